// The model's setup: one verdict on this device in plain language, the same on the options
// page, the popup and the studio (the plan's sizes once asked for, the published pack's "about" before;
// a software renderer warned about; the raw limits behind "Details"); the guided setup of the studio and
// the popup until the model is installed (what it is, its size, Download, then the progress in place with
// pause and cancel, followed by every page; Generate held back with its reason); the options page's
// model section, which never offers Download next to Delete for the installed pack; and the first-time
// flow, from a fresh profile to an image on screen. English and German; axe in light and dark.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const PANEL = { width: 420, height: 1000 };

const TEXT = {
  en: {
    converted: (extra) => `This GPU cannot run the model as published, so Imagine adapts it once while downloading (${extra} on disk); after that it runs like any other.`,
    about: (size) => `about ${size}`,
    number: (text) => text.replace(' ', '\u00a0'),
    software: 'This is a software renderer (SwiftShader), not a GPU: each image will be very slow (minutes).',
    intro: (size) => `Imagine makes images with FLUX.2 [klein] 4B on this device. The model is downloaded once (${size}); after that Imagine works offline.`,
    reason: 'Generate works once the model is downloaded.',
    details: 'Details',
    installed: 'Installed: ',
    timeLeft: /^about \d+(\.\d)?\u00a0(s|min|h) left$/,
    popupInstalled: 'Model installed ',
  },
  de: {
    converted: (extra) => `Diese GPU kann das Modell nicht so ausführen, wie es veröffentlicht ist; Imagine passt es daher beim Download einmal an (${extra} auf der Festplatte), danach läuft es wie jedes andere.`,
    about: (size) => `etwa ${size}`,
    // German writes a decimal comma.
    number: (text) => text.replace('.', ',').replace(' ', '\u00a0'),
    software: 'Dies ist ein Software-Renderer (SwiftShader), keine GPU: Jedes Bild dauert Minuten.',
    intro: (size) => `Imagine erzeugt Bilder mit FLUX.2 [klein] 4B auf diesem Gerät. Das Modell wird einmalig heruntergeladen (${size}); danach funktioniert Imagine offline.`,
    reason: 'Erzeugen ist möglich, sobald das Modell heruntergeladen ist.',
    details: 'Details',
    installed: 'Installiert: ',
    timeLeft: /^noch etwa \d+(,\d)?\u00a0(s|min|h)$/,
    popupInstalled: 'Modell installiert ',
  },
};

/** Bytes as the verdict says them. */
const size = (bytes) => h.formatBytes(bytes);

async function open(b, file, viewport = PANEL) {
  const page = await b.context.newPage();
  await page.setViewportSize(viewport);
  page.on('pageerror', (e) => console.log(`${file} error: ${e}`));
  await page.goto(h.extensionUrl(b.extensionId, file));
  return page;
}

/** The verdict and its warning once the page has said them. */
async function verdict(page) {
  await page.waitForFunction(() => document.querySelector('#device-verdict')?.textContent.trim().length > 0, null, { timeout: 30_000 });
  return {
    verdict: (await page.textContent('#device-verdict')).trim(),
    warning: (await page.isVisible('#device-warning')) ? (await page.textContent('#device-warning')).trim() : null,
  };
}

async function assertAxeBothThemes(page, what) {
  for (const colorScheme of ['light', 'dark']) {
    await page.emulateMedia({ colorScheme });
    assert.deepEqual(await h.axeViolations(page), [], `${what} ${colorScheme}`);
  }
  await page.emulateMedia({ colorScheme: null });
}

/** Saves the pack source as the options page does (without its host-permission prompt, which a test cannot answer). */
async function saveSource(page, hub, repo) {
  await page.evaluate(([endpoint, repo]) => chrome.storage.local.set({ 'imagine.source': { endpoint, repo, revision: 'main' } }), [hub.url, repo]);
}

/** Generate is held back, focusable, its reason shown and tied to it; a click starts nothing. */
async function assertGenerateHeld(page, reason) {
  await page.waitForSelector('#generate[aria-disabled="true"]', { timeout: 15_000 });
  assert.equal(await page.evaluate(() => document.querySelector('#generate').disabled), false, 'held back with aria-disabled, still focusable');
  assert.ok((await page.getAttribute('#generate', 'aria-describedby')).split(/\s+/).includes('generate-reason'));
  assert.equal((await page.textContent('#generate-reason')).trim(), reason);
  assert.equal(await page.isVisible('#generate-reason'), true);
  await h.recordSent(page);
  await page.fill('#prompt', 'a red boat');
  // Reached and pressed by keyboard (Playwright's click waits for it to be enabled).
  await page.focus('#generate');
  await page.keyboard.press('Enter');
  await h.sleep(300);
  const sent = await page.evaluate(() => window.__sent);
  assert.ok(!sent.includes('generate'), `sent: ${JSON.stringify(sent)}`);
}

for (const lang of ['en', 'de']) {
  const say = TEXT[lang];

  test(`one device verdict (${lang}): the options page, the popup and the studio say the same, the plan's sizes once asked`, { timeout: 180_000 }, async (t) => {
    const b = await h.setup(t, { pack: 'f16', install: false, args: [`--lang=${lang}`] });
    await saveSource(b.page, b.hub, b.repo);
    const pages = { options: await open(b, 'options.html', { width: 900, height: 900 }), popup: b.page, studio: await open(b, 'studio.html') };
    await b.page.reload();
    // Before any plan: the published pack's figures, said as "about"; SwiftShader has no shader-f16.
    const expected = { verdict: say.converted(say.about(say.number('+892 MB'))), warning: say.software };
    for (const [name, page] of Object.entries(pages)) assert.deepEqual(await verdict(page), expected, name);
    // The raw limits behind a closed "Details", in readable units.
    const options = pages.options;
    assert.equal((await options.textContent('#device-report')).length > 0, true);
    assert.equal(await options.evaluate(() => document.querySelector('#device-report').closest('details').open), false);
    assert.equal((await options.textContent('details:has(#device-report) > summary')).trim(), say.details);
    const limits = await options.$$eval('#device-report dt', (dts) => Object.fromEntries(dts.map((dt) => [dt.textContent, dt.nextElementSibling.textContent])));
    assert.match(limits.maxBufferSize, lang === 'de' ? /^\d+(,\d+)?\u00a0(GB|MB)$/ : /^\d+(\.\d+)?\u00a0(GB|MB)$/, JSON.stringify(limits));

    // The popup asks for the size: every page then says this plan's extra disk, without "about".
    const plan = await h.api(b.page, { type: 'planPack', endpoint: b.hub.url, repo: b.repo, revision: 'main' });
    assert.ok(plan.conversion?.extraDiskBytes > 0, JSON.stringify(plan.conversion));
    await b.page.click('#check-size');
    const planned = { verdict: say.converted(say.number(`+${size(plan.conversion.extraDiskBytes)}`)), warning: say.software };
    await b.page.waitForFunction((text) => document.querySelector('#device-verdict').textContent === text, planned.verdict, { timeout: 30_000 });
    for (const [name, page] of Object.entries(pages)) {
      if (page !== b.page) await page.reload();
      assert.deepEqual(await verdict(page), planned, name);
      await assertAxeBothThemes(page, name);
    }
    assert.equal((await pages.studio.textContent('#setup-intro')).trim(), say.intro(say.number(size(plan.totalBytes))));
  });

  test(`guided setup (${lang}): the studio downloads in place, every page follows with pause and cancel; Generate held back until installed`, { timeout: 300_000 }, async (t) => {
    const b = await h.setupPadded(t, { args: [`--lang=${lang}`] });
    // Slow enough that the download is still running at the pause below, after six axe runs and a
    // reload (at 2 MiB/s it once finished first, under load).
    b.hub.inject(h.BIG_SHARD, { type: 'slow', bytesPerSecond: 512 << 10 });
    await saveSource(b.page, b.hub, b.repo);
    const studio = await open(b, 'studio.html');
    await studio.waitForSelector('#setup', { state: 'visible', timeout: 15_000 });
    assert.equal((await studio.textContent('#setup-intro')).trim(), say.intro(say.about(say.number('6.5 GB'))));
    assert.deepEqual(await verdict(studio), { verdict: say.converted(say.about(say.number('+892 MB'))), warning: say.software });
    assert.equal(await studio.getAttribute('#install', 'class'), 'primary');
    // "Download it" is no link to the popup opened as a tab any more.
    assert.equal(await studio.$('a[href*="popup.html"]'), null);
    await assertGenerateHeld(studio, say.reason);
    await assertAxeBothThemes(studio, 'studio setup');

    const pagesBefore = b.context.pages().length;
    // The source is a mirror (the fake Hub): its host permission is asked for within the click, as
    // the popup and the options page do. A prompt nobody answers holds nothing up.
    await studio.evaluate(() => {
      chrome.permissions.request = ({ origins }) => {
        window.__asked = origins;
        return new Promise(() => {});
      };
    });
    await studio.click('#install');
    await studio.waitForSelector('#download', { state: 'visible', timeout: 15_000 });
    assert.deepEqual(await studio.evaluate(() => window.__asked), [`http://${new URL(b.hub.url).hostname}/*`]);
    await studio.waitForFunction(() => Number(document.querySelector('#download-bar[role="progressbar"]')?.getAttribute('aria-valuenow')) > 0, null, { timeout: 30_000 });
    assert.equal(await studio.isVisible('#install'), false);
    assert.equal(await studio.isVisible('#pause'), true);
    assert.equal(await studio.isVisible('#cancel-download'), true);
    assert.match(await studio.textContent('#download-eta'), say.timeLeft);
    await assertAxeBothThemes(studio, 'studio downloading');

    // The popup and the options page show the same download with its controls.
    await b.page.reload();
    await b.page.waitForSelector('section#download', { state: 'visible', timeout: 15_000 });
    assert.equal(await b.page.isVisible('#install'), false);
    const options = await open(b, 'options.html', { width: 900, height: 900 });
    await options.waitForSelector('#download', { state: 'visible', timeout: 15_000 });
    await options.waitForFunction(() => Number(document.querySelector('#download-bar').getAttribute('aria-valuenow')) > 0, null, { timeout: 15_000 });
    for (const id of ['#pause', '#cancel-download']) assert.equal(await options.isVisible(id), true, id);
    assert.equal(await options.isVisible('#install'), false);
    await assertAxeBothThemes(options, 'options downloading');

    // Paused on the options page: the studio follows, and resumes it.
    await options.click('#pause');
    await studio.waitForSelector('#resume', { state: 'visible', timeout: 15_000 });
    b.hub.clearFaults();
    await studio.click('#resume');
    // Resumed in the studio: the options page no longer offers Resume.
    await options.waitForSelector('#resume', { state: 'hidden', timeout: 5_000 });
    await h.waitForInstall(b.page);

    await studio.waitForSelector('#setup', { state: 'hidden', timeout: 15_000 });
    await studio.waitForFunction(() => !document.querySelector('#generate').hasAttribute('aria-disabled'), null, { timeout: 15_000 });
    assert.equal(await studio.isVisible('#generate-reason'), false);
    // No page was opened by any of it (no popup as a tab).
    assert.equal(b.context.pages().length, pagesBefore + 1, b.context.pages().map((p) => p.url()).join(' '));
    // Finished after a resume in the studio: the options page and the popup, open all along and not
    // reloaded, say so. Installed from the saved source: Delete, and no Download beside it.
    await options.waitForSelector('#delete-pack', { state: 'visible', timeout: 15_000 });
    assert.match(await options.textContent('#model-status'), new RegExp(`^${say.installed}`));
    assert.equal(await options.isVisible('#install'), false);
    assert.equal(await options.isVisible('#download'), false);
    await b.page.waitForSelector('#delete-pack', { state: 'visible', timeout: 15_000 });
    assert.match(await b.page.textContent('#pack-status'), new RegExp(`^${say.popupInstalled}`));
    assert.equal(await b.page.isVisible('#download'), false);
    // Another source may be downloaded.
    await options.fill('#hub-repo', 'someone/another-pack');
    await options.waitForSelector('#install', { state: 'visible', timeout: 15_000 });
  });
}

test('the studio, the popup and the options page follow a download started elsewhere; cancelled in the studio, every page brings the Download button back', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  b.hub.inject(h.BIG_SHARD, { type: 'slow', bytesPerSecond: 1 << 20 });
  const studio = await open(b, 'studio.html');
  await studio.waitForSelector('#install', { state: 'visible', timeout: 15_000 });
  const reply = await h.startInstall(b.page, b.hub, b.repo);
  assert.equal(reply.type, 'installStarted', JSON.stringify(reply));
  await studio.waitForFunction(() => Number(document.querySelector('#download-bar').getAttribute('aria-valuenow')) > 0, null, { timeout: 30_000 });
  assert.equal(await studio.isVisible('#install'), false);
  assert.equal(await studio.getAttribute('#generate', 'aria-disabled'), 'true');
  // The popup and the options page follow too, and are told of the cancel at once.
  const popup = await open(b, 'popup.html');
  const options = await open(b, 'options.html');
  for (const page of [popup, options]) await page.waitForSelector('#download', { state: 'visible', timeout: 15_000 });
  await studio.bringToFront();
  await studio.click('#cancel-download');
  await studio.waitForSelector('#install', { state: 'visible', timeout: 15_000 });
  assert.equal(await studio.isVisible('#download'), false);
  assert.equal((await h.packStatus(b.page)).download, null);
  for (const page of [popup, options]) await page.waitForSelector('#download', { state: 'hidden', timeout: 5_000 });
  await popup.waitForSelector('#install', { state: 'visible', timeout: 5_000 });
});

test('first-time flow: a fresh profile opens the studio, downloads from the Hub, generates and sees the image without scrolling', { timeout: 420_000 }, async (t) => {
  const b = await h.setup(t, { install: false });
  await saveSource(b.page, b.hub, b.repo);
  const studio = await open(b, 'studio.html');
  await studio.waitForSelector('#setup', { state: 'visible', timeout: 15_000 });
  assert.equal(await studio.isVisible('#install'), true);
  await studio.click('#install');
  await studio.waitForSelector('#setup', { state: 'hidden', timeout: h.INSTALL_TIMEOUT_MS });
  await studio.waitForFunction(() => !document.querySelector('#generate').hasAttribute('aria-disabled'));
  await studio.fill('#prompt', 'a lighthouse at dusk');
  await studio.fill('#steps', '1');
  await studio.click('#generate');
  await studio.waitForSelector('#result', { state: 'visible', timeout: h.GENERATION_TIMEOUT_MS });
  await studio.waitForFunction(() => document.querySelector('#image').complete && document.querySelector('#image').naturalWidth > 0);
  await h.sleep(500); // scrolled into view once decoded
  const box = await studio.evaluate(() => {
    const r = document.querySelector('#image').getBoundingClientRect();
    return { top: r.top, bottom: r.bottom, height: r.height, room: window.innerHeight };
  });
  assert.ok(box.height > 100 && box.top >= 0 && box.bottom <= box.room, JSON.stringify(box));
  assert.deepEqual(await h.axeViolations(studio), []);
});
