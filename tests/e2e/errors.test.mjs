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

test('a float16 pack on WebGPU without shader-f16 fails clearly', { timeout: 600_000 }, async (t) => {
  // Installed for the wasm backend (an install for webgpu is refused up front, see download-basic),
  // then generated on webgpu: generation itself must say what is missing.
  const b = await h.setup(t, { pack: 'f16', backend: 'wasm' });
  const r = await h.generate(b.page, { ...base, backend: 'webgpu' });
  assert.equal(r.reply.type, 'jobStarted', JSON.stringify(r.reply));
  assert.ok(!r.result, 'float16 on SwiftShader WebGPU produced an image');
  assert.equal(r.failed?.type, 'failed', JSON.stringify(r.failed));
  assert.match(r.failed.error, /shader-f16/);
});
