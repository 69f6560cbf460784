// `cargo xtask bench loading`: what a stage's weights cost the extension's renderer while they load, in
// Chromium (SwiftShader) and in Firefox ESR (lavapipe). Both run the stage workers on ORT's JSPI build,
// which reads the weights from OPFS one initializer at a time (`ChunkedBlob`) rather than whole.
//
//   node tests/e2e/bench/loading.mjs [--watch-ms 12000]
//
// Two packs: the tiny real-architecture float16 pack (tests/e2e/lib/tiny-packs.mjs), and the same pack
// with the full-size VAE decoder (198 MB of float32 weights, exported once by
// tools/gpu-bench/export_stage.py into target/tiny-packs/f16-full-decoder). For each browser and pack:
// a fresh browser installs it, then an image is asked for with no GPU memory limit (every stage loads at
// once) and cancelled after --watch-ms. Printed: the anonymous memory (heaps: JavaScript, wasm) of the
// process the stage workers run in, idle and its peak above idle, and per browser the difference the
// full-size decoder made, against its weights' size: streamed, the difference stays far below it.

import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from '../lib/harness.mjs';
import { chromiumLoadingPeak, firefoxLoadingPeak, withFullDecoder } from '../lib/loading-memory.mjs';
import { tinyPack } from '../lib/tiny-packs.mjs';

const { values: o } = parseArgs({ options: { 'watch-ms': { type: 'string', default: '12000' } } });
const WATCH_MS = Number(o['watch-ms']);
const MB = 1e6;

const tiny = await tinyPack('float16');
const full = await withFullDecoder(tiny);
const decoderBytes = fs.statSync(path.join(full, 'vae_decoder.onnx.data')).size;
const hub = await h.startHub({ repos: { 'tiny/float16': { dir: tiny }, 'tiny/float16-full-decoder': { dir: full } } });
const rows = [];
try {
  for (const [browser, measure] of [['Chromium (SwiftShader)', chromiumLoadingPeak], ['Firefox (lavapipe)', firefoxLoadingPeak]]) {
    for (const [pack, repo] of [['tiny', 'tiny/float16'], ['tiny, full-size decoder', 'tiny/float16-full-decoder']]) {
      const m = await measure(hub, repo, WATCH_MS);
      rows.push({ browser, pack, ...m });
      console.log(`bench: ${browser}, ${pack}: idle ${(m.idle / MB).toFixed(0)} MB, peak above idle ${(m.above / MB).toFixed(0)} MB`);
    }
  }
} finally {
  await hub.close();
}
console.log(`\nthe stage workers' process while every stage loads (anonymous memory, MB; the full-size decoder's weights: ${(decoderBytes / MB).toFixed(0)} MB)`);
h.printTable(['browser', 'pack', 'idle', 'peak above idle'], rows.map((r) => [r.browser, r.pack, (r.idle / MB).toFixed(0), (r.above / MB).toFixed(0)]));
console.log('\nwhat the full-size decoder added to the peak, against its weights');
h.printTable(['browser', 'added MB', 'added / weights'], ['Chromium (SwiftShader)', 'Firefox (lavapipe)'].map((browser) => {
  const [a, b] = rows.filter((r) => r.browser === browser);
  return [browser, ((b.above - a.above) / MB).toFixed(0), ((b.above - a.above) / decoderBytes).toFixed(2)];
}));
