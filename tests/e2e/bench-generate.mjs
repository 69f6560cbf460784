// `cargo xtask bench generate`: time generations on the f32 fixture pack.
//
//   node tests/e2e/bench-generate.mjs [--runs 3] [--size 512] [--steps 4] [--pack f32] [--backend webgpu]
//
// For each run: wall time (request sent -> result event), and, when the result carries
// `timings: { sessionCreateMs, runMs, totalMs }`, the time inside ORT (session creation + runs) and
// its share of the wall time.

import { parseArgs } from 'node:util';
import * as h from './harness.mjs';

const { values: o } = parseArgs({
  options: {
    runs: { type: 'string', default: '3' },
    size: { type: 'string', default: '512' },
    steps: { type: 'string', default: '4' },
    pack: { type: 'string', default: 'f32' },
    backend: { type: 'string' },
  },
});
const runs = Number(o.runs);
const size = Number(o.size);
const steps = Number(o.steps);

const server = await h.startHub({ repos: [o.pack] });
const b = await h.launch();
const rows = [];
try {
  console.log(`bench: installing fixture pack ${o.pack} from the fake Hub at ${server.url}`);
  await h.installPack(b.page, server, `fixtures/${o.pack}`, { backend: o.pack === 'f16' ? 'wasm' : undefined });
  for (let i = 1; i <= runs; i++) {
    const req = { prompt: 'a red fox in the snow', width: size, height: size, steps, seed: String(i), trace: false };
    if (o.backend) req.backend = o.backend;
    const r = await h.generateOk(b.page, req, 3600_000);
    const t = r.result.timings ?? null;
    rows.push({ run: String(i), wall: r.wallMs, create: t?.sessionCreateMs, runMs: t?.runMs, total: t?.totalMs });
    console.log(`bench: run ${i}: ${(r.wallMs / 1000).toFixed(2)} s`);
  }
} finally {
  await b.close();
  await server.close();
}

const sum = (k) => (rows.every((r) => typeof r[k] === 'number') ? rows.reduce((n, r) => n + r[k], 0) : undefined);
rows.push({ run: 'total', wall: sum('wall'), create: sum('create'), runMs: sum('runMs'), total: sum('total') });

const ms = (v) => (typeof v === 'number' ? v.toFixed(0) : '-');
const cols = ['run', 'wall ms', 'session create ms', 'ort run ms', 'ort ms', 'ext total ms', 'ort/wall'];
const table = rows.map((r) => {
  const ort = typeof r.create === 'number' && typeof r.runMs === 'number' ? r.create + r.runMs : undefined;
  return [
    r.run,
    ms(r.wall),
    ms(r.create),
    ms(r.runMs),
    ms(ort),
    ms(r.total),
    ort !== undefined && r.wall ? `${((100 * ort) / r.wall).toFixed(1)}%` : '-',
  ];
});
const widths = cols.map((c, i) => Math.max(c.length, ...table.map((row) => row[i].length)));
const line = (cells) => cells.map((c, i) => c.padStart(widths[i])).join('  ');
console.log(`\nbench generate: ${size}x${size}, ${steps} steps, pack ${o.pack}, ${runs} runs`);
console.log(line(cols));
console.log(widths.map((w) => '-'.repeat(w)).join('  '));
for (const row of table) console.log(line(row));
if (rows.some((r) => r.run !== 'total' && r.create === undefined)) {
  console.log('(the result carries no `timings`: only wall time is known)');
}
