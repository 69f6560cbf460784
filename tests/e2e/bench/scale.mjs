// `cargo xtask bench scale`: the full-size pack through the extension, on this machine.
//
//   node tests/e2e/bench/scale.mjs [--pack DIR] [--size 256] [--steps 1] [--export-only] [--install-only]
//                                  [--interval-ms 200] [--timeout-min 180] [--stages LIST [--create-only]]
//                                  [--memory VmRSS|RssAnon]
//
// 1. Export (or reuse): a full-size pack with random weights and float32 activations, written by
//    tools/export/stream_export.py (the graphs export.py writes, in about one tensor of memory), under
//    nice 19, into target/scale-pack/pack, reused when target/scale-pack/stamp.json matches the
//    exporter's sources and arguments. --pack DIR uses an exported pack as it is (any config). Its three graphs' sizes are printed next to the published pack's.
// 2. Install: the fake Hub (fake-hub.mjs) serves DIR from disk on loopback; installPack through the
//    extension, timed (the install rate).
// 3. Generate: one --size x --size, --steps image on the default backend (WebGPU; SwiftShader here).
//    Stage start times, session-create and run times come from the result's `timings.stages`.
// Memory (proc-memory.mjs): VmRSS (or with --memory RssAnon, anonymous memory only) of the extension's renderer process (the offscreen document and
// the stage workers in it) and of the GPU process, sampled every --interval-ms; idle = the median of
// the 3 s before the generation. For each stage: the peak above idle while its session is created and
// while it runs, next to its weight bytes.
// Also printed: the ORT build the shipped stage worker imports, and the WebGPU adapter's buffer limits.
// --install-only stops after the install (session creation is then not measured); a failed
// generation still prints the stages it reached, from the progress events.
// --stages decoder,transformer,textEncoder: instead of a generation, each stage on its own, in that
// order: the extension's stage worker (stage-worker.js) started from the extension page, given the
// task the offscreen document would give it and a made-up input of the right size (zero prompt
// embeddings, small random latents), each ended after --timeout-min, or 1 s after its session exists
// with --create-only. For when one stage cannot run (or takes hours) on this machine and the others
// are still to be measured. First comes what ORT itself costs a renderer: a one-node graph created and
// run in a browser of its own (ortAlone).

import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from '../lib/harness.mjs';
import { cpuCores, medianBetween, peakBetween, startSampler } from '../lib/proc-memory.mjs';

const { values: o } = parseArgs({
  options: {
    pack: { type: 'string' },
    size: { type: 'string', default: '256' },
    steps: { type: 'string', default: '1' },
    'export-only': { type: 'boolean', default: false },
    'install-only': { type: 'boolean', default: false },
    'interval-ms': { type: 'string', default: '200' },
    'timeout-min': { type: 'string', default: '180' },
    stages: { type: 'string', default: '' },
    'create-only': { type: 'boolean', default: false },
    memory: { type: 'string', default: 'VmRSS' },
  },
});
const DEFAULT_PACK = path.join(h.ROOT, 'target/scale-pack/pack');
const PACK = path.resolve(o.pack ?? DEFAULT_PACK);
const REPO = 'bench/flux2-klein-4b-full-f32';
const STEMS = ['text_encoder_q4', 'transformer_q8', 'vae_decoder'];
const STAGE_OF = { textEncoder: 'text_encoder_q4', transformer: 'transformer_q8', decoder: 'vae_decoder' };
// The published pack (cgb/flux2-klein-4b-onnx-webgpu), GB per graph: the pack card.
const PUBLISHED_GB = { text_encoder_q4: 2.2, transformer_q8: 4.14, vae_decoder: 0.2 };
const PYTHON = path.join(h.ROOT, 'target/export-venv/bin/python');
const EXPORTER = ['stream_export.py', 'export.py', 'models.py', 'onnx_tools.py'].map((f) => path.join(h.ROOT, 'tools/export', f));
const EXPORT_ARGS = ['--config', 'full', '--activations', 'float32', '--seed', '0'];
// An ONNX model of one node, y = x + x on float32[4] (ir_version 8, opset 17), as onnx.helper writes it.
const ONE_NODE_MODEL = 'CAgSADo1Cg4KAXgKAXgSAXkiA0FkZBIBZ1oPCgF4EgoKCAgBEgQKAggEYg8KAXkSCgoICAESBAoCCARCBAoAEBE=';

const log = (m) => console.log(`bench: ${m}`);
const gb = (n) => (n / 1e9).toFixed(2);
const mb = (n) => ((n ?? 0) / 1e6).toFixed(0);
const s = (ms) => (typeof ms === 'number' ? (ms / 1000).toFixed(1) : '-');
/** The peak of `kind` in the window [from, to] of `history` above `idle`, in MB; '-' without samples. */
function peakAbove(history, idle, [from, to], kind) {
  const { peak, samples } = peakBetween(history, from, to);
  return samples ? mb(Math.max(0, (peak[kind] ?? 0) - (idle[kind] ?? 0))) : '-';
}

// 1. export or reuse ----------------------------------------------------------------------------
const stampFile = path.join(path.dirname(PACK), 'stamp.json');
const stamp = {
  args: EXPORT_ARGS,
  sources: crypto.createHash('sha256').update(Buffer.concat(EXPORTER.map((f) => fs.readFileSync(f)))).digest('hex'),
};
let exportS = null;
const old = fs.existsSync(stampFile) ? JSON.parse(fs.readFileSync(stampFile, 'utf8')) : null;
if (o.pack) {
  if (!fs.existsSync(path.join(PACK, 'export_info.json'))) throw new Error(`--pack ${PACK}: no export_info.json there`);
  log(`using ${PACK} as it is (--pack)`);
} else if (old && old.args.join(' ') === stamp.args.join(' ') && old.sources === stamp.sources && fs.existsSync(path.join(PACK, 'export_info.json'))) {
  log(`reusing ${PACK} (exported in ${old.seconds} s; ${stampFile} matches)`);
} else {
  if (!fs.existsSync(PYTHON)) throw new Error(`${PYTHON} is missing: see tools/export/README.md`);
  fs.rmSync(stampFile, { force: true });
  log(`exporting the full-size float32 pack into ${PACK} (nice 19; about 15 min here) ...`);
  const t = Date.now();
  const r = await h.run('nice', ['-n', '19', PYTHON, 'tools/export/stream_export.py', ...EXPORT_ARGS, '--out', PACK], { timeoutMs: 3 * 3600_000 });
  if (r.code !== 0) throw new Error(`stream_export.py failed (${r.code}):\n${r.stdout}\n${r.stderr}`);
  exportS = Math.round((Date.now() - t) / 1000);
  fs.writeFileSync(stampFile, JSON.stringify({ ...stamp, seconds: exportS }, null, 2) + '\n');
  log(`exported in ${exportS} s`);
}
const weights = {};
const files = fs.readdirSync(PACK);
for (const stem of STEMS) weights[stem] = files.filter((f) => f.startsWith(stem)).reduce((n, f) => n + fs.statSync(path.join(PACK, f)).size, 0);
const sizeRows = STEMS.map((stem) => {
  const ratio = weights[stem] / (PUBLISHED_GB[stem] * 1e9);
  return [stem, gb(weights[stem]), PUBLISHED_GB[stem].toFixed(2), `${((ratio - 1) * 100).toFixed(1)}%`, Math.abs(ratio - 1) <= 0.1 ? 'yes' : 'NO'];
});
console.log('\npack: graph + external data, GB');
h.printTable(['graph', 'this pack', 'published', 'difference', 'within 10%'], sizeRows);
if (o['export-only']) process.exit(0);

// 2. install --------------------------------------------------------------------------------------
const ortBuild = (/from '\.\/ort\/([^']+)'/.exec(fs.readFileSync(path.join(h.DIST, 'stage-worker.js'), 'utf8')) ?? [])[1] ?? 'unknown';
const t0 = Date.now();
const hub = await h.startHub({ repos: { [REPO]: { dir: PACK, disk: true, extra: {} } } });
log(`fake Hub ${hub.url}: ${h.packFiles(hub, REPO).length} pack files hashed in ${s(Date.now() - t0)} s`);
const b = await h.launch();
const sampler = startSampler(b.profileDir, Number(o['interval-ms']), o.memory);
let exit = 0;
const report = { exportS, ortBuild };
try {
  const adapter = await b.page.evaluate(async () => {
    const a = await navigator.gpu?.requestAdapter();
    if (!a) return null;
    const info = a.info ?? {};
    return { description: `${info.vendor ?? ''} ${info.architecture ?? ''} ${info.description ?? ''}`.trim(), maxBufferSize: a.limits.maxBufferSize, maxStorageBufferBindingSize: a.limits.maxStorageBufferBindingSize, f16: a.features.has('shader-f16') };
  });
  report.adapter = adapter;
  log(`stage worker ORT build: ${ortBuild}; adapter ${JSON.stringify(adapter)}`);
  await h.sleep(3000);
  const idleInstall = sampler.mark();
  log(`installing ${gb(Object.values(weights).reduce((a, x) => a + x, 0))} GB through the extension ...`);
  const ti = Date.now();
  await h.collectEvents(b.page);
  const reply = await h.startInstall(b.page, hub, REPO);
  if (reply?.type !== 'installStarted') throw new Error(`installPack: ${JSON.stringify(reply)}`);
  const installed = await h.waitForInstall(b.page, 3 * 3600_000);
  const installS = (Date.now() - ti) / 1000;
  const installMem = sampler.mark();
  report.install = { bytes: installed.bytes, seconds: installS };
  log(`installed ${gb(installed.bytes)} GB in ${installS.toFixed(1)} s: ${(installed.bytes / installS / 1e6).toFixed(1)} MB/s; peak above idle: extension renderer ${mb(installMem.peakByKind.extension - idleInstall.median.extension)} MB, all but the browser ${mb(installMem.peakSum - idleInstall.medianSum)} MB`);
  if (o['install-only']) throw Object.assign(new Error('--install-only'), { quiet: true });

  if (o.stages) {
    await stagesAlone(b, adapter, installed, installS);
    throw Object.assign(new Error('--stages'), { quiet: true });
  }

  // 3. generate ------------------------------------------------------------------------------------
  await h.sleep(3000);
  const idleFrom = Date.now() - 3000;
  const idle = medianBetween(sampler.history, idleFrom, Date.now());
  const req = { prompt: 'a red fox in the snow', width: Number(o.size), height: Number(o.size), steps: Number(o.steps), seed: '1', trace: false };
  log(`generating ${req.width}x${req.height}, ${req.steps} step(s) ...`);
  const tg = Date.now();
  const startReply = await h.api(b.page, { type: 'generate', ...req });
  if (startReply?.type !== 'jobStarted') throw new Error(`generate: ${JSON.stringify(startReply)}`);
  const progress = [];
  let end = null;
  const deadline = tg + Number(o['timeout-min']) * 60_000;
  while (!end) {
    const evs = await h.events(b.page);
    for (const e of evs.filter((x) => x.job === startReply.job && x.type === 'progress').slice(progress.length)) {
      progress.push({ t: Date.now(), ...e.progress });
      log(`+${s(Date.now() - tg)} s: ${e.progress.stage} ${e.progress.step}/${e.progress.steps}`);
    }
    end = evs.find((x) => x.job === startReply.job && ['result', 'failed', 'cancelled'].includes(x.type));
    if (!end && Date.now() > deadline) {
      end = { type: 'timeout' };
      await h.api(b.page, { type: 'cancel', job: startReply.job }).catch(() => {});
    }
    if (!end) await h.sleep(1000);
  }
  const tEnd = Date.now();
  await h.sleep(1000);
  await sampler.stop();
  const wallS = (tEnd - tg) / 1000;
  report.generate = { wallS, outcome: end.type, error: end.error };
  if (end.type !== 'result') {
    exit = 1;
    log(`generation ${end.type} after ${wallS.toFixed(1)} s: ${end.error ?? ''}`);
  } else log(`image in ${wallS.toFixed(1)} s`);

  // Stage windows: from the result's timings, else from the progress events (create and run together).
  const stages = end.timings?.stages ?? end.result?.timings?.stages;
  const windows = [];
  if (stages?.length) {
    stages.forEach((st, i) => {
      const created = st.startedAtMs + st.sessionCreateMs;
      const next = stages[i + 1]?.startedAtMs ?? tEnd;
      windows.push({ stage: st.stage, create: [st.startedAtMs, created], run: [created, next], createMs: st.sessionCreateMs, runMs: st.runMs });
    });
  } else {
    const starts = [];
    for (const p of progress) if (!starts.length || starts.at(-1).stage !== p.stage) starts.push(p);
    starts.forEach((p, i) => windows.push({ stage: p.stage, create: [p.t, starts[i + 1]?.t ?? tEnd], run: null }));
  }
  const above = (w, kind) => (w ? peakAbove(sampler.history, idle, w, kind) : '-');
  const rows = windows.map((w) => {
    const bytes = weights[STAGE_OF[w.stage]];
    const ext = above(w.create, 'extension');
    return [w.stage, mb(bytes), s(w.createMs), s(w.runMs), ext, ext === '-' ? '-' : (Number(ext) * 1e6 / bytes).toFixed(2), above(w.run, 'extension'), above(w.create, 'gpu'), above(w.run, 'gpu')];
  });
  report.stages = rows;
  console.log(`\nbench scale: ${req.width}x${req.height}, ${req.steps} step(s), ${os.platform()} ${cpuCores()} cores, ORT build ${ortBuild}, adapter ${adapter?.description || '?'} (maxBufferSize ${adapter?.maxBufferSize}, maxStorageBufferBindingSize ${adapter?.maxStorageBufferBindingSize})`);
  console.log(`install: ${gb(installed.bytes)} GB in ${installS.toFixed(1)} s = ${(installed.bytes / installS / 1e6).toFixed(1)} MB/s; generation wall ${wallS.toFixed(1)} s (${end.type})`);
  console.log(`idle: extension renderer ${mb(idle.extension)} MB, GPU process ${mb(idle.gpu)} MB; peaks below are above idle, MB${stages?.length ? '' : ' (no timings: windows from progress events, create and run together)'}`);
  h.printTable(['stage', 'weights MB', 'create s', 'run s', 'renderer create', 'x weights', 'renderer run', 'GPU create', 'GPU run'], rows);
} catch (e) {
  if (!e.quiet) {
    console.error(`bench: ${e.stack ?? e}`);
    exit = 2;
  }
} finally {
  await sampler.stop();
  await b.close();
  await hub.close();
}
fs.mkdirSync(h.OUT, { recursive: true });
fs.writeFileSync(path.join(h.OUT, 'bench-scale.json'), JSON.stringify(report, null, 2) + '\n');
process.exit(exit);

/**
 * What ONNX Runtime Web itself costs a renderer, whatever the weights: in a browser of its own (so that
 * what a renderer keeps after it neither adds to nor hides the stages' peaks), an extension page imports
 * the shipped ORT build, creates a session of ONE_NODE_MODEL on WebGPU and runs it. The row --stages
 * prints first.
 */
async function ortAlone() {
  const b = await h.launch({ page: 'options.html' });
  const own = startSampler(b.profileDir, Number(o['interval-ms']), o.memory);
  try {
    await h.sleep(3000);
    const idle = medianBetween(own.history, Date.now() - 3000, Date.now());
    const t = Date.now();
    const r = await b.page.evaluate(async (model) => {
      const ort = await import('./ort/ort.jspi.bundle.min.mjs');
      const t0 = performance.now();
      const session = await ort.InferenceSession.create(Uint8Array.from(atob(model), (c) => c.charCodeAt(0)), { executionProviders: ['webgpu'] });
      const t1 = performance.now();
      const { y } = await session.run({ x: new ort.Tensor('float32', Float32Array.of(1, 2, 3, 4), [4]) });
      const out = Array.from(await y.getData());
      return { createMs: t1 - t0, runMs: performance.now() - t1, out };
    }, ONE_NODE_MODEL);
    const tEnd = Date.now();
    await h.sleep(1000);
    if (r.out.join() !== '2,4,6,8') throw new Error(`ORT alone: y = x + x gave ${r.out} for x = 1,2,3,4`);
    const above = (w, kind) => peakAbove(own.history, idle, w, kind);
    const row = ['ORT alone (y = x + x)', '0', s(r.createMs), s(r.runMs), above([t, tEnd], 'extension'), '-', '-', above([t, tEnd], 'gpu'), '-', 'an extension page of a browser of its own'];
    log(row.join(' | '));
    return row;
  } finally {
    await own.stop();
    await b.close();
  }
}

/** --stages: each stage alone in the extension's stage worker, started from the extension page. */
async function stagesAlone(b, adapter, installed, installS) {
  const size = Number(o.size);
  const params = { prompt: 'a red fox in the snow', width: size, height: size, steps: Number(o.steps), seed: '1', schedule: 'empirical', trace: false, backend: 'webgpu' };
  const rows = [await ortAlone()];
  for (const stage of o.stages.split(',')) {
    if (!STAGE_OF[stage]) throw new Error(`--stages: unknown stage ${stage} (textEncoder, transformer, decoder)`);
    await h.sleep(3000);
    const idle = medianBetween(sampler.history, Date.now() - 3000, Date.now());
    log(`${stage} alone ...`);
    const t = Date.now();
    const r = await b.page.evaluate(
      ({ stage, params, size, timeoutMs, createOnly }) =>
        new Promise((resolve) => {
          const w = new Worker('stage-worker.js', { type: 'module' });
          const tokens = (size / 16) * (size / 16);
          let data;
          if (stage === 'transformer') data = new Float32Array(512 * 7680).buffer;
          if (stage === 'decoder') data = Float32Array.from({ length: tokens * 128 }, () => Math.random() - 0.5).buffer;
          let created = null;
          const timer = setTimeout(() => (w.terminate(), resolve({ error: `ended after ${timeoutMs / 60000} min`, timedOut: true, created })), timeoutMs);
          const end = (x) => (clearTimeout(timer), w.terminate(), resolve(x));
          w.onmessage = (e) => {
            const m = e.data;
            if (m?.kind === 'sessionCreated') {
              created = m.timing;
              if (createOnly) setTimeout(() => end({ error: 'ended once created (--create-only)', created }), 1000);
            } else if (m?.kind === 'done') end({ output: m.output });
            else if (m?.kind === 'error') end({ error: m.error });
          };
          w.onerror = (e) => end({ error: `worker error: ${e.message}` });
          const msg = { task: stage, params };
          // The offscreen document tokenizes; made-up ids (20 tokens padded to 512) cost the same to encode.
          if (stage === 'textEncoder') {
            const real = 20;
            msg.prompt = {
              inputIds: Array.from({ length: 512 }, (_, i) => (i < real ? 1000 + i : 151643)), // padding: imagine_core::prompt::PAD_TOKEN_ID
              attentionMask: Array.from({ length: 512 }, (_, i) => (i < real ? 1 : 0)),
              tokenCount: real,
              truncated: false,
            };
          }
          if (data) {
            msg.data = data;
            w.postMessage(msg, [data]);
          } else w.postMessage(msg);
        }),
      { stage, params, size, timeoutMs: Number(o['timeout-min']) * 60_000, createOnly: o['create-only'] },
    );
    const tEnd = Date.now();
    await h.sleep(1000);
    const timing = r.output?.timing ?? r.created;
    const bytes = weights[STAGE_OF[stage]];
    const above = (w, kind) => peakAbove(sampler.history, idle, w, kind);
    let row;
    if (timing) {
      const created = timing.startedAtMs + timing.sessionCreateMs;
      const ext = above([timing.startedAtMs, created], 'extension');
      const outcome = r.output ? `ok in ${s(tEnd - t)} s` : `run ${r.error} (${s(tEnd - t)} s)`;
      row = [stage, mb(bytes), s(timing.sessionCreateMs), r.output ? s(timing.runMs) : o['create-only'] ? '-' : `>${s(tEnd - created)}`, ext, (Number(ext) * 1e6 / bytes).toFixed(2), above([created, tEnd], 'extension'), above([timing.startedAtMs, created], 'gpu'), above([created, tEnd], 'gpu'), outcome];
    } else {
      row = [stage, mb(bytes), '-', '-', above([t, tEnd], 'extension'), '-', '-', above([t, tEnd], 'gpu'), '-', `${r.error} (${s(tEnd - t)} s; memory: the whole stage)`];
    }
    log(row.join(' | '));
    rows.push(row);
  }
  report.stages = rows;
  console.log(`\nbench scale --stages: ${size}x${size}, ${params.steps} step(s), ${os.platform()} ${cpuCores()} cores, ORT build ${report.ortBuild}, adapter ${adapter?.description || '?'} (maxBufferSize ${adapter?.maxBufferSize}, maxStorageBufferBindingSize ${adapter?.maxStorageBufferBindingSize})`);
  console.log(`install: ${gb(installed.bytes)} GB in ${installS.toFixed(1)} s = ${(installed.bytes / installS / 1e6).toFixed(1)} MB/s; peaks (${o.memory}) are above the idle before each stage, MB`);
  h.printTable(['stage', 'weights MB', 'create s', 'run s', 'renderer create', 'x weights', 'renderer run', 'GPU create', 'GPU run', 'outcome'], rows);
}
