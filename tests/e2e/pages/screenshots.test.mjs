// The screenshots of README.md and docs/, made from the extension itself (the fake Hub and the tiny
// fixture pack): the first run (the studio's guided setup), a download in progress, a result, the
// gallery and the options page, each in the light and the dark theme, 800 pixels wide.
//
//   IMAGINE_SCREENSHOTS=docs/screenshots node --test tests/e2e/pages/screenshots.test.mjs
//   IMAGINE_SCREENSHOTS=docs/screenshots IMAGINE_SCREENSHOTS_LANG=de node --test tests/e2e/pages/screenshots.test.mjs
//
// makes the committed ones again (the second, the German ones: `<name>-de-<scheme>.png`); without
// IMAGINE_SCREENSHOTS they go to tests/e2e/out/screenshots/. The test checks that
// every one was made, at its size, not what is in it: pixels differ with the Chromium version.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const DIR = process.env.IMAGINE_SCREENSHOTS ? path.resolve(process.env.IMAGINE_SCREENSHOTS) : path.join(h.OUT, 'screenshots');
const VIEWPORT = { width: 800, height: 900 };
const LANG = process.env.IMAGINE_SCREENSHOTS_LANG || 'en';
const SHOTS = ['first-run', 'download', 'result', 'result-page', 'gallery', 'gallery-undo', 'options', 'options-checked'];
/** The file of screenshot `name` in `scheme`, in this run's language. */
const file = (name, scheme) => path.join(DIR, `${name}${LANG === 'en' ? '' : `-${LANG}`}-${scheme}.png`);

async function shoot(page, name) {
  fs.mkdirSync(DIR, { recursive: true });
  for (const scheme of ['light', 'dark']) {
    await page.emulateMedia({ colorScheme: scheme });
    await h.sleep(200);
    await page.screenshot({ path: file(name, scheme) });
  }
  await page.emulateMedia({ colorScheme: null });
}

async function open(b, file) {
  const page = await b.context.newPage();
  await page.setViewportSize(VIEWPORT);
  await page.goto(h.extensionUrl(b.extensionId, file));
  return page;
}

/** Width and height from a PNG's IHDR. */
function pngSize(file) {
  const bytes = fs.readFileSync(file);
  assert.equal(bytes.subarray(1, 4).toString(), 'PNG', file);
  return { width: bytes.readUInt32BE(16), height: bytes.readUInt32BE(20) };
}

test('the screenshots of README.md and docs/ are made, light and dark', { timeout: 600_000 }, async (t) => {
  for (const name of SHOTS) for (const scheme of ['light', 'dark']) fs.rmSync(file(name, scheme), { force: true });
  const b = await h.setupPadded(t, { args: [`--lang=${LANG}`] });
  b.hub.inject(h.BIG_SHARD, { type: 'slow', bytesPerSecond: 1 << 20 });
  await b.page.evaluate(([endpoint, repo]) => chrome.storage.local.set({ 'imagine.source': { endpoint, repo, revision: 'main' } }), [b.hub.url, b.repo]);

  const studio = await open(b, 'studio.html');
  await studio.waitForSelector('#setup', { state: 'visible', timeout: 15_000 });
  await studio.waitForFunction(() => document.querySelector('#device-verdict').textContent.length > 0);
  await shoot(studio, 'first-run');

  await studio.click('#install');
  await studio.waitForFunction(() => Number(document.querySelector('#download-bar').getAttribute('aria-valuenow')) >= 20, null, { timeout: 60_000 });
  await studio.waitForFunction(() => /\d/.test(document.querySelector('#download-eta').textContent));
  await shoot(studio, 'download');
  b.hub.clearFaults();
  await h.waitForInstall(b.page);

  await studio.waitForSelector('#setup', { state: 'hidden', timeout: 15_000 });
  await studio.fill('#prompt', 'a lighthouse on a cliff at dusk, oil painting');
  await studio.fill('#steps', '2');
  // Small: the fixture's image is noise, which PNG does not compress.
  await studio.fill('#width', '256');
  await studio.fill('#height', '256');
  await studio.click('#generate');
  await studio.waitForSelector('#result', { state: 'visible', timeout: h.GENERATION_TIMEOUT_MS });
  await studio.waitForFunction(() => document.querySelector('#image').naturalWidth > 0);
  await h.sleep(500); // the studio scrolls the result into view once decoded
  await shoot(studio, 'result');

  // The page "Imagine from selected text" opens where the side panel cannot: its progress and Cancel.
  await b.page.evaluate(() => chrome.storage.local.set({ 'imagine.defaults': { width: 256, height: 256, steps: 50, schedule: 'empirical' } }));
  const sw = await h.currentServiceWorker(b.context, b.extensionId);
  const [resultPage] = await Promise.all([
    b.context.waitForEvent('page', { timeout: 30_000 }),
    sw.evaluate(() =>
      chrome.contextMenus.onClicked.dispatch(
        { menuItemId: 'imagine-selection', selectionText: 'a lighthouse on a cliff at dusk, oil painting', editable: false, pageUrl: 'https://example.com/' },
        { id: -1 },
      ),
    ),
  ]);
  await resultPage.setViewportSize(VIEWPORT);
  await resultPage.waitForFunction(() => document.querySelector('#stage-steps')?.className === 'now' && /\d/.test(document.querySelector('#timing').textContent), null, { timeout: 60_000 });
  await shoot(resultPage, 'result-page');
  await resultPage.click('#cancel');
  await resultPage.waitForSelector('#run', { state: 'hidden', timeout: 30_000 });
  await resultPage.close();

  for (const [prompt, seed] of [['a red boat in a harbour', '11'], ['a forest path in autumn', '12']]) {
    await h.generateOk(b.page, { prompt, width: 256, height: 256, steps: 1, seed });
  }
  const gallery = await open(b, 'gallery.html');
  await gallery.waitForFunction(() => document.querySelectorAll('#grid img').length >= 3, null, { timeout: 30_000 });
  await gallery.waitForFunction(() => [...document.querySelectorAll('#grid img')].every((i) => i.complete && i.naturalWidth > 0));
  await shoot(gallery, 'gallery');
  await gallery.click('#grid button.thumb');
  await gallery.waitForSelector('#viewer[open]');
  await gallery.click('#delete');
  await gallery.waitForSelector('#undo-bar', { state: 'visible' });
  await shoot(gallery, 'gallery-undo');
  await gallery.click('#undo');

  const options = await open(b, 'options.html');
  await options.waitForSelector('#delete-pack', { state: 'visible', timeout: 15_000 });
  await options.waitForFunction(() => document.querySelector('#device-verdict').textContent.length > 0);
  await options.evaluate(() => document.querySelector('#model-heading').scrollIntoView());
  await shoot(options, 'options');
  await options.fill('#default-width', '300');
  await options.fill('#default-steps', '99');
  await options.click('#save-defaults');
  await options.waitForSelector('#default-steps-error', { state: 'visible' });
  await options.evaluate(() => document.querySelector('#defaults-heading').scrollIntoView());
  await shoot(options, 'options-checked');

  for (const name of SHOTS) {
    for (const scheme of ['light', 'dark']) {
      assert.deepEqual(pngSize(file(name, scheme)), VIEWPORT, `${name}-${scheme}`);
    }
  }
});
