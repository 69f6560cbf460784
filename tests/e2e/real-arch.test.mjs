// Packs of the real architectures (tools/export, tiny configuration: Qwen3 layers with int4 MatMulNBits,
// FLUX.2 transformer blocks with int8 MatMulNBits, the FLUX.2 VAE decoder; the real I/O widths) installed
// through the extension and run by it: on WebGPU with float32 activations, on the wasm backend with
// float16 ones, each compared with the independent Python reference on the same graphs (ORT on the CPU).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import * as h from './harness.mjs';

const PYTHON = path.join(h.ROOT, 'target/export-venv/bin/python');
const PACKS = path.join(h.ROOT, 'target/tiny-packs');

/**
 * The exported pack `activations` (float32 | float16), made once per checkout (seed 1). The exporter's
 * virtual environment is made by `cargo xtask test` (exporter step) before the browser tests run.
 */
async function tinyPack(activations) {
  const dir = path.join(PACKS, activations === 'float32' ? 'f32' : 'f16');
  if (fs.existsSync(path.join(dir, 'export_info.json'))) return dir;
  if (!fs.existsSync(PYTHON)) throw new Error(`${PYTHON} is missing: run \`cargo xtask test\`, which makes it`);
  const r = await h.run(PYTHON, ['tools/export/export.py', '--config', 'tiny', '--activations', activations, '--out', dir, '--seed', '1']);
  if (r.code !== 0) throw new Error(`export.py failed (${r.code}):\n${r.stdout}\n${r.stderr}`);
  return dir;
}

/**
 * Largest per-channel difference (0..255) allowed against the reference. Both sides run the same graphs,
 * but ORT's WebGPU and wasm kernels (MatMulNBits, convolutions) sum in another order than its native CPU
 * kernels, and the decoder's 16x upsampling spreads a small latent difference over many pixels. Measured
 * here (2026-12-01): 1 level at most (36 of 65536 pixels differ on float32, 839 on float16); one level of
 * margin for other CPUs.
 */
const TOLERANCE = { float32: 2, float16: 2 };

for (const [activations, backend] of [['float32', undefined], ['float16', 'wasm']]) {
  test(`a tiny real-architecture ${activations} pack installs and matches the reference`, { timeout: 900_000 }, async (t) => {
    const dir = await tinyPack(activations);
    const repo = `tiny/${activations}`;
    const b = await h.setup(t, { pack: null, install: false, hubOptions: { repos: { [repo]: { dir } } } });
    await h.installPack(b.page, b.hub, repo, { backend });
    const req = { prompt: 'a red fox in the snow', width: 256, height: 256, steps: 2, seed: '42', trace: true };
    if (backend) req.backend = backend;
    const { result } = await h.generateOk(b.page, req, 600_000);
    const files = h.writeResult(`real-arch-${activations}`, result);
    await h.compareWithReference({ packDir: dir, traceJson: files.json, png: files.png, tol: TOLERANCE[activations], name: `real-arch-${activations}` });
  });
}

/** Records in the page when the conversion's first progress and the `installing` state arrive. */
async function watchConversion(page) {
  await page.evaluate(() => {
    window.__conversion = {};
    chrome.runtime.onMessage.addListener((m) => {
      const c = window.__conversion;
      if (m?.type === 'packProgress' && m.state === 'converting') c.first ??= performance.now();
      if (m?.type === 'packProgress' && m.state === 'installing') c.installing ??= performance.now();
      return false;
    });
  });
}

/** Milliseconds from the conversion's first progress to the `installing` state. */
async function conversionMs(page) {
  const c = await page.evaluate(() => window.__conversion);
  return Math.round(c.installing - c.first);
}

/**
 * The float16 pack on SwiftShader WebGPU, which lacks shader-f16: the extension converts its graphs to
 * float32 at install. Compared with the reference of the float32-activation export of the same weights
 * and seed (what the converted graphs compute, up to the float16 rounding of the weights the float16
 * export stores) and, printed for the record, with the float16 pack's own reference. Tolerance: that of
 * the float32 pack on WebGPU (TOLERANCE.float32 above: summation order, decoder upsampling), as the
 * converted graphs compute in float32. Measured (2026-12-01) on ONNX Runtime's CPU, the graphs converted
 * by `cargo run -p imagine-core --example convert_f16` against the float32 export's reference: 1 level,
 * 12543 of 65536 pixels differ (the float16-rounded weights).
 */
const CONVERTED_TOLERANCE = 2;

test('a tiny real-architecture float16 pack installs converted to float32 on WebGPU without shader-f16 and matches the reference', { timeout: 1_200_000 }, async (t) => {
  const dir = await tinyPack('float16');
  const f32Dir = await tinyPack('float32');
  const repo = 'tiny/float16';
  const b = await h.setup(t, { pack: null, install: false, hubOptions: { repos: { [repo]: { dir } } } });
  await watchConversion(b.page);
  await h.installPack(b.page, b.hub, repo, { timeoutMs: 600_000 });
  const ms = await conversionMs(b.page);
  const state = await h.packState(b.page);
  assert.ok(state.installed.conversion, 'installed without its float32 conversion');
  const converting = (await h.events(b.page)).filter((e) => e.type === 'packProgress' && e.state === 'converting');
  const tree = await h.opfsTree(b.page);
  const extra = Object.keys(tree).filter((p) => /\.f32(\.onnx|-\d{5}\.data)$/.test(p)).reduce((n, p) => n + tree[p], 0);
  console.log(`tiny float16: conversion ${ms} ms; converted ${converting.at(-1)?.totalBytes} bytes; extra disk ${extra} bytes`);
  const req = { prompt: 'a red fox in the snow', width: 256, height: 256, steps: 2, seed: '42', trace: true };
  const { result } = await h.generateOk(b.page, req, 900_000);
  const files = h.writeResult('real-arch-float16-converted', result);
  const f16 = await h.compareWithReference({ packDir: dir, traceJson: files.json, png: files.png, tol: 255, name: 'real-arch-float16-converted-ref16' });
  console.log(`against the float16 pack's reference: ${f16}`);
  const f32 = await h.compareWithReference({ packDir: f32Dir, traceJson: files.json, png: files.png, tol: CONVERTED_TOLERANCE, name: 'real-arch-float16-converted' });
  console.log(`against the float32 export's reference: ${f32}`);
});
