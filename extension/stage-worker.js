// Stage worker entry: ORT ships inside the extension and is exposed to the Rust bindings as globalThis.ort.
import * as ort from './ort/ort.jspi.bundle.min.mjs';
import init, { stageWorkerMain } from './pkg/imagine_web.js';

globalThis.ort = ort;
// Messages that arrive before the wasm module is ready are queued, then replayed.
const early = [];
self.onmessage = (event) => early.push(event);
// ORT gets its wasm as bytes, not as a URL to compile while it streams: streamed, the third stage
// worker's compile had V8 optimize ORT's static constructors (958 kB of wasm, run once), which held
// 0.25-0.8 GB of the renderer for seconds during the decoder's stage (BENCHMARKS.md, "The decoder's rise
// in the renderer").
const ortWasm = fetch(new URL('./ort/ort-wasm-simd-threaded.jspi.wasm', import.meta.url))
  .then((response) => response.arrayBuffer())
  .then((bytes) => { ort.env.wasm.wasmBinary = bytes; });
Promise.all([ortWasm, init({ module_or_path: new URL('./pkg/imagine_web_bg.wasm', import.meta.url) })]).then(() => {
  stageWorkerMain();
  for (const event of early) self.onmessage(event);
}, (e) => self.postMessage({ kind: 'error', error: `the stage worker could not start: ${e}` }));
