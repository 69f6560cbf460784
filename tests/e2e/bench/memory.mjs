// `cargo xtask bench memory`: what each GPU memory plan holds. Each plan makes the same cold image in a
// browser of its own, after the pack is installed; printed per plan: the peak above idle of the GPU
// process (SwiftShader keeps "GPU" buffers there, so on this machine it stands for the GPU's memory) and
// of the extension's renderer, the GPU's memory in use where `nvidia-smi` answers, the wall time and its
// ratio to the first plan's, and the largest channel difference from the first plan's image.
//
//   node tests/e2e/bench/memory.mjs [--size 384] [--steps 2] [--pack tiny-f32|f32] [--pack-dir DIR]
//        [--piece-mb 16] [--plans unlimited,lean,split] [--out FILE]
//   node tests/e2e/bench/memory.mjs --free-gb 8,6,4 --pack-dir DIR [--sizes 512,768x1024,1024x768,1024]
//        [--small-sizes 512,1024] [--grow 8:3] [--also 'SIZE=JSON;...'] [--steps 4] [--browser-args "..."] [--dumps] [--out FILE]
//
// Plans (the image is always the same prompt and seed):
//   unlimited  no budget: every stage loads at once and stays loaded (what a large GPU gets);
//   lean       a 1 GB budget, which no stage fits: one stage at a time, nothing kept;
//   split      lean, and the decoder run as a chain of pieces of at most --piece-mb (counted) MB.
// --pack tiny-f32 is the tiny real-architecture pack (tools/export, made by `cargo xtask test`); f32
// the fixture pack; --pack-dir an exported pack on disk (the full-size one on the GPU machine).
//
// With --free-gb (the GPU machine, IMAGINE_WEBGPU=vulkan): the GPU made small for real. The pack is
// installed once; each size is made with no limit first (the reference images); then for each N,
// `tools/gpu-bench/ballast.py` holds all but N GB of the GPU (torch), the same browser profile is
// opened again, the budget measured again (`gpuMemory` with `measure`, as at a first run) and every
// size made with the budget the probe found: done or failed (with its message), the GPU's peak above
// the ballast (`nvidia-smi`), the time and its ratio to the reference, and the largest difference from
// the reference image (at most 2 levels expected). --browser-args (e.g.
// "--enable-dawn-features=vulkan_enable_f16_on_nvidia") picks the float16 path.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from '../lib/harness.mjs';
import { peakBetween, medianBetween, startSampler } from '../lib/proc-memory.mjs';
import { tinyPack } from '../lib/tiny-packs.mjs';

const { values: o } = parseArgs({
  options: {
    size: { type: 'string', default: '384' },
    steps: { type: 'string', default: '2' },
    pack: { type: 'string', default: 'tiny-f32' },
    'piece-mb': { type: 'string', default: '16' },
    'pack-dir': { type: 'string' },
    'free-gb': { type: 'string' },
    sizes: { type: 'string', default: '512,768x1024,1024x768,1024' },
    'small-sizes': { type: 'string', default: '512,1024' },
    grow: { type: 'string' },
    also: { type: 'string' },
    'browser-args': { type: 'string', default: '' },
    dumps: { type: 'boolean', default: false },
    plans: { type: 'string', default: 'unlimited,lean,split' },
    out: { type: 'string' },
  },
});
const size = Number(o.size);
const REQUEST = { prompt: 'a lighthouse in a storm', width: size, height: size, steps: Number(o.steps), seed: '7' };
const PLANS = {
  unlimited: { budget: null, request: {} },
  lean: { budget: 1e9, request: {} },
  split: { budget: 1e9, request: { decoderPieceBytes: Number(o['piece-mb']) * 1e6 } },
};
const MB = 2 ** 20;
const gb = (bytes) => (bytes / 1e9).toFixed(1);
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-memory-'));

/** The GPU's memory in use (bytes) every 200 ms while it runs, where nvidia-smi answers; else []. */
function sampleGpu() {
  const samples = [];
  let child;
  child = spawn('nvidia-smi', ['--query-gpu=memory.used', '--format=csv,noheader,nounits', '-lms=200'], { stdio: ['ignore', 'pipe', 'ignore'] });
  // No nvidia-smi here: no samples.
  child.on('error', () => {});
  child.stdout.on('data', (d) => String(d).split('\n').filter(Boolean).forEach((l) => samples.push({ t: Date.now(), bytes: Number(l) * MB })));
  return { samples, stop: () => child.kill() };
}

async function packSource() {
  if (o['pack-dir']) return { repoDir: o['pack-dir'], repo: 'bench/pack' };
  return { repoDir: o.pack === 'tiny-f32' ? await tinyPack('float32') : h.fixtureDir(o.pack), repo: `bench/${o.pack}` };
}

async function measure(name) {
  const plan = PLANS[name];
  const { repoDir, repo } = await packSource();
  const b = await h.setup({ after: () => {} }, { pack: null, install: false, hubOptions: { repos: { [repo]: { dir: repoDir } } } });
  try {
    await h.installPack(b.page, b.hub, repo);
    if (plan.budget) await h.api(b.page, { type: 'gpuMemory', setting: { mode: 'set', bytes: plan.budget } });
    const sampler = startSampler(b.profileDir, 100);
    const gpu = sampleGpu();
    await h.sleep(2000);
    const idleTo = Date.now();
    const idle = medianBetween(sampler.history, idleTo - 2000, idleTo);
    const gpuIdle = Math.min(...gpu.samples.map((s) => s.bytes), Infinity);
    const { result, wallMs } = await h.generateOk(b.page, { ...REQUEST, ...plan.request }, 3_600_000);
    const end = Date.now();
    await sampler.stop();
    gpu.stop();
    const { peak } = peakBetween(sampler.history, idleTo, end);
    const gpuPeak = Math.max(...gpu.samples.filter((s) => s.t >= idleTo).map((s) => s.bytes), -Infinity);
    const png = path.join(dir, `${name}.png`);
    fs.writeFileSync(png, h.pngBytes(result));
    return {
      plan: name,
      memory: result.timings.memory,
      budget: result.timings.budget ?? null,
      pieces: result.timings.stages.find((s) => s.stage === 'decoder')?.pieces,
      wallMs,
      gpuProcessAboveIdle: (peak.gpu ?? 0) - (idle.gpu ?? 0),
      rendererAboveIdle: (peak.extension ?? 0) - (idle.extension ?? 0),
      gpuMemoryAboveIdle: Number.isFinite(gpuPeak) && Number.isFinite(gpuIdle) ? gpuPeak - gpuIdle : null,
      png,
    };
  } finally {
    await b.close();
    await b.hub?.close();
  }
}

if (o['free-gb']) {
  await smallGpus();
  process.exit(0);
}

/** Starts the ballast holding all but `gb` GB of the GPU; resolves once it holds it. */
function ballast(gb) {
  const child = spawn('python3', ['tools/gpu-bench/ballast.py', '--free-gb', String(gb)], { stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    child.on('exit', (code) => reject(new Error(`ballast exited (${code})`)));
    child.stdout.on('data', (d) => {
      if (String(d).startsWith('ballast: holding')) {
        console.log(String(d).trim());
        resolve(child);
      }
    });
  });
}

/** One image of `size` (`WxH` or `S`) in `b`: its outcome, time, GPU and renderer peaks above the start, PNG. */
async function image(b, size, tag, { during, extra = {} } = {}) {
  const [width, height] = size.includes('x') ? size.split('x').map(Number) : [Number(size), Number(size)];
  // Every image cold, its text encoder included: the prompt's cached embeddings go first.
  await h.opfsRemove(b.page, 'cache/embeddings');
  const gpu = sampleGpu();
  const cpu = startSampler(b.profileDir, 200);
  // The job before this one may have ended only just now: its stage worker's memory goes back to the
  // system over the next second or two, and "above start" must not count from before that.
  await h.sleep(3000);
  const before = Math.min(...gpu.samples.map((x) => x.bytes), Infinity);
  const t0 = Date.now();
  const rendererBefore = medianBetween(cpu.history, t0 - 1000, t0).extension ?? 0;
  const dumps = o.dumps ? h.memoryDumps(b.context) : null;
  await dumps?.start();
  const job = h.generate(b.page, { ...REQUEST, width, height, ...extra }, 1_800_000);
  let ended = false;
  const dumping = (async () => {
    while (dumps && !ended) {
      await dumps.dump();
      await h.sleep(400);
    }
  })();
  const duringOutcome = during ? await during(b) : null;
  const r = await job;
  const tEnd = Date.now();
  ended = true;
  await dumping;
  gpu.stop();
  // What the renderer holds at the end that is garbage: the JavaScript heaps of the extension's main
  // thread (its documents) and service worker, then again after a full collection in each, and the
  // renderer's memory after it.
  const heapsAtEnd = await h.extensionHeaps(b.context);
  const heapsAfterCollection = await h.extensionHeaps(b.context, { collect: true });
  await h.sleep(1500);
  await dumps?.dump();
  await cpu.stop();
  const renderers = extensionRenderers();
  const rendererDumps = (await dumps?.stop())?.filter((d) => renderers.has(d.pid)).map((d) => [d.t - t0, Object.fromEntries(
    Object.entries(d.allocators).filter(([name, bytes]) => bytes >= 8 * MB && name.split('/').length <= 4).map(([name, bytes]) => [name, Math.round(bytes / MB)]))]);
  const peak = Math.max(...gpu.samples.map((x) => x.bytes), -Infinity);
  const rendererPeak = peakBetween(cpu.history, t0, tEnd).peak.extension ?? 0;
  const rendererAfterCollection = (cpu.history.at(-1)?.rss.extension ?? 0) - rendererBefore;
  const png = r.result ? path.join(dir, `${tag}-${size}.png`) : null;
  if (png) fs.writeFileSync(png, h.pngBytes(r.result));
  return {
    size,
    done: !!r.result,
    error: r.result ? null : (r.failed?.error ?? JSON.stringify(r.reply)),
    wallMs: r.wallMs,
    memory: r.result?.timings.memory ?? null,
    budget: r.result?.timings.budget ?? null,
    stages: r.result?.timings.stages?.map(({ stage, startedAtMs, finishedAtMs, sessionCreateMs, resident, pieces, chunkedAttention, partedProjections, chunkedChains, partedGemms, partedMatmuls, uploadedValues }) => ({ stage, startedAtMs, finishedAtMs, sessionCreateMs, resident, pieces, chunkedAttention, partedProjections, chunkedChains, partedGemms, partedMatmuls, uploadedValues })) ?? null,
    gpuAboveStart: Number.isFinite(peak) && Number.isFinite(before) ? peak - before : null,
    rendererAboveStart: rendererPeak - rendererBefore,
    rendererAfterCollection,
    heapsAtEnd,
    heapsAfterCollection,
    // The GPU's and the renderer's use over time (ms from the request, MB), to tell the stages' peaks
    // apart afterwards; the renderer's as [ms, VmRSS, of which anonymous, shared, file-backed].
    gpuTrace: gpu.samples.map((x) => [x.t - t0, Math.round(x.bytes / MB)]),
    rendererTrace: cpu.history.filter((x) => x.t >= t0).map((x) => {
      const { anon = 0, shmem = 0, file = 0 } = x.parts.extension ?? {};
      return [x.t - t0, ...[x.rss.extension ?? 0, anon, shmem, file].map((n) => Math.round(n / MB))];
    }),
    during: duringOutcome,
    // With --dumps: Chromium's account of the extension renderer's memory by allocator (memory-infra),
    // every 0.4 s from the request to 1.5 s after the job: [ms from the request, { allocator: MiB }].
    rendererDumps,
    png,
  };
}


/** The pids of the extension renderers (Chromium's `--extension-process`) running now. */
function extensionRenderers() {
  const pids = new Set();
  for (const p of fs.readdirSync('/proc').filter((x) => /^\d+$/.test(x))) {
    try {
      const cmd = fs.readFileSync(`/proc/${p}/cmdline`, 'utf8');
      if (cmd.includes('--type=renderer') && cmd.includes('--extension-process')) pids.add(Number(p));
    } catch {}
  }
  return pids;
}

/** Opens the profile again under the current ballast and measures the budget, as at a first run. */
async function reopen(profileDir, args, freeGb) {
  const b = await h.launch({ profileDir, args });
  b.profileDir = profileDir;
  await h.collectEvents(b.page);
  const measured = await h.api(b.page, { type: 'gpuMemory', measure: true });
  console.log(`${freeGb} GB free: the probe found ${JSON.stringify(measured.probe?.found)}, budget ${measured.budget}`);
  return { b, probe: measured.probe?.found ?? null };
}

/** Compares `row`'s image with the reference image of its size. */
async function compare(row, reference) {
  const ref = reference[row.size];
  row.timeRatio = ref?.done && row.done ? row.wallMs / ref.wallMs : null;
  if (row.png && ref?.png) {
    const c = await h.run('python3', ['tests/reference/compare.py', ref.png, row.png, '--tol', '2']);
    row.largestDifference = Number(/max abs channel difference (\d+)/.exec(c.stdout)?.[1] ?? NaN);
  }
}

async function smallGpus() {
  const sizes = o.sizes.split(',');
  const smallSizes = o['small-sizes'].split(',');
  const args = o['browser-args'].split(' ').filter(Boolean);
  const { repoDir, repo } = await packSource();
  const hub = await h.startHub({ repos: { [repo]: { dir: repoDir } } });
  const profileDir = fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-memory-profile-'));
  let b = await h.launch({ profileDir, args });
  b.profileDir = profileDir;
  await h.collectEvents(b.page);
  const installT0 = Date.now();
  await h.installPack(b.page, hub, repo);
  console.log(`installed in ${((Date.now() - installT0) / 1000).toFixed(1)} s`);
  const reference = {};
  for (const size of sizes) {
    reference[size] = await image(b, size, 'unlimited');
    console.log(JSON.stringify({ freeGb: 'all', ...reference[size], gpuTrace: undefined }));
  }
  await b.close({ keepProfile: true });
  const rows = [];
  const save = () => o.out && fs.writeFileSync(o.out, JSON.stringify({ sizes, steps: REQUEST.steps, args, reference, rows }, null, 2));
  save();
  for (const freeGb of o['free-gb'].split(',').map(Number)) {
    const held = await ballast(freeGb);
    try {
      let probe;
      ({ b, probe } = await reopen(profileDir, args, freeGb));
      // Each size from a fresh start: nothing kept loaded from the image before.
      for (const size of freeGb >= 8 ? sizes : smallSizes) {
        await h.api(b.page, { type: 'keepLoaded', seconds: 0 });
        const row = { freeGb, probe, ...(await image(b, size, `free-${freeGb}`)) };
        await compare(row, reference);
        rows.push(row);
        console.log(JSON.stringify({ ...row, gpuTrace: undefined }));
        save();
      }
      for (const also of o.also?.split(';') ?? []) {
        const [size, json] = [also.slice(0, also.indexOf('=')), also.slice(also.indexOf('=') + 1)];
        await h.api(b.page, { type: 'keepLoaded', seconds: 0 });
        const row = { freeGb: `${freeGb} ${json}`, probe, ...(await image(b, size, `free-${freeGb}-also`, { extra: JSON.parse(json) })) };
        await compare(row, reference);
        rows.push(row);
        console.log(JSON.stringify({ ...row, gpuTrace: undefined }));
        save();
      }
      await b.close({ keepProfile: true });
    } finally {
      held.kill('SIGTERM');
    }
  }
  if (o.grow) {
    const [from, to] = o.grow.split(':').map(Number);
    const held = await ballast(from);
    let more = null;
    try {
      let probe;
      ({ b, probe } = await reopen(profileDir, args, from));
      await h.api(b.page, { type: 'keepLoaded', seconds: 0 });
      const seen = (await h.events(b.page)).length;
      const during = async (browser) => {
        // Only this job's events: the list holds the earlier jobs' too.
        for (const t0 = Date.now(); Date.now() - t0 < 600_000; await h.sleep(100)) {
          const evs = (await h.events(browser.page)).slice(seen);
          if (evs.some((e) => ['result', 'failed', 'cancelled'].includes(e.type))) return 'the job ended before its transformer ran';
          if (evs.some((e) => e.type === 'progress' && e.progress?.stage === 'transformer')) break;
        }
        more = await ballast(to);
        return `ballast grown to ${to} GB free while the transformer ran`;
      };
      const grown = { freeGb: `${from}->${to}`, probe, ...(await image(b, '1024', `grow-${from}-${to}`, { during })) };
      await compare(grown, reference);
      rows.push(grown);
      console.log(JSON.stringify({ ...grown, gpuTrace: undefined }));
      const after = { freeGb: `${to} (after)`, probe, ...(await image(b, '512', `grow-after-${to}`)) };
      await compare(after, reference);
      rows.push(after);
      console.log(JSON.stringify({ ...after, gpuTrace: undefined }));
      save();
      await b.close({ keepProfile: true });
    } finally {
      more?.kill('SIGTERM');
      held.kill('SIGTERM');
    }
  }
  await hub.close();
  const plan = (r) => (r.memory ? `${r.memory.ahead} / ${r.memory.levers.decoderPieceBytes ? gb(r.memory.levers.decoderPieceBytes) : 'whole'} / ${r.memory.levers.attentionChunks}` : '-');
  h.printTable(
    ['free GB', 'size', 'outcome', 'budget GB', 'plan (at once / decoder pieces GB / chunks)', 'GPU above start (GB)', 'renderer above start (GB)', 'time (s)', 'time / unlimited', 'largest difference'],
    [...sizes.map((size) => ({ freeGb: 'all', ...reference[size], timeRatio: 1, largestDifference: 0 })), ...rows].map((r) => [
      r.freeGb,
      r.size,
      r.done ? 'done' : `failed: ${r.error}`,
      r.budget === null ? '-' : gb(r.budget),
      plan(r),
      r.gpuAboveStart === null ? '-' : gb(r.gpuAboveStart),
      gb(r.rendererAboveStart),
      (r.wallMs / 1000).toFixed(1),
      r.timeRatio == null ? '-' : r.timeRatio.toFixed(2),
      r.largestDifference ?? '-',
    ]),
  );
  save();
  fs.rmSync(profileDir, { recursive: true, force: true });
}

const rows = [];
for (const name of o.plans.split(',')) {
  process.stdout.write(`plan ${name}... `);
  const row = await measure(name);
  console.log(`${(row.wallMs / 1000).toFixed(1)} s`);
  rows.push(row);
}
const first = rows[0];
for (const row of rows) {
  const compared = await h.run('python3', ['tests/reference/compare.py', first.png, row.png, '--tol', '255']);
  row.largestDifference = Number(/max abs channel difference (\d+)/.exec(compared.stdout)?.[1] ?? NaN);
  row.timeRatio = row.wallMs / first.wallMs;
}
console.log(`\n${o.pack} pack, ${size}x${size}, ${REQUEST.steps} steps, one cold image per plan, each in a browser of its own:`);
h.printTable(
  ['plan', 'at once / kept', 'decoder pieces', 'GPU process above idle (MiB)', 'renderer above idle (MiB)', 'GPU memory above idle (MiB)', 'time (s)', 'time / first', 'largest difference (levels)'],
  rows.map((r) => [
    r.plan,
    `${r.memory.ahead} / ${r.memory.keep}`,
    r.pieces,
    (r.gpuProcessAboveIdle / MB).toFixed(0),
    (r.rendererAboveIdle / MB).toFixed(0),
    r.gpuMemoryAboveIdle === null ? '-' : (r.gpuMemoryAboveIdle / MB).toFixed(0),
    (r.wallMs / 1000).toFixed(1),
    r.timeRatio.toFixed(2),
    r.largestDifference,
  ]),
);
if (o.out) fs.writeFileSync(o.out, JSON.stringify({ size, steps: REQUEST.steps, pack: o.pack, rows }, null, 2));
