// `cargo xtask run`: launch Chromium with the built extension (dist/), install a pack, optionally
// generate one image and write it.
//
//   node tests/e2e/run.mjs [--pack URL | --demo] [--prompt P --out F.png]
//        [--width W --height H --steps N --seed S --schedule NAME --backend webgpu|wasm]
//        [--profile DIR] [--fresh]
//
// Headed when $DISPLAY is set, otherwise headless (SwiftShader WebGPU). The browser profile lives in
// target/imagine-profile (so a downloaded pack survives runs) unless --profile or --fresh is given.

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from './harness.mjs';

const DEFAULT_PACK = 'https://huggingface.co/cgb/flux2-klein-4b-onnx-webgpu/resolve/main/';

const { values: o } = parseArgs({
  options: {
    pack: { type: 'string' },
    demo: { type: 'boolean', default: false },
    prompt: { type: 'string' },
    out: { type: 'string' },
    width: { type: 'string' },
    height: { type: 'string' },
    steps: { type: 'string' },
    seed: { type: 'string' },
    schedule: { type: 'string' },
    backend: { type: 'string' },
    trace: { type: 'boolean', default: false },
    profile: { type: 'string' },
    fresh: { type: 'boolean', default: false },
  },
});
if (o.demo && o.pack) fail('--demo and --pack exclude each other');
if (o.prompt !== undefined && !o.out) fail('--prompt needs --out F.png');
if (o.out && o.prompt === undefined) fail('--out needs --prompt');

function fail(msg) {
  console.error(`run: ${msg}`);
  process.exit(2);
}

const profileDir = o.fresh
  ? fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-run-'))
  : path.resolve(o.profile ?? path.join(h.ROOT, 'target/imagine-profile'));
fs.mkdirSync(profileDir, { recursive: true });

let server = null;
let baseUrl = o.pack ?? DEFAULT_PACK;
if (o.demo) {
  server = await h.servePack('f32');
  baseUrl = server.url;
  console.log(`run: serving tests/fixtures/packs/f32 at ${baseUrl}`);
}

console.log(`run: launching ${h.CHROMIUM} (${h.isHeadless() ? 'headless' : 'headed'}), profile ${profileDir}`);
const b = await h.launch({ profileDir });
console.log(`run: extension ${b.extensionId}: ${h.extensionUrl(b.extensionId, 'popup.html')}`);
let exitCode = 0;

const shutdown = async (code) => {
  await b.close();
  await server?.close();
  if (o.fresh) fs.rmSync(profileDir, { recursive: true, force: true });
  process.exit(code);
};
process.on('SIGINT', () => {
  console.log('\nrun: closing');
  shutdown(130);
});

try {
  await h.collectEvents(b.page);
  const status = await h.api(b.page, { type: 'packStatus' });
  // The demo server's port changes every run, so a demo pack is always reinstalled.
  if (!status?.installed || status.source !== baseUrl) {
    console.log(`run: installing pack from ${baseUrl}`);
    let last = 0;
    const progress = setInterval(async () => {
      const evs = await h.events(b.page).catch(() => []);
      const p = evs.filter((e) => e.type === 'packProgress').at(-1);
      if (p && Date.now() - last > 2000) {
        last = Date.now();
        console.log(`run:   ${p.file}: ${mb(p.doneBytes)} / ${mb(p.totalBytes)} MB`);
      }
    }, 1000);
    try {
      const ev = await h.installPack(b.page, baseUrl, 24 * 3600_000);
      console.log(`run: pack installed (${mb(ev.bytes)} MB)`);
    } finally {
      clearInterval(progress);
    }
  } else {
    console.log(`run: pack already installed from ${status.source} (${mb(status.bytes)} MB)`);
  }

  if (o.prompt !== undefined) {
    const req = { prompt: o.prompt, trace: o.trace };
    for (const k of ['width', 'height', 'steps']) if (o[k] !== undefined) req[k] = Number(o[k]);
    if (o.seed !== undefined) req.seed = o.seed;
    if (o.schedule !== undefined) req.schedule = o.schedule;
    if (o.backend !== undefined) req.backend = o.backend;
    console.log(`run: generating ${JSON.stringify(req)}`);
    const printer = setInterval(async () => {
      const evs = await h.events(b.page).catch(() => []);
      const p = evs.filter((e) => e.type === 'progress').at(-1);
      if (p) process.stdout.write(`\rrun:   ${p.progress.stage} ${p.progress.step}/${p.progress.steps}   `);
    }, 500);
    const r = await h.generate(b.page, req, 24 * 3600_000).finally(() => clearInterval(printer));
    process.stdout.write('\n');
    if (!r.result) {
      console.error(`run: generation failed: ${JSON.stringify(r.failed ?? r.reply, h.shorten)}`);
      exitCode = 1;
    } else {
      fs.mkdirSync(path.dirname(path.resolve(o.out)), { recursive: true });
      fs.writeFileSync(o.out, h.pngBytes(r.result));
      const { png, trace, ...meta } = r.result;
      console.log(`run: wrote ${o.out} in ${(r.wallMs / 1000).toFixed(1)} s: ${JSON.stringify(meta)}`);
    }
    await shutdown(exitCode);
  } else {
    console.log('run: browser is open; Ctrl-C to quit');
    b.context.on('close', () => shutdown(0));
    await new Promise(() => {});
  }
} catch (e) {
  console.error(`run: ${e.stack ?? e}`);
  await shutdown(1);
}

function mb(n) {
  return ((n ?? 0) / 1e6).toFixed(1);
}
