// `cargo xtask bench buffers`: chained attention layers (tools/gpu-bench/attention_graph.py: the FLUX.2
// transformer's 24 heads x 128, float32, no weights) on ONNX Runtime Web's WebGPU backend (the shipped
// JSPI build, in a dedicated worker) in this machine's Chromium, with ORT's storage-buffer cache left at
// its default (`bucket`: released buffers are kept for the next run only up to 160 MiB) and set to
// `simple` (every released buffer kept; what `generate {keepBuffers: true}` asks for): session creation
// and each run per token count, the ratio of the warm runs, and how far the outputs are apart.
//
//   node tests/e2e/bench/buffers.mjs [--dir tests/e2e/out/attention] [--tokens 256] [--runs 4] [--out report.json]
//        [--timeout-s 600]
//
// DIR holds attention-T.onnx for each T of --tokens, written by attention_graph.py where missing. On the
// GPU machine, tools/gpu-bench/browser.sh runs it with PROBE (tools/gpu-bench/README.md).

import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from '../lib/harness.mjs';

const { values: o } = parseArgs({
  options: {
    dir: { type: 'string', default: path.join(h.OUT, 'attention') },
    tokens: { type: 'string', default: '256' },
    runs: { type: 'string', default: '4' },
    out: { type: 'string' },
    'timeout-s': { type: 'string', default: '600' },
  },
});
const tokens = o.tokens.split(',').map(Number);
if (tokens.some((t) => !fs.existsSync(path.join(o.dir, `attention-${t}.onnx`)))) {
  // The exporter's environment (`cargo xtask test` makes it) has onnx; the GPU machine's python3 too.
  const venv = path.join(h.ROOT, 'target/export-venv/bin/python');
  const python = fs.existsSync(venv) ? venv : 'python3';
  const r = await h.run(python, ['tools/gpu-bench/attention_graph.py', '--tokens', o.tokens, '--out', o.dir]);
  if (r.code !== 0) throw new Error(`attention_graph.py failed (${r.code}): ${r.stderr}`);
}
const runs = Number(o.runs);
const MODES = ['bucket', 'simple'];
const HEADS = 24;
const HEAD_DIM = 128;

const PAGE = `<!doctype html><script type="module">
  // The outputs stay here, by cache mode, for largestDifference: at 4608 tokens they are 14 M values.
  window.outputs = {};
  window.attend = (args) => new Promise((resolve, reject) => {
    const w = new Worker('/worker.mjs', { type: 'module' });
    w.onmessage = ({ data: { error, data, ...times } }) => {
      w.terminate();
      if (error) return reject(new Error(error));
      window.outputs[args.mode] = data;
      resolve(times);
    };
    w.onerror = (e) => reject(new Error(e.message));
    w.postMessage(args);
  });
  window.largestDifference = (a, b) => window.outputs[a].reduce((m, x, i) => Math.max(m, Math.abs(x - window.outputs[b][i])), 0);
</script>`;
const WORKER = `import * as ort from '/ort/ort.jspi.bundle.min.mjs';
  ort.env.wasm.numThreads = 1;
  onmessage = async ({ data: { graph, mode, tokens, runs } }) => {
    try {
      const bytes = new Uint8Array(await (await fetch(graph)).arrayBuffer());
      let t = performance.now();
      const session = await ort.InferenceSession.create(bytes, { executionProviders: [{ name: 'webgpu', storageBufferCacheMode: mode }], logSeverityLevel: 3 });
      const createMs = performance.now() - t;
      const shape = [1, ${HEADS}, tokens, ${HEAD_DIM}];
      const n = ${HEADS} * tokens * ${HEAD_DIM};
      const feeds = Object.fromEntries(['q', 'k', 'v'].map((name, j) => [name, new ort.Tensor('float32', Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37 + j)), shape)]));
      const runMs = [];
      let out;
      for (let i = 0; i < runs; i++) {
        t = performance.now();
        out = Object.values(await session.run(feeds))[0];
        runMs.push(performance.now() - t);
      }
      const data = out.data;
      await session.release();
      postMessage({ createMs, runMs, data });
    } catch (e) {
      postMessage({ error: String(e && e.stack || e) });
    }
  };`;

const server = await h.serveOrtBench({ page: PAGE, worker: WORKER, dir: o.dir });
const b = await h.launch({ page: null });
const report = { startedAt: new Date().toISOString(), runs, rows: [] };
try {
  const page = await b.context.newPage();
  page.setDefaultTimeout(Number(o['timeout-s']) * 1000);
  await page.goto(`http://127.0.0.1:${server.address().port}/`);
  report.browser = await b.context.browser().version();
  for (const t of tokens) {
    const row = { tokens: t, scoresMB: (HEADS * t * t * 4) / 1e6 };
    for (const mode of MODES) {
      row[mode] = await page.evaluate((args) => window.attend(args), { graph: `/attention-${t}.onnx`, mode, tokens: t, runs });
      console.log(`bench buffers: ${t} tokens, ${mode}: create ${row[mode].createMs.toFixed(0)} ms, runs ${row[mode].runMs.map((x) => x.toFixed(0)).join(' ')} ms`);
    }
    row.largestDifference = await page.evaluate(() => window.largestDifference('bucket', 'simple'));
    report.rows.push(row);
  }
} finally {
  await b.close();
  server.close();
}
console.log(`\nbench buffers: chained attention, float32, WebGPU, ${report.browser}; ${runs} runs each, a fresh worker and session per cache mode`);
h.printTable(['tokens', 'scores MB per layer', 'bucket runs ms', 'simple runs ms', 'bucket / simple, last run', 'largest difference'],
  report.rows.map((r) => [r.tokens, r.scoresMB.toFixed(0), r.bucket.runMs.map((x) => x.toFixed(0)).join(' '), r.simple.runMs.map((x) => x.toFixed(0)).join(' '),
    (r.bucket.runMs.at(-1) / r.simple.runMs.at(-1)).toFixed(2), r.largestDifference]));
if (o.out) fs.writeFileSync(o.out, JSON.stringify(report, null, 1) + '\n');
