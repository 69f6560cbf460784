// Stage workers: each stage in its own worker, the next one loading while the current one runs (two at
// most), none left after the result; loading ahead never costs an image.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from './harness.mjs';

/** The result's timings by stage. */
const byStage = (result) => Object.fromEntries(result.timings.stages.map((s) => [s.stage, s]));

test('each stage runs in its own worker, the next one loading while the current one runs, and none is left after the result', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  // The pack worker of the install must be gone too.
  assert.deepEqual((await h.listWorkers(b.context)).filter(h.isStageWorker), [], 'worker alive after install');

  const watch = h.watchWorkers(b.context, { intervalMs: 50 });
  let samples;
  let result;
  try {
    ({ result } = await h.generateOk(b.page, { prompt: 'a bowl of cherries', width: 256, height: 256, steps: 2, seed: '11' }));
  } finally {
    samples = await watch.stop();
  }
  const errors = samples.filter((s) => s.error);
  assert.deepEqual(errors, [], 'listWorkers failed while polling');

  const stage = samples.map((s) => ({ t: s.t, ids: s.workers.filter(h.isStageWorker).map((w) => w.targetId) }));
  const most = Math.max(...stage.map((s) => s.ids.length));
  assert.ok(most >= 1, 'never saw a stage worker (is the generation running in workers of the offscreen document?)');
  // Two stages at once at most (three only for a moment, while a terminated one is torn down).
  const three = stage.filter((s) => s.ids.length > 2);
  assert.ok(three.length <= 4, `more than two stage workers at once: ${JSON.stringify(three)}`);
  // Three stages, each in its own worker.
  const seen = [...new Set(stage.flatMap((s) => s.ids))];
  assert.equal(seen.length, 3, `expected 3 stage workers (text encoder, transformer, decoder), saw ${seen.length}`);

  // The transformer's session was created while the text encoder worked, the decoder's while the
  // transformer did; each stage ended before the next one's run.
  const s = byStage(result);
  assert.ok(s.transformer.startedAtMs < s.textEncoder.finishedAtMs, JSON.stringify(s));
  assert.ok(s.decoder.startedAtMs < s.transformer.finishedAtMs, JSON.stringify(s));
  assert.ok(s.textEncoder.finishedAtMs <= s.transformer.finishedAtMs && s.transformer.finishedAtMs <= s.decoder.finishedAtMs, JSON.stringify(s));

  // None remain after the result.
  let left = [];
  for (let i = 0; i < 25; i++) {
    left = (await h.listWorkers(b.context)).filter(h.isStageWorker);
    if (left.length === 0) break;
    await h.sleep(200);
  }
  assert.deepEqual(left, [], 'stage workers alive after the result');
});

test('a stage that cannot be created while the one before it is loaded is created again alone, and the image is made', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const req = { prompt: 'a bowl of cherries', width: 256, height: 256, steps: 2, seed: '11' };
  const { result: first } = await h.generateOk(b.page, { ...req, prompt: 'a bowl of plums' });
  await h.armFailpoint(b.page, 'stage:create-fails:Transformer');
  const { result } = await h.generateOk(b.page, req);
  const s = byStage(result);
  // Made again one stage at a time: the prompt was encoded by the first attempt (now cached), and the
  // transformer's second worker started after the text encoder had finished.
  assert.equal(s.textEncoder.workerCreatedAtMs, 0, JSON.stringify(s.textEncoder));
  assert.ok(s.transformer.sessionCreateMs > 0, JSON.stringify(s.transformer));
  assert.equal(result.timings.stages.length, 3);
  assert.ok(first.png.length > 0 && result.png.length > 0);
  // The same image as without the failure.
  const again = await h.generateOk(b.page, req);
  assert.equal(again.result.png, result.png);
});
