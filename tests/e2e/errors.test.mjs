// Invalid requests are refused with messages that say what is allowed; limits are enforced.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from './harness.mjs';

const base = { prompt: 'a cat', width: 256, height: 256, steps: 2, seed: '1' };

test('invalid sizes and steps are refused', { timeout: 300_000 }, async (t) => {
  const b = await h.setup(t);
  const refuse = async (extra, ...needles) => {
    const reply = await h.api(b.page, { type: 'generate', ...base, ...extra });
    assert.equal(reply.type, 'error', `${JSON.stringify(extra)} was accepted: ${JSON.stringify(reply)}`);
    for (const n of needles) assert.ok(reply.error.includes(n), `${JSON.stringify(extra)}: "${reply.error}" lacks "${n}"`);
  };
  await refuse({ width: 500 }, 'multiple of 16', '256', '1536');
  await refuse({ height: 2048 }, '1536');
  await refuse({ width: 128 }, '256');
  await refuse({ steps: 0 }, '1', '50');
  await refuse({ steps: 51 }, '1', '50');
});

test('a 3000-word prompt is truncated to 512 tokens', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const words = Array.from({ length: 3000 }, (_, i) => ['red', 'fox', 'snow', 'tree', 'light'][i % 5]).join(' ');
  const { result } = await h.generateOk(b.page, { ...base, prompt: words });
  assert.equal(result.truncated, true);
  assert.equal(result.tokenCount, 512);
});

test('a float16 pack on WebGPU without shader-f16 runs in float32; one installed only for wasm says to install it again', { timeout: 600_000 }, async (t) => {
  // Installed for webgpu on SwiftShader (no shader-f16): converted to float32 at install, then it
  // makes the image (f32-conversion.test.mjs compares it with the reference).
  const b = await h.setup(t, { pack: 'f16', backend: 'webgpu' });
  const ok = await h.generate(b.page, { ...base, backend: 'webgpu' });
  assert.ok(ok.result, `no image: ${JSON.stringify(ok.failed ?? ok.reply)}`);
  // Installed for the wasm backend (no conversion), then generated on webgpu: still refused, saying
  // what is missing and what to do.
  await h.api(b.page, { type: 'deletePack' });
  await h.installPack(b.page, b.hub, b.repo, { backend: 'wasm' });
  const r = await h.generate(b.page, { ...base, backend: 'webgpu' });
  assert.equal(r.reply.type, 'jobStarted', JSON.stringify(r.reply));
  assert.ok(!r.result, 'float16 without conversion on SwiftShader WebGPU produced an image');
  assert.equal(r.failed?.type, 'failed', JSON.stringify(r.failed));
  assert.match(r.failed.error, /shader-f16/);
  assert.match(r.failed.error, /Install the pack again/);
});

test('requests with a field they do not have are refused, naming it', { timeout: 120_000 }, async (t) => {
  const b = await h.setup(t, { pack: null });
  for (const [request, field] of [
    [{ type: 'generate', prompt: 'a cat', widht: 512 }, 'widht'],
    [{ type: 'installPack', repo: 'a/b', revsion: 'v2' }, 'revsion'],
    [{ type: 'pausePack', now: true }, 'now'],
  ]) {
    const reply = await h.api(b.page, request);
    assert.equal(reply.type, 'error', JSON.stringify(reply));
    assert.match(reply.error, new RegExp(`unknown field \`${field}\``));
  }
});

test('only the offscreen document reports events, only the service worker commands it', { timeout: 240_000 }, async (t) => {
  const b = await h.setupPadded(t);
  // A page posing as the offscreen document: its "result" is not recorded.
  const fake = { type: 'result', job: 'f00f00f00f00f00f', png: '', prompt: 'x', seed: '1', width: 256, height: 256, steps: 1, schedule: 'empirical', tokenCount: 1, truncated: false };
  await h.api(b.page, fake).catch(() => {});
  assert.equal((await h.api(b.page, { type: 'job', job: fake.job })).status, 'unknown');
  // A page posing as the service worker: the offscreen document does not take its command.
  b.hub.inject(h.BIG_SHARD, { type: 'slow', bytesPerSecond: 4 << 20 });
  assert.equal((await h.startInstall(b.page, b.hub, b.repo)).type, 'installStarted');
  await h.waitForDownload(b.page, (s) => h.fileDone(s, h.BIG_SHARD) >= 4 << 20, 60_000);
  const reply = await b.page.evaluate(() => chrome.runtime.sendMessage({ target: 'offscreen', command: 'cancelPack' }).catch((e) => String(e)));
  assert.notEqual(reply?.ok, true, JSON.stringify(reply));
  b.hub.clearFaults();
  await h.waitForInstall(b.page);
});
