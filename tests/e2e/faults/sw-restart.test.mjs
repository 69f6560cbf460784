// The service worker can be stopped between generations; the next request wakes it.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

test('generation works after the service worker was stopped', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const req = { prompt: 'a paper crane', width: 256, height: 256, steps: 2, seed: '5' };
  const first = await h.generateOk(b.page, req);

  await h.stopServiceWorker(b.context, b.page);

  const status = await h.api(b.page, { type: 'packStatus' });
  assert.equal(status.installed, true, 'the pack is still installed after a restart');
  const second = await h.generateOk(b.page, req);
  assert.notEqual(second.result.job, first.result.job);
  // Same request, same seed: same image.
  assert.equal(second.result.png, first.result.png);
});
