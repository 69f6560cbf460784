// Accessibility of every extension page, in the light and the dark theme: axe-core (from npm, run in the
// page through the DevTools protocol, so the pages' CSP stays as shipped) finds no serious or critical
// violation, and every visible control can be reached with the Tab key.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

/** The visible, enabled controls that Tab does not reach (pressed as many times as there are controls, plus some). */
async function unreachableByTab(page) {
  const controls = await page.evaluate(() => {
    const all = [...document.querySelectorAll('a[href], button, input, select, textarea, summary, [tabindex]:not([tabindex="-1"])')];
    const visible = all.filter((e) => !e.disabled && e.checkVisibility({ visibilityProperty: true }) && e.tabIndex >= 0);
    visible.forEach((e, i) => e.setAttribute('data-a11y-id', String(i)));
    return visible.length;
  });
  await page.evaluate(() => document.activeElement?.blur());
  const reached = new Set();
  for (let i = 0; i < controls + 5; i++) {
    await page.keyboard.press('Tab');
    const id = await page.evaluate(() => document.activeElement?.getAttribute('data-a11y-id'));
    if (id != null) reached.add(id);
  }
  // A radio group is one tab stop (arrow keys move within it): reaching one of its radios reaches all.
  return page.evaluate((reached) => {
    const marked = [...document.querySelectorAll('[data-a11y-id]')];
    const isReached = (e) => reached.includes(e.getAttribute('data-a11y-id'));
    const groupReached = (e) => e.type === 'radio' && marked.some((o) => o.type === 'radio' && o.name === e.name && isReached(o));
    return marked.filter((e) => !isReached(e) && !groupReached(e)).map((e) => e.outerHTML.slice(0, 120));
  }, [...reached]);
}

test('every page: no serious or critical axe findings in both themes; every control reachable by keyboard', { timeout: 900_000 }, async (t) => {
  const b = await h.setup(t);
  const { result: { job } } = await h.generateOk(b.page, { prompt: 'a lighthouse at dusk', width: 256, height: 256, steps: 1, seed: '7' });
  const pages = ['popup.html', 'studio.html', 'gallery.html', 'options.html', `result.html?job=${job}`];
  for (const file of pages) {
    for (const colorScheme of ['light', 'dark']) {
      await t.test(`${file.split('?')[0]} (${colorScheme})`, async () => {
        const page = await b.context.newPage();
        await page.emulateMedia({ colorScheme });
        await page.goto(h.extensionUrl(b.extensionId, file));
        await page.waitForLoadState('networkidle');
        await h.sleep(1000); // the wasm module fills the page after load
        assert.deepEqual(await h.axeViolations(page), [], `${file} ${colorScheme}`);
        if (colorScheme === 'light') assert.deepEqual(await unreachableByTab(page), [], `${file}: not reachable by Tab`);
        await page.close();
      });
    }
  }
});
