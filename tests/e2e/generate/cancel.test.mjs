// Cancelling a running job: a `cancelled` event, no result, and no stage worker left but those kept loaded.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

test('cancel during the transformer stops the job and its workers', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const reply = await h.api(b.page, {
    type: 'generate',
    prompt: 'a cathedral made of glass',
    width: 512,
    height: 512,
    steps: 8,
    seed: '7',
  });
  assert.equal(reply.type, 'jobStarted', JSON.stringify(reply));
  const { job } = reply;
  await h.waitForEvent(b.page, (e) => e.type === 'progress' && e.job === job && e.progress.stage === 'transformer');

  const cancelReply = await h.api(b.page, { type: 'cancel', job });
  assert.equal(cancelReply.type, 'cancelled', JSON.stringify(cancelReply));
  assert.equal(cancelReply.job, job);
  await h.waitForEvent(b.page, (e) => e.type === 'cancelled' && e.job === job, 30_000);

  // No stage worker that was working survives the cancel: what is left is what stays loaded for the
  // next image (`keepLoaded`, 300 s by default): the text encoder, done before the cancel. `terminate()`
  // is immediate for the page, but the browser may take a while to tear the target down when the worker
  // was still loading its module (ORT and its wasm) under load; a stage that went on running would stay
  // listed far longer than this.
  const residency = await h.api(b.page, { type: 'keepLoaded' });
  assert.deepEqual(residency.loaded, ['textEncoder'], JSON.stringify(residency));
  const stageWorkersSettleAt = async (count) => {
    let workers = [];
    for (let i = 0; i < 150; i++) {
      workers = (await h.listWorkers(b.context)).filter(h.isStageWorker);
      if (workers.length === count) break;
      await h.sleep(200);
    }
    return workers.length;
  };
  assert.equal(await stageWorkersSettleAt(1), 1, 'the transformer and decoder workers still alive after cancel');
  // Keeping nothing loaded ends the last one.
  assert.deepEqual((await h.api(b.page, { type: 'keepLoaded', seconds: 0 })).loaded, []);
  assert.equal(await stageWorkersSettleAt(0), 0, 'a stage worker still alive with nothing kept loaded');

  // Nothing more arrives for the job: no result, no further progress.
  await h.sleep(5_000);
  const evs = await h.events(b.page);
  assert.ok(!evs.some((e) => e.type === 'result' && e.job === job), 'a result arrived for a cancelled job');
  assert.ok(!evs.some((e) => e.type === 'failed' && e.job === job), 'a cancelled job reported failed');
  const state = await h.api(b.page, { type: 'job', job });
  assert.equal(state.type, 'job');
  assert.equal(state.status, 'cancelled', JSON.stringify(state, h.shorten));
});
