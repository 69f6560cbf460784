// Faster repeats and batches: a prompt seen before on this pack reuses its cached
// embeddings and starts no text-encoder worker, across a browser restart, with the same image a cold run
// gives; a damaged cache entry falls back to the encoder; a batch of 4 loads each graph once and gives the
// images of 4 single generations with seeds in a row.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const SIZE = { width: 256, height: 256, steps: 2 };

/**
 * Runs `fn` while counting the worker targets the browser creates (CDP target discovery, so a
 * short-lived worker is not missed between two polls). Returns { value, workers }.
 */
async function countingWorkers(b, fn) {
  const cdp = await b.context.browser().newBrowserCDPSession();
  const before = new Set((await h.listWorkers(b.context)).map((w) => w.targetId));
  const created = new Set();
  cdp.on('Target.targetCreated', ({ targetInfo }) => {
    if (targetInfo.type === 'worker' && !before.has(targetInfo.targetId)) created.add(targetInfo.targetId);
  });
  await cdp.send('Target.setDiscoverTargets', { discover: true });
  try {
    const value = await fn();
    return { value, workers: created.size };
  } finally {
    await cdp.send('Target.setDiscoverTargets', { discover: false }).catch(() => {});
    await cdp.detach().catch(() => {});
  }
}

/** One generation: its result event and how many (stage) workers it started. */
async function generateCounting(b, request) {
  const { value, workers } = await countingWorkers(b, () => h.generateOk(b.page, { ...SIZE, ...request }));
  return { result: value.result, workers };
}

/** The cache's files: { 'cache/embeddings/index.json': size, '<key>.bin': size, … }. */
async function cacheFiles(page) {
  const tree = await h.opfsTree(page);
  return Object.fromEntries(Object.entries(tree).filter(([p]) => p.startsWith('cache/embeddings/') && !p.endsWith('/')));
}

test('a repeated prompt skips the text encoder, across a restart, with the cold run image', { timeout: 600_000 }, async (t) => {
  const b0 = await h.setup(t);
  // Workers are counted: nothing stays loaded between images (the setting is kept across the restart).
  await h.api(b0.page, { type: 'keepLoaded', seconds: 0 });
  const prompt = 'a lighthouse on a cliff at dusk';

  const cold = await generateCounting(b0, { prompt, seed: '5' });
  assert.equal(cold.workers, 3, 'a first run uses a text-encoder, a transformer and a decoder worker');
  const files = await cacheFiles(b0.page);
  const entries = Object.keys(files).filter((p) => p.endsWith('.bin'));
  assert.equal(entries.length, 1, `one cached prompt: ${JSON.stringify(files)}`);
  assert.ok(files['cache/embeddings/index.json'] > 0, 'the index is written');
  // magic + count + SHA-256, then 512 x 7680 float32.
  assert.equal(files[entries[0]], 48 + 512 * 7680 * 4);

  const repeat = await generateCounting(b0, { prompt, seed: '5' });
  assert.equal(repeat.workers, 2, 'a repeat starts no text-encoder worker');
  assert.equal(repeat.result.png, cold.result.png, 'a repeat gives the cold run image');
  assert.equal(repeat.result.tokenCount, cold.result.tokenCount);

  const newSeed = await generateCounting(b0, { prompt, seed: '6' });
  assert.equal(newSeed.workers, 2, 'a new seed starts no text-encoder worker');
  assert.notEqual(newSeed.result.png, cold.result.png);

  // The cache survives the browser.
  const b = await b0.relaunch();
  t.after(() => b.close());
  await h.collectEvents(b.page);
  const afterRestart = await generateCounting(b, { prompt, seed: '6' });
  assert.equal(afterRestart.workers, 2, 'after a restart the cached embeddings are used');
  assert.equal(afterRestart.result.png, newSeed.result.png);

  // A cut entry is detected: the encoder runs again and the image is still the cold run's; the entry is
  // written again for the next repeat.
  await h.opfsTruncate(b.page, entries[0], 1000);
  const damaged = await generateCounting(b, { prompt, seed: '5' });
  assert.equal(damaged.workers, 3, 'a damaged entry falls back to the text encoder');
  assert.equal(damaged.result.png, cold.result.png);
  assert.equal((await cacheFiles(b.page))[entries[0]], 48 + 512 * 7680 * 4, 'the entry is written again');
  // One bit flipped, length unchanged: the hash catches it.
  await b.page.evaluate(async (p) => {
    const dir = await (await (await navigator.storage.getDirectory()).getDirectoryHandle('cache')).getDirectoryHandle('embeddings');
    const handle = await dir.getFileHandle(p.split('/').at(-1));
    const bytes = new Uint8Array(await (await handle.getFile()).arrayBuffer());
    bytes[bytes.length - 1] ^= 1;
    const w = await handle.createWritable();
    await w.write(bytes);
    await w.close();
  }, entries[0]);
  const flipped = await generateCounting(b, { prompt, seed: '5' });
  assert.equal(flipped.workers, 3, 'an entry with the wrong hash falls back to the text encoder');
  assert.equal(flipped.result.png, cold.result.png);
  assert.equal((await generateCounting(b, { prompt, seed: '5' })).workers, 2);

  // Another prompt is another entry.
  const other = await generateCounting(b, { prompt: 'a lighthouse on a cliff at dawn', seed: '5' });
  assert.equal(other.workers, 3);
  assert.equal(Object.keys(await cacheFiles(b.page)).filter((p) => p.endsWith('.bin')).length, 2);

  // The cache goes with the pack.
  assert.equal((await h.api(b.page, { type: 'deletePack' })).type, 'done');
  assert.ok(!(await h.opfsEntries(b.page)).includes('cache'), 'the cache is removed with the pack');
});

test('a batch of 4: seeds in a row, each graph loaded once, each image a single generation\'s', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const prompt = 'four paper boats on a pond';

  const refused = await h.api(b.page, { type: 'generate', prompt, count: 9 });
  assert.equal(refused.type, 'error');
  assert.match(refused.error, /count 9 .*1 to 8/);
  assert.match((await h.api(b.page, { type: 'generate', prompt, count: 0 })).error, /count 0 /);

  await h.collectEvents(b.page);
  const { value: reply, workers } = await countingWorkers(b, async () => {
    const reply = await h.api(b.page, { type: 'generate', prompt, ...SIZE, seed: '18446744073709551614', count: 4 });
    assert.equal(reply.type, 'jobStarted', JSON.stringify(reply));
    await h.waitForEvent(b.page, (e) => e.job === reply.job && e.type === 'result' && e.index === 3);
    return reply;
  });
  assert.equal(workers, 3, 'one worker per stage for the whole batch');
  assert.equal(reply.seed, '18446744073709551614', 'the reply names the first seed');

  const evs = (await h.events(b.page)).filter((e) => e.job === reply.job);
  const results = evs.filter((e) => e.type === 'result');
  assert.deepEqual(results.map((r) => [r.index, r.count]), [[0, 4], [1, 4], [2, 4], [3, 4]]);
  // Seeds in a row, wrapping past 2^64 - 1.
  assert.deepEqual(results.map((r) => r.seed), ['18446744073709551614', '18446744073709551615', '0', '1']);
  const progress = evs.filter((e) => e.type === 'progress').map((e) => e.progress);
  assert.ok(progress.every((p) => p.images === 4), JSON.stringify(progress));
  for (const image of [0, 1, 2, 3]) {
    assert.ok(progress.some((p) => p.stage === 'transformer' && p.image === image && p.step === SIZE.steps), `steps of image ${image}`);
  }

  const state = await h.endedJob(b.page, reply.job);
  assert.equal(state.status, 'done', JSON.stringify(state, h.shorten));
  assert.deepEqual(state.results.map((r) => r.png), results.map((r) => r.png), 'the job keeps every image, in order');
  assert.equal(state.result.png, results[3].png, '`result` is the last image');

  for (const r of results) {
    const single = await h.generateOk(b.page, { prompt, ...SIZE, seed: r.seed });
    assert.equal(single.result.png, r.png, `image ${r.index} equals a single generation with seed ${r.seed}`);
    assert.equal(single.result.count, 1);
    assert.equal(single.result.index, 0);
  }

  // Cancelling a batch during its denoising ends it; nothing more comes.
  const batch = await h.api(b.page, { type: 'generate', prompt, ...SIZE, steps: 8, seed: '3', count: 3 });
  await h.waitForEvent(b.page, (e) => e.job === batch.job && e.type === 'progress' && e.progress.image === 1);
  assert.equal((await h.api(b.page, { type: 'cancel', job: batch.job })).type, 'cancelled');
  await h.waitForEvent(b.page, (e) => e.job === batch.job && e.type === 'cancelled', 30_000);
  await h.sleep(2_000);
  assert.ok(!(await h.events(b.page)).some((e) => e.job === batch.job && e.type === 'result'));
  const cancelled = await h.api(b.page, { type: 'job', job: batch.job });
  assert.equal(cancelled.status, 'cancelled');
  assert.deepEqual(cancelled.results, []);
});
