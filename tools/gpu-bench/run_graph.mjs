// Runs ONE graph of a pack once with ONNX Runtime Web 1.30 (the extension's build) in Node, on a real
// GPU through Dawn (or ORT's wasm backend), with feeds from files; writes its first output's float32
// bytes. compare_transformer.py calls it for the float32 export and the converted float16 export.
//
//   node --experimental-wasm-jspi tools/gpu-bench/run_graph.mjs --graph DIR/NAME.onnx --feeds DIR/feeds.json \
//        --out FILE.bin --ort-dir DIR [--dawn PATH/dawn.node] [--ep webgpu|wasm] [--build jspi|asyncify]
//        [--external a.data,b.data]
//
// feeds.json: [{name, dtype: "float32"|"int64", dims, file}] (file: raw little-endian bytes, beside
// feeds.json). The session is made as bench.mjs makes it: a GPUDevice with the adapter's maximum
// limits and no features (the H200's Dawn adapter has no shader-f16), graphOptimizationLevel 'all',
// each external-data file (named in the graph's directory) as a file-backed Blob. Prints one JSON
// line: adapter, timings, output dims, finiteness.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const require = createRequire(import.meta.url);
const a = { ep: 'webgpu', build: 'jspi', external: '' };
for (let i = 2; i < process.argv.length; i += 2) {
  a[process.argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase())] = process.argv[i + 1];
}
for (const k of ['graph', 'feeds', 'out', 'ortDir']) if (!a[k]) throw new Error(`--${k} is required`);

const LIMITS = [
  'maxBufferSize', 'maxStorageBufferBindingSize', 'maxComputeWorkgroupStorageSize',
  'maxComputeInvocationsPerWorkgroup', 'maxComputeWorkgroupSizeX', 'maxComputeWorkgroupSizeY',
  'maxComputeWorkgroupSizeZ', 'maxComputeWorkgroupsPerDimension', 'maxStorageBuffersPerShaderStage',
];
const report = { graph: path.basename(a.graph), ep: a.ep, build: a.build };
let device = null;
if (a.ep === 'webgpu') {
  if (!a.dawn) throw new Error('--dawn is required for the webgpu EP');
  const { create, globals } = require(path.resolve(a.dawn));
  Object.assign(globalThis, globals);
  Object.defineProperty(globalThis.navigator, 'gpu', { value: create([]), configurable: true });
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance' });
  if (!adapter) throw new Error('no WebGPU adapter');
  const requiredLimits = {};
  for (const k of LIMITS) requiredLimits[k] = adapter.limits[k];
  report.adapter = { description: adapter.info?.description, shaderF16: adapter.features.has('shader-f16'),
    maxBufferSize: adapter.limits.maxBufferSize, maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize };
  device = await adapter.requestDevice({ requiredFeatures: [], requiredLimits });
}

const [bundle, wasm] = {
  jspi: ['ort.jspi.bundle.min.mjs', 'ort-wasm-simd-threaded.jspi.wasm'],
  asyncify: ['ort.webgpu.bundle.min.mjs', 'ort-wasm-simd-threaded.asyncify.wasm'],
}[a.build];
const ort = await import(pathToFileURL(path.resolve(a.ortDir, bundle)).href);
ort.env.wasm.wasmBinary = fs.readFileSync(path.resolve(a.ortDir, wasm));
ort.env.wasm.numThreads = 1;
ort.env.logLevel = 'error';
report.ort = ort.env.versions?.web ?? ort.env.versions?.common;
report.node = process.version;

const dir = path.dirname(a.graph);
const externalData = [];
for (const f of a.external ? a.external.split(',') : []) {
  externalData.push({ path: f, data: await fs.openAsBlob(path.join(dir, f)) });
}
let t = performance.now();
const session = await ort.InferenceSession.create(fs.readFileSync(a.graph), {
  executionProviders: a.ep === 'webgpu' ? [{ name: 'webgpu', device }] : ['wasm'],
  externalData,
  graphOptimizationLevel: 'all',
});
report.createMs = Math.round(performance.now() - t);

const TYPED = { float32: Float32Array, int64: BigInt64Array };
const feedsDir = path.dirname(a.feeds);
const feeds = {};
for (const f of JSON.parse(fs.readFileSync(a.feeds, 'utf8'))) {
  const b = fs.readFileSync(path.join(feedsDir, f.file));
  const copy = new Uint8Array(b.length);
  copy.set(b);
  feeds[f.name] = new ort.Tensor(f.dtype, new TYPED[f.dtype](copy.buffer), f.dims);
}
t = performance.now();
const results = await session.run(feeds);
report.runMs = Math.round(performance.now() - t);
const out = results[session.outputNames[0]];
if (out.type !== 'float32') throw new Error(`output ${session.outputNames[0]} is ${out.type}, not float32`);
report.output = { name: session.outputNames[0], dims: out.dims, finite: out.data.every(Number.isFinite) };
fs.writeFileSync(a.out, Buffer.from(out.data.buffer, out.data.byteOffset, out.data.byteLength));
await session.release();
device?.destroy();
console.log(JSON.stringify(report));
process.exit(0);
