// The stage workers run ORT's JSPI build, which reads external data one initializer at a time through
// `ChunkedBlob` (crates/ort/src/chunked_blob.js).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import * as h from './harness.mjs';

/** Generations in one browser: with ORT reading each slice through a BYOB reader, a stage stopped for
 * good within the first 2 to 7 generations in `bench soak` (BENCHMARKS.md, "JSPI"). */
const GENERATIONS = 8;

test('the stage workers import the JSPI build', () => {
  const shim = fs.readFileSync(path.join(h.DIST, 'stage-worker.js'), 'utf8');
  assert.match(shim, /from '\.\/ort\/ort\.jspi\.bundle\.min\.mjs'/);
});

test('ChunkedBlob: a Blob whose slices read back exactly, as plain streams', { timeout: 120_000 }, async (t) => {
  const b = await h.setup(t, { pack: null });
  const snippets = path.join(h.DIST, 'pkg/snippets');
  const [dir] = fs.readdirSync(snippets).filter((d) => d.startsWith('imagine-ort-'));
  const url = `/pkg/snippets/${dir}/src/chunked_blob.js`;
  const checks = await b.page.evaluate(async (url) => {
    const { ChunkedBlob, forOrt } = await import(url);
    // 20 MiB + 3 bytes of a known pattern: slices cross the 8 MiB chunks.
    const bytes = new Uint8Array(20 * 1024 * 1024 + 3).map((_, i) => (i * 7 + (i >> 11)) & 255);
    const root = await navigator.storage.getDirectory();
    const handle = await root.getFileHandle('chunked-blob-test.bin', { create: true });
    const writable = await handle.createWritable();
    await writable.write(bytes);
    await writable.close();
    const file = await handle.getFile();
    const wrapped = forOrt(file);
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
        parts.push(value);
      }
      const out = new Uint8Array(parts.reduce((n, p) => n + p.byteLength, 0));
      parts.reduce((at, p) => (out.set(p, at), at + p.byteLength), 0);
      return { out, byob };
    };
    const same = (a, start) => a.every((v, i) => v === bytes[start + i]);
    const results = [];
    for (const [start, end] of [[0, 1024], [8 * 1024 * 1024 - 5, 16 * 1024 * 1024 + 9], [17920, 17920], [0, bytes.length]]) {
      const { out, byob } = await readAll(wrapped.slice(start, end).stream());
      results.push({ start, end, length: out.length, same: same(out, start), byob });
    }
    await root.removeEntry('chunked-blob-test.bin');
    return {
      isBlob: wrapped instanceof Blob,
      isChunked: wrapped instanceof ChunkedBlob,
      size: wrapped.size,
      expectedSize: bytes.length,
      notBlob: forOrt('https://example.invalid/w.data'),
      results,
    };
  }, url);
  assert.ok(checks.isBlob && checks.isChunked, 'an OPFS File is handed to ORT as a ChunkedBlob, still a Blob');
  assert.equal(checks.size, checks.expectedSize);
  assert.equal(checks.notBlob, 'https://example.invalid/w.data', 'a URL is handed on as it is');
  for (const r of checks.results) {
    assert.equal(r.length, r.end - r.start, `slice ${r.start}..${r.end}: length`);
    assert.ok(r.same, `slice ${r.start}..${r.end}: bytes differ`);
    assert.equal(r.byob, false, `slice ${r.start}..${r.end}: a BYOB reader was offered`);
  }
});

test(`${GENERATIONS} generations in one browser, each through three JSPI stage workers`, { timeout: 900_000 }, async (t) => {
  const b = await h.setup(t);
  for (let i = 0; i < GENERATIONS; i++) {
    // A new prompt each time: the text encoder runs too (no cached embeddings), so three workers each.
    const { result } = await h.generateOk(b.page, { prompt: `a lighthouse at dusk, take ${i}`, width: 256, height: 256, steps: 2, seed: String(i) }, 120_000);
    assert.equal(result.seed, String(i));
  }
});
