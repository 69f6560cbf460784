// The studio (studio.html, the side panel; driven here as a tab, since a side panel is hard to drive
// headless): token count, size presets, a generation with the stage bar, the result's actions, the
// last image again when the studio is reopened, the batch grid; the side panel settings; notifications when no page is open; screenshots for review.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const PANEL = { width: 420, height: 1000 };

async function openStudio(b, query = '') {
  const page = await b.context.newPage();
  await page.setViewportSize(PANEL);
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') console.log(`studio console: ${m.text()}`); });
  page.on('pageerror', (e) => console.log(`studio error: ${e}`));
  await page.goto(h.extensionUrl(b.extensionId, `studio.html${query}`));
  await page.waitForFunction(() => document.querySelectorAll('#presets input').length > 0);
  return page;
}

async function screenshots(page, name) {
  fs.mkdirSync(h.OUT, { recursive: true });
  for (const colorScheme of ['light', 'dark']) {
    await page.emulateMedia({ colorScheme });
    await page.screenshot({ path: path.join(h.OUT, `${name}-${colorScheme}.png`), fullPage: true });
  }
  await page.emulateMedia({ colorScheme: 'light' });
}

const imageShown = (page, notSrc = '') =>
  page.waitForFunction((old) => {
    const src = document.querySelector('#image')?.src ?? '';
    return src.startsWith('data:image/png') && src !== old && !document.querySelector('#result').hidden;
  }, notSrc, { timeout: h.GENERATION_TIMEOUT_MS });

test('studio: tokens, presets, a generation with the stage bar, copy, save, new seed, reuse seed', { timeout: 900_000 }, async (t) => {
  const b = await h.setup(t);
  const sw = await h.currentServiceWorker(b.context, b.extensionId);
  const page = await openStudio(b);

  // The token count comes from the core's tokenizer and chat template: "a cat" is 14 tokens.
  await page.fill('#prompt', 'a cat');
  await page.waitForFunction(() => /^14 \/ 512/.test(document.querySelector('#token-count').textContent), null, { timeout: 60_000 });
  assert.equal(await page.isHidden('#token-warning'), true);
  await page.fill('#prompt', 'cat '.repeat(600));
  await page.waitForFunction(() => !document.querySelector('#token-warning').hidden, null, { timeout: 30_000 });
  const count = await page.textContent('#token-count');
  assert.ok(Number(count.split(' ')[0]) > 512, count);
  assert.match(await page.getAttribute('#token-count', 'class'), /over/);
  assert.match(await page.textContent('#token-warning'), /512/);

  // Presets set width and height and show their pixel sizes; typing a size selects "custom".
  const presets = await page.$$eval('#presets label', (ls) => ls.map((l) => l.textContent.trim()));
  assert.ok(presets.some((p) => p.includes('768×1024')), JSON.stringify(presets));
  await page.check('#presets input[value="768x1024"]');
  assert.deepEqual([await page.inputValue('#width'), await page.inputValue('#height')], ['768', '1024']);
  await page.check('#presets input[value="1024x768"]');
  assert.deepEqual([await page.inputValue('#width'), await page.inputValue('#height')], ['1024', '768']);
  await page.fill('#width', '512');
  await page.fill('#height', '512');
  assert.equal(await page.isChecked('#presets input[value="512x512"]'), true);
  await page.fill('#width', '256');
  assert.equal(await page.isChecked('#presets input[value="custom"]'), true);
  await page.fill('#height', '256');

  await page.fill('#prompt', 'a small red boat on a calm lake');
  await page.waitForFunction(() => /^20 \/ 512/.test(document.querySelector('#token-count').textContent));
  assert.equal(await page.isHidden('#token-warning'), true);
  await screenshots(page, 'studio-empty');

  // A generation with a fixed seed: the stage bar moves through encoding, steps, decoding.
  await page.fill('#steps', '2');
  await page.check('#seed-fixed');
  await page.fill('#seed', '42');
  await page.evaluate(() => {
    window.__texts = [];
    window.__stages = new Set();
    const el = document.querySelector('#progress');
    new MutationObserver(() => {
      window.__texts.push(el.textContent);
      const now = document.querySelector('.stages li.now');
      if (now) window.__stages.add(now.id);
    }).observe(el, { childList: true, characterData: true, subtree: true });
  });
  await page.click('#generate');
  await page.waitForFunction(() => !document.querySelector('#run').hidden);
  assert.equal(await page.isVisible('#cancel'), true);
  await page.waitForFunction(() => /Step/.test(document.querySelector('#progress').textContent), null, { timeout: h.GENERATION_TIMEOUT_MS });
  await screenshots(page, 'studio-running');
  await imageShown(page);
  const texts = await page.evaluate(() => window.__texts);
  const stages = await page.evaluate(() => [...window.__stages]);
  assert.ok(texts.some((s) => /Step \d of 2/.test(s)), JSON.stringify(texts));
  assert.ok(stages.includes('stage-steps'), JSON.stringify(stages));
  assert.match(await page.textContent('#meta'), /256×256, 2 steps, standard, seed 42/);
  assert.equal((await page.textContent('#error')).trim(), '');
  await screenshots(page, 'studio-result');

  // The timings of this run are kept for the next estimate.
  const timings = await page.evaluate(() => chrome.storage.local.get('studioTimings'));
  const runs = timings.studioTimings?.['256x256'];
  assert.equal(runs?.length, 1, JSON.stringify(timings));
  assert.ok(runs[0].stepMs > 0 && runs[0].decodeMs > 0, JSON.stringify(runs));

  // A page was open: no notification.
  assert.deepEqual(await sw.evaluate(() => chrome.notifications.getAll()), {});

  // Save: the PNG as made (its text chunks carry the prompt and seed).
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('#save-png')]);
  assert.equal(download.suggestedFilename(), 'imagine-42.png');
  const saved = fs.readFileSync(await download.path());
  assert.ok(h.pngTextChunks(saved).some((c) => c.text.includes('a small red boat')), 'prompt not in the saved PNG');

  // Copy: an image/png goes to the clipboard (the real write must succeed; what it was given is
  // recorded on the way, since an extension page cannot be granted clipboard-read in a test).
  await page.evaluate(() => {
    const write = navigator.clipboard.write.bind(navigator.clipboard);
    navigator.clipboard.write = async (items) => {
      window.__clip = await Promise.all(items.map(async (item) => ({ types: item.types, size: (await item.getType('image/png')).size })));
      return write(items);
    };
  });
  await page.click('#copy');
  await page.waitForFunction(() => document.querySelector('#action-status').textContent.length > 0);
  assert.match(await page.textContent('#action-status'), /Copied/);
  const clip = await page.evaluate(() => window.__clip);
  assert.ok(clip?.[0]?.types.includes('image/png') && clip[0].size === saved.length, JSON.stringify(clip));

  // Again with a new seed: same prompt and size, another seed.
  // It is the second image of this size: the studio now gives an estimate from the first.
  const first = await page.getAttribute('#image', 'src');
  await page.evaluate(() => {
    window.__timing = [];
    const el = document.querySelector('#timing');
    new MutationObserver(() => window.__timing.push(el.textContent)).observe(el, { childList: true, characterData: true, subtree: true });
  });
  await page.click('#again');
  // The last image stays on screen while the next one is made.
  await page.waitForFunction(() => !document.querySelector('#cancel').hidden || document.querySelector('#generate').disabled);
  assert.equal(await page.isVisible('#result'), true);
  assert.equal(await page.getAttribute('#image', 'src'), first);
  await imageShown(page, first);
  const timing = await page.evaluate(() => window.__timing);
  assert.ok(timing.some((s) => /about \d+\u00a0s left/.test(s)), JSON.stringify(timing));
  const meta = await page.textContent('#meta');
  assert.match(meta, /256×256, 2 steps/);
  const seed = /seed (\d+)/.exec(meta)[1];
  assert.notEqual(seed, '42');
  // The seed box shows the seed it used.
  assert.equal(await page.inputValue('#seed'), seed);

  // Reuse the seed of this image.
  await page.uncheck('#seed-fixed');
  await page.click('#reuse-seed');
  assert.equal(await page.isChecked('#seed-fixed'), true);
  assert.equal(await page.inputValue('#seed'), seed);

  // Reopened, the studio keeps the settings last used and shows the last image.
  await page.reload();
  await imageShown(page);
  assert.deepEqual(
    [await page.inputValue('#width'), await page.inputValue('#height'), await page.inputValue('#steps')],
    ['256', '256', '2'],
  );
  assert.equal(await page.isChecked('#presets input[value="custom"]'), true);
  assert.equal(await page.inputValue('#seed'), '42');
  assert.equal(await page.inputValue('#prompt'), 'a small red boat on a calm lake');

  // Closed and opened again (as a side panel is), the studio shows the last image, the new seed's.
  const last = await page.getAttribute('#image', 'src');
  await page.close();
  const reopened = await openStudio(b);
  await imageShown(reopened);
  assert.equal(await reopened.getAttribute('#image', 'src'), last);
  assert.match(await reopened.textContent('#meta'), new RegExp(`256×256, 2 steps, standard, seed ${seed}\\b`));
  assert.equal(await reopened.inputValue('#prompt'), 'a small red boat on a calm lake');
  assert.deepEqual(await h.axeViolations(reopened), []);
});

test('studio: the progress bar never goes back, though a stage overruns its estimate; the finished image scrolls into view in a short panel; the status of an action clears when the next starts', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const sw = await h.currentServiceWorker(b.context, b.extensionId);
  // Earlier images of this size far quicker than this one: the text encoder overruns its estimate, and
  // the estimate of what is left grows again when the transformer reports.
  await sw.evaluate(() => chrome.storage.local.set({ studioTimings: { '256x256': [{ encodeMs: 1, loadMs: 300, stepMs: 300, decodeMs: 300 }] } }));
  const page = await openStudio(b);
  // A side panel shorter than the form and the image together.
  await page.setViewportSize({ width: 360, height: 640 });
  await page.fill('#prompt', 'a lighthouse at dusk');
  await page.fill('#width', '256');
  await page.fill('#height', '256');
  await page.fill('#steps', '2');
  await page.evaluate(() => {
    window.__bar = [];
    const bar = document.querySelector('#progress-bar');
    new MutationObserver(() => window.__bar.push(Number(bar.getAttribute('value')))).observe(bar, { attributes: true, attributeFilter: ['value'] });
  });
  // Cmd+Enter in the prompt generates (Ctrl+Enter in popup.test.mjs), adding no new line.
  await page.press('#prompt', 'Meta+Enter');
  await imageShown(page);
  assert.equal(await page.inputValue('#prompt'), 'a lighthouse at dusk');
  // The result card says its own prompt; with no fixed seed the seed field says "random", not a seed.
  assert.equal(await page.textContent('#result-prompt'), 'a lighthouse at dusk');
  assert.equal(await page.inputValue('#seed'), '');
  const values = await page.evaluate(() => window.__bar);
  assert.ok(values.length >= 3, JSON.stringify(values));
  const back = values.findIndex((v, i) => i > 0 && v < values[i - 1]);
  assert.equal(back, -1, `the bar went back at ${back}: ${JSON.stringify(values)}`);
  // The image and its actions are in view without scrolling.
  const inView = (sel) => page.$eval(sel, (el) => { const r = el.getBoundingClientRect(); return r.top >= 0 && r.bottom <= window.innerHeight; });
  await page.waitForFunction(() => { const r = document.querySelector('#again').getBoundingClientRect(); return r.bottom <= window.innerHeight && r.top >= 0; }, null, { timeout: 5_000 }).catch(() => {});
  const sizes = await page.evaluate(() => [document.querySelector('#result').getBoundingClientRect().height, window.innerHeight]);
  assert.deepEqual([await inView('#image'), await inView('#again')], [true, true], JSON.stringify(sizes));
  // What an action said is cleared when the next one starts.
  await page.click('#reuse-seed');
  assert.notEqual(await page.textContent('#action-status'), '');
  await page.click('#generate');
  assert.equal(await page.textContent('#action-status'), '');
  await page.waitForFunction(() => !document.querySelector('#run').hidden);
  await page.waitForFunction(() => document.querySelector('#run').hidden, null, { timeout: h.GENERATION_TIMEOUT_MS });
});

test('studio: 4 variations send count 4 and show the batch as a grid', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const page = await openStudio(b);
  await page.fill('#prompt', 'a lighthouse');
  await page.fill('#width', '256');
  await page.fill('#height', '256');
  await page.fill('#steps', '1');
  await page.check('#seed-fixed');
  await page.fill('#seed', '7');
  await page.click('#generate');
  await imageShown(page);
  const png = (await page.getAttribute('#image', 'src')).split(',')[1];

  // The studio's requests are recorded; `generate` is answered with a made-up job whose events another
  // page sends (so the grid is tested whatever the service worker does with `count`).
  await page.evaluate(() => {
    window.__sent = [];
    const send = chrome.runtime.sendMessage.bind(chrome.runtime);
    chrome.runtime.sendMessage = (message) => {
      window.__sent.push(message);
      if (message?.type === 'generate') return Promise.resolve({ type: 'jobStarted', job: window.__job ?? 'batchjob', seed: '8' });
      return send(message);
    };
  });
  await page.click('#variations');
  const sent = await page.evaluate(() => window.__sent.filter((m) => m.type === 'generate'));
  assert.equal(sent.length, 1);
  assert.equal(sent[0].count, 4);
  assert.equal(sent[0].seed, '8');
  assert.equal(sent[0].prompt, 'a lighthouse');
  assert.deepEqual([sent[0].width, sent[0].height, sent[0].steps], [256, 256, 1]);

  const other = b.page; // popup.html, another extension page
  const broadcast = (m) => other.evaluate((m) => chrome.runtime.sendMessage(m).catch(() => {}), m);
  await broadcast({ type: 'progress', job: 'batchjob', progress: { stage: 'transformer', step: 1, steps: 1, image: 1, images: 4 } });
  await page.waitForFunction(() => /Image 2 of 4/.test(document.querySelector('#progress').textContent));
  const result = (i) => ({
    type: 'result', job: 'batchjob', png, prompt: 'a lighthouse', seed: String(8 + i), width: 256, height: 256,
    steps: 1, schedule: 'empirical', tokenCount: 14, truncated: false, trace: null, timings: null, index: i, count: 4,
  });
  for (const i of [1, 0, 3]) await broadcast(result(i));
  await page.waitForFunction(() => document.querySelectorAll('#grid .thumb img').length === 3);
  assert.equal(await page.isVisible('#cancel'), true, 'the batch is still running');
  await broadcast(result(2));
  await page.waitForFunction(() => document.querySelectorAll('#grid .thumb img').length === 4);
  assert.equal(await page.isVisible('#cancel'), false);
  // Choosing a thumbnail shows that image (keyboard: it is a button).
  await page.focus('#grid .thumb:nth-child(3)');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => /seed 10/.test(document.querySelector('#meta').textContent));
  assert.equal(await page.getAttribute('#grid .thumb:nth-child(3)', 'aria-pressed'), 'true');
  await screenshots(page, 'studio-variations');

  // A run that is cancelled before its first image leaves the last images on screen, with their actions.
  const shown = await page.getAttribute('#image', 'src');
  await page.evaluate(() => { window.__job = 'cancelledjob'; });
  await page.click('#again');
  await page.waitForFunction(() => !document.querySelector('#cancel').hidden);
  assert.equal(await page.isVisible('#result'), true);
  await broadcast({ type: 'cancelled', job: 'cancelledjob' });
  await page.waitForFunction(() => /Cancelled/.test(document.querySelector('#progress').textContent));
  assert.equal(await page.isVisible('#result'), true);
  assert.equal(await page.getAttribute('#image', 'src'), shown);
  assert.match(await page.textContent('#meta'), /seed 10/);
  assert.equal(await page.locator('#grid .thumb img').count(), 4);
  await page.click('#reuse-seed');
  assert.equal(await page.inputValue('#seed'), '10');
});

test('side panel, shortcut, toolbar choice; the context menu shows its job in an open studio', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const sw = await h.currentServiceWorker(b.context, b.extensionId);

  // The studio is the side panel, and the toolbar button opens it by default.
  assert.equal((await sw.evaluate(() => chrome.sidePanel.getOptions({}))).path, 'studio.html');
  assert.deepEqual(await sw.evaluate(() => chrome.sidePanel.getPanelBehavior()), { openPanelOnActionClick: true });
  assert.equal(await sw.evaluate(() => chrome.action.getPopup({})), '');
  const commands = await sw.evaluate(() => chrome.commands.getAll());
  assert.equal(commands.find((c) => c.name === 'open-studio')?.shortcut, 'Alt+Shift+I', JSON.stringify(commands));

  // The popup's button opens the side panel (the click is the user gesture Chrome asks for).
  // (The popup closes itself once the panel is open: another tab keeps the window.)
  await b.context.newPage();
  await b.page.reload();
  await b.page.click('#open-studio');
  let panels = [];
  for (let i = 0; i < 50 && !panels.some((c) => c.documentUrl.endsWith('/studio.html')); i++) {
    await h.sleep(200);
    panels = await sw.evaluate(() => chrome.runtime.getContexts({ contextTypes: ['SIDE_PANEL'] }));
  }
  assert.ok(panels.some((c) => c.documentUrl.endsWith('/studio.html')), JSON.stringify(panels));

  // The keyboard command: without a gesture the panel cannot open (as in this test), so a tab opens.
  const [tab] = await Promise.all([
    b.context.waitForEvent('page', { timeout: 30_000 }),
    sw.evaluate(() => chrome.commands.onCommand.dispatch('open-studio', { id: -1, windowId: -1 })),
  ]);
  await tab.waitForLoadState('domcontentloaded');
  assert.equal(new URL(tab.url()).pathname, '/studio.html');
  await tab.close();

  // The toolbar may open the quick prompt instead; the choice is kept.
  const page = await openStudio(b);
  assert.match(await page.textContent('#shortcut'), /Alt\+Shift\+I/);
  const toolbar = () => sw.evaluate(async () => ({
    popup: (await chrome.action.getPopup({})).replace(/^.*\//, ''),
    panel: (await chrome.sidePanel.getPanelBehavior()).openPanelOnActionClick,
  }));
  const waitForToolbar = async (want) => {
    const deadline = Date.now() + 10_000;
    let now = await toolbar();
    while (JSON.stringify(now) !== JSON.stringify(want) && Date.now() < deadline) {
      await h.sleep(200);
      now = await toolbar();
    }
    assert.deepEqual(now, want);
  };
  await page.selectOption('#toolbar-opens', 'popup');
  await waitForToolbar({ popup: 'popup.html', panel: false });
  assert.equal((await page.evaluate(() => chrome.storage.local.get('toolbarOpens'))).toolbarOpens, 'popup');
  await page.selectOption('#toolbar-opens', 'studio');
  await waitForToolbar({ popup: '', panel: true });

  // The context menu starts the job; a studio already open follows it (prompt as text, then the image).
  const prompt = 'a lighthouse at dusk <b>bold</b>';
  await sw.evaluate(
    (selectionText) =>
      chrome.contextMenus.onClicked.dispatch(
        { menuItemId: 'imagine-selection', selectionText, editable: false, pageUrl: 'https://example.com/' },
        { id: -1, windowId: -1 },
      ),
    prompt,
  );
  await page.waitForFunction((p) => document.querySelector('#prompt').value === p, prompt, { timeout: 30_000 });
  await imageShown(page);
  assert.equal(await page.locator('#prompt ~ b, #result b').count(), 0);
  const focus = (await page.evaluate(() => chrome.storage.session.get('studioFocus'))).studioFocus;
  assert.equal(focus.prompt, prompt);
  assert.ok(focus.job);
});

test('a notification when an image is made while no page is open; clicking it opens the studio at it', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const sw = await h.currentServiceWorker(b.context, b.extensionId);
  const reply = await h.api(b.page, { type: 'generate', prompt: 'a quiet harbour', width: 256, height: 256, steps: 2, seed: '5' });
  assert.equal(reply.type, 'jobStarted', JSON.stringify(reply));
  // No extension page stays open.
  const blank = await b.context.newPage();
  await b.page.close();
  const id = `imagine-job-${reply.job}`;
  const deadline = Date.now() + h.GENERATION_TIMEOUT_MS;
  let shown = {};
  while (!shown[id] && Date.now() < deadline) {
    await h.sleep(500);
    shown = await sw.evaluate(() => chrome.notifications.getAll());
  }
  assert.ok(shown[id], `no notification: ${JSON.stringify(shown)}`);

  const [tab] = await Promise.all([
    b.context.waitForEvent('page', { timeout: 30_000 }),
    sw.evaluate((id) => chrome.notifications.onClicked.dispatch(id), id),
  ]);
  await tab.waitForLoadState('domcontentloaded');
  const url = new URL(tab.url());
  assert.equal(url.pathname, '/studio.html');
  assert.equal(url.searchParams.get('job'), reply.job);
  await imageShown(tab);
  assert.match(await tab.textContent('#meta'), /seed 5/);
  assert.equal(await tab.inputValue('#prompt'), 'a quiet harbour');
  assert.deepEqual(await sw.evaluate(() => chrome.notifications.getAll()), {});
  await blank.close();
});

test('a notification when the model download ends while no page is open', { timeout: 600_000 }, async (t) => {
  // Throttled, so the download is still running when the last page closes.
  const b = await h.setup(t, { install: false, hubOptions: { repos: ['f32'], throttle: 200_000 } });
  const sw = await h.currentServiceWorker(b.context, b.extensionId);
  const reply = await h.startInstall(b.page, b.hub, b.repo);
  assert.equal(reply.type, 'installStarted', JSON.stringify(reply));
  const blank = await b.context.newPage();
  await b.page.close();
  const deadline = Date.now() + h.INSTALL_TIMEOUT_MS;
  let shown = {};
  while (!shown['imagine-download'] && Date.now() < deadline) {
    await h.sleep(500);
    shown = await sw.evaluate(() => chrome.notifications.getAll());
  }
  assert.ok(shown['imagine-download'], `no notification: ${JSON.stringify(shown)}`);
  const [tab] = await Promise.all([
    b.context.waitForEvent('page', { timeout: 30_000 }),
    sw.evaluate(() => chrome.notifications.onClicked.dispatch('imagine-download')),
  ]);
  await tab.waitForLoadState('domcontentloaded');
  assert.equal(new URL(tab.url()).pathname, '/studio.html');
  await blank.close();
});

test('popup screenshots (light, dark)', { timeout: 300_000 }, async (t) => {
  const b = await h.setup(t, { pack: null });
  const page = b.page;
  await page.setViewportSize({ width: 404, height: 640 });
  await page.reload();
  await page.waitForFunction(() => !/Checking/.test(document.querySelector('#pack-status').textContent));
  assert.equal(await page.isVisible('#open-studio'), true);
  await screenshots(page, 'popup');
});
