// Hash worker entry (started by the offscreen document beside the download worker). Messages that
// arrive before the wasm module is ready are queued, then replayed.
import init, { hashWorkerMain } from './pkg/imagine_web.js';

const early = [];
self.onmessage = (event) => early.push(event);
init({ module_or_path: new URL('./pkg/imagine_web_bg.wasm', import.meta.url) }).then(() => {
  hashWorkerMain();
  for (const event of early) self.onmessage(event);
}, (e) => self.postMessage({ op: 'error', error: `the hash worker could not start: ${e}` }));
