import { test } from 'node:test';
import * as h from '/work/main/tests/e2e/lib/harness.mjs';
test('create', async (t) => {
  const b = await h.setup(t, {});
  await h.api(b.page, { type: 'keepLoaded', seconds: 0 });
  for (const seed of ['1', '2', '3', '4', '5']) {
    const t0 = Date.now();
    const { result } = await h.generateOk(b.page, { prompt: 'a fox ' + seed, width: 256, height: 256, steps: 2, seed }, 300000);
    console.log('image', Date.now() - t0, result.timings.stages.map((s) => `${s.stage} ws ${Math.round(s.workerStartMs)} cr ${Math.round(s.sessionCreateMs)} [${s.runsMs?.map(Math.round)}]`).join('; '));
    await h.sleep(1000);
  }
});
