// axe-core (from npm) in a page, run through the DevTools protocol so the pages' CSP stays as shipped.

import fs from 'node:fs';
import path from 'node:path';
import { ROOT } from './config.mjs';

let axe = null;

/** The serious and critical axe findings (WCAG 2.1 A and AA, best practices) of `page` as it is now. */
export async function axeViolations(page) {
  // Read when first used: the run and bench scripts import the harness too.
  axe ??= fs.readFileSync(path.join(ROOT, 'node_modules/axe-core/axe.min.js'), 'utf8');
  await page.evaluate(axe);
  const result = await page.evaluate(() =>
    globalThis.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice'] } }));
  return result.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => `${v.impact} ${v.id}: ${v.help} — ${v.nodes.map((n) => n.target.join(' ')).slice(0, 5).join(', ')}`);
}
