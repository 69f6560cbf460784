// The graphs re-blocked to 32 and stored beside an installed pack (`<stem>.b32.onnx`, `<stem>.b32.data`): a
// damaged form is never used (the image is the one the undamaged form makes, and the form is made again). On
// the tiny real-architecture transformer with the fixture's text encoder and decoder (lib/stored-forms.mjs);
// the download worker's store of the forms is stored-forms-store.test.mjs's and
// stored-forms-space.test.mjs's.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';
import { REQ, TRANSFORMER, graphFiles, installed, storedForm, within } from '../lib/stored-forms.mjs';

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
  const checkMs = (r) => r.timings.stages.find((s) => s.stage === 'transformer').storedFormCheckMs.toFixed(1);
  t.diagnostic(`transformer's stored form (${first.form.bytes} bytes): checked with its checksums in ${checkMs(first.result)} ms at the session's first load`);
  t.diagnostic(`transformer's stored form checked by its lengths in ${checkMs(result)} ms`);
});

test('a stored form with other bytes at the same length is not loaded in a new session: the same image, and the form made again', { timeout: 900_000 }, async (t) => {
  const b = await installed(t);
  const first = await firstImage(b);
  // The repeated scales at the start of the data file, inverted.
  await h.opfsFlipBytes(b.page, first.path, 0, 256);
  // A new browser session's first load of the form checks its checksum.
  const nb = await b.relaunch();
  // What the test's end closes (h.setup's hook), so that the profile is removed after this browser
  // closed, not while it writes to it.
  b.close = nb.close;
  await h.collectEvents(nb.page);
  await h.api(nb.page, { type: 'keepLoaded', seconds: 0 });
  await sameImage({ ...b, ...nb }, first);
  await madeAgain({ ...b, ...nb }, first);
});
