// `cargo xtask bench generate`: where generation time goes, and what repeats and batches save, on a
// fixture pack.
//
//   node tests/e2e/bench/generate.mjs [--runs 3] [--size 512] [--steps 4] [--pack f32] [--backend webgpu]
//                                     [--batch 4]
//
// After one warm-up image (the browser's first image also pays for compiling ORT's wasm and opening
// WebGPU), for each of `runs` new prompts:
//   first   the prompt's first image (the text encoder runs; its stage is timed from the `progress`
//           events: text encoder start -> transformer start)
//   repeat  the same prompt with another seed (its embeddings come from the cache: no text encoder)
// Target: repeat <= (first - its text-encoder stage) * 1.05; the ratio repeat / (first - encoder)
// is printed with PASS or FAIL (on the median run).
// Then a batch of `batch` images against a single image, same prompt (both from the cache): the batch's
// wall time per image against the single image's.
//
// Wall time is request sent -> (last) result event; `timings` (time inside ORT) is printed beside it.

import { parseArgs } from 'node:util';
import * as h from '../lib/harness.mjs';

const { values: o } = parseArgs({
  options: {
    runs: { type: 'string', default: '3' },
    size: { type: 'string', default: '512' },
    steps: { type: 'string', default: '4' },
    pack: { type: 'string', default: 'f32' },
    backend: { type: 'string' },
    batch: { type: 'string', default: '4' },
  },
});
const runs = Number(o.runs);
const size = Number(o.size);
const steps = Number(o.steps);
const batch = Number(o.batch);
const TARGET = 1.05;

/** Collects events in the page with the time they arrived. */
async function collectTimed(page) {
  await page.evaluate(() => {
    if (window.__timed) return;
    window.__timed = [];
    chrome.runtime.onMessage.addListener((m) => {
      if (m && typeof m === 'object' && 'type' in m) window.__timed.push({ t: Date.now(), ...m, png: undefined });
      return false;
    });
  });
}

/** Runs one generate request to its last result; { wallMs, encoderMs, results }. */
async function generate(page, request) {
  const t0 = await page.evaluate(() => Date.now());
  const reply = await h.api(page, { type: 'generate', width: size, height: size, steps, ...request });
  if (reply?.type !== 'jobStarted') throw new Error(`generate: ${JSON.stringify(reply)}`);
  const count = request.count ?? 1;
  const deadline = Date.now() + 3600_000;
  for (;;) {
    const evs = await page.evaluate((job) => window.__timed.filter((e) => e.job === job), reply.job);
    const bad = evs.find((e) => e.type === 'failed' || e.type === 'cancelled');
    if (bad) throw new Error(`generate: ${JSON.stringify(bad)}`);
    const results = evs.filter((e) => e.type === 'result');
    if (results.length === count) {
      const encoding = evs.find((e) => e.type === 'progress' && e.progress.stage === 'textEncoder');
      const denoising = evs.find((e) => e.type === 'progress' && e.progress.stage === 'transformer');
      return {
        wallMs: results.at(-1).t - t0,
        encoderMs: encoding && denoising ? denoising.t - encoding.t : undefined,
        results,
      };
    }
    if (Date.now() > deadline) throw new Error('generate: timed out');
    await h.sleep(100);
  }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const s = (ms) => `${(ms / 1000).toFixed(2)} s`;

const server = await h.startHub({ repos: [o.pack] });
const b = await h.launch();
const pairs = [];
let single;
let batched;
try {
  console.log(`bench: installing fixture pack ${o.pack} from the fake Hub at ${server.url}`);
  await h.installPack(b.page, server, `fixtures/${o.pack}`, { backend: o.pack === 'f16' ? 'wasm' : undefined });
  await collectTimed(b.page);
  const extra = o.backend ? { backend: o.backend } : {};
  const warm = await generate(b.page, { prompt: 'a warm-up', seed: '1', ...extra });
  console.log(`bench: warm-up image: ${s(warm.wallMs)}`);
  for (let i = 1; i <= runs; i++) {
    const prompt = `a red fox in the snow, study ${i}`;
    const first = await generate(b.page, { prompt, seed: String(i), ...extra });
    const repeat = await generate(b.page, { prompt, seed: String(1000 + i), ...extra });
    const ratio = repeat.wallMs / (first.wallMs - first.encoderMs);
    pairs.push({ first, repeat, ratio });
    console.log(
      `bench: run ${i}: first ${s(first.wallMs)} (text encoder ${s(first.encoderMs)}), repeat ${s(repeat.wallMs)}, ` +
        `ratio ${ratio.toFixed(3)}`,
    );
  }
  const prompt = 'a red fox in the snow, study 1';
  single = await generate(b.page, { prompt, seed: '7', ...extra });
  batched = await generate(b.page, { prompt, seed: '8', count: batch, ...extra });
} finally {
  await b.close();
  await server.close();
}

console.log(`\nbench generate: ${size}x${size}, ${steps} steps, pack ${o.pack}, ${runs} runs`);
const cols = ['run', 'first ms', 'text encoder ms', 'first - encoder ms', 'repeat ms', 'repeat ort ms', 'ratio'];
const ortMs = (r) => {
  const t = r.results.at(-1).timings;
  return t ? (t.sessionCreateMs + t.runMs).toFixed(0) : '-';
};
const table = pairs.map(({ first, repeat, ratio }, i) => [
  String(i + 1),
  first.wallMs.toFixed(0),
  first.encoderMs.toFixed(0),
  (first.wallMs - first.encoderMs).toFixed(0),
  repeat.wallMs.toFixed(0),
  ortMs(repeat),
  ratio.toFixed(3),
]);
const widths = cols.map((c, i) => Math.max(c.length, ...table.map((row) => row[i].length)));
const line = (cells) => cells.map((c, i) => c.padStart(widths[i])).join('  ');
console.log(line(cols));
console.log(widths.map((w) => '-'.repeat(w)).join('  '));
for (const row of table) console.log(line(row));
const ratio = median(pairs.map((p) => p.ratio));
console.log(
  `repeat / (first - text encoder), median: ${ratio.toFixed(3)} (target <= ${TARGET}): ${ratio <= TARGET ? 'PASS' : 'FAIL'}`,
);
const perImage = batched.wallMs / batch;
console.log(
  `batch of ${batch}: ${s(batched.wallMs)}, ${s(perImage)} per image; single image: ${s(single.wallMs)}; ` +
    `per-image ratio ${(perImage / single.wallMs).toFixed(3)}`,
);
