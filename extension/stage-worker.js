// Stage worker entry: ORT ships inside the extension and is exposed to the Rust bindings as globalThis.ort.
import * as ort from './ort/ort.jspi.bundle.min.mjs';
import init, { stageWorkerMain } from './pkg/imagine_web.js';

globalThis.ort = ort;
// Messages that arrive before the wasm module is ready are queued, then replayed.
const early = [];
self.onmessage = (event) => early.push(event);
// `?ort-wasm=bytes` (stages loaded one at a time): ORT gets its wasm as bytes, not as a URL to compile
// while it streams, where Chromium's code cache had V8 optimize ORT's static constructors (958 kB of
// wasm, run once), holding 0.25-0.8 GB of the renderer for seconds. Stages loaded at once keep the URL
// and the cache's optimized code (stage_run.rs, `stage_worker_script`).
const asBytes = new URL(import.meta.url).searchParams.get('ort-wasm') === 'bytes';
const ortWasm = asBytes
  ? fetch(new URL('./ort/ort-wasm-simd-threaded.jspi.wasm', import.meta.url))
    .then((response) => response.arrayBuffer())
    .then((bytes) => { ort.env.wasm.wasmBinary = bytes; })
  : null;
Promise.all([ortWasm, init({ module_or_path: new URL('./pkg/imagine_web_bg.wasm', import.meta.url) })]).then(() => {
  stageWorkerMain();
  for (const event of early) self.onmessage(event);
}, (e) => self.postMessage({ kind: 'error', error: `the stage worker could not start: ${e}` }));
