// `cargo xtask bench memory`: what each GPU memory plan holds. Each plan makes the same cold image in a
// browser of its own, after the pack is installed; printed per plan: the peak above idle of the GPU
// process (SwiftShader keeps "GPU" buffers there, so on this machine it stands for the GPU's memory) and
// of the extension's renderer, the GPU's memory in use where `nvidia-smi` answers, the wall time and its
// ratio to the first plan's, and the largest channel difference from the first plan's image.
//
//   node tests/e2e/bench/memory.mjs [--size 384] [--steps 2] [--pack tiny-f32|f32] [--piece-mb 16]
//        [--plans unlimited,lean,split] [--out FILE]
//
// Plans (the image is always the same prompt and seed):
//   unlimited  no budget: every stage loads at once and stays loaded (what a large GPU gets);
//   lean       a 1 GB budget, which no stage fits: one stage at a time, nothing kept;
//   split      lean, and the decoder run as a chain of pieces of at most --piece-mb (counted) MB.
// --pack tiny-f32 is the tiny real-architecture pack (tools/export, made by `cargo xtask test`); f32
// the fixture pack.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from '../lib/harness.mjs';
import { peakBetween, medianBetween, startSampler } from '../lib/proc-memory.mjs';
import { tinyPack } from '../lib/tiny-packs.mjs';

const { values: o } = parseArgs({
  options: {
    size: { type: 'string', default: '384' },
    steps: { type: 'string', default: '2' },
    pack: { type: 'string', default: 'tiny-f32' },
    'piece-mb': { type: 'string', default: '16' },
    plans: { type: 'string', default: 'unlimited,lean,split' },
    out: { type: 'string' },
  },
});
const size = Number(o.size);
const REQUEST = { prompt: 'a lighthouse in a storm', width: size, height: size, steps: Number(o.steps), seed: '7' };
const PLANS = {
  unlimited: { budget: null, request: {} },
  lean: { budget: 1e9, request: {} },
  split: { budget: 1e9, request: { decoderPieceBytes: Number(o['piece-mb']) * 1e6 } },
};
const MB = 2 ** 20;
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-memory-'));

/** The GPU's memory in use (bytes) every 200 ms while it runs, where nvidia-smi answers; else []. */
function sampleGpu() {
  const samples = [];
  let child;
  child = spawn('nvidia-smi', ['--query-gpu=memory.used', '--format=csv,noheader,nounits', '-lms=200'], { stdio: ['ignore', 'pipe', 'ignore'] });
  // No nvidia-smi here: no samples.
  child.on('error', () => {});
  child.stdout.on('data', (d) => String(d).split('\n').filter(Boolean).forEach((l) => samples.push({ t: Date.now(), bytes: Number(l) * MB })));
  return { samples, stop: () => child.kill() };
}

async function measure(name) {
  const plan = PLANS[name];
  const repoDir = o.pack === 'tiny-f32' ? await tinyPack('float32') : h.fixtureDir(o.pack);
  const repo = `bench/${o.pack}`;
  const b = await h.setup({ after: () => {} }, { pack: null, install: false, hubOptions: { repos: { [repo]: { dir: repoDir } } } });
  try {
    await h.installPack(b.page, b.hub, repo);
    if (plan.budget) await h.api(b.page, { type: 'gpuMemory', setting: { mode: 'set', bytes: plan.budget } });
    const sampler = startSampler(b.profileDir, 100);
    const gpu = sampleGpu();
    await h.sleep(2000);
    const idleTo = Date.now();
    const idle = medianBetween(sampler.history, idleTo - 2000, idleTo);
    const gpuIdle = Math.min(...gpu.samples.map((s) => s.bytes), Infinity);
    const { result, wallMs } = await h.generateOk(b.page, { ...REQUEST, ...plan.request }, 3_600_000);
    const end = Date.now();
    await sampler.stop();
    gpu.stop();
    const { peak } = peakBetween(sampler.history, idleTo, end);
    const gpuPeak = Math.max(...gpu.samples.filter((s) => s.t >= idleTo).map((s) => s.bytes), -Infinity);
    const png = path.join(dir, `${name}.png`);
    fs.writeFileSync(png, h.pngBytes(result));
    return {
      plan: name,
      memory: result.timings.memory,
      budget: result.timings.budget ?? null,
      pieces: result.timings.stages.find((s) => s.stage === 'decoder')?.pieces,
      wallMs,
      gpuProcessAboveIdle: (peak.gpu ?? 0) - (idle.gpu ?? 0),
      rendererAboveIdle: (peak.extension ?? 0) - (idle.extension ?? 0),
      gpuMemoryAboveIdle: Number.isFinite(gpuPeak) && Number.isFinite(gpuIdle) ? gpuPeak - gpuIdle : null,
      png,
    };
  } finally {
    await b.close();
    await b.hub?.close();
  }
}

const rows = [];
for (const name of o.plans.split(',')) {
  process.stdout.write(`plan ${name}... `);
  const row = await measure(name);
  console.log(`${(row.wallMs / 1000).toFixed(1)} s`);
  rows.push(row);
}
const first = rows[0];
for (const row of rows) {
  const compared = await h.run('python3', ['tests/reference/compare.py', first.png, row.png, '--tol', '255']);
  row.largestDifference = Number(/max abs channel difference (\d+)/.exec(compared.stdout)?.[1] ?? NaN);
  row.timeRatio = row.wallMs / first.wallMs;
}
console.log(`\n${o.pack} pack, ${size}x${size}, ${REQUEST.steps} steps, one cold image per plan, each in a browser of its own:`);
h.printTable(
  ['plan', 'at once / kept', 'decoder pieces', 'GPU process above idle (MiB)', 'renderer above idle (MiB)', 'GPU memory above idle (MiB)', 'time (s)', 'time / first', 'largest difference (levels)'],
  rows.map((r) => [
    r.plan,
    `${r.memory.ahead} / ${r.memory.keep}`,
    r.pieces,
    (r.gpuProcessAboveIdle / MB).toFixed(0),
    (r.rendererAboveIdle / MB).toFixed(0),
    r.gpuMemoryAboveIdle === null ? '-' : (r.gpuMemoryAboveIdle / MB).toFixed(0),
    (r.wallMs / 1000).toFixed(1),
    r.timeRatio.toFixed(2),
    r.largestDifference,
  ]),
);
if (o.out) fs.writeFileSync(o.out, JSON.stringify({ size, steps: REQUEST.steps, pack: o.pack, rows }, null, 2));
