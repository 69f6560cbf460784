// The glue checked against upstream: the tiny real-architecture pack exported without quantization
// (tiny-packs.mjs, `quantize: false`), installed and run by the extension on WebGPU with float32
// activations, and diffusers' `Flux2KleinPipeline.__call__` run on the torch modules that pack was
// exported from, with the extension's initial noise as `latents` (tests/reference/diffusers_pipeline.py).
// The traced token ids, attention mask, sigmas, noise, position ids (img_ids, txt_ids) and prompt
// embeddings as fed, and the first velocity must match, and the image within 2 levels; and the same
// comparison fails when one thing changes on diffusers' side (another seed's noise, one more step, the
// schedule's mu, the text taps, the text positions).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';
import { PYTHON, tinyPack } from '../lib/tiny-packs.mjs';

const ITEMS = ['inputIds', 'attentionMask', 'sigmas', 'noise', 'imgIds', 'txtIds', 'promptEmbeds', 'firstVelocity', 'image'];

/**
 * diffusers_pipeline.py on the pack and the extension's result, once per run of `runs` ([name, args]:
 * `args` change diffusers' side), all in one Python process; each run's report.
 */
async function diffusers(dir, files, runs) {
  const outs = runs.map(([name]) => path.join(h.OUT, `diffusers-${name}`));
  for (const out of outs) fs.rmSync(out, { recursive: true, force: true });
  const argv = runs.flatMap(([, args], i) => [...(i ? ['--then'] : []), '--pack', dir, '--trace', files.json, '--png', files.png, '--out', outs[i], ...args]);
  const r = await h.run(PYTHON, ['tests/reference/diffusers_pipeline.py', ...argv]);
  assert.ok(r.code === 0 || r.code === 1, `diffusers_pipeline.py failed (${r.code}):\n${r.stdout}\n${r.stderr}`);
  const reports = outs.map((out) => JSON.parse(fs.readFileSync(path.join(out, 'report.json'), 'utf8')));
  assert.equal(r.code, reports.every((report) => report.ok) ? 0 : 1);
  for (const report of reports) assert.deepEqual(Object.keys(report.items), ITEMS);
  return { reports, stdout: r.stdout };
}

/** The items that differ in a report. */
const differing = (report) => ITEMS.filter((k) => !report.items[k].ok);

test('the extension matches diffusers\' Flux2KleinPipeline on an unquantized tiny pack, and a change on diffusers\' side fails', { timeout: 900_000 }, async (t) => {
  const dir = await tinyPack('float32', { quantize: false });
  const repo = 'tiny/float32-unquantized';
  const b = await h.setup(t, { pack: null, install: false, hubOptions: { repos: { [repo]: { dir } } } });
  await h.installPack(b.page, b.hub, repo);
  const req = { prompt: 'a red fox in the snow', width: 256, height: 256, steps: 2, seed: '42', trace: true };
  const { result } = await h.generateOk(b.page, req, 600_000);
  assert.deepEqual(result.timings.stages.map((s) => s.graphFile), ['text_encoder_q4.onnx', 'transformer_q8.onnx', 'vae_decoder.onnx']);
  const files = h.writeResult('diffusers', result);

  // The same inputs, then one change on diffusers' side each, for which the comparison must fail in the
  // items the change touches; all in one Python process.
  const negatives = [
    ['noise-seed', ['--noise-seed', '43'], ['noise', 'firstVelocity', 'image']],
    ['extra-step', ['--extra-steps', '1'], ['sigmas', 'image']],
    ['mu', ['--mu-delta', '0.1'], ['sigmas', 'image']],
    // The tiny model's image hardly depends on the text (1 level here): the traced embeddings and first
    // velocity are what catch the taps.
    ['text-taps', ['--text-taps', '0,1,2'], ['promptEmbeds', 'firstVelocity']],
    // A text-position off-by-one, caught by comparing the position ids as fed.
    ['text-position', ['--text-position-offset', '1'], ['txtIds']],
  ];
  const { reports: [same, ...changed], stdout } = await diffusers(dir, files, [['same', []], ...negatives]);
  console.log(stdout.trim());
  assert.deepEqual(differing(same), [], stdout);
  const compared = await h.run('python3', ['tests/reference/compare.py', files.png, path.join(h.OUT, 'diffusers-same', 'diffusers.png'), '--tol', '2']);
  assert.equal(compared.code, 0, `compare.py: ${compared.stdout}${compared.stderr}`);
  console.log(`against diffusers' image: ${compared.stdout.trim()}`);

  negatives.forEach(([name, , expected], i) => {
    const report = changed[i];
    console.log(`${name}: differs in ${differing(report).join(', ')}`);
    assert.equal(report.ok, false, `${name}: the comparison did not fail:\n${stdout}`);
    for (const item of expected) assert.ok(!report.items[item].ok, `${name}: ${item} did not differ:\n${stdout}`);
  });
});
