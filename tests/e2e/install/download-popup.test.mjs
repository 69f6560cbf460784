// The popup during a download: size, progress, rate, time left, per-file list, pause/resume, cancel
// button, storage used and delete. Light: the behaviour itself is covered by the API tests.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const { BIG_SHARD: SHARD } = h;

test('popup shows the download and its controls, after a reopen too', { timeout: 180_000 }, async (t) => {
  const b = await h.setupPadded(t);
  const page = b.page;
  b.hub.inject(SHARD, { type: 'slow', bytesPerSecond: 2 << 20 });
  const reply = await h.startInstall(page, b.hub, b.repo);
  assert.equal(reply.type, 'installStarted', JSON.stringify(reply));
  await h.waitForDownload(page, (s) => h.fileDone(s, SHARD) >= 4 << 20, 60_000);

  // The toolbar badge shows how far the download is.
  const sw = await h.currentServiceWorker(b.context, b.extensionId);
  assert.match(await sw.evaluate(() => chrome.action.getBadgeText({})), /^\d+%$/);

  await page.reload(); // the popup opened while a download runs
  const text = (sel) => page.textContent(sel).then((s) => (s ?? '').trim());
  // (popup.html also has an <a id="download"> for the PNG: select the section.)
  await page.waitForSelector('section#download', { state: 'visible', timeout: 10_000 });
  await page.waitForFunction(() => /\d/.test(document.querySelector('#download-rate')?.textContent ?? ''), null, { timeout: 10_000 });
  // Done and total bytes.
  assert.match(await text('#download-done'), /\d[\s\S]*\d/);
  assert.match(await text('#download-eta'), /^about \d+(\.\d)?\u00a0(s|min|h) left$/);
  assert.ok((await text('#download-files')).includes(SHARD), `#download-files: ${await text('#download-files')}`);
  for (const id of ['#pause', '#cancel-download']) assert.ok(await page.isVisible(id), `${id} not visible`);

  await page.click('#pause');
  await h.waitForDownload(page, (s) => s.download?.state === 'paused', 10_000);
  await page.waitForSelector('#resume', { state: 'visible', timeout: 10_000 });
  b.hub.clearFaults();
  await page.click('#resume');
  await h.waitForInstall(page);

  await page.waitForFunction(() => /\d/.test(document.querySelector('#storage-used')?.textContent ?? ''), null, { timeout: 10_000 });
  // #pack-status starts as "Checking the model…"; once installed it gives the model's size, and no
  // commit (a version number is for a bug report, not for the eye).
  await page.waitForFunction(() => document.querySelector('#pack-status')?.textContent.startsWith('Model installed'), null, { timeout: 10_000 });
  assert.match(await text('#pack-status'), /^Model installed \(\d+(\.\d)?\u00a0(MB|KB|GB)\), works offline\.$/);
  await page.waitForSelector('#delete-pack', { state: 'visible', timeout: 10_000 });
  await page.click('#delete-pack');
  await page.click('#delete-confirm-yes');
  await h.waitForDownload(page, (s) => !s.installed, 10_000);
});

test('the popup contacts no Hub until asked; "Check the download size" shows the plan', { timeout: 120_000 }, async (t) => {
  const b = await h.setup(t, { install: false });
  await b.page.reload();
  await b.page.waitForSelector('#install-form', { state: 'visible', timeout: 10_000 });
  // Opening the popup asked the service worker for the status only, which contacts nothing.
  await h.sleep(1500);
  assert.match(await b.page.textContent('#pack-size'), /Nothing is fetched until you ask/);
  assert.equal(b.hub.log.length, 0, JSON.stringify(b.hub.log));

  await b.page.click('summary:has-text("Source")');
  await b.page.fill('#hub-endpoint', b.hub.url);
  await b.page.fill('#hub-repo', b.repo);
  await b.page.click('#check-size');
  await b.page.waitForFunction(() => /files, downloaded once/.test(document.querySelector('#pack-size')?.textContent ?? ''), null, { timeout: 30_000 });
  assert.ok(b.hub.log.length > 0);
});
