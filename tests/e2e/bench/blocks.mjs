// `cargo xtask bench blocks`: on ONNX Runtime Web's WebGPU backend (the shipped JSPI build, in a
// dedicated worker) in this machine's Chromium,
//   1. one MatMulNBits as the exporter writes it (block 128) against the same node re-blocked to 32 by
//      the stage worker's graph edit (`imagine_core::graph::reblock`): session creation and each run per
//      block size, the ratio of the warm runs, and how far the outputs are apart (the two kernels sum in
//      another order);
//   2. session creation of the text encoder's MatMulNBits at full size (--layers of them,
//      text_encoder_shaped_model.py; 0 skips this) as exported (block 128), re-blocked with nodes that
//      ONNX Runtime folds while it creates the session (`to_block_32`), and re-blocked with the scales
//      and zero points computed beforehand (`to_block_32_computed`, what the stage worker does), each
//      in a fresh worker, --creates times in turn; the median of each and the ratios.
//
//   node tests/e2e/bench/blocks.mjs [--k 128] [--n 2560] [--bits 4] [--tokens 512] [--runs 2]
//        [--layers 27] [--creates 3] [--timeout-s 600]
//
// The defaults of 1 are the tiny text encoder's down projection at its 512 tokens, the node that made
// the real-architecture browser test run for over ten minutes at block 128 on SwiftShader (Chromium
// 156); of 2, the 27 layers of the published text encoder.

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from '../lib/harness.mjs';

const { values: o } = parseArgs({
  options: {
    k: { type: 'string', default: '128' },
    n: { type: 'string', default: '2560' },
    bits: { type: 'string', default: '4' },
    tokens: { type: 'string', default: '512' },
    runs: { type: 'string', default: '2' },
    layers: { type: 'string', default: '27' },
    creates: { type: 'string', default: '3' },
    'timeout-s': { type: 'string', default: '600' },
  },
});
const [k, tokens, runs] = [Number(o.k), Number(o.tokens), Number(o.runs)];

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-bench-blocks-'));
const graphs = { 128: path.join(dir, 'block128.onnx'), 32: path.join(dir, 'block32.onnx') };
const shaped = { exported: path.join(dir, 'te.onnx'), folded: path.join(dir, 'te.folded.onnx'), computed: path.join(dir, 'te.computed.onnx') };
const block32 = (...args) => ['cargo', ['run', '-q', '--release', '-p', 'imagine-core', '--example', 'block32', '--', ...args]];
for (const [cmd, args] of [
  ['python3', ['tests/e2e/lib/matmul_nbits_model.py', graphs[128], o.k, o.n, o.bits, '128']],
  block32(graphs[128], graphs[32]),
  ...(Number(o.layers) > 0 ? [
    ['python3', ['tests/e2e/lib/text_encoder_shaped_model.py', shaped.exported, o.layers]],
    block32(shaped.exported, shaped.folded),
    block32('--computed', shaped.exported, shaped.computed),
  ] : []),
]) {
  const r = await h.run(cmd, args);
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${r.code}):\n${r.stdout}\n${r.stderr}`);
}

// The page starts a module worker; the worker loads ORT as the stage workers do and runs one graph.
const PAGE = `<!doctype html><script type="module">
  window.runGraph = (graph, tokens, k, runs, external = []) => new Promise((resolve, reject) => {
    const w = new Worker('/worker.mjs', { type: 'module' });
    w.onmessage = (e) => { w.terminate(); e.data.error ? reject(new Error(e.data.error)) : resolve(e.data); };
    w.onerror = (e) => reject(new Error(e.message));
    w.postMessage({ graph, tokens, k, runs, external });
  });
</script>`;
const WORKER = `import * as ort from '/ort/ort.jspi.bundle.min.mjs';
  ort.env.wasm.numThreads = 1;
  onmessage = async ({ data: { graph, tokens, k, runs, external } }) => {
    try {
      const bytes = new Uint8Array(await (await fetch(graph)).arrayBuffer());
      // External data read into memory first, so that creation is timed without the fetch.
      const externalData = await Promise.all(external.map(async (path) => ({ path, data: new Uint8Array(await (await fetch('/' + path)).arrayBuffer()) })));
      let t = performance.now();
      const session = await ort.InferenceSession.create(bytes, { executionProviders: ['webgpu'], externalData, logSeverityLevel: 3 });
      const createMs = performance.now() - t;
      if (runs === 0) {
        await session.release();
        return postMessage({ createMs });
      }
      const a = new ort.Tensor('float32', Float32Array.from({ length: tokens * k }, (_, i) => Math.sin(i)), [tokens, k]);
      const runMs = [];
      let y;
      for (let i = 0; i < runs; i++) {
        t = performance.now();
        y = (await session.run({ a })).y;
        runMs.push(performance.now() - t);
      }
      postMessage({ createMs, runMs, y: Array.from(y.data) });
    } catch (e) {
      postMessage({ error: String(e) });
    }
  };`;
const server = await h.serveOrtBench({ page: PAGE, worker: WORKER, dir });

const b = await h.launch({ page: null });
try {
  const page = await b.context.newPage();
  page.setDefaultTimeout(Number(o['timeout-s']) * 1000);
  await page.goto(`http://127.0.0.1:${server.address().port}/`);
  const results = {};
  for (const block of [32, 128]) {
    results[block] = await page.evaluate(([g, t, kk, r]) => window.runGraph(g, t, kk, r), [`/${path.basename(graphs[block])}`, tokens, k, runs]);
  }
  console.log(`MatMulNBits K ${o.k}, N ${o.n}, ${o.bits} bits, ${tokens} tokens, float32, WebGPU, ${await b.context.browser().version()}`);
  h.printTable(
    ['block', 'create ms', ...results[32].runMs.map((_, i) => `run ${i + 1} ms`)],
    [32, 128].map((block) => [block, results[block].createMs.toFixed(0), ...results[block].runMs.map((ms) => ms.toFixed(0))]),
  );
  const warm = (block) => results[block].runMs.at(-1);
  const [y32, y128] = [results[32].y, results[128].y];
  let [maxAbs, maxDiff] = [0, 0];
  y128.forEach((v, i) => {
    maxAbs = Math.max(maxAbs, Math.abs(v));
    maxDiff = Math.max(maxDiff, Math.abs(v - y32[i]));
  });
  console.log(`block 128 / block 32, last run: ${(warm(128) / warm(32)).toFixed(1)}x`);
  console.log(`outputs: largest difference ${maxDiff.toExponential(2)} (largest value ${maxAbs.toFixed(3)})`);

  if (Number(o.layers) > 0) {
    const forms = Object.keys(shaped);
    const external = { exported: ['te.onnx.data'], folded: ['te.onnx.data'], computed: ['te.onnx.data', 'imagine-block32.data'] };
    const created = Object.fromEntries(forms.map((f) => [f, []]));
    for (let i = 0; i < Number(o.creates); i++) {
      for (const form of forms) {
        const r = await page.evaluate(([g, ext]) => window.runGraph(g, 0, 0, 0, ext), [`/${path.basename(shaped[form])}`, external[form]]);
        created[form].push(r.createMs / 1000);
      }
    }
    const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    const mb = (f) => (fs.statSync(f).size / 1e6).toFixed(0);
    console.log(`\nsession creation, ${o.layers} layers of the text encoder's MatMulNBits (int4, block 128 as exported; ${mb(shaped.exported + '.data')} MB of weights, float32 scales), ${o.creates} times each in turn:`);
    h.printTable(
      ['form', 'create s (each)', 'median s'],
      forms.map((f) => [
        { exported: 'block 128 (as exported)', folded: 'block 32, nodes folded by ORT', computed: `block 32, computed (+${mb(path.join(dir, 'imagine-block32.data'))} MB)` }[f],
        created[f].map((s) => s.toFixed(2)).join(' '),
        median(created[f]).toFixed(2),
      ]),
    );
    console.log(`folded / computed: ${(median(created.folded) / median(created.computed)).toFixed(2)}x; computed / exported: ${(median(created.computed) / median(created.exported)).toFixed(2)}x`);
  }
} finally {
  await b.close();
  server.close();
  fs.rmSync(dir, { recursive: true, force: true });
}
