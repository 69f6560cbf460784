// The GPU memory budget drives the plan: with no known limit every stage loads at once and stays
// loaded; under a small budget one stage is loaded at a time, nothing stays, and the image is the
// same; a job the plan had no room for fails with what it needs and what would fit. The probe holds
// buffers until the GPU refuses or its cap (on SwiftShader only when a test gives a cap). The studio,
// the popup and the options page say which sizes fit.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';
import { medianBetween, peakBetween, startSampler } from '../lib/proc-memory.mjs';

const byStage = (result) => Object.fromEntries(result.timings.stages.map((s) => [s.stage, s]));
const REQ = { prompt: 'a kettle on a stove', width: 256, height: 256, steps: 2, seed: '21' };
const GB = 1e9;

async function gpuMemory(page, request = {}) {
  const reply = await h.api(page, { type: 'gpuMemory', ...request });
  assert.equal(reply.type, 'gpuMemory', JSON.stringify(reply));
  return reply;
}

/** The most stage workers alive at once while `fn` runs (CDP target polling every 50 ms). */
async function mostStageWorkers(b, fn) {
  const watch = h.watchWorkers(b.context, { intervalMs: 50 });
  let value;
  try {
    value = await fn();
  } finally {
    const samples = await watch.stop();
    value = { value, most: Math.max(0, ...samples.map((s) => s.workers.filter(h.isStageWorker).length)) };
  }
  return value;
}

test('under a small budget no two stages are loaded at once, none stays, and the image is the same', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  // SwiftShader's "GPU memory" is the computer's: the probe does not fill it, so there is no limit.
  const auto = await gpuMemory(b.page);
  assert.deepEqual(auto.setting, { mode: 'auto' });
  assert.equal(auto.probe?.found?.kind, 'unknown', JSON.stringify(auto));
  assert.equal(auto.budget, null);
  assert.equal(auto.precision, 'float32', 'SwiftShader has no shader-f16');
  assert.ok(auto.weights.transformer > 0 && auto.weights.decoder > 0, JSON.stringify(auto.weights));

  const unlimited = await mostStageWorkers(b, () => h.generateOk(b.page, REQ));
  const u = unlimited.value.result.timings;
  assert.equal(u.memory.ahead, true, JSON.stringify(u.memory));
  assert.equal(u.memory.keep, true, JSON.stringify(u.memory));
  assert.equal(u.budget, undefined);
  assert.equal(unlimited.most, 3, 'with no limit every stage loads at once');
  // Stages at once let ORT compile its wasm from its URL (Chromium's code cache); one at a time hands
  // it the bytes (stage_run.rs, `stage_worker_script`).
  const asBytes = (r) => r.timings.stages.map((s) => [s.stage, s.ortWasmAsBytes ?? false]);
  assert.deepEqual(asBytes(unlimited.value.result), [['textEncoder', false], ['transformer', false], ['decoder', false]]);
  assert.deepEqual((await h.api(b.page, { type: 'keepLoaded' })).loaded.length, 3, 'and stays loaded');

  // A size the options page refuses, and nothing changes.
  const bad = await h.api(b.page, { type: 'gpuMemory', setting: { mode: 'set', bytes: 500_000_000 } });
  assert.equal(bad.type, 'error');
  assert.equal(bad.error, '0.5 GB of GPU memory is not allowed: give a size from 1 to 512 GB, or Auto');
  assert.deepEqual((await gpuMemory(b.page)).setting, { mode: 'auto' });

  // A new budget ends the stages loaded under the old one.
  const set = await gpuMemory(b.page, { setting: { mode: 'set', bytes: 1 * GB } });
  assert.equal(set.budget, 1 * GB);
  assert.deepEqual((await h.api(b.page, { type: 'keepLoaded' })).loaded, []);
  const other = { ...REQ, prompt: 'a teapot in the rain' };
  const { result } = await h.generateOk(b.page, other);
  const m = result.timings.memory;
  assert.equal(result.timings.budget, 1 * GB);
  assert.deepEqual([m.ahead, m.keep, m.levers.keepBuffers], [false, false, false], JSON.stringify(m));
  assert.equal(m.fits, false, 'the transformer alone needs more than 1 GB');
  // From the stage timings: each stage's worker was created after the one before it had released its
  // session (a worker the browser still lists for a moment after it was ended makes counting them
  // unreliable here).
  const s = byStage(result);
  assert.ok(s.textEncoder.sessionCreateMs > 0, JSON.stringify(s.textEncoder));
  assert.ok(s.transformer.workerCreatedAtMs >= s.textEncoder.finishedAtMs, JSON.stringify(s));
  assert.ok(s.decoder.workerCreatedAtMs >= s.transformer.finishedAtMs, JSON.stringify(s));
  assert.ok(['textEncoder', 'transformer', 'decoder'].every((n) => !s[n].resident), JSON.stringify(s));
  assert.deepEqual(asBytes(result), [['textEncoder', true], ['transformer', true], ['decoder', true]]);
  // The decoder ends when it reports done, just after its image's result: asked until then (10 s).
  let loaded;
  for (const t0 = Date.now(); ; await h.sleep(200)) {
    loaded = (await h.api(b.page, { type: 'keepLoaded' })).loaded;
    if (loaded.length === 0 || Date.now() - t0 > 10_000) break;
  }
  assert.deepEqual(loaded, [], 'nothing stays loaded');

  // Failing where the plan had no room says so, with what fits.
  await h.armFailpoint(b.page, 'stage:create-fails:Transformer');
  const { failed } = await h.generate(b.page, { ...REQ, seed: '22' });
  assert.ok(failed, 'the job failed');
  assert.match(failed.error, /^This image needs about \d+\.\d GB of GPU memory and Imagine may use 1\.0 GB on this GPU, so it failed \(.*\)\. No size fits: /, failed.error);

  // Back to Auto: stages load at once again, and the image is the one the small budget made (the
  // prompt's embeddings come from the cache now, which gives the cold run's image: repeat.test.mjs).
  await gpuMemory(b.page, { setting: { mode: 'auto' } });
  const again = await h.generateOk(b.page, other);
  assert.equal(again.result.timings.memory.ahead, true);
  assert.equal(again.result.png, result.png, 'the plan changes where the graphs load, not the image');
});

test('a GPU that runs out of memory: the image is made again smaller, and else the failure says GPU memory', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  // Nothing stays loaded, so that every try loads its stages afresh.
  await h.api(b.page, { type: 'keepLoaded', seconds: 0 });
  const plain = await h.generateOk(b.page, REQ);
  assert.equal(plain.result.timings.memory.ahead, true);

  /** Makes `request` with the decoder running out of memory at each of its first `times` tries; counts the tries. */
  const outOfMemory = async (request, times) => {
    const arm = () => h.armFailpoint(b.page, 'stage:out-of-memory:Decoder');
    const consumed = async () => !(await h.opfsEntries(b.page)).includes('failpoint');
    await arm();
    let ended = false;
    const job = h.generate(b.page, request).finally(() => { ended = true; });
    let armed = true;
    let tries = 0;
    while (!ended) {
      if (armed && (await consumed())) {
        tries += 1;
        armed = tries < times;
        if (armed) await arm();
      }
      await h.sleep(50);
    }
    if (armed && (await consumed())) tries++;
    await h.opfsRemove(b.page, 'failpoint');
    return { ...(await job), tries };
  };

  // Out of memory with every stage loaded at once, then one stage at a time: made a third time with the
  // decoder in pieces, and the image is the same.
  const twice = await outOfMemory(REQ, 2);
  assert.ok(twice.result, JSON.stringify(twice.failed));
  assert.equal(twice.tries, 2);
  const m = twice.result.timings.memory;
  assert.deepEqual([m.ahead, m.keep, m.levers.keepBuffers], [false, false, false], JSON.stringify(m));
  assert.ok(m.levers.decoderPieceBytes > 0, JSON.stringify(m));
  assert.equal(twice.result.png, plain.result.png);

  // Out of memory every time: a few tries and no more (no retry storm), and the failure says what ran
  // out. The plan that failed before is remembered as too large, so this job had a budget below it.
  const always = await outOfMemory({ ...REQ, seed: '23' }, 10);
  assert.ok(always.failed, 'the job failed');
  assert.ok(always.tries >= 2 && always.tries <= 3, `${always.tries} tries`);
  assert.match(always.failed.error, /^(This image needs about \d+\.\d GB of GPU memory and Imagine may use \d+\.\d GB on this GPU, so it failed|The GPU ran out of memory making this image, also when made again with less: Imagine may use \d+\.\d GB on this GPU now) \(.*Out of memory.*\)\. (Sizes up to|No size fits)/s, always.failed.error);

  // The GPU is still there: the next image is made.
  const after = await h.generateOk(b.page, REQ);
  assert.equal(after.result.png, plain.result.png);
});

test('the probe holds buffers up to its cap and lets them go', { timeout: 300_000 }, async (t) => {
  const b = await h.setup(t, { pack: null });
  const cap = 768 << 20;
  const measured = await gpuMemory(b.page, { measure: true, probeCapBytes: cap });
  // SwiftShader gives what the computer has: the cap is reached, three 256 MiB buffers held.
  assert.deepEqual(measured.probe.found, { kind: 'plenty', bytes: cap }, JSON.stringify(measured));
  assert.equal(measured.budget, null, 'a probe that reached its cap sets no limit');
  assert.ok(measured.probe.adapter.length > 0);
  // Kept for this adapter: asking again does not probe again.
  assert.deepEqual((await gpuMemory(b.page)).probe, measured.probe);
  // Measured again: SwiftShader keeps "GPU" buffers in the GPU process, so its memory shows the probe
  // holding them and letting them go.
  const sampler = startSampler(b.profileDir, 50);
  await h.sleep(1000);
  const before = medianBetween(sampler.history, Date.now() - 1000, Date.now()).gpu;
  const t0 = Date.now();
  const again = await gpuMemory(b.page, { measure: true, probeCapBytes: cap });
  assert.deepEqual(again.probe.found, { kind: 'plenty', bytes: cap });
  const during = peakBetween(sampler.history, t0, Date.now()).peak.gpu;
  await h.sleep(1500);
  const after = medianBetween(sampler.history, Date.now() - 1000, Date.now()).gpu;
  await sampler.stop();
  const MiB = 2 ** 20;
  const mib = (x) => `${Math.round(x / MiB)} MiB`;
  assert.ok(during - before > 0.8 * cap, `the probe held ${mib(during - before)} above ${mib(before)}`);
  assert.ok(after - before < 0.25 * cap, `${mib(after - before)} still held after the probe`);
});

test('the studio, the popup and the options page say which sizes fit this GPU', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  await gpuMemory(b.page, { setting: { mode: 'set', bytes: 1 * GB } });

  const studio = await b.context.newPage();
  await studio.goto(h.extensionUrl(b.extensionId, 'studio.html'));
  await studio.waitForSelector('#size-fit:not([hidden])', { timeout: 10_000 });
  assert.match(await studio.textContent('#size-fit'), /^This size needs about \d+\.\d GB of GPU memory, and Imagine may use 1\.0 GB on this GPU: it will likely fail\. No size fits: /);
  const marks = await studio.$$eval('#presets .chip .fit', (els) => els.map((e) => e.textContent));
  assert.deepEqual(marks, [...Array(4).fill('too big for this GPU'), ''], 'the presets are marked, "custom" not');

  const popup = await b.context.newPage();
  await popup.goto(h.extensionUrl(b.extensionId, 'popup.html'));
  await popup.waitForSelector('#size-fit:not([hidden])', { timeout: 10_000 });

  const options = await b.context.newPage();
  await options.goto(h.extensionUrl(b.extensionId, 'options.html'));
  await options.waitForFunction(() => document.querySelector('#gpu-memory-status').textContent.length > 0);
  assert.equal(await options.textContent('#gpu-memory-status'), 'Imagine plans every image for 1.0 GB of GPU memory.');
  assert.equal(await options.inputValue('#gpu-memory-mode'), 'set');
  assert.equal(await options.inputValue('#gpu-memory-gb'), '1');
  const fits = await options.$$eval('#gpu-memory-fits li', (els) => els.map((e) => e.textContent));
  assert.equal(fits.length, 4);
  assert.match(fits[0], /^512×512: needs about \d+\.\d GB, too big for this GPU$/);

  // A size out of range is marked at its field and nothing is saved.
  await options.fill('#gpu-memory-gb', '0.5');
  await options.click('#save-gpu-memory');
  await options.waitForSelector('#gpu-memory-gb[aria-invalid="true"]');
  assert.equal((await options.textContent('#gpu-memory-gb-error .message')).trim(), 'Give a size from 1 to 512 GB.');
  assert.equal((await gpuMemory(b.page)).budget, 1 * GB);

  // A budget every size fits: no warning, no marks.
  await options.fill('#gpu-memory-gb', '100');
  await options.click('#save-gpu-memory');
  await options.waitForFunction(() => document.querySelector('#gpu-memory-status').textContent.includes('100.0 GB'));
  assert.equal((await gpuMemory(b.page)).budget, 100 * GB);
  await studio.reload();
  await studio.waitForFunction(() => document.querySelectorAll('#presets .chip').length === 5);
  await h.sleep(1000);
  assert.equal(await studio.isHidden('#size-fit'), true);
  assert.deepEqual(await studio.$$eval('#presets .chip .fit', (els) => els.map((e) => e.textContent)), Array(5).fill(''));

  // Back to Auto: the SwiftShader status says why there is no limit.
  await options.selectOption('#gpu-memory-mode', 'auto');
  await options.click('#save-gpu-memory');
  await options.waitForFunction(() => document.querySelector('#gpu-memory-status').textContent.startsWith('This browser does not tell'));
  assert.equal(await options.isHidden('#gpu-memory-size'), true);
});
