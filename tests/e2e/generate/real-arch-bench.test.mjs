// The browser mode of the GPU bench (tests/e2e/bench/gpu.mjs) on the tiny real-architecture packs (tiny-packs.mjs),
// as the H200 runs it at full size: every image of its plan made, its report complete, its images
// compared with the reference.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';
import { tinyPack, TOLERANCE } from '../lib/tiny-packs.mjs';

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

/**
 * The images of the bench's plan made here, in its order: all of it but these, as each WebGPU image costs
 * SwiftShader half a minute to a minute (three times that beside two other test files in CI): the
 * float32 images with `keepBuffers` (workers.test.mjs shows the option reaches ORT on WebGPU), the float32
 * image re-blocked while loading (real-arch.test.mjs shows that path), the float32 repeat (stages kept
 * loaded on WebGPU: repeat.test.mjs and workers.test.mjs), the float32 image with accuracy level 4 (the
 * graph edit: `reblock` tests in imagine-core; here it runs on wasm, f16-acc4, where ORT gives the same
 * image), the fused attention's timed images (the image of the cold image's inputs shows the same), and the
 * --large images (--large 0).
 */
const PLAN = ['f32-cold', 'f32-profile', 'f32-fused-same', 'f16-warm-up', 'base-cold', 'base-repeat', 'f16-cold',
  'f16-repeat', 'f16-batch', 'f16-atload', 'f16-acc4', 'f16-acc4-repeat', 'f16-profile', 'f16-keep', 'f16-keep-repeat', 'f16-fused-same'];

test('the browser mode of the GPU bench, on the tiny float16 pack: installed converted to float32 without shader-f16, every image of the plan made, the images match the reference and a perturbed input fails', { timeout: 1_200_000 }, async () => {
  const dir = await tinyPack('float16');
  const f32Dir = await tinyPack('float32');
  const out = path.join(h.OUT, 'bench-gpu-tiny');
  fs.rmSync(out, { recursive: true, force: true });
  // SwiftShader has no shader-f16 with any flag: the float16 images run on the wasm backend here. The
  // --large images are the same plan at another size: left out (--large 0), as SwiftShader is slow. The
  // idle each image's memory is measured above: 600 ms (3 samples) rather than 2 s, 18 times.
  const args = ['tests/e2e/bench/gpu.mjs', '--pack', dir, '--out', out, '--size', '256', '--large', '0', '--steps', '2', '--batch', '2',
    '--f16-backend', 'wasm', '--images', PLAN.join(','), '--reference', '--tolerance-f16', String(TOLERANCE.float16), '--tolerance-f32', String(CONVERTED_TOLERANCE), '--threads', '1',
    '--idle-ms', '600'];
  const r = await h.run(process.execPath, args, { timeoutMs: 1_100_000 });
  console.log(r.stdout.split('\n').filter((l) => !l.startsWith('bench gpu: ')).join('\n'));
  assert.equal(r.code, 0, `bench/gpu.mjs failed (${r.code}):\n${r.stdout.slice(-4000)}\n${r.stderr.slice(-4000)}`);
  const report = JSON.parse(fs.readFileSync(path.join(out, 'bench-gpu.json'), 'utf8'));

  assert.equal(report.launches.default.adapter.shaderF16, false);
  assert.ok(report.plan.conversion.extraDiskBytes > 0, JSON.stringify(report.plan));
  assert.ok(report.install.conversionSeconds > 0, JSON.stringify(report.install));
  assert.equal(report.install.extraDiskBytes, report.plan.conversion.extraDiskBytes);
  assert.ok(report.install.block32Bytes > 0 && report.install.block32Seconds > 0, JSON.stringify(report.install));
  assert.deepEqual(report.images.map((i) => [i.name, i.count, i.outcome]), PLAN.map((name) => [name, name === 'f16-batch' ? 2 : 1, 'result']));
  // The profiled images: every stage loaded afresh, with ORT's profile; on WebGPU (the float32
  // conversion) each run's GPU time and the kernels, the transformer's MatMulNBits re-blocked to 32.
  for (const image of ['f32-profile', 'f16-profile']) {
    const { profile } = report.images.find((i) => i.name === image);
    assert.deepEqual(Object.keys(profile).sort(), ['decoder', 'textEncoder', 'transformer'], image);
    for (const p of Object.values(profile)) assert.ok(p.sessionInitializationMs > 0 && p.runs.length > 0, JSON.stringify(p).slice(0, 400));
    assert.equal(profile.transformer.runs.length, 2);
  }
  const webgpu = report.images.find((i) => i.name === 'f32-profile').profile;
  for (const p of Object.values(webgpu)) assert.ok(p.runs.every((r) => r.gpuMs > 0) && p.kernels.length > 0, JSON.stringify(p).slice(0, 400));
  assert.ok(webgpu.transformer.kernels.some((k) => k.op === 'MatMulNBits'), JSON.stringify(webgpu.transformer.kernels));
  // SwiftShader runs on the CPU: the decoder's convolutions stay in the graph's layout (NCHW), without
  // the Transposes ORT's default (NHWC) puts around each of them (60 for this decoder, 8 of its own).
  const transposes = webgpu.decoder.kernels.filter((k) => k.op === 'Transpose').reduce((n, k) => n + k.dispatches, 0);
  assert.ok(transposes <= 20, `the decoder ran ${transposes} Transposes: ${JSON.stringify(webgpu.decoder.kernels)}`);
  const stage = (image, name) => report.stages.find((x) => x.image === report.images.find((i) => i.name === image).label && x.stage === name);
  // Accuracy level 4 on wasm (the float16 images here): ORT gives the same image; its text encoder runs
  // again rather than take the cached embeddings.
  const png = (name) => fs.readFileSync(path.join(out, `${name}.png`));
  assert.deepEqual(png('f16-acc4'), png('f16-cold'));
  assert.ok(!stage('f16-acc4', 'textEncoder').cached);
  // Every stage's time is accounted for: the transformer runs once per step and image, the text
  // encoder is skipped where the prompt's embeddings were cached.
  for (const image of ['f32-cold', 'base-cold', 'f16-cold', 'f32-profile', 'f16-profile']) {
    for (const name of ['textEncoder', 'transformer', 'decoder']) {
      const x = stage(image, name);
      assert.ok(x.workerStartMs > 0 && x.prepareMs >= 0 && x.sessionCreateMs > 0 && x.wallMs >= x.sessionCreateMs, JSON.stringify(x));
      assert.ok(x.rendererPeakAboveIdle !== undefined && x.gpuMemoryPeak === null, JSON.stringify(x));
    }
    assert.equal(stage(image, 'transformer').runsMs.length, 2);
  }
  // On WebGPU the transformer loads the float32 conversion as re-blocked at install; the float16 images
  // run on wasm, which re-blocks nothing, with the record as an older version wrote it or not.
  assert.equal(stage('f32-cold', 'transformer').graphFile, 'transformer_q8.f32.b32.onnx');
  for (const image of ['f16-cold', 'f16-atload']) assert.equal(stage(image, 'transformer').graphFile, 'transformer_q8.onnx');
  // A repeat: the baseline loads the transformer and the decoder again, the product keeps them loaded.
  for (const image of ['base-repeat', 'f16-repeat']) assert.equal(stage(image, 'textEncoder').cached, true);
  for (const name of ['transformer', 'decoder']) {
    assert.ok(!stage('base-repeat', name).resident && stage('base-repeat', name).sessionCreateMs > 0, JSON.stringify(stage('base-repeat', name)));
    for (const image of ['f16-repeat', 'f16-batch', 'f16-keep-repeat']) {
      assert.ok(stage(image, name).resident && stage(image, name).sessionCreateMs === 0, JSON.stringify(stage(image, name)));
    }
  }
  assert.deepEqual(Object.keys(report.ratios), ['cold', 'repeat']);
  assert.equal(stage('f16-batch', 'transformer').runsMs.length, 4);
  // The transformer's attention fused into MultiHeadAttention on request, where it runs on WebGPU (the
  // tiny transformer's two blocks), and nowhere on wasm; its first output agrees with the graph's.
  assert.equal(stage('f32-cold', 'transformer').fusedAttention, 0);
  assert.equal(stage('f32-fused-same', 'transformer').fusedAttention, 2);
  assert.equal(stage('f16-fused-same', 'transformer').fusedAttention, 0);
  // On WebGPU (float32) the edited graphs' images are measured; on wasm they are the same images.
  const measured = (c) => (c.expect === 'measure' && c.name.startsWith('f32-') ? 'measured' : c.outcome);
  assert.deepEqual(report.comparisons.map((c) => [c.name, c.expect, measured(c)]), [
    ['f32-cold', 'pass', 'pass'], ['f16-cold', 'pass', 'pass'], ['f16-cold-perturbed', 'fail', 'fail'],
    ['f16-acc4', 'measure', 'pass'],
    ['f32-fused-same', 'measure', 'measured'], ['f16-fused-same', 'pass', 'pass'],
    ['f32-fused-same-velocity', 'pass', 'pass'], ['f16-fused-same-velocity', 'pass', 'pass'],
  ]);
  // Where nothing was fused (wasm) the images are the same.
  assert.deepEqual(png('f16-fused-same'), png('f16-cold'));
  for (const name of ['f32-fused-same', 'f32-fused-same-velocity']) console.log(`attention fused (WebGPU), ${name}: ${report.comparisons.find((c) => c.name === name).output}`);
  // The converted graphs compute the float32 export's function: the closer reference.
  const f32 = await h.compareWithReference({ packDir: f32Dir, traceJson: path.join(out, 'f32-cold.json'), png: path.join(out, 'f32-cold.png'), tol: CONVERTED_TOLERANCE, name: 'real-arch-float16-converted' });
  console.log(`converted, against the float32 export's reference: ${f32}`);
});
