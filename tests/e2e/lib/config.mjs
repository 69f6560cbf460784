// Where things are and how long to wait: the repository, the extension under test, Chromium, the
// fixture packs, the output folder, the timeouts, WebGPU's flags.

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const DIST = process.env.IMAGINE_DIST ? path.resolve(process.env.IMAGINE_DIST) : path.join(ROOT, 'dist');

/** The URL extension pages import `gpu_adapter.js` from (a wasm-bindgen snippet of the web crate). */
export function gpuAdapterUrl() {
  const [dir] = fs.readdirSync(path.join(DIST, 'pkg/snippets')).filter((d) => d.startsWith('imagine-web-'));
  return `/pkg/snippets/${dir}/src/platform/gpu_adapter.js`;
}
export const CHROMIUM = process.env.IMAGINE_CHROMIUM || '/usr/lib/chromium/chromium';
export const PACKS = process.env.IMAGINE_PACKS ? path.resolve(process.env.IMAGINE_PACKS) : path.join(ROOT, 'tests/fixtures/packs');
export const OUT = path.join(ROOT, 'tests/e2e/out');

/** SwiftShader is slow: one generation may take this long. */
export const GENERATION_TIMEOUT_MS = 180_000;
/** A pack install from loopback. */
export const INSTALL_TIMEOUT_MS = 120_000;
/**
 * The longest a job may go without an event (a stage's start, a step, an image) before its test fails,
 * naming the stage it was in. The longest quiet stretch in the browser tests is the tiny
 * real-architecture decoder's one run at 256x256 on SwiftShader, about 80 s here (2026-12-02); a stage
 * that never ends fails within minutes, not at the test file's timeout.
 */
export const STALL_MS = 300_000;

/**
 * WebGPU's flags by IMAGINE_WEBGPU. swiftshader: WebGPU without a GPU (`--enable-unsafe-webgpu` gives the
 * SwiftShader adapter; the other two don't hurt). vulkan: headless Chromium on a real GPU; without
 * `--disable-vulkan-surface` Vulkan fails to start there and only SwiftShader is left (measured on an
 * NVIDIA H200, Chromium 156, 2026-12-02).
 */
export const WEBGPU_ARGS = {
  swiftshader: ['--enable-unsafe-webgpu', '--enable-unsafe-swiftshader', '--use-webgpu-adapter=swiftshader'],
  vulkan: ['--enable-unsafe-webgpu', '--ignore-gpu-blocklist', '--use-angle=vulkan', '--enable-features=Vulkan', '--disable-vulkan-surface'],
};

export function webgpuArgs(kind = process.env.IMAGINE_WEBGPU || 'swiftshader') {
  const args = WEBGPU_ARGS[kind];
  if (!args) throw new Error(`IMAGINE_WEBGPU=${kind}: expected one of ${Object.keys(WEBGPU_ARGS).join(', ')}`);
  return args;
}

/**
 * IMAGINE_TEST_FLAGS=1 (`cargo xtask test` and `e2e` set it): Chromium with two savings of CPU that no
 * test's outcome depends on, as the browser tests keep a 2-core machine busy (BENCHMARKS.md, "CI" and
 * "Where the browser tests' CPU goes"); the benchmarks leave it unset, measuring the browser as users
 * run it.
 * - V8 compiles WebAssembly with its baseline compiler only (`--liftoff-only`). Every stage worker
 *   loads ORT's wasm afresh and V8's optimizing tier compiles its hot code again in each: with the
 *   tests' tiny graphs, about 1.3 s of CPU per worker, more than it gives back. (Firefox's optimizing
 *   tier costs its tests nothing measurable: left on.)
 * - Dawn compiles the shaders without zeroing workgroup memory and without clamping every buffer index
 *   (`disable_workgroup_init`, `disable_robustness`): about a third of the GPU process's CPU, which runs
 *   SwiftShader, on the fixture pack's images. A kernel that relied on either would read garbage here and
 *   fail its test: no test can pass here and fail for users. (Dawn's `skip_validation` would save a
 *   little more, but it would let through a WebGPU call that users' Chrome refuses.)
 * - Chromium does not load its omnibox popup, two WebUI pages it otherwise makes at every start in a
 *   renderer of their own, headless too: 1.2 of the 2.9 CPU-s that a launch and close took.
 */
export function testFlags() {
  return process.env.IMAGINE_TEST_FLAGS === '1'
    ? ['--js-flags=--liftoff-only', '--enable-dawn-features=disable_workgroup_init,disable_robustness', '--disable-features=WebUIOmniboxPopup,WebUIOmniboxAimPopup']
    : [];
}

/**
 * Bytes as the pages write them (`imagine_core::hub::format_bytes`): decimal units, one decimal below
 * 100 of the unit and none above, with a plain space (the pages hold it to the unit with a no-break
 * space: `.replace(' ', '\u00a0')`).
 */
export function formatBytes(bytes) {
  if (bytes === 1) return '1 byte';
  if (bytes < 1000) return `${bytes} bytes`;
  const [value, unit] = bytes >= 999_500_000 ? [bytes / 1e9, 'GB'] : bytes >= 999_500 ? [bytes / 1e6, 'MB'] : [bytes / 1e3, 'KB'];
  return `${value >= 99.95 ? value.toFixed(0) : value.toFixed(1)} ${unit}`;
}
