// `cargo xtask bench browsers`: the tiny real-architecture packs (tests/e2e/lib/tiny-packs.mjs) on the two
// CPU WebGPUs the tests have: Chromium on SwiftShader and Firefox ESR on Mesa's lavapipe.
//
//   node tests/e2e/bench/browsers.mjs [--runs 3] [--size 256] [--steps 2]
//
// Each browser installs the float32 pack from the fake Hub, makes a warm-up image, then `runs` images of
// new prompts on WebGPU; Firefox also the float16 pack (lavapipe has `shader-f16`, SwiftShader does not).
// Printed per pack and browser, medians over the runs: each stage's session creation and run (ORT's own
// time, from the result's timings) and the wall time, then Firefox / Chromium for the float32 pack.
// The question it answers: would the browser tests' slowest files (images on SwiftShader) run faster on
// lavapipe?

import { parseArgs } from 'node:util';
import * as h from '../lib/harness.mjs';
import { launchFirefox } from '../lib/firefox.mjs';
import { tinyPack } from '../lib/tiny-packs.mjs';

const { values: o } = parseArgs({
  options: {
    runs: { type: 'string', default: '3' },
    size: { type: 'string', default: '256' },
    steps: { type: 'string', default: '2' },
  },
});
const runs = Number(o.runs);
const size = Number(o.size);
const steps = Number(o.steps);
const STAGES = ['textEncoder', 'transformer', 'decoder'];

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** The warm-up image and `runs` more of `repo` in `page`: per run, each stage's create and run ms and the wall. */
async function measure(page, hub, repo) {
  await h.installPack(page, hub, repo, { backend: 'webgpu' });
  const request = (i) => ({ prompt: `a red fox in the snow, study ${i}`, width: size, height: size, steps, seed: String(i), backend: 'webgpu' });
  await h.generateOk(page, request(0), 1_800_000);
  const measured = [];
  for (let i = 1; i <= runs; i++) {
    const { result, wallMs } = await h.generateOk(page, request(i), 1_800_000);
    const stages = Object.fromEntries(result.timings.stages.map((s) => [s.stage, s]));
    measured.push({ wallMs, stages });
    console.log(`bench: ${repo} run ${i}: ${(wallMs / 1000).toFixed(2)} s`);
  }
  const row = { wallMs: median(measured.map((m) => m.wallMs)) };
  for (const stage of STAGES) {
    row[`${stage} create`] = median(measured.map((m) => m.stages[stage]?.sessionCreateMs ?? 0));
    row[`${stage} run`] = median(measured.map((m) => m.stages[stage]?.runMs ?? 0));
  }
  return row;
}

const packs = { float32: await tinyPack('float32'), float16: await tinyPack('float16') };
const hub = await h.startHub({ repos: { 'tiny/float32': { dir: packs.float32 }, 'tiny/float16': { dir: packs.float16 } } });
const rows = [];
try {
  const chromium = await h.launch();
  try {
    rows.push({ browser: 'Chromium (SwiftShader)', pack: 'float32', ...(await measure(chromium.page, hub, 'tiny/float32')) });
  } finally {
    await chromium.close();
  }
  const firefox = await launchFirefox({ headless: true });
  try {
    rows.push({ browser: 'Firefox (lavapipe)', pack: 'float32', ...(await measure(firefox.page, hub, 'tiny/float32')) });
    rows.push({ browser: 'Firefox (lavapipe)', pack: 'float16', ...(await measure(firefox.page, hub, 'tiny/float16')) });
  } finally {
    await firefox.close();
  }
} finally {
  await hub.close();
}

console.log(`\nbench browsers: the tiny real-architecture packs, ${size}x${size}, ${steps} steps, WebGPU, median of ${runs} runs (ms)`);
const cols = ['browser', 'pack', ...STAGES.flatMap((s) => [`${s} create`, `${s} run`]), 'wallMs'];
const table = rows.map((r) => cols.map((c) => (typeof r[c] === 'number' ? r[c].toFixed(0) : r[c])));
const widths = cols.map((c, i) => Math.max(c.length, ...table.map((row) => row[i].length)));
const line = (cells) => cells.map((c, i) => (i < 2 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ');
console.log(line(cols));
console.log(widths.map((w) => '-'.repeat(w)).join('  '));
for (const row of table) console.log(line(row));
const [chromium, firefox] = rows;
const ratio = (c) => (chromium[c] > 0 ? (firefox[c] / chromium[c]).toFixed(2) : '-');
console.log(`Firefox (lavapipe) / Chromium (SwiftShader), float32: ${cols.slice(2).map((c) => `${c} ${ratio(c)}`).join(', ')}`);
