// The graphs re-blocked to 32 and stored beside an installed pack (`<stem>.b32.onnx`, `<stem>.b32.data`)
// and the download worker that stores them after a job: a damaged form is never used (the image is the
// one the undamaged form makes, and the form is made again), a store that hangs holds up neither a new
// pack nor the images behind it, a store checks the space first, leaves nothing behind when the disk
// fills and is not tried again after every job, packStatus counts the forms, and deleting the pack while
// a store runs deletes it whole. On the tiny real-architecture pack (tiny-packs.mjs), whose text encoder
// and transformer have MatMulNBits of block 128.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';
import { tinyPack } from '../lib/tiny-packs.mjs';

const REPO = 'tiny/float32';
const REQ = { prompt: 'a red fox in the snow', width: 256, height: 256, steps: 2, seed: '42' };
const TRANSFORMER = 'transformer_q8.onnx';

/** A browser with the tiny float32 pack installed (for WebGPU: its forms stored), stages not kept loaded. */
async function installed(t, launchOpts = {}) {
  const dir = await tinyPack('float32');
  const b = await h.setup(t, { pack: null, install: false, hubOptions: { repos: { [REPO]: { dir } } }, ...launchOpts });
  await h.installPack(b.page, b.hub, REPO);
  // Each image loads its stages afresh, so that each reads the stored forms again.
  await h.api(b.page, { type: 'keepLoaded', seconds: 0 });
  return { ...b, dir, pack: await h.installedDir(b.page) };
}

/** Each stage's graph file in a result's timings, by stage. */
function graphFiles(result) {
  return Object.fromEntries(result.timings.stages.map((s) => [s.stage, s.graphFile]));
}

/** The stored form of `graph` the installed pack's record names, or undefined. */
async function storedForm(page, graph = TRANSFORMER) {
  return (await h.packState(page))?.installed?.block32?.graphs?.find((g) => g.graph === graph);
}

/** Polls `check` (async, truthy when done) every 500 ms for at most `ms`; its last value. */
async function within(ms, check) {
  let value;
  for (const until = Date.now() + ms; !(value = await check()) && Date.now() < until;) await h.sleep(500);
  return value;
}

/** The stored forms' files in the installed pack's directory. */
async function storedFiles(b) {
  return Object.keys(await h.opfsTree(b.page)).filter((k) => k.startsWith(`${b.pack}/`) && k.includes('.b32.'));
}

/**
 * The installed pack as a version before the stored forms installed it: its record without them and
 * their files removed. A job then re-blocks the graphs while loading and stores their forms after it.
 */
async function withoutStoredForms(b) {
  const state = await h.packState(b.page);
  const record = state.installed.block32;
  delete state.installed.block32;
  await h.opfsWrite(b.page, 'packs/state.json', JSON.stringify(state));
  for (const g of record.graphs) for (const f of [g.onnx, g.data]) await h.opfsRemove(b.page, `${b.pack}/${f}`);
  return record;
}

/** The image of REQ from the undamaged stored forms, and the transformer's form with the SHA-256 of its data. */
async function firstImage(b) {
  const { result } = await h.generateOk(b.page, REQ, 600_000);
  assert.equal(graphFiles(result).transformer, 'transformer_q8.b32.onnx');
  const form = await storedForm(b.page);
  return { result, form, path: `${b.pack}/${form.data}`, hash: await h.opfsSha256(b.page, `${b.pack}/${form.data}`) };
}

/** The next image of REQ (its prompt's embeddings are cached: the transformer is what loads) is the first one. */
async function sameImage(b, first) {
  const { result } = await h.generateOk(b.page, REQ, 600_000);
  assert.equal(graphFiles(result).transformer, TRANSFORMER, 'the damaged stored form was loaded');
  assert.ok(h.pngBytes(result).equals(h.pngBytes(first.result)), 'the image differs from the undamaged form\'s');
}

/** The damaged form is made again after the job: the same bytes, named by the record as at install. */
async function madeAgain(b, first) {
  const again = await within(120_000, async () => (await h.opfsSha256(b.page, first.path)) === first.hash && (await storedForm(b.page)));
  assert.deepEqual(again, first.form, 'the stored form was not made again');
}

test('a stored form cut short is not loaded: the same image, re-blocked while loading, and the form made again', { timeout: 900_000 }, async (t) => {
  const b = await installed(t);
  const first = await firstImage(b);
  const size = (await h.opfsTree(b.page))[first.path];
  await h.opfsTruncate(b.page, first.path, Math.floor(size / 2));
  await sameImage(b, first);
  await madeAgain(b, first);
  // And the next image loads the form made again (checked by its lengths: its checksums were this
  // session's first load's).
  const { result } = await h.generateOk(b.page, REQ, 600_000);
  assert.equal(graphFiles(result).transformer, 'transformer_q8.b32.onnx');
  assert.ok(h.pngBytes(result).equals(h.pngBytes(first.result)));
  // What checking costs: the first load of a session reads each form whole for its checksums.
  const forms = (await h.packState(b.page)).installed.block32.graphs;
  const checkMs = (r, stage) => r.timings.stages.find((s) => s.stage === stage).storedFormCheckMs.toFixed(1);
  for (const [stage, graph] of [['textEncoder', 'text_encoder_q4.onnx'], ['transformer', TRANSFORMER]]) {
    const bytes = forms.find((g) => g.graph === graph).bytes;
    t.diagnostic(`${stage}'s stored form (${bytes} bytes): checked with its checksums in ${checkMs(first.result, stage)} ms at the session's first load`);
  }
  t.diagnostic(`transformer's stored form checked by its lengths in ${checkMs(result, 'transformer')} ms`);
});

test('a stored form with other bytes at the same length is not loaded in a new session: the same image, and the form made again', { timeout: 900_000 }, async (t) => {
  const b = await installed(t);
  const first = await firstImage(b);
  // The repeated scales at the start of the data file, inverted.
  await h.opfsFlipBytes(b.page, first.path, 0, 256);
  // A new browser session's first load of the form checks its checksum.
  const nb = await b.relaunch();
  t.after(() => nb.close());
  await h.collectEvents(nb.page);
  await h.api(nb.page, { type: 'keepLoaded', seconds: 0 });
  await sameImage({ ...b, ...nb }, first);
  await madeAgain({ ...b, ...nb }, first);
});

test('a store of the forms that hangs holds up neither a new pack nor the image queued behind it', { timeout: 900_000 }, async (t) => {
  const b = await installed(t);
  await withoutStoredForms(b);
  // The store after the next job holds for ever once its first form is written.
  await h.armFailpoint(b.page, 'block32:graph-done');
  await h.generateOk(b.page, REQ, 600_000);
  await h.waitForFailpoint(b.page, 120_000);
  // A new commit of the pack is installed, and an image is asked for while it is put in place.
  const commit = b.hub.setRepo(REPO, { dir: b.dir });
  assert.equal((await h.startInstall(b.page, b.hub, REPO)).type, 'installStarted');
  await h.waitForDownload(b.page, (s) => s.download?.state === 'installing' || s.commit === commit, 120_000);
  const queued = await h.api(b.page, { type: 'generate', ...REQ, seed: '7' });
  assert.equal(queued.type, 'jobStarted', JSON.stringify(queued));
  await h.waitForInstall(b.page, 120_000);
  assert.equal((await h.packState(b.page)).installed.commit, commit);
  const ended = await h.waitForJobEnd(b.page, queued.job, 300_000);
  assert.equal(ended.type, 'result', JSON.stringify(ended, h.shorten));
});

test('storing the forms checks the space first, is not tried again after every job, and packStatus counts them', { timeout: 900_000 }, async (t) => {
  const b = await installed(t);
  const record = await withoutStoredForms(b);
  const form = record.graphs.find((g) => g.graph === TRANSFORMER);
  // Room for the job's image, not for the transformer's form (with unlimitedStorage the override is
  // what the extension's estimate reports).
  const { usage } = await h.storageEstimate(b.page);
  await h.setQuota(b.context, b.page, usage + Math.floor(form.bytes / 2));
  await h.generateOk(b.page, REQ, 600_000);
  assert.deepEqual(await within(15_000, () => storedFiles(b).then((f) => f.length > 0 && f)), false, 'forms stored without the room for them');
  assert.equal(await storedForm(b.page), undefined);
  // With room again, the next job does not try at once: a failed store waits before it is tried again.
  await h.setQuota(b.context, b.page, null);
  await h.generateOk(b.page, REQ, 600_000);
  assert.deepEqual(await within(15_000, () => storedFiles(b).then((f) => f.length > 0 && f)), false, 'tried again right after the next job');
  // Once that wait is over (shortened here) the store is made, and packStatus counts its bytes.
  await h.opfsWrite(b.page, 'block32-retry-ms', '0');
  await h.generateOk(b.page, REQ, 600_000);
  const stored = await within(120_000, () => storedForm(b.page));
  assert.deepEqual(stored, form);
  const status = await h.packStatus(b.page);
  const all = (await h.packState(b.page)).installed.block32.graphs.reduce((n, g) => n + g.bytes, 0);
  assert.ok(all >= stored.bytes);
  assert.equal(status.block32Bytes, all, JSON.stringify(status, h.shorten));
});

test('a store of the forms that runs out of disk part way leaves no partial file', { timeout: 900_000 }, async (t) => {
  // Without unlimitedStorage, a quota override limits OPFS writes (and the estimate does not show it).
  const b = await installed(t, { extDir: h.quotaDist() });
  await h.generateOk(b.page, REQ, 600_000);
  const form = (await withoutStoredForms(b)).graphs.find((g) => g.graph === TRANSFORMER);
  // Room for the job's image (its prompt's embeddings are cached), not for the transformer's form.
  const { usage } = await h.storageEstimate(b.page);
  await h.setQuota(b.context, b.page, usage + Math.floor(form.bytes / 2));
  await h.generateOk(b.page, REQ, 600_000);
  // Give the store time to fail.
  await h.sleep(15_000);
  assert.deepEqual(await storedFiles(b), [], 'partial files of the store are left');
  assert.equal(await storedForm(b.page), undefined);
});

test('deleting the pack while its forms are being stored deletes it whole, and the store brings nothing back', { timeout: 900_000 }, async (t) => {
  const b = await installed(t);
  await withoutStoredForms(b);
  await h.armFailpoint(b.page, 'block32:graph-done');
  await h.generateOk(b.page, REQ, 600_000);
  // The store holds with the form's files open.
  await h.waitForFailpoint(b.page, 120_000);
  const started = Date.now();
  const reply = await h.api(b.page, { type: 'deletePack' });
  assert.equal(reply.type, 'done', JSON.stringify(reply));
  assert.ok(Date.now() - started < 8_000, `deleting took ${Date.now() - started} ms`);
  const packs = () => h.opfsTree(b.page).then((tree) => Object.keys(tree).filter((k) => k.startsWith('packs/') && !['packs/', 'packs/state.json'].includes(k)));
  assert.deepEqual(await packs(), []);
  // Nothing the store does afterwards brings the deleted pack back.
  await h.sleep(5_000);
  assert.equal((await h.packState(b.page)).installed, null);
  assert.deepEqual(await packs(), []);
  assert.equal((await h.packStatus(b.page)).installed, false);
});
