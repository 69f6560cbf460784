// What the download promises about stored data, under the interruptions that used to break it: a file is
// marked verified only when the bytes on disk are the listed ones; the installed pack stays usable through
// every step of replacing it; retries end; a server whose copy differs from the listing is refused.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const { BIG_SHARD: SHARD, BIG_SHARD_SIZE: SIZE } = h;

/** Polls `predicate` (sync or async) every 50 ms until it holds; throws after `timeoutMs`. */
async function until(predicate, what, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await h.sleep(50);
  }
}

/** Asserts that the installed copy of every pack file holds exactly the listed bytes. */
async function assertInstalledBytes(b, commit) {
  const dir = await h.installedDir(b.page);
  assert.ok(dir, 'no pack installed');
  for (const f of h.packFiles(b.hub, b.repo, commit).filter((f) => f.sha256)) {
    assert.equal(await h.opfsSha256(b.page, `${dir}/${f.path}`), f.sha256, `${dir}/${f.path} on disk is not the listed file`);
  }
}

test('a 200 to a range, stopped before its first checkpoint: the resumed file is the listed bytes', { timeout: 240_000 }, async (t) => {
  const b = await h.setupPadded(t);
  b.hub.inject(SHARD, { type: 'slow', bytesPerSecond: 2 << 20 });
  b.hub.inject(SHARD, { type: 'cut', afterBytes: 9 << 20 });
  b.hub.inject(SHARD, { type: 'ignoreRange', times: 1 });
  assert.equal((await h.startInstall(b.page, b.hub, b.repo)).type, 'installStarted');
  // The retry asks for a range, gets the whole file from 0; stop it 1 MiB in, before the 4 MiB checkpoint.
  const restart = () => b.hub.log.find((r) => r.server === 'cdn' && r.range && r.status === 200);
  await until(() => restart()?.bytes >= 1 << 20, 'the restarted response');
  assert.equal((await h.api(b.page, { type: 'pausePack' })).type, 'done');
  await h.waitForDownload(b.page, (s) => s.download?.state === 'paused', 10_000);
  assert.ok(restart().bytes < 4 << 20, `the restart got ${restart().bytes} bytes before the pause`);

  b.hub.clearFaults();
  assert.equal((await h.resumePack(b.page)).type, 'installStarted');
  await h.waitForInstall(b.page);
  await assertInstalledBytes(b);
});

test('a staged file shorter than its checkpoint starts over and verifies', { timeout: 240_000 }, async (t) => {
  const b = await h.setupPadded(t);
  b.hub.inject(SHARD, { type: 'slow', bytesPerSecond: 3 << 20 });
  assert.equal((await h.startInstall(b.page, b.hub, b.repo)).type, 'installStarted');
  await h.waitForDownload(b.page, (s) => h.fileDone(s, SHARD) >= 14 << 20, 60_000);
  assert.equal((await h.api(b.page, { type: 'pausePack' })).type, 'done');
  await h.waitForDownload(b.page, (s) => s.download?.state === 'paused', 10_000);
  // Something else cut the file (a disk tool, a crash of the file system) below its checkpoint.
  const staged = `${await h.stagingDir(b.page)}/${SHARD}`;
  await until(async () => h.opfsTruncate(b.page, staged, 1 << 20).then(() => true, () => false), 'the file lock');

  b.hub.clearFaults();
  b.hub.reset();
  assert.equal((await h.resumePack(b.page)).type, 'installStarted');
  await h.waitForInstall(b.page);
  await assertInstalledBytes(b);
  // It started over from 0 rather than from the checkpoint it no longer holds.
  assert.deepEqual(b.hub.stats(SHARD).ranges.filter((r) => r && !r.startsWith('bytes=0-')), []);
  assert.equal(h.servedBytes(b.hub, SHARD), SIZE);
});

// Replacing the installed pack, stopped by a browser exit at each step: a pack is installed at every
// moment (the old one or the new one, whole), and the new one ends up installed.
for (const point of ['swap:before-state', 'swap:after-state']) {
  test(`browser killed at ${point}: a whole pack is installed throughout, then the new one`, { timeout: 300_000 }, async (t) => {
    const b = await h.setup(t);
    const oldCommit = b.hub.commit(b.repo);
    const newCommit = b.hub.setRepo(b.repo, { dir: h.fixtureDir(b.repo), salt: 'v2' });
    await h.armFailpoint(b.page, point);
    assert.equal((await h.startInstall(b.page, b.hub, b.repo)).type, 'installStarted');
    await h.waitForFailpoint(b.page);
    const before = await h.packStatus(b.page);
    assert.equal(before.installed, true);

    const nb = await b.relaunch();
    b.close = nb.close;
    const after = await h.packStatus(nb.page);
    assert.equal(after.installed, true, `nothing installed after the restart: ${JSON.stringify(after, h.shorten)}`);
    assert.ok([oldCommit, newCommit].includes(after.commit), after.commit);
    await h.waitForInstall(nb.page);
    const st = await h.packStatus(nb.page);
    assert.equal(st.commit, newCommit);
    await assertInstalledBytes({ ...b, page: nb.page }, newCommit);
    // Nothing left of the old pack or the download.
    const dir = await h.installedDir(nb.page);
    const stray = Object.keys(await h.opfsTree(nb.page)).filter((k) => k.startsWith('packs/') && !k.startsWith(`${dir}/`) && k !== 'packs/' && k !== 'packs/state.json');
    assert.deepEqual(stray, []);
    const { result } = await h.generateOk(nb.page, { prompt: 'a lighthouse', width: 256, height: 256, steps: 1, seed: '3' });
    assert.ok(result.png.length > 0);
  });
}

test('a verified pack waiting to be put in place when the browser closes is installed after the restart at its commit, though main moved: nothing fetched again', { timeout: 300_000 }, async (t) => {
  const b = await h.setup(t);
  const newCommit = b.hub.setRepo(b.repo, { dir: h.fixtureDir(b.repo), salt: 'v2' });
  await h.armFailpoint(b.page, 'swap:before-state');
  assert.equal((await h.startInstall(b.page, b.hub, b.repo)).type, 'installStarted');
  await h.waitForFailpoint(b.page);
  await h.waitForDownload(b.page, (s) => s.download?.state === 'installing', 10_000);
  // Closed before the swap; main moves on meanwhile.
  const third = b.hub.setRepo(b.repo, { dir: h.fixtureDir(b.repo), salt: 'v3' });
  b.hub.reset();
  const nb = await b.relaunch();
  b.close = nb.close; // setup's cleanup closes the new browser
  assert.equal((await h.waitForInstall(nb.page)).commit, newCommit);
  assert.equal((await h.packStatus(nb.page)).commit, newCommit);
  for (const f of h.packFiles(b.hub, b.repo, newCommit).filter((f) => f.path.endsWith('.data'))) {
    assert.equal(b.hub.stats(f.path).requests, 0, `${f.path} fetched again`);
  }
  assert.ok(b.hub.log.every((r) => r.commit !== third), 'a request at the commit main moved to');
  await assertInstalledBytes({ ...b, page: nb.page }, newCommit);
});

test('pause, delete and cancel while the new pack waits to be put in place: the old pack stays usable', { timeout: 300_000 }, async (t) => {
  const b = await h.setup(t);
  const oldCommit = b.hub.commit(b.repo);
  const newCommit = b.hub.setRepo(b.repo, { dir: h.fixtureDir(b.repo), salt: 'v2' });
  await h.armFailpoint(b.page, 'swap:before-state');
  assert.equal((await h.startInstall(b.page, b.hub, b.repo)).type, 'installStarted');
  await h.waitForFailpoint(b.page);
  await h.waitForDownload(b.page, (s) => s.download?.state === 'installing', 10_000);
  // The popup offers no pause while the new pack is put in place.
  await b.page.reload();
  await b.page.waitForFunction(() => /installing/i.test(document.querySelector('#download-done')?.textContent ?? ''), null, { timeout: 10_000 });
  assert.equal(await b.page.isVisible('#pause'), false, 'pause offered while installing');
  assert.equal(await b.page.isVisible('#cancel-download'), true);

  const del = await h.api(b.page, { type: 'deletePack' });
  assert.equal(del.type, 'error', JSON.stringify(del));
  assert.match(del.error, /being installed/);

  assert.equal((await h.api(b.page, { type: 'pausePack' })).type, 'done');
  await h.waitForDownload(b.page, (s) => s.download?.state === 'paused', 10_000);
  assert.equal((await h.packStatus(b.page)).commit, oldCommit);
  // Resumed, it is put in place without downloading anything again.
  b.hub.reset();
  assert.equal((await h.resumePack(b.page)).type, 'installStarted');
  assert.equal((await h.waitForInstall(b.page)).commit, newCommit);
  for (const f of h.packFiles(b.hub, b.repo).filter((f) => f.path.endsWith('.data'))) {
    assert.equal(b.hub.stats(f.path).requests, 0, `${f.path} fetched again`);
  }

  // Once more, cancelled this time: the installed pack is untouched.
  const third = b.hub.setRepo(b.repo, { dir: h.fixtureDir(b.repo), salt: 'v3' });
  assert.notEqual(third, newCommit);
  await h.armFailpoint(b.page, 'swap:before-state');
  assert.equal((await h.startInstall(b.page, b.hub, b.repo)).type, 'installStarted');
  await h.waitForFailpoint(b.page);
  assert.equal((await h.api(b.page, { type: 'cancelPack' })).type, 'done');
  const st = await h.packStatus(b.page);
  assert.equal(st.installed, true);
  assert.equal(st.commit, newCommit);
  assert.equal(st.download ?? null, null);
  const { result } = await h.generateOk(b.page, { prompt: 'a lighthouse', width: 256, height: 256, steps: 1, seed: '3' });
  assert.ok(result.png.length > 0);
});

test('a server that always cuts the file short: gives up after the stated attempts, naming the file', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  b.hub.inject(SHARD, { type: 'cut', afterBytes: 300_000, times: Infinity });
  const t0 = Date.now();
  assert.equal((await h.startInstall(b.page, b.hub, b.repo)).type, 'installStarted');
  const error = await h.waitForInstallFailure(b.page, 120_000);
  assert.ok(error.includes(SHARD), error);
  assert.match(error, /gave up after 6 attempts/);
  // Six attempts, 15.5 s of backoff (jitter takes up to a fifth off).
  const bodies = b.hub.stats(SHARD).ranges.length;
  assert.equal(bodies, 6, JSON.stringify(b.hub.stats(SHARD).ranges));
  assert.ok(Date.now() - t0 >= 12_000, `gave up after ${Date.now() - t0} ms`);
  assert.equal((await h.packStatus(b.page)).download?.state, 'failed');
});

for (const [by, what] of [[4096, 'longer'], [-4096, 'shorter']]) {
  test(`a server whose copy is ${what} than listed: refused at once, naming the file`, { timeout: 120_000 }, async (t) => {
    const b = await h.setupPadded(t);
    b.hub.inject(SHARD, { type: 'resize', by, times: Infinity });
    assert.equal((await h.startInstall(b.page, b.hub, b.repo)).type, 'installStarted');
    const error = await h.waitForInstallFailure(b.page, 60_000);
    assert.ok(error.includes(SHARD), error);
    assert.match(error, new RegExp(`${SIZE + by} bytes, the Hub lists ${SIZE}`));
    assert.equal(b.hub.stats(SHARD).ranges.length, 1, 'retried a body of the wrong length');
  });
}

test('a data file stored in git is verified by its blob id: a corrupted copy is fetched again', { timeout: 180_000 }, async (t) => {
  const DATA = 'vae_decoder.onnx.data';
  const b = await h.setup(t, { install: false, hubOptions: { repos: { 'fixtures/f32': { dir: h.fixtureDir('fixtures/f32'), git: [DATA] } } } });
  const listed = b.hub.file(b.repo, DATA);
  assert.equal(listed.lfs, false);
  b.hub.inject(DATA, { type: 'corrupt', times: 1 });
  await h.installPack(b.page, b.hub, b.repo);
  assert.equal(h.servedBytes(b.hub, DATA), 2 * listed.size, 'the corrupted copy was not fetched again');
  assert.equal(await h.opfsSha256(b.page, `${await h.installedDir(b.page)}/${DATA}`), listed.sha256);
});

test('a graph that names its data file ./name installs and runs', { timeout: 240_000 }, async (t) => {
  // The f32 pack with the decoder's initializers pointing at "./vae_decoder.onnx.data".
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-dotslash-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.cpSync(h.fixtureDir('fixtures/f32'), dir, { recursive: true });
  const rewrite = `
import onnx, sys
path = sys.argv[1]
m = onnx.load(path, load_external_data=False)
for t in m.graph.initializer:
    for e in t.external_data:
        if e.key == "location":
            e.value = "./" + e.value
onnx.save(m, path)
`;
  const r = await h.run('python3', ['-c', rewrite, path.join(dir, 'vae_decoder.onnx')]);
  assert.equal(r.code, 0, r.stderr);
  const b = await h.setup(t, { install: false, hubOptions: { repos: { 'fixtures/dotslash': { dir } } } });
  await h.installPack(b.page, b.hub, 'fixtures/dotslash');
  const tree = await h.opfsTree(b.page);
  assert.ok(`${await h.installedDir(b.page)}/vae_decoder.onnx.data` in tree, JSON.stringify(tree));
  const { result } = await h.generateOk(b.page, { prompt: 'a kite', width: 256, height: 256, steps: 1, seed: '8' });
  assert.ok(result.png.length > 0);
});

test('stray pack files are found and removed: an earlier layout, a slot that holds no pack', { timeout: 180_000 }, async (t) => {
  const b = await h.setup(t);
  const installed = await h.installedDir(b.page);
  const unused = installed === 'packs/a' ? 'packs/b' : 'packs/a';
  // What an earlier version left (a pack/ without its record, a staging directory), and files in the
  // slot that stages downloads while none is kept.
  await h.opfsWrite(b.page, 'pack/transformer_q8-00000.data', 'x'.repeat(1000));
  await h.opfsWrite(b.page, 'pack-staging/download-a.json', '{}');
  await h.opfsWrite(b.page, `${unused}/transformer_q8-00000.data`, 'y'.repeat(1000));
  const del = await h.api(b.page, { type: 'deletePack' });
  assert.equal(del.type, 'done', JSON.stringify(del));
  const left = Object.keys(await h.opfsTree(b.page)).filter((k) => !k.startsWith('results/'));
  assert.deepEqual(left.sort(), ['packs/', 'packs/state.json']);
});

test('a graph served longer than listed is cut off at its listed size, naming it', { timeout: 120_000 }, async (t) => {
  const b = await h.setup(t, { install: false });
  const graph = 'text_encoder_q4.onnx';
  const size = b.hub.file(b.repo, graph).size;
  b.hub.inject(graph, { type: 'resize', by: 1 << 20, times: Infinity });
  const reply = await h.startInstall(b.page, b.hub, b.repo);
  const error = reply.type === 'error' ? reply.error : await h.waitForInstallFailure(b.page, 60_000);
  assert.ok(error.includes(graph), error);
  assert.match(error, new RegExp(`more than the ${size} bytes allowed`));
});

test('a file list larger than the stated limit (16 MiB) is refused, not held', { timeout: 120_000 }, async (t) => {
  // 60,000 made-up entries of about 300 bytes: a listing no pack has.
  const filler = (i) => ({ type: 'file', oid: 'c'.repeat(40), size: 1, path: `junk/${String(i).padStart(6, '0')}-${'x'.repeat(220)}.bin` });
  const mutateTree = (entries) => entries.concat(Array.from({ length: 60_000 }, (_, i) => filler(i)));
  const b = await h.setup(t, { install: false, hubOptions: { repos: { 'fixtures/f32': { dir: h.fixtureDir('fixtures/f32'), mutateTree } } } });
  const plan = await h.api(b.page, { type: 'planPack', endpoint: b.hub.url, repo: b.repo, revision: 'main' });
  assert.equal(plan.type, 'error', JSON.stringify(plan, h.shorten));
  assert.match(plan.error, /the file list of fixtures\/f32 holds more than the 16777216 bytes allowed for it, all pages together/);
});

test('a file list whose pages together pass the limit (16 MiB) is refused, not held', { timeout: 120_000 }, async (t) => {
  // The same 60,000 made-up entries, in pages of 20,000 (about 6 MB each, each under the limit).
  const filler = (i) => ({ type: 'file', oid: 'c'.repeat(40), size: 1, path: `junk/${String(i).padStart(6, '0')}-${'x'.repeat(220)}.bin` });
  const mutateTree = (entries) => entries.concat(Array.from({ length: 60_000 }, (_, i) => filler(i)));
  const b = await h.setup(t, { install: false, hubOptions: { repos: { 'fixtures/f32': { dir: h.fixtureDir('fixtures/f32'), mutateTree } } } });
  b.hub.setTreePageSize(20_000);
  const plan = await h.api(b.page, { type: 'planPack', endpoint: b.hub.url, repo: b.repo, revision: 'main' });
  assert.equal(plan.type, 'error', JSON.stringify(plan, h.shorten));
  assert.match(plan.error, /the file list of fixtures\/f32 holds more than the 16777216 bytes allowed for it, all pages together/);
  // The service worker is still there.
  assert.equal((await h.packStatus(b.page)).installed, false);
});

test('a graph listed far larger than any pack\'s is refused before it is fetched; nothing is written', { timeout: 120_000 }, async (t) => {
  const graph = 'transformer_q8.onnx';
  const huge = 10 * 2 ** 30;
  const mutateTree = (entries) => entries.map((e) => (e.path === graph ? { ...e, size: huge, lfs: { ...e.lfs, size: huge } } : e));
  const b = await h.setup(t, { install: false, hubOptions: { repos: { 'fixtures/f32': { dir: h.fixtureDir('fixtures/f32'), mutateTree } } } });
  const expected = /the Hub lists transformer_q8\.onnx at 10\.7 GB, over the 67\.1 MB allowed for a pack's graph or manifest/;
  const plan = await h.api(b.page, { type: 'planPack', endpoint: b.hub.url, repo: b.repo, revision: 'main' });
  assert.equal(plan.type, 'error', JSON.stringify(plan, h.shorten));
  assert.match(plan.error, expected);
  // The service worker survived it; the popup's "Check the download size" says it; an install asked
  // for the same pack is refused the same way.
  assert.equal((await h.packStatus(b.page)).installed, false);
  await b.page.reload();
  await b.page.waitForSelector('#install-form', { state: 'visible', timeout: 10_000 });
  await b.page.click('summary:has-text("Source")');
  await b.page.fill('#hub-endpoint', b.hub.url);
  await b.page.fill('#hub-repo', b.repo);
  await b.page.click('#check-size');
  await b.page.waitForFunction(() => /over the 67\.1\sMB allowed/.test(document.querySelector('#pack-size')?.textContent ?? ''), null, { timeout: 30_000 });
  const reply = await h.startInstall(b.page, b.hub, b.repo);
  const error = reply.type === 'error' ? reply.error : await h.waitForInstallFailure(b.page, 60_000);
  assert.match(error, expected);
  assert.equal(b.hub.stats(graph).requests, 0, `${graph} was fetched`);
  for (const f of h.packFiles(b.hub, b.repo)) if (f.path.endsWith('.data')) assert.equal(h.servedBytes(b.hub, f.path), 0, f.path);
  assert.equal(await h.installedDir(b.page), null);
});

test('a 206 that covers only part of the range asked for: the rest is asked for from where it stopped', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  const cutAt = 10 << 20;
  const part = 5 << 20;
  // A cut makes the next request a ranged one; its answer covers 5 MiB of it.
  b.hub.inject(SHARD, { type: 'slow', bytesPerSecond: 8 << 20 });
  b.hub.inject(SHARD, { type: 'cut', afterBytes: cutAt });
  b.hub.inject(SHARD, { type: 'shortRange', bytes: part });
  await h.installPack(b.page, b.hub, b.repo, { timeoutMs: 60_000 });
  const starts = b.hub.stats(SHARD).ranges.filter(Boolean).map((r) => Number(/bytes=(\d+)-/.exec(r)[1]));
  assert.equal(starts.length, 2, JSON.stringify(b.hub.stats(SHARD).ranges));
  assert.equal(starts[1], starts[0] + part, `continued at ${starts[1]}, the short range was ${starts[0]}-${starts[0] + part - 1}`);
  await assertInstalledBytes(b);
});
