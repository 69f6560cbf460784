// Stage worker entry: ORT ships inside the extension and is exposed to the Rust bindings as globalThis.ort.
import * as ort from './ort/ort.jspi.bundle.min.mjs';
import init, { stageWorkerMain } from './pkg/imagine_web.js';

globalThis.ort = ort;
// Messages that arrive before the wasm module is ready are queued, then replayed.
const early = [];
self.onmessage = (event) => early.push(event);
init({ module_or_path: new URL('./pkg/imagine_web_bg.wasm', import.meta.url) }).then(() => {
  stageWorkerMain();
  for (const event of early) self.onmessage(event);
}, (e) => self.postMessage({ kind: 'error', error: `the stage worker could not start: ${e}` }));
