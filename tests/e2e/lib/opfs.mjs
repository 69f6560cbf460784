// The extension's OPFS, its storage quota, failpoints and the offscreen document.

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { browserSession } from './cdp.mjs';
import { DIST, INSTALL_TIMEOUT_MS } from './config.mjs';
import { sleep } from './process.mjs';

/**
 * The OPFS of the extension, from an extension page: { 'packs/a/x.onnx': size, 'packs/b/': 0, … } (dirs end
 * in /). An entry the extension removes while it is read is left out.
 */
export async function opfsTree(page) {
  return page.evaluate(async () => {
    const out = {};
    const gone = (e) => e?.name === 'NotFoundError';
    const walk = async (dir, prefix) => {
      try {
        for await (const [name, h] of dir.entries()) {
          if (h.kind === 'directory') {
            out[`${prefix}${name}/`] = 0;
            await walk(h, `${prefix}${name}/`);
          } else {
            try {
              out[`${prefix}${name}`] = (await h.getFile()).size;
            } catch (e) {
              if (!gone(e)) throw e;
            }
          }
        }
      } catch (e) {
        if (!gone(e)) throw e;
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

/** Removes an OPFS file or directory (`dir/name` from the root); absent is fine. */
export async function opfsRemove(page, filePath) {
  return page.evaluate(async (p) => {
    let dir = await navigator.storage.getDirectory();
    const parts = p.split('/');
    try {
      for (const part of parts.slice(0, -1)) dir = await dir.getDirectoryHandle(part);
      await dir.removeEntry(parts.at(-1), { recursive: true });
    } catch (e) {
      if (e.name !== 'NotFoundError') throw e;
    }
  }, filePath);
}

/** Inverts `count` bytes of an OPFS file from `offset`, keeping its length (a same-length corruption). */
export async function opfsFlipBytes(page, filePath, offset, count) {
  return page.evaluate(async ({ p, offset, count }) => {
    let dir = await navigator.storage.getDirectory();
    const parts = p.split('/');
    for (const part of parts.slice(0, -1)) dir = await dir.getDirectoryHandle(part);
    const handle = await dir.getFileHandle(parts.at(-1));
    const bytes = new Uint8Array(await (await handle.getFile()).slice(offset, offset + count).arrayBuffer());
    for (let i = 0; i < bytes.length; i++) bytes[i] ^= 0xff;
    const w = await handle.createWritable({ keepExistingData: true });
    await w.write({ type: 'write', position: offset, data: bytes });
    await w.close();
  }, { p: filePath, offset, count });
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
 * What it does in Chromium 148 and 156 (checked by the download-interrupt and download-basic tests):
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

/**
 * The files under `dir` (a browser profile, on this machine's disk) that hold any of `needles` (strings,
 * searched as UTF-8 and UTF-16LE, or Buffers): [{ file, needle }], `file` relative to `dir`. Files that
 * vanish or cannot be read while the browser writes are skipped; links are not followed.
 */
export function filesHolding(dir, needles) {
  const patterns = needles.flatMap((n) => (Buffer.isBuffer(n) ? [[n, n]] : [[Buffer.from(n, 'utf8'), n], [Buffer.from(n, 'utf16le'), n]]));
  const found = [];
  const walk = (d) => {
    let entries;
    try {
      entries = fs.readdirSync(d, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) {
        let bytes;
        try {
          bytes = fs.readFileSync(p);
        } catch {
          continue;
        }
        for (const [pattern, needle] of patterns) {
          if (bytes.includes(pattern)) found.push({ file: path.relative(dir, p), needle: Buffer.isBuffer(needle) ? `${needle.length} bytes of the image` : needle });
        }
      }
    }
  };
  walk(dir);
  return found;
}
