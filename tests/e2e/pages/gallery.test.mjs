// The gallery: every result is kept (OPFS gallery/<job>.png + index.json), listed newest first,
// searchable, opened with its parameters, reused (in the studio or the popup, whichever the toolbar
// button opens; in English and German), deleted, exported as a zip, limited (oldest first, never the
// one being viewed, never by the batch that made it), rebuilt from the PNGs when the index is lost,
// and kept across a browser restart.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';
import { startSampler, peakBetween, medianBetween } from '../lib/proc-memory.mjs';

const IMAGES = [
  { prompt: 'a red fox in the snow', seed: '11' },
  { prompt: 'a blue boat', seed: '12' },
  { prompt: 'A RED barn at dusk', seed: '13' },
];

async function list(page, request = {}) {
  const reply = await h.api(page, { type: 'galleryList', ...request });
  assert.equal(reply.type, 'gallery', JSON.stringify(reply));
  return reply;
}

/** The ids of the grid's thumbnails, in page order, once there are `count` of them. */
async function gridIds(page, count) {
  await page.waitForFunction((n) => document.querySelectorAll('#grid button.thumb').length === n, count, { timeout: 20_000 });
  return page.$$eval('#grid button.thumb', (buttons) => buttons.map((b) => b.dataset.id));
}

/** The large view's parameters as { name: value }. */
async function viewerParams(page) {
  return page.$$eval('#viewer-params dt', (dts) => Object.fromEntries(dts.map((dt) => [dt.textContent, dt.nextElementSibling.textContent])));
}

async function screenshots(page, name) {
  fs.mkdirSync(h.OUT, { recursive: true });
  for (const scheme of ['light', 'dark']) {
    await page.emulateMedia({ colorScheme: scheme });
    await page.screenshot({ path: path.join(h.OUT, `${name}-${scheme}.png`) });
  }
  await page.emulateMedia({ colorScheme: null });
}

async function openStudio(b) {
  const page = await b.context.newPage();
  await page.goto(h.extensionUrl(b.extensionId, 'studio.html'));
  await page.waitForFunction(() => document.querySelectorAll('#presets input').length > 0);
  return page;
}

/** Waits until the studio's form holds `want` (prompt, size preset, width, height, steps, seed, schedule). */
async function studioFilledWith(page, want) {
  const form = () => page.evaluate(() => ({
    prompt: document.querySelector('#prompt').value,
    size: document.querySelector('input[name=size]:checked')?.value,
    width: document.querySelector('#width').value,
    height: document.querySelector('#height').value,
    steps: document.querySelector('#steps').value,
    seedFixed: document.querySelector('#seed-fixed').checked,
    seed: document.querySelector('#seed').value,
    schedule: document.querySelector('#schedule').value,
  }));
  await page.waitForFunction((p) => document.querySelector('#prompt').value === p, want.prompt, { timeout: 20_000 }).catch(() => {});
  assert.deepEqual(await form(), want);
}

/**
 * Sets what the toolbar button opens, as the studio's footer does, and returns once `page` has heard
 * of it (its own `storage.onChanged` listeners, registered before this one, have run).
 */
async function setToolbar(page, choice) {
  await page.evaluate((choice) => new Promise((resolve) => {
    chrome.storage.onChanged.addListener(function heard(changes) {
      if (!changes.toolbarOpens) return;
      chrome.storage.onChanged.removeListener(heard);
      setTimeout(resolve, 0);
    });
    chrome.storage.local.set({ toolbarOpens: choice });
  }), choice);
}

/** Waits until a side panel shows the studio. */
async function sidePanelOpen(b) {
  const sw = await h.currentServiceWorker(b.context, b.extensionId);
  let panels = [];
  for (let i = 0; i < 50 && !panels.some((c) => c.documentUrl.endsWith('/studio.html')); i++) {
    await h.sleep(200);
    panels = await sw.evaluate(() => chrome.runtime.getContexts({ contextTypes: ['SIDE_PANEL'] }));
  }
  assert.ok(panels.some((c) => c.documentUrl.endsWith('/studio.html')), JSON.stringify(panels));
}

/**
 * The zip's entries as { name: [sha256, written front to back] }: the second is whether the entry's
 * sizes follow its data (a data descriptor), which is how a zip written in pieces, never patched, looks.
 */
function unzipList(zipPath) {
  const script = [
    'import json, sys, zipfile, hashlib',
    'z = zipfile.ZipFile(sys.argv[1])',
    'assert z.testzip() is None',
    'print(json.dumps({i.filename: [hashlib.sha256(z.read(i)).hexdigest(), i.flag_bits & 8 != 0] for i in z.infolist()}))',
  ].join('\n');
  return h.run('python3', ['-c', script, zipPath]);
}

test('the gallery keeps every result and lets the user find, open, reuse, limit, export and delete them', { timeout: 1_200_000 }, async (t) => {
  let b = await h.setup(t);
  const made = [];
  for (const image of IMAGES) {
    const { result } = await h.generateOk(b.page, { ...image, width: 256, height: 256, steps: 1 });
    made.push(result);
  }
  const [fox, boat, barn] = made.map((r) => r.job);
  // The service worker stores a result when it sees the same event the test waited for.
  for (let deadline = Date.now() + 20_000; (await list(b.page)).count < 3; ) {
    if (Date.now() > deadline) throw new Error(`the gallery never held 3 images: ${JSON.stringify(await list(b.page))}`);
    await h.sleep(200);
  }
  let gallery = await b.context.newPage();
  await gallery.goto(h.extensionUrl(b.extensionId, 'gallery.html'));

  await t.test('every result is in the gallery, newest first, with its parameters and bytes', async () => {
    const page = await list(b.page);
    assert.deepEqual(page.items.map((i) => i.id), [barn, boat, fox]);
    assert.equal(page.total, 3);
    assert.equal(page.count, 3);
    const tree = await h.opfsTree(b.page);
    for (const r of made) {
      const item = page.items.find((i) => i.id === r.job);
      assert.equal(item.bytes, h.pngBytes(r).length);
      assert.equal(tree[`gallery/${r.job}.png`], item.bytes);
      assert.deepEqual([item.prompt, item.seed, item.width, item.height, item.steps, item.schedule], [r.prompt, r.seed, 256, 256, 1, 'empirical']);
      assert.ok(Math.abs(item.created - Date.now()) < 3_600_000 && item.timings.totalMs > 0, JSON.stringify(item));
      assert.match(item.packCommit, /^[0-9a-f]{40}$/);
    }
    assert.equal(page.bytesUsed, made.reduce((n, r) => n + h.pngBytes(r).length, 0));
    // No second copy of the bytes anywhere else.
    assert.deepEqual(Object.keys(tree).filter((k) => k.endsWith('.png')).sort(), made.map((r) => `gallery/${r.job}.png`).sort());
    assert.deepEqual(await gridIds(gallery, 3), [barn, boat, fox]);
    assert.match(await gallery.textContent('#usage'), /^3 images, /);
    assert.equal(await gallery.isHidden('#more'), true, 'all are shown: no "Show more"');
    await screenshots(gallery, 'gallery');
  });

  await t.test('search filters by prompt, case-insensitively', async () => {
    const page = await list(b.page, { query: 'RED' });
    assert.deepEqual(page.items.map((i) => i.id), [barn, fox]);
    assert.equal(page.total, 2);
    await gallery.fill('#search', 'red');
    assert.deepEqual(await gridIds(gallery, 2), [barn, fox]);
    await gallery.fill('#search', 'no such thing');
    await gridIds(gallery, 0);
    await gallery.fill('#search', '');
    await gridIds(gallery, 3);
    const bad = await h.api(b.page, { type: 'galleryList', limit: 0 });
    assert.deepEqual(bad, {
      type: 'error',
      error: 'limit 0 is not allowed: use 1 to 500',
      message: { key: 'errGalleryOutOfRange', args: ['limit', '0', '1', '500'] },
    });
  });

  await t.test('opening one shows it large with its parameters, from the keyboard too', async () => {
    await gallery.focus(`#grid button.thumb[data-id="${fox}"]`);
    await gallery.keyboard.press('Enter');
    await gallery.waitForSelector('#viewer[open]');
    assert.equal(await gallery.textContent('#viewer-prompt'), IMAGES[0].prompt);
    const params = await viewerParams(gallery);
    assert.equal(params.Seed, '11');
    assert.equal(params.Size, '256 × 256');
    assert.equal(params.Steps, '1');
    assert.equal(params.Schedule, 'standard');
    assert.match(params.Time, /^\d+\.\d\u00a0s$/);
    // The model version is for a bug report: behind "Details", closed.
    assert.equal(params['Model version'], undefined);
    assert.equal(await gallery.isVisible('#viewer-more'), true);
    assert.equal(await gallery.isVisible('#viewer-technical'), false);
    const src = await gallery.getAttribute('#viewer-image', 'src');
    assert.equal(src, `data:image/png;base64,${made[0].png}`);
    assert.ok(gallery.url().endsWith(`gallery.html?view=${fox}`), gallery.url());
    await screenshots(gallery, 'gallery-view');
  });

  await t.test('the limit drops the oldest first, never the one being viewed', async () => {
    // The fox (oldest) is open in the gallery page: the boat goes instead.
    const reply = await h.api(b.page, { type: 'galleryLimit', maxItems: 2 });
    assert.equal(reply.type, 'galleryLimit', JSON.stringify(reply));
    assert.equal(reply.maxItems, 2);
    assert.deepEqual((await list(b.page)).items.map((i) => i.id), [barn, fox]);
    const tree = await h.opfsTree(b.page);
    assert.equal(tree[`gallery/${boat}.png`], undefined);
    const bad = await h.api(b.page, { type: 'galleryLimit', maxItems: 0 });
    assert.deepEqual(bad, {
      type: 'error',
      error: 'maxItems 0 is not allowed: use 1 to 10000',
      message: { key: 'errGalleryOutOfRange', args: ['maxItems', '0', '1', '10000'] },
    });
    const unknown = await h.api(b.page, { type: 'galleryLimit', maxItem: 3 });
    assert.equal(unknown.type, 'error');
    assert.match(unknown.error, /unknown field `maxItem`/);
  });

  await t.test('reuse fills what the toolbar button opens: the studio by default (side panel, or a tab)', async () => {
    await gallery.evaluate(() => {
      window.__popupOpened = 0;
      chrome.action.openPopup = async () => { window.__popupOpened += 1; };
    });
    // A studio open already takes them at once; the click opens the side panel.
    const studio = await openStudio(b);
    await gallery.click('#reuse');
    await studioFilledWith(studio, { prompt: IMAGES[0].prompt, size: 'custom', width: '256', height: '256', steps: '1', seedFixed: true, seed: '11', schedule: 'empirical' });
    assert.equal(await gallery.textContent('#viewer-status'), 'Prompt and settings copied: the studio opens with them.');
    assert.equal(await gallery.evaluate(() => window.__popupOpened), 0);
    await sidePanelOpen(b);
    // Taken once.
    await gallery.waitForFunction(async () => Object.keys(await chrome.storage.session.get('imagine.reuse')).length === 0);
    await studio.close();

    // Where the side panel cannot open, the studio opens in a tab, with them.
    await gallery.evaluate(() => { chrome.sidePanel.open = () => Promise.reject(new Error('no side panel here')); });
    const [tab] = await Promise.all([b.context.waitForEvent('page', { timeout: 30_000 }), gallery.click('#reuse')]);
    await tab.waitForLoadState('domcontentloaded');
    assert.equal(new URL(tab.url()).pathname, '/studio.html');
    await studioFilledWith(tab, { prompt: IMAGES[0].prompt, size: 'custom', width: '256', height: '256', steps: '1', seedFixed: true, seed: '11', schedule: 'empirical' });
    assert.deepEqual(await h.axeViolations(tab), []);
    await tab.close();
    assert.equal(await gallery.evaluate(() => window.__popupOpened), 0);
    assert.deepEqual(await h.axeViolations(gallery), []);
  });

  await t.test('reuse leaves the prompt and settings for the popup when the toolbar button opens it, which starts from them', async () => {
    // Switched as the studio's footer does it; the open gallery follows.
    await setToolbar(gallery, 'popup');
    await gallery.evaluate(() => {
      window.__popupOpened = 0;
      chrome.action.openPopup = async () => { window.__popupOpened += 1; };
    });
    await gallery.click('#reuse');
    await gallery.waitForFunction(() => window.__popupOpened === 1);
    assert.equal(await gallery.textContent('#viewer-status'), 'Prompt and settings copied: the Imagine popup opens with them.');
    const stored = await gallery.evaluate(() => chrome.storage.session.get('imagine.reuse'));
    assert.deepEqual(stored['imagine.reuse'], { prompt: IMAGES[0].prompt, width: 256, height: 256, steps: 1, seed: '11', schedule: 'empirical' });
    // The side panel still open (a studio) leaves them to the popup.
    await h.sleep(1000);
    assert.deepEqual(Object.keys(await gallery.evaluate(() => chrome.storage.session.get('imagine.reuse'))), ['imagine.reuse']);
    const popup = await b.context.newPage();
    await popup.goto(h.extensionUrl(b.extensionId, 'popup.html'));
    await popup.waitForFunction(() => document.querySelector('#prompt').value !== '');
    assert.equal(await popup.inputValue('#prompt'), IMAGES[0].prompt);
    assert.equal(await popup.inputValue('#seed'), '11');
    assert.equal(await popup.inputValue('#width'), '256');
    assert.equal(await popup.inputValue('#steps'), '1');
    // Taken once.
    assert.deepEqual(await popup.evaluate(() => chrome.storage.session.get('imagine.reuse')), {});
    await popup.close();
    await setToolbar(gallery, 'studio');
    await gallery.keyboard.press('Escape');
    await gallery.waitForFunction(() => !document.querySelector('#viewer').open);
    // The dialog's `close` event, which takes `?view=` off the address, is a task after `open` drops.
    await gallery.waitForFunction(() => location.href.endsWith('gallery.html'), null, { timeout: 5000 });
  });

  await t.test('export all gives a zip of the PNGs and their parameters', async () => {
    const download = gallery.waitForEvent('download', { timeout: 30_000 });
    await gallery.click('#export');
    const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-export-')), 'gallery.zip');
    await (await download).saveAs(file);
    const r = await unzipList(file);
    assert.equal(r.code, 0, r.stderr);
    const entries = JSON.parse(r.stdout);
    assert.deepEqual(Object.keys(entries).sort(), [`${barn}.png`, `${fox}.png`, 'gallery.json'].sort());
    for (const [job, result] of [[fox, made[0]], [barn, made[2]]]) {
      const want = (await import('node:crypto')).createHash('sha256').update(h.pngBytes(result)).digest('hex');
      assert.equal(entries[`${job}.png`][0], want);
    }
    // Written a PNG at a time, front to back (never the whole gallery in memory to patch headers in).
    assert.ok(Object.values(entries).every(([, streamed]) => streamed), JSON.stringify(entries));
    // The OPFS copy is gone once downloaded.
    await gallery.waitForFunction(async () => {
      try {
        await (await (await navigator.storage.getDirectory()).getDirectoryHandle('exports')).getFileHandle('gallery.zip');
        return false;
      } catch {
        return true;
      }
    });
    fs.rmSync(path.dirname(file), { recursive: true, force: true });
  });

  await t.test('a corrupt index is rebuilt from the PNGs', async () => {
    await h.opfsWrite(b.page, 'gallery/index.json', '{"version": 1, "items": [trunc');
    const page = await list(b.page);
    assert.deepEqual(page.items.map((i) => [i.id, i.prompt, i.seed]).sort(), [[barn, IMAGES[2].prompt, '13'], [fox, IMAGES[0].prompt, '11']].sort());
  });

  await t.test('the gallery survives a browser restart', async () => {
    b = await b.relaunch();
    gallery = await b.context.newPage();
    await gallery.goto(h.extensionUrl(b.extensionId, 'gallery.html'));
    assert.equal((await gridIds(gallery, 2)).length, 2);
  });

  await t.test('delete one: Undo for a moment, then gone from every open page', async () => {
    // A new image (the relaunch forgot the earlier jobs), open elsewhere: the studio showing it,
    // another gallery with its large view.
    assert.equal((await h.api(b.page, { type: 'galleryLimit', maxItems: 10 })).maxItems, 10);
    const { result } = await h.generateOk(b.page, { prompt: 'an owl at night', width: 256, height: 256, steps: 1, seed: '17' });
    const owl = result.job;
    assert.deepEqual(await gridIds(gallery, 3), [owl, barn, fox]);
    const studio = await b.context.newPage();
    await studio.goto(h.extensionUrl(b.extensionId, `studio.html?job=${owl}`));
    await studio.waitForSelector('#result:not([hidden]) #image[src^="data:image/png"]');
    const other = await b.context.newPage();
    await other.goto(h.extensionUrl(b.extensionId, `gallery.html?view=${owl}`));
    await other.waitForSelector('#viewer[open]');
    await gallery.bringToFront();

    await gallery.click(`#grid button.thumb[data-id="${owl}"]`);
    await gallery.waitForSelector('#viewer[open]');
    await gallery.click('#delete');
    assert.deepEqual(await gridIds(gallery, 2), [barn, fox]);
    await gallery.waitForSelector('#undo-bar:not([hidden])');
    // Counted as gone (the line says what the gallery will hold), not deleted yet: Undo brings it
    // back, with the focus on it.
    assert.match(await gallery.textContent('#usage'), /^2 images, /);
    assert.notEqual((await h.opfsTree(b.page))[`gallery/${owl}.png`], undefined);
    await gallery.click('#undo');
    assert.deepEqual(await gridIds(gallery, 3), [owl, barn, fox]);
    await gallery.waitForFunction((id) => document.activeElement?.dataset?.id === id, owl, { timeout: 5_000 });
    assert.match(await gallery.textContent('#usage'), /^3 images, /);

    // Deleted again and left alone: deleted once Undo is no longer offered.
    await gallery.click(`#grid button.thumb[data-id="${owl}"]`);
    await gallery.waitForSelector('#viewer[open]');
    await gallery.click('#delete');
    assert.deepEqual(await gridIds(gallery, 2), [barn, fox]);
    await gallery.waitForFunction(() => /^2 images, /.test(document.querySelector('#usage').textContent), null, { timeout: 20_000 });
    await gallery.waitForSelector('#undo-bar', { state: 'hidden' });
    // The focus goes to the thumbnail that took the deleted one's place, not to nowhere.
    await gallery.waitForFunction((id) => document.activeElement?.dataset?.id === id, barn, { timeout: 5_000 });
    // The bar hides as the deletion is sent, not when it is done (once, beside two other test files,
    // the file was still there at this point).
    const stored = async () => (await h.opfsTree(b.page))[`gallery/${owl}.png`];
    for (const until = Date.now() + 20_000; (await stored()) !== undefined && Date.now() < until;) await h.sleep(250);
    assert.equal(await stored(), undefined);
    // The other pages let it go at once: no error about an image the user deleted.
    assert.deepEqual(await gridIds(other, 2), [barn, fox]);
    await other.waitForSelector('#viewer:not([open])', { state: 'attached' });
    await studio.waitForSelector('#result', { state: 'hidden' });
    assert.equal(await studio.isVisible('#error'), false);
    await studio.close();
    await other.close();

    const again = await h.api(b.page, { type: 'galleryDelete', id: owl });
    assert.deepEqual(again, {
      type: 'error',
      error: `there is no image "${owl}" in the gallery`,
      // The id quoted by a message of its own: each language has its quote marks.
      message: { key: 'errGalleryNotFound', args: [{ key: 'quotedValue', args: [owl] }] },
    });
    const bad = await h.api(b.page, { type: 'galleryImage', id: '../packs' });
    assert.equal(bad.type, 'error');
    assert.match(bad.error, /not allowed/);
  });

  await t.test('delete all asks first', async () => {
    await gallery.click('#clear');
    await gallery.waitForSelector('#confirm[open]');
    await gallery.click('#confirm-no');
    assert.equal((await list(b.page)).count, 2);
    await gallery.click('#clear');
    await gallery.click('#confirm-yes');
    await gallery.waitForSelector('#empty:not([hidden])');
    assert.equal((await list(b.page)).count, 0);
    const left = Object.keys(await h.opfsTree(b.page)).filter((k) => k.startsWith('gallery/'));
    assert.deepEqual(left.sort(), ['gallery/', 'gallery/index.json']);
  });
  // The relaunched browser (setup's hook closes the first one and removes the profile after it).
  await b.close({ keepProfile: true });
});

test('a batch at the gallery limit keeps all of its images; the next image lets them go', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  assert.equal((await h.api(b.page, { type: 'galleryLimit', maxItems: 1 })).maxItems, 1);
  const size = { width: 256, height: 256, steps: 1 };
  const reply = await h.api(b.page, { type: 'generate', prompt: 'three boats', ...size, seed: '21', count: 3 });
  assert.equal(reply.type, 'jobStarted', JSON.stringify(reply));
  await h.waitForEvent(b.page, (e) => e.type === 'result' && e.job === reply.job && e.index === 2);
  assert.equal((await h.endedJob(b.page, reply.job)).status, 'done');
  const batch = [reply.job, `${reply.job}-1`, `${reply.job}-2`];
  let page = await list(b.page);
  for (let deadline = Date.now() + 20_000; !page.items.some((i) => i.id === batch[2]) && Date.now() < deadline; ) {
    await h.sleep(200);
    page = await list(b.page);
  }
  // Over the cap of one while the batch is the newest: its images are the job's results.
  assert.deepEqual(page.items.map((i) => i.id), [...batch].reverse());
  for (const id of batch) assert.equal((await h.api(b.page, { type: 'galleryImage', id })).type, 'galleryImage', id);
  const { result } = await h.generateOk(b.page, { prompt: 'one more boat', ...size, seed: '30' });
  for (let deadline = Date.now() + 20_000; (await list(b.page)).items[0]?.id !== result.job; ) {
    if (Date.now() > deadline) throw new Error(`the next image was never kept: ${JSON.stringify(await list(b.page))}`);
    await h.sleep(200);
  }
  assert.deepEqual((await list(b.page)).items.map((i) => i.id), [result.job]);
});

test('an index rebuild reads only the start of each PNG, one at a time', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const { result } = await h.generateOk(b.page, { prompt: 'a large harbour', width: 256, height: 256, steps: 1, seed: '40' });
  // 32 images of 10 MB (the result's PNG with bytes after its end): read whole, and all at once, they
  // would leave the extension's process 320 MB larger.
  const COUNT = 32;
  const PAD = 10 << 20;
  await b.page.evaluate(async ({ png, count, pad }) => {
    const head = Uint8Array.from(atob(png), (c) => c.charCodeAt(0));
    const bytes = new Uint8Array(head.length + pad).fill(7);
    bytes.set(head);
    const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle('gallery');
    for (let i = 0; i < count; i++) {
      const w = await (await dir.getFileHandle(`big${i}.png`, { create: true })).createWritable();
      await w.write(bytes);
      await w.close();
    }
  }, { png: result.png, count: COUNT, pad: PAD });
  await h.opfsWrite(b.page, 'gallery/index.json', '{"version": 1, "items": [trunc');
  const sampler = startSampler(b.profileDir, 50);
  t.after(() => sampler.stop());
  await h.sleep(1500);
  const before = Date.now();
  const page = await list(b.page, { limit: 500 });
  await h.sleep(1000);
  const after = Date.now();
  assert.equal(page.count, COUNT + 1, JSON.stringify(page.items.map((i) => i.id)));
  assert.ok(page.items.filter((i) => i.id.startsWith('big')).every((i) => i.bytes === h.pngBytes(result).length + PAD && i.prompt === 'a large harbour'));
  const baseline = medianBetween(sampler.history, before - 1500, before).extension;
  const peak = peakBetween(sampler.history, before, after).peak.extension;
  const grewMb = (peak - baseline) / (1 << 20);
  assert.ok(grewMb < 100, `the rebuild grew the extension's process by ${grewMb.toFixed(0)} MB (${COUNT * (PAD >> 20)} MB of PNGs)`);
});

test('reuse in German: the studio or the popup gets the prompt and settings, and the gallery says which', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t, { args: ['--lang=de'] });
  const { result } = await h.generateOk(b.page, { prompt: 'ein roter Fuchs im Schnee', seed: '21', width: 256, height: 256, steps: 1 });
  for (let deadline = Date.now() + 20_000; (await list(b.page)).count < 1; ) {
    if (Date.now() > deadline) throw new Error(`the gallery never held the image: ${JSON.stringify(await list(b.page))}`);
    await h.sleep(200);
  }
  const gallery = await b.context.newPage();
  await gallery.goto(h.extensionUrl(b.extensionId, `gallery.html?view=${result.job}`));
  await gallery.waitForSelector('#viewer[open]');
  assert.equal(await gallery.textContent('#reuse'), 'Prompt und Einstellungen übernehmen');
  // Dates and durations as German writes them.
  const params = await viewerParams(gallery);
  assert.match(params.Erstellt, /^\d{2}\.\d{2}\.\d{4}, \d{2}:\d{2}$/, params.Erstellt);
  assert.match(params.Dauer, /^\d+,\d\u00a0s$/, params.Dauer);
  // The number as Intl writes the image's time in German, the unit after a no-break space.
  const [item] = (await list(b.page)).items;
  const seconds = await gallery.evaluate((ms) => new Intl.NumberFormat('de', { minimumFractionDigits: 1, maximumFractionDigits: 1 }).format(ms / 1000), item.timings.totalMs);
  assert.equal(params.Dauer, `${seconds}\u00a0s`);
  await gallery.evaluate(() => {
    window.__popupOpened = 0;
    chrome.action.openPopup = async () => { window.__popupOpened += 1; };
    chrome.sidePanel.open = () => Promise.reject(new Error('no side panel here'));
  });
  const [tab] = await Promise.all([b.context.waitForEvent('page', { timeout: 30_000 }), gallery.click('#reuse')]);
  await tab.waitForLoadState('domcontentloaded');
  await studioFilledWith(tab, { prompt: 'ein roter Fuchs im Schnee', size: 'custom', width: '256', height: '256', steps: '1', seedFixed: true, seed: '21', schedule: 'empirical' });
  assert.equal(await gallery.textContent('#viewer-status'), 'Prompt und Einstellungen übernommen: Das Studio öffnet sich damit.');
  assert.deepEqual(await h.axeViolations(gallery), []);
  await tab.close();

  await setToolbar(gallery, 'popup');
  await gallery.click('#reuse');
  await gallery.waitForFunction(() => window.__popupOpened === 1);
  assert.equal(await gallery.textContent('#viewer-status'), 'Prompt und Einstellungen übernommen: Das Imagine-Popup öffnet sich damit.');
  const popup = await b.context.newPage();
  await popup.goto(h.extensionUrl(b.extensionId, 'popup.html'));
  await popup.waitForFunction(() => document.querySelector('#prompt').value !== '');
  assert.equal(await popup.inputValue('#prompt'), 'ein roter Fuchs im Schnee');
  assert.equal(await popup.inputValue('#seed'), '21');
});
