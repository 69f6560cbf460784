// Packs of the real architectures (tiny-packs.mjs) installed through the extension and run by it: on
// WebGPU with float32 activations, on the wasm backend with float16 ones, each compared with the
// independent Python reference on the same graphs (ORT on the CPU). On WebGPU the graphs re-blocked to
// 32 at install are what the stages load, and a pack installed without them (by an older version)
// makes the same image by re-blocking while it loads, then stores the form it re-blocked. The decoder cut
// into a chain of pieces, the transformer's projections computed per part and the transformer streamed
// in pieces of its weights make the whole graphs' image.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';
import { tinyPack, TOLERANCE } from '../lib/tiny-packs.mjs';

const B32 = { text_encoder_q4: 'text_encoder_q4.b32.onnx', transformer_q8: 'transformer_q8.b32.onnx' };

/** Each stage's graph file in a result's timings, by stage. */
function graphFiles(result) {
  return Object.fromEntries(result.timings.stages.map((s) => [s.stage, s.graphFile]));
}

for (const [activations, backend] of [['float32', undefined], ['float16', 'wasm']]) {
  test(`a tiny real-architecture ${activations} pack installs and matches the reference`, { timeout: 900_000 }, async (t) => {
    const dir = await tinyPack(activations);
    const repo = `tiny/${activations}`;
    const b = await h.setup(t, { pack: null, install: false, hubOptions: { repos: { [repo]: { dir } } } });
    if (backend === 'wasm') {
      await h.installPack(b.page, b.hub, repo, { backend });
    } else {
      // Stopped once the first graph's re-blocked form is stored, then paused and resumed: nothing is
      // installed until every stored form is made again and checked.
      await h.armFailpoint(b.page, 'block32:graph-done');
      assert.equal((await h.startInstall(b.page, b.hub, repo)).type, 'installStarted');
      await h.waitForFailpoint(b.page);
      assert.equal((await h.packState(b.page))?.installed ?? null, null);
      assert.equal((await h.api(b.page, { type: 'pausePack' })).type, 'done');
      await h.waitForDownload(b.page, (s) => s.download?.state === 'paused', 10_000);
      assert.equal((await h.resumePack(b.page)).type, 'installStarted');
      await h.waitForInstall(b.page);
    }
    const installed = (await h.packState(b.page)).installed;
    if (backend === 'wasm') {
      assert.equal(installed.block32, undefined, 'the wasm backend needs no graph re-blocked');
    } else {
      // Stored beside the pack, each file whole: the text encoder's and the transformer's MatMulNBits
      // (block 128 as exported); the decoder has none.
      assert.deepEqual(installed.block32.graphs.map((g) => g.onnx), Object.values(B32));
      assert.deepEqual(installed.block32.unchanged, ['vae_decoder.onnx']);
      const tree = await h.opfsTree(b.page);
      const pack = await h.installedDir(b.page);
      for (const g of installed.block32.graphs) {
        assert.equal(tree[`${pack}/${g.onnx}`] + tree[`${pack}/${g.data}`], g.bytes, JSON.stringify(g));
      }
      // Sessions made afresh for each image, so that the second one loads its graphs again.
      await h.api(b.page, { type: 'keepLoaded', seconds: 0 });
    }
    const req = { prompt: 'a red fox in the snow', width: 256, height: 256, steps: 2, seed: '42', trace: true };
    if (backend) req.backend = backend;
    const { result } = await h.generateOk(b.page, req, 600_000);
    const files = h.writeResult(`real-arch-${activations}`, result);
    await h.compareWithReference({ packDir: dir, traceJson: files.json, png: files.png, tol: TOLERANCE[activations], name: `real-arch-${activations}` });
    if (backend === 'wasm') return;
    assert.deepEqual(graphFiles(result), { textEncoder: B32.text_encoder_q4, transformer: B32.transformer_q8, decoder: 'vae_decoder.onnx' });

    // The decoder cut into a chain of pieces, the transformer's wide projections computed per part, its
    // token-wise chains in chunks of tokens, and the transformer streamed in 2 pieces of its weights
    // (one session at a time, made again on every step), one stage loaded at a time, as the memory plan
    // cuts them for a small GPU, and the heavy weights in parts of their rows (the Gemms' in every plan,
    // the MatMulNBits' where stages load one at a time; over 16 MiB), make the whole graphs' image,
    // within the tolerance (the prompt's embeddings are cached now). 20 MB cuts the tiny decoder's 110
    // MB at 256x256 into 7 pieces; 64 KiB cuts 5 of the tiny transformer's 6 Gemms and its context
    // embedder's MatMulNBits (960 kB, into 15 parts). (16 KiB cut 28 MatMulNBits, most of them copies in
    // the chains' chunks: each step of this image took 55-58 s on SwiftShader, and once in CI more than
    // the stall limit the first image had set.)
    const cut = { decoderPieceBytes: 20_000_000, projectionsPerPart: true, tokenChunks: 3, transformerPieces: 2, weightPartBytes: 65_536, loadAhead: false };
    // Its transformer makes both pieces' sessions again on every step (49 s a step beside two other
    // files here), which the stall limit learned from the first image (5x its longest quiet) does not
    // expect: this test is not about stalls.
    await h.opfsWrite(b.page, 'stall-limit-ms', '600000');
    const split = await h.generateOk(b.page, { ...req, ...cut }, 600_000);
    const stage = (r, name) => r.timings.stages.find((s) => s.stage === name);
    const pieces = stage(split.result, 'decoder').pieces;
    assert.ok(pieces >= 3, `the decoder ran as ${pieces} pieces`);
    assert.equal(stage(result, 'decoder').pieces, 1);
    // The double-stream block's two gated MLPs and the single-stream block's fused projection.
    assert.equal(stage(split.result, 'transformer').partedProjections, 3);
    assert.equal(stage(result, 'transformer').partedProjections, undefined);
    // The double-stream block's two MLPs and the single-stream block's MLP with its second projection.
    assert.equal(stage(split.result, 'transformer').chunkedChains, 3);
    assert.equal(stage(split.result, 'transformer').pieces, 2);
    assert.equal(stage(split.result, 'transformer').partedGemms, 5);
    assert.equal(stage(result, 'transformer').partedGemms, undefined, 'the tiny weights are under the default 16 MiB');
    // The context embedder (tools/export/tests/test_weight_parts.py cuts every chain's copies too).
    assert.equal(stage(split.result, 'transformer').partedMatmuls, 1);
    // What the second piece is given, larger than 64 KiB, copied to the GPU by us a chunk at a time
    // (crates/ort/src/gpu.js, `upload`): 4 values a step.
    assert.equal(stage(split.result, 'transformer').uploadedValues, 8);
    assert.equal(stage(result, 'transformer').pieces, 1);
    const splitFiles = h.writeResult(`real-arch-${activations}-split`, split.result);
    const compared = await h.run('python3', ['tests/reference/compare.py', files.png, splitFiles.png, '--tol', String(TOLERANCE[activations])]);
    assert.equal(compared.code, 0, `the split decoder's image differs from the whole one's: ${compared.stdout}${compared.stderr}`);
    console.log(`decoder in ${pieces} pieces, projections per part, chains in 3 chunks of tokens, transformer streamed in 2, weights in parts, against whole: ${compared.stdout.trim()}`);

    // The same pack as an older version installed it, without the stored forms: the transformer is
    // re-blocked while it loads (the prompt's embeddings are cached), and the image is the same.
    const state = await h.packState(b.page);
    const pack = await h.installedDir(b.page);
    const hashes = async () => Promise.all(state.installed.block32.graphs.flatMap((g) => [g.onnx, g.data]).map((f) => h.opfsSha256(b.page, `${pack}/${f}`)));
    const stored = { record: state.installed.block32, hashes: await hashes() };
    delete state.installed.block32;
    await h.opfsWrite(b.page, 'packs/state.json', JSON.stringify(state));
    const again = await h.generateOk(b.page, req, 600_000);
    assert.deepEqual(graphFiles(again.result), { textEncoder: '', transformer: 'transformer_q8.onnx', decoder: 'vae_decoder.onnx' });
    assert.ok(h.pngBytes(again.result).equals(h.pngBytes(result)), 'the image re-blocked at load differs from the stored form\'s');
    // After that job the extension stores the transformer's form with the pack by itself, as at install.
    let record;
    for (const until = Date.now() + 120_000; !(record = (await h.packState(b.page)).installed.block32) && Date.now() < until;) await h.sleep(500);
    assert.deepEqual(record, { graphs: stored.record.graphs.filter((g) => g.graph === 'transformer_q8.onnx'), unchanged: [] });
    const [transformer] = record.graphs;
    const made = await Promise.all([transformer.onnx, transformer.data].map((f) => h.opfsSha256(b.page, `${pack}/${f}`)));
    assert.deepEqual(made, stored.hashes.slice(2), 'the form stored after the job differs from the one stored at install');
  });
}
