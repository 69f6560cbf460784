// A transformer streamed in pieces passes values from one piece's session to the next through the CPU
// (ORT closes its device with its last session). `readBack` (crates/ort/src/gpu.js) reads an output
// ORT left on the GPU into an array of the chain's own, reused on every step, where ORT's own read back
// makes a new array every time: the renderer held those as garbage (BENCHMARKS.md, "The streamed
// transformer's values read back into reused arrays"); and through one staging buffer, a chunk at a
// time, where one staging buffer the size of each value left Chromium's mapped memory holding them all.
// `upload` gives the next piece such a value the same way, where ORT's own upload maps a staging buffer
// the size of the value.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

// `y = Add(x, x)` over float `[n]`, opset 17, as onnx.helper writes it (checked by onnx.checker).
const TWICE = 'CAg6OwoOCgF4CgF4EgF5IgNBZGQSBXR3aWNlWhAKAXgSCwoJCAESBQoDEgFuYhAKAXkSCwoJCAESBQoDEgFuQgQKABAR';

/**
 * A browser whose page has ORT (`ort`), a session of TWICE (`session`, its outputs left on the GPU with
 * `gpuOutputs`), and the staging buffers then made on ORT's device for `mode` (`READ` or `WRITE`), with
 * how many times each is mapped (`staging`); and the URL of gpu.js to import there.
 */
async function pageWithTwice(t, { gpuOutputs, mode }) {
  const b = await h.setup(t, { pack: null });
  const [dir] = fs.readdirSync(path.join(h.DIST, 'pkg/snippets')).filter((d) => d.startsWith('imagine-ort-'));
  await b.page.evaluate(async ({ model, gpuOutputs, mode }) => {
    globalThis.ort = await import('/ort/ort.jspi.bundle.min.mjs');
    const bytes = Uint8Array.from(atob(model), (c) => c.charCodeAt(0));
    const where = gpuOutputs ? { preferredOutputLocation: 'gpu-buffer' } : {};
    globalThis.session = await ort.InferenceSession.create(bytes, { executionProviders: ['webgpu'], ...where });
    const device = await ort.env.webgpu.device;
    globalThis.staging = [];
    const createBuffer = device.createBuffer.bind(device);
    device.createBuffer = (descriptor) => {
      const buffer = createBuffer(descriptor);
      if (descriptor.usage & GPUBufferUsage[`MAP_${mode}`]) {
        const made = { size: descriptor.size, maps: 0 };
        staging.push(made);
        const mapAsync = buffer.mapAsync.bind(buffer);
        buffer.mapAsync = (...args) => ((made.maps += 1), mapAsync(...args));
      }
      return buffer;
    };
  }, { model: TWICE, gpuOutputs, mode });
  return { page: b.page, gpuJs: `/pkg/snippets/${dir}/src/gpu.js` };
}

test('readBack: an output left on the GPU read back exactly, into the array it is given while large enough, through one staging buffer a chunk at a time', { timeout: 120_000 }, async (t) => {
  const { page, gpuJs } = await pageWithTwice(t, { gpuOutputs: true, mode: 'READ' });
  const seen = await page.evaluate(async (gpuJs) => {
    const { readBack } = await import(gpuJs);
    const maps = () => staging.reduce((n, s) => n + s.maps, 0);
    const twice = async (values, reuse, chunk) => {
      const { y } = await session.run({ x: new ort.Tensor('float32', Float32Array.from(values), [values.length]) });
      const location = y.location;
      const mapsBefore = maps();
      const read = await readBack(y, reuse, chunk);
      let disposed = false;
      try {
        y.data;
      } catch {
        disposed = true;
      }
      // Copied now: the next read back into the same array overwrites it.
      return { location, read, disposed, values: Array.from(read.data), maps: maps() - mapsBefore };
    };
    // 5 floats: 20 bytes, not a whole multiple of ORT's 16.
    const first = await twice([1, 2, 3, 4, 5.5]);
    const again = await twice([-1, 0, 0.25, 1e6, 7], first.read.data.buffer);
    const larger = await twice(Array.from({ length: 40 }, (_, i) => i), first.read.data.buffer);
    // In chunks: 160 bytes 32 at a time; 164 bytes (176 on the GPU) 48 at a time, the last chunk partly
    // past the value; 20 bytes (32) 16 at a time.
    const chunked = await twice(Array.from({ length: 40 }, (_, i) => -i), undefined, 32);
    const uneven = await twice(Array.from({ length: 41 }, (_, i) => i / 4), undefined, 48);
    const small = await twice([9, 8, 7, 6, 5], undefined, 16);
    await session.release();
    const out = ({ location, read, disposed, values }) => ({ location, disposed, onCpu: read.location, dims: read.dims, values });
    return {
      first: out(first),
      again: out(again),
      larger: out(larger),
      reused: again.read.data.buffer === first.read.data.buffer,
      replaced: larger.read.data.buffer !== first.read.data.buffer,
      chunked: out(chunked), uneven: out(uneven), small: out(small),
      maps: [first, again, larger, chunked, uneven, small].map((r) => r.maps),
      staging: staging.map((s) => s.size),
    };
  }, gpuJs);
  assert.deepEqual(seen.first, { location: 'gpu-buffer', disposed: true, onCpu: 'cpu', dims: [5], values: [2, 4, 6, 8, 11] });
  assert.deepEqual(seen.again.values, [-2, 0, 0.5, 2e6, 14]);
  assert.ok(seen.reused, 'the second read back made a new array rather than filling the one it was given');
  assert.deepEqual(seen.larger.values, Array.from({ length: 40 }, (_, i) => 2 * i));
  assert.ok(seen.replaced, 'an array too small for the value was used anyway');
  assert.deepEqual(seen.chunked.values, Array.from({ length: 40 }, (_, i) => -2 * i));
  assert.deepEqual(seen.uneven.values, Array.from({ length: 41 }, (_, i) => i / 2));
  assert.deepEqual(seen.small.values, [18, 16, 14, 12, 10]);
  assert.deepEqual(seen.maps, [1, 1, 1, 5, 4, 2], 'mapped once per chunk');
  // One staging buffer, made again only when a value outgrew it (32 bytes, then 160), not one a value.
  assert.deepEqual(seen.staging, [32, 160]);
});

test('upload: a CPU value larger than the chunk copied to the GPU exactly, through one staging buffer a chunk at a time, as a GPU tensor ORT reads and whose buffer goes when it is disposed', { timeout: 120_000 }, async (t) => {
  const { page, gpuJs } = await pageWithTwice(t, { gpuOutputs: false, mode: 'WRITE' });
  const seen = await page.evaluate(async (gpuJs) => {
    const { upload } = await import(gpuJs);
    const maps = () => staging.reduce((n, s) => n + s.maps, 0);
    const twice = async (floats, chunk) => {
      const mapsBefore = maps();
      const cpu = new ort.Tensor('float32', Float32Array.from(floats), [floats.length]);
      const x = await upload(cpu, chunk);
      const { location } = x;
      // The value's own GPU buffer, and whether disposing the tensor destroys it.
      const buffer = location === 'gpu-buffer' ? { size: x.gpuBuffer.size, destroyed: false } : null;
      if (buffer) {
        const destroy = x.gpuBuffer.destroy.bind(x.gpuBuffer);
        x.gpuBuffer.destroy = () => ((buffer.destroyed = true), destroy());
      }
      const { y } = await session.run({ x });
      const result = { location, same: x === cpu, dims: x.dims, values: Array.from(y.data), maps: maps() - mapsBefore };
      x.dispose();
      return { ...result, buffer };
    };
    // 160 bytes 48 at a time, the last chunk 16; 164 bytes (176 on the GPU) 48 at a time, the last
    // chunk partly past the value; 160 bytes 128 at a time; 20 bytes, no more than one chunk of 32.
    const chunked = await twice(Array.from({ length: 40 }, (_, i) => i - 7.5), 48);
    const uneven = await twice(Array.from({ length: 41 }, (_, i) => i / 4), 48);
    const whole = await twice(Array.from({ length: 40 }, (_, i) => -i), 128);
    const small = await twice([9, 8, 7, 6, 5], 32);
    await session.release();
    return { chunked, uneven, whole, small, staging: staging.map((s) => s.size) };
  }, gpuJs);
  const expect = (location, floats, maps, buffer) => ({ location, same: location === 'cpu', dims: [floats.length], values: floats.map((v) => 2 * v), maps, buffer });
  assert.deepEqual(seen.chunked, expect('gpu-buffer', Array.from({ length: 40 }, (_, i) => i - 7.5), 4, { size: 160, destroyed: true }));
  assert.deepEqual(seen.uneven, expect('gpu-buffer', Array.from({ length: 41 }, (_, i) => i / 4), 4, { size: 176, destroyed: true }));
  assert.deepEqual(seen.whole, expect('gpu-buffer', Array.from({ length: 40 }, (_, i) => -i), 2, { size: 160, destroyed: true }));
  assert.deepEqual(seen.small, expect('cpu', [9, 8, 7, 6, 5], 0, null), 'a value of one chunk or less is left to ORT');
  // One staging buffer, made again only when a chunk outgrew it (48 bytes, then 128), not one a value;
  // the last is ORT's own upload of the small value, a staging buffer of the value's size (20 bytes).
  assert.deepEqual(seen.staging, [48, 128, 20]);
});
