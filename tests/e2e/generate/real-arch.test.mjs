// Packs of the real architectures (tiny-packs.mjs) installed through the extension and run by it: on
// WebGPU with float32 activations, on the wasm backend with float16 ones, each compared with the
// independent Python reference on the same graphs (ORT on the CPU).
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';
import { tinyPack, TOLERANCE } from '../lib/tiny-packs.mjs';

for (const [activations, backend] of [['float32', undefined], ['float16', 'wasm']]) {
  test(`a tiny real-architecture ${activations} pack installs and matches the reference`, { timeout: 900_000 }, async (t) => {
    const dir = await tinyPack(activations);
    const repo = `tiny/${activations}`;
    const b = await h.setup(t, { pack: null, install: false, hubOptions: { repos: { [repo]: { dir } } } });
    await h.installPack(b.page, b.hub, repo, { backend });
    const req = { prompt: 'a red fox in the snow', width: 256, height: 256, steps: 2, seed: '42', trace: true };
    if (backend) req.backend = backend;
    const { result } = await h.generateOk(b.page, req, 600_000);
    const files = h.writeResult(`real-arch-${activations}`, result);
    await h.compareWithReference({ packDir: dir, traceJson: files.json, png: files.png, tol: TOLERANCE[activations], name: `real-arch-${activations}` });
  });
}
