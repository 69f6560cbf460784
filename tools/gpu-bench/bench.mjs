// GPU benchmark of the Imagine pipeline: ONNX Runtime Web 1.30 (the extension's build) in Node on a
// real GPU through Dawn (the `webgpu` npm package's dawn.node), driven by the core's own pipeline.
//
//   node --experimental-wasm-jspi tools/gpu-bench/bench.mjs --pack DIR --bridge BIN \
//        --tokenizer-dir DIR --ort-dir DIR --dawn PATH --out DIR [--build jspi|asyncify] [--ep webgpu|wasm]
//        [--plan none,transformer,transformer] [--prompt TEXT] [--seed N] [--size 512] [--steps 4]
//        [--dawn-flags a=b,c=d] [--dawn-label webgpu@0.6.2]
//
// Who does what:
// * The core (crates/core/examples/stdio_pipeline.rs, a native build of imagine-core, spawned here as
//   BIN): parameter validation, the Qwen3 chat template and tokenizer (512 ids + mask), the schedule's
//   sigmas, text and image position ids, the seed's noise, the Euler step after each transformer
//   call, the unpacking to the decoder's input, RGBA and PNG; and the order of the stages, each
//   opened, run and closed as the extension's stage workers do. It finds each graph's external-data
//   files with the core's pack reader.
// * This script: the runtime end of that bridge. For each `open` it creates a GPUDevice (the adapter's
//   maximum limits, as crates/web/src/platform/gpu.rs) and an ORT Web InferenceSession (webgpu EP on that
//   device, graphOptimizationLevel all, external data as file-backed Blobs, as the extension passes
//   OPFS Files); `run` runs it; `close` releases the session and destroys the device, unless the
//   plan keeps the stage loaded. It times all of it.
//
// Output: OUT/bench.json (adapter, versions, every event with its milliseconds, per-image summary),
// a table on stdout, and the core's OUT/image-<i>.png and OUT/core-trace.json.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const require = createRequire(import.meta.url);

function parseArgs(argv) {
  const a = {
    build: 'jspi', ep: 'webgpu', plan: 'none,transformer,transformer', size: 512, steps: 4, seed: 42,
    prompt: 'a red fox sitting in fresh snow at sunrise, detailed fur, soft golden light', dawnFlags: '',
  };
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(i + 1 < argv.length)) throw new Error(`${argv[i]} needs a value`);
    a[key] = argv[i + 1];
  }
  for (const k of ['pack', 'bridge', 'tokenizerDir', 'ortDir', 'out']) {
    if (!a[k]) throw new Error(`--${k.replace(/[A-Z]/g, (c) => '-' + c.toLowerCase())} is required`);
  }
  if (a.ep === 'webgpu' && !a.dawn) throw new Error('--dawn is required for the webgpu EP');
  return a;
}

const args = parseArgs(process.argv);
fs.mkdirSync(args.out, { recursive: true });
const now = () => performance.now();
const events = [];
const log = (...m) => console.log(...m);

// ---------------------------------------------------------------------------------------------
// WebGPU through Dawn
// ---------------------------------------------------------------------------------------------

// Limits ORT's WebGPU EP benefits from; the extension asks for the adapter's maximum of each
// (crates/web/src/platform/gpu.rs, LIMITS).
const LIMITS = [
  'maxBufferSize', 'maxStorageBufferBindingSize', 'maxComputeWorkgroupStorageSize',
  'maxComputeInvocationsPerWorkgroup', 'maxComputeWorkgroupSizeX', 'maxComputeWorkgroupSizeY',
  'maxComputeWorkgroupSizeZ', 'maxComputeWorkgroupsPerDimension', 'maxStorageBuffersPerShaderStage',
];

let adapterReport = null;
if (args.ep === 'webgpu') {
  const { create, globals } = require(path.resolve(args.dawn));
  Object.assign(globalThis, globals);
  const gpu = create(args.dawnFlags ? args.dawnFlags.split(',') : []);
  Object.defineProperty(globalThis.navigator, 'gpu', { value: gpu, configurable: true });
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance' });
  if (!adapter) throw new Error('no WebGPU adapter');
  const limits = {};
  for (const k in adapter.limits) limits[k] = adapter.limits[k];
  const info = adapter.info || {};
  adapterReport = {
    vendor: info.vendor, architecture: info.architecture, device: info.device, description: info.description,
    features: [...adapter.features].sort(), limits, shaderF16: adapter.features.has('shader-f16'),
  };
  log('adapter:', JSON.stringify({ ...adapterReport, limits: undefined }));
  log('limits:', JSON.stringify(limits));
}

async function openDevice(needsF16) {
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance' });
  if (needsF16 && !adapter.features.has('shader-f16')) {
    throw new Error('the graph uses float16 but the adapter has no shader-f16');
  }
  const requiredLimits = {};
  for (const k of LIMITS) requiredLimits[k] = adapter.limits[k];
  const requiredFeatures = needsF16 ? ['shader-f16'] : [];
  return adapter.requestDevice({ requiredFeatures, requiredLimits });
}

// ---------------------------------------------------------------------------------------------
// ONNX Runtime Web, the extension's build
// ---------------------------------------------------------------------------------------------

const builds = {
  // The JSPI bundle and its wasm: reads external data one initializer at a time.
  jspi: ['ort.jspi.bundle.min.mjs', 'ort-wasm-simd-threaded.jspi.wasm'],
  // The asyncify build (reads every external-data Blob whole before creating the session).
  asyncify: ['ort.webgpu.bundle.min.mjs', 'ort-wasm-simd-threaded.asyncify.wasm'],
};
const [bundle, wasmFile] = builds[args.build];
const ort = await import(pathToFileURL(path.resolve(args.ortDir, bundle)).href);
ort.env.wasm.wasmBinary = fs.readFileSync(path.resolve(args.ortDir, wasmFile));
ort.env.wasm.numThreads = 1; // as the stage worker (imagine_ort::configure(1))
ort.env.logLevel = 'warning';
const ortVersion = ort.env.versions?.web ?? ort.env.versions?.common;
log(`node ${process.version}, onnxruntime-web ${ortVersion} (${bundle}), ep ${args.ep}`);

function typeName(t) {
  return { float32: 'float32', float16: 'float16', int64: 'int64', float: 'float32' }[t] ?? String(t);
}

function describe(metadata) {
  return metadata.map((m) => ({
    name: m.name,
    dtype: typeName(m.type),
    shape: (m.shape ?? []).map((d) => (typeof d === 'number' ? d : String(d))),
  }));
}

const TYPED = { float32: Float32Array, float16: Uint16Array, int64: BigInt64Array };

function toTensor(dtype, dims, bytes) {
  const Typed = TYPED[dtype];
  if (!Typed) throw new Error(`feed type ${dtype}`);
  const copy = new Uint8Array(bytes.length);
  copy.set(bytes);
  return new ort.Tensor(dtype, new Typed(copy.buffer), dims);
}

function tensorBytes(t) {
  const d = t.data; // CPU tensor (no preferredOutputLocation): a typed array
  return Buffer.from(d.buffer, d.byteOffset, d.byteLength);
}

// ---------------------------------------------------------------------------------------------
// The bridge to the core
// ---------------------------------------------------------------------------------------------

const open = new Map(); // graph -> {session, device, inputs, outputs}
const kept = new Map();
let image = null; // the image being made: its record
const images = [];

async function handle(msg, payload) {
  switch (msg.op) {
    case 'open': {
      if (kept.has(msg.graph)) {
        const s = kept.get(msg.graph);
        kept.delete(msg.graph);
        open.set(msg.graph, s);
        events.push({ image: image?.index, graph: msg.graph, what: 'reuse', ms: 0 });
        image?.stages.push({ graph: msg.graph, reused: true, deviceMs: 0, createMs: 0, runMs: [] });
        return { ok: true, inputs: s.inputs, outputs: s.outputs };
      }
      const t0 = now();
      const device = args.ep === 'webgpu' ? await openDevice(msg.needs_f16) : null;
      const t1 = now();
      const bytes = fs.readFileSync(path.join(args.pack, msg.graph));
      const externalData = [];
      for (const f of msg.external) {
        // A file-backed Blob, as the extension hands ORT an OPFS File.
        externalData.push({ path: f.path, data: await fs.openAsBlob(path.join(args.pack, f.file)) });
      }
      const t2 = now();
      const options = {
        executionProviders: args.ep === 'webgpu' ? [{ name: 'webgpu', device }] : ['wasm'],
        externalData,
        graphOptimizationLevel: 'all',
      };
      const session = await ort.InferenceSession.create(bytes, options);
      const t3 = now();
      const rss = process.memoryUsage().rss;
      const s = { session, device, inputs: describe(session.inputMetadata), outputs: describe(session.outputMetadata) };
      open.set(msg.graph, s);
      const rec = { graph: msg.graph, reused: false, deviceMs: t1 - t0, readMs: t2 - t1, createMs: t3 - t2, runMs: [], rssAfterCreateMB: rss / 2 ** 20 };
      image?.stages.push(rec);
      events.push({ image: image?.index, graph: msg.graph, what: 'create', ms: t3 - t2, deviceMs: t1 - t0, rssMB: rss / 2 ** 20 });
      log(`  ${msg.graph}: device ${(t1 - t0).toFixed(0)} ms, session create ${(t3 - t2).toFixed(0)} ms, rss ${(rss / 2 ** 30).toFixed(2)} GiB`);
      return { ok: true, inputs: s.inputs, outputs: s.outputs };
    }
    case 'run': {
      const s = open.get(msg.graph);
      const feeds = {};
      let at = 0;
      for (const f of msg.feeds) {
        feeds[f.name] = toTensor(f.dtype, f.dims, payload.subarray(at, at + f.bytes));
        at += f.bytes;
      }
      const t0 = now();
      const results = await s.session.run(feeds, msg.fetches);
      const t1 = now();
      const outputs = [];
      const parts = [];
      let finite = true;
      for (const name of msg.fetches) {
        const t = results[name];
        const b = tensorBytes(t);
        if (t.type === 'float32') for (const v of t.data) if (!Number.isFinite(v)) { finite = false; break; }
        outputs.push({ name, dtype: t.type, dims: t.dims, bytes: b.length });
        parts.push(b);
      }
      for (const t of Object.values(feeds)) t.dispose?.();
      const rec = image?.stages.findLast((r) => r.graph === msg.graph);
      rec?.runMs.push(t1 - t0);
      events.push({ image: image?.index, graph: msg.graph, what: 'run', ms: t1 - t0, finite });
      log(`  ${msg.graph}: run ${(t1 - t0).toFixed(0)} ms${finite ? '' : ' (NOT FINITE)'}`);
      return [{ ok: true, outputs }, parts];
    }
    case 'close': {
      const s = open.get(msg.graph);
      open.delete(msg.graph);
      if (msg.keep) {
        kept.set(msg.graph, s);
        return { ok: true };
      }
      const t0 = now();
      await s.session.release();
      s.device?.destroy();
      const t1 = now();
      const rec = image?.stages.findLast((r) => r.graph === msg.graph);
      if (rec) rec.releaseMs = t1 - t0;
      events.push({ image: image?.index, graph: msg.graph, what: 'release', ms: t1 - t0 });
      return { ok: true };
    }
    case 'mark': {
      if (msg.what === 'image-start') {
        image = { index: msg.image, plan: msg.plan, started: now(), stages: [] };
        log(`image ${msg.image} (kept loaded after it: ${msg.plan})`);
      } else {
        image.wallMs = now() - image.started;
        image.core = { totalMs: msg.core_total_ms, waitingMs: msg.core_waiting_ms, pngBytes: msg.png_bytes, finite: msg.finite };
        images.push(image);
        log(`  image ${msg.image}: ${(image.wallMs / 1000).toFixed(2)} s wall, finite ${msg.finite}`);
        image = null;
      }
      return { ok: true };
    }
    default:
      throw new Error(`unknown op ${msg.op}`);
  }
}

function frame(header, parts = []) {
  const bytes = parts.reduce((n, p) => n + p.length, 0);
  const text = Buffer.from(JSON.stringify({ ...header, bytes }));
  const len = Buffer.alloc(4);
  len.writeUInt32LE(text.length);
  return [len, text, ...parts];
}

async function serve(child) {
  let buf = Buffer.alloc(0);
  const chunks = [];
  let queued = 0; // bytes in chunks
  let wake = null;
  let ended = false;
  child.stdout.on('data', (c) => { chunks.push(c); queued += c.length; wake?.(); });
  child.stdout.on('end', () => { ended = true; wake?.(); });
  // Waits until n bytes are there, then joins them once (not once per chunk: a step's feeds are 16 MB).
  const need = async (n) => {
    while (buf.length + queued < n) {
      if (ended) throw new Error('the core ended the bridge early');
      await new Promise((r) => { wake = r; });
      wake = null;
    }
    if (buf.length < n) {
      buf = Buffer.concat([buf, ...chunks.splice(0)]);
      queued = 0;
    }
  };
  const take = (n) => { const out = buf.subarray(0, n); buf = buf.subarray(n); return out; };
  const write = (parts) => new Promise((res, rej) => {
    const data = Buffer.concat(parts);
    child.stdin.write(data, (e) => (e ? rej(e) : res()));
  });
  for (;;) {
    await need(4);
    const n = take(4).readUInt32LE(0);
    await need(n);
    const msg = JSON.parse(take(n).toString());
    if (msg.op === 'done') return;
    const size = msg.bytes ?? 0;
    await need(size);
    const payload = Buffer.from(take(size));
    let reply;
    try {
      reply = await handle(msg, payload);
    } catch (e) {
      log(`  ${msg.op} ${msg.graph ?? ''} failed: ${e?.stack ?? e}`);
      reply = { ok: false, error: String(e?.message ?? e) };
    }
    const [header, parts] = Array.isArray(reply) ? reply : [reply, []];
    await write(frame(header, parts));
  }
}

const request = {
  prompt: args.prompt, width: Number(args.size), height: Number(args.size), steps: Number(args.steps),
  seed: String(args.seed), schedule: 'empirical', trace: false, backend: args.ep,
};
const started = now();
const child = spawn(path.resolve(args.bridge), [
  '--pack', args.pack, '--tokenizer-dir', args.tokenizerDir, '--request', JSON.stringify(request),
  '--plan', args.plan, '--out', args.out,
], { stdio: ['pipe', 'pipe', 'inherit'] });
const exited = new Promise((res) => child.on('exit', (code) => res(code)));
await serve(child);
const code = await exited;
const totalMs = now() - started;

// ---------------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------------

const sum = (xs) => xs.reduce((a, b) => a + b, 0);
const rows = [];
for (const im of images) {
  const per = {};
  for (const st of im.stages) {
    per[st.graph] = {
      reused: st.reused, deviceS: st.deviceMs / 1e3, createS: st.createMs / 1e3,
      runS: sum(st.runMs) / 1e3, runsS: st.runMs.map((x) => x / 1e3), releaseS: (st.releaseMs ?? 0) / 1e3,
    };
  }
  const create = sum(im.stages.map((s) => s.createMs + s.deviceMs)) / 1e3;
  const run = sum(im.stages.map((s) => sum(s.runMs))) / 1e3;
  rows.push({ image: im.index, plan: im.plan, wallS: im.wallMs / 1e3, createS: create, runS: run, stages: per, core: im.core });
}
const result = {
  date: new Date().toISOString(), node: process.version, ort: ortVersion, build: args.build, bundle, ep: args.ep,
  dawn: args.ep === 'webgpu' ? (args.dawnLabel ?? args.dawn) : null,
  adapter: adapterReport, request, plan: args.plan, bridgeExit: code, totalS: totalMs / 1e3, images: rows, events,
};
fs.writeFileSync(path.join(args.out, 'bench.json'), JSON.stringify(result, null, 2));

const short = { 'text_encoder_q4.onnx': 'text encoder', 'transformer_q8.onnx': 'transformer', 'vae_decoder.onnx': 'VAE decoder' };
log('\nimage  kept-after   stage          device s  create s  run s (per call)                     release s');
for (const r of rows) {
  for (const [g, s] of Object.entries(r.stages)) {
    log(`${String(r.image).padStart(5)}  ${r.plan.padEnd(11)}  ${short[g].padEnd(13)}  ${s.reused ? '  (kept)' : s.deviceS.toFixed(3).padStart(8)}  ${s.reused ? '  (kept)' : s.createS.toFixed(2).padStart(8)}  ${s.runS.toFixed(2).padStart(5)} (${s.runsS.map((x) => x.toFixed(2)).join(', ')})`.padEnd(96) + `${s.releaseS.toFixed(2)}`);
  }
  log(`${String(r.image).padStart(5)}  image wall ${r.wallS.toFixed(2)} s = device+create ${r.createS.toFixed(2)} s + run ${r.runS.toFixed(2)} s + other ${(r.wallS - r.createS - r.runS).toFixed(2)} s; core ${(r.core.totalMs / 1e3).toFixed(2)} s, finite ${r.core.finite}`);
}
log(`bridge exit ${code}; total ${(totalMs / 1e3).toFixed(1)} s`);
process.exit(code === 0 ? 0 : 1);
