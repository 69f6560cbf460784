// The fake Hub itself (no browser): the endpoints behave like the Hub's, faults and accounting work.
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { startFakeHub } from '../lib/fake-hub.mjs';
import { PACKS } from '../lib/harness.mjs';

const REPO = 'fixtures/f32';
const SHARD = 'transformer_q8-00000.data';

async function withHub(t, opts) {
  const hub = await startFakeHub({ repos: { [REPO]: { dir: path.join(PACKS, 'f32'), pad: { [SHARD]: 24 << 20 } } }, ...opts });
  t.after(() => hub.close());
  return hub;
}

const sha256 = (b) => crypto.createHash('sha256').update(b).digest('hex');

test('revision, tree and resolve behave like the Hub', async (t) => {
  const hub = await withHub(t);
  const rev = await (await fetch(`${hub.url}/api/models/${REPO}/revision/main`)).json();
  assert.equal(rev.id, REPO);
  assert.match(rev.sha, /^[0-9a-f]{40}$/);
  assert.equal((await fetch(`${hub.url}/api/models/${REPO}/revision/${rev.sha}`)).status, 200);
  assert.equal((await fetch(`${hub.url}/api/models/${REPO}/revision/nope`)).status, 404);
  assert.equal((await fetch(`${hub.url}/api/models/no/such/revision/main`)).status, 404);

  const tree = await (await fetch(`${hub.url}/api/models/${REPO}/tree/${rev.sha}?recursive=true`)).json();
  const byPath = Object.fromEntries(tree.map((e) => [e.path, e]));
  assert.equal(byPath.samples.type, 'directory');
  assert.ok(byPath['samples/cat.png'].lfs);
  assert.ok(byPath['README.md'] && !byPath['README.md'].lfs);
  const shard = byPath[SHARD];
  assert.equal(shard.size, 24 << 20);
  assert.equal(shard.lfs.size, 24 << 20);
  assert.equal(shard.lfs.pointerSize, 134);
  const manifest = byPath['transformer_q8.manifest.json'];
  const mbytes = fs.readFileSync(path.join(PACKS, 'f32/transformer_q8.manifest.json'));
  const blobOid = crypto.createHash('sha1').update(`blob ${mbytes.length}\0`).update(mbytes).digest('hex');
  assert.equal(manifest.oid, blobOid);

  // LFS: 302 to the CDN with the Hub's headers.
  const r = await fetch(`${hub.url}/${REPO}/resolve/${rev.sha}/${SHARD}`, { redirect: 'manual' });
  assert.equal(r.status, 302);
  assert.equal(r.headers.get('x-repo-commit'), rev.sha);
  assert.equal(r.headers.get('x-linked-etag'), `"${shard.lfs.oid}"`);
  assert.equal(r.headers.get('x-linked-size'), String(shard.size));
  assert.ok(r.headers.get('location').startsWith(`${hub.cdnUrl}/blobs/${shard.lfs.oid}`));
  await r.arrayBuffer();

  // Followed, whole and ranged; the body hashes to lfs.oid; the padded prefix is the real file.
  const full = Buffer.from(await (await fetch(`${hub.url}/${REPO}/resolve/${rev.sha}/${SHARD}`)).arrayBuffer());
  assert.equal(sha256(full), shard.lfs.oid);
  const real = fs.readFileSync(path.join(PACKS, 'f32', SHARD));
  assert.ok(full.subarray(0, real.length).equals(real));
  const ranged = await fetch(`${hub.url}/${REPO}/resolve/${rev.sha}/${SHARD}`, { headers: { Range: 'bytes=1000-' } });
  assert.equal(ranged.status, 206);
  assert.equal(ranged.headers.get('content-range'), `bytes 1000-${shard.size - 1}/${shard.size}`);
  assert.equal(ranged.headers.get('etag'), `"${shard.lfs.oid}"`);
  assert.ok(Buffer.from(await ranged.arrayBuffer()).equals(full.subarray(1000)));
  const mid = await fetch(`${hub.url}/${REPO}/resolve/${rev.sha}/${SHARD}`, { headers: { Range: 'bytes=10-19' } });
  assert.equal(mid.status, 206);
  assert.ok(Buffer.from(await mid.arrayBuffer()).equals(full.subarray(10, 20)));

  // Non-LFS: served by the hub itself.
  const m = await fetch(`${hub.url}/${REPO}/resolve/${rev.sha}/transformer_q8.manifest.json`, { redirect: 'manual' });
  assert.equal(m.status, 200);
  assert.ok(Buffer.from(await m.arrayBuffer()).equals(mbytes));

  // CORS preflight.
  const pre = await fetch(`${hub.cdnUrl}/blobs/${shard.lfs.oid}`, { method: 'OPTIONS', headers: { 'Access-Control-Request-Headers': 'range' } });
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get('access-control-allow-origin'), '*');
  assert.match(pre.headers.get('access-control-allow-headers'), /range/i);

  const s = hub.stats(SHARD);
  assert.equal(s.bodyBytes, full.length + (full.length - 1000) + 10);
  assert.equal(s.resolveRequests, 4);
  assert.equal(s.cdnRequests, 3);
});

test('faults: cut, status, ignoreRange, corrupt, slow; setRepo moves main', async (t) => {
  const hub = await withHub(t);
  const commit = hub.commit(REPO);
  const url = `${hub.url}/${REPO}/resolve/${commit}/${SHARD}`;
  const sha = hub.file(REPO, SHARD).sha256;

  hub.inject(SHARD, { type: 'cut', afterBytes: 5 << 20 });
  await assert.rejects(async () => Buffer.from(await (await fetch(url)).arrayBuffer()));
  assert.equal(hub.stats(SHARD).bodyBytes, 5 << 20);
  hub.reset();

  hub.inject(SHARD, { type: 'status', status: 503, times: 2 });
  assert.equal((await fetch(url)).status, 503);
  assert.equal((await fetch(url)).status, 503);
  const ok = await fetch(url, { headers: { Range: 'bytes=0-0' } });
  assert.equal(ok.status, 206);
  await ok.arrayBuffer();

  hub.inject(SHARD, { type: 'ignoreRange' });
  const ign = await fetch(url, { headers: { Range: 'bytes=100-' } });
  assert.equal(ign.status, 200);
  assert.equal((await ign.arrayBuffer()).byteLength, 24 << 20);

  hub.inject(SHARD, { type: 'corrupt' });
  const bad = Buffer.from(await (await fetch(url)).arrayBuffer());
  assert.notEqual(sha256(bad), sha);
  const good = Buffer.from(await (await fetch(url)).arrayBuffer());
  assert.equal(sha256(good), sha);

  hub.inject(SHARD, { type: 'slow', bytesPerSecond: 4 << 20 });
  const t0 = Date.now();
  await (await fetch(url, { headers: { Range: 'bytes=0-2097151' } })).arrayBuffer();
  assert.ok(Date.now() - t0 >= 400, `2 MiB at 4 MiB/s took ${Date.now() - t0} ms`);
  hub.clearFaults();

  const moved = hub.setRepo(REPO, { dir: path.join(PACKS, 'f32'), pad: { [SHARD]: 20 << 20 } });
  assert.notEqual(moved, commit);
  assert.equal(hub.commit(REPO), moved);
  const rev = await (await fetch(`${hub.url}/api/models/${REPO}/revision/main`)).json();
  assert.equal(rev.sha, moved);
  // The old commit still resolves.
  assert.equal((await fetch(`${hub.url}/api/models/${REPO}/revision/${commit}`)).status, 200);
});

test('faults: stall, shortRange, redirect, and API faults', async (t) => {
  const hub = await withHub(t);
  const commit = hub.commit(REPO);
  const url = `${hub.url}/${REPO}/resolve/${commit}/${SHARD}`;
  const size = hub.file(REPO, SHARD).size;

  // Headers and 1 MiB, then silence with the connection open: only the client's own timeout ends it.
  hub.inject(SHARD, { type: 'stall', afterBytes: 1 << 20 });
  const stalled = await fetch(url, { signal: AbortSignal.timeout(1500) });
  assert.equal(stalled.status, 200);
  const t0 = Date.now();
  await assert.rejects(stalled.arrayBuffer(), /abort|timeout/i);
  assert.ok(Date.now() - t0 >= 1000, `the stalled body ended after ${Date.now() - t0} ms`);
  assert.equal(hub.stats(SHARD).bodyBytes, 1 << 20);

  // A part of the range asked for, said so by its Content-Range.
  hub.inject(SHARD, { type: 'shortRange', bytes: 1000 });
  const part = await fetch(url, { headers: { Range: 'bytes=5000-' } });
  assert.equal(part.status, 206);
  assert.equal(part.headers.get('content-range'), `bytes 5000-5999/${size}`);
  assert.equal((await part.arrayBuffer()).byteLength, 1000);

  // Redirected elsewhere, for an LFS file and for one stored in git alike.
  for (const p of [SHARD, 'transformer_q8.manifest.json']) {
    hub.inject(p, { type: 'redirect', to: 'http://elsewhere.test:1234' });
    const r = await fetch(`${hub.url}/${REPO}/resolve/${commit}/${p}`, { redirect: 'manual' });
    assert.equal(r.status, 302);
    assert.match(r.headers.get('location'), new RegExp(`^http://elsewhere\\.test:1234/blobs/${hub.file(REPO, p).sha256}\\?`));
    await r.arrayBuffer();
  }

  // API answers: a status, then headers and silence, then the answer.
  const tree = `${hub.url}/api/models/${REPO}/tree/${commit}?recursive=true`;
  hub.inject(':tree', { type: 'status', status: 503 });
  hub.inject(':tree', { type: 'stall' });
  assert.equal((await fetch(tree)).status, 503);
  const silent = await fetch(tree, { signal: AbortSignal.timeout(1000) });
  assert.equal(silent.status, 200);
  await assert.rejects(silent.arrayBuffer(), /abort|timeout/i);
  assert.ok(Array.isArray(await (await fetch(tree)).json()));
  hub.inject(':revision', { type: 'stall' });
  await assert.rejects(fetch(`${hub.url}/api/models/${REPO}/revision/main`, { signal: AbortSignal.timeout(1000) }).then((r) => r.arrayBuffer()), /abort|timeout/i);
  // No answer at all, as offline, until the fault is cleared.
  hub.inject(':revision', { type: 'refuse', times: Infinity });
  for (let i = 0; i < 2; i++) await assert.rejects(fetch(`${hub.url}/api/models/${REPO}/revision/main`), /fetch failed/);
  hub.clearFaults();
  assert.equal((await (await fetch(`${hub.url}/api/models/${REPO}/revision/main`)).json()).sha, commit);
});

test('generated content: large files are streamed, not held', async (t) => {
  const hub = await startFakeHub({ repos: { 'bench/gen': { extra: {}, files: { 'big.data': { size: 64 << 20 } } } } });
  t.after(() => hub.close());
  const f = hub.file('bench/gen', 'big.data');
  const r = await fetch(`${hub.url}/bench/gen/resolve/${hub.commit('bench/gen')}/big.data`);
  const h = crypto.createHash('sha256');
  for await (const chunk of r.body) h.update(chunk);
  assert.equal(h.digest('hex'), f.sha256);
});
