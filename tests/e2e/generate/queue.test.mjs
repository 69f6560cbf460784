// Jobs run one at a time, in the order they were asked for.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

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

test('the jobs of an offscreen document that closes end failed within a minute; the next image works', { timeout: 400_000 }, async (t) => {
  const b = await h.setup(t);
  const request = (prompt) => ({ type: 'generate', prompt, width: 256, height: 256, steps: 1, seed: '1' });
  // One job running (its text encoder held after loading), one queued behind it.
  await h.armFailpoint(b.page, 'stage:session-created:TextEncoder');
  const running = await h.api(b.page, request('a held kite'));
  const queued = await h.api(b.page, request('a queued kite'));
  assert.equal(running.type, 'jobStarted', JSON.stringify(running));
  assert.equal(queued.type, 'jobStarted', JSON.stringify(queued));
  await h.waitForFailpoint(b.page, 60_000);
  // As a renderer out of memory or another extension page would: the document goes, its jobs with it.
  await b.serviceWorker.evaluate(() => chrome.offscreen.closeDocument());
  const closed = Date.now();
  // No page asks about the jobs: the service worker's own check ends them, and the pages hear of it.
  for (const { job } of [running, queued]) {
    const end = await h.waitForJobEnd(b.page, job, 90_000, 90_000);
    assert.equal(end.type, 'failed', JSON.stringify(end, h.shorten));
    assert.match(end.error, /the page that makes images closed/);
  }
  assert.ok(Date.now() - closed < 60_000, `ended ${Date.now() - closed} ms after the document closed`);
  for (const { job } of [running, queued]) assert.equal((await h.api(b.page, { type: 'job', job })).status, 'failed');
  // A new document takes the next job.
  const { result } = await h.generateOk(b.page, { prompt: 'a red kite', width: 256, height: 256, steps: 1, seed: '2' });
  assert.ok(result.png.length > 0);
});

// More jobs than the service worker keeps ended ones of (8): none that is queued or running is forgotten.
const TEN = Array.from({ length: 10 }, (_, i) => ({ type: 'generate', prompt: `a kite number ${i + 1}`, width: 256, height: 256, steps: 1, seed: String(i + 1) }));

/** Sends every request at once from the page; the replies, in order. */
async function startAll(page, requests) {
  const replies = await page.evaluate((all) => Promise.all(all.map((r) => chrome.runtime.sendMessage(r))), requests);
  for (const reply of replies) assert.equal(reply.type, 'jobStarted', JSON.stringify(reply));
  return replies.map((r) => r.job);
}

test('ten jobs queued at once: each can be asked for while it waits, and each ends with its image', { timeout: 900_000 }, async (t) => {
  const b = await h.setup(t);
  await h.collectEvents(b.page);
  const jobs = await startAll(b.page, TEN);
  // The first loads its stages for seconds: the others wait behind it, and a page asking for any of
  // them (one opened late, say) hears that it is on its way.
  for (const [i, job] of jobs.entries()) {
    const state = await h.api(b.page, { type: 'job', job });
    // (The first may be done already on a fast machine; none is gone.)
    assert.ok(['running', 'done'].includes(state.status), `job ${i + 1} of 10, queued: ${JSON.stringify(state, h.shorten)}`);
    if (state.status === 'running') assert.equal(state.prompt, `a kite number ${i + 1}`);
  }
  for (const [i, job] of jobs.entries()) {
    const end = await h.waitForJobEnd(b.page, job, 300_000);
    assert.equal(end.type, 'result', `job ${i + 1}: ${JSON.stringify(end, h.shorten)}`);
    const state = await h.endedJob(b.page, job);
    assert.equal(state.status, 'done', `job ${i + 1} once ended: ${JSON.stringify(state, h.shorten)}`);
    assert.ok(state.result.png.length > 0);
  }
});

test('ten jobs queued when the offscreen document closes: every one of them ends failed', { timeout: 400_000 }, async (t) => {
  const b = await h.setup(t);
  await h.collectEvents(b.page);
  // The first job held once its text encoder has loaded; nine more queued behind it.
  await h.armFailpoint(b.page, 'stage:session-created:TextEncoder');
  const jobs = await startAll(b.page, TEN);
  await h.waitForFailpoint(b.page, 60_000);
  for (const [i, job] of jobs.entries()) {
    const state = await h.api(b.page, { type: 'job', job });
    assert.equal(state.status, 'running', `job ${i + 1} of 10, before the document closed: ${JSON.stringify(state, h.shorten)}`);
  }
  await b.serviceWorker.evaluate(() => chrome.offscreen.closeDocument());
  for (const [i, job] of jobs.entries()) {
    const end = await h.waitForJobEnd(b.page, job, 90_000, 90_000);
    assert.equal(end.type, 'failed', `job ${i + 1}: ${JSON.stringify(end, h.shorten)}`);
    assert.match(end.error, /the page that makes images closed/);
    assert.equal((await h.api(b.page, { type: 'job', job })).status, 'failed', `job ${i + 1}`);
  }
});
