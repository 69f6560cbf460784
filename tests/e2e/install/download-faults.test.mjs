// Server-side faults during a download: each one survived with nothing lost and at most one
// checkpoint interval (6 MiB with the hash lag) re-fetched per interruption, or stopped with an error naming the file.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const { BIG_SHARD: SHARD, BIG_SHARD_SIZE: SIZE, REFETCH_BYTES } = h;

/** Range starts the hub saw for SHARD (null: no Range header). */
const rangeStarts = (hub) => hub.stats(SHARD).ranges.map((r) => (r ? Number(/bytes=(\d+)-/.exec(r)?.[1]) : null));

test('connection cut mid-file: resumes with a Range from the last checkpoint; the pack generates', { timeout: 600_000 }, async (t) => {
  const b = await h.setupPadded(t);
  const cutAt = 10 << 20;
  // Throttled like a real network (the browser keeps up), so that what was sent before the cut was
  // received: Chromium drops body bytes still buffered when the connection fails, and at loopback
  // speed megabytes are (the fake Hub counts bytes written, not bytes read).
  b.hub.inject(SHARD, { type: 'slow', bytesPerSecond: 8 << 20 });
  b.hub.inject(SHARD, { type: 'cut', afterBytes: cutAt });
  await h.installPack(b.page, b.hub, b.repo);
  h.assertServed(b.hub, b.repo, { interruptions: { [SHARD]: 1 } });
  const starts = rangeStarts(b.hub);
  const resumed = starts.filter((s) => s > 0);
  assert.equal(resumed.length, 1, `expected one ranged resume, ranges: ${JSON.stringify(b.hub.stats(SHARD).ranges)}`);
  assert.ok(resumed[0] <= cutAt && resumed[0] >= cutAt - REFETCH_BYTES - h.IN_FLIGHT_SLACK, `resumed at ${resumed[0]}, cut at ${cutAt}`);
  assert.ok(b.hub.stats(SHARD).statuses.includes(206));
  const st = await h.packStatus(b.page);
  assert.equal(st.installed, true);
  // The padded pack still runs: nothing lost.
  const { result } = await h.generateOk(b.page, { prompt: 'a red fox', width: 256, height: 256, steps: 2, seed: '2' });
  assert.ok(result.png.length > 0);
});

test('500 and 503 are retried with backoff; nothing fetched twice', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  b.hub.inject(SHARD, { type: 'status', status: 503, times: 2 });
  b.hub.inject('transformer_q8-00001.data', { type: 'status', status: 500, times: 1 });
  // And a file that gets a 503 and a cut mid-file.
  b.hub.inject('text_encoder_q4-00000.data', { type: 'cut', afterBytes: 100_000 });
  b.hub.inject('text_encoder_q4-00000.data', { type: 'status', status: 503, times: 1 });
  await h.installPack(b.page, b.hub, b.repo);
  h.assertServed(b.hub, b.repo, { interruptions: { 'text_encoder_q4-00000.data': 1 } });
  assert.equal(h.servedBytes(b.hub, SHARD), SIZE);
  const s = b.hub.stats(SHARD);
  assert.deepEqual(s.statuses.filter((x) => x >= 500), [503, 503]);
  // Backoff: 0.5 s, then 1 s (a little early is fine: timers).
  const times = b.hub.log.filter((r) => r.server === 'hub' && r.path === SHARD).map((r) => r.t);
  assert.ok(times.length >= 3);
  assert.ok(times[1] - times[0] >= 400, `first retry after ${times[1] - times[0]} ms`);
  assert.ok(times[2] - times[1] >= 800, `second retry after ${times[2] - times[1]} ms`);
  assert.ok(b.hub.stats('transformer_q8-00001.data').statuses.includes(500));
});

test('404: stops with an error naming the file; resumes once the file is back', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  b.hub.inject(SHARD, { type: 'status', status: 404, times: Infinity });
  const reply = await h.startInstall(b.page, b.hub, b.repo);
  assert.equal(reply.type, 'installStarted', JSON.stringify(reply));
  const error = await h.waitForInstallFailure(b.page, 60_000);
  assert.ok(error.includes(SHARD), `error does not name ${SHARD}: ${error}`);
  assert.match(error, /404|not found/i);
  const st = await h.packStatus(b.page);
  assert.equal(st.installed, false);
  assert.equal(st.download?.state, 'failed', JSON.stringify(st.download, h.shorten));
  assert.ok(st.download.error.includes(SHARD));
  // No retry storm: a 404 is final.
  assert.ok(b.hub.stats(SHARD).requests <= 2, `404 retried ${b.hub.stats(SHARD).requests} times`);

  b.hub.clearFaults();
  assert.equal((await h.resumePack(b.page)).type, 'installStarted');
  await h.waitForInstall(b.page);
  h.assertServed(b.hub, b.repo);
});

test('a 200 to a range request restarts that file from 0 and still verifies', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  const cutAt = 9 << 20;
  // Throttled until the cut, so that the bytes sent before it were received and checkpointed (at
  // loopback speed the connection reset drops megabytes still buffered, and there may be no checkpoint
  // to resume from).
  b.hub.inject(SHARD, { type: 'slow', bytesPerSecond: 8 << 20 });
  b.hub.inject(SHARD, { type: 'cut', afterBytes: cutAt });
  b.hub.inject(SHARD, { type: 'ignoreRange', times: 1 });
  await h.installPack(b.page, b.hub, b.repo);
  // The bytes before the cut are wasted once (the server ignored the range); nothing else.
  h.assertServed(b.hub, b.repo, { extra: { [SHARD]: cutAt } });
  const s = b.hub.stats(SHARD);
  assert.ok(s.statuses.includes(200));
  assert.ok(s.ranges.some((r) => r && !r.startsWith('bytes=0-')), `no ranged resume: ${JSON.stringify(s.ranges)}`);
  assert.equal((await h.packStatus(b.page)).installed, true);
});

test('corrupted bytes: the file is deleted and fetched again once', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  b.hub.inject(SHARD, { type: 'corrupt', times: 1 });
  await h.installPack(b.page, b.hub, b.repo);
  h.assertServed(b.hub, b.repo, { extra: { [SHARD]: SIZE } });
  assert.equal(h.servedBytes(b.hub, SHARD), 2 * SIZE);
  assert.equal((await h.packStatus(b.page)).installed, true);
});

test('corrupted twice: stops with an error naming the file', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  b.hub.inject(SHARD, { type: 'corrupt', times: 2 });
  const reply = await h.startInstall(b.page, b.hub, b.repo);
  assert.equal(reply.type, 'installStarted', JSON.stringify(reply));
  const error = await h.waitForInstallFailure(b.page, 120_000);
  assert.ok(error.includes(SHARD), `error does not name ${SHARD}: ${error}`);
  assert.match(error, /sha-?256|hash|checksum|verif|corrupt|mismatch/i);
  assert.ok(h.servedBytes(b.hub, SHARD) <= 2 * SIZE, `fetched more than twice: ${JSON.stringify(b.hub.stats(SHARD))}`);
  const st = await h.packStatus(b.page);
  assert.equal(st.installed, false);
  assert.equal(st.download?.state, 'failed');
  assert.equal(await h.installedDir(b.page), null, 'a failed install was installed');
});

test('a server that goes silent mid-file: given up after the idle timeout, resumed from the last checkpoint', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  await h.setIdleTimeout(b.page, 2000);
  const stallAt = 10 << 20;
  // Throttled, so that what was sent before the silence was received (see the cut above).
  b.hub.inject(SHARD, { type: 'slow', bytesPerSecond: 8 << 20 });
  b.hub.inject(SHARD, { type: 'stall', afterBytes: stallAt });
  await h.installPack(b.page, b.hub, b.repo, { timeoutMs: 60_000 });
  assert.ok(b.hub.log.some((r) => r.path === SHARD && r.stalled), 'the silent response was not served');
  h.assertServed(b.hub, b.repo, { interruptions: { [SHARD]: 1 } });
  const resumed = rangeStarts(b.hub).filter((s) => s > 0);
  assert.equal(resumed.length, 1, `expected one ranged resume, ranges: ${JSON.stringify(b.hub.stats(SHARD).ranges)}`);
  assert.ok(resumed[0] <= stallAt && resumed[0] >= stallAt - REFETCH_BYTES - h.IN_FLIGHT_SLACK, `resumed at ${resumed[0]}, silent from ${stallAt}`);
  assert.equal((await h.packStatus(b.page)).installed, true);
});

test('Hub API answers that go silent are given up after the idle timeout and asked again', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  await h.setIdleTimeout(b.page, 2000);
  const apiRequests = (what) => b.hub.log.filter((r) => r.server === 'hub' && r.url.includes(`/${what}/`));
  // The service worker's plan: the revision sends its headers and a few bytes, then nothing.
  b.hub.inject(':revision', { type: 'stall', afterBytes: 10 });
  const plan = await h.api(b.page, { type: 'planPack', endpoint: b.hub.url, repo: b.repo, revision: 'main' });
  assert.equal(plan.type, 'packPlan', JSON.stringify(plan, h.shorten));
  assert.deepEqual(apiRequests('revision').map((r) => Boolean(r.stalled)), [true, false]);
  // The download worker's: the file list sends its headers, then nothing.
  b.hub.reset();
  b.hub.inject(':tree', { type: 'stall' });
  await h.installPack(b.page, b.hub, b.repo, { timeoutMs: 60_000 });
  assert.deepEqual(apiRequests('tree').map((r) => Boolean(r.stalled)), [true, false]);
  h.assertServed(b.hub, b.repo);
});

test('a redirect to plain http:// off this machine is refused, naming where it went and what is allowed', { timeout: 120_000 }, async (t) => {
  // insecure-cdn.test is the fake CDN, reached by a name that is not loopback.
  const b = await h.setupPadded(t, { args: ['--host-resolver-rules=MAP insecure-cdn.test 127.0.0.1'] });
  const to = `http://insecure-cdn.test:${new URL(b.hub.cdnUrl).port}`;
  b.hub.inject(SHARD, { type: 'redirect', to, times: Infinity });
  assert.equal((await h.startInstall(b.page, b.hub, b.repo)).type, 'installStarted');
  const error = await h.waitForInstallFailure(b.page, 60_000);
  assert.ok(error.includes(`redirected to ${to}/blobs/`), error);
  assert.match(error, /only https:\/\/ addresses are followed, or http:\/\/ on this machine/);
  // Refused, not retried; nothing of it kept.
  assert.equal(b.hub.stats(SHARD).resolveRequests, 1, JSON.stringify(b.hub.stats(SHARD)));
  assert.equal((await h.packStatus(b.page)).installed, false);
});
