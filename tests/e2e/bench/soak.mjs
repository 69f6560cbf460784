// `cargo xtask bench soak`: many generations in one browser, two fixture packs installed in turn, to
// see whether a stage worker ever stops. Written to decide whether ORT's JSPI build could replace the
// asyncify build (BENCHMARKS.md, "JSPI").
//
//   node tests/e2e/bench/soak.mjs [--runs 12] [--ort jspi|asyncify] [--ort-dist DIR] [--timeout-s 120]
//
// `--ort asyncify`, or `--ort-dist` (another onnxruntime-web build's dist/), runs a copy of dist/
// (target/dist-soak/) whose stage workers import that bundle instead of the one shipped.

import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from '../lib/harness.mjs';

const ORT_DIST = path.join(h.ROOT, 'node_modules/onnxruntime-web/dist');
const { values: o } = parseArgs({
  options: {
    runs: { type: 'string', default: '12' },
    ort: { type: 'string', default: 'jspi' },
    'ort-dist': { type: 'string', default: ORT_DIST },
    'timeout-s': { type: 'string', default: '120' },
  },
});
const BUNDLES = { asyncify: ['ort.webgpu.bundle.min.mjs', 'ort-wasm-simd-threaded.asyncify.wasm'], jspi: ['ort.jspi.bundle.min.mjs', 'ort-wasm-simd-threaded.jspi.wasm'] };
if (!BUNDLES[o.ort]) throw new Error(`--ort: ${o.ort} (allowed: asyncify, jspi)`);

/** dist/, or a copy of it whose stage workers load the chosen bundle. */
function extensionDir() {
  const shim = path.join(h.DIST, 'stage-worker.js');
  const imports = fs.readFileSync(shim, 'utf8');
  const shipped = Object.keys(BUNDLES).find((k) => imports.includes(`./ort/${BUNDLES[k][0]}`));
  if (!shipped) throw new Error(`${shim} imports none of ${Object.values(BUNDLES).map((b) => b[0]).join(', ')}`);
  if (o.ort === shipped && path.resolve(o['ort-dist']) === ORT_DIST) return h.DIST;
  const dir = path.join(h.ROOT, 'target/dist-soak');
  fs.rmSync(dir, { recursive: true, force: true });
  fs.cpSync(h.DIST, dir, { recursive: true });
  for (const f of BUNDLES[o.ort]) fs.copyFileSync(path.join(o['ort-dist'], f), path.join(dir, 'ort', f));
  const copy = path.join(dir, 'stage-worker.js');
  fs.writeFileSync(copy, fs.readFileSync(copy, 'utf8').replace(BUNDLES[shipped][0], BUNDLES[o.ort][0]));
  return dir;
}

const b = await h.launch({ extDir: extensionDir() });
const hub = await h.startHub({ repos: ['f32', 'f32-vae32'] });
const runs = Number(o.runs);
const t0 = Date.now();
const at = () => `${((Date.now() - t0) / 1000).toFixed(1)} s`;
let finished = 0;
try {
  for (let i = 0; i < runs; i++) {
    const repo = i % 2 ? 'fixtures/f32-vae32' : 'fixtures/f32';
    await h.installPack(b.page, hub, repo);
    try {
      await h.generateOk(b.page, { prompt: `a red fox, take ${i}`, width: 256, height: 256, steps: 2, seed: String(i) }, Number(o['timeout-s']) * 1000);
      finished++;
      console.log(`${at()}: generation ${i + 1} of ${runs} (${repo}): finished`);
    } catch (e) {
      console.log(`${at()}: generation ${i + 1} of ${runs} (${repo}): ${e.message}`);
      break;
    }
  }
} finally {
  await b.close();
  await hub.close();
}
console.log(`\nbench soak --ort ${o.ort}: ${finished} of ${runs} generations finished in one browser`);
