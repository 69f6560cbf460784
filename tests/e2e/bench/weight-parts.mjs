// `cargo xtask bench weight-parts`: what the transformer's weights, at their real sizes, cost the
// extension's renderer while they load one stage at a time, in two builds of the extension (the one in
// dist/ and another, e.g. before a change to how weights load), on this machine's SwiftShader.
//
//   node tests/e2e/bench/weight-parts.mjs --other DIR [--label-other NAME] [--runs 2] [--watch-s 150]
//
// The pack: the tiny real-architecture float32 pack with its transformer exported at its real width,
// one block of each kind (tools/export/models.py, `wide`: int8 MatMulNBits of 9 to 81 MiB, float
// modulations of 226 MB), made once per checkout into target/tiny-packs/f32-wide-transformer. Each run:
// a fresh browser installs it, then a 256x256 image of 1 step with every stage loaded one at a time
// (`loadAhead: false`, the plan of a small budget), cancelled after --watch-s (150: the transformer's
// session made, its step running; the step alone takes SwiftShader minutes). Printed per build: the
// extension renderer's peak above idle of its shared memory (Chromium's staging buffers for uploads and
// read backs), of its anonymous memory (heaps: JavaScript, wasm) and of both, from /proc every 100 ms,
// and when the shared memory peaked.

import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from '../lib/harness.mjs';
import { startSampler } from '../lib/proc-memory.mjs';
import { PYTHON, tinyPack } from '../lib/tiny-packs.mjs';

const { values: o } = parseArgs({
  options: {
    other: { type: 'string' },
    'label-other': { type: 'string', default: 'other' },
    runs: { type: 'string', default: '2' },
    'watch-s': { type: 'string', default: '150' },
  },
});
if (!o.other) throw new Error('--other DIR: the other unpacked build to measure beside dist/');
const MB = 1e6;
const WATCH_MS = Number(o['watch-s']) * 1000;
const REQUEST = { prompt: 'a lighthouse at dusk', width: 256, height: 256, steps: 1, seed: '1', loadAhead: false };

/** The tiny float32 pack with the transformer at its real width in place of its own, made once. */
async function withWideTransformer(tiny) {
  const dir = path.join(h.ROOT, 'target/tiny-packs/f32-wide-transformer');
  if (fs.existsSync(path.join(dir, 'transformer_q8.export.json'))) return dir;
  const partial = `${dir}.partial-${process.pid}`;
  fs.rmSync(partial, { recursive: true, force: true });
  fs.cpSync(tiny, partial, { recursive: true });
  for (const f of fs.readdirSync(partial).filter((f) => f.startsWith('transformer_q8'))) fs.rmSync(path.join(partial, f));
  const args = ['tools/gpu-bench/export_stage.py', '--stem', 'transformer_q8', '--config', 'wide', '--activations', 'float32', '--out', partial, '--threads', '2'];
  const r = await h.run(PYTHON, args);
  if (r.code !== 0) throw new Error(`export_stage.py failed (${r.code}):\n${r.stdout}\n${r.stderr}`);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.renameSync(partial, dir);
  return dir;
}

/** One image in a fresh browser of `extDir`, cancelled after `--watch-s`: the renderer's peaks above idle. */
async function measure(hub, extDir) {
  const b = await h.launch({ extDir });
  try {
    await h.installPack(b.page, hub, 'tiny/wide-transformer');
    const sampler = startSampler(b.profileDir, 100);
    try {
      await h.sleep(2000);
      const t0 = Date.now();
      await h.collectEvents(b.page);
      const reply = await h.api(b.page, { type: 'generate', ...REQUEST });
      if (reply?.type !== 'jobStarted') throw new Error(`the image did not start: ${JSON.stringify(reply)}`);
      await h.sleep(WATCH_MS);
      await h.api(b.page, { type: 'cancel', job: reply.job });
      const samples = sampler.history.map((s) => ({ t: s.t, ...(s.parts.extension ?? { anon: 0, shmem: 0 }) }));
      const idle = samples.filter((s) => s.t < t0).at(-1) ?? samples[0];
      const after = samples.filter((s) => s.t >= t0);
      const peak = (f) => Math.max(...after.map(f)) - f(idle);
      const top = after.reduce((a, x) => (x.shmem > a.shmem ? x : a), after[0]);
      return { shmem: peak((s) => s.shmem), anon: peak((s) => s.anon), both: peak((s) => s.shmem + s.anon), shmemPeakS: (top.t - t0) / 1000 };
    } finally {
      await sampler.stop();
    }
  } finally {
    await b.close();
  }
}

const dir = await withWideTransformer(await tinyPack('float32'));
const hub = await h.startHub({ repos: { 'tiny/wide-transformer': { dir } } });
const builds = [['dist/', h.DIST], [o['label-other'], path.resolve(o.other)]];
const rows = [];
try {
  for (let run = 1; run <= Number(o.runs); run++) {
    // In turn, so that the machine's load falls on both alike.
    for (const [label, extDir] of run % 2 ? builds : [...builds].reverse()) {
      const m = await measure(hub, extDir);
      rows.push({ label, run, ...m });
      console.log(`bench: ${label}, run ${run}: shared ${(m.shmem / MB).toFixed(0)} MB, anonymous ${(m.anon / MB).toFixed(0)} MB, both ${(m.both / MB).toFixed(0)} MB above idle; shared memory's peak at ${m.shmemPeakS.toFixed(0)} s`);
    }
  }
} finally {
  await hub.close();
}
console.log(`\nthe extension renderer, peak above idle in the first ${o['watch-s']} s of the image (MB)`);
h.printTable(['build', 'run', 'shared memory', 'anonymous', 'both', 'shared memory\'s peak at s'],
  rows.map((r) => [r.label, r.run, (r.shmem / MB).toFixed(0), (r.anon / MB).toFixed(0), (r.both / MB).toFixed(0), r.shmemPeakS.toFixed(0)]));
