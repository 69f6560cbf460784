// `cargo xtask bench ort-wasm`: what a stage worker's ORT gains from compiling its wasm from its URL
// (Chromium's code cache) rather than from bytes (BENCHMARKS.md, "How a stage worker's ORT gets its
// wasm, and the renderer's mapped memory"). The fixture pack, every stage loaded afresh for each image
// (`keepLoaded` 0, stages at once): --images cold images with the extension as built, whose stage workers
// then compile ORT from its URL, and as many with a copy of it (target/dist-ort-bytes/) whose stage
// workers always hand ORT the bytes. Printed: each image's wall time and each stage's session creation,
// and the ratio of the medians after the first image (the first fills the code cache).
//
//   node tests/e2e/bench/ort-wasm.mjs [--images 5]
//
// As users run Chromium: V8's optimizing tier on (IMAGINE_TEST_FLAGS is cleared).

import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';

delete process.env.IMAGINE_TEST_FLAGS;
const h = await import('../lib/harness.mjs');
const { values: o } = parseArgs({ options: { images: { type: 'string', default: '5' } } });
const IMAGES = Number(o.images);
if (!(IMAGES >= 2)) throw new Error(`--images ${o.images}: at least 2`);

/** A copy of dist/ whose stage workers always hand ORT its wasm as bytes. */
function bytesDist() {
  const dir = path.join(h.ROOT, 'target/dist-ort-bytes');
  fs.rmSync(dir, { recursive: true, force: true });
  fs.cpSync(h.DIST, dir, { recursive: true });
  const shim = path.join(dir, 'stage-worker.js');
  const text = fs.readFileSync(shim, 'utf8');
  const forced = text.replace(/const asBytes = [^;]+;/, 'const asBytes = true;');
  if (forced === text) throw new Error(`${shim}: no \`const asBytes = ...;\` to force`);
  fs.writeFileSync(shim, forced);
  return dir;
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const STAGES = ['textEncoder', 'transformer', 'decoder'];

async function measure(label, extDir) {
  const hub = await h.startHub({ repos: ['f32'] });
  const b = await h.launch({ extDir });
  const rows = [];
  try {
    await h.collectEvents(b.page);
    await h.installPack(b.page, hub, 'fixtures/f32');
    await h.api(b.page, { type: 'keepLoaded', seconds: 0 });
    for (let i = 0; i < IMAGES; i++) {
      const t0 = Date.now();
      const { result } = await h.generateOk(b.page, { prompt: `a red fox, take ${i}`, width: 256, height: 256, steps: 2, seed: String(i) }, 300_000);
      const wall = Date.now() - t0;
      const stages = Object.fromEntries(result.timings.stages.map((s) => [s.stage, s]));
      const bytes = STAGES.map((s) => stages[s].ortWasmAsBytes ?? false);
      rows.push({ wall, create: STAGES.map((s) => stages[s].sessionCreateMs) });
      console.log(`${label} image ${i + 1}: ${(wall / 1000).toFixed(1)} s; session created (ms) ${STAGES.map((s, j) => `${s} ${Math.round(rows.at(-1).create[j])}`).join(', ')}; ORT's wasm as bytes: ${bytes.join('/')}`);
      await h.sleep(1000);
    }
  } finally {
    await b.close();
    await hub.close();
  }
  const later = rows.slice(1);
  return { wall: median(later.map((r) => r.wall)), create: STAGES.map((_, j) => median(later.map((r) => r.create[j]))) };
}

const url = await measure('from its URL', h.DIST);
const bytes = await measure('as bytes', bytesDist());
console.log(`\nmedians of images 2-${IMAGES}: wall ${(url.wall / 1000).toFixed(1)} s from its URL, ${(bytes.wall / 1000).toFixed(1)} s as bytes (${(bytes.wall / url.wall).toFixed(2)}x)`);
for (const [j, s] of STAGES.entries()) {
  console.log(`  ${s} session created: ${Math.round(url.create[j])} ms from its URL, ${Math.round(bytes.create[j])} ms as bytes (${(bytes.create[j] / url.create[j]).toFixed(2)}x)`);
}
