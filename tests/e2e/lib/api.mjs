// The message API from an extension page: requests, events, installs and generations, and the fake
// Hub's fixture packs.

import fs from 'node:fs';
import path from 'node:path';
import { startFakeHub } from './fake-hub.mjs';
import { setup } from './browser.mjs';
import { GENERATION_TIMEOUT_MS, INSTALL_TIMEOUT_MS, OUT, PACKS, STALL_MS } from './config.mjs';
import { sleep } from './process.mjs';

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

/** The offsets `hub` was asked to resume file `p` from (its `Range` requests' starts, 0s left out). */
export function resumedFrom(hub, p) {
  return hub.stats(p).ranges.map((r) => (r ? Number(/bytes=(\d+)-/.exec(r)?.[1]) : 0)).filter((n) => n > 0);
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

/** Records the type of every message the page sends from now on (in `window.__sent`). */
export async function recordSent(page) {
  await page.evaluate(() => {
    window.__sent = [];
    const send = chrome.runtime.sendMessage.bind(chrome.runtime);
    chrome.runtime.sendMessage = (message, ...rest) => {
      window.__sent.push(message?.type);
      return send(message, ...rest);
    };
  });
}
