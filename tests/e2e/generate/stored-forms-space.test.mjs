// The disk space of the download worker's store of the graphs re-blocked to 32 beside the installed pack
// (after a job whose stages re-blocked them while loading): a store checks the space first, leaves nothing
// behind when the disk fills and is not tried again after every job, and packStatus counts the forms. On the
// tiny real-architecture transformer with the fixture's text encoder and decoder (lib/stored-forms.mjs);
// damaged forms are stored-forms.test.mjs's, a store that hangs stored-forms-store.test.mjs's.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';
import { REQ, TRANSFORMER, installed, storedFiles, storedForm, within, withoutStoredForms } from '../lib/stored-forms.mjs';

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
