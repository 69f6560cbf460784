// Installing from the (fake) Hub: the plan, what is fetched and from where, checks before anything is
// written, paths that escape the pack, one download for two requests, delete.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const REPO = 'fixtures/f32';
const sum = (files) => files.reduce((n, f) => n + f.size, 0);

test('planPack: total = the pack files at the resolved commit; nothing written or downloaded', { timeout: 120_000 }, async (t) => {
  const b = await h.setup(t, { install: false });
  const plan = await h.api(b.page, { type: 'planPack', endpoint: b.hub.url, repo: REPO, revision: 'main' });
  assert.equal(plan.type, 'packPlan', JSON.stringify(plan));
  assert.equal(plan.commit, b.hub.commit(REPO));
  const want = h.packFiles(b.hub, REPO);
  assert.deepEqual(plan.files.map((f) => f.path).sort(), want.map((f) => f.path).sort());
  assert.equal(plan.totalBytes, sum(want));
  for (const f of plan.files) {
    const w = want.find((x) => x.path === f.path);
    assert.equal(f.size, w.size, f.path);
    if (w.lfs) assert.equal(f.sha256, w.sha256, f.path);
  }
  // Only graphs and manifests may have been read to make the plan; no shard, nothing written.
  for (const f of want.filter((f) => f.path.endsWith('.data'))) assert.equal(h.servedBytes(b.hub, f.path), 0, f.path);
  assert.ok(!(await h.opfsEntries(b.page)).some((n) => n.startsWith('pack')), 'planPack wrote to OPFS');
  const st = await h.packStatus(b.page);
  assert.equal(st.installed, false);
  assert.equal(st.download ?? null, null);
});

test('a file list the Hub serves in pages is read to its last page', { timeout: 120_000 }, async (t) => {
  const b = await h.setup(t, { install: false });
  b.hub.setTreePageSize(3);
  const plan = await h.api(b.page, { type: 'planPack', endpoint: b.hub.url, repo: REPO, revision: 'main' });
  assert.equal(plan.type, 'packPlan', JSON.stringify(plan));
  const want = h.packFiles(b.hub, REPO);
  assert.deepEqual(plan.files.map((f) => f.path).sort(), want.map((f) => f.path).sort());
  assert.equal(plan.totalBytes, sum(want));
  const pages = b.hub.log.filter((r) => r.server === 'hub' && r.url.includes('/tree/'));
  assert.ok(pages.length >= 4, `the list came in ${pages.length} requests`);
  assert.ok(pages.slice(1).every((r) => r.url.includes('cursor=')), JSON.stringify(pages.map((r) => r.url)));
});

test('install: every pack file once, at the commit, nothing else; generate; deletePack frees it', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t, { install: false });
  // Host permissions granted earlier for custom sources (a test cannot answer Chrome's prompt, so the
  // service worker's chrome.permissions stands in for it): one for another mirror, one for this source.
  const sw = await h.currentServiceWorker(b.context, b.extensionId);
  await sw.evaluate(() => {
    const real = chrome.permissions.getAll.bind(chrome.permissions);
    self.__granted = ['https://old-mirror.example/*', 'http://127.0.0.1/*'];
    self.__removed = [];
    chrome.permissions.getAll = async () => {
      const all = await real();
      return { ...all, origins: [...all.origins, ...self.__granted] };
    };
    chrome.permissions.remove = async ({ origins }) => {
      self.__removed.push(origins);
      self.__granted = self.__granted.filter((o) => !origins.includes(o));
      return true;
    };
  });
  const ev = await h.installPack(b.page, b.hub, REPO);
  // Installed from this source: the other mirror's permission is given back, this source's kept.
  for (const t0 = Date.now(); (await sw.evaluate(() => self.__removed.length)) === 0 && Date.now() - t0 < 10_000; ) await h.sleep(100);
  assert.deepEqual(await sw.evaluate(() => self.__removed), [['https://old-mirror.example/*']]);
  const commit = b.hub.commit(REPO);
  const files = h.packFiles(b.hub, REPO);
  assert.equal(ev.commit, commit);
  assert.equal(ev.bytes, sum(files));
  h.assertServed(b.hub, REPO);
  for (const f of files) assert.equal(b.hub.stats(f.path).bodyBytes, f.size, `${f.path} served more than once`);
  // Resolve requests name the commit, never the branch; LFS files came from the CDN.
  const resolves = b.hub.log.filter((r) => r.server === 'hub' && r.rev);
  assert.ok(resolves.length >= files.length);
  assert.ok(resolves.every((r) => r.rev === commit), JSON.stringify(resolves.map((r) => r.url)));
  for (const f of files.filter((f) => f.lfs)) assert.ok(b.hub.stats(f.path).cdnRequests >= 1, f.path);

  const st = await h.packStatus(b.page);
  assert.equal(st.installed, true);
  assert.equal(st.commit, commit);
  assert.equal(st.source.repo, REPO);
  assert.equal(st.source.endpoint.replace(/\/$/, ''), b.hub.url);
  assert.equal(st.bytes, sum(files));
  assert.equal(st.download ?? null, null);
  assert.ok(st.storage.usageBytes >= sum(files), JSON.stringify(st.storage));
  assert.ok(st.storage.quotaBytes > 0);

  const tree = await h.opfsTree(b.page);
  const dir = await h.installedDir(b.page);
  assert.ok(dir, `packs/state.json names no installed pack: ${JSON.stringify(await h.packState(b.page))}`);
  for (const f of files) assert.equal(tree[`${dir}/${f.path}`], f.size, `${dir}/${f.path} in OPFS: ${JSON.stringify(tree)}`);
  // The pack's files and the state, nothing else: no download record, nothing staged.
  const expected = ['packs/', 'packs/state.json', `${dir}/`, ...files.map((f) => `${dir}/${f.path}`)].sort();
  assert.deepEqual(Object.keys(tree).filter((k) => k.startsWith('packs/')).sort(), expected);

  const { result } = await h.generateOk(b.page, { prompt: 'a red fox', width: 256, height: 256, steps: 2, seed: '1' });
  assert.ok(result.png.length > 0);

  // The job ends just after its last image's result; a deletion while it runs is refused (below).
  assert.equal((await h.endedJob(b.page, result.job)).status, 'done');
  const del = await h.api(b.page, { type: 'deletePack' });
  assert.equal(del.type, 'done', JSON.stringify(del));
  // Deleted: nothing uses this source any more, its permission is given back too.
  assert.deepEqual(await sw.evaluate(() => self.__removed), [['https://old-mirror.example/*'], ['http://127.0.0.1/*']]);
  const after = await h.packStatus(b.page);
  assert.equal(after.installed, false);
  assert.ok(after.storage.usageBytes < st.storage.usageBytes - sum(files) / 2, `storage not freed: ${JSON.stringify([st.storage, after.storage])}`);
  const left = Object.keys(await h.opfsTree(b.page)).filter((k) => k.startsWith('packs/'));
  assert.deepEqual(left.sort(), ['packs/', 'packs/state.json'], 'pack files left in OPFS after deletePack');
  const g = await h.generate(b.page, { prompt: 'x', width: 256, height: 256, steps: 1, seed: '1' });
  assert.ok(!g.result, 'generated without a pack');
  // Host permissions: the Hub's for good, nothing else held after the install and the deletion; the
  // manifest may ask for an https host or a loopback one, never any http host.
  const { granted, manifest } = await b.page.evaluate(async () => ({ granted: await chrome.permissions.getAll(), manifest: chrome.runtime.getManifest() }));
  assert.deepEqual(granted.origins.sort(), manifest.host_permissions.sort());
  assert.deepEqual(manifest.optional_host_permissions, ['https://*/*', 'http://localhost/*', 'http://127.0.0.1/*', 'http://[::1]/*']);
});

test('a new pack installed while a generation runs replaces the old one only after that job', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const old = b.hub.commit(REPO);
  const fresh = b.hub.setRepo(REPO, { dir: h.fixtureDir(REPO), salt: 'v2' });
  assert.notEqual(fresh, old);
  await h.collectEvents(b.page);
  const job = await h.api(b.page, { type: 'generate', prompt: 'a lighthouse', width: 512, height: 512, steps: 4, seed: '7' });
  assert.equal(job.type, 'jobStarted', JSON.stringify(job));
  await h.waitForEvent(b.page, (e) => e.type === 'progress' && e.job === job.job && e.progress.stage === 'transformer');
  // The install starts while the job runs: its pack must not replace the files the job is reading.
  const reply = await h.startInstall(b.page, b.hub, REPO);
  assert.equal(reply.type, 'installStarted', JSON.stringify(reply));
  // The install waits for the job, which may take a while on a loaded machine.
  const installed = await h.waitForInstall(b.page, h.GENERATION_TIMEOUT_MS + h.INSTALL_TIMEOUT_MS);
  assert.equal(installed.commit, fresh);
  const evs = await h.events(b.page);
  const resultAt = evs.findIndex((e) => e.job === job.job && ['result', 'failed', 'cancelled'].includes(e.type));
  const installedAt = evs.findIndex((e) => e.type === 'packInstalled');
  assert.ok(resultAt >= 0 && resultAt < installedAt, `the job ended at event ${resultAt}, the pack was replaced at ${installedAt}`);
  assert.equal(evs[resultAt].type, 'result', JSON.stringify(evs[resultAt], h.shorten));
  // Meanwhile the popup said why the install waited.
  const installing = evs.findIndex((e) => e.type === 'packProgress' && e.state === 'installing');
  assert.ok(installing >= 0 && installing < resultAt, `installing reported at event ${installing}`);
  assert.equal((await h.packStatus(b.page)).commit, fresh);
  await h.generateOk(b.page, { prompt: 'a lighthouse', width: 256, height: 256, steps: 1, seed: '7' });
});

test('two installPack requests at once start one download', { timeout: 180_000 }, async (t) => {
  const b = await h.setup(t, { install: false, hubOptions: { pad: { 'transformer_q8-00000.data': 16 << 20 } } });
  const req = { type: 'installPack', endpoint: b.hub.url, repo: REPO, revision: 'main' };
  await h.collectEvents(b.page);
  const [r1, r2] = await b.page.evaluate((m) => Promise.all([chrome.runtime.sendMessage(m), chrome.runtime.sendMessage(m)]), req);
  assert.equal(r1.type, 'installStarted', JSON.stringify(r1));
  assert.equal(r2.type, 'installStarted', JSON.stringify(r2));
  await h.waitForInstall(b.page);
  h.assertServed(b.hub, REPO);
  for (const f of h.packFiles(b.hub, REPO)) assert.equal(b.hub.stats(f.path).bodyBytes, f.size, `${f.path} fetched twice`);
  const revisions = b.hub.log.filter((r) => r.url.includes('/revision/'));
  assert.ok(revisions.length <= 2, `revision resolved ${revisions.length} times`);
  const installed = (await h.events(b.page)).filter((e) => e.type === 'packInstalled');
  assert.equal(installed.length, 1, 'more than one packInstalled');
});

test('an install of another pack while one downloads is refused, naming it; the running one goes on', { timeout: 180_000 }, async (t) => {
  const b = await h.setup(t, { install: false, hubOptions: { pad: { 'transformer_q8-00000.data': 16 << 20 } } });
  b.hub.inject('transformer_q8-00000.data', { type: 'slow', bytesPerSecond: 4 << 20 });
  assert.equal((await h.startInstall(b.page, b.hub, REPO)).type, 'installStarted');
  const other = await h.api(b.page, { type: 'installPack', endpoint: b.hub.url, repo: 'fixtures/f16', revision: 'main' });
  assert.equal(other.type, 'error', JSON.stringify(other));
  assert.ok(other.error.includes(`a download of ${REPO}@main is running`), other.error);
  assert.match(other.error, /pause or cancel it/);
  // The same pack again joins the running download.
  assert.equal((await h.startInstall(b.page, b.hub, REPO)).type, 'installStarted');
  b.hub.clearFaults();
  await h.waitForInstall(b.page);
  h.assertServed(b.hub, REPO);
  assert.equal(b.hub.log.filter((r) => r.url.includes('fixtures/f16')).length, 0, 'the other pack was fetched');
});

test('deleting the pack while an image is being made is refused; once the job ended it is deleted', { timeout: 300_000 }, async (t) => {
  const b = await h.setup(t);
  await h.armFailpoint(b.page, 'stage:session-created:TextEncoder');
  const job = await h.api(b.page, { type: 'generate', prompt: 'a held fox', width: 256, height: 256, steps: 1, seed: '1' });
  assert.equal(job.type, 'jobStarted', JSON.stringify(job));
  await h.waitForFailpoint(b.page, 60_000);
  const refused = await h.api(b.page, { type: 'deletePack' });
  assert.equal(refused.type, 'error', JSON.stringify(refused));
  assert.match(refused.error, /an image is being made: delete the model pack once it is done, or cancel it first/);
  assert.equal((await h.packStatus(b.page)).installed, true);
  assert.equal((await h.api(b.page, { type: 'cancel', job: job.job })).type, 'cancelled');
  await h.waitForJobEnd(b.page, job.job, 60_000, 60_000);
  assert.equal((await h.api(b.page, { type: 'deletePack' })).type, 'done');
  assert.equal((await h.packStatus(b.page)).installed, false);
});

test('the float16 pack with the default (webgpu) backend, without shader-f16: planned with its float32 cost, installed converted', { timeout: 300_000 }, async (t) => {
  // Before the float32 conversion this was refused before downloading. Now the plan states the cost, and the
  // install converts after the download (f32-conversion.test.mjs checks the image and resuming).
  const b = await h.setup(t, { install: false });
  const plan = await h.api(b.page, { type: 'planPack', endpoint: b.hub.url, repo: 'fixtures/f16', revision: 'main' });
  assert.equal(plan.type, 'packPlan', JSON.stringify(plan));
  assert.ok(plan.conversion?.extraDiskBytes > 0, JSON.stringify(plan.conversion));
  assert.ok(plan.conversion?.gpuBytes > 0, JSON.stringify(plan.conversion));
  await h.installPack(b.page, b.hub, 'fixtures/f16');
  const status = await h.packStatus(b.page);
  assert.equal(status.installed, true);
  assert.equal(status.source.repo, 'fixtures/f16');
  assert.ok((await h.packState(b.page)).installed.conversion, 'installed without its float32 conversion');
});

test('not enough quota is refused before downloading, and says storage', { timeout: 120_000 }, async (t) => {
  const b = await h.setup(t, { install: false });
  const total = sum(h.packFiles(b.hub, REPO));
  // With unlimitedStorage, the override changes what navigator.storage.estimate() reports.
  await h.setQuota(b.context, b.page, Math.floor(total / 2));
  const est = await h.storageEstimate(b.page);
  assert.ok(est.quota < total, `quota override not visible to the extension: ${JSON.stringify(est)}`);
  const reply = await h.startInstall(b.page, b.hub, REPO);
  const error = reply.type === 'error' ? reply.error : await h.waitForInstallFailure(b.page, 60_000);
  assert.match(error, /storage|space|quota/i);
  for (const f of h.packFiles(b.hub, REPO)) if (f.path.endsWith('.data')) assert.equal(h.servedBytes(b.hub, f.path), 0, f.path);
  assert.ok(!(await h.opfsEntries(b.page)).some((n) => n.startsWith('pack')), 'wrote to OPFS');
});

for (const [name, spec, needle] of [
  [
    'a manifest listing ../evil.data',
    { override: { 'transformer_q8.manifest.json': JSON.stringify({ shards: [{ path: '../evil.data' }, { path: 'transformer_q8-00001.data' }] }) } },
    'evil.data',
  ],
  [
    'a manifest listing an absolute path',
    { override: { 'text_encoder_q4.manifest.json': JSON.stringify({ shards: [{ path: '/etc/evil.data' }] }) } },
    'evil.data',
  ],
  [
    'a tree entry (named by the manifest) with a backslash',
    {
      override: { 'transformer_q8.manifest.json': JSON.stringify({ shards: [{ path: 'sub\\evil.data' }, { path: 'transformer_q8-00001.data' }] }) },
      files: { 'sub\\evil.data': Buffer.alloc(1000, 1) },
    },
    'evil.data',
  ],
  [
    'a manifest naming a shard in a sub-folder',
    {
      override: { 'transformer_q8.manifest.json': JSON.stringify({ shards: [{ path: 'transformer_q8-00000.data' }, { path: 'transformer_q8-00001.data' }, { path: 'shards/extra.data' }] }) },
      files: { 'shards/extra.data': Buffer.alloc(1000, 1) },
    },
    'shards/extra.data, which is in a sub-folder: a pack\'s files must all be at the top of the repo',
  ],
  [
    // Imagine's own files beside an installed pack (the graphs re-blocked to 32): a pack file of that name
    // would be overwritten, then removed, after it was verified.
    'a manifest listing transformer_q8.b32.data, a name Imagine stores its re-blocked graphs under',
    {
      override: { 'transformer_q8.manifest.json': JSON.stringify({ shards: [{ path: 'transformer_q8-00000.data' }, { path: 'transformer_q8-00001.data' }, { path: 'transformer_q8.b32.data' }] }) },
      files: { 'transformer_q8.b32.data': Buffer.alloc(1000, 1) },
    },
    '"transformer_q8.b32.data" is not allowed as a file name in the pack: the name is reserved',
  ],
  [
    // Imagine's own files beside an installed pack (the graphs re-blocked to 32): a pack file of that name
    // would be overwritten, then removed, after it was verified.
    'a manifest listing text_encoder_q4.b32.onnx, a name Imagine stores its re-blocked graphs under',
    {
      override: { 'text_encoder_q4.manifest.json': JSON.stringify({ shards: [{ path: 'text_encoder_q4-00000.data' }, { path: 'text_encoder_q4-00001.data' }, { path: 'text_encoder_q4.b32.onnx' }] }) },
      files: { 'text_encoder_q4.b32.onnx': Buffer.alloc(1000, 1) },
    },
    '"text_encoder_q4.b32.onnx" is not allowed as a file name in the pack: the name is reserved',
  ],
  [
    // Imagine's own files beside an installed pack (the graphs re-blocked to 32): a pack file of that name
    // would be overwritten, then removed, after it was verified.
    'a manifest listing imagine-block32.data, a name Imagine stores its re-blocked graphs under',
    {
      override: { 'transformer_q8.manifest.json': JSON.stringify({ shards: [{ path: 'transformer_q8-00000.data' }, { path: 'transformer_q8-00001.data' }, { path: 'imagine-block32.data' }] }) },
      files: { 'imagine-block32.data': Buffer.alloc(1000, 1) },
    },
    '"imagine-block32.data" is not allowed as a file name in the pack: the name is reserved',
  ],
  [
    'a size that makes no sense (tree size and LFS size disagree)',
    {
      mutateTree: (entries) =>
        entries.map((e) => (e.path === 'transformer_q8-00001.data' ? { ...e, size: e.size + 1 } : e)),
    },
    'transformer_q8-00001.data',
  ],
]) {
  test(`refused with a clear error, nothing written: ${name}`, { timeout: 120_000 }, async (t) => {
    const hub = await h.startHub({ repos: { 'bad/pack': { dir: h.fixtureDir('fixtures/f32'), ...spec } } });
    t.after(() => hub.close());
    const b = await h.launch();
    t.after(() => b.close());
    const reply = await h.startInstall(b.page, hub, 'bad/pack');
    const error = reply.type === 'error' ? reply.error : await h.waitForInstallFailure(b.page, 60_000);
    assert.ok(error.includes(needle), `error does not name ${needle}: ${error}`);
    assert.equal(hub.stats('../evil.data').requests + hub.stats('/etc/evil.data').requests + hub.stats('sub\\evil.data').requests, 0);
    for (const f of h.packFiles(hub, 'bad/pack')) if (f.path.endsWith('.data')) assert.equal(h.servedBytes(hub, f.path), 0, f.path);
    const tree = await h.opfsTree(b.page);
    assert.ok(!Object.keys(tree).some((k) => k.startsWith('pack')), `wrote to OPFS: ${JSON.stringify(tree)}`);
    assert.equal((await h.packStatus(b.page)).installed, false);
  });
}
