// The popup: type a prompt, Generate, see progress, get an image.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

test('popup generates an image (Ctrl+Enter in the prompt) and shows progress', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const page = b.page;
  await page.reload(); // the popup starts with the pack installed
  // Tab reaches the prompt and Generate before "Delete model".
  const order = await page.evaluate(() => ['#prompt', '#generate', '#delete-pack'].map((s) => document.querySelector(s)).reduce((ok, el, i, all) => ok && (i === 0 || Boolean(all[i - 1].compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING)), true));
  assert.ok(order, 'the prompt and Generate come before Delete model');
  await page.fill('#prompt', 'a small red boat on a calm lake');
  // Record every text #progress shows (polling could miss a short-lived one).
  await page.evaluate(() => {
    window.__progressTexts = [];
    const el = document.querySelector('#progress');
    const record = () => window.__progressTexts.push(el.textContent);
    new MutationObserver(record).observe(el, { childList: true, characterData: true, subtree: true });
  });
  // Ctrl+Enter in the prompt generates, as in chat and image apps, adding no new line; Enter alone
  // still does.
  await page.press('#prompt', 'Enter');
  assert.equal(await page.inputValue('#prompt'), 'a small red boat on a calm lake\n');
  await page.press('#prompt', 'Backspace');
  await page.press('#prompt', 'Control+Enter');
  await page.waitForFunction(() => document.querySelector('#image')?.src?.startsWith('data:image/png'), null, {
    timeout: h.GENERATION_TIMEOUT_MS,
  });
  const texts = await page.evaluate(() => window.__progressTexts);
  assert.ok(texts.some((s) => /Step/.test(s)), `progress never showed "Step": ${JSON.stringify(texts)}`);
  const error = (await page.textContent('#error')) ?? ''; // (a missing #error fails here)
  assert.equal(error.trim(), '', `#error shows: ${error}`);
  const src = await page.getAttribute('#image', 'src');
  const png = Buffer.from(src.split(',')[1], 'base64');
  assert.ok(h.pngTextChunks(png).some((c) => c.text.includes('a small red boat')), 'prompt not in the PNG');
});

test('the toolbar badge shows the step while a job runs and clears when it ends', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const badge = () => h.currentServiceWorker(b.context, b.extensionId).then((sw) => sw.evaluate(() => chrome.action.getBadgeText({})));
  await h.collectEvents(b.page);
  const reply = await h.api(b.page, { type: 'generate', prompt: 'a kite', width: 512, height: 512, steps: 4, seed: '3' });
  assert.equal(reply.type, 'jobStarted', JSON.stringify(reply));
  const seen = new Set();
  for (let done = false; !done; ) {
    seen.add(await badge());
    done = (await h.events(b.page)).some((e) => e.job === reply.job && ['result', 'failed', 'cancelled'].includes(e.type));
    await h.sleep(100);
  }
  assert.ok([...seen].some((s) => /^[0-4]\/4$/.test(s)), `the badge never showed a step: ${JSON.stringify([...seen])}`);
  await h.waitForEvent(b.page, (e) => e.job === reply.job && e.type === 'result');
  // The service worker records the result, then clears the badge.
  const deadline = Date.now() + 10_000;
  while ((await badge()) !== '' && Date.now() < deadline) await h.sleep(100);
  assert.equal(await badge(), '');
});
