// The download worker that stores the graphs re-blocked to 32 beside the installed pack after a job whose
// stages re-blocked them while loading, held part way (a failpoint): a store that hangs holds up neither a
// new pack nor the images behind it, and deleting the pack while a store runs deletes it whole. On the tiny
// real-architecture transformer with the fixture's text encoder and decoder (lib/stored-forms.mjs); damaged
// forms are stored-forms.test.mjs's, the store's disk space stored-forms-space.test.mjs's.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';
import { REPO, REQ, installed, withoutStoredForms } from '../lib/stored-forms.mjs';

test('a store of the forms that hangs holds up neither a new pack nor the image queued behind it', { timeout: 900_000 }, async (t) => {
  const b = await installed(t);
  await withoutStoredForms(b);
  // The store after the next job holds for ever once its first form is written.
  await h.armFailpoint(b.page, 'block32:graph-done');
  await h.generateOk(b.page, REQ, 600_000);
  await h.waitForFailpoint(b.page, 120_000);
  // A new commit of the pack is installed, and an image is asked for while it is put in place.
  const commit = b.hub.setRepo(REPO, b.spec);
  assert.equal((await h.startInstall(b.page, b.hub, REPO)).type, 'installStarted');
  await h.waitForDownload(b.page, (s) => s.download?.state === 'installing' || s.commit === commit, 120_000);
  const queued = await h.api(b.page, { type: 'generate', ...REQ, seed: '7' });
  assert.equal(queued.type, 'jobStarted', JSON.stringify(queued));
  await h.waitForInstall(b.page, 120_000);
  assert.equal((await h.packState(b.page)).installed.commit, commit);
  const ended = await h.waitForJobEnd(b.page, queued.job, 300_000);
  assert.equal(ended.type, 'result', JSON.stringify(ended, h.shorten));
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
