// Stage workers: one at a time during a generation, none left after it.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from './harness.mjs';

/** How long a terminated worker's target may linger while the next stage starts. */
const HANDOVER_MS = 500;

test('stage workers run one at a time and are gone after the result', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  // The pack worker of the install must be gone too.
  assert.deepEqual((await h.listWorkers(b.context)).filter(h.isStageWorker), [], 'worker alive after install');

  const watch = h.watchWorkers(b.context, { intervalMs: 50 });
  let samples;
  try {
    await h.generateOk(b.page, { prompt: 'a bowl of cherries', width: 256, height: 256, steps: 2, seed: '11' });
  } finally {
    samples = await watch.stop();
  }
  const errors = samples.filter((s) => s.error);
  assert.deepEqual(errors, [], 'listWorkers failed while polling');

  const stage = samples.map((s) => ({ t: s.t, ids: s.workers.filter(h.isStageWorker).map((w) => w.targetId) }));
  const most = Math.max(...stage.map((s) => s.ids.length));
  assert.ok(most >= 1, 'never saw a stage worker (is the generation running in workers of the offscreen document?)');
  assert.ok(most <= 2, `more than two stage workers at once: ${JSON.stringify(stage.filter((s) => s.ids.length > 2))}`);
  // `terminate()` returns before the browser has torn the target down, so the next stage's worker may
  // appear while the previous one is still going away; each such hand-over must be brief.
  const handovers = new Map();
  for (const s of stage.filter((s) => s.ids.length > 1)) {
    const key = [...s.ids].sort().join(' ');
    const span = handovers.get(key) ?? { from: s.t, to: s.t };
    span.to = s.t;
    handovers.set(key, span);
  }
  for (const [ids, { from, to }] of handovers) {
    assert.ok(to - from <= HANDOVER_MS, `stage workers ${ids} were alive together for ${to - from} ms`);
  }

  // Three stages, each in its own worker: three distinct targets seen, in sequence.
  const seen = [...new Set(stage.flatMap((s) => s.ids))];
  assert.equal(seen.length, 3, `expected 3 stage workers (text encoder, transformer, decoder), saw ${seen.length}`);

  // None remain after the result.
  let left = [];
  for (let i = 0; i < 25; i++) {
    left = (await h.listWorkers(b.context)).filter(h.isStageWorker);
    if (left.length === 0) break;
    await h.sleep(200);
  }
  assert.deepEqual(left, [], 'stage workers alive after the result');
});
