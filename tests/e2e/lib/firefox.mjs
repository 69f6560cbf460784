// Firefox ESR with the extension's Firefox build (`cargo xtask build --browser firefox`: dist-firefox/),
// driven by puppeteer-core over WebDriver BiDi. WebGPU is behind a pref in Firefox on Linux; here it runs
// on Mesa's lavapipe (Vulkan on the CPU), which, unlike Chromium's SwiftShader, has `shader-f16`.
//
// Firefox gives each installation a random origin (`moz-extension://<uuid>/`); the pref
// `extensions.webextensions.uuids` fixes it, so a test can open the extension's pages. Since Firefox 153,
// WebDriver navigates to `moz-extension:` pages only with `--remote-allow-system-access`.

import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import puppeteer from 'puppeteer-core';
import { startHub } from './api.mjs';
import { isHeadless, removeProfile } from './browser.mjs';
import { ROOT } from './config.mjs';

export const FIREFOX = process.env.IMAGINE_FIREFOX || '/usr/bin/firefox-esr';
export const FIREFOX_DIST = path.join(ROOT, 'dist-firefox');
const ORIGIN_UUID = '6d1f0a52-3c1e-4a9b-9e57-1a2b3c4d5e6f';

/** The Firefox build's add-on id, as its manifest names it. */
function addonId() {
  const manifest = path.join(FIREFOX_DIST, 'manifest.json');
  if (!fs.existsSync(manifest)) throw new Error(`${manifest} is missing: run \`cargo xtask build --browser firefox\``);
  return JSON.parse(fs.readFileSync(manifest, 'utf8')).browser_specific_settings.gecko.id;
}

/** The URL of an extension page in the Firefox started by `setupFirefox`. */
export function firefoxPageUrl(page) {
  return `moz-extension://${ORIGIN_UUID}/${page}`;
}

/**
 * Puts the Firefox build into `profileDir` as an add-on of that profile (`extensions/<id>.xpi`), which
 * Firefox installs for good at its next start, unsigned where `xpinstall.signatures.required` is off
 * (ESR honours it; release builds do not): installed as a user has it, rather than as a temporary
 * add-on (WebDriver's `installExtension`), which must be installed again at every start. The file is
 * replaced only when the build changed: Firefox takes a new file for an update of the add-on.
 */
function placeInProfile(profileDir, id) {
  const xpi = path.join(profileDir, 'extensions', `${id}.xpi`);
  fs.mkdirSync(path.dirname(xpi), { recursive: true });
  const made = `${xpi}.new`;
  const files = fs.readdirSync(FIREFOX_DIST).map((f) => path.join(FIREFOX_DIST, f));
  execFileSync('python3', ['-m', 'zipfile', '-c', made, ...files]);
  if (fs.existsSync(xpi) && fs.readFileSync(xpi).equals(fs.readFileSync(made))) fs.rmSync(made);
  else fs.renameSync(made, xpi);
}

/**
 * Firefox with the extension installed and the popup open: { browser, page, open(name), close(),
 * relaunch() }. `profileDir`: a profile kept between launches, in which the add-on is installed for
 * good (`relaunch` closes Firefox and starts it again on it, as a user quitting and reopening it);
 * without one, a fresh profile and a temporary add-on. `webgpu: false` leaves WebGPU off, as Firefox
 * ships it on Linux; `prefs`: more of Firefox's preferences.
 */
export async function launchFirefox({ headless = isHeadless(), profileDir, webgpu = true, prefs = {} } = {}) {
  const id = addonId();
  if (profileDir) placeInProfile(profileDir, id);
  const permanent = profileDir
    ? { 'xpinstall.signatures.required': false, 'extensions.autoDisableScopes': 0, 'extensions.enabledScopes': 15 }
    : {};
  const browser = await puppeteer.launch({
    browser: 'firefox',
    executablePath: FIREFOX,
    headless,
    userDataDir: profileDir,
    args: ['--remote-allow-system-access'],
    extraPrefsFirefox: {
      'dom.webgpu.enabled': webgpu,
      'gfx.webgpu.ignore-blocklist': webgpu,
      'extensions.webextensions.uuids': JSON.stringify({ [id]: ORIGIN_UUID }),
      ...permanent,
      ...prefs,
    },
  });
  if (!profileDir) await browser.installExtension(FIREFOX_DIST);
  const open = async (name) => {
    const page = await browser.newPage();
    // An extension page never tells WebDriver it has loaded; its elements say so.
    await page.goto(firefoxPageUrl(name), { waitUntil: 'domcontentloaded', timeout: 2_000 }).catch(() => {});
    await page.waitForSelector('body > *', { timeout: 30_000 });
    return page;
  };
  const page = await open('popup.html');
  const close = () => quit(browser);
  const relaunch = async () => {
    await close();
    return launchFirefox({ headless, profileDir, webgpu, prefs });
  };
  return { browser, page, open, close, relaunch };
}

/**
 * Quits Firefox and waits for its process to end; kills it if it has not quit within 30 s. A Firefox
 * that outlives its test keeps the test file running until the runner's timeout, and writes into a
 * profile being removed.
 */
async function quit(browser) {
  const child = browser.process();
  const exited = new Promise((resolve) => {
    if (!child || child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once('exit', resolve);
  });
  const closing = browser.close().catch(() => {});
  const timer = setTimeout(() => child?.kill('SIGKILL'), 30_000);
  await exited;
  clearTimeout(timer);
  // Puppeteer then removes the temporary profile it made, if any.
  await Promise.race([closing, new Promise((resolve) => setTimeout(resolve, 5_000))]);
}

/**
 * `launchFirefox` (headless, `webgpu`, `prefs`) and a fake Hub serving `repos` (`hubOptions`: more of
 * `startHub`'s options): { browser, page, hub, open(name), relaunch() }. `keptProfile`: Firefox runs on a
 * profile of its own that `relaunch` keeps, with the add-on installed for good in it; otherwise on a
 * fresh temporary profile with a temporary add-on. When the test ends, Firefox (a relaunched one too)
 * quits, then the Hub closes and the profile is removed, in that order whatever fails.
 */
export async function setupFirefox(t, { repos = ['f16', 'f32'], hubOptions = {}, webgpu = true, prefs, keptProfile = false } = {}) {
  const hub = await startHub({ repos, ...hubOptions });
  const profileDir = keptProfile ? fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-firefox-')) : undefined;
  let current = null;
  t.after(async () => {
    try {
      await current?.close();
    } finally {
      await hub.close();
      if (profileDir) removeProfile(profileDir);
    }
  });
  current = await launchFirefox({ headless: true, webgpu, prefs, profileDir });
  const relaunch = async () => {
    current = await current.relaunch();
    return current;
  };
  return { ...current, hub, relaunch };
}

/**
 * Runs `fn` in Firefox's browser window, in its parent process, with `args` (JSON values); returns what
 * it returns (a JSON value). WebDriver BiDi reaches the browser window's privileged scope where Firefox
 * allows system access (`--remote-allow-system-access`; `browsingContext.getTree` with
 * `moz:scope: "chrome"` lists its windows), so a test can read and use Firefox's own UI, such as its
 * context menu.
 */
export async function inBrowserWindow(browser, fn, ...args) {
  const connection = browser.connection;
  const { result: tree } = await connection.send('browsingContext.getTree', { 'moz:scope': 'chrome' });
  const window = tree.contexts.find((c) => c.url === 'chrome://browser/content/browser.xhtml');
  if (!window) throw new Error(`no browser window among Firefox's windows: ${JSON.stringify(tree.contexts.map((c) => c.url))}`);
  const { result } = await connection.send('script.callFunction', {
    functionDeclaration: `async (args) => JSON.stringify((await (${fn})(...JSON.parse(args))) ?? null)`,
    target: { context: window.context },
    arguments: [{ type: 'string', value: JSON.stringify(args) }],
    awaitPromise: true,
  });
  if (result.type === 'exception') throw new Error(`in Firefox's browser window: ${result.exceptionDetails.text}`);
  return JSON.parse(result.result.value);
}

/**
 * Stands in for the system's notifications: headless Firefox shows none (its alerts service ends each
 * at once), so the add-on's `notifications` API never sees one stay. Registers an alerts service of the
 * test's in Firefox's parent process, in place of the system's: Firefox's own notifications API hands it
 * each notification an add-on creates, and what it shows and is clicked goes back through that API as
 * from the system. Returns { shown() (each notification shown and not yet closed: { name, title, text,
 * imageURL, textClickable }), click(name) (as a user's click on it) }.
 */
export async function fakeSystemNotifications(browser) {
  await inBrowserWindow(browser, () => {
    const open = new Map();
    const service = {
      QueryInterface: ChromeUtils.generateQI(['nsIAlertsService']),
      showAlert(alert, listener) {
        const { name, title, text, imageURL, textClickable, cookie } = alert;
        open.set(name, { shown: { name, title, text, imageURL, textClickable }, listener, cookie });
        listener?.observe(null, 'alertshow', cookie);
      },
      closeAlert(name) {
        const alert = open.get(name);
        open.delete(name);
        alert?.listener?.observe(null, 'alertfinished', alert.cookie);
      },
    };
    window.imagineTestAlerts = open;
    const factory = { createInstance: (iid) => service.QueryInterface(iid), QueryInterface: ChromeUtils.generateQI(['nsIFactory']) };
    Components.manager.QueryInterface(Ci.nsIComponentRegistrar)
      .registerFactory(Services.uuid.generateUUID(), 'Imagine test: system notifications', '@mozilla.org/alerts-service;1', factory);
  });
  return {
    shown: () => inBrowserWindow(browser, () => [...window.imagineTestAlerts.values()].map((a) => a.shown)),
    click: (name) => inBrowserWindow(browser, (n) => {
      const alert = window.imagineTestAlerts.get(n);
      if (!alert) throw new Error(`no notification ${n} is shown`);
      alert.listener.observe(null, 'alertclickcallback', alert.cookie);
    }, name),
  };
}
