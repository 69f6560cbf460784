// The tiny packs of the real architectures (tools/export, tiny configuration: Qwen3 layers with int4
// MatMulNBits, FLUX.2 transformer blocks with int8 MatMulNBits, the FLUX.2 VAE decoder; the real I/O
// widths) and how close the extension's images must come to the reference on them; used by
// real-arch.test.mjs and real-arch-bench.test.mjs, which may run at once.
import fs from 'node:fs';
import path from 'node:path';
import * as h from './harness.mjs';

/** The exporter's Python (torch, diffusers, transformers). */
export const PYTHON = path.join(h.ROOT, 'target/export-venv/bin/python');
const PACKS = path.join(h.ROOT, 'target/tiny-packs');

/**
 * The exported pack `activations` (float32 | float16), made once per checkout (seed 1); with
 * `quantize: false` the text encoder's and the transformer's float graphs under the pack's names
 * (`export.py --no-quantize`, in `f32-float`; what diffusers.test.mjs compares with diffusers). The exporter's
 * virtual environment is made by `cargo xtask test` (exporter step) before the browser tests run. Made
 * in a directory of its own and then renamed into place, so two test files asking at once never see
 * half a pack (the second rename loses, and its copy is removed).
 */
export async function tinyPack(activations, { quantize = true } = {}) {
  const dir = path.join(PACKS, (activations === 'float32' ? 'f32' : 'f16') + (quantize ? '' : '-float'));
  if (fs.existsSync(path.join(dir, 'export_info.json'))) return dir;
  if (!fs.existsSync(PYTHON)) throw new Error(`${PYTHON} is missing: run \`cargo xtask test\`, which makes it`);
  const partial = `${dir}.partial-${process.pid}`;
  fs.rmSync(partial, { recursive: true, force: true });
  const r = await h.run(PYTHON, ['tools/export/export.py', '--config', 'tiny', '--activations', activations, '--out', partial, '--seed', '1', ...(quantize ? [] : ['--no-quantize'])]);
  if (r.code !== 0) throw new Error(`export.py failed (${r.code}):\n${r.stdout}\n${r.stderr}`);
  try {
    fs.renameSync(partial, dir);
  } catch (e) {
    if (!fs.existsSync(path.join(dir, 'export_info.json'))) throw e;
    fs.rmSync(partial, { recursive: true, force: true });
  }
  return dir;
}

/**
 * Largest per-channel difference (0..255) allowed against the reference. Both sides run the same graphs,
 * but ORT's WebGPU and wasm kernels (MatMulNBits, convolutions) sum in another order than its native CPU
 * kernels, and the decoder's 16x upsampling spreads a small latent difference over many pixels. Measured
 * here (2026-12-05, the decoder of (8, 8, 16, 16) channels): 1 level at most (32 of 65536 pixels differ
 * on float32, 765 on float16); one level of margin for other CPUs.
 */
export const TOLERANCE = { float32: 2, float16: 2 };
