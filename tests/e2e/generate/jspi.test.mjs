// The stage workers run ORT's JSPI build, which reads external data one initializer at a time through
// `ChunkedBlob` (crates/ort/src/chunked_blob.js): in chunks, into one reused buffer, paced to the GPU;
// bytes the worker computed go to it as a `PartsBlob`.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

/** Generations in one browser: with ORT reading each slice through a BYOB reader, a stage stopped for
 * good within the first 2 to 7 generations in `bench soak` (BENCHMARKS.md, "JSPI"). */
const GENERATIONS = 8;

/** A browser with no pack, and the URL its pages import `chunked_blob.js` from. */
async function pageWithChunkedBlob(t) {
  const b = await h.setup(t, { pack: null });
  const [dir] = fs.readdirSync(path.join(h.DIST, 'pkg/snippets')).filter((d) => d.startsWith('imagine-ort-'));
  return { b, url: `/pkg/snippets/${dir}/src/chunked_blob.js` };
}

test('the stage workers import the JSPI build', () => {
  const shim = fs.readFileSync(path.join(h.DIST, 'stage-worker.js'), 'utf8');
  assert.match(shim, /from '\.\/ort\/ort\.jspi\.bundle\.min\.mjs'/);
});

test('ChunkedBlob: slices read back exactly, as plain streams, through one reused buffer and one handle', { timeout: 120_000 }, async (t) => {
  const { b, url } = await pageWithChunkedBlob(t);
  const checks = await b.page.evaluate(async (url) => {
    const { ChunkedBlob, PartsBlob, closeFiles, forOrt } = await import(url);
    // 20 MiB + 3 bytes of a known pattern: slices cross the 8 MiB chunks.
    const bytes = new Uint8Array(20 * 1024 * 1024 + 3).map((_, i) => (i * 7 + (i >> 11)) & 255);
    const root = await navigator.storage.getDirectory();
    const handle = await root.getFileHandle('chunked-blob-test.bin', { create: true });
    const writable = await handle.createWritable();
    await writable.write(bytes);
    await writable.close();
    const file = await handle.getFile();
    // Sync access handles exist only in dedicated workers (where the stage workers read through them);
    // here the same reads go through a stand-in over `bytes` that records what it is asked.
    const access = { opened: 0, closed: 0, modes: new Set(), buffers: new Set() };
    const standIn = {
      async createSyncAccessHandle(options) {
        access.opened++;
        access.modes.add(options?.mode);
        return {
          read(view, { at }) {
            access.buffers.add(view.buffer);
            const n = Math.max(0, Math.min(view.byteLength, bytes.length - at));
            view.set(bytes.subarray(at, at + n));
            return n;
          },
          close() {
            access.closed++;
          },
        };
      },
    };
    const readAll = async (stream) => {
      let byob = true;
      try {
        stream.getReader({ mode: 'byob' }).releaseLock();
      } catch {
        byob = false;
      }
      const reader = stream.getReader();
      const parts = [];
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        parts.push(value.slice()); // as ORT does: each chunk is copied before the next read
      }
      const out = new Uint8Array(parts.reduce((n, p) => n + p.byteLength, 0));
      parts.reduce((at, p) => (out.set(p, at), at + p.byteLength), 0);
      return { out, byob };
    };
    const same = (a, start) => a.every((v, i) => v === bytes[start + i]);
    const results = [];
    // The same bytes computed in memory, in parts of uneven lengths (one empty).
    const cuts = [0, 5, 5, 8 * 1024 * 1024 + 1, 9 * 1024 * 1024, bytes.length];
    const parts = cuts.slice(1).map((end, i) => bytes.slice(cuts[i], end));
    const wrapped = {
      file: await forOrt(file),
      handle: await forOrt(handle), // no sync access handle on a page: read with arrayBuffer()
      'sync access handle': new ChunkedBlob(file, standIn),
      parts: await forOrt(parts),
    };
    for (const [how, blob] of Object.entries(wrapped)) {
      const slices = [[0, 1024], [8 * 1024 * 1024 - 5, 16 * 1024 * 1024 + 9], [17920, 17920], [0, bytes.length]]
        .map(([start, end]) => [start, end, blob.slice(start, end)]);
      // A slice of a slice (ORT never takes one, Blob allows it): the offsets add up.
      slices.push([1000, 3000, blob.slice(500, 9000).slice(500, 2500)]);
      for (const [start, end, slice] of slices) {
        const { out, byob } = await readAll(slice.stream());
        results.push({ how, start, end, length: out.length, same: same(out, start), byob });
      }
    }
    const partsBuffers = new Set(parts.map((p) => p.buffer));
    const partsRead = await readAll(wrapped.parts.slice(7, 9 * 1024 * 1024 + 2).stream());
    const views = [];
    const viewReader = wrapped.parts.slice(3, 17 << 20).stream().getReader();
    for (let r; !(r = await viewReader.read()).done; ) views.push(r.value);
    const zeroCopy = views.every((v) => partsBuffers.has(v.buffer) && v.byteLength <= 8 << 20);
    const openBeforeClose = access.closed;
    await closeFiles();
    // A file shorter than its Blob says fails the read with a message; its handle is closed with the rest.
    const short = {
      createSyncAccessHandle: async () => (access.opened++, { read: () => 0, close: () => access.closed++ }),
    };
    let shortError = '';
    try {
      await readAll(new ChunkedBlob(file, short).slice(0, 10).stream());
    } catch (e) {
      shortError = String(e);
    }
    await closeFiles();
    await root.removeEntry('chunked-blob-test.bin');
    return {
      isBlob: ['file', 'handle', 'sync access handle'].every((how) => wrapped[how] instanceof Blob && wrapped[how] instanceof ChunkedBlob),
      size: wrapped.handle.size,
      expectedSize: bytes.length,
      notBlob: await forOrt('https://example.invalid/w.data'),
      results,
      access: { opened: access.opened, closed: access.closed, modes: [...access.modes], buffers: access.buffers.size },
      openBeforeClose,
      parts: { isBlob: wrapped.parts instanceof Blob && wrapped.parts instanceof PartsBlob, size: wrapped.parts.size, same: same(partsRead.out, 7), length: partsRead.out.length, zeroCopy, views: views.length },
      shortError,
    };
  }, url);
  assert.ok(checks.isBlob, 'OPFS files and file handles are handed to ORT as ChunkedBlobs, still Blobs');
  // Parts in memory: a Blob whose slices stream views of the parts themselves, in chunks of 8 MiB at most.
  assert.deepEqual(checks.parts, { isBlob: true, size: checks.expectedSize, same: true, length: 9 * 1024 * 1024 - 5, zeroCopy: true, views: 4 });
  assert.equal(checks.size, checks.expectedSize);
  assert.equal(checks.notBlob, 'https://example.invalid/w.data', 'a URL is handed on as it is');
  for (const r of checks.results) {
    const what = `${r.how}, slice ${r.start}..${r.end}`;
    assert.equal(r.length, r.end - r.start, `${what}: length`);
    assert.ok(r.same, `${what}: bytes differ`);
    assert.equal(r.byob, false, `${what}: a BYOB reader was offered`);
  }
  // One read-only handle for every slice of the file, open until closeFiles() (the short file's one
  // more), and every chunk read into the same buffer.
  assert.equal(checks.openBeforeClose, 0);
  assert.deepEqual(checks.access, { opened: 2, closed: 2, modes: ['read-only'], buffers: 1 });
  assert.match(checks.shortError, /the file ended 0 bytes in, 10 bytes early/);
});

test('ChunkedBlob: every 32 MiB read marks the GPU queue, and the next slice waits for the mark before', { timeout: 120_000 }, async (t) => {
  const { b, url } = await pageWithChunkedBlob(t);
  const seen = await b.page.evaluate(async (url) => {
    const { forOrt } = await import(url);
    const blob = await forOrt(new Blob([new Uint8Array(10 << 20)]));
    // Opened after forOrt, as ORT opens its device: that device's queue is the one paced to. Its marks
    // settle only when the test says.
    const device = await (await navigator.gpu.requestAdapter()).requestDevice();
    const marks = [];
    device.queue.onSubmittedWorkDone = () => new Promise((resolve) => marks.push({ at: read, resolve }));
    let read = 0;
    const readSlice = async () => {
      const reader = blob.slice(0, 10 << 20).stream().getReader();
      while (!(await reader.read()).done);
      read += 10;
    };
    for (let i = 0; i < 8; i++) await readSlice(); // the 5th marks the queue at 40 MiB, waiting for nothing
    const ninth = readSlice(); // marks at 80 MiB and waits for the mark at 40
    const settled = await Promise.race([ninth.then(() => true), new Promise((r) => setTimeout(() => r(false), 500))]);
    const marksBefore = marks.map((m) => m.at);
    marks[0].resolve();
    await ninth;
    return { marksBefore, settledBeforeFirstMark: settled, read };
  }, url);
  // 10 MiB slices: the 5th starts after 40 MiB, the 9th after 80.
  assert.deepEqual(seen, { marksBefore: [40, 80], settledBeforeFirstMark: false, read: 90 });
});

test(`${GENERATIONS} generations in one browser, each through three JSPI stage workers`, { timeout: 900_000 }, async (t) => {
  const b = await h.setup(t);
  for (let i = 0; i < GENERATIONS; i++) {
    // A new prompt each time: the text encoder runs too (no cached embeddings), so three workers each.
    const { result } = await h.generateOk(b.page, { prompt: `a lighthouse at dusk, take ${i}`, width: 256, height: 256, steps: 2, seed: String(i) }, 120_000);
    assert.equal(result.seed, String(i));
  }
});
