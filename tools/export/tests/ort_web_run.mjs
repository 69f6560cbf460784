// Runs one ONNX graph with the project's onnxruntime-web (npm, 1.30) in Node, wasm backend, with the
// build the extension ships: ort.webgpu.bundle.min.mjs + ort-wasm-simd-threaded.asyncify.wasm
// (extension/stage-worker.js; xtask copies those two files). Set ORT_WEB_BUILD=node to use the
// package's Node entry (ort.node.min.mjs + ort-wasm-simd-threaded.wasm) instead: that build has
// more CPU kernels (it runs float64 Casts, for one) and is not what the browser gets.
//
//   node tools/export/tests/ort_web_run.mjs MODEL.onnx FEEDS.json RESULT.json [DATA_FILE ...]
//
// FEEDS.json: {name: {type: "float32"|"float16"|"int64", dims: [...], data: [numbers]}} (float16 as
// its uint16 bit patterns). Each DATA_FILE is passed as externalData under its base name, as the
// extension does. RESULT.json gets {ok: true, outputs: {name: {type, dims, data}}} or
// {ok: false, stage: "create"|"run", error}. Exit code 0 either way: the caller judges.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const [model, feedsPath, resultPath, ...dataFiles] = process.argv.slice(2);
const build = process.env.ORT_WEB_BUILD === 'node' ? 'node' : 'webgpu';
const ort = await import(build === 'node' ? 'onnxruntime-web' : 'onnxruntime-web/webgpu');
if (build === 'webgpu') {
  // The bundle fetches its wasm next to itself, which Node cannot: hand it the bytes.
  const dist = path.dirname(createRequire(import.meta.url).resolve('onnxruntime-web/webgpu'));
  ort.env.wasm.wasmBinary = fs.readFileSync(path.join(dist, 'ort-wasm-simd-threaded.asyncify.wasm'));
}
ort.env.wasm.numThreads = 1;
ort.env.logLevel = 'error';

const ARRAYS = {
  float32: Float32Array,
  float16: Uint16Array,
  int64: BigInt64Array,
};

function write(obj) {
  fs.writeFileSync(resultPath, JSON.stringify(obj));
}

let stage = 'create';
try {
  const externalData = dataFiles.map((f) => ({ path: path.basename(f), data: new Uint8Array(fs.readFileSync(f)) }));
  const session = await ort.InferenceSession.create(new Uint8Array(fs.readFileSync(model)), {
    executionProviders: ['wasm'],
    externalData,
  });
  stage = 'run';
  const spec = JSON.parse(fs.readFileSync(feedsPath, 'utf8'));
  const feeds = {};
  for (const [name, { type, dims, data }] of Object.entries(spec)) {
    const A = ARRAYS[type];
    const arr = type === 'int64' ? A.from(data, (v) => BigInt(v)) : A.from(data);
    feeds[name] = new ort.Tensor(type, arr, dims);
  }
  const res = await session.run(feeds);
  const outputs = {};
  for (const [name, t] of Object.entries(res)) {
    outputs[name] = { type: t.type, dims: t.dims, data: Array.from(t.data, Number) };
  }
  write({ ok: true, build, outputs });
} catch (e) {
  write({ ok: false, build, stage, error: String(e && e.message ? e.message : e) });
}
// Exit at once (conftest.py also runs node with --liftoff-only: see there).
process.exit(0);
