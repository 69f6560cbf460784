// Shared helpers for the end-to-end tests (node:test) and the run/bench scripts.
//
// Chromium is Debian's (/usr/lib/chromium/chromium; /usr/bin/chromium is a shell wrapper), driven by
// playwright-core through a persistent context, because extensions only load in one. Without $DISPLAY
// it runs in the new headless mode, which loads extensions; WebGPU is SwiftShader there
// (--enable-unsafe-webgpu is the flag that matters, see docs/platform.md §7).
//
// Environment:
//   IMAGINE_DIST      the unpacked extension to load (default: <repo>/dist, built by `cargo xtask build`)
//   IMAGINE_PACKS     the fixture packs (default: <repo>/tests/fixtures/packs)
//   IMAGINE_CHROMIUM  the Chromium binary (default: /usr/lib/chromium/chromium)
//   IMAGINE_HEADLESS=1  headless even when $DISPLAY is set
//   IMAGINE_WEBGPU    swiftshader (default: the CPU adapter every machine has) or vulkan (a real GPU
//                     through Vulkan, as on a Linux machine with an NVIDIA GPU and no display)

import { chromium } from 'playwright-core';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startFakeHub } from './fake-hub.mjs';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const DIST = process.env.IMAGINE_DIST ? path.resolve(process.env.IMAGINE_DIST) : path.join(ROOT, 'dist');

/** The URL extension pages import `gpu_adapter.js` from (a wasm-bindgen snippet of the web crate). */
export function gpuAdapterUrl() {
  const [dir] = fs.readdirSync(path.join(DIST, 'pkg/snippets')).filter((d) => d.startsWith('imagine-web-'));
  return `/pkg/snippets/${dir}/src/platform/gpu_adapter.js`;
}
export const CHROMIUM = process.env.IMAGINE_CHROMIUM || '/usr/lib/chromium/chromium';
export const PACKS = process.env.IMAGINE_PACKS ? path.resolve(process.env.IMAGINE_PACKS) : path.join(ROOT, 'tests/fixtures/packs');
export const OUT = path.join(ROOT, 'tests/e2e/out');

/** SwiftShader is slow: one generation may take this long. */
export const GENERATION_TIMEOUT_MS = 180_000;
/** A pack install from loopback. */
export const INSTALL_TIMEOUT_MS = 120_000;
/**
 * The longest a job may go without an event (a stage's start, a step, an image) before its test fails,
 * naming the stage it was in. The longest quiet stretch in the browser tests is the tiny
 * real-architecture decoder's one run at 256x256 on SwiftShader, about 80 s here (2026-12-02); a stage
 * that never ends fails within minutes, not at the test file's timeout.
 */
export const STALL_MS = 300_000;

/**
 * WebGPU's flags by IMAGINE_WEBGPU. swiftshader: WebGPU without a GPU (`--enable-unsafe-webgpu` gives the
 * SwiftShader adapter; the other two don't hurt). vulkan: headless Chromium on a real GPU; without
 * `--disable-vulkan-surface` Vulkan fails to start there and only SwiftShader is left (measured on an
 * NVIDIA H200, Chromium 156, 2026-12-02).
 */
export const WEBGPU_ARGS = {
  swiftshader: ['--enable-unsafe-webgpu', '--enable-unsafe-swiftshader', '--use-webgpu-adapter=swiftshader'],
  vulkan: ['--enable-unsafe-webgpu', '--ignore-gpu-blocklist', '--use-angle=vulkan', '--enable-features=Vulkan', '--disable-vulkan-surface'],
};

export function webgpuArgs(kind = process.env.IMAGINE_WEBGPU || 'swiftshader') {
  const args = WEBGPU_ARGS[kind];
  if (!args) throw new Error(`IMAGINE_WEBGPU=${kind}: expected one of ${Object.keys(WEBGPU_ARGS).join(', ')}`);
  return args;
}

/** The flags every launch uses. */
export function chromiumArgs(extDir = DIST) {
  return [
    `--disable-extensions-except=${extDir}`,
    `--load-extension=${extDir}`,
    ...webgpuArgs(),
    // As root on a machine without a user namespace sandbox.
    '--no-sandbox',
    '--disable-gpu-sandbox',
    // The machine's network is closed: keep Chromium from calling home (and from failing noisily).
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--no-first-run',
    '--disable-quic',
    '--disable-default-apps',
  ];
}

export function isHeadless() {
  if (process.env.IMAGINE_HEADLESS === '1') return true;
  return !process.env.DISPLAY;
}

/**
 * Launches Chromium with the extension and opens its popup page in a tab.
 * Returns { context, extensionId, serviceWorker, page, profileDir, browserCdp, close }.
 */
export async function launch({ profileDir, extDir = DIST, headless = isHeadless(), args = [], page: openPage = 'popup.html' } = {}) {
  if (!fs.existsSync(path.join(extDir, 'manifest.json'))) {
    throw new Error(`${extDir}/manifest.json is missing: run \`cargo xtask build\` first`);
  }
  const ownProfile = !profileDir;
  profileDir ??= fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-e2e-'));
  const context = await chromium.launchPersistentContext(profileDir, {
    executablePath: CHROMIUM,
    headless,
    args: [...chromiumArgs(extDir), ...args],
    viewport: { width: 900, height: 900 },
  });
  let serviceWorker = context.serviceWorkers().find((w) => w.url().startsWith('chrome-extension://'));
  if (!serviceWorker) {
    serviceWorker = await context.waitForEvent('serviceworker', {
      predicate: (w) => w.url().startsWith('chrome-extension://'),
      timeout: 30_000,
    });
  }
  const extensionId = new URL(serviceWorker.url()).host;
  let page = null;
  if (openPage) {
    page = context.pages()[0] ?? (await context.newPage());
    await page.goto(extensionUrl(extensionId, openPage));
  }
  const browserCdp = await context.browser().newBrowserCDPSession();
  const b = { context, extensionId, serviceWorker, page, profileDir, browserCdp };
  /** Closes the browser; removes the profile if launch() made it (unless keepProfile). */
  b.close = async ({ keepProfile = false } = {}) => {
    await context.close().catch(() => {});
    if (ownProfile && !keepProfile) fs.rmSync(profileDir, { recursive: true, force: true });
  };
  /**
   * Closes the browser and launches it again on the same profile (as a user quitting and reopening
   * it). Returns the new launch object; its close() removes the profile as the first one would have.
   */
  b.relaunch = async (opts = {}) => {
    await context.close().catch(() => {});
    const nb = await launch({ profileDir, extDir, headless, args, page: openPage, ...opts });
    const innerClose = nb.close;
    nb.close = async ({ keepProfile = false } = {}) => {
      await innerClose({ keepProfile: true });
      if (ownProfile && !keepProfile) fs.rmSync(profileDir, { recursive: true, force: true });
    };
    return nb;
  };
  return b;
}

export function extensionUrl(extensionId, file) {
  return `chrome-extension://${extensionId}/${file}`;
}

/** The current service worker of the extension (it changes after a restart). */
export async function currentServiceWorker(context, extensionId) {
  const prefix = `chrome-extension://${extensionId}/`;
  return (
    context.serviceWorkers().find((w) => w.url().startsWith(prefix)) ??
    (await context.waitForEvent('serviceworker', { predicate: (w) => w.url().startsWith(prefix), timeout: 30_000 }))
  );
}

// ---------------------------------------------------------------------------------------------
// The message API

/** Sends one request from an extension page and returns the reply. */
export async function api(page, request) {
  return page.evaluate((msg) => chrome.runtime.sendMessage(msg), request);
}

/**
 * Starts collecting broadcast events in the page (idempotent). Call it before sending the request
 * whose events you wait for; waitForEvent calls it too, but then earlier events are lost.
 */
export async function collectEvents(page) {
  await page.evaluate(() => {
    if (window.__events) return;
    window.__events = [];
    chrome.runtime.onMessage.addListener((m) => {
      if (m && typeof m === 'object' && 'type' in m) window.__events.push(m);
      return false;
    });
  });
}

/** All events collected so far in the page. */
export async function events(page) {
  return page.evaluate(() => window.__events ?? []);
}

/**
 * Waits for a collected event matching `predicate` (a node function over the event) and returns it.
 * Events seen earlier count too. Throws with the events seen on timeout.
 */
export async function waitForEvent(page, predicate, timeoutMs = GENERATION_TIMEOUT_MS, { pollMs = 250 } = {}) {
  await collectEvents(page);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const evs = await events(page);
    const hit = evs.find(predicate);
    if (hit) return hit;
    if (Date.now() > deadline) {
      const summary = evs.slice(-20).map((e) => JSON.stringify(e, shorten)).join('\n  ');
      throw new Error(`no matching event within ${timeoutMs} ms; last events:\n  ${summary}`);
    }
    await sleep(pollMs);
  }
}

/** JSON.stringify replacer that shortens base64 blobs in error messages. */
export function shorten(key, value) {
  if (typeof value === 'string' && value.length > 200) return `${value.slice(0, 60)}…(${value.length} chars)`;
  if (Array.isArray(value) && value.length > 20) return `[${value.length} items]`;
  return value;
}

/** Sends `installPack` for `repo` on `hub` (a fake Hub or { url }); returns the reply (no waiting). */
export async function startInstall(page, hub, repo, { backend, revision = 'main' } = {}) {
  await clearInstallEvents(page);
  const req = { type: 'installPack', endpoint: hubUrl(hub), repo, revision };
  if (backend) req.backend = backend;
  return api(page, req);
}

/**
 * Waits for the install started before to end: returns the `packInstalled` event, throws with the
 * `packFailed` error. Also polls packStatus (a request to the service worker is one of the moments the
 * extension resumes an interrupted download), so it survives events lost to a restart.
 */
export async function waitForInstall(page, timeoutMs = INSTALL_TIMEOUT_MS) {
  await collectEvents(page);
  const deadline = Date.now() + timeoutMs;
  let status = null;
  for (;;) {
    const evs = await events(page);
    const ev = evs.find((e) => e.type === 'packInstalled' || e.type === 'packFailed');
    if (ev?.type === 'packFailed') throw new Error(`pack install failed: ${ev.error}`);
    status = await api(page, { type: 'packStatus' }).catch((e) => ({ error: String(e) }));
    if (ev?.type === 'packInstalled') {
      if (!status?.installed) throw new Error(`packInstalled, but packStatus says ${JSON.stringify(status)}`);
      return ev;
    }
    if (status?.download?.state === 'failed') throw new Error(`pack install failed: ${status.download.error}`);
    if (status?.installed && !status.download) return { type: 'packInstalled', bytes: status.bytes, commit: status.commit };
    if (Date.now() > deadline) throw new Error(`install not done within ${timeoutMs} ms: ${JSON.stringify(status, shorten)}`);
    await sleep(250);
  }
}

/**
 * Installs `repo` from `hub` and waits until it is installed; returns packInstalled.
 * `backend: 'wasm'` skips the GPU checks (needed for the f16 pack on SwiftShader).
 */
export async function installPack(page, hub, repo = 'fixtures/f32', { backend, revision, timeoutMs = INSTALL_TIMEOUT_MS } = {}) {
  const reply = await startInstall(page, hub, repo, { backend, revision });
  if (reply?.type !== 'installStarted') throw new Error(`installPack: ${JSON.stringify(reply)}`);
  return waitForInstall(page, timeoutMs);
}

/** Forgets collected packInstalled/packFailed events (before a request whose outcome you wait for). */
export async function clearInstallEvents(page) {
  await collectEvents(page);
  await page.evaluate(() => {
    window.__events = window.__events.filter((e) => !['packInstalled', 'packFailed'].includes(e.type));
  });
}

/** Sends `resumePack` (after forgetting earlier install outcomes); returns the reply. */
export async function resumePack(page) {
  await clearInstallEvents(page);
  return api(page, { type: 'resumePack' });
}

/** Waits for the install started before to fail; returns the error text (throws if it installs). */
export async function waitForInstallFailure(page, timeoutMs = INSTALL_TIMEOUT_MS) {
  try {
    const ev = await waitForInstall(page, timeoutMs);
    throw Object.assign(new Error(`expected the install to fail, it installed: ${JSON.stringify(ev)}`), { installed: true });
  } catch (e) {
    if (e.installed) throw e;
    const m = /^pack install failed: ([\s\S]*)$/.exec(e.message);
    if (!m) throw e;
    return m[1];
  }
}

function hubUrl(hub) {
  return typeof hub === 'string' ? hub : hub.url;
}

/** `packStatus`. */
export async function packStatus(page) {
  const s = await api(page, { type: 'packStatus' });
  if (s?.type !== 'packStatus') throw new Error(`packStatus: ${JSON.stringify(s)}`);
  return s;
}

/**
 * Polls packStatus until `predicate(status)` holds; returns that status. Throws on timeout with the
 * last status. (Use a predicate over status.download, e.g. `(s) => fileDone(s, 'x.data') >= 8 << 20`.)
 */
export async function waitForDownload(page, predicate, timeoutMs = INSTALL_TIMEOUT_MS, { pollMs = 150 } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last = null;
  for (;;) {
    last = await api(page, { type: 'packStatus' }).catch((e) => ({ error: String(e) }));
    if (last && !last.error && predicate(last)) return last;
    if (Date.now() > deadline) throw new Error(`download condition not met within ${timeoutMs} ms; last packStatus: ${JSON.stringify(last, shorten)}`);
    await sleep(pollMs);
  }
}

/** Bytes done of one file of the running download (0 if unknown). */
export function fileDone(status, p) {
  return status?.download?.files?.find((f) => f.path === p)?.doneBytes ?? 0;
}

/**
 * Starts a generation and waits for its result (or failure). Returns
 * { reply, result, failed, wallMs }: result is the `result` event (or null), failed the `failed` event.
 * Throws when the job has not ended within `timeoutMs`, or when it sent no event for `stallMs` (the
 * error names the stage it was in).
 */
export async function generate(page, request, timeoutMs = GENERATION_TIMEOUT_MS, { stallMs = STALL_MS } = {}) {
  await collectEvents(page);
  const t0 = Date.now();
  const reply = await api(page, { type: 'generate', ...request });
  if (reply?.type !== 'jobStarted') return { reply, result: null, failed: null, wallMs: Date.now() - t0 };
  const ev = await waitForJobEnd(page, reply.job, timeoutMs, stallMs);
  const wallMs = Date.now() - t0;
  return {
    reply,
    result: ev.type === 'result' ? ev : null,
    failed: ev.type === 'result' ? null : ev,
    wallMs,
  };
}

/**
 * The event that ended `job` (`result`, `failed` or `cancelled`). Throws after `timeoutMs`, or once the
 * job has sent no event for `stallMs`, naming the stage of its last progress event.
 */
export async function waitForJobEnd(page, job, timeoutMs = GENERATION_TIMEOUT_MS, stallMs = STALL_MS) {
  await collectEvents(page);
  const t0 = Date.now();
  let seen = 0;
  let lastEventAt = t0;
  for (;;) {
    const evs = (await events(page)).filter((e) => e.job === job);
    const end = evs.find((e) => ['result', 'failed', 'cancelled'].includes(e.type));
    if (end) return end;
    const now = Date.now();
    if (evs.length > seen) [seen, lastEventAt] = [evs.length, now];
    const stalled = now - lastEventAt > stallMs;
    if (stalled || now - t0 > timeoutMs) {
      const progress = evs.filter((e) => e.type === 'progress').at(-1)?.progress;
      const stage = progress
        ? `stage ${progress.stage} (step ${progress.step}/${progress.steps}, image ${progress.image + 1}/${progress.images})`
        : 'no stage started';
      const why = stalled ? `no event for ${Math.round((now - lastEventAt) / 1000)} s` : `not ended within ${timeoutMs} ms`;
      const last = evs.slice(-5).map((e) => JSON.stringify(e, shorten)).join('\n  ');
      throw new Error(`job ${job}: ${why}, in ${stage}; last events:\n  ${last}`);
    }
    await sleep(250);
  }
}

/**
 * The `job` reply once the job has ended (`done`, `failed`, `cancelled`). A page shows a result from the
 * broadcast event while the service worker records it, so right after the event the job may still read
 * as running for a moment.
 */
export async function endedJob(page, job, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const state = await api(page, { type: 'job', job });
    if (state?.status !== 'running' || Date.now() > deadline) return state;
    await sleep(100);
  }
}

/** Like generate, but throws unless there is a result. */
export async function generateOk(page, request, timeoutMs) {
  const r = await generate(page, request, timeoutMs);
  if (!r.result) {
    throw new Error(`generate ${JSON.stringify(request)}: ${JSON.stringify(r.failed ?? r.reply, shorten)}`);
  }
  return r;
}

export function pngBytes(result) {
  return Buffer.from(result.png, 'base64');
}

/** Writes `<name>.png` and `<name>.json` (the result without the png) to `dir` (tests/e2e/out/). */
export function writeResult(name, result, dir = OUT) {
  fs.mkdirSync(dir, { recursive: true });
  const png = path.join(dir, `${name}.png`);
  const json = path.join(dir, `${name}.json`);
  fs.writeFileSync(png, pngBytes(result));
  const { png: _png, ...rest } = result;
  fs.writeFileSync(json, JSON.stringify(rest, null, 1));
  return { png, json };
}

/**
 * The most an interruption re-fetches of the file it was in: a checkpoint interval (4 MiB) plus the
 * blocks the hash worker may be behind when a checkpoint is asked for (2 MiB), since the record is
 * saved when the checkpoint's answer comes (crates/web/src/offscreen/download.rs).
 */
export const REFETCH_BYTES = 6 << 20;
/**
 * What may be in flight (written to the socket, not yet read by the browser) when an interruption
 * hits; the fake Hub counts bytes as they are written. Downloads that are interrupted on purpose are
 * throttled, which keeps this small.
 */
export const IN_FLIGHT_SLACK = 1 << 20;

/** The shard the interruption tests pad to BIG_SHARD_SIZE, so that "mid-file" means something. */
export const BIG_SHARD = 'transformer_q8-00000.data';
export const BIG_SHARD_SIZE = 24 << 20;

/**
 * setup() with the f32 pack's BIG_SHARD padded to BIG_SHARD_SIZE, nothing installed yet.
 * Returns setup()'s object with `repo` = 'fixtures/f32'.
 */
export async function setupPadded(t, opts = {}) {
  return setup(t, { pack: 'f32', install: false, hubOptions: { repos: ['f32'], pad: { [BIG_SHARD]: BIG_SHARD_SIZE } }, ...opts });
}

/** The fixture packs' repos on the fake Hub: `fixtures/<name>`. */
export const FIXTURE_REPOS = ['f32', 'f32-vae32', 'f16'];

/**
 * Starts a fake Hub (fake-hub.mjs) serving fixture packs. `repos`: names of fixture packs (served as
 * `fixtures/<name>`), or { repo: spec } (see fake-hub.mjs). `pad`: { file: size } applied to every
 * fixture repo.
 */
export async function startHub({ repos = FIXTURE_REPOS, pad = null, throttle = null } = {}) {
  const specs = {};
  if (Array.isArray(repos)) {
    for (const name of repos) {
      const dir = path.join(PACKS, name);
      if (!fs.existsSync(dir)) throw new Error(`no fixture pack at ${dir}: run python3 tests/fixtures/make_packs.py`);
      specs[`fixtures/${name}`] = { dir };
    }
  } else Object.assign(specs, repos);
  return startFakeHub({ repos: specs, pad, throttle });
}

/** The fixture pack directory of a fixture repo (`fixtures/f32` -> tests/fixtures/packs/f32). */
export function fixtureDir(repo) {
  return path.join(PACKS, repo.replace(/^fixtures\//, ''));
}

/** Whether a repo file is part of the pack (graphs, manifests, external data), from its name. */
export function isPackFile(p) {
  return !p.includes('/') && /\.(onnx|data|manifest\.json)$/.test(p);
}

/** Bytes of body the hub (hub and CDN) served for a pack-relative path. */
export function servedBytes(hub, p) {
  return hub.stats(p).bodyBytes;
}

/** The pack files of `repo` on the hub at main: [{ path, size, sha256, lfs }]. */
export function packFiles(hub, repo, commit) {
  return hub.files(repo, commit).filter((f) => isPackFile(f.path));
}

/**
 * Asserts what the hub served for `repo`: every pack file at most its size plus REFETCH_BYTES (+
 * in-flight slack) per interruption it went through (`interruptions`: { path: n }, or a number for
 * every file; `extra`: { path: bytes } more allowed, e.g. a restart from 0), non-pack files never
 * requested, and every resolve at one commit. Returns the per-file stats.
 */
export function assertServed(hub, repo, { interruptions = 0, extra = {}, commit } = {}) {
  const problems = [];
  const rows = {};
  for (const f of packFiles(hub, repo, commit)) {
    const st = hub.stats(f.path);
    const n = typeof interruptions === 'number' ? interruptions : (interruptions[f.path] ?? 0);
    const allowed = f.size + n * (REFETCH_BYTES + IN_FLIGHT_SLACK) + (extra[f.path] ?? 0);
    rows[f.path] = { size: f.size, served: st.bodyBytes, allowed, requests: st.requests, ranges: st.ranges };
    if (st.bodyBytes > allowed) problems.push(`${f.path}: served ${st.bodyBytes} bytes, size ${f.size}, allowed ${allowed}`);
  }
  for (const f of hub.files(repo, commit).filter((f) => !isPackFile(f.path))) {
    if (hub.stats(f.path).requests > 0) problems.push(`${f.path} is not part of the pack but was requested`);
  }
  const resolveRevs = hub.log.filter((r) => r.server === 'hub' && r.rev).map((r) => r.rev);
  const want = commit ?? hub.commit(repo);
  const other = [...new Set(resolveRevs.filter((r) => r !== want))];
  if (other.length) problems.push(`resolve requests at other revisions than ${want}: ${other.join(', ')}`);
  if (problems.length) throw new Error(`served bytes:\n  ${problems.join('\n  ')}\n${JSON.stringify(rows, null, 1)}`);
  return rows;
}

// ---------------------------------------------------------------------------------------------
// OPFS, quota, offscreen document

/** The OPFS of the extension, from an extension page: { 'packs/a/x.onnx': size, 'packs/b/': 0, … } (dirs end in /). */
export async function opfsTree(page) {
  return page.evaluate(async () => {
    const out = {};
    const walk = async (dir, prefix) => {
      for await (const [name, h] of dir.entries()) {
        if (h.kind === 'directory') {
          out[`${prefix}${name}/`] = 0;
          await walk(h, `${prefix}${name}/`);
        } else {
          out[`${prefix}${name}`] = (await h.getFile()).size;
        }
      }
    };
    await walk(await navigator.storage.getDirectory(), '');
    return out;
  });
}

/** The names in the OPFS root (`packs`, …). */
export async function opfsEntries(page) {
  return page.evaluate(async () => {
    const names = [];
    for await (const name of (await navigator.storage.getDirectory()).keys()) names.push(name);
    return names.sort();
  });
}

/** The text of an OPFS file (`dir/name` from the root), read in the page; null if absent. */
export async function opfsText(page, filePath) {
  return page.evaluate(async (p) => {
    try {
      let dir = await navigator.storage.getDirectory();
      const parts = p.split('/');
      for (const part of parts.slice(0, -1)) dir = await dir.getDirectoryHandle(part);
      return await (await (await dir.getFileHandle(parts.at(-1))).getFile()).text();
    } catch {
      return null;
    }
  }, filePath);
}

/** `packs/state.json` (crates/core/src/storage.rs): { staging: 'a' | 'b', installed: record | null }, or null. */
export async function packState(page) {
  const text = await opfsText(page, 'packs/state.json');
  return text === null ? null : JSON.parse(text);
}

/** The OPFS directory of the installed pack (`packs/a` or `packs/b`), or null. */
export async function installedDir(page) {
  const state = await packState(page);
  return state?.installed ? `packs/${state.staging === 'a' ? 'b' : 'a'}` : null;
}

/** The OPFS directory downloads are staged in (`packs/a` when nothing was ever installed). */
export async function stagingDir(page) {
  return `packs/${(await packState(page))?.staging ?? 'a'}`;
}

/** Lowercase hex SHA-256 of an OPFS file (`dir/name` from the root), read in the page; null if absent. */
export async function opfsSha256(page, filePath) {
  return page.evaluate(async (p) => {
    let dir = await navigator.storage.getDirectory();
    const parts = p.split('/');
    try {
      for (const part of parts.slice(0, -1)) dir = await dir.getDirectoryHandle(part);
      const file = await (await dir.getFileHandle(parts.at(-1))).getFile();
      const digest = await crypto.subtle.digest('SHA-256', await file.arrayBuffer());
      return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, '0')).join('');
    } catch {
      return null;
    }
  }, filePath);
}

/** Writes `bytes` (a Buffer or string) to an OPFS file `dir/name`, creating directories. */
export async function opfsWrite(page, filePath, bytes) {
  const data = [...Buffer.from(bytes)];
  return page.evaluate(async ({ p, data }) => {
    let dir = await navigator.storage.getDirectory();
    const parts = p.split('/');
    for (const part of parts.slice(0, -1)) dir = await dir.getDirectoryHandle(part, { create: true });
    const w = await (await dir.getFileHandle(parts.at(-1), { create: true })).createWritable();
    await w.write(new Uint8Array(data));
    await w.close();
  }, { p: filePath, data });
}

/** Cuts an OPFS file to `length` bytes (no worker may hold it open). */
export async function opfsTruncate(page, filePath, length) {
  return page.evaluate(async ({ p, length }) => {
    let dir = await navigator.storage.getDirectory();
    const parts = p.split('/');
    for (const part of parts.slice(0, -1)) dir = await dir.getDirectoryHandle(part);
    const w = await (await dir.getFileHandle(parts.at(-1))).createWritable({ keepExistingData: true });
    await w.truncate(length);
    await w.close();
  }, { p: filePath, length });
}

/**
 * Arms the failpoint `name` (crates/web/src/platform/opfs.rs `failpoint`): the extension holds for ever when it
 * reaches it, and removes the OPFS file `failpoint`, which tells the test it got there.
 */
export async function armFailpoint(page, name) {
  await opfsWrite(page, 'failpoint', name);
}

/**
 * Shortens the time a Hub request may receive nothing before the extension gives it up (30 s; the
 * OPFS file `idle-timeout-ms`, crates/web/src/platform/hub_client.rs), so a test of a silent server need not wait.
 */
export async function setIdleTimeout(page, ms) {
  await opfsWrite(page, 'idle-timeout-ms', String(ms));
}

/** Waits until an armed failpoint was reached. */
export async function waitForFailpoint(page, timeoutMs = INSTALL_TIMEOUT_MS) {
  const deadline = Date.now() + timeoutMs;
  while ((await opfsEntries(page)).includes('failpoint')) {
    if (Date.now() > deadline) throw new Error(`failpoint not reached within ${timeoutMs} ms`);
    await sleep(100);
  }
}

/** `navigator.storage.estimate()` in an extension page. */
export async function storageEstimate(page) {
  return page.evaluate(async () => {
    const { usage, quota } = await navigator.storage.estimate();
    return { usage, quota };
  });
}

const quotaSessions = new WeakMap();

/**
 * Overrides the storage quota of the extension's origin with CDP Storage.overrideQuotaForOrigin
 * (`null` removes the override). The override lives as long as the CDP session that set it, so the
 * session is kept open (per page) until setQuota(…, null).
 *
 * What it does in Chromium 156 (checked, see tests/e2e/README.md):
 *  - extension WITH `unlimitedStorage` (dist/ as built): navigator.storage.estimate().quota reports the
 *    override, but OPFS writes are not limited by it;
 *  - extension WITHOUT `unlimitedStorage` (quotaDist()): OPFS writes fail with QuotaExceededError past
 *    the override, but estimate().quota keeps reporting the default (10 GiB).
 * So: the up-front quota check is tested with dist/ + setQuota, and running out of quota part way
 * with quotaDist() + setQuota.
 */
export async function setQuota(context, page, bytes) {
  const u = new URL(page.url());
  const origin = `${u.protocol}//${u.host}`; // URL.origin is "null" for chrome-extension: in node
  let cdp = quotaSessions.get(page);
  if (!cdp) {
    cdp = await context.newCDPSession(page);
    quotaSessions.set(page, cdp);
  }
  const params = { origin };
  if (bytes !== null && bytes !== undefined) params.quotaSize = bytes;
  await cdp.send('Storage.overrideQuotaForOrigin', params);
  if (bytes === null || bytes === undefined) {
    quotaSessions.delete(page);
    await cdp.detach().catch(() => {});
  }
}

let quotaDistDir = null;

/**
 * A copy of the built extension without the `unlimitedStorage` permission (in a temp dir, made once
 * per process), so that a quota override limits OPFS writes (see setQuota).
 */
export function quotaDist() {
  if (quotaDistDir) return quotaDistDir;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-dist-quota-'));
  fs.cpSync(DIST, dir, { recursive: true });
  const mf = path.join(dir, 'manifest.json');
  const m = JSON.parse(fs.readFileSync(mf, 'utf8'));
  m.permissions = (m.permissions ?? []).filter((p) => p !== 'unlimitedStorage');
  fs.writeFileSync(mf, JSON.stringify(m, null, 1));
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  quotaDistDir = dir;
  return dir;
}

/** Closes the extension's offscreen document from its service worker. */
export async function closeOffscreen(serviceWorker) {
  return serviceWorker.evaluate(async () => {
    const has = await chrome.offscreen.hasDocument?.();
    if (has === false) return false;
    await chrome.offscreen.closeDocument();
    return true;
  });
}

/** Whether the offscreen document is open (from the browser's targets). */
export async function offscreenOpen(context) {
  const cdp = await browserSession(context);
  const { targetInfos } = await cdp.send('Target.getTargets');
  return targetInfos.some((t) => t.url.includes('/offscreen.html'));
}

// ---------------------------------------------------------------------------------------------
// Browser internals over CDP

/**
 * Stops the extension's service worker (CDP ServiceWorker.stopAllWorkers) and waits until it has
 * stopped. It may be running again by then: a download worker's next progress message wakes it at once.
 */
export async function stopServiceWorker(context, page, { timeoutMs = 15_000 } = {}) {
  const helper = page ?? (await context.newPage());
  const cdp = await context.newCDPSession(helper);
  const versions = new Map();
  let asked = false;
  let stoppedSinceAsked = false;
  cdp.on('ServiceWorker.workerVersionUpdated', ({ versions: vs }) => {
    for (const v of vs) {
      versions.set(v.versionId, v);
      if (asked && v.scriptURL.startsWith('chrome-extension://') && v.runningStatus === 'stopped') stoppedSinceAsked = true;
    }
  });
  await cdp.send('ServiceWorker.enable');
  asked = true;
  await cdp.send('ServiceWorker.stopAllWorkers');
  const deadline = Date.now() + timeoutMs;
  try {
    for (;;) {
      const ext = [...versions.values()].filter((v) => v.scriptURL.startsWith('chrome-extension://'));
      if (stoppedSinceAsked || (ext.length > 0 && ext.every((v) => v.runningStatus === 'stopped'))) return;
      if (Date.now() > deadline) {
        throw new Error(`service worker did not stop: ${JSON.stringify(ext.map((v) => v.runningStatus))}`);
      }
      await sleep(100);
    }
  } finally {
    await cdp.send('ServiceWorker.disable').catch(() => {});
    await cdp.detach().catch(() => {});
    if (!page) await helper.close();
  }
}

/**
 * The dedicated workers alive in the browser, from a browser-level CDP session (Target.getTargets):
 * [{ targetId, url, parentId, parentUrl, parentType }].
 *
 * Chromium 156 lists a dedicated worker of an offscreen document with an empty `url` and `title`
 * (a page's workers have theirs), and attaching to such a worker and evaluating `location.href`
 * gets no answer. What is always known is its parent: `parentId` is the offscreen document's target
 * (type `background_page`, url `.../offscreen.html`). So stage workers are identified by their
 * parent; a worker appears in the list as soon as it is constructed and disappears when terminated.
 * Chromium 148 (Debian's in December 2026) has no `parentId` in a target's info at all; there, a
 * worker without a url and without a parent is taken for the offscreen document's (the only context
 * of the extension that starts workers).
 */
export async function listWorkers(context) {
  const cdp = await browserSession(context);
  const { targetInfos } = await cdp.send('Target.getTargets');
  const byId = new Map(targetInfos.map((t) => [t.targetId, t]));
  return targetInfos
    .filter((t) => t.type === 'worker')
    .map((w) => {
      const parent = byId.get(w.parentId ?? w.openerId ?? '') ?? null;
      return {
        targetId: w.targetId,
        url: w.url,
        parentId: parent?.targetId ?? null,
        parentUrl: parent?.url ?? '',
        parentType: parent?.type ?? '',
      };
    });
}

const browserSessions = new WeakMap();

async function browserSession(context) {
  let s = browserSessions.get(context);
  if (!s) {
    s = await context.browser().newBrowserCDPSession();
    browserSessions.set(context, s);
  }
  return s;
}

/**
 * Polls listWorkers every `intervalMs` until stop() is called; returns { stop, samples } where
 * samples is [{ t, workers }] (t: ms since start).
 */
export function watchWorkers(context, { intervalMs = 100 } = {}) {
  const samples = [];
  const t0 = Date.now();
  let running = true;
  const loop = (async () => {
    while (running) {
      try {
        samples.push({ t: Date.now() - t0, workers: await listWorkers(context) });
      } catch (e) {
        if (running) samples.push({ t: Date.now() - t0, error: String(e) });
      }
      await sleep(intervalMs);
    }
  })();
  return {
    samples,
    stop: async () => {
      running = false;
      await loop;
      return samples;
    },
  };
}

/** Whether a worker is a stage (or pack) worker: its parent is the offscreen document (see listWorkers). */
export function isStageWorker(w) {
  return w.parentUrl.includes('/offscreen.html') || w.url.includes('stage-worker') || (w.parentId === null && w.url === '');
}

// ---------------------------------------------------------------------------------------------
// Processes and misc

/** Runs a command; resolves { code, stdout, stderr }. */
export function run(cmd, args, { cwd = ROOT, timeoutMs = 600_000, env = process.env } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/**
 * Recomputes the image with the Python reference and compares it with `png` (a path):
 * reference.py --pack DIR --trace T.json --out REF.png, then compare.py OUT REF --tol TOL.
 * Returns the compare output; throws with both outputs if either fails.
 */
export async function compareWithReference({ packDir, traceJson, png, tol, name }) {
  const ref = path.join(OUT, `${name}.ref.png`);
  const r1 = await run('python3', ['tests/reference/reference.py', '--pack', packDir, '--trace', traceJson, '--out', ref]);
  if (r1.code !== 0) throw new Error(`reference.py failed (${r1.code}):\n${r1.stdout}\n${r1.stderr}`);
  const r2 = await run('python3', ['tests/reference/compare.py', png, ref, '--tol', String(tol)]);
  if (r2.code !== 0) throw new Error(`compare.py ${png} ${ref} --tol ${tol} failed (${r2.code}):\n${r2.stdout}\n${r2.stderr}`);
  return r2.stdout;
}

/** The tEXt/zTXt/iTXt chunks of a PNG: [{ type, keyword, text }] (zTXt text is left compressed). */
export function pngTextChunks(buf) {
  const sig = Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]);
  if (!buf.subarray(0, 8).equals(sig)) throw new Error('not a PNG');
  const chunks = [];
  let off = 8;
  while (off + 8 <= buf.length) {
    const len = buf.readUInt32BE(off);
    const type = buf.toString('latin1', off + 4, off + 8);
    const data = buf.subarray(off + 8, off + 8 + len);
    if (type === 'tEXt' || type === 'iTXt' || type === 'zTXt') {
      const nul = data.indexOf(0);
      const keyword = data.toString('latin1', 0, nul);
      let text = '';
      if (type === 'tEXt') text = data.toString('latin1', nul + 1);
      if (type === 'iTXt') {
        // keyword\0 flag method lang\0 translated\0 text
        const flag = data[nul + 1];
        let p = nul + 3;
        p = data.indexOf(0, p) + 1;
        p = data.indexOf(0, p) + 1;
        text = flag === 0 ? data.toString('utf8', p) : '';
      }
      chunks.push({ type, keyword, text });
    }
    if (type === 'IEND') break;
    off += 12 + len;
  }
  return chunks;
}

export function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * For a node:test test: starts a fake Hub serving the fixture packs (unless `pack` is null and
 * `hubOptions.repos` is not given), launches a fresh browser profile and installs `fixtures/<pack>`
 * (with `backend`; f16 defaults to 'wasm', the float16 reference path; on WebGPU it is converted to
 * float32 first, see f32-conversion.test.mjs). Closes
 * everything when the test ends. Returns launch()'s object plus `hub` and `repo`.
 */
export async function setup(t, { pack = 'f32', install = true, backend, hubOptions = {}, ...launchOpts } = {}) {
  const hub = pack || hubOptions.repos ? await startHub(hubOptions) : null;
  const b = await launch(launchOpts);
  const ctx = { ...b, hub, repo: pack ? `fixtures/${pack}` : null };
  t.after(async () => {
    await ctx.close();
    await hub?.close();
  });
  await collectEvents(b.page);
  if (hub && pack && install) {
    await installPack(b.page, hub, ctx.repo, { backend: backend ?? (pack === 'f16' ? 'wasm' : undefined) });
  }
  return ctx;
}

/** Prints `rows` under the headings `cols` as aligned columns (the benches' reports). */
export function printTable(cols, rows) {
  const widths = cols.map((c, i) => Math.max(c.length, ...rows.map((r) => String(r[i]).length)));
  const line = (cells) => cells.map((c, i) => (i === 0 ? String(c).padEnd(widths[i]) : String(c).padStart(widths[i]))).join('  ');
  console.log(line(cols));
  console.log(widths.map((w) => '-'.repeat(w)).join('  '));
  for (const r of rows) console.log(line(r));
}

/**
 * A loopback server for the ONNX Runtime benchmarks (bench-blocks, bench-layout): `/` is `page`,
 * `/worker.mjs` is `worker`, `/ort/NAME` the extension's ORT file NAME, any other `/NAME` the file NAME
 * in `dir`, streamed (weights can be gigabytes). Listening when it resolves.
 */
export async function serveOrtBench({ page, worker, dir }) {
  const types = { '.mjs': 'text/javascript', '.wasm': 'application/wasm' };
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://localhost');
    const send = (body, type) => res.writeHead(200, { 'content-type': type }).end(body);
    if (url.pathname === '/') return send(page, 'text/html');
    if (url.pathname === '/worker.mjs') return send(worker, 'text/javascript');
    const file = url.pathname.startsWith('/ort/')
      ? path.join(DIST, 'ort', path.basename(url.pathname))
      : path.join(dir, path.basename(url.pathname));
    if (!fs.existsSync(file)) return res.writeHead(404).end();
    res.writeHead(200, { 'content-type': types[path.extname(file)] ?? 'application/octet-stream', 'content-length': fs.statSync(file).size });
    fs.createReadStream(file).pipe(res);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return server;
}
