// What a stage's weights cost the extension's renderer while they load: the stage workers' process
// sampled from /proc while every stage of a pack loads, in Chromium and in Firefox. Used by `cargo xtask
// bench loading` and by the Firefox test that the weights are streamed there too.

import fs from 'node:fs';
import path from 'node:path';
import * as h from './harness.mjs';
import { launchFirefox } from './firefox.mjs';
import { processTree, startSampler } from './proc-memory.mjs';
import { PYTHON } from './tiny-packs.mjs';

const REQUEST = { prompt: 'a lighthouse at dusk', width: 256, height: 256, steps: 1, seed: '1', backend: 'webgpu' };

/** The tiny float16 pack with the full-size decoder in place of its own, made once per checkout. */
export async function withFullDecoder(tiny) {
  const dir = path.join(h.ROOT, 'target/tiny-packs/f16-full-decoder');
  if (fs.existsSync(path.join(dir, 'vae_decoder.export.json'))) return dir;
  const partial = `${dir}.partial-${process.pid}`;
  fs.rmSync(partial, { recursive: true, force: true });
  fs.cpSync(tiny, partial, { recursive: true });
  const args = ['tools/gpu-bench/export_stage.py', '--stem', 'vae_decoder', '--config', 'full', '--activations', 'float32', '--out', partial, '--threads', '2'];
  const r = await h.run(PYTHON, args);
  if (r.code !== 0) throw new Error(`export_stage.py failed (${r.code}):\n${r.stdout}\n${r.stderr}`);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.renameSync(partial, dir);
  return dir;
}

/** Anonymous memory (bytes) of each process in the tree under `root`, by pid. */
function anonByPid(root) {
  const out = {};
  for (const pid of processTree(root)) {
    try {
      out[pid] = Number(/RssAnon:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) * 1024;
    } catch {}
  }
  return out;
}

/**
 * Samples `read()` every 200 ms: 2 s idle, then `job()` (which returns what ends it), then `watchMs`
 * more; returns when the job began (`t0`) and the samples.
 */
async function watch(read, job, watchMs) {
  const samples = [];
  let running = true;
  const loop = (async () => {
    while (running) {
      samples.push({ t: Date.now(), value: read() });
      await h.sleep(200);
    }
  })();
  let t0;
  try {
    await h.sleep(2000);
    t0 = Date.now();
    const cancel = await job();
    await h.sleep(watchMs);
    await cancel();
  } finally {
    running = false;
    await loop;
  }
  return { t0, samples };
}

/** Starts an image on `page` and returns what cancels it. */
async function startImage(page) {
  await h.collectEvents(page);
  const reply = await h.api(page, { type: 'generate', ...REQUEST });
  if (reply?.type !== 'jobStarted') throw new Error(`the image did not start: ${JSON.stringify(reply)}`);
  return () => h.api(page, { type: 'cancel', job: reply.job });
}

/** Idle (the median of the second before the request) and peak above it, of one series of numbers. */
function idleAndPeak(t0, samples) {
  const before = samples.filter((s) => s.t >= t0 - 1000 && s.t < t0).map((s) => s.value).sort((a, b) => a - b);
  const idle = before[Math.floor(before.length / 2)] ?? samples[0].value;
  return { idle, above: Math.max(...samples.filter((s) => s.t >= t0).map((s) => s.value)) - idle };
}

/**
 * Chromium installs `repo` from `hub`, then an image is asked for with no GPU memory limit (every stage
 * loads at once) and cancelled after `watchMs`: the extension renderer's anonymous memory (heaps:
 * JavaScript, wasm), idle (the median of the second before the request) and its peak above idle.
 */
export async function chromiumLoadingPeak(hub, repo, watchMs) {
  const b = await h.launch();
  try {
    await h.installPack(b.page, hub, repo);
    const sampler = startSampler(b.profileDir, 200);
    try {
      const read = () => sampler.history.at(-1)?.parts.extension?.anon ?? 0;
      const { t0, samples } = await watch(read, () => startImage(b.page), watchMs);
      return idleAndPeak(t0, samples);
    } finally {
      await sampler.stop();
    }
  } finally {
    await b.close();
  }
}

/** The same in Firefox ESR (`chromiumLoadingPeak`). */
export async function firefoxLoadingPeak(hub, repo, watchMs) {
  const ff = await launchFirefox({ headless: true });
  try {
    await h.installPack(ff.page, hub, repo);
    // Firefox names no process after its extensions: the stage workers' is the content process whose
    // memory grows the most while the stages load (WebGPU itself runs in the parent process here).
    const { t0, samples } = await watch(() => anonByPid(ff.browser.process().pid), () => startImage(ff.page), watchMs);
    // Processes there before the request only: one started later has no idle to count from.
    const pids = Object.keys(samples.filter((s) => s.t < t0).at(-1).value);
    const series = (pid) => samples.filter((s) => pid in s.value).map((s) => ({ t: s.t, value: s.value[pid] }));
    const [best] = pids
      .filter((pid) => Number(pid) !== ff.browser.process().pid)
      .map((pid) => idleAndPeak(t0, series(pid)))
      .sort((a, b) => b.above - a.above);
    return best;
  } finally {
    await ff.close();
  }
}
