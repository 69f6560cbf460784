// Interruptions on the browser's side: service worker stopped, offscreen document closed, browser
// restarted, pause/resume, cancel, the quota running out, and `main` moving while paused. Each one
// with nothing lost and at most REFETCH_BYTES (6 MiB) re-fetched.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const { BIG_SHARD: SHARD, BIG_SHARD_SIZE: SIZE, REFETCH_BYTES } = h;
/** Throttle for the shard while we interrupt it: 24 MiB take 8 s. */
const SLOW = 3 << 20;
const MID = 8 << 20;

/** Starts an install with SHARD throttled and waits until it is mid-file; returns the status then. */
async function startMidFile(b, { page = b.page } = {}) {
  b.hub.inject(SHARD, { type: 'slow', bytesPerSecond: SLOW });
  const reply = await h.startInstall(page, b.hub, b.repo);
  assert.equal(reply.type, 'installStarted', JSON.stringify(reply));
  return h.waitForDownload(page, (s) => h.fileDone(s, SHARD) >= MID, 60_000);
}

/** `startMidFile`, then paused; the status once paused. */
async function pausedMidFile(b) {
  await startMidFile(b);
  assert.equal((await h.api(b.page, { type: 'pausePack' })).type, 'done');
  return h.waitForDownload(b.page, (s) => s.download?.state === 'paused', 10_000);
}

/** Bytes the hub sends in `ms` (0 when the download is stopped). */
async function flowing(hub, ms = 1500) {
  const before = hub.totalBodyBytes();
  await h.sleep(ms);
  return hub.totalBodyBytes() - before;
}

const resumedFrom = (hub) => h.resumedFrom(hub, SHARD);

test('service worker stopped mid-download: the download goes on', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  await startMidFile(b);
  await h.stopServiceWorker(b.context, b.page);
  b.hub.clearFaults();
  await h.waitForInstall(b.page);
  h.assertServed(b.hub, b.repo, { interruptions: { [SHARD]: 1 } });
  assert.equal((await h.packStatus(b.page)).installed, true);
});

test('offscreen document closed mid-download: resumes by itself from the checkpoint', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  const mid = await startMidFile(b);
  const sw = await h.currentServiceWorker(b.context, b.extensionId);
  assert.equal(await h.closeOffscreen(sw), true, 'no offscreen document to close');
  b.hub.clearFaults();
  // The next request to the service worker (waitForInstall polls packStatus) resumes it.
  await h.waitForInstall(b.page);
  h.assertServed(b.hub, b.repo, { interruptions: { [SHARD]: 1 } });
  const resumed = resumedFrom(b.hub);
  assert.equal(resumed.length, 1, JSON.stringify(b.hub.stats(SHARD).ranges));
  assert.ok(resumed[0] >= h.fileDone(mid, SHARD) - REFETCH_BYTES, `resumed at ${resumed[0]}, was at ${h.fileDone(mid, SHARD)}`);
});

test('the hash worker dies mid-download: the install goes on from its checkpoint with fresh workers', { timeout: 240_000 }, async (t) => {
  const b = await h.setupPadded(t);
  // How long a worker may leave a message due unanswered (shortened from its default).
  await h.opfsWrite(b.page, 'worker-limit-ms', '1500');
  const mid = await startMidFile(b);
  // The hash worker ends itself at its next checkpoint: its port stays open and never answers.
  await h.armFailpoint(b.page, 'hash:dies');
  await h.waitForFailpoint(b.page, 30_000);
  // Still throttled until the fresh workers ask for the rest.
  for (const until = Date.now() + 60_000; resumedFrom(b.hub).length === 0 && Date.now() < until;) await h.sleep(100);
  b.hub.clearFaults();
  await h.waitForInstall(b.page, 90_000);
  // The dead worker's response goes on filling the connection's buffers until the silence limit: a
  // second interruption's worth.
  h.assertServed(b.hub, b.repo, { interruptions: { [SHARD]: 2 } });
  const resumed = resumedFrom(b.hub);
  assert.equal(resumed.length, 1, JSON.stringify(b.hub.stats(SHARD).ranges));
  assert.ok(resumed[0] >= h.fileDone(mid, SHARD) - REFETCH_BYTES, `resumed at ${resumed[0]}, was at ${h.fileDone(mid, SHARD)}`);
});

test('browser closed and reopened on the same profile: resumes by itself, nothing lost', { timeout: 600_000 }, async (t) => {
  const b = await h.setupPadded(t);
  const mid = await startMidFile(b);
  const nb = await b.relaunch();
  b.close = nb.close; // setup's cleanup closes the new browser
  b.hub.clearFaults();
  // Without any request from us: startup (or the popup the launch opens) resumes it.
  const deadline = Date.now() + 40_000;
  while (b.hub.stats(SHARD).ranges.length < 2 && Date.now() < deadline) await h.sleep(250);
  assert.ok(b.hub.stats(SHARD).ranges.length >= 2, 'the download did not resume by itself within 40 s of the restart');
  await h.waitForInstall(nb.page);
  h.assertServed(b.hub, b.repo, { interruptions: { [SHARD]: 1 } });
  const resumed = resumedFrom(b.hub);
  assert.ok(resumed.length >= 1 && resumed[0] >= h.fileDone(mid, SHARD) - REFETCH_BYTES, JSON.stringify(b.hub.stats(SHARD).ranges));
  const st = await h.packStatus(nb.page);
  assert.equal(st.installed, true);
  const { result } = await h.generateOk(nb.page, { prompt: 'a harbour', width: 256, height: 256, steps: 2, seed: '4' });
  assert.ok(result.png.length > 0);
});

test('the browser starts again offline: the download fails saying it is tried again, and is, by itself, once the Hub answers', { timeout: 600_000 }, async (t) => {
  const b = await h.setupPadded(t);
  const mid = await startMidFile(b);
  // The network is down: the Hub's API answers nothing at all.
  b.hub.inject(':revision', { type: 'refuse', times: Infinity });
  b.hub.inject(':tree', { type: 'refuse', times: Infinity });
  const nb = await b.relaunch();
  b.close = nb.close; // setup's cleanup closes the new browser
  const failed = await h.waitForDownload(nb.page, (s) => s.download?.state === 'failed', 120_000);
  assert.match(failed.download.error, /could not reach .*tried again by itself every 30 seconds/, failed.download.error);
  assert.ok(b.hub.log.some((r) => r.refused), 'the Hub was never asked');
  // The network is back: nobody asks, the download alarm tries again, and nothing kept is fetched again.
  b.hub.clearFaults();
  await h.waitForDownload(nb.page, (s) => s.installed && !s.download, 120_000);
  h.assertServed(b.hub, b.repo, { interruptions: { [SHARD]: 1 } });
  const resumed = resumedFrom(b.hub);
  assert.ok(resumed.length >= 1 && resumed[0] >= h.fileDone(mid, SHARD) - REFETCH_BYTES, JSON.stringify(b.hub.stats(SHARD).ranges));
  assert.equal((await h.packStatus(nb.page)).installed, true);
});

test('a partial download of another source is freed before the space check, not counted against the new one', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  const paused = await pausedMidFile(b);
  const partial = h.fileDone(paused, SHARD);
  // Another source: the same repo at a new commit, asked for by its id.
  const other = b.hub.setRepo(b.repo, { dir: h.fixtureDir(b.repo), pad: { [SHARD]: 4 << 20 }, salt: 'v2' });
  b.hub.clearFaults();
  const need = h.packFiles(b.hub, b.repo, other).reduce((n, f) => n + f.size, 0);
  // Room for the new pack beside everything stored but the partial download, not beside all of it.
  const { usage } = await h.storageEstimate(b.page);
  await h.setQuota(b.context, b.page, usage - partial + need + (partial >> 1));
  try {
    assert.equal((await h.startInstall(b.page, b.hub, b.repo, { revision: other })).type, 'installStarted');
    assert.equal((await h.waitForInstall(b.page)).commit, other);
  } finally {
    await h.setQuota(b.context, b.page, null);
  }
  const tree = await h.opfsTree(b.page);
  assert.equal(tree[`${await h.installedDir(b.page)}/${SHARD}`], 4 << 20);
  assert.deepEqual(Object.entries(tree).filter(([k, size]) => k.endsWith(SHARD) && size !== 4 << 20), [], 'the partial shard is still stored');
});

test('pause keeps the bytes and stops the transfer; resume continues from there', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  const paused = await pausedMidFile(b);
  await h.sleep(500);
  assert.ok((await flowing(b.hub)) === 0, 'bytes still flowing after pausePack');
  const done = h.fileDone(paused, SHARD);
  assert.ok(done >= MID, `paused at ${done}`);
  const tree = await h.opfsTree(b.page);
  const staging = await h.stagingDir(b.page);
  assert.ok(tree[`${staging}/${SHARD}`] > 0, `no partial kept: ${JSON.stringify(tree)}`);
  // Still paused after a status request (a pause is not an interruption to repair).
  await h.sleep(1000);
  assert.equal((await h.packStatus(b.page)).download?.state, 'paused');

  b.hub.clearFaults();
  assert.equal((await h.resumePack(b.page)).type, 'installStarted');
  await h.waitForInstall(b.page);
  h.assertServed(b.hub, b.repo, { interruptions: { [SHARD]: 1 } });
  assert.ok(resumedFrom(b.hub)[0] >= done - REFETCH_BYTES);
});

/**
 * Opens `paths` (from the OPFS root) with sync access handles in a dedicated worker of `page`, as the
 * download worker does, and holds them; returns a function that closes them and ends the worker.
 */
async function holdFiles(page, paths) {
  const started = page.waitForEvent('worker');
  await page.evaluate(() => {
    // Any worker of the extension serves (this one waits for a message that never comes).
    window.__holder = new Worker('hash-worker.js', { type: 'module' });
  });
  const worker = await started;
  await worker.evaluate(async (paths) => {
    self.__held = [];
    for (const p of paths) {
      let dir = await navigator.storage.getDirectory();
      const parts = p.split('/');
      for (const part of parts.slice(0, -1)) dir = await dir.getDirectoryHandle(part);
      const file = await dir.getFileHandle(parts.at(-1), { create: true });
      self.__held.push(await file.createSyncAccessHandle());
    }
  }, paths);
  return async () => {
    await worker.evaluate(() => self.__held.forEach((handle) => handle.close()));
    await page.evaluate(() => window.__holder.terminate());
  };
}

test('pause then resume at once, the old worker still holding its files: the new one waits for them, nothing lost', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  const paused = await pausedMidFile(b);
  const done = h.fileDone(paused, SHARD);
  // What a worker that is slow to go away still holds: the shard and the download record.
  const staging = await h.stagingDir(b.page);
  const release = await holdFiles(b.page, [`${staging}/${SHARD}`, `${staging}/download-a.json`, `${staging}/download-b.json`]);
  b.hub.clearFaults();
  assert.equal((await h.resumePack(b.page)).type, 'installStarted');
  await h.sleep(2000);
  await release();
  await h.waitForInstall(b.page, 60_000);
  assert.equal((await h.packStatus(b.page)).installed, true);
  h.assertServed(b.hub, b.repo, { interruptions: { [SHARD]: 1 } });
  assert.ok(resumedFrom(b.hub)[0] >= done - REFETCH_BYTES, JSON.stringify(b.hub.stats(SHARD).ranges));
});

test('cancel removes the partial files and stops the transfer', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  await startMidFile(b);
  assert.equal((await h.api(b.page, { type: 'cancelPack' })).type, 'done');
  await h.waitForDownload(b.page, (s) => !s.download, 10_000);
  await h.sleep(500);
  assert.equal(await flowing(b.hub), 0, 'bytes still flowing after cancelPack');
  const staging = await h.stagingDir(b.page);
  assert.ok(!Object.keys(await h.opfsTree(b.page)).some((k) => k.startsWith(`${staging}/`)), `${staging}/ still in OPFS`);
  const st = await h.packStatus(b.page);
  assert.equal(st.installed, false);
  assert.equal(st.download ?? null, null);
  // And nothing resumes it later.
  await h.sleep(2000);
  assert.equal(await flowing(b.hub, 500), 0);
});

test('quota exhausted part way: clear error, partial kept, resumes once space is freed', { timeout: 240_000 }, async (t) => {
  // Without unlimitedStorage (quotaDist), a quota override limits OPFS writes (see harness setQuota).
  const b = await h.setupPadded(t, { extDir: h.quotaDist() });
  await h.setQuota(b.context, b.page, 14 << 20);
  // Throttled, so that the bytes sent when the write fails are about the bytes received (at loopback
  // speed the whole file is in socket buffers by then, and the fake Hub counts bytes written).
  b.hub.inject(SHARD, { type: 'slow', bytesPerSecond: 8 << 20 });
  const reply = await h.startInstall(b.page, b.hub, b.repo);
  assert.equal(reply.type, 'installStarted', JSON.stringify(reply));
  const error = await h.waitForInstallFailure(b.page, 60_000);
  assert.match(error, /storage|space|quota/i);
  // The failed download still reports what it kept.
  const st = await h.waitForDownload(b.page, (s) => s.download?.state === 'failed' && s.download.files.length > 0, 10_000).catch(async (e) => {
    assert.fail(`a failed download must still report its files and bytes: ${e.message}`);
  });
  assert.ok(st.download.doneBytes > 0, `nothing kept: ${JSON.stringify(st.download)}`);
  const kept = st.download.doneBytes;
  const tree = await h.opfsTree(b.page);
  const staging = await h.stagingDir(b.page);
  assert.ok(Object.keys(tree).some((k) => k.startsWith(`${staging}/`) && tree[k] > 0), `partial not kept: ${JSON.stringify(tree)}`);

  await h.setQuota(b.context, b.page, null);
  b.hub.clearFaults();
  assert.equal((await h.resumePack(b.page)).type, 'installStarted');
  await h.waitForInstall(b.page);
  h.assertServed(b.hub, b.repo, { interruptions: 1 });
  assert.ok(b.hub.totalBodyBytes() <= st.download.totalBytes + REFETCH_BYTES + h.IN_FLIGHT_SLACK, `kept ${kept}, served ${b.hub.totalBodyBytes()}`);
});

test('main moves to a new commit while paused: the download ends at its own commit, nothing fetched again; the next install is entirely the new commit', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  const oldCommit = b.hub.commit(b.repo);
  const paused = await pausedMidFile(b);
  const NEW_SIZE = 20 << 20;
  const newCommit = b.hub.setRepo(b.repo, { dir: h.fixtureDir(b.repo), pad: { [SHARD]: NEW_SIZE }, salt: 'v2' });
  assert.notEqual(newCommit, oldCommit);
  b.hub.clearFaults();
  b.hub.reset();
  assert.equal((await h.resumePack(b.page)).type, 'installStarted');
  assert.equal((await h.waitForInstall(b.page)).commit, oldCommit);
  // Resumed at the commit it started from: every request at it, the shard from its checkpoint.
  assert.ok(b.hub.log.every((r) => !r.commit || r.commit === oldCommit), 'a request at the new commit');
  const resumed = resumedFrom(b.hub);
  assert.ok(resumed.length === 1 && resumed[0] >= h.fileDone(paused, SHARD) - REFETCH_BYTES, JSON.stringify(b.hub.stats(SHARD).ranges));
  assert.equal((await h.opfsTree(b.page))[`${await h.installedDir(b.page)}/${SHARD}`], SIZE);

  // Installed again, it is the new commit, entirely.
  b.hub.reset();
  assert.equal((await h.startInstall(b.page, b.hub, b.repo)).type, 'installStarted');
  assert.equal((await h.waitForInstall(b.page)).commit, newCommit);
  const st = await h.packStatus(b.page);
  assert.equal(st.commit, newCommit);
  // Every resolve is at the new commit, and the changed shard came whole from it.
  h.assertServed(b.hub, b.repo, { commit: newCommit });
  assert.equal(h.servedBytes(b.hub, SHARD), NEW_SIZE);
  assert.ok(b.hub.stats(SHARD).ranges.every((r) => !r || r.startsWith('bytes=0-')), JSON.stringify(b.hub.stats(SHARD).ranges));
  assert.ok(b.hub.log.every((r) => !r.commit || r.commit === newCommit), 'a request at the old commit after the move');
  const tree = await h.opfsTree(b.page);
  assert.equal(tree[`${await h.installedDir(b.page)}/${SHARD}`], NEW_SIZE);
});
