// Chromium with the extension loaded: launching it, its pages and service worker, and a test's whole
// setup (fake Hub, browser, installed pack).

import { chromium } from 'playwright-core';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { collectEvents, installPack, startHub } from './api.mjs';
import { CHROMIUM, DIST, testFlags, webgpuArgs } from './config.mjs';

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
    ...testFlags(),
  ];
}

export function isHeadless() {
  if (process.env.IMAGINE_HEADLESS === '1') return true;
  return !process.env.DISPLAY;
}

/**
 * The features Playwright turns off and on at every launch (`chromiumSwitches` of the playwright-core
 * that package-lock.json pins). Chromium keeps only the last `--disable-features` and the last
 * `--enable-features`: `featureSwitches` merges ours with these into one of each, and `launch` fails if
 * Playwright's list has grown and a name of it would be lost.
 */
const PLAYWRIGHT_FEATURES = {
  disable: ['AvoidUnnecessaryBeforeUnloadCheckSync', 'DestroyProfileOnBrowserClose', 'HttpsUpgrades', 'HttpsFirstBalancedModeAutoEnable',
    'LensOverlay', 'MediaRouter', 'PaintHolding', 'ThirdPartyStoragePartitioning', 'AvoidCorsURLLoaderRestartOnRedirect',
    'TcpPortRandomizationWin', 'OptimizationHints', 'NetworkTimeServiceQuerying', 'AimEnabled', 'PreconnectToSearch',
    'msForceBrowserSignIn', 'msEdgeUpdateLaunchServicesPreferredVersion'],
  enable: ['CDPScreenshotNewSurface', 'SkipListAccountsWithoutGaiaCookies'],
};

/** `args` with their feature switches merged, with Playwright's, into one of each kind. */
function featureSwitches(args) {
  const names = { disable: [...PLAYWRIGHT_FEATURES.disable], enable: [...PLAYWRIGHT_FEATURES.enable] };
  const rest = args.filter((arg) => {
    const m = /^--(disable|enable)-features=(.*)$/.exec(arg);
    if (m) names[m[1]].push(...m[2].split(',').filter(Boolean));
    return !m;
  });
  return [...rest, ...Object.entries(names).map(([kind, list]) => `--${kind}-features=${[...new Set(list)].join(',')}`)];
}

/** Throws if a feature switch of the running browser drops a name that an earlier one of its kind gave. */
async function checkFeatureSwitches(browserCdp) {
  const { processInfo } = await browserCdp.send('SystemInfo.getProcessInfo');
  const argv = fs.readFileSync(`/proc/${processInfo.find((p) => p.type === 'browser').id}/cmdline`, 'utf8').split('\0');
  for (const kind of ['disable', 'enable']) {
    const lists = argv.filter((a) => a.startsWith(`--${kind}-features=`)).map((a) => a.slice(a.indexOf('=') + 1).split(','));
    const kept = new Set(lists.at(-1));
    const lost = [...new Set(lists.flat())].filter((name) => !kept.has(name));
    if (lost.length) throw new Error(`Chromium keeps only the last --${kind}-features: ${lost.join(', ')} would be lost; add them to PLAYWRIGHT_FEATURES (tests/e2e/lib/browser.mjs)`);
  }
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
    args: featureSwitches([...chromiumArgs(extDir), ...args]),
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
  await checkFeatureSwitches(browserCdp).catch(async (e) => {
    await context.close();
    throw e;
  });
  const b = { context, extensionId, serviceWorker, page, profileDir, browserCdp };
  /** Closes the browser; removes the profile if launch() made it (unless keepProfile). */
  b.close = async ({ keepProfile = false } = {}) => {
    await context.close().catch(() => {});
    if (ownProfile && !keepProfile) removeProfile(profileDir);
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
      if (ownProfile && !keepProfile) removeProfile(profileDir);
    };
    return nb;
  };
  return b;
}

/**
 * Removes a browser profile. A browser's last writes can land while the removal runs (ENOTEMPTY),
 * so it is tried again a few times rather than failing the test that used it.
 */
export function removeProfile(dir) {
  fs.rmSync(dir, { recursive: true, force: true, maxRetries: 10, retryDelay: 200 });
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
    try {
      await ctx.close();
    } finally {
      await hub?.close();
    }
  });
  await collectEvents(b.page);
  if (hub && pack && install) {
    await installPack(b.page, hub, ctx.repo, { backend: backend ?? (pack === 'f16' ? 'wasm' : undefined) });
  }
  return ctx;
}
