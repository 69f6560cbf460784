// `cargo xtask bench blocks`: one MatMulNBits as the exporter writes it (block 128) against the same node
// re-blocked to 32 by the stage worker's graph edit (`imagine_core::matmul_blocks`), on ONNX Runtime Web's
// WebGPU backend (the shipped JSPI build, in a dedicated worker) in this machine's Chromium. Prints
// session creation and each run per block size, the ratio of the warm runs, and how far the outputs are
// apart (the two kernels sum in another order).
//
//   node tests/e2e/bench-blocks.mjs [--k 128] [--n 2560] [--bits 4] [--tokens 512] [--runs 2] [--timeout-s 600]
//
// The defaults are the tiny text encoder's down projection at its 512 tokens, the node that made the
// real-architecture browser test run for over ten minutes at block 128 on SwiftShader (Chromium 156).

import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from './harness.mjs';

const { values: o } = parseArgs({
  options: {
    k: { type: 'string', default: '128' },
    n: { type: 'string', default: '2560' },
    bits: { type: 'string', default: '4' },
    tokens: { type: 'string', default: '512' },
    runs: { type: 'string', default: '2' },
    'timeout-s': { type: 'string', default: '600' },
  },
});
const [k, tokens, runs] = [Number(o.k), Number(o.tokens), Number(o.runs)];

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-bench-blocks-'));
const graphs = { 128: path.join(dir, 'block128.onnx'), 32: path.join(dir, 'block32.onnx') };
for (const [cmd, args] of [
  ['python3', ['tests/e2e/matmul_nbits_model.py', graphs[128], o.k, o.n, o.bits, '128']],
  ['cargo', ['run', '-q', '-p', 'imagine-core', '--example', 'block32', '--', graphs[128], graphs[32]]],
]) {
  const r = await h.run(cmd, args);
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${r.code}):\n${r.stdout}\n${r.stderr}`);
}

// The page starts a module worker; the worker loads ORT as the stage workers do and runs one graph.
const PAGE = `<!doctype html><script type="module">
  window.runGraph = (graph, tokens, k, runs) => new Promise((resolve, reject) => {
    const w = new Worker('/worker.mjs', { type: 'module' });
    w.onmessage = (e) => { w.terminate(); e.data.error ? reject(new Error(e.data.error)) : resolve(e.data); };
    w.onerror = (e) => reject(new Error(e.message));
    w.postMessage({ graph, tokens, k, runs });
  });
</script>`;
const WORKER = `import * as ort from '/ort/ort.jspi.bundle.min.mjs';
  ort.env.wasm.numThreads = 1;
  onmessage = async ({ data: { graph, tokens, k, runs } }) => {
    try {
      const bytes = new Uint8Array(await (await fetch(graph)).arrayBuffer());
      let t = performance.now();
      const session = await ort.InferenceSession.create(bytes, { executionProviders: ['webgpu'] });
      const createMs = performance.now() - t;
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
const TYPES = { '.mjs': 'text/javascript', '.wasm': 'application/wasm' };
const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://localhost');
  const send = (body, type) => res.writeHead(200, { 'content-type': type }).end(body);
  if (url.pathname === '/') return send(PAGE, 'text/html');
  if (url.pathname === '/worker.mjs') return send(WORKER, 'text/javascript');
  const file = url.pathname.startsWith('/ort/')
    ? path.join(h.DIST, 'ort', path.basename(url.pathname))
    : path.join(dir, path.basename(url.pathname));
  if (!fs.existsSync(file)) return res.writeHead(404).end();
  send(fs.readFileSync(file), TYPES[path.extname(file)] ?? 'application/octet-stream');
});
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));

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
} finally {
  await b.close();
  server.close();
  fs.rmSync(dir, { recursive: true, force: true });
}
