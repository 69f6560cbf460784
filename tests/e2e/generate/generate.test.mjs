// Generations match the independent Python reference, on the three fixture packs.
import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

/** Max per-channel difference (0..255) allowed against the reference for float32 packs. */
const F32_TOLERANCE = 1;
/** float16 rounding on different CPU kernels (ORT wasm EP in the browser vs numpy in the reference). */
const F16_TOLERANCE = 2;

const PROMPT = 'a red fox in the snow';

async function generateAndCompare(b, { pack, name, tol, backend }) {
  const req = { prompt: PROMPT, width: 256, height: 256, steps: 2, seed: '42', trace: true };
  if (backend) req.backend = backend;
  const { result } = await h.generateOk(b.page, req);
  assert.equal(result.seed, '42');
  assert.equal(result.width, 256);
  assert.equal(result.height, 256);
  assert.equal(result.steps, 2);
  assert.equal(result.prompt, PROMPT);
  assert.ok(result.trace, 'trace requested but missing');
  assert.equal(result.trace.inputIds.length, 512);
  assert.equal(result.trace.sigmas.length, 3);
  assert.equal(result.trace.sigmas[2], 0);

  const png = h.pngBytes(result);
  const chunks = h.pngTextChunks(png);
  const all = chunks.map((c) => `${c.keyword}=${c.text}`).join('\n');
  assert.ok(chunks.some((c) => c.text.includes(PROMPT)), `prompt not in PNG text chunks:\n${all}`);
  const mentionsSeed = (c) => /seed/i.test(c.keyword) || /seed/i.test(c.text);
  assert.ok(chunks.some((c) => mentionsSeed(c) && c.text.includes('42')), `seed not in PNG text chunks:\n${all}`);

  const files = h.writeResult(name, result);
  await h.compareWithReference({
    packDir: path.join(h.PACKS, pack),
    traceJson: files.json,
    png: files.png,
    tol,
    name,
  });
}

test('f32, f32-vae32 and f16 (wasm) packs match the reference', { timeout: 900_000 }, async (t) => {
  const b = await h.setup(t, { pack: 'f32', install: false });

  await t.test('f32', async () => {
    await h.installPack(b.page, b.hub, 'fixtures/f32');
    await generateAndCompare(b, { pack: 'f32', name: 'generate-f32', tol: F32_TOLERANCE });
  });

  await t.test('f32-vae32 (decoder takes [1,32,H/8,W/8]); install replaces the pack', async () => {
    await h.installPack(b.page, b.hub, 'fixtures/f32-vae32');
    const status = await h.packStatus(b.page);
    assert.equal(status.source.repo, 'fixtures/f32-vae32');
    assert.equal(status.commit, b.hub.commit('fixtures/f32-vae32'));
    await generateAndCompare(b, { pack: 'f32-vae32', name: 'generate-f32-vae32', tol: F32_TOLERANCE });
  });

  await t.test('f16 on the wasm backend', async () => {
    // The float16 graphs on the wasm backend (on SwiftShader WebGPU, which lacks shader-f16, they run
    // converted to float32: f32-conversion.test.mjs).
    await h.installPack(b.page, b.hub, 'fixtures/f16', { backend: 'wasm' });
    await generateAndCompare(b, { pack: 'f16', name: 'generate-f16-wasm', tol: F16_TOLERANCE, backend: 'wasm' });
  });
});
