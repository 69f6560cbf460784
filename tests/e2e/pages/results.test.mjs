// Results are never lost: a job's image is kept in OPFS (storage.session holds 10 MiB, less than one
// large PNG in base64), and every job ends in a state the pages can show.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

/** `storage.session`'s quota (chrome.storage.session.QUOTA_BYTES). */
const SESSION_QUOTA = 10 * 1024 * 1024;

async function jobState(page, job) {
  return h.api(page, { type: 'job', job });
}

test('a full storage.session: the job still ends done, its image readable after a service worker restart', { timeout: 300_000 }, async (t) => {
  const b = await h.setup(t);
  // Leave less room than one 512x512 result in base64.
  await b.serviceWorker.evaluate((n) => chrome.storage.session.set({ filler: 'x'.repeat(n) }), SESSION_QUOTA - 100_000);
  const { reply, result } = await h.generateOk(b.page, { prompt: 'a red fox', width: 512, height: 512, steps: 1, seed: '5' });
  assert.ok(result.png.length > 100_000, `a smaller PNG than this test needs: ${result.png.length}`);
  const done = await h.endedJob(b.page, reply.job);
  assert.equal(done.status, 'done', JSON.stringify(done, h.shorten));
  assert.equal(done.result.png, result.png);

  await h.stopServiceWorker(b.context, b.page);
  const again = await jobState(b.page, reply.job);
  assert.equal(again.status, 'done');
  assert.equal(again.result.png, result.png);
  const tree = await h.opfsTree(b.page);
  assert.equal(tree[`gallery/${reply.job}.png`], h.pngBytes(result).length);
});
