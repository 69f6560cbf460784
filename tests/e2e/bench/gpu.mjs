// The extension itself on a real GPU: `tools/gpu-bench/browser.sh` runs this on the GPU machine (the
// release build in Chromium on the H200); `real-arch-bench.test.mjs` runs it here on SwiftShader with the tiny
// real-architecture pack.
//
//   node tests/e2e/bench/gpu.mjs --pack DIR [--out DIR] [--size 512] [--large 1024] [--steps 4] [--batch 4]
//        [--f16-args "--enable-dawn-features=vulkan_enable_f16_on_nvidia"] [--f16-backend webgpu|wasm]
//        [--reference] [--tolerance-f16 N] [--tolerance-f32 N] [--max-pixels N] [--threads N]
//        [--ort-alt DIR] [--images NAME,...] [--f16-install] [--idle-ms 2000]
//
// With IMAGINE_WEBGPU=vulkan (harness.mjs) Chromium runs on the GPU. A float16 pack exported like the
// published one (`--pack`, served by the fake Hub from disk on loopback) goes through:
//   1. without shader-f16 (Chromium's default on Linux + NVIDIA): the install through the extension
//      (resolve, plan, download, verify, the float32 conversion, swap): its rate, the conversion's time
//      and extra disk; then one cold --size image (prompt A, seed 42), traced, and a repeat (seed 43);
//   2. with shader-f16 (Chromium started with --f16-args; if the adapter still lacks it, again with
//      `allow_unsafe_apis` added; with neither it runs on --f16-backend if given, else is skipped), the
//      same installed pack: a warm-up image (shaders compiled; then, until they are, the float16 graphs' forms re-blocked to 32 stored, which the install stored for the conversion only), then the baseline, as the extension ran before stages loaded at once and
//      stayed loaded (`loadAhead: false`, `keepLoaded` 0): a cold --size image (prompt D) and a repeat;
//      then as it runs now (`keepLoaded` 300): a cold --size image (prompt B, seed 42, traced), the same
//      prompt again with seed 43 (embeddings cached, stages resident, traced), a batch of --batch
//      variations (seeds 44...), and, with the stages unloaded first, one cold --large image (prompt C);
//      then, nothing loaded, the cold and repeat --size images again with int8 activations in every
//      MatMulNBits (`accuracyLevel` 4; step 1 ends with its cold image too), compared with the
//      reference of the same trace (measured, not expected either way); and last a cold --size image
//      with ONNX Runtime's profiling on (prompt G; step 1 too, prompt F): per stage, session creation
//      as ORT saw it, each run's GPU time, and the GPU time of each operator and program; then two
//      cold --large images, with `accuracyLevel` 4 (prompt J) and profiled (prompt K); then with
//      `keepBuffers` (ORT keeps every GPU buffer between runs, not only those up to 160 MiB) a cold
//      --size image (prompt M) and its repeat, and a cold --large image with ORT's own cache
//      (`keepBuffers: false`, prompt L), as the extension keeps the buffers above 512x512 by default.
//      Then, unloaded first, a cold --size image with the graphs re-blocked to 32 while they load rather
//      than stored at install (the pack record as an older version wrote it, put back after; prompt O).
//      Step 1 ends with a cold --large image (prompt C), the same with ORT's own cache (prompt L), a
//      cold --size image with `keepBuffers` and its repeat (prompt N), and a cold --size image
//      re-blocked while loading (prompt P);
//   1 and 2 each end with the transformer's attention fused into MultiHeadAttention (`fuseAttention`;
//      by default it runs as exported, node by node): a cold --size image (prompt Q) and its repeat, the
//      inputs of the step's cold image again (traced: their first transformer outputs must agree to
//      cosine 0.999, and its image is compared with the same reference) and a cold --large image (R);
//   2b. --ort-alt DIR (another onnxruntime-web package: its package.json and dist/): the same Chromium
//      again with that package's JSPI bundle and wasm in place of the extension's (swapped in the
//      unpacked extension, so that the installed pack is the same, and put back after): a warm-up
//      (prompt H), a cold --size image and its repeat (prompt I: step 2's embeddings are cached) and a
//      profiled cold one (prompt G), beside step 2's;
//   3. --reference: tests/reference/reference.py (onnxruntime, CPU) recomputes the two cold --size
//      images from their traces on the pack's own graphs, and compare.py compares each with the
//      extension's; then the check is run once with one input perturbed (the cold image of step 2
//      against a reference fed the noise of seed 43 instead of 42), which must fail.
// --f16-install installs the pack again in step 2's browser before its images (deleted first), as a
// user whose GPU has shader-f16 does: the float16 graphs are then the ones re-blocked to 32 and stored at
// install, not step 1's float32 conversion; with --images naming no float32 image, step 1 is left out.
// --images (names as in bench-gpu.json, e.g. f16-warm-up,f16-cold,f16-repeat,f16-large) makes only those
// images of the plan, when device time is short; the install and the launches stay. --large 0 leaves out
// the --large images.
// --idle-ms: how long each image and the install wait first, the idle their memory peaks are measured
// above (the median of that window's samples, every --interval-ms).
// Per stage of every image: worker start (creation to its task arriving: script, wasm, ORT bindings),
// preparing the graph (reading it and its edits; the block-32 one only when re-blocking while loading), session creation, each run, the stage's wall
// time (its worker's creation to the end of its work) and what of it was neither (waiting for the
// stage before it, the messages between); the peak memory above idle of the extension's renderer (offscreen document and stage workers)
// and of the GPU process, and the GPU's memory in use (`nvidia-smi`, when there is one).
// Writes OUT/bench-gpu.json, the PNGs and the traces; prints the tables BENCHMARKS.md shows. Exits 1
// when an image failed or a comparison did not come out as expected.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from '../lib/harness.mjs';
import { medianBetween, peakBetween, startSampler } from '../lib/proc-memory.mjs';

const { values: o } = parseArgs({
  options: {
    pack: { type: 'string' },
    out: { type: 'string', default: path.join(h.OUT, 'bench-gpu') },
    size: { type: 'string', default: '512' },
    large: { type: 'string', default: '1024' },
    steps: { type: 'string', default: '4' },
    batch: { type: 'string', default: '4' },
    'f16-args': { type: 'string', default: '--enable-dawn-features=vulkan_enable_f16_on_nvidia' },
    'f16-backend': { type: 'string' },
    images: { type: 'string' },
    'f16-install': { type: 'boolean', default: false },
    reference: { type: 'boolean', default: false },
    // Levels of 255 per channel; those of the tiny real-architecture packs (tiny-packs.mjs): the same
    // graphs on both sides, summed in another order, rounded to float16 elsewhere. Measured at full size
    // on the H200: 1 (BENCHMARKS.md).
    'tolerance-f16': { type: 'string', default: '2' },
    'tolerance-f32': { type: 'string', default: '2' },
    'max-pixels': { type: 'string', default: '0' },
    threads: { type: 'string', default: String(Math.max(1, Math.floor(os.cpus().length / 3))) },
    'interval-ms': { type: 'string', default: '200' },
    'idle-ms': { type: 'string', default: '2000' },
    'timeout-min': { type: 'string', default: '20' },
    'ort-alt': { type: 'string' },
  },
});
if (!o.pack) throw new Error('--pack DIR is required (a pack exported by tools/export)');
const PACK = path.resolve(o.pack);
const OUT = path.resolve(o.out);
const REPO = 'bench/flux2-klein-4b';
const SIZE = Number(o.size);
const STEPS = Number(o.steps);
const PROMPTS = {
  a: 'a red fox in the snow, morning light',
  b: 'a lighthouse on a cliff at dusk, oil painting',
  c: 'a bowl of ramen on a wooden table, photograph',
  d: 'a paper boat on a puddle, watercolor',
  e: 'a stack of old books, studio light',
  f: 'a glass teapot with blooming tea, macro photograph',
  g: 'a snowy mountain village at night, lanterns',
  h: 'a tin robot watering a garden, children\'s book',
  i: 'a sailboat in a storm, dramatic sky',
  j: 'a hummingbird at a red flower, high speed photograph',
  k: 'an old tram in a rainy city street, film photograph',
  l: 'a field of sunflowers under a thunderstorm, wide angle',
  m: 'a cup of coffee with latte art, top view',
  n: 'a koi pond in autumn, ink painting',
  o: 'a lantern-lit night market, long exposure',
  p: 'a fox made of paper, origami on white',
  q: 'a desert road at noon, heat haze',
  r: 'a greenhouse full of ferns, soft light',
};
/** How long stages stay loaded after an image while the bench measures the product as it ships. */
const KEEP_LOADED_S = 300;
const TIMEOUT_MS = Number(o['timeout-min']) * 60_000;
const IDLE_MS = Number(o['idle-ms']);
fs.mkdirSync(OUT, { recursive: true });

const log = (m) => console.log(`bench gpu: ${m}`);
const s = (ms) => (typeof ms === 'number' && Number.isFinite(ms) ? (ms / 1000).toFixed(2) : '-');
const mb = (n) => (typeof n === 'number' ? (n / 1e6).toFixed(0) : '-');
const report = { startedAt: new Date().toISOString(), pack: {}, launches: {}, images: [], stages: [], comparisons: [] };

// The pack's graphs, by stem.
for (const f of fs.readdirSync(PACK)) {
  const stem = /^(text_encoder_q4|transformer_q8|vae_decoder)/.exec(f)?.[1];
  if (stem) report.pack[stem] = (report.pack[stem] ?? 0) + fs.statSync(path.join(PACK, f)).size;
}

const gpuMemory = startGpuMemorySampler(Number(o['interval-ms']));
const t0 = Date.now();
const hub = await h.startHub({ repos: { [REPO]: { dir: PACK, disk: true, extra: {} } } });
report.hubHashS = (Date.now() - t0) / 1000;
log(`fake Hub ${hub.url}: ${h.packFiles(hub, REPO).length} files hashed in ${report.hubHashS.toFixed(1)} s`);
const profileDir = fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-bench-gpu-'));
let failed = false;
try {
  // 1. Chromium as it starts by default: no shader-f16 on Linux + NVIDIA --------------------------------
  // Step 1 installs the pack; with --f16-install and only step 2's images asked for, step 2 does.
  const step1 = !(o['f16-install'] && o.images && !o.images.split(',').some((n) => n.startsWith('f32-')));
  if (step1) await withBrowser('default', [], async (b, sampler) => {
    const plan = await h.api(b.page, { type: 'planPack', endpoint: hub.url, repo: REPO, revision: 'main' });
    if (plan?.type !== 'packPlan') throw new Error(`planPack: ${JSON.stringify(plan, h.shorten)}`);
    report.plan = { totalBytes: plan.totalBytes, conversion: plan.conversion ?? null };
    log(`plan: ${JSON.stringify(report.plan)}`);
    report.install = await install(b, sampler);
    await keepLoaded(b, KEEP_LOADED_S);
    await image(b, sampler, { label: 'cold, float32 conversion', prompt: PROMPTS.a, size: SIZE, seed: '42', trace: true, name: 'f32-cold' });
    await image(b, sampler, { label: 'repeat, float32 conversion', prompt: PROMPTS.a, size: SIZE, seed: '43', name: 'f32-repeat' });
    // Int8 activations in every MatMulNBits (`accuracyLevel` 4), cold: against the cold image above.
    await keepLoaded(b, 0);
    await keepLoaded(b, KEEP_LOADED_S);
    await image(b, sampler, { label: 'accuracy level 4: cold, float32 conversion', prompt: PROMPTS.a, size: SIZE, seed: '42', trace: true, accuracyLevel: 4, name: 'f32-acc4' });
    await image(b, sampler, { label: 'profiled cold, float32 conversion', prompt: PROMPTS.f, size: SIZE, seed: '42', profile: true, name: 'f32-profile' });
    await keepLoaded(b, 0);
    await keepLoaded(b, KEEP_LOADED_S);
    await image(b, sampler, { label: `cold ${o.large}x${o.large}, float32 conversion`, prompt: PROMPTS.c, size: Number(o.large), seed: '42', name: 'f32-large' });
    await keepLoaded(b, 0);
    await keepLoaded(b, KEEP_LOADED_S);
    await image(b, sampler, { label: `ORT's buffer cache: cold ${o.large}x${o.large}, float32 conversion`, prompt: PROMPTS.l, size: Number(o.large), seed: '42', keepBuffers: false, name: 'f32-large-bucket' });
    await keepLoaded(b, 0);
    await keepLoaded(b, KEEP_LOADED_S);
    await image(b, sampler, { label: 'keepBuffers: cold, float32 conversion', prompt: PROMPTS.n, size: SIZE, seed: '42', keepBuffers: true, name: 'f32-keep' });
    await image(b, sampler, { label: 'keepBuffers: repeat, float32 conversion', prompt: PROMPTS.n, size: SIZE, seed: '43', keepBuffers: true, name: 'f32-keep-repeat' });
    await keepLoaded(b, 0);
    await keepLoaded(b, KEEP_LOADED_S);
    await withoutStoredBlock32(b, true, () => image(b, sampler, { label: 're-blocked while loading: cold, float32 conversion', prompt: PROMPTS.p, size: SIZE, seed: '42', name: 'f32-atload' }));
    await fusedAttention(b, sampler, { prompt: PROMPTS.a, tag: ', float32 conversion', prefix: 'f32' });
  });

  // 2. Chromium with shader-f16 ------------------------------------------------------------------------
  const f16Args = o['f16-args'].split(/\s+/).filter(Boolean);
  const unsafe = f16Args.map((a) => (a.startsWith('--enable-dawn-features=') ? `${a},allow_unsafe_apis` : a));
  let ran = null;
  for (const [name, args] of [['f16', f16Args], ['f16-unsafe', unsafe]]) {
    if (ran || (name === 'f16-unsafe' && unsafe.join() === f16Args.join())) continue;
    await withBrowser(name, args, async (b, sampler, adapter) => {
      const backend = adapter?.shaderF16 ? undefined : o['f16-backend'];
      if (!adapter?.shaderF16 && !backend) return log(`${name}: the adapter has no shader-f16 with ${args.join(' ')}`);
      if (!adapter?.shaderF16 && name === 'f16' && unsafe.join() !== f16Args.join()) return log(`${name}: no shader-f16; trying allow_unsafe_apis`);
      ran = { args, backend };
      const extra = backend ? { backend } : {};
      const tag = backend ? ` (${backend}: no shader-f16)` : '';
      await keepLoaded(b, 0);
      if (o['f16-install']) {
        // As a user whose GPU has shader-f16 installs it: no conversion, and the float16 graphs
        // re-blocked to 32 at install (step 1's install stored the float32 conversion's).
        const deleted = step1 ? await h.api(b.page, { type: 'deletePack' }) : { type: 'done' };
        if (deleted?.type !== 'done') throw new Error(`deletePack: ${JSON.stringify(deleted)}`);
        report.installF16 = await install(b, sampler);
      }
      // The browser compiles each shader once: a first image, so that neither side below pays for it.
      await image(b, sampler, { label: `warm-up${tag}`, prompt: PROMPTS.e, size: SIZE, seed: '42', name: 'f16-warm-up', ...extra });
      if (!backend) await formsStoredAfter(b, `warm-up${tag}`);
      const baseline = { ...extra, loadAhead: false };
      await image(b, sampler, { label: `baseline: cold${tag}`, prompt: PROMPTS.d, size: SIZE, seed: '42', name: 'base-cold', ...baseline });
      await image(b, sampler, { label: `baseline: repeat${tag}`, prompt: PROMPTS.d, size: SIZE, seed: '43', name: 'base-repeat', ...baseline });
      await keepLoaded(b, KEEP_LOADED_S);
      await image(b, sampler, { label: `cold${tag}`, prompt: PROMPTS.b, size: SIZE, seed: '42', trace: true, name: 'f16-cold', ...extra });
      await image(b, sampler, { label: `repeat: same prompt, new seed${tag}`, prompt: PROMPTS.b, size: SIZE, seed: '43', trace: true, name: 'f16-repeat', ...extra });
      await image(b, sampler, { label: `batch of ${o.batch}${tag}`, prompt: PROMPTS.b, size: SIZE, seed: '44', count: Number(o.batch), name: 'f16-batch', ...extra });
      // Cold: nothing loaded.
      await keepLoaded(b, 0);
      await keepLoaded(b, KEEP_LOADED_S);
      await image(b, sampler, { label: `cold ${o.large}x${o.large}${tag}`, prompt: PROMPTS.c, size: Number(o.large), seed: '42', name: 'f16-large', ...extra });
      // The graphs re-blocked to 32 while they load, as for a pack an older version installed: the cold
      // image again, against the form stored at install above.
      await keepLoaded(b, 0);
      await keepLoaded(b, KEEP_LOADED_S);
      await withoutStoredBlock32(b, !backend, () => image(b, sampler, { label: `re-blocked while loading: cold${tag}`, prompt: PROMPTS.o, size: SIZE, seed: '42', name: 'f16-atload', ...extra }));
      // Int8 activations in every MatMulNBits (`accuracyLevel` 4): the cold and repeat images again.
      await keepLoaded(b, 0);
      await keepLoaded(b, KEEP_LOADED_S);
      const acc4 = { ...extra, accuracyLevel: 4 };
      await image(b, sampler, { label: `accuracy level 4: cold${tag}`, prompt: PROMPTS.b, size: SIZE, seed: '42', trace: true, name: 'f16-acc4', ...acc4 });
      await image(b, sampler, { label: `accuracy level 4: repeat${tag}`, prompt: PROMPTS.b, size: SIZE, seed: '43', name: 'f16-acc4-repeat', ...acc4 });
      await image(b, sampler, { label: `profiled cold${tag}`, prompt: PROMPTS.g, size: SIZE, seed: '42', profile: true, name: 'f16-profile', ...extra });
      // The large image's steps, where the quadratic attention weighs most: level 4, then profiled.
      await keepLoaded(b, 0);
      await keepLoaded(b, KEEP_LOADED_S);
      await image(b, sampler, { label: `accuracy level 4: cold ${o.large}x${o.large}${tag}`, prompt: PROMPTS.j, size: Number(o.large), seed: '42', name: 'f16-large-acc4', ...acc4 });
      await image(b, sampler, { label: `profiled cold ${o.large}x${o.large}${tag}`, prompt: PROMPTS.k, size: Number(o.large), seed: '42', profile: true, name: 'f16-large-profile', ...extra });
      // ORT keeping every GPU buffer between runs, not only those up to 160 MiB (`keepBuffers`), at
      // --size; at --large the extension keeps them by default, so there the other side is ORT's own.
      await keepLoaded(b, 0);
      await keepLoaded(b, KEEP_LOADED_S);
      const keep = { ...extra, keepBuffers: true };
      await image(b, sampler, { label: `keepBuffers: cold${tag}`, prompt: PROMPTS.m, size: SIZE, seed: '42', name: 'f16-keep', ...keep });
      await image(b, sampler, { label: `keepBuffers: repeat${tag}`, prompt: PROMPTS.m, size: SIZE, seed: '43', name: 'f16-keep-repeat', ...keep });
      await keepLoaded(b, 0);
      await keepLoaded(b, KEEP_LOADED_S);
      await image(b, sampler, { label: `ORT's buffer cache: cold ${o.large}x${o.large}${tag}`, prompt: PROMPTS.l, size: Number(o.large), seed: '42', name: 'f16-large-bucket', ...extra, keepBuffers: false });
      await fusedAttention(b, sampler, { prompt: PROMPTS.b, tag, prefix: 'f16', extra });
    });
  }
  if (!ran) log('no image with shader-f16: skipped (give --f16-backend wasm to run these images on the CPU)');

  // 2b. Another ONNX Runtime Web ------------------------------------------------------------------------
  if (o['ort-alt'] && ran) {
    const alt = path.resolve(o['ort-alt']);
    report.ortAlt = JSON.parse(fs.readFileSync(path.join(alt, 'package.json'), 'utf8')).version;
    report.ort = JSON.parse(fs.readFileSync(path.join(h.ROOT, 'package.json'), 'utf8')).dependencies['onnxruntime-web'];
    await withOrt(path.join(alt, 'dist'), () => withBrowser('f16-ort-alt', ran.args, async (b, sampler) => {
      const extra = ran.backend ? { backend: ran.backend } : {};
      const tag = ` (ORT ${report.ortAlt})`;
      await keepLoaded(b, 0);
      // Prompts of their own: the embedding cache (keyed by prompt and graphs, not ORT) holds step 2's.
      await image(b, sampler, { label: `warm-up${tag}`, prompt: PROMPTS.h, size: SIZE, seed: '42', name: 'alt-warm-up', ...extra });
      await keepLoaded(b, KEEP_LOADED_S);
      await image(b, sampler, { label: `cold${tag}`, prompt: PROMPTS.i, size: SIZE, seed: '42', name: 'alt-cold', ...extra });
      await image(b, sampler, { label: `repeat: same prompt, new seed${tag}`, prompt: PROMPTS.i, size: SIZE, seed: '43', name: 'alt-repeat', ...extra });
      await image(b, sampler, { label: `profiled cold${tag}`, prompt: PROMPTS.g, size: SIZE, seed: '42', profile: true, name: 'alt-profile', ...extra });
    }));
  }

  // 3. the independent reference --------------------------------------------------------------------------
  if (o.reference) await compareAll();
} catch (e) {
  failed = true;
  console.error(`bench gpu: ${e.stack ?? e}`);
} finally {
  await hub.close();
  report.gpuMemory = await gpuMemory.stop();
  fs.rmSync(profileDir, { recursive: true, force: true });
}
printReport();
fs.writeFileSync(path.join(OUT, 'bench-gpu.json'), JSON.stringify(report, null, 1) + '\n');
process.exit(failed || report.images.some((i) => i.outcome !== 'result') || report.comparisons.some((c) => !c.asExpected) ? 1 : 0);

// ---------------------------------------------------------------------------------------------------

/** Launches Chromium on the bench's profile with `args` added, samples its memory, runs `fn`, closes it. */
async function withBrowser(name, args, fn) {
  const b = await h.launch({ profileDir, args });
  const sampler = startSampler(profileDir, Number(o['interval-ms']));
  try {
    const version = b.context.browser()?.version();
    const adapter = await adapterReport(b.page);
    report.launches[name] = { args, version, adapter };
    log(`${name}: Chromium ${version}, flags ${[...h.webgpuArgs(), ...args].join(' ')}; adapter ${JSON.stringify(adapter)}`);
    await collectProgress(b.page);
    await fn(b, sampler, adapter);
  } finally {
    await sampler.stop();
    await b.close({ keepProfile: true });
  }
}

/** Records in the page when each job's result events arrive (the page's clock is Node's). */
function recordResultTimes(page) {
  return page.evaluate(() => {
    if (window.__resultTimes) return;
    window.__resultTimes = {};
    chrome.runtime.onMessage.addListener((m) => {
      if (m?.type === 'result') (window.__resultTimes[m.job] ??= []).push(Date.now());
      return false;
    });
  });
}

/** Runs `fn` with the stage workers' ORT files (the JSPI bundle and its wasm) taken from `ortDist`, then
 * puts the extension's own back. */
async function withOrt(ortDist, fn) {
  const files = ['ort.jspi.bundle.min.mjs', 'ort-wasm-simd-threaded.jspi.wasm'];
  const own = path.join(h.DIST, 'ort');
  const saved = fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-bench-ort-'));
  for (const f of files) fs.copyFileSync(path.join(own, f), path.join(saved, f));
  try {
    for (const f of files) fs.copyFileSync(path.join(ortDist, f), path.join(own, f));
    await fn();
  } finally {
    for (const f of files) fs.copyFileSync(path.join(saved, f), path.join(own, f));
    fs.rmSync(saved, { recursive: true, force: true });
  }
}

/** Sets `keepLoaded` (0 also unloads whatever is loaded); checks the reply. */
async function keepLoaded(b, seconds) {
  let reply = await h.api(b.page, { type: 'keepLoaded', seconds });
  // A job whose result has arrived may still be finishing (seen under load in CI): the stages it holds
  // are unloaded when it ends, so 0 waits for that.
  for (const until = Date.now() + 60_000; seconds === 0 && reply?.loaded?.length && Date.now() < until;) {
    await h.sleep(250);
    reply = await h.api(b.page, { type: 'keepLoaded' });
  }
  if (reply?.type !== 'keepLoaded' || reply.seconds !== seconds || (seconds === 0 && reply.loaded.length)) {
    throw new Error(`keepLoaded ${seconds}: ${JSON.stringify(reply)}`);
  }
}

/** What the stage workers will get: the first adapter by power preference (as gpu_adapter.js asks), and
 * whether ORT's device there gets subgroup matrices (where the adapter offers them). */
function adapterReport(page) {
  return page.evaluate(async (url) => {
    const SUBGROUP_MATRIX = 'chromium-experimental-subgroup-matrix';
    if (!navigator.gpu) return null;
    for (const powerPreference of ['high-performance', undefined, 'low-power']) {
      const a = await navigator.gpu.requestAdapter({ powerPreference });
      if (!a) continue;
      const i = a.info ?? {};
      return {
        powerPreference: powerPreference ?? 'default',
        vendor: i.vendor, architecture: i.architecture, description: i.description,
        shaderF16: a.features.has('shader-f16'), subgroups: a.features.has('subgroups'),
        maxBufferSize: a.limits.maxBufferSize, maxStorageBufferBindingSize: a.limits.maxStorageBufferBindingSize,
        subgroupMatrix: a.features.has(SUBGROUP_MATRIX) ? await ortGetsSubgroupMatrix(a) : 'not offered',
      };
    }
    return null;

    async function ortGetsSubgroupMatrix(a) {
      const { requestDeviceOrtCanUse } = await import(url);
      const requiredFeatures = [SUBGROUP_MATRIX, ...['shader-f16', 'subgroups'].filter((f) => a.features.has(f))];
      const device = await requestDeviceOrtCanUse(a, { requiredFeatures });
      const kept = device.features.has(SUBGROUP_MATRIX);
      device.destroy();
      return kept ? 'used (its WGSL compiles)' : 'left out (ORT\'s WGSL does not compile)';
    }
  }, h.gpuAdapterUrl());
}

/**
 * Waits (at most 5 min) until the forms re-blocked to 32 of the graphs `label`'s image re-blocked while
 * loading are stored with the pack, as the extension does after such a job: without `--f16-install`
 * the install stored the float32 conversion's forms only, and the images after this one are to load
 * the float16 graphs' as a user's would.
 */
async function formsStoredAfter(b, label) {
  const unchanged = (await h.packState(b.page)).installed.block32?.unchanged ?? [];
  const reblocked = report.stages
    .filter((x) => x.image === label && x.graphFile && !x.graphFile.includes('.b32.') && !unchanged.includes(x.graphFile))
    .map((x) => x.graphFile);
  const t0 = Date.now();
  for (; Date.now() - t0 < 300_000; await h.sleep(500)) {
    const stored = (await h.packState(b.page)).installed.block32?.graphs.map((g) => g.graph) ?? [];
    if (reblocked.every((g) => stored.includes(g))) break;
  }
  if (reblocked.length) log(`stored forms of ${reblocked.join(', ')} after ${((Date.now() - t0) / 1000).toFixed(1)} s`);
}

/** Records in the page when each install state is first reported. */
function collectProgress(page) {
  return page.evaluate(() => {
    window.__installStates = {};
    chrome.runtime.onMessage.addListener((m) => {
      if (m?.type === 'packProgress') window.__installStates[m.state] ??= Date.now();
      return false;
    });
  });
}

async function install(b, sampler) {
  await h.sleep(IDLE_MS);
  const idle = medianBetween(sampler.history, Date.now() - IDLE_MS, Date.now());
  const t = Date.now();
  const reply = await h.startInstall(b.page, hub, REPO);
  if (reply?.type !== 'installStarted') throw new Error(`installPack: ${JSON.stringify(reply)}`);
  const installed = await h.waitForInstall(b.page, TIMEOUT_MS);
  const end = Date.now();
  const states = await b.page.evaluate(() => window.__installStates);
  const tree = await h.opfsTree(b.page);
  const converted = Object.keys(tree).filter((p) => /\.f32(\.onnx|-\d{5}\.data)$/.test(p));
  const downloadEnd = states.converting ?? states.installing ?? end;
  const peak = peakBetween(sampler.history, t, end).peak;
  const r = {
    bytes: installed.bytes,
    seconds: (end - t) / 1000,
    downloadSeconds: (downloadEnd - t) / 1000,
    downloadMBps: installed.bytes / ((downloadEnd - t) / 1000) / 1e6,
    conversionSeconds: states.converting ? ((states.installing ?? end) - states.converting) / 1000 : null,
    extraDiskBytes: converted.reduce((n, p) => n + tree[p], 0),
    // From the end of the conversion (or the download) to the pack installed: the graphs re-blocked to
    // 32 and stored, then the swap.
    block32Seconds: states.installing ? (end - states.installing) / 1000 : null,
    block32Bytes: (await h.packState(b.page)).installed.block32?.graphs.reduce((n, g) => n + g.bytes, 0) ?? 0,
    rendererPeakAboveIdle: (peak.extension ?? 0) - (idle.extension ?? 0),
  };
  log(`installed ${(r.bytes / 1e9).toFixed(2)} GB in ${r.seconds.toFixed(1)} s: download and verify ${r.downloadSeconds.toFixed(1)} s (${r.downloadMBps.toFixed(0)} MB/s), conversion ${r.conversionSeconds?.toFixed(1) ?? '-'} s, extra disk ${mb(r.extraDiskBytes)} MB; re-blocked to 32 and stored ${r.block32Seconds?.toFixed(1) ?? '-'} s, ${mb(r.block32Bytes)} MB`);
  return r;
}

/**
 * Runs `fn` with the installed pack's record as a version before the install-time re-blocking
 * wrote it (no `block32`), so that the stage workers re-block the graphs while they load. The
 * extension then stores those forms with the pack by itself, in the background: on WebGPU (`webgpu`;
 * the wasm backend re-blocks nothing) waited for, so that it does not weigh on the next image, and
 * logged; then the record is put back as it was.
 */
async function withoutStoredBlock32(b, webgpu, fn) {
  const state = await h.packState(b.page);
  const stored = state.installed.block32;
  delete state.installed.block32;
  await h.opfsWrite(b.page, 'packs/state.json', JSON.stringify(state));
  try {
    if (!(await fn()) || !webgpu) return;
    const t = Date.now();
    let record;
    while (!(record = (await h.packState(b.page)).installed.block32) && Date.now() - t < 300_000) await h.sleep(250);
    log(`the extension stored ${record ? record.graphs.map((g) => g.onnx).join(', ') : 'nothing'} with the pack after that image, within ${((Date.now() - t) / 1000).toFixed(1)} s of its result`);
  } finally {
    state.installed.block32 = stored;
    await h.opfsWrite(b.page, 'packs/state.json', JSON.stringify(state));
  }
}

/**
 * The transformer's attention fused into `MultiHeadAttention` (ORT's flash attention where the adapter
 * has subgroups) rather than run as exported, node by node (the default): a cold --size image (prompt
 * Q) and its repeat, the inputs of the cold image of the step again (its `prompt`, seed 42, traced: the
 * first transformer outputs are compared), and a cold --large image (prompt R). Nothing loaded before
 * each cold one.
 */
async function fusedAttention(b, sampler, { prompt, tag, prefix, extra = {} }) {
  const fused = { ...extra, fuseAttention: true };
  await keepLoaded(b, 0);
  await keepLoaded(b, KEEP_LOADED_S);
  await image(b, sampler, { label: `attention fused: cold${tag}`, prompt: PROMPTS.q, size: SIZE, seed: '42', name: `${prefix}-fused`, ...fused });
  await image(b, sampler, { label: `attention fused: repeat${tag}`, prompt: PROMPTS.q, size: SIZE, seed: '43', name: `${prefix}-fused-repeat`, ...fused });
  await image(b, sampler, { label: `attention fused: the cold image's inputs${tag}`, prompt, size: SIZE, seed: '42', trace: true, name: `${prefix}-fused-same`, ...fused });
  await keepLoaded(b, 0);
  await keepLoaded(b, KEEP_LOADED_S);
  await image(b, sampler, { label: `attention fused: cold ${o.large}x${o.large}${tag}`, prompt: PROMPTS.r, size: Number(o.large), seed: '42', name: `${prefix}-large-fused`, ...fused });
}

/**
 * One generation request; records its wall time, each image's timings and the stages' memory. Its
 * report entry when it made its images; nothing when it was left out or failed.
 */
async function image(b, sampler, { label, name, size, count = 1, ...rest }) {
  if (o.images && !o.images.split(',').includes(name)) return void log(`${label}: left out (--images)`);
  if (!size) return void log(`${label}: left out (--large 0)`);
  await h.sleep(IDLE_MS);
  const idle = medianBetween(sampler.history, Date.now() - IDLE_MS, Date.now());
  const gpuIdle = gpuMemory.median(Date.now() - IDLE_MS, Date.now());
  const req = { width: size, height: size, steps: STEPS, count, ...rest };
  log(`${label}: ${size}x${size}, ${STEPS} steps, ${count} image(s) ...`);
  await h.collectEvents(b.page);
  await recordResultTimes(b.page);
  const t = Date.now();
  const reply = await h.api(b.page, { type: 'generate', ...req });
  if (reply?.type !== 'jobStarted') throw new Error(`generate: ${JSON.stringify(reply)}`);
  const results = [];
  let end;
  for (;;) {
    end = await h.waitForJobEnd(b.page, reply.job, TIMEOUT_MS, TIMEOUT_MS);
    const evs = (await h.events(b.page)).filter((e) => e.job === reply.job && e.type === 'result');
    if (end.type !== 'result' || evs.length >= count) {
      results.push(...evs);
      break;
    }
    await h.sleep(250);
  }
  // When the page got the last result: the polling above lags by up to its interval, more as events pile up.
  const received = await b.page.evaluate((job) => window.__resultTimes[job]?.at(-1), reply.job);
  const tEnd = received ?? Date.now();
  const wallS = (tEnd - t) / 1000;
  const entry = { label, name, size, steps: STEPS, count, wallS, outcome: results.length === count ? 'result' : end.type, error: end.error };
  report.images.push(entry);
  if (entry.outcome !== 'result') return void log(`${label}: ${entry.outcome} after ${wallS.toFixed(1)} s: ${end.error ?? ''}`);
  const last = results.at(-1);
  entry.totalMs = last.timings.totalMs;
  results.forEach((r, i) => h.writeResult(count > 1 ? `${name}-${i}` : name, r, OUT));
  const stages = last.timings.stages;
  if (rest.profile) entry.profile = Object.fromEntries(stages.filter((st) => st.profile).map((st) => [st.stage, st.profile]));
  stages.forEach((st) => {
    if (!st.workerCreatedAtMs) return report.stages.push({ image: label, stage: st.stage, cached: true });
    // From its worker's creation (a resident stage's: its task) to the end of its work. A stage loads
    // while the one before it runs, so part of this is waiting for its input.
    const workerStartMs = st.resident ? 0 : st.taskAtMs - st.workerCreatedAtMs;
    const span = [st.taskAtMs - workerStartMs, st.finishedAtMs || tEnd];
    const peak = peakBetween(sampler.history, ...span).peak;
    const gpu = gpuMemory.peak(...span);
    report.stages.push({
      image: label,
      stage: st.stage,
      graphFile: st.graphFile,
      fusedAttention: st.fusedAttention,
      workerStartMs,
      prepareMs: st.startedAtMs - st.taskAtMs,
      // Checking the stored re-blocked form, while the session is made: part of `sessionCreateMs`.
      storedFormCheckMs: st.storedFormCheckMs ?? 0,
      sessionCreateMs: st.sessionCreateMs,
      resident: st.resident,
      runsMs: st.runsMs,
      wallMs: span[1] - span[0],
      waitMs: span[1] - span[0] - workerStartMs - (st.startedAtMs - st.taskAtMs) - st.sessionCreateMs - st.runsMs.reduce((a, x) => a + x, 0),
      rendererPeakAboveIdle: (peak.extension ?? 0) - (idle.extension ?? 0),
      gpuProcessPeakAboveIdle: (peak.gpu ?? 0) - (idle.gpu ?? 0),
      gpuMemoryPeak: gpu,
      gpuMemoryAboveIdle: gpu == null || gpuIdle == null ? null : gpu - gpuIdle,
    });
  });
  // What is measured so far, in case the machine is taken back before the end.
  fs.writeFileSync(path.join(OUT, 'bench-gpu.json'), JSON.stringify(report, null, 1) + '\n');
  log(`${label}: ${wallS.toFixed(1)} s wall (${s(entry.totalMs)} s in the extension)`);
  return entry;
}

/** Reference runs (concurrently), then each comparison. */
async function compareAll() {
  const cold = path.join(OUT, 'f16-cold.json');
  const checks = [
    { name: 'f32-cold', what: 'cold image, float32 conversion, vs onnxruntime CPU on the float16 graphs', tol: o['tolerance-f32'], expect: 'pass' },
    { name: 'f16-cold', what: 'cold image, shader-f16, vs onnxruntime CPU on the float16 graphs', tol: o['tolerance-f16'], expect: 'pass' },
  ].filter((c) => fs.existsSync(path.join(OUT, `${c.name}.json`)));
  if (fs.existsSync(cold) && fs.existsSync(path.join(OUT, 'f16-repeat.json'))) {
    // One input perturbed: the noise of seed 43 (the repeat's) instead of 42.
    const doc = JSON.parse(fs.readFileSync(cold, 'utf8'));
    doc.trace.noise = JSON.parse(fs.readFileSync(path.join(OUT, 'f16-repeat.json'), 'utf8')).trace.noise;
    fs.writeFileSync(path.join(OUT, 'f16-cold-perturbed.json'), JSON.stringify(doc));
    checks.push({ name: 'f16-cold-perturbed', png: 'f16-cold', what: 'the same, the reference fed the noise of seed 43 instead of 42', tol: o['tolerance-f16'], expect: 'fail' });
  }
  // Accuracy level 4 against the reference of the same prompt and seed (the same trace): measured, not
  // expected either way.
  const acc4 = [
    { name: 'f32-acc4', ref: 'f32-cold', what: 'cold image, float32 conversion, accuracy level 4, vs the same reference', tol: o['tolerance-f32'], expect: 'measure' },
    { name: 'f16-acc4', ref: 'f16-cold', what: 'cold image, shader-f16, accuracy level 4, vs the same reference', tol: o['tolerance-f16'], expect: 'measure' },
    // The fused float16 image was within the tolerance on the H200; the float32 one on SwiftShader at its
    // edge (2 levels), so measured (its first transformer output is checked below).
    { name: 'f32-fused-same', ref: 'f32-cold', what: 'the cold image\'s inputs, float32 conversion, attention fused, vs the same reference', tol: o['tolerance-f32'], expect: 'measure' },
    { name: 'f16-fused-same', ref: 'f16-cold', what: 'the cold image\'s inputs, shader-f16, attention fused, vs the same reference', tol: o['tolerance-f16'], expect: 'pass' },
  ].filter((c) => fs.existsSync(path.join(OUT, `${c.name}.png`)) && checks.some((x) => x.name === c.ref));
  log(`reference runs: ${checks.map((c) => c.name).join(', ')} (onnxruntime CPU, ${o.threads} threads each) ...`);
  await Promise.all(checks.map(async (c) => {
    const t = Date.now();
    const args = ['tests/reference/reference.py', '--pack', PACK, '--trace', path.join(OUT, `${c.name}.json`), '--out', path.join(OUT, `${c.name}.ref.png`), '--threads', o.threads];
    const r = await h.run('python3', args, { timeoutMs: TIMEOUT_MS });
    c.referenceS = (Date.now() - t) / 1000;
    c.referenceError = r.code === 0 ? null : (r.stderr || r.stdout).slice(-2000);
  }));
  for (const c of [...checks, ...acc4]) {
    const png = path.join(OUT, `${c.png ?? c.name}.png`);
    const ref = c.ref ? checks.find((x) => x.name === c.ref) : c;
    c.referenceS ??= 0;
    const r = ref.referenceError ? null : await h.run('python3', ['tests/reference/compare.py', png, path.join(OUT, `${ref.name}.ref.png`), '--tol', c.tol, '--max-pixels', o['max-pixels']]);
    const outcome = r?.code === 0 ? 'pass' : r?.code === 1 ? 'fail' : 'error';
    const asExpected = c.expect === 'measure' ? outcome !== 'error' : outcome === c.expect;
    const entry = { ...c, outcome, asExpected, output: (r?.stdout ?? '').trim() || ref.referenceError };
    report.comparisons.push(entry);
    log(`${c.what}: ${outcome} (expected ${c.expect}); reference ${c.referenceS.toFixed(0)} s; ${entry.output}`);
  }
  for (const [graph, fused] of [['f32-cold', 'f32-fused-same'], ['f16-cold', 'f16-fused-same']]) compareVelocities(graph, fused);
}

/** The first transformer output of two images made from the same inputs (traced): cosine at least 0.999. */
function compareVelocities(a, b) {
  const read = (name) => {
    const file = path.join(OUT, `${name}.json`);
    const b64 = fs.existsSync(file) ? JSON.parse(fs.readFileSync(file, 'utf8')).trace?.firstVelocity : null;
    if (!b64) return null;
    const bytes = Buffer.from(b64, 'base64');
    return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4);
  };
  const [x, y] = [read(a), read(b)];
  if (!x || !y) return;
  let [dot, xx, yy, maxAbs] = [0, 0, 0, 0];
  for (let i = 0; i < x.length; i++) {
    dot += x[i] * y[i];
    xx += x[i] * x[i];
    yy += y[i] * y[i];
    maxAbs = Math.max(maxAbs, Math.abs(x[i] - y[i]));
  }
  const cosine = dot / Math.sqrt(xx * yy);
  const outcome = x.length === y.length && cosine >= 0.999 ? 'pass' : 'fail';
  const output = `cosine ${cosine.toFixed(6)}, max abs difference ${maxAbs.toExponential(2)} over ${x.length} values`;
  report.comparisons.push({ name: `${b}-velocity`, what: `the first transformer output of ${b} against ${a}'s`, tol: 'cosine 0.999', expect: 'pass', outcome, asExpected: outcome === 'pass', referenceS: 0, output });
  log(`the first transformer output of ${b} against ${a}: ${outcome}; ${output}`);
}

function printReport() {
  const l = report.launches;
  const any = l.f16 ?? l['f16-unsafe'] ?? l.default;
  console.log(`\nbench gpu: Chromium ${any?.version ?? '?'}, ${os.cpus().length} cores, ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB; pack ${Object.entries(report.pack).map(([k, v]) => `${k} ${(v / 1e9).toFixed(2)} GB`).join(', ')}`);
  for (const [name, x] of Object.entries(l)) console.log(`  ${name}: ${JSON.stringify(x.adapter)} (flags: ${x.args.join(' ') || 'none added'})`);
  if (report.install) {
    const i = report.install;
    console.log(`install: ${(i.bytes / 1e9).toFixed(2)} GB in ${i.seconds.toFixed(1)} s; download and verify ${i.downloadSeconds.toFixed(1)} s = ${i.downloadMBps.toFixed(0)} MB/s; conversion ${i.conversionSeconds?.toFixed(1) ?? '-'} s, extra disk ${mb(i.extraDiskBytes)} MB; re-blocked and stored ${i.block32Seconds?.toFixed(1) ?? '-'} s, ${mb(i.block32Bytes)} MB; fake Hub hashing ${report.hubHashS.toFixed(1)} s`);
  }
  if (report.installF16) {
    const i = report.installF16;
    console.log(`install with shader-f16: ${(i.bytes / 1e9).toFixed(2)} GB in ${i.seconds.toFixed(1)} s; download and verify ${i.downloadSeconds.toFixed(1)} s; re-blocked and stored ${i.block32Seconds?.toFixed(1) ?? '-'} s, ${mb(i.block32Bytes)} MB`);
  }
  console.log('\nimages (wall: from the request to the last result event):');
  h.printTable(['image', 'size', 'count', 'wall s', 'in extension s', 'outcome'], report.images.map((i) => [i.label, `${i.size}x${i.size}`, i.count, i.wallS.toFixed(2), s(i.totalMs), i.outcome]));
  const wall = (name) => report.images.find((i) => i.name === name && i.outcome === 'result')?.wallS;
  /** [what, image a, image b] -> [what, a s, b s, a / b], for the pairs where both images were made. */
  const ratioRows = (pairs) => pairs
    .filter(([, a, b]) => wall(a) && wall(b))
    .map(([what, a, b]) => [what, wall(a).toFixed(2), wall(b).toFixed(2), (wall(a) / wall(b)).toFixed(2)]);
  const acc4 = ratioRows([['cold, float32 conversion', 'f32-cold', 'f32-acc4'], ['cold', 'f16-cold', 'f16-acc4'], ['repeat', 'f16-repeat', 'f16-acc4-repeat'], [`cold ${o.large}x${o.large}`, 'f16-large', 'f16-large-acc4']]);
  if (acc4.length) {
    console.log('\naccuracy level 4 (int8 activations in every MatMulNBits) against the pack as it is:');
    h.printTable(['image', 'as it is s', 'level 4 s', 'as it is / level 4'], acc4);
  }
  const keep = ratioRows([['cold', 'f16-cold', 'f16-keep'], ['repeat', 'f16-repeat', 'f16-keep-repeat'], [`cold ${o.large}x${o.large}`, 'f16-large-bucket', 'f16-large'],
    ['cold, float32 conversion', 'f32-cold', 'f32-keep'], ['repeat, float32 conversion', 'f32-repeat', 'f32-keep-repeat'],
    [`cold ${o.large}x${o.large}, float32 conversion`, 'f32-large-bucket', 'f32-large']]);
  if (keep.length) {
    console.log(`\nkeepBuffers (ORT keeps every GPU buffer between runs; the extension's default above 512x512) against ORT's cache (those up to 160 MiB):`);
    h.printTable(['image', "ORT's cache s", 'keepBuffers s', "ORT's cache / keepBuffers"], keep);
  }
  const fusion = ratioRows([['cold', 'f16-cold', 'f16-fused'], ['repeat', 'f16-repeat', 'f16-fused-repeat'], [`cold ${o.large}x${o.large}`, 'f16-large', 'f16-large-fused'],
    ['cold, float32 conversion', 'f32-cold', 'f32-fused'], ['repeat, float32 conversion', 'f32-repeat', 'f32-fused-repeat'],
    [`cold ${o.large}x${o.large}, float32 conversion`, 'f32-large', 'f32-large-fused']]);
  if (fusion.length) {
    console.log('\nthe attention as exported, node by node (the default), against fused into MultiHeadAttention:');
    h.printTable(['image', 'as exported s', 'fused s', 'as exported / fused'], fusion);
  }
  const stored = ratioRows([['cold', 'f16-atload', 'f16-cold'], ['cold, float32 conversion', 'f32-atload', 'f32-cold']]);
  if (stored.length) {
    console.log('\nthe graphs re-blocked to 32 while they load (a pack installed without them) against the form stored at install:');
    h.printTable(['image', 'while loading s', 'stored s', 'while loading / stored'], stored);
  }
  const ratios = ratioRows([['cold', 'base-cold', 'f16-cold'], ['repeat', 'base-repeat', 'f16-repeat']]);
  report.ratios = Object.fromEntries(ratios.map(([what, , , x]) => [what, Number(x)]));
  if (ratios.length) {
    console.log('\nagainst the baseline of this run (one stage loaded at a time, nothing kept loaded):');
    h.printTable(['image', 'baseline s', 'now s', 'baseline / now'], ratios);
  }
  const f32Ratios = ratioRows([['cold', 'f32-cold', 'f16-cold'], ['repeat', 'f32-repeat', 'f16-repeat'], [`cold ${o.large}x${o.large}`, 'f32-large', 'f16-large']]);
  if (f32Ratios.length) {
    console.log('\nwithout shader-f16 (float32 conversion) against with it:');
    h.printTable(['image', 'float32 s', 'float16 s', 'float32 / float16'], f32Ratios);
  }
  const altRatios = ratioRows([['cold', 'f16-cold', 'alt-cold'], ['repeat', 'f16-repeat', 'alt-repeat'], ['profiled cold', 'f16-profile', 'alt-profile']]);
  if (altRatios.length) {
    console.log(`\nONNX Runtime Web ${report.ortAlt} against the extension's ${report.ort}:`);
    h.printTable(['image', `${report.ort} s`, `${report.ortAlt} s`, `${report.ort} / ${report.ortAlt}`], altRatios);
  }
  console.log('\nstages (s; memory MB: peak above the idle before the image; GPU memory: nvidia-smi, in use at the peak):');
  h.printTable(
    ['image', 'stage', 'fused', 'worker start', 'prepare', 'form check', 'create', 'runs', 'waiting', 'stage wall', 'renderer', 'GPU process', 'GPU memory', 'above idle'],
    report.stages.map((x) => (x.cached
      ? [x.image, x.stage, '-', 'cached', '-', '-', '-', '-', '-', '-', '-', '-', '-', '-']
      : [x.image, x.stage, x.fusedAttention ?? '-', s(x.workerStartMs), s(x.prepareMs), s(x.storedFormCheckMs), x.resident ? 'resident' : s(x.sessionCreateMs), x.runsMs.map(s).join(' '), s(x.waitMs), s(x.wallMs), mb(x.rendererPeakAboveIdle), mb(x.gpuProcessPeakAboveIdle), mb(x.gpuMemoryPeak), mb(x.gpuMemoryAboveIdle)])),
  );
  for (const i of report.images.filter((i) => i.profile)) printProfile(i);
  if (report.comparisons.length) {
    console.log('\ncomparisons with the independent reference (onnxruntime CPU):');
    h.printTable(['check', 'tolerance', 'expected', 'outcome', 'reference s', 'difference'], report.comparisons.map((c) => [c.name, c.tol, c.expect, c.outcome, c.referenceS.toFixed(0), c.output.split('\n')[0]]));
  }
}

/** Where the time of a profiled image went, per stage (ONNX Runtime's profile): session creation as the
 * stage measured it and as ORT did, each run's wall and GPU time (timestamp queries), and the kernels
 * that took the most GPU time. */
function printProfile(i) {
  const ms = (x) => x.toFixed(1);
  console.log(`\nprofile of "${i.label}" (ms; ORT's profiling on, so slower than the images above):`);
  const created = (stage) => report.stages.find((x) => x.image === i.label && x.stage === stage)?.sessionCreateMs;
  h.printTable(
    ['stage', 'create', 'ORT model loading', 'ORT session initialization', 'runs: wall / GPU'],
    Object.entries(i.profile).map(([stage, p]) => [stage, ms(created(stage) ?? 0), ms(p.modelLoadingMs), ms(p.sessionInitializationMs), p.runs.map((r) => `${ms(r.wallMs)} / ${ms(r.gpuMs)}`).join(', ')]),
  );
  for (const [stage, p] of Object.entries(i.profile)) {
    const gpu = p.kernels.reduce((a, k) => a + k.ms, 0);
    if (!gpu) continue;
    console.log(`${stage}: GPU ${ms(gpu)} ms over ${p.runs.length} run(s), by operator and program:`);
    h.printTable(['operator', 'program', 'dispatches', 'GPU ms', 'share'], p.kernels.slice(0, 12).map((k) => [k.op, k.program, k.dispatches, ms(k.ms), `${((100 * k.ms) / gpu).toFixed(1)} %`]));
  }
}

/**
 * The GPU's memory in use (bytes), from `nvidia-smi` every `intervalMs`; every query answers null where
 * there is no nvidia-smi (this machine).
 */
function startGpuMemorySampler(intervalMs) {
  const samples = [];
  let child = null;
  try {
    child = spawn('nvidia-smi', ['--query-gpu=memory.used', '--format=csv,noheader,nounits', `-lms=${intervalMs}`], { stdio: ['ignore', 'pipe', 'ignore'] });
    child.on('error', () => (child = null));
    let rest = '';
    child.stdout.on('data', (d) => {
      const lines = (rest + d).split('\n');
      rest = lines.pop();
      for (const line of lines) if (/^\d+/.test(line.trim())) samples.push({ t: Date.now(), bytes: Number(line.trim()) * 2 ** 20 });
    });
  } catch {
    child = null;
  }
  const between = (from, to) => samples.filter((x) => x.t >= from && x.t <= to).map((x) => x.bytes);
  return {
    peak: (from, to) => (between(from, to).length ? Math.max(...between(from, to)) : null),
    median(from, to) {
      const xs = between(from, to).sort((a, b) => a - b);
      return xs.length ? xs[Math.floor(xs.length / 2)] : null;
    },
    async stop() {
      child?.kill();
      return samples.length ? { samples: samples.length, peak: Math.max(...samples.map((x) => x.bytes)) } : null;
    },
  };
}
