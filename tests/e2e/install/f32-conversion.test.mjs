// The float16 pack on a WebGPU adapter without shader-f16 (SwiftShader): the popup states what running
// in float32 costs, the install converts the float16 graphs to float32 in the staging slot (progress
// `converting`, resumable, verified), and generation on WebGPU matches the float32 reference.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const REPO = 'fixtures/f16';
const PROMPT = 'a red fox in the snow';

/**
 * Largest per-channel difference (0..255) allowed between the converted f16 pack on WebGPU and the
 * reference of the f32 fixture pack (the same weights: make_packs.py draws one set of float32 weights
 * for every variant, and the f16 graphs keep them float32 between Casts, so the converted graphs
 * compute exactly the f32 pack's function). It is therefore the f32 pack's own WebGPU tolerance
 * (generate.test.mjs, F32_TOLERANCE: summation order on SwiftShader versus numpy). Measured
 * (2026-12-01, SwiftShader): 1 level, 942 of 65536 pixels differ, against the f32 reference; 1 level,
 * 7808 pixels, against the f16 pack's own reference (float16 rounding the converted run does not do).
 */
const TOLERANCE = 1;

async function generateAndCompare(b, name, referencePack) {
  const req = { prompt: PROMPT, width: 256, height: 256, steps: 2, seed: '42', trace: true, backend: 'webgpu' };
  const { result } = await h.generateOk(b.page, req);
  const files = h.writeResult(name, result);
  const out = await h.compareWithReference({ packDir: path.join(h.PACKS, referencePack), traceJson: files.json, png: files.png, tol: TOLERANCE, name });
  return out;
}

/** Records in the page when the conversion's first progress and the `installing` state arrive. */
async function watchConversion(page) {
  await page.evaluate(() => {
    window.__conversion = {};
    chrome.runtime.onMessage.addListener((m) => {
      const c = window.__conversion;
      if (m?.type === 'packProgress' && m.state === 'converting') c.first ??= performance.now();
      if (m?.type === 'packProgress' && m.state === 'installing') c.installing ??= performance.now();
      return false;
    });
  });
}

/** Milliseconds from the conversion's first progress to the `installing` state. */
async function conversionMs(page) {
  const c = await page.evaluate(() => window.__conversion);
  return Math.round(c.installing - c.first);
}

/** The converted files (`*.f32.onnx`, `*.f32-NNNNN.data`) under an OPFS tree, by path. */
function convertedFiles(tree) {
  return Object.keys(tree).filter((p) => /\.f32(\.onnx|-\d{5}\.data)$/.test(p));
}

test('f16 pack without shader-f16: the plan states the float32 cost, the install converts, the image matches the f32 reference', { timeout: 900_000 }, async (t) => {
  const b = await h.setup(t, { install: false });
  const plan = await h.api(b.page, { type: 'planPack', endpoint: b.hub.url, repo: REPO, revision: 'main' });
  assert.equal(plan.type, 'packPlan', JSON.stringify(plan));
  assert.ok(plan.conversion, `no conversion in the plan: ${JSON.stringify(plan, h.shorten)}`);
  assert.ok(plan.conversion.extraDiskBytes > 0 && plan.conversion.gpuBytes > 0, JSON.stringify(plan.conversion));
  // The f32 plan has none (nothing to convert).
  const f32 = await h.api(b.page, { type: 'planPack', endpoint: b.hub.url, repo: 'fixtures/f32', revision: 'main' });
  assert.equal(f32.conversion, undefined, JSON.stringify(f32.conversion));

  // The popup's verdict says it with the plan's extra disk once the size was checked.
  await b.page.click('summary:has-text("Source")');
  await b.page.fill('#hub-endpoint', b.hub.url);
  await b.page.fill('#hub-repo', REPO);
  await b.page.click('#check-size');
  await b.page.waitForFunction(() => /files, downloaded once/.test(document.querySelector('#pack-size')?.textContent ?? ''), null, { timeout: 30_000 });
  const verdict = await b.page.textContent('#device-verdict');
  // The number and its unit held together by a no-break space.
  const planned = `+${h.formatBytes(plan.conversion.extraDiskBytes).replace(' ', '\u00a0')}`;
  assert.equal(verdict, `This GPU cannot run the model as published, so Imagine adapts it once while downloading (${planned} on disk); after that it runs like any other.`);

  await watchConversion(b.page);
  await h.installPack(b.page, b.hub, REPO);
  const ms = await conversionMs(b.page);
  const converting = (await h.events(b.page)).filter((e) => e.type === 'packProgress' && e.state === 'converting');
  assert.ok(converting.length > 0, 'no converting progress');
  const last = converting.at(-1);
  assert.equal(last.doneBytes, last.totalBytes, JSON.stringify(last, h.shorten));
  const state = await h.packState(b.page);
  assert.ok(state.installed.conversion, JSON.stringify(state, h.shorten));
  assert.equal(typeof state.installed.conversion.limits.maxStorageBufferBindingSize, 'number');
  const tree = await h.opfsTree(b.page);
  const dir = await h.installedDir(b.page);
  const converted = convertedFiles(tree);
  assert.ok(converted.length >= 2 && converted.every((p) => p.startsWith(`${dir}/`)), JSON.stringify(converted));
  assert.ok(!Object.keys(tree).some((p) => p.endsWith('conversion.json')), 'conversion state left behind');
  const extra = converted.reduce((n, p) => n + tree[p], 0);
  console.log(`f16 fixture: conversion ${ms} ms; converted ${last.totalBytes} bytes; extra disk ${extra} bytes; plan said ${plan.conversion.extraDiskBytes}`);
  assert.equal(extra, plan.conversion.extraDiskBytes);

  console.log(await generateAndCompare(b, 'f32-conversion-f16', 'f32'));
  // For the record: against the f16 pack's own reference (float16 activations).
  const res = h.writeResult('f32-conversion-f16', (await h.generateOk(b.page, { prompt: PROMPT, width: 256, height: 256, steps: 2, seed: '42', trace: true })).result);
  const r = await h.run('python3', ['tests/reference/reference.py', '--pack', path.join(h.PACKS, 'f16'), '--trace', res.json, '--out', path.join(h.OUT, 'f32-conversion-f16.ref16.png')]);
  assert.equal(r.code, 0, r.stderr);
  const c = await h.run('python3', ['tests/reference/compare.py', res.png, path.join(h.OUT, 'f32-conversion-f16.ref16.png'), '--tol', '255']);
  console.log(`against the f16 reference: ${c.stdout}`);

  // Installing the f32 pack removes the converted pack's slot, converted files included.
  await h.installPack(b.page, b.hub, 'fixtures/f32');
  assert.deepEqual(convertedFiles(await h.opfsTree(b.page)), []);
});

test('a conversion interrupted by the browser closing resumes after the restart; nothing of it lingers', { timeout: 900_000 }, async (t) => {
  const hub = await h.startHub();
  const profileDir = fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-conv-'));
  t.after(async () => {
    await hub.close();
    fs.rmSync(profileDir, { recursive: true, force: true });
  });
  let b = await h.launch({ profileDir });
  try {
    await h.collectEvents(b.page);
    await h.installPack(b.page, hub, 'fixtures/f32');
    const oldDir = await h.installedDir(b.page);
    await h.armFailpoint(b.page, 'convert:file-done');
    const reply = await h.startInstall(b.page, hub, REPO);
    assert.equal(reply.type, 'installStarted', JSON.stringify(reply));
    await h.waitForFailpoint(b.page);
    // Stopped after the first converted file was written and verified: the f32 pack is still the
    // installed one; the converted file is staged with the conversion's state.
    const state = await h.packState(b.page);
    assert.equal(state.installed.source.repo, 'fixtures/f32');
    assert.equal(state.installed.conversion, undefined);
    const before = await h.opfsTree(b.page);
    const staged = convertedFiles(before);
    assert.ok(staged.length > 0 && staged.every((p) => !p.startsWith(`${oldDir}/`)), JSON.stringify(staged));
    assert.ok(Object.keys(before).some((p) => p.endsWith('conversion.json')), 'no conversion state saved');
    await b.close();

    b = await h.launch({ profileDir });
    await h.collectEvents(b.page);
    await h.waitForInstall(b.page, 300_000);
    const after = await h.packState(b.page);
    assert.equal(after.installed.source.repo, REPO);
    assert.ok(after.installed.conversion, JSON.stringify(after, h.shorten));
    const dir = await h.installedDir(b.page);
    const tree = await h.opfsTree(b.page);
    assert.notEqual(dir, oldDir);
    // The old slot is empty; the only converted files are the installed pack's.
    assert.deepEqual(Object.keys(tree).filter((p) => p.startsWith(`${oldDir}/`)), []);
    assert.ok(convertedFiles(tree).every((p) => p.startsWith(`${dir}/`)));
    assert.ok(!Object.keys(tree).some((p) => p.endsWith('conversion.json')), 'conversion state left behind');
    await generateAndCompare(b, 'f32-conversion-resumed', 'f32');
  } finally {
    await b.close();
  }
});

test('a conversion resumed after a pause is not charged again for what it converted before', { timeout: 300_000 }, async (t) => {
  const b = await h.setup(t, { install: false });
  const plan = await h.api(b.page, { type: 'planPack', endpoint: b.hub.url, repo: REPO, revision: 'main' });
  const extra = plan.conversion.extraDiskBytes;
  await h.armFailpoint(b.page, 'convert:file-done');
  assert.equal((await h.startInstall(b.page, b.hub, REPO)).type, 'installStarted');
  await h.waitForFailpoint(b.page);
  assert.equal((await h.api(b.page, { type: 'pausePack' })).type, 'done');
  await h.waitForDownload(b.page, (s) => s.download?.state === 'paused', 10_000);
  // What it converted: the files it verified, whole.
  const staging = await h.stagingDir(b.page);
  const state = JSON.parse(await h.opfsText(b.page, `${staging}/conversion.json`));
  const tree = await h.opfsTree(b.page);
  const written = state.verified.reduce((n, name) => n + tree[`${staging}/${name}`], 0);
  assert.ok(written >= 1000, `${JSON.stringify(state)} ${written}`);
  // No room at all: the refusal says what is still needed, which is what is left to convert.
  const { usage } = await h.storageEstimate(b.page);
  await h.setQuota(b.context, b.page, usage);
  try {
    assert.equal((await h.resumePack(b.page)).type, 'installStarted');
    const error = await h.waitForInstallFailure(b.page, 60_000);
    const [, amount, unit] = /needs ([\d.]+) (bytes|KB|MB) more/.exec(error) ?? [];
    const needed = Number(amount) * { bytes: 1, KB: 1e3, MB: 1e6 }[unit];
    assert.ok(Math.abs(needed - (extra - written)) <= 50, `${error}: needed ${needed}, left to convert ${extra - written} of ${extra}`);
  } finally {
    await h.setQuota(b.context, b.page, null);
  }
  assert.equal((await h.resumePack(b.page)).type, 'installStarted');
  await h.waitForInstall(b.page, 300_000);
  assert.ok((await h.packState(b.page)).installed.conversion, 'installed without its float32 conversion');
});

test('an operator the float32 rewrite does not know is refused before downloading, naming node and operator', { timeout: 300_000 }, async (t) => {
  // The f16 fixture with one text-encoder node turned into an operator the rewrite has no rule for.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'imagine-f16-unknown-op-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  for (const f of fs.readdirSync(h.fixtureDir('f16'))) fs.copyFileSync(path.join(h.fixtureDir('f16'), f), path.join(dir, f));
  const script = `
import onnx, sys
p = sys.argv[1] + '/text_encoder_q4.onnx'
m = onnx.load(p, load_external_data=False)
n = next(n for n in m.graph.node if n.op_type == 'Sin' or n.op_type == 'Tanh' or n.op_type == 'Mul')
n.op_type, n.domain, n.name = 'Frobnicate', 'com.example', 'frob_node'
m.opset_import.append(onnx.helper.make_opsetid('com.example', 1))
onnx.save(m, p)
`;
  const r = await h.run('python3', ['-c', script, dir]);
  assert.equal(r.code, 0, r.stderr);
  const repo = 'broken/f16';
  const b = await h.setup(t, { pack: null, install: false, hubOptions: { repos: { [repo]: { dir } } } });
  const plan = await h.api(b.page, { type: 'planPack', endpoint: b.hub.url, repo, revision: 'main' });
  assert.equal(plan.type, 'error', JSON.stringify(plan, h.shorten));
  assert.match(plan.error, /frob_node/);
  assert.match(plan.error, /com\.example::Frobnicate/);
  const reply = await h.startInstall(b.page, b.hub, repo);
  const error = reply.type === 'error' ? reply.error : await h.waitForInstallFailure(b.page, 60_000);
  assert.match(error, /frob_node/);
  assert.match(error, /com\.example::Frobnicate/);
  for (const f of h.packFiles(b.hub, repo)) {
    if (f.path.endsWith('.data')) assert.equal(h.servedBytes(b.hub, f.path), 0, `${f.path} was downloaded`);
  }
  assert.equal((await h.packStatus(b.page)).installed, false);
  assert.deepEqual(Object.keys(await h.opfsTree(b.page)).filter((p) => /\.(data|onnx)$/.test(p)), []);
});
