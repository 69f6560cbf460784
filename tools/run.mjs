// `cargo xtask run`: launch Chromium with the built extension (dist/), or Firefox ESR with its Firefox
// build (dist-firefox/, `--browser firefox`), install the pack from a Hub (or the demo pack from a local
// fake Hub), optionally generate one image and write it.
//
//   node tools/run.mjs [--browser chrome|firefox]
//        [--pack URL | --hub ENDPOINT [--repo OWNER/NAME] [--revision REV] | --demo]
//        [--prompt P --out F.png]
//        [--width W --height H --steps N --seed S --schedule NAME --backend webgpu|wasm]
//        [--profile DIR] [--fresh]
//
// The install goes through the extension's Hub path (resolve the revision to a commit, list, verify,
// resume): defaults https://huggingface.co, cgb/flux2-klein-4b-onnx-webgpu, main. `--pack URL` names
// the same three from a repo's address (`https://huggingface.co/OWNER/NAME`, optionally followed by
// `/tree/REV` or `/resolve/REV/`). `--demo` starts the
// fake Hub (tests/e2e/lib/fake-hub.mjs) serving tests/fixtures/packs/f32 as `fixtures/f32` on loopback.
// Headed when $DISPLAY is set, otherwise headless (SwiftShader WebGPU), where, without --prompt, it
// installs the pack and exits, saying what can be done instead. The browser profile lives in
// target/imagine-profile (so a downloaded pack, or a half-downloaded one, survives runs) unless
// --profile or --fresh is given.

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from '../tests/e2e/lib/harness.mjs';
import { FIREFOX, firefoxPageUrl, launchFirefox } from '../tests/e2e/lib/firefox.mjs';

const DEFAULTS = { endpoint: 'https://huggingface.co', repo: 'cgb/flux2-klein-4b-onnx-webgpu', revision: 'main' };

const { values: o } = parseArgs({
  options: {
    browser: { type: 'string', default: 'chrome' },
    pack: { type: 'string' },
    hub: { type: 'string' },
    repo: { type: 'string' },
    revision: { type: 'string' },
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
if (!['chrome', 'firefox'].includes(o.browser)) fail(`--browser ${o.browser}: expected chrome or firefox`);
const firefox = o.browser === 'firefox';
if (o.demo && (o.pack || o.hub || o.repo || o.revision)) fail('--demo serves its own Hub: it excludes --pack, --hub, --repo and --revision');
if (o.pack && (o.hub || o.repo || o.revision)) fail('--pack names the Hub, repo and revision: it excludes --hub, --repo and --revision');
if (o.pack) Object.assign(o, parsePackUrl(o.pack));

/** `https://HOST/OWNER/NAME[/tree/REV | /resolve/REV[/...]]` -> { hub, repo, revision }. */
function parsePackUrl(text) {
  let url;
  try {
    url = new URL(text);
  } catch {
    fail(`--pack ${text}: not a URL; expected https://huggingface.co/OWNER/NAME[/tree/REVISION]`);
  }
  const parts = url.pathname.split('/').filter(Boolean);
  if (parts.length < 2 || (parts.length > 2 && !['tree', 'resolve'].includes(parts[2])) || parts.length === 3) {
    fail(`--pack ${text}: expected https://HOST/OWNER/NAME, optionally followed by /tree/REVISION or /resolve/REVISION/`);
  }
  return { hub: url.origin, repo: `${parts[0]}/${parts[1]}`, revision: parts[3] ?? DEFAULTS.revision };
}
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

let hub = null;
const source = {
  endpoint: (o.hub ?? DEFAULTS.endpoint).replace(/\/+$/, ''),
  repo: o.repo ?? DEFAULTS.repo,
  revision: o.revision ?? DEFAULTS.revision,
};
if (o.demo) {
  hub = await h.startHub({ repos: ['f32'] });
  Object.assign(source, { endpoint: hub.url, repo: 'fixtures/f32', revision: 'main' });
  console.log(`run: fake Hub at ${hub.url} (CDN ${hub.cdnUrl}) serving tests/fixtures/packs/f32 as fixtures/f32`);
}

console.log(`run: launching ${firefox ? FIREFOX : h.CHROMIUM} (${h.isHeadless() ? 'headless' : 'headed'}), profile ${profileDir}`);
// Said before a download that may take an hour, not only after it.
if (h.isHeadless() && o.prompt === undefined) {
  console.log('run: headless (no $DISPLAY, or IMAGINE_HEADLESS=1): nobody sees this browser, so this run only installs the pack and exits; add --prompt P --out F.png to make an image, or run where there is a display (a desktop session, or xvfb-run) to use the popup and the studio');
}
const b = firefox ? await launchFirefox({ profileDir }) : await h.launch({ profileDir });
console.log(`run: extension at ${firefox ? firefoxPageUrl('popup.html') : h.extensionUrl(b.extensionId, 'popup.html')}`);
let exitCode = 0;

const shutdown = async (code) => {
  await b.close();
  await hub?.close();
  if (o.fresh) fs.rmSync(profileDir, { recursive: true, force: true });
  process.exit(code);
};
process.on('SIGINT', () => {
  console.log('\nrun: closing');
  shutdown(130);
});

const sameSource = (s) =>
  s && s.endpoint?.replace(/\/+$/, '') === source.endpoint && s.repo === source.repo && s.revision === source.revision;

try {
  await h.collectEvents(b.page);
  const status = await h.packStatus(b.page);
  // Installed from the same endpoint, repo and revision (or at the commit asked for): kept. The demo
  // hub's port changes every run, so a demo pack is always reinstalled.
  const same = status.installed && !o.demo && (sameSource(status.source) || status.commit === source.revision);
  if (same && !status.download) {
    console.log(`run: pack already installed from ${status.source.endpoint} ${status.source.repo}@${status.commit} (${mb(status.bytes)} MB)`);
  } else {
    const backend = o.backend === 'wasm' ? 'wasm' : undefined;
    if (status.download && sameSource(status.download.source) && !['downloading', 'installing'].includes(status.download.state)) {
      console.log(`run: a ${status.download.state} download of ${status.download.source.repo} exists: resuming it`);
      const r = await h.api(b.page, { type: 'resumePack' });
      if (r?.type !== 'installStarted') throw new Error(`resumePack: ${JSON.stringify(r)}`);
    } else {
      console.log(`run: installing ${source.repo}@${source.revision} from ${source.endpoint}`);
      const r = await h.startInstall(b.page, source.endpoint, source.repo, { revision: source.revision, backend });
      if (r?.type !== 'installStarted') throw new Error(`installPack: ${r?.error ?? JSON.stringify(r)}`);
    }
    let last = 0;
    const progress = setInterval(async () => {
      const s = await h.packStatus(b.page).catch(() => null); // also what resumes an interrupted download
      const d = s?.download;
      if (d && Date.now() - last > 2000) {
        last = Date.now();
        const eta = d.secondsLeft == null ? '?' : `${Math.round(d.secondsLeft)} s`;
        const cur = d.files.find((f) => !f.verified && f.doneBytes > 0)?.path ?? '';
        console.log(`run:   ${d.state} ${mb(d.doneBytes)} / ${mb(d.totalBytes)} MB, ${mb(d.bytesPerSecond)} MB/s, ${eta} left ${cur}`);
      }
    }, 1000);
    try {
      const ev = await h.waitForInstall(b.page, 7 * 24 * 3600_000);
      console.log(`run: pack installed (${mb(ev.bytes)} MB, commit ${ev.commit})`);
    } catch (e) {
      // A machine without the Internet (CI, a sandbox) can still run the extension: on the demo pack.
      // Said last, in the same line as what failed (no stack: nothing in this program went wrong).
      const message = String(e.message ?? e);
      if (!o.demo && /could not reach/.test(message)) {
        console.error(`run: ${message.replace(/^pack install failed: /, '')}. ${source.endpoint} cannot be reached from here: \`cargo xtask run --demo\` installs a tiny demo pack from a local fake Hub and works offline`);
        await shutdown(1);
      }
      throw e;
    } finally {
      clearInterval(progress);
    }
  }

  if (o.prompt !== undefined) {
    const req = { prompt: o.prompt, trace: o.trace };
    for (const k of ['width', 'height', 'steps']) if (o[k] !== undefined) req[k] = Number(o[k]);
    if (o.seed !== undefined) req.seed = o.seed;
    if (o.schedule !== undefined) req.schedule = o.schedule;
    if (o.backend !== undefined) req.backend = o.backend;
    console.log(`run: generating ${JSON.stringify(req)}`);
    let shown = '';
    const printer = setInterval(async () => {
      const evs = await h.events(b.page).catch(() => []);
      const p = evs.filter((e) => e.type === 'progress').at(-1);
      const line = p ? `${p.progress.stage} ${p.progress.step}/${p.progress.steps}` : '';
      if (line && line !== shown) console.log(`run:   ${line}`);
      shown = line || shown;
    }, 250);
    const r = await h.generate(b.page, req, 24 * 3600_000, { stallMs: Infinity }).finally(() => clearInterval(printer));
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
  } else if (h.isHeadless()) {
    // Nobody sees a headless browser: waiting for Ctrl-C would only hold the pack's memory.
    console.log(`run: the pack is installed in the profile ${profileDir}. The browser is headless (no $DISPLAY, or IMAGINE_HEADLESS=1), so there is nothing to look at: add --prompt P --out F.png to make an image, or run where there is a display (a desktop session, or xvfb-run) to use the popup and the studio`);
    await shutdown(0);
  } else {
    console.log('run: browser is open; Ctrl-C to quit');
    if (firefox) b.browser.on('disconnected', () => shutdown(0));
    else b.context.on('close', () => shutdown(0));
    await new Promise(() => {});
  }
} catch (e) {
  console.error(`run: ${e.stack ?? e}`);
  await shutdown(1);
}

function mb(n) {
  return ((n ?? 0) / 1e6).toFixed(1);
}
