// The generate forms of the studio and the popup checked before a job is sent: an empty prompt or a
// size that is not allowed is marked at its control (aria-invalid, a message tied to it by
// aria-describedby, the focus moved there), in the page's language, with the nearest allowed sizes to
// apply; no request is sent. German addresses the user as "Sie" throughout and names no API term.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const PANEL = { width: 420, height: 1000 };

/** What each language says; `sizes(a, b)` is the message's list of nearest allowed sizes. */
const TEXT = {
  en: {
    empty: 'Describe the image to make: the prompt is empty.',
    size: (v) => `${v} pixels is not allowed: use a multiple of 16 from 256 to 1536.`,
    nearest: (...s) => (s.length === 1 ? `Nearest allowed: ${s[0]}.` : `Nearest allowed: ${s[0]} or ${s[1]}.`),
    use: (v) => `Use ${v}`,
  },
  de: {
    empty: 'Beschreiben Sie das gewünschte Bild: Der Prompt ist leer.',
    size: (v) => `${v} Pixel sind nicht erlaubt: Verwenden Sie ein Vielfaches von 16 zwischen 256 und 1536.`,
    nearest: (...s) => (s.length === 1 ? `Nächster erlaubter Wert: ${s[0]}.` : `Nächste erlaubte Werte: ${s[0]} oder ${s[1]}.`),
    use: (v) => `${v} verwenden`,
  },
};

/** API terms and English field names that no message shown to a German user may contain. */
const API_TERMS = /\b(installPack|maxItems|maxBytes|keepLoaded|accuracyLevel|width|height|steps|generate)\b/;

async function openStudio(b) {
  const page = await b.context.newPage();
  await page.setViewportSize(PANEL);
  page.on('pageerror', (e) => console.log(`studio error: ${e}`));
  await page.goto(h.extensionUrl(b.extensionId, 'studio.html'));
  await page.waitForFunction(() => document.querySelectorAll('#presets input').length > 0);
  return page;
}

/** The control `id` is marked invalid, its message shown, tied to it and saying `text`, and focused. */
async function assertMarked(page, id, text) {
  await page.waitForSelector(`#${id}[aria-invalid="true"]`, { timeout: 5_000 });
  assert.equal(await page.isVisible(`#${id}-error`), true);
  assert.equal((await page.textContent(`#${id}-error .message`)).trim(), text);
  const describedBy = (await page.getAttribute(`#${id}`, 'aria-describedby')).split(/\s+/);
  assert.ok(describedBy.includes(`${id}-error`), describedBy.join(' '));
  assert.equal(await page.evaluate(() => document.activeElement?.id), id);
  // At the control, not the page's general error at the bottom.
  assert.equal(await page.isHidden('#error'), true);
}

async function assertNothingSent(page) {
  await h.sleep(300);
  const sent = await page.evaluate(() => window.__sent);
  assert.ok(!sent.includes('generate'), `sent: ${JSON.stringify(sent)}`);
}

/** A size not allowed: marked, the nearest offered, the first offer's button applied. */
async function checkSize(page, lang, id, value, nearest) {
  const say = TEXT[lang];
  await page.fill(`#${id}`, String(value));
  await page.click('#generate');
  await assertMarked(page, id, say.size(value));
  assert.match(await page.textContent(`#${id}-error .fixes`), new RegExp(`^${say.nearest(...nearest).replace(/[.()]/g, '\\$&')}`));
  const buttons = await page.$$eval(`#${id}-error .fixes button`, (bs) => bs.map((b) => b.textContent));
  assert.deepEqual(buttons, nearest.map(say.use));
  assert.deepEqual(await h.axeViolations(page), []);
  await assertNothingSent(page);
  await page.click(`#${id}-error .fixes button >> nth=${nearest.length - 1}`);
  assert.equal(await page.inputValue(`#${id}`), String(nearest.at(-1)));
  assert.equal(await page.getAttribute(`#${id}`, 'aria-invalid'), null);
  assert.equal(await page.isHidden(`#${id}-error`), true);
  assert.equal(await page.evaluate(() => document.activeElement?.id), id);
}

for (const lang of ['en', 'de']) {
  const say = TEXT[lang];
  // With the model installed: until then Generate is held back (setup.test.mjs), whatever the form holds.
  const setup = (t) => h.setup(t, { args: [`--lang=${lang}`] });

  test(`studio (${lang}): an empty prompt is marked at its field and starts no job`, { timeout: 120_000 }, async (t) => {
    const page = await openStudio(await setup(t));
    await h.recordSent(page);
    await page.fill('#prompt', '  \n\t ');
    await page.click('#generate');
    await assertMarked(page, 'prompt', say.empty);
    assert.deepEqual(await h.axeViolations(page), []);
    await assertNothingSent(page);
    // Typing clears the mark.
    await page.fill('#prompt', 'a small red boat');
    assert.equal(await page.getAttribute('#prompt', 'aria-invalid'), null);
    assert.equal(await page.isHidden('#prompt-error'), true);
  });

  test(`studio (${lang}): a size not allowed is marked at its field with the nearest allowed ones to apply; no job starts`, { timeout: 120_000 }, async (t) => {
    const page = await openStudio(await setup(t));
    await h.recordSent(page);
    await page.fill('#prompt', 'a small red boat');
    await checkSize(page, lang, 'width', 500, [496, 512]);
    assert.equal(await page.isChecked('#presets input[value="512x512"]'), true);
    await checkSize(page, lang, 'height', 2000, [1536]);
  });

  test(`studio (${lang}): a refusal names no API term${lang === 'de' ? '; the schedules and the placeholder are German' : ''}`, { timeout: 120_000 }, async (t) => {
    const b = await setup(t);
    const page = await openStudio(b);
    await page.waitForFunction(() => !document.querySelector('#generate').hasAttribute('aria-disabled'));
    // Deleted elsewhere while the studio is open: the studio holds Generate back at once and sends
    // nothing; what the service worker says to a request sent anyway names no API term either.
    await h.api(b.page, { type: 'deletePack' });
    await page.waitForSelector('#generate[aria-disabled="true"]', { timeout: 5_000 });
    await h.recordSent(page);
    await page.fill('#prompt', 'a small red boat');
    await page.focus('#generate');
    await page.keyboard.press('Enter');
    await h.sleep(500);
    assert.deepEqual((await page.evaluate(() => window.__sent)).filter((s) => s === 'generate'), []);
    const reply = await h.api(b.page, { type: 'generate', prompt: 'a small red boat' });
    const refused = `${await page.textContent('#generate-reason')} ${await page.evaluate((m) => chrome.i18n.getMessage(m.key, m.args), reply.message)}`;
    assert.doesNotMatch(refused, /installPack/, refused);
    if (lang === 'de') {
      assert.doesNotMatch(refused, API_TERMS, refused);
      const schedules = await page.$$eval('#schedule option', (os) => os.map((o) => o.textContent));
      assert.deepEqual(schedules, ['Standard (wie das Modell trainiert wurde)', 'Linear verschoben (wie die Seite des Modells vorschlägt)']);
      assert.equal(await page.getAttribute('#prompt', 'placeholder'), 'Beschreiben Sie ein Bild …');
      assert.equal(await page.textContent('label[for="prompt"]'), 'Prompt');
    }
  });

  test(`popup (${lang}): an empty prompt is marked at its field and starts no job`, { timeout: 120_000 }, async (t) => {
    const page = (await setup(t)).page;
    await page.waitForSelector('#delete-pack:not([hidden])'); // started: the form is filled
    await h.recordSent(page);
    await page.fill('#prompt', '   ');
    await page.click('#generate');
    await assertMarked(page, 'prompt', say.empty);
    assert.deepEqual(await h.axeViolations(page), []);
    await assertNothingSent(page);
  });

  test(`popup (${lang}): a size not allowed is marked at its field, unfolded, with the nearest allowed ones to apply; no job starts`, { timeout: 120_000 }, async (t) => {
    const page = (await setup(t)).page;
    await page.waitForSelector('#delete-pack:not([hidden])');
    await h.recordSent(page);
    await page.fill('#prompt', 'a small red boat');
    // The sizes are under the folded "Options": a bad one unfolds them to show and focus its field.
    assert.equal(await page.evaluate(() => document.querySelector('#width').closest('details').open), false);
    await page.evaluate(() => { document.querySelector('#height').value = '100'; });
    await page.click('#generate');
    await assertMarked(page, 'height', say.size(100));
    assert.equal(await page.evaluate(() => document.querySelector('#height').closest('details').open), true);
    await page.click('#height-error .fixes button');
    assert.equal(await page.inputValue('#height'), '256');
    await checkSize(page, lang, 'width', 1000, [992, 1008]);
    await assertNothingSent(page);
  });
}

test('German addresses the user as "Sie" throughout, says "Prompt" and translates the schedules', () => {
  const dir = path.join(h.ROOT, 'extension/_locales');
  const de = JSON.parse(fs.readFileSync(path.join(dir, 'de/messages.json'), 'utf8'));
  const en = JSON.parse(fs.readFileSync(path.join(dir, 'en/messages.json'), 'utf8'));
  const found = [];
  for (const [key, { message }] of Object.entries(de)) {
    // "du" and its forms, as whole words.
    if (/(^|[^\p{L}])(du|dein|deine|deinen|deinem|deiner|deines|dich|dir)(?![\p{L}])/iu.test(message)) found.push(`${key}: ${message}`);
    // Imperatives of "du" that the texts had or are likely to have.
    if (/(^|[^\p{L}])(Klicke|Kürze|Beschreibe|Wähle|Lade|Lösche|Öffne|Warte|Versuche|Prüfe|Schaffe|Installiere|Setze|Verwende|Starte|Tippe|Gib)(?![\p{L}])/u.test(message)) found.push(`${key}: ${message}`);
    if (/Eingabe|Aufforderung/.test(message)) found.push(`${key}: ${message}`);
  }
  assert.deepEqual(found, []);
  // The texts that had "du" say "Sie".
  for (const key of ['extDescription', 'downloadOnce', 'promptPlaceholder', 'notifyModelInstalledText', 'studioTokensOver']) {
    assert.match(de[key].message, /\b(Sie|Ihre?n?)\b/, key);
  }
  assert.match(de.notifyImageReady.message, /^Ihr Bild/);
  assert.equal(de.prompt.message, 'Prompt');
  for (const key of ['scheduleEmpirical', 'scheduleLinearShift', 'scheduleNameEmpirical', 'scheduleNameLinearShift']) {
    assert.notEqual(de[key].message, en[key].message, key);
    assert.doesNotMatch(de[key].message, /empirical|linear-shift/, key);
  }
});
