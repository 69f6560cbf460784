// Jobs run one at a time, in the order they were asked for.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from './harness.mjs';

test('two generations asked for at once run one after the other', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  await h.collectEvents(b.page);
  const request = (seed) => ({ type: 'generate', prompt: 'a kite', width: 256, height: 256, steps: 1, seed });
  const [first, second] = await b.page.evaluate(
    ([a, c]) => Promise.all([chrome.runtime.sendMessage(a), chrome.runtime.sendMessage(c)]),
    [request('1'), request('2')],
  );
  assert.equal(first.type, 'jobStarted', JSON.stringify(first));
  assert.equal(second.type, 'jobStarted', JSON.stringify(second));
  for (const { job } of [first, second]) {
    await h.waitForEvent(b.page, (e) => e.type === 'result' && e.job === job, 300_000);
  }
  // Every event of one job comes before every event of the other.
  const jobs = (await h.events(b.page)).filter((e) => e.job === first.job || e.job === second.job).map((e) => e.job);
  const firstRun = jobs[0];
  const switches = jobs.filter((job, i) => i > 0 && job !== jobs[i - 1]).length;
  assert.equal(switches, 1, `the two jobs interleaved: ${jobs.map((j) => (j === firstRun ? 'A' : 'B')).join('')}`);
});
