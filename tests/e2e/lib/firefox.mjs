// Firefox ESR with the extension's Firefox build (`cargo xtask build --browser firefox`: dist-firefox/),
// driven by puppeteer-core over WebDriver BiDi. WebGPU is behind a pref in Firefox on Linux; here it runs
// on Mesa's lavapipe (Vulkan on the CPU), which, unlike Chromium's SwiftShader, has `shader-f16`.
//
// Firefox gives each installation a random origin (`moz-extension://<uuid>/`); the pref
// `extensions.webextensions.uuids` fixes it, so a test can open the extension's pages. Since Firefox 153,
// WebDriver navigates to `moz-extension:` pages only with `--remote-allow-system-access`.

import fs from 'node:fs';
import path from 'node:path';
import puppeteer from 'puppeteer-core';
import { startHub } from './api.mjs';
import { isHeadless } from './browser.mjs';
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
 * Firefox with the extension installed and the popup open: { browser, page, open(name), close() }.
 * `profileDir`: a profile kept between launches (default: a fresh one); `webgpu: false` leaves WebGPU
 * off, as Firefox ships it on Linux; `prefs`: more of Firefox's preferences.
 */
export async function launchFirefox({ headless = isHeadless(), profileDir, webgpu = true, prefs = {} } = {}) {
  const id = addonId();
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
      ...prefs,
    },
  });
  await browser.installExtension(FIREFOX_DIST);
  const open = async (name) => {
    const page = await browser.newPage();
    // An extension page never tells WebDriver it has loaded; its elements say so.
    await page.goto(firefoxPageUrl(name), { waitUntil: 'domcontentloaded', timeout: 2_000 }).catch(() => {});
    await page.waitForSelector('body > *', { timeout: 30_000 });
    return page;
  };
  const page = await open('popup.html');
  return { browser, page, open, close: () => browser.close().catch(() => {}) };
}

/**
 * `launchFirefox` (headless, a fresh profile, `webgpu`, `prefs`) and a fake Hub serving `repos`:
 * { browser, page, hub, open(name) }. Both closed when the test ends.
 */
export async function setupFirefox(t, { repos = ['f16', 'f32'], webgpu = true, prefs } = {}) {
  const hub = await startHub({ repos });
  t.after(() => hub.close());
  const ff = await launchFirefox({ headless: true, webgpu, prefs });
  t.after(() => ff.close());
  return { ...ff, hub };
}
