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
 * virtual environment is made by `cargo xtask test` (exporter step) before the browser tests run. One
 * test file exports it while the others that ask wait (a lock file holding its pid; a lock whose process
 * is gone is taken over): exported twice at once, each copy took twice as long beside the other files.
 * Made in a directory of its own and then renamed into place, so that no one sees half a pack.
 */
export async function tinyPack(activations, { quantize = true } = {}) {
  const dir = path.join(PACKS, (activations === 'float32' ? 'f32' : 'f16') + (quantize ? '' : '-float'));
  const made = () => fs.existsSync(path.join(dir, 'export_info.json'));
  const lock = `${dir}.lock`;
  fs.mkdirSync(PACKS, { recursive: true });
  for (;;) {
    if (made()) return dir;
    try {
      fs.writeFileSync(lock, String(process.pid), { flag: 'wx' });
      break;
    } catch (e) {
      if (e.code !== 'EEXIST') throw e;
    }
    if (!exporting(lock)) fs.rmSync(lock, { force: true });
    else await h.sleep(1000);
  }
  try {
    if (made()) return dir;
    if (!fs.existsSync(PYTHON)) throw new Error(`${PYTHON} is missing: run \`cargo xtask test\`, which makes it`);
    const partial = `${dir}.partial`;
    fs.rmSync(partial, { recursive: true, force: true });
    const r = await h.run(PYTHON, ['tools/export/export.py', '--config', 'tiny', '--activations', activations, '--out', partial, '--seed', '1', ...(quantize ? [] : ['--no-quantize'])]);
    if (r.code !== 0) throw new Error(`export.py failed (${r.code}):\n${r.stdout}\n${r.stderr}`);
    fs.renameSync(partial, dir);
    return dir;
  } finally {
    fs.rmSync(lock, { force: true });
  }
}

/** Whether the process named in `lock` still runs; a lock that names no one yet was just made: it does. */
function exporting(lock) {
  let pid;
  try {
    pid = Number(fs.readFileSync(lock, 'utf8'));
  } catch {
    return false;
  }
  if (!pid) return true;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return e.code === 'EPERM';
  }
}

/**
 * Largest per-channel difference (0..255) allowed against the reference. Both sides run the same graphs,
 * but ORT's WebGPU and wasm kernels (MatMulNBits, convolutions) sum in another order than its native CPU
 * kernels, and the decoder's 16x upsampling spreads a small latent difference over many pixels. Measured
 * here (2026-12-05, the decoder of (8, 8, 16, 16) channels): 1 level at most (32 of 65536 pixels differ
 * on float32, 765 on float16); one level of margin for other CPUs.
 */
export const TOLERANCE = { float32: 2, float16: 2 };
