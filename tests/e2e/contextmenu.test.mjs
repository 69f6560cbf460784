// The context menu on a selection opens a result page that generates the selected text (headless, the
// side panel cannot open without a user gesture, so the result page is the fallback shown).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from './harness.mjs';

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
});
