// The context menu on a selection opens a result page that generates the selected text (headless, the
// side panel cannot open without a user gesture, so the result page is the fallback shown).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

test('context menu on a selection opens result.html with the image, made with the saved defaults', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  // The defaults saved on the options page apply to images made from the context menu too.
  await b.page.evaluate(() => chrome.storage.local.set({ 'imagine.defaults': { width: 256, height: 320, steps: 2, schedule: 'linear-shift' } }));
  const sw = await h.currentServiceWorker(b.context, b.extensionId);
  const prompt = 'a lighthouse at dusk <b>bold</b>';
  const [tab] = await Promise.all([
    b.context.waitForEvent('page', { timeout: 30_000 }),
    sw.evaluate(
      (selectionText) =>
        chrome.contextMenus.onClicked.dispatch(
          { menuItemId: 'imagine-selection', selectionText, editable: false, pageUrl: 'https://example.com/' },
          { id: -1 },
        ),
      prompt,
    ),
  ]);
  await tab.waitForLoadState('domcontentloaded');
  const url = new URL(tab.url());
  assert.equal(url.protocol, 'chrome-extension:');
  assert.equal(url.pathname, '/result.html');
  assert.ok(url.searchParams.get('job'), `no job in ${tab.url()}`);
  // The selection is not in the URL (it would land in the browser's history), yet the page shows it
  // while the image is made.
  assert.ok(!tab.url().includes('lighthouse'), tab.url());
  await tab.waitForFunction((p) => document.querySelector('#prompt-text')?.textContent.trim() === p, prompt, { timeout: 30_000 });

  await tab.waitForFunction(() => document.querySelector('#image')?.src?.startsWith('data:image/png'), null, {
    timeout: h.GENERATION_TIMEOUT_MS,
  });
  const job = url.searchParams.get('job');
  const state = await h.endedJob(b.page, job);
  assert.deepEqual(
    [state.result.width, state.result.height, state.result.steps, state.result.schedule],
    [256, 320, 2, 'linear-shift'],
  );
  // The prompt is rendered as text, not as HTML.
  assert.equal((await tab.textContent('#prompt-text')).trim(), prompt);
  assert.equal(await tab.locator('#prompt-text b').count(), 0);
  // Its parameters and actions, as in the studio: copy, save, and the studio at this job for the rest.
  assert.match(await tab.textContent('#meta'), /^256×320, 2 steps, /);
  assert.deepEqual([await tab.isVisible('#copy'), await tab.isVisible('#save-png'), await tab.isVisible('#open-studio')], [true, true, true]);
  await tab.click('#copy');
  await tab.waitForFunction(() => document.querySelector('#action-status').textContent !== '');
  assert.equal(await tab.getAttribute('#open-studio', 'href'), `studio.html?job=${encodeURIComponent(job)}`);
  await tab.click('#open-studio');
  await tab.waitForURL(/\/studio\.html\?job=/);
  await tab.waitForFunction(() => document.querySelector('#image')?.src?.startsWith('data:image/png') && !document.querySelector('#result').hidden, null, { timeout: 60_000 });
  assert.match(await tab.textContent('#meta'), /^256×320, 2 steps, /);

  // While an image is made the page shows the studio's progress (the stage, a bar, the time so far)
  // and Cancel, which stops it.
  await b.page.evaluate(() => chrome.storage.local.set({ 'imagine.defaults': { width: 256, height: 320, steps: 50, schedule: 'linear-shift' } }));
  const [slow] = await Promise.all([
    b.context.waitForEvent('page', { timeout: 30_000 }),
    sw.evaluate(() =>
      chrome.contextMenus.onClicked.dispatch(
        { menuItemId: 'imagine-selection', selectionText: 'a slow lighthouse', editable: false, pageUrl: 'https://example.com/' },
        { id: -1 },
      ),
    ),
  ]);
  // The stage list is built by the page's script, which may not have run yet.
  await slow.waitForFunction(() => document.querySelector('#stage-steps')?.className === 'now' && Number(document.querySelector('#progress-bar').value) > 0.1, null, { timeout: 60_000 });
  assert.match(await slow.textContent('#timing'), /^\d+\u00a0s$/);
  assert.equal(await slow.isVisible('#cancel'), true);
  await slow.click('#cancel');
  await slow.waitForFunction(() => document.querySelector('#progress').textContent === 'Cancelled.', null, { timeout: 30_000 });
  assert.equal(await slow.isVisible('#run'), false);
  assert.equal(await slow.isVisible('#image'), false);
  const slowJob = new URL(slow.url()).searchParams.get('job');
  assert.equal((await h.endedJob(b.page, slowJob)).status, 'cancelled');
});

/** Dispatches the context menu's click on `selectionText` as a private (incognito) window's tab would. */
async function fromPrivateWindow(b, selectionText) {
  const sw = await h.currentServiceWorker(b.context, b.extensionId);
  const [tab] = await Promise.all([
    b.context.waitForEvent('page', { timeout: 30_000 }),
    sw.evaluate(
      (text) =>
        chrome.contextMenus.onClicked.dispatch(
          { menuItemId: 'imagine-selection', selectionText: text, editable: false, pageUrl: 'https://example.com/' },
          { id: -1, incognito: true },
        ),
      selectionText,
    ),
  ]);
  await tab.waitForFunction(() => document.querySelector('#image')?.src?.startsWith('data:image/png'), null, { timeout: h.GENERATION_TIMEOUT_MS });
  return { tab, job: new URL(tab.url()).searchParams.get('job') };
}

const until = async (ok, ms, what) => {
  for (const end = Date.now() + ms; !(await ok()); await h.sleep(200)) if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}`);
};
const cachedEmbeddings = async (page) => Object.keys(await h.opfsTree(page)).filter((p) => p.startsWith('cache/') && p.endsWith('.bin'));

/** 64 bytes from inside a PNG's image data: found on disk only where a copy of that image is. */
function imageBytes(png) {
  const idat = png.indexOf('IDAT');
  const length = png.readUInt32BE(idat - 4);
  const at = idat + 4 + Math.max(0, Math.min(256, length - 64));
  return png.subarray(at, at + 64);
}

test('text selected in a private window makes an image that is shown but leaves nothing on disk, and is forgotten when the last private window closes; unless the option keeps it', { timeout: 600_000 }, async (t) => {
  let b = await h.setup(t);
  await b.page.evaluate(() => chrome.storage.local.set({ 'imagine.defaults': { width: 256, height: 256, steps: 1 } }));
  const galleryPrompts = async () => (await h.api(b.page, { type: 'galleryList' })).items.map((i) => i.prompt);

  // Shown (the job's state holds the image), but not in the gallery, and the prompt's embeddings are not cached.
  const prompt = 'a private lighthouse';
  const made = await fromPrivateWindow(b, prompt);
  await made.tab.close();
  const state = await h.endedJob(b.page, made.job);
  assert.equal(state.status, 'done');
  assert.equal(state.result.private, true);
  assert.ok(state.result.png.length > 0);
  assert.ok(!(await galleryPrompts()).includes(prompt));
  assert.deepEqual(await cachedEmbeddings(b.page), []);
  // Nothing of it is on disk, not even while the browser runs: no file of the profile (OPFS included)
  // holds its prompt or its image.
  const traces = [prompt, imageBytes(Buffer.from(state.result.png, 'base64'))];
  assert.deepEqual(h.filesHolding(b.profileDir, traces), [], 'the private image is on disk');
  assert.ok(!(await h.opfsEntries(b.page)).includes('private'), 'private/ is in OPFS');

  // A page opened later, while a private window is open, still shows it (from memory): the studio at it.
  const studio = await b.context.newPage();
  await studio.goto(h.extensionUrl(b.extensionId, `studio.html?job=${made.job}`));
  await studio.waitForFunction(() => document.querySelector('#image')?.src?.startsWith('data:image/png') && !document.querySelector('#result').hidden, null, { timeout: 60_000 });
  assert.equal(await studio.inputValue('#prompt'), prompt);

  // The last private window closes (Chrome's windows.onRemoved, and no incognito window left): the
  // image and its job are forgotten; a page asking for it hears that it is gone.
  const sw = await h.currentServiceWorker(b.context, b.extensionId);
  assert.deepEqual(await sw.evaluate(() => chrome.windows.getAll().then((ws) => ws.filter((w) => w.incognito).length)), 0);
  await sw.evaluate(() => chrome.windows.onRemoved.dispatch(424242));
  await until(async () => (await h.api(b.page, { type: 'job', job: made.job })).status === 'unknown', 10_000, 'the private job forgotten');
  const focus = await b.page.evaluate(() => chrome.storage.session.get('studioFocus'));
  assert.ok(!JSON.stringify(focus).includes(prompt), JSON.stringify(focus));
  const reopened = await b.context.newPage();
  await reopened.goto(h.extensionUrl(b.extensionId, `result.html?job=${made.job}`));
  await reopened.waitForFunction(() => !document.querySelector('#error')?.hidden && document.querySelector('#error').textContent.length > 0, null, { timeout: 30_000 });
  assert.match(await reopened.textContent('#error'), /no longer available/);
  await reopened.close();

  // Nor once the browser has closed (the studio still open at it, as a tab Chrome restores).
  await b.context.close();
  assert.deepEqual(h.filesHolding(b.profileDir, traces), [], 'the private image is on disk after the browser closed');
  const first = b;
  b = await b.relaunch();
  first.close = b.close; // setup's cleanup closes the new browser
  assert.equal((await h.api(b.page, { type: 'job', job: made.job })).status, 'unknown');
  assert.ok(!(await h.opfsEntries(b.page)).includes('private'), 'private/ is there');

  // With the option on (options page), such an image is kept like any other.
  const options = await b.context.newPage();
  await options.goto(h.extensionUrl(b.extensionId, 'options.html'));
  await options.check('#keep-private');
  await until(async () => (await b.page.evaluate(() => chrome.storage.local.get('imagine.keepPrivate')))['imagine.keepPrivate'] === true, 10_000, 'option saved');
  await options.close();
  const kept = await fromPrivateWindow(b, 'a kept lighthouse');
  await kept.tab.close();
  assert.equal((await h.endedJob(b.page, kept.job)).status, 'done');
  assert.ok((await galleryPrompts()).includes('a kept lighthouse'));
  assert.equal((await cachedEmbeddings(b.page)).length, 1);
});

test('what a private image leads to is private too: again with a new seed, 4 variations, its seed reused', { timeout: 900_000 }, async (t) => {
  const b = await h.setup(t);
  await b.page.evaluate(() => chrome.storage.local.set({ 'imagine.defaults': { width: 256, height: 256, steps: 1 } }));
  const prompt = 'a private harbour';
  const { tab, job } = await fromPrivateWindow(b, prompt);
  // The result page's "Open in the studio": the studio at this image, for what it derives from it.
  await tab.click('#open-studio');
  await tab.waitForURL(/\/studio\.html\?job=/);
  await tab.waitForFunction(() => document.querySelector('#image')?.src?.startsWith('data:image/png') && !document.querySelector('#result').hidden, null, { timeout: 60_000 });
  await h.collectEvents(tab);
  const known = new Set([job]);
  /** Clicks `selector` and waits for the job it starts to end with its `images` images; their result events. */
  const made = async (selector, images) => {
    await tab.waitForFunction((s) => !document.querySelector(s).disabled, selector);
    await tab.click(selector);
    const first = await h.waitForEvent(tab, (e) => e.type === 'result' && !known.has(e.job));
    known.add(first.job);
    const results = async () => (await h.events(tab)).filter((e) => e.type === 'result' && e.job === first.job);
    await until(async () => (await results()).length === images, h.GENERATION_TIMEOUT_MS, `${images} images of ${selector}`);
    await tab.waitForFunction(() => !document.querySelector('#generate').disabled);
    return { job: first.job, results: await results() };
  };

  const again = await made('#again', 1);
  assert.deepEqual(again.results.map((r) => r.private), [true], 'the image "Again with a new seed" made from a private image is not private');
  assert.equal(again.results[0].prompt, prompt);
  const variations = await made('#variations', 4);
  assert.deepEqual(variations.results.map((r) => r.private), [true, true, true, true], 'the variations of a private image are not private');
  // The studio's form holds the private prompt: it says it will make a private image, and after
  // "Reuse this seed" it makes one with that seed.
  assert.equal(await tab.isVisible('#private'), true);
  assert.equal(await tab.isChecked('#private'), true);
  await tab.click('#reuse-seed');
  const seed = await tab.inputValue('#seed');
  await tab.fill('#width', '256');
  await tab.fill('#height', '256');
  await tab.fill('#steps', '1');
  const reused = await made('#generate', 1);
  assert.deepEqual(reused.results.map((r) => [r.private, r.seed, r.prompt]), [[true, seed, prompt]], 'the image made with a private image\'s seed reused is not private');

  // None of them is kept: not in the gallery, no prompt embeddings cached, every job's state private;
  // the studio stored neither its form nor the timings of these runs.
  for (const derived of [again, variations, reused]) {
    const state = await h.endedJob(b.page, derived.job);
    assert.equal(state.status, 'done');
    assert.ok(state.results.every((r) => r.private === true), JSON.stringify(state, h.shorten));
  }
  assert.equal((await h.api(b.page, { type: 'galleryList' })).total, 0);
  assert.deepEqual(await cachedEmbeddings(b.page), []);
  assert.equal(await tab.evaluate(() => localStorage.getItem('imagine.studio.settings')), null);
  assert.deepEqual(await tab.evaluate(() => chrome.storage.local.get('studioTimings')), {});
  // Unticked, the form makes an image kept like any other.
  await tab.uncheck('#private');
  const kept = await made('#generate', 1);
  assert.equal(kept.results[0].private, undefined);
  assert.equal((await h.api(b.page, { type: 'galleryList' })).total, 1);
});
