// Imagine in Firefox ESR: the same pages and wasm, Firefox's manifest (dist-firefox/), its background an
// event page that opens the offscreen document as a frame. WebGPU runs on lavapipe, which has
// `shader-f16`: the float16 pack runs on WebGPU as published (Chromium's SwiftShader cannot).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';
import { FIREFOX_DIST, fakeSystemNotifications, inBrowserWindow, setupFirefox } from '../lib/firefox.mjs';
import { firefoxLoadingPeak, withFullDecoder } from '../lib/loading-memory.mjs';
import { TOLERANCE, tinyPack } from '../lib/tiny-packs.mjs';

const REQUEST = { prompt: 'a red fox in the snow', width: 256, height: 256, steps: 2, seed: '42', trace: true };

/** An image of `pack` equals the Python reference's within `tol` levels; its stages' graph files. */
async function generateAndCompare(page, pack, tol) {
  const { result } = await h.generateOk(page, REQUEST);
  assert.equal(result.seed, '42');
  const files = h.writeResult(`firefox-${pack}`, result);
  await h.compareWithReference({ packDir: path.join(h.PACKS, pack), traceJson: files.json, png: files.png, tol, name: `firefox-${pack}` });
  return result.timings.stages.map((s) => s.graphFile);
}

test('Firefox: the float16 pack installs from the fake Hub and runs on WebGPU with shader-f16; a float32 pack too; both equal the reference', { timeout: 600_000 }, async (t) => {
  const ff = await setupFirefox(t);
  // The background answers the pages (Firefox's origin is not the add-on's id, its background a page).
  const status = await h.packStatus(ff.page);
  assert.equal(status.installed, false, JSON.stringify(status));
  // The verdict from an adapter Firefox names nothing of (no vendor, no architecture): it has shader-f16.
  const asPublished = await ff.page.evaluate(() => chrome.i18n.getMessage('verdictAsPublished'));
  await ff.page.waitForFunction((text) => document.querySelector('#device-verdict')?.textContent.trim() === text, { timeout: 30_000 }, asPublished);

  await h.installPack(ff.page, ff.hub, 'fixtures/f16');
  assert.equal((await h.packStatus(ff.page)).convertedBytes, null, 'a float16 pack is not converted where WebGPU has shader-f16');
  // The published graphs, float16, on WebGPU (the default backend; float16 is refused there without shader-f16).
  assert.deepEqual(await generateAndCompare(ff.page, 'f16', 2), ['text_encoder_q4.onnx', 'transformer_q8.onnx', 'vae_decoder.onnx']);

  await h.installPack(ff.page, ff.hub, 'fixtures/f32');
  await generateAndCompare(ff.page, 'f32', 1);
});

test('Firefox: the tiny real-architecture float16 pack runs on WebGPU with shader-f16 and equals the reference', { timeout: 900_000 }, async (t) => {
  const dir = await tinyPack('float16');
  const ff = await setupFirefox(t, { repos: { 'tiny/float16': { dir } } });
  await h.installPack(ff.page, ff.hub, 'tiny/float16');
  // The transformer's clamps run as Max then Min (imagine_core::graph::clip): Firefox's shader compiler
  // refuses ORT's float16 Clip shader, and without that edit the job failed at the first clamp
  // ("Shader 'Clip' parsing error", Firefox ESR 153 on lavapipe, 2026-12-06).
  const { result } = await h.generateOk(ff.page, { ...REQUEST, backend: 'webgpu' }, 600_000);
  // On WebGPU: the stored forms re-blocked to 32 (the wasm backend loads the published graphs).
  const graphs = Object.fromEntries(result.timings.stages.map((s) => [s.stage, s.graphFile]));
  assert.deepEqual(graphs, { textEncoder: 'text_encoder_q4.b32.onnx', transformer: 'transformer_q8.b32.onnx', decoder: 'vae_decoder.onnx' });
  const files = h.writeResult('firefox-real-arch-float16', result);
  await h.compareWithReference({ packDir: dir, traceJson: files.json, png: files.png, tol: TOLERANCE.float16, name: 'firefox-real-arch-float16' });
  // Streamed in 2 pieces, as the memory plan streams it for a small GPU: what the first piece passes to
  // the second (float16 values) is read back into the chain's own arrays on every step; the same image.
  const streamed = await h.generateOk(ff.page, { ...REQUEST, backend: 'webgpu', transformerPieces: 2 }, 600_000);
  assert.equal(streamed.result.timings.stages.find((s) => s.stage === 'transformer').pieces, 2);
  const streamedFiles = h.writeResult('firefox-real-arch-float16-streamed', streamed.result);
  const compared = await h.run('python3', ['tests/reference/compare.py', files.png, streamedFiles.png, '--tol', String(TOLERANCE.float16)]);
  assert.equal(compared.code, 0, `the streamed transformer's image differs from the whole one's: ${compared.stdout}${compared.stderr}`);
});

test('Firefox streams a stage\'s weights from storage, as Chromium does: the full-size decoder adds far less than its weights to the stage workers\' process while every stage loads', { timeout: 600_000 }, async (t) => {
  const tiny = await tinyPack('float16');
  const full = await withFullDecoder(tiny);
  const weights = fs.statSync(path.join(full, 'vae_decoder.onnx.data')).size;
  const hub = await h.startHub({ repos: { 'tiny/float16': { dir: tiny }, 'tiny/full-decoder': { dir: full } } });
  t.after(() => hub.close());
  // Every stage loads at once (no GPU memory limit); the peak above idle of the process the stage
  // workers run in, with the tiny decoder (176 kB) and with the full-size one (198 MB). Streamed one
  // initializer at a time (ORT's JSPI build reading a `ChunkedBlob`), its weights added -14 to +27 MB
  // here alone, 106 MB once beside two other test files in CI; handed to ORT whole (tried), 174 MB. So
  // the line is at two thirds of the weights (132 MB).
  const small = await firefoxLoadingPeak(hub, 'tiny/float16', 12_000);
  const large = await firefoxLoadingPeak(hub, 'tiny/full-decoder', 12_000);
  const MB = (n) => `${(n / 1e6).toFixed(0)} MB`;
  const added = large.above - small.above;
  assert.ok(added < (weights * 2) / 3, `the full-size decoder (${MB(weights)} of weights) added ${MB(added)} to the peak while loading: ${MB(small.above)} above idle with the tiny one, ${MB(large.above)} with it`);
});

test('Firefox without WebGPU (as it ships on Linux): the verdict says how to get it in Firefox\'s words, and Generate is held back', { timeout: 120_000 }, async (t) => {
  const ff = await setupFirefox(t, { repos: ['f32'], webgpu: false });
  const said = async (key) => ff.page.evaluate((k) => chrome.i18n.getMessage(k), key);
  await ff.page.waitForFunction((text) => document.querySelector('#device-verdict')?.textContent.trim() === text, { timeout: 30_000 }, await said('verdictNoWebGpuFirefox'));
  assert.match(await said('verdictNoWebGpuFirefox'), /dom\.webgpu\.enabled/);
  assert.equal(await ff.page.$eval('#generate', (e) => e.getAttribute('aria-disabled')), 'true');
  assert.equal(await ff.page.$eval('#generate-reason', (e) => e.textContent.trim()), await said('setupCannotRun'));
});

test('Firefox unloads an idle background page, and the offscreen document with it: stages kept loaded keep it', { timeout: 180_000 }, async (t) => {
  // Firefox unloads an event page after `extensions.background.idle.timeout` without an event (30 s by
  // default; 12 s here). The offscreen document, a frame of it, sends it a message every 10 s while it
  // holds anything: the stages kept loaded after an image (300 s by default) outlive two timeouts.
  const ff = await setupFirefox(t, { repos: ['f32'], prefs: { 'extensions.background.idle.timeout': 12_000 } });
  await h.installPack(ff.page, ff.hub, 'fixtures/f32');
  await h.generateOk(ff.page, { prompt: 'a red fox', width: 256, height: 256, steps: 2, seed: '1' });
  const loaded = async () => (await h.api(ff.page, { type: 'keepLoaded' })).loaded;
  assert.deepEqual((await loaded()).sort(), ['decoder', 'textEncoder', 'transformer']);
  await h.sleep(26_000);
  assert.deepEqual((await loaded()).sort(), ['decoder', 'textEncoder', 'transformer'], 'the stages are still loaded');
  // Nothing loaded, nothing running: the background may go, and the next image still comes.
  assert.deepEqual((await h.api(ff.page, { type: 'keepLoaded', seconds: 0 })).loaded, []);
  await h.sleep(14_000);
  await h.generateOk(ff.page, { prompt: 'a red fox', width: 256, height: 256, steps: 2, seed: '1' });
});

test('Firefox: a right-click on selected text, then "Imagine" in Firefox\'s own context menu: the studio opens in the sidebar at the job, made from the selection with the saved defaults', { timeout: 300_000 }, async (t) => {
  const ff = await setupFirefox(t, { repos: ['f32'] });
  await h.installPack(ff.page, ff.hub, 'fixtures/f32');
  await ff.page.evaluate(() => chrome.storage.local.set({ 'imagine.defaults': { width: 256, height: 320, steps: 2, schedule: 'linear-shift' } }));
  const prompt = 'a lighthouse at dusk <b>bold</b>';
  const page = await ff.browser.newPage();
  await page.goto(`data:text/html,${encodeURIComponent('<body style="margin:40px"><p id="text" style="font-size:24px"></p></body>')}`);
  const at = await page.evaluate((text) => {
    const p = document.getElementById('text');
    p.textContent = text;
    const range = document.createRange();
    range.selectNodeContents(p);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    const box = p.getBoundingClientRect();
    return { x: box.x + 30, y: box.y + box.height / 2 };
  }, prompt);
  // Firefox opens its context menu on the right-click, as for a user, with the add-on's item in it.
  const opened = inBrowserWindow(ff.browser, async () => {
    const menu = document.getElementById('contentAreaContextMenu');
    if (menu.state !== 'open') await new Promise((resolve) => menu.addEventListener('popupshown', resolve, { once: true }));
    return [...menu.querySelectorAll('menuitem')].filter((m) => !m.hidden).map((m) => ({ id: m.id, label: m.label }));
  });
  await h.sleep(300);
  await page.mouse.click(at.x, at.y, { button: 'right' });
  const items = await opened;
  const ours = items.filter((m) => m.id.endsWith('-menuitem-_imagine-selection'));
  assert.deepEqual(ours.map((m) => m.label), [`Imagine “${prompt}”`], JSON.stringify(items));
  // Chosen: the item's command, which Firefox turns into the add-on's click, and the menu closes.
  await inBrowserWindow(ff.browser, (id) => {
    document.getElementById(id).doCommand();
    document.getElementById('contentAreaContextMenu').hidePopup();
  }, ours[0].id);
  // The click is the user's gesture: the studio opens as the sidebar, focused on the selection's job.
  let focus;
  for (let i = 0; i < 100 && !focus?.job; i++) {
    await h.sleep(200);
    focus = (await ff.page.evaluate(() => chrome.storage.session.get('studioFocus'))).studioFocus;
  }
  assert.equal(focus?.prompt, prompt, JSON.stringify(focus));
  assert.ok(focus.job, JSON.stringify(focus));
  assert.equal(await ff.page.evaluate(() => chrome.sidebarAction.isOpen({})), true);
  // The sidebar's panel shows about:blank until the studio loads in it (seen beside other files).
  const panel = () => inBrowserWindow(ff.browser, () => SidebarController.browser.contentDocument.getElementById('webext-panels-browser')?.currentURI.spec ?? null);
  let sidebar = await panel();
  for (let i = 0; i < 75 && !/^moz-extension:/.test(sidebar ?? ''); i++) {
    await h.sleep(200);
    sidebar = await panel();
  }
  assert.match(sidebar ?? '', /^moz-extension:\/\/[^/]+\/studio\.html/);
  const state = await h.endedJob(ff.page, focus.job, h.GENERATION_TIMEOUT_MS);
  assert.deepEqual([state.result?.prompt, state.result?.width, state.result?.height, state.result?.steps, state.result?.schedule], [prompt, 256, 320, 2, 'linear-shift'], JSON.stringify(state).slice(0, 400));
});

test('Firefox: with no page of the add-on open, the download\'s end and an image made are notified; clicking one opens the studio at its image', { timeout: 300_000 }, async (t) => {
  // Throttled, so the download is still running when the last page closes.
  const ff = await setupFirefox(t, { repos: ['f32'], hubOptions: { throttle: 200_000 } });
  const notifications = await fakeSystemNotifications(ff.browser);
  const en = JSON.parse(fs.readFileSync(path.join(FIREFOX_DIST, '_locales/en/messages.json'), 'utf8'));
  const shown = async (name) => {
    for (let i = 0; i < 240; i++) {
      const found = (await notifications.shown()).find((n) => n.name === name);
      if (found) return found;
      await h.sleep(500);
    }
    throw new Error(`no notification ${name}: ${JSON.stringify(await notifications.shown())}`);
  };
  const tabs = () => inBrowserWindow(ff.browser, () => gBrowser.tabs.map((tab) => ({ url: tab.linkedBrowser.currentURI.spec, selected: tab.selected })));
  const studioOpened = async (search) => {
    for (let i = 0; i < 150; i++) {
      const tab = (await tabs()).find((x) => x.selected && /^moz-extension:\/\/[^/]+\/studio\.html/.test(x.url));
      if (tab) return assert.equal(new URL(tab.url).search, search);
      await h.sleep(200);
    }
    assert.fail(`the studio did not open: ${JSON.stringify(await tabs())}`);
  };
  const icon = /^moz-extension:\/\/[^/]+\/icons\/icon128\.png$/;

  assert.equal((await h.startInstall(ff.page, ff.hub, 'fixtures/f32')).type, 'installStarted');
  const blank = await ff.browser.newPage();
  await ff.page.close();
  const installed = await shown('imagine-download');
  assert.deepEqual([installed.title, installed.text, installed.textClickable], [en.notifyModelInstalled.message, en.notifyModelInstalledText.message, true]);
  assert.match(installed.imageURL, icon);
  await notifications.click('imagine-download');
  await studioOpened('');
  assert.deepEqual(await notifications.shown(), [], 'a notification clicked is closed');
  await inBrowserWindow(ff.browser, () => gBrowser.removeTab(gBrowser.selectedTab));

  const popup = await ff.open('popup.html');
  const reply = await h.api(popup, { type: 'generate', prompt: 'a quiet harbour', width: 256, height: 256, steps: 2, seed: '5' });
  assert.equal(reply.type, 'jobStarted', JSON.stringify(reply));
  await popup.close();
  const made = await shown(`imagine-job-${reply.job}`);
  assert.deepEqual([made.title, made.text, made.textClickable], [en.notifyImageReady.message, 'a quiet harbour', true]);
  assert.match(made.imageURL, icon);
  await notifications.click(`imagine-job-${reply.job}`);
  await studioOpened(`?job=${reply.job}`);
  assert.deepEqual(await notifications.shown(), []);
  await blank.close();
});

test('Firefox: the GPU memory probe; offline, the studio counts tokens and makes an image from its form, the gallery shows it, the options page sets the defaults; the studio is the sidebar: the popup\'s button opens it, the toolbar button and the shortcut are set to', { timeout: 180_000 }, async (t) => {
  const ff = await setupFirefox(t, { repos: ['f32'] });
  // The GPU memory probe: lavapipe's "GPU memory" is the computer's, so the cap is reached. Firefox
  // names no adapter; the probe is kept under its features and limits instead.
  const probed = await h.api(ff.page, { type: 'gpuMemory', measure: true, probeCapBytes: 768 << 20 });
  assert.deepEqual([probed.probe?.found, probed.budget, probed.precision], [{ kind: 'plenty', bytes: 768 << 20 }, null, 'float16'], JSON.stringify(probed));
  assert.match(probed.probe.adapter, /^unnamed adapter \(shader-f16: true, maxBufferSize \d+, maxStorageBufferBindingSize \d+\)$/);

  await h.installPack(ff.page, ff.hub, 'fixtures/f32');
  // Offline from here: nothing answers at the Hub's address any more.
  await ff.hub.close();
  const studio = await ff.open('studio.html');
  // The token count comes from the core's tokenizer (shipped gzipped) and chat template: "a cat" is 14.
  await studio.type('#prompt', 'a cat');
  await studio.waitForFunction(() => /^14 \/ 512/.test(document.querySelector('#token-count').textContent), { timeout: 60_000 });
  const set = (page, id, value) => page.$eval(`#${id}`, (e, v) => {
    e.value = v;
    e.dispatchEvent(new Event('input', { bubbles: true }));
  }, value);
  await set(studio, 'width', '256');
  await set(studio, 'height', '256');
  await set(studio, 'steps', '2');
  await studio.click('#generate');
  await studio.waitForFunction(() => document.querySelector('#image')?.src.startsWith('data:image/png') && !document.querySelector('#result').hidden, { timeout: 120_000 });
  const [width, height] = await studio.$eval('#image', (img) => img.decode().then(() => [img.naturalWidth, img.naturalHeight]));
  assert.deepEqual([width, height], [256, 256]);
  // The gallery shows it; the defaults saved on the options page are the quick prompt's form's.
  const gallery = await ff.open('gallery.html');
  await gallery.waitForFunction(() => document.querySelectorAll('#grid button.thumb').length === 1, { timeout: 20_000 });
  const options = await ff.open('options.html');
  await options.waitForFunction(() => document.querySelector('#default-width').value === '512', { timeout: 20_000 });
  await set(options, 'default-width', '768');
  await set(options, 'default-steps', '6');
  await options.click('#save-defaults');
  await options.waitForFunction(() => document.querySelector('#defaults-status').textContent === 'Saved.', { timeout: 10_000 });
  const quick = await ff.open('popup.html');
  await quick.waitForFunction(() => document.querySelector('#width').value === '768', { timeout: 20_000 });
  assert.equal(await quick.$eval('#steps', (e) => e.value), '6');

  // The studio is Firefox's sidebar; the toolbar button opens it (no popup set) and so does the
  // shortcut; the popup's button opens it (the click is the gesture Firefox asks for).
  const ask = (f) => studio.evaluate(f);
  assert.match(await ask(() => chrome.sidebarAction.getPanel({})), /\/studio\.html$/);
  assert.equal(await ask(() => chrome.action.getPopup({})), '');
  assert.equal((await ask(() => chrome.commands.getAll())).find((c) => c.name === 'open-studio')?.shortcut, 'Alt+Shift+I');
  const popup = await ff.open('popup.html');
  await popup.click('#open-studio');
  let sidebars = [];
  for (let i = 0; i < 50 && sidebars.length === 0; i++) {
    await h.sleep(200);
    sidebars = await ask(() => chrome.runtime.getContexts({ contextTypes: ['SIDE_PANEL'] }));
  }
  assert.deepEqual(sidebars.map((c) => new URL(c.documentUrl).pathname), ['/studio.html']);
  assert.equal(await ask(() => chrome.sidebarAction.isOpen({})), true);
  // The toolbar button may open the quick prompt instead.
  const toolbarPopup = async (want) => {
    let now;
    for (let i = 0; i < 50 && now !== want; i++) {
      await h.sleep(200);
      now = (await ask(() => chrome.action.getPopup({}))).replace(/^.*\//, '');
    }
    assert.equal(now, want);
  };
  await studio.select('#toolbar-opens', 'popup');
  await toolbarPopup('popup.html');
  await studio.select('#toolbar-opens', 'studio');
  await toolbarPopup('');
});

test('Firefox closed mid-download and started again on the same profile: the download resumes by itself and the pack installs, verified', { timeout: 300_000 }, async (t) => {
  const { BIG_SHARD: SHARD, BIG_SHARD_SIZE: SIZE, REFETCH_BYTES } = h;
  // Installed for good in its profile, as a user has it. (Seen to fail when the profile's storage is
  // removed between the two starts: the download then does not resume.)
  const ff = await setupFirefox(t, { repos: ['f32'], hubOptions: { pad: { [SHARD]: SIZE } }, keptProfile: true });
  // 1 MiB/s: at 3 MiB/s, beside two other test files, Firefox took long enough to close that 5 MB more
  // were sent meanwhile, while its hash worker had checkpointed only 4 MiB: more re-fetched than a
  // checkpoint's interval allows.
  ff.hub.inject(SHARD, { type: 'slow', bytesPerSecond: 1 << 20 });
  assert.equal((await h.startInstall(ff.page, ff.hub, 'fixtures/f32')).type, 'installStarted');
  const mid = await h.waitForDownload(ff.page, (s) => h.fileDone(s, SHARD) >= 8 << 20, 60_000);
  const again = await ff.relaunch();
  ff.hub.clearFaults();
  // Nothing asked of it: the background's start resumes the download from its checkpoint.
  const deadline = Date.now() + 40_000;
  while (ff.hub.stats(SHARD).ranges.length < 2 && Date.now() < deadline) await h.sleep(250);
  assert.ok(ff.hub.stats(SHARD).ranges.length >= 2, 'the download did not resume by itself within 40 s of the start');
  await h.waitForInstall(again.page);
  h.assertServed(ff.hub, 'fixtures/f32', { interruptions: { [SHARD]: 1 } });
  const resumed = h.resumedFrom(ff.hub, SHARD);
  assert.ok(resumed.length === 1 && resumed[0] >= h.fileDone(mid, SHARD) - REFETCH_BYTES, JSON.stringify(ff.hub.stats(SHARD).ranges));
  assert.equal((await h.packStatus(again.page)).installed, true);
});

