// The options page: defaults (saved, checked, used by the popup), the pack source, the gallery's
// limit, the device report before any download, and deleting the model.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

async function report(page) {
  await page.waitForFunction(() => document.querySelectorAll('#device-report dt').length >= 4, null, { timeout: 30_000 });
  return page.$$eval('#device-report dt', (dts) => Object.fromEntries(dts.map((dt) => [dt.textContent, dt.nextElementSibling.textContent])));
}

test('options: defaults reach the popup, the device report, the gallery limit, delete the model', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const manifest = await b.page.evaluate(() => chrome.runtime.getManifest());
  assert.equal(manifest.options_ui.page, 'options.html');
  const options = await b.context.newPage();
  await options.goto(h.extensionUrl(b.extensionId, 'options.html'));

  await t.test('the device report names the SwiftShader adapter, shader-f16 no, the limits and the quota', async () => {
    const r = await report(options);
    assert.match(`${r['WebGPU adapter']} ${r.Description ?? ''}`, /swiftshader/i, JSON.stringify(r));
    assert.equal(r['shader-f16'], 'no');
    // What that means for the pack of the source in the form is the verdict above the details: the
    // published float16 pack's (the Hub, the form's default; more in setup.test.mjs), then, with the
    // installed pack's source typed in, that pack's (the float32 fixture: nothing to convert). The
    // details say how Linux + NVIDIA gets the feature.
    assert.match(await options.textContent('#device-verdict'), /adapts it once while downloading \(about \+892\u00a0MB on disk\)/);
    await options.click('#source-advanced summary');
    await options.fill('#hub-endpoint', b.hub.url);
    await options.fill('#hub-repo', b.repo);
    await options.waitForFunction(() => document.querySelector('#device-verdict').textContent === 'This GPU runs this model as downloaded.');
    // Typed, not saved: the page as it loads shows the saved source again.
    await options.reload();
    await options.waitForFunction(() => /adapts it once while downloading/.test(document.querySelector('#device-verdict').textContent));
    // The Linux + NVIDIA flag is not offered to a GPU it cannot help.
    assert.equal(r.Hint, undefined);
    assert.equal(r['Found by asking for'], 'the high-performance GPU');
    assert.match(r.maxBufferSize, /^\d+(\.\d+)?\u00a0(GB|MB)$/);
    assert.match(r.maxStorageBufferBindingSize, /^\d+(\.\d+)?\u00a0(GB|MB)$/);
    assert.match(r.Storage, /used of/);
  });

  await t.test('defaults are checked, saved, and the popup and the studio start from them', async () => {
    await options.waitForFunction(() => document.querySelector('#default-width').value === '512');
    // Every value not allowed is marked at its own field at once, with the nearest allowed values
    // offered; nothing is saved; the focus is on the first.
    await options.fill('#default-width', '300');
    await options.fill('#default-steps', '99');
    await options.click('#save-defaults');
    await options.waitForSelector('#default-steps-error:not([hidden])');
    assert.equal(await options.textContent('#default-width-error .message'), '300 pixels is not allowed: use a multiple of 16 from 256 to 1536.');
    assert.equal(await options.textContent('#default-steps-error .message'), '99 steps is not allowed: choose from 1 to 50 (more steps take longer).');
    assert.equal(await options.isHidden('#default-height-error'), true);
    assert.equal(await options.evaluate(() => document.activeElement.id), 'default-width');
    assert.equal(await options.textContent('#defaults-status'), '');
    assert.deepEqual(await options.evaluate(() => chrome.storage.local.get('imagine.defaults')), {});
    assert.deepEqual(await options.$$eval('#default-width-error .fixes button', (bs) => bs.map((b) => b.textContent)), ['Use 288', 'Use 304']);
    await options.click('#default-steps-error .fixes button');
    assert.equal(await options.inputValue('#default-steps'), '50');
    assert.equal(await options.isHidden('#default-steps-error'), true);
    await options.fill('#default-width', '768');
    assert.equal(await options.isHidden('#default-width-error'), true);
    await options.fill('#default-height', '384');
    await options.fill('#default-steps', '6');
    await options.selectOption('#default-schedule', 'linear-shift');
    await options.click('#save-defaults');
    await options.waitForFunction(() => document.querySelector('#defaults-status').textContent === 'Saved.');
    const stored = await options.evaluate(() => chrome.storage.local.get('imagine.defaults'));
    const { savedAtMs, ...saved } = stored['imagine.defaults'];
    assert.deepEqual(saved, { width: 768, height: 384, steps: 6, schedule: 'linear-shift' });
    assert.ok(savedAtMs > 0, JSON.stringify(stored));
    await b.page.reload();
    await b.page.waitForFunction(() => document.querySelector('#width').value === '768');
    assert.equal(await b.page.inputValue('#height'), '384');
    assert.equal(await b.page.inputValue('#steps'), '6');
    assert.equal(await b.page.inputValue('#schedule'), 'linear-shift');
    // The studio starts from them too, over its own settings of an earlier visit; settings it keeps
    // from a later one stay its own.
    const studio = await b.context.newPage();
    await studio.goto(h.extensionUrl(b.extensionId, 'studio.html'));
    const form = (page) => page.evaluate(() => ['#width', '#height', '#steps', '#schedule'].map((s) => document.querySelector(s).value));
    for (const [keptAt, expected] of [[savedAtMs - 1, ['768', '384', '6', 'linear-shift']], [savedAtMs + 1, ['1024', '1024', '2', 'empirical']]]) {
      await studio.evaluate((at) => localStorage.setItem('imagine.studio.settings', JSON.stringify({ width: '1024', height: '1024', steps: '2', schedule: 'empirical', savedAtMs: at })), keptAt);
      await studio.reload();
      // The shortcut is shown after the defaults are looked at.
      await studio.waitForFunction(() => document.querySelector('#shortcut').textContent !== '');
      assert.deepEqual(await form(studio), expected);
    }
    await studio.close();
  });

  await t.test('the source is saved and the popup offers it', async () => {
    // Folded away under "Advanced" while the source is the model's own.
    assert.equal(await options.isVisible('#hub-revision'), false);
    await options.click('#source-advanced summary');
    await options.fill('#hub-revision', 'v1.0');
    await options.click('#save-source');
    await options.waitForFunction(() => document.querySelector('#model-status').textContent.startsWith('Source saved. '));
    const stored = await options.evaluate(() => chrome.storage.local.get('imagine.source'));
    assert.deepEqual(stored['imagine.source'], { endpoint: 'https://huggingface.co', repo: 'cgb/flux2-klein-4b-onnx-webgpu', revision: 'v1.0' });
    await b.page.reload();
    await b.page.waitForFunction(() => document.querySelector('#hub-revision').value === 'v1.0');
  });

  await t.test('the gallery limit is set through the message API', async () => {
    await options.fill('#max-items', '7');
    await options.fill('#max-megabytes', '64');
    await options.click('#save-limit');
    // Typed in MB, shown in MB: one unit system (decimal) on every page.
    await options.waitForFunction(() => /^Saved: at most 7 images and 64\.0\u00a0MB\.$/.test(document.querySelector('#limit-status').textContent));
    const page = await h.api(b.page, { type: 'galleryList' });
    assert.deepEqual(page.limit, { maxItems: 7, maxBytes: 64_000_000 });
    // A limit out of range is marked at its field, in the field's own terms, and nothing is sent.
    // Half a megabyte is below the limit too, not cut to a whole number and ignored.
    for (const [field, value, text] of [['#max-items', '0', 'Keep between 1 and 10000 images.'], ['#max-megabytes', '70000', 'Use between 1 and 64000 MB.'], ['#max-megabytes', '0.5', 'Use between 1 and 64000 MB.']]) {
      await options.fill(field, value);
      await options.click('#save-limit');
      await options.waitForFunction((f) => document.querySelector(f).getAttribute('aria-invalid') === 'true', field);
      assert.equal(await options.textContent(`${field}-error .message`), text);
      // The earlier "Saved: …" is gone: it was not about this try.
      assert.equal(await options.textContent('#limit-status'), '');
      assert.equal(await options.evaluate(() => document.activeElement.id), field.slice(1));
      assert.deepEqual((await h.api(b.page, { type: 'galleryList' })).limit, { maxItems: 7, maxBytes: 64_000_000 });
      await options.fill(field, field === '#max-items' ? '7' : '64');
      assert.equal(await options.getAttribute(field, 'aria-invalid'), null);
      assert.equal(await options.isHidden(`${field}-error`), true);
    }
  });

  await t.test('keep the model loaded: the setting, what is loaded now, off unloads it', async () => {
    await options.reload();
    const status = () => options.evaluate(() => document.querySelector('#keep-loaded-status').textContent);
    await options.waitForFunction(() => document.querySelector('#keep-loaded-status').textContent !== '');
    assert.equal(await options.inputValue('#keep-loaded'), '300');
    assert.equal(await status(), 'Nothing is loaded now.');
    // Followed while the page is open: no reload.
    await h.generateOk(b.page, { prompt: 'a kettle', width: 256, height: 256, steps: 1, seed: '5' });
    await options.waitForFunction(() => document.querySelector('#keep-loaded-status').textContent === 'Loaded now: text encoder, transformer, decoder.', null, { timeout: 10_000 });
    await options.selectOption('#keep-loaded', '0');
    await options.waitForFunction(() => document.querySelector('#keep-loaded-status').textContent === 'Nothing is loaded now.');
    assert.deepEqual(await options.evaluate(() => chrome.storage.local.get('imagine.keepLoaded')), { 'imagine.keepLoaded': 0 });
    assert.deepEqual(await h.api(b.page, { type: 'keepLoaded' }), { type: 'keepLoaded', seconds: 0, loaded: [] });
    // A value set through the message API is shown as it is.
    await h.api(b.page, { type: 'keepLoaded', seconds: 90 });
    await options.reload();
    await options.waitForFunction(() => document.querySelector('#keep-loaded').value === '90');
    assert.equal(await options.evaluate(() => document.querySelector('#keep-loaded').selectedOptions[0].textContent), 'for 90 seconds after the last image');
    await options.selectOption('#keep-loaded', '1800');
    await options.waitForFunction(async () => (await chrome.storage.local.get('imagine.keepLoaded'))['imagine.keepLoaded'] === 1800);
  });

  await t.test('screenshots in light and dark', async () => {
    await options.reload();
    await report(options);
    fs.mkdirSync(h.OUT, { recursive: true });
    for (const scheme of ['light', 'dark']) {
      await options.emulateMedia({ colorScheme: scheme });
      await options.screenshot({ path: path.join(h.OUT, `options-${scheme}.png`), fullPage: true });
    }
    await options.emulateMedia({ colorScheme: null });
  });

  await t.test('delete model', async () => {
    await options.waitForFunction(() => /^Installed: fixtures\/f32/.test(document.querySelector('#model-status').textContent));
    // Asked first, saying what it costs; "Keep it" (focused) keeps it.
    await options.click('#delete-pack');
    await options.waitForSelector('#delete-confirm[open]');
    assert.match(await options.textContent('#delete-confirm-text'), /^Delete the model \(.+\)\? Making images again means downloading it again/);
    // What downloading it again costs is this pack's size, as the page shows it (6.5 GB only for the
    // published pack).
    const size = /\(([^)]+)\), works offline\.$/.exec(await options.textContent('#model-status'))[1];
    assert.equal(await options.textContent('#delete-confirm-text'), `Delete the model (fixtures/f32)? Making images again means downloading it again (${size}).`);
    assert.deepEqual(await h.axeViolations(options), []);
    assert.equal(await options.evaluate(() => document.activeElement.id), 'delete-confirm-no');
    await options.click('#delete-confirm-no');
    await options.waitForSelector('#delete-confirm:not([open])', { state: 'attached' });
    assert.equal((await h.packStatus(b.page)).installed, true);
    // Escape cancels too.
    await options.click('#delete-pack');
    await options.waitForSelector('#delete-confirm[open]');
    await options.keyboard.press('Escape');
    await options.waitForSelector('#delete-confirm:not([open])', { state: 'attached' });
    await h.sleep(500);
    assert.equal((await h.packStatus(b.page)).installed, true);
    assert.match(await options.textContent('#model-status'), /^Installed: fixtures\/f32/);
    // Deleted with the stages loaded and the popup and the studio open: every page follows at once.
    await h.generateOk(b.page, { prompt: 'a kettle', width: 256, height: 256, steps: 1, seed: '6' });
    await options.waitForFunction(() => /^Loaded now: /.test(document.querySelector('#keep-loaded-status').textContent), null, { timeout: 10_000 });
    const popup = await b.context.newPage();
    await popup.goto(h.extensionUrl(b.extensionId, 'popup.html'));
    await popup.waitForFunction(() => /^Model installed/.test(document.querySelector('#pack-status').textContent), null, { timeout: 15_000 });
    const studio = await b.context.newPage();
    await studio.goto(h.extensionUrl(b.extensionId, 'studio.html'));
    await studio.waitForSelector('#setup', { state: 'hidden', timeout: 15_000 });
    assert.equal(await studio.getAttribute('#generate', 'aria-disabled'), null);
    await options.bringToFront();
    await options.click('#delete-pack');
    await options.click('#delete-confirm-yes');
    await options.waitForFunction(() => document.querySelector('#model-status').textContent === 'The model is not installed yet.');
    assert.equal((await h.packStatus(b.page)).installed, false);
    assert.equal(await options.isHidden('#delete-pack'), true);
    await options.waitForFunction(() => document.querySelector('#keep-loaded-status').textContent === 'Nothing is loaded now.', null, { timeout: 5_000 });
    await popup.waitForFunction(() => document.querySelector('#pack-status').textContent === 'The model is not installed yet.', null, { timeout: 5_000 });
    await studio.waitForSelector('#setup', { state: 'visible', timeout: 5_000 });
    assert.equal(await studio.getAttribute('#generate', 'aria-disabled'), 'true');
    await popup.close();
    await studio.close();
  });
});

test('options in German: deleting the model asks first, with the size to download again; cancelled, nothing is deleted', { timeout: 300_000 }, async (t) => {
  const b = await h.setup(t, { args: ['--lang=de'] });
  const options = await b.context.newPage();
  await options.goto(h.extensionUrl(b.extensionId, 'options.html'));
  await options.waitForFunction(() => /^Installiert: fixtures\/f32/.test(document.querySelector('#model-status').textContent));
  const size = /\(([^)]+)\), funktioniert offline\.$/.exec(await options.textContent('#model-status'))[1];
  // In German's number format: a decimal comma.
  assert.match(size, /^\d+,\d\u00a0(MB|GB)$/);
  assert.equal(await options.textContent('#delete-pack'), 'Modell löschen');
  await options.click('#delete-pack');
  await options.waitForSelector('#delete-confirm[open]');
  assert.equal(
    await options.textContent('#delete-confirm-text'),
    `Das Modell (fixtures/f32) löschen? Um wieder Bilder zu erzeugen, muss es erneut heruntergeladen werden (${size}).`,
  );
  assert.deepEqual([await options.textContent('#delete-confirm-yes'), await options.textContent('#delete-confirm-no')], ['Löschen', 'Behalten']);
  assert.equal(await options.evaluate(() => document.activeElement.id), 'delete-confirm-no');
  assert.deepEqual(await h.axeViolations(options), []);
  await options.keyboard.press('Enter');
  await options.waitForSelector('#delete-confirm:not([open])', { state: 'attached' });
  await h.sleep(500);
  assert.equal((await h.packStatus(b.page)).installed, true);
  await options.click('#delete-pack');
  await options.click('#delete-confirm-yes');
  await options.waitForFunction(() => document.querySelector('#model-status').textContent === 'Das Modell ist noch nicht installiert.');
  assert.equal((await h.packStatus(b.page)).installed, false);
});

test('the adapter is looked for with high-performance, then no preference, then low-power', { timeout: 120_000 }, async (t) => {
  const b = await h.setup(t, { pack: null });
  const url = h.gpuAdapterUrl();
  const orders = await b.page.evaluate(async (url) => {
    const { requestAnyAdapter } = await import(url);
    // A stand-in GPU that offers an adapter for the preferences in `offers` only, and records the asks.
    const ask = async (offers, options) => {
      const asked = [];
      const gpu = { async requestAdapter(o) { asked.push(o.powerPreference ?? 'none'); return offers.includes(o.powerPreference ?? 'none') ? { offered: o.powerPreference ?? 'none' } : null; } };
      const found = await requestAnyAdapter(gpu, options);
      return { asked, found: found.powerPreference, adapter: found.adapter?.offered ?? null };
    };
    return {
      first: await ask(['high-performance', 'low-power']),
      none: await ask(['none', 'low-power']),
      low: await ask(['low-power']),
      nothing: await ask([]),
      askedLow: await ask(['high-performance', 'low-power'], { powerPreference: 'low-power' }),
    };
  }, url);
  assert.deepEqual(orders.first, { asked: ['high-performance'], found: 'high-performance', adapter: 'high-performance' });
  assert.deepEqual(orders.none, { asked: ['high-performance', 'none'], found: 'default', adapter: 'none' });
  assert.deepEqual(orders.low, { asked: ['high-performance', 'none', 'low-power'], found: 'low-power', adapter: 'low-power' });
  assert.deepEqual(orders.nothing, { asked: ['high-performance', 'none', 'low-power'], found: null, adapter: null });
  assert.deepEqual(orders.askedLow, { asked: ['low-power'], found: 'low-power', adapter: 'low-power' });

  // Patched as the stage workers patch it (for ONNX Runtime's own request): a real adapter although
  // high-performance gives none.
  const patched = await b.page.evaluate(async (url) => {
    // Only this test's asks are counted (marked): the page may look for the adapter itself meanwhile.
    const asked = [];
    const real = GPU.prototype.requestAdapter;
    GPU.prototype.requestAdapter = function (o = {}) {
      if (o.test) asked.push(o.powerPreference ?? 'none');
      return o.powerPreference === 'high-performance' ? Promise.resolve(null) : real.call(this, o);
    };
    const { findAnyAdapter } = await import(url);
    findAnyAdapter();
    findAnyAdapter(); // idempotent: one level of fallback, not two
    const adapter = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance', test: true });
    const patchedAsked = asked.splice(0);
    // The options page's probe, in a context patched so: it still says which preference found it.
    const { requestAnyAdapter } = await import(url);
    const found = await requestAnyAdapter(navigator.gpu, { test: true });
    return { asked: patchedAsked, isAdapter: adapter instanceof GPUAdapter, probe: found.powerPreference, probeAsked: asked };
  }, url);
  assert.deepEqual(patched, {
    asked: ['high-performance', 'none'],
    isAdapter: true,
    probe: 'default',
    probeAsked: ['high-performance', 'none'],
  });
});

test('the device report says which preference found the adapter when high-performance finds none', { timeout: 120_000 }, async (t) => {
  const b = await h.setup(t, { pack: null });
  // As on a GPU machine whose Chrome offers its GPU only for other preferences.
  await b.context.addInitScript(() => {
    const real = GPU.prototype.requestAdapter;
    GPU.prototype.requestAdapter = function (o = {}) {
      return o.powerPreference === 'high-performance' ? Promise.resolve(null) : real.call(this, o);
    };
  });
  const options = await b.context.newPage();
  await options.goto(h.extensionUrl(b.extensionId, 'options.html'));
  const r = await report(options);
  assert.match(`${r['WebGPU adapter']} ${r.Description ?? ''}`, /swiftshader/i, JSON.stringify(r));
  assert.equal(r['Found by asking for'], "the browser's default GPU (none for high performance)");
});

test('ONNX Runtime gets subgroup matrices only where its form of the WGSL compiles', { timeout: 120_000 }, async (t) => {
  const b = await h.setup(t, { pack: null });
  const url = h.gpuAdapterUrl();
  const SM = 'chromium-experimental-subgroup-matrix';

  // Stand-ins: an adapter offering an f16 16x16x16 configuration, the probe device compiling or not.
  const cases = await b.page.evaluate(async ({ url, SM }) => {
    const { requestDeviceOrtCanUse } = await import(url);
    const adapter = { info: { subgroupMatrixConfigs: [{ componentType: 'u8', M: 8, N: 8, K: 32 }, { componentType: 'f16', M: 16, N: 16, K: 16 }] } };
    const run = async (requiredFeatures, probe) => {
      const asked = [];
      const seen = { probeFeatures: null, code: null, destroyed: false };
      const request = async function (descriptor) { asked.push(descriptor); return { features: new Set(descriptor.requiredFeatures) }; };
      const openProbe = async (features) => {
        seen.probeFeatures = features;
        if (probe === 'throws') throw new Error('no such feature');
        if (probe === 'none') return null;
        return {
          createShaderModule({ code }) {
            seen.code = code;
            return { getCompilationInfo: async () => ({ messages: probe === 'fails' ? [{ type: 'error', message: 'unresolved value row_major' }] : [{ type: 'warning', message: 'w' }] }) };
          },
          destroy() { seen.destroyed = true; },
        };
      };
      const device = await requestDeviceOrtCanUse(adapter, { requiredFeatures, requiredLimits: { maxBufferSize: 1024 } }, request, openProbe);
      return { asked, features: [...device.features], ...seen };
    };
    return {
      notAsked: await run(['shader-f16'], 'fails'),
      compiles: await run(['shader-f16', 'subgroups', SM, 'timestamp-query'], 'compiles'),
      fails: await run(['shader-f16', 'subgroups', SM, 'timestamp-query'], 'fails'),
      noProbeDevice: await run([SM], 'none'),
      probeThrows: await run([SM], 'throws'),
    };
  }, { url, SM });
  assert.deepEqual(cases.notAsked, { asked: [{ requiredFeatures: ['shader-f16'], requiredLimits: { maxBufferSize: 1024 } }], features: ['shader-f16'], probeFeatures: null, code: null, destroyed: false });
  assert.deepEqual(cases.compiles.features, ['shader-f16', 'subgroups', SM, 'timestamp-query']);
  assert.deepEqual(cases.compiles.probeFeatures, ['shader-f16', 'subgroups', SM]);
  assert.equal(cases.compiles.destroyed, true);
  // ORT's form, of the adapter's float configuration (16x16, f16 as the device gets shader-f16).
  assert.match(cases.compiles.code, /^enable f16;\nenable subgroups;\nenable chromium_experimental_subgroup_matrix;\n/);
  assert.match(cases.compiles.code, /subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, row_major>\(&data, 0, 16\)/);
  assert.match(cases.compiles.code, /subgroupMatrixStore<row_major>\(&data, 0, m, 16\)/);
  assert.deepEqual(cases.fails.asked, [{ requiredFeatures: ['shader-f16', 'subgroups', 'timestamp-query'], requiredLimits: { maxBufferSize: 1024 } }]);
  assert.equal(cases.fails.destroyed, true);
  assert.deepEqual(cases.noProbeDevice.features, []);
  assert.deepEqual(cases.probeThrows.features, []);

  // The real thing on SwiftShader: its compiler rejects the probe on a device without the feature and
  // takes a plain shader; asked for a feature this adapter lacks, the patched requestDevice (as ORT
  // calls it) opens the device without it; other requests pass through unchanged.
  const real = await b.page.evaluate(async ({ url, SM }) => {
    const { compiles, subgroupMatrixProbe, openDevicesOrtCanUse } = await import(url);
    openDevicesOrtCanUse();
    openDevicesOrtCanUse(); // idempotent
    const plainDevice = await (await navigator.gpu.requestAdapter()).requestDevice();
    const probe = await compiles(plainDevice, subgroupMatrixProbe());
    const plain = await compiles(plainDevice, '@compute @workgroup_size(1) fn main() {}');
    const adapter = await navigator.gpu.requestAdapter();
    const offered = adapter.features.has(SM);
    const device = await adapter.requestDevice({ requiredFeatures: [SM] });
    return { probe, plain, offered, hasIt: device.features.has(SM), lost: await Promise.race([device.lost.then(() => true), new Promise((r) => setTimeout(() => r(false), 200))]) };
  }, { url, SM });
  assert.deepEqual(real, { probe: false, plain: true, offered: false, hasIt: false, lost: false });
});
