// `cargo xtask bench layout`: the VAE decoder on ONNX Runtime Web's WebGPU backend (the shipped JSPI
// build, in a dedicated worker) in this machine's Chromium, with ORT's layout for convolutions left at
// its default (NHWC: it transposes the activations around every Conv, normalization and Resize) and set
// to NCHW (the graph's own layout, no transposes): session creation and each run per image size, the
// ratio of the warm runs, and how far the outputs are apart.
//
//   node tests/e2e/bench/layout.mjs [--graph target/tiny-packs/f32/vae_decoder.onnx] [--sizes 256]
//        [--runs 3] [--out report.json] [--timeout-s 600]
//
// The graph is the pack's `vae_decoder.onnx` (input `packed_latent` [1, 128, h/16, w/16]) with its
// external data beside it; the default is the tiny real-architecture pack's (tests/e2e/lib/tiny-packs.mjs,
// made by `cargo xtask test`). On the GPU machine, tools/gpu-bench/browser.sh runs it on the full-size
// export after the extension's bench.

import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from '../lib/harness.mjs';

const { values: o } = parseArgs({
  options: {
    graph: { type: 'string', default: 'target/tiny-packs/f32/vae_decoder.onnx' },
    sizes: { type: 'string', default: '256' },
    runs: { type: 'string', default: '3' },
    out: { type: 'string' },
    'timeout-s': { type: 'string', default: '600' },
  },
});
if (!fs.existsSync(o.graph)) throw new Error(`${o.graph} does not exist: run \`cargo xtask test\` once (it exports the tiny packs), or pass --graph`);
const dir = path.dirname(path.resolve(o.graph));
const sizes = o.sizes.split(',').map(Number);
const runs = Number(o.runs);
const LAYOUTS = ['NHWC', 'NCHW'];

const PAGE = `<!doctype html><script type="module">
  window.decode = (args) => new Promise((resolve, reject) => {
    const w = new Worker('/worker.mjs', { type: 'module' });
    w.onmessage = (e) => { w.terminate(); e.data.error ? reject(new Error(e.data.error)) : resolve(e.data); };
    w.onerror = (e) => reject(new Error(e.message));
    w.postMessage(args);
  });
</script>`;
const WORKER = `import * as ort from '/ort/ort.jspi.bundle.min.mjs';
  ort.env.wasm.numThreads = 1;
  onmessage = async ({ data: { graph, external, layout, size, runs } }) => {
    try {
      const bytes = new Uint8Array(await (await fetch(graph)).arrayBuffer());
      // External data read into memory first, so that creation is timed without the fetch.
      const externalData = await Promise.all(external.map(async (path) => ({ path, data: new Uint8Array(await (await fetch('/' + path)).arrayBuffer()) })));
      let t = performance.now();
      const session = await ort.InferenceSession.create(bytes, { executionProviders: [{ name: 'webgpu', preferredLayout: layout }], externalData, logSeverityLevel: 3 });
      const createMs = performance.now() - t;
      const side = size / 16;
      const latent = new ort.Tensor('float32', Float32Array.from({ length: 128 * side * side }, (_, i) => Math.sin(i * 0.37)), [1, 128, side, side]);
      const runMs = [];
      let image;
      for (let i = 0; i < runs; i++) {
        t = performance.now();
        image = Object.values(await session.run({ [session.inputNames[0]]: latent }))[0];
        runMs.push(performance.now() - t);
      }
      postMessage({ createMs, runMs, image: Array.from(await image.getData()) });
    } catch (e) {
      postMessage({ error: String(e) });
    }
  };`;
const server = await h.serveOrtBench({ page: PAGE, worker: WORKER, dir });

const external = fs.readdirSync(dir).filter((f) => f.startsWith(path.basename(o.graph)) && f.endsWith('.data'));
const b = await h.launch({ page: null });
try {
  const page = await b.context.newPage();
  page.setDefaultTimeout(Number(o['timeout-s']) * 1000);
  await page.goto(`http://127.0.0.1:${server.address().port}/`);
  const report = { browser: await b.context.browser().version(), graph: o.graph, runs, sizes: [] };
  const rows = [];
  for (const size of sizes) {
    const by = {};
    for (const layout of LAYOUTS) {
      by[layout] = await page.evaluate((args) => window.decode(args), { graph: `/${path.basename(o.graph)}`, external, layout, size, runs });
    }
    let maxDiff = 0;
    by.NHWC.image.forEach((v, i) => (maxDiff = Math.max(maxDiff, Math.abs(v - by.NCHW.image[i]))));
    const warm = (layout) => by[layout].runMs.at(-1);
    report.sizes.push({
      size,
      ...Object.fromEntries(LAYOUTS.map((l) => [l, { createMs: by[l].createMs, runMs: by[l].runMs }])),
      nhwcOverNchw: warm('NHWC') / warm('NCHW'),
      maxAbsDifference: maxDiff,
    });
    for (const layout of LAYOUTS) {
      rows.push([`${size}x${size}`, layout, (by[layout].createMs / 1000).toFixed(2), by[layout].runMs.map((ms) => (ms / 1000).toFixed(3)).join(' '),
        layout === 'NCHW' ? (warm('NHWC') / warm('NCHW')).toFixed(2) : '', layout === 'NCHW' ? maxDiff.toExponential(2) : '']);
    }
  }
  console.log(`VAE decoder ${o.graph}, float32, WebGPU, ${report.browser}`);
  h.printTable(['image', 'layout', 'create s', 'runs s', 'NHWC / NCHW (last run)', 'largest difference'], rows);
  if (o.out) fs.writeFileSync(o.out, JSON.stringify(report, null, 2));
} finally {
  await b.close();
  server.close();
}
