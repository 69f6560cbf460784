// Download worker entry (started by the offscreen document): streams the pack into OPFS. It never runs
// a model, so it does not load ONNX Runtime. Messages that arrive before the wasm module is ready are
// queued, then replayed.
import init, { downloadWorkerMain } from './pkg/imagine_web.js';

const early = [];
self.onmessage = (event) => early.push(event);
init({ module_or_path: new URL('./pkg/imagine_web_bg.wasm', import.meta.url) }).then(() => {
  downloadWorkerMain();
  for (const event of early) self.onmessage(event);
}, (e) => self.postMessage({ kind: 'error', error: `the download worker could not start: ${e}` }));
