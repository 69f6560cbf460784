// The popup: type a prompt, Generate, see progress, get an image.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from './harness.mjs';

test('popup generates an image and shows progress', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const page = b.page;
  await page.reload(); // the popup starts with the pack installed
  await page.fill('#prompt', 'a small red boat on a calm lake');
  // Record every text #progress shows (polling could miss a short-lived one).
  await page.evaluate(() => {
    window.__progressTexts = [];
    const el = document.querySelector('#progress');
    const record = () => window.__progressTexts.push(el.textContent);
    new MutationObserver(record).observe(el, { childList: true, characterData: true, subtree: true });
  });
  await page.click('#generate');
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
