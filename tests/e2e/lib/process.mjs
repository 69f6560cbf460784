// Processes and the rest: commands, the reference comparison, PNG text chunks, tables, sleeping.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { DIST, OUT, ROOT } from './config.mjs';

/** Runs a command; resolves { code, stdout, stderr }. */
export function run(cmd, args, { cwd = ROOT, timeoutMs = 600_000, env = process.env } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/**
 * Recomputes the image with the Python reference and compares it with `png` (a path):
 * reference.py --pack DIR --trace T.json --out REF.png, then compare.py OUT REF --tol TOL.
 * Returns the compare output; throws with both outputs if either fails.
 */
export async function compareWithReference({ packDir, traceJson, png, tol, name }) {
  const ref = path.join(OUT, `${name}.ref.png`);
  const r1 = await run('python3', ['tests/reference/reference.py', '--pack', packDir, '--trace', traceJson, '--out', ref]);
  if (r1.code !== 0) throw new Error(`reference.py failed (${r1.code}):\n${r1.stdout}\n${r1.stderr}`);
  const r2 = await run('python3', ['tests/reference/compare.py', png, ref, '--tol', String(tol)]);
  if (r2.code !== 0) throw new Error(`compare.py ${png} ${ref} --tol ${tol} failed (${r2.code}):\n${r2.stdout}\n${r2.stderr}`);
  return r2.stdout;
}

/** The tEXt/zTXt/iTXt chunks of a PNG: [{ type, keyword, text }] (zTXt text is left compressed). */
export function pngTextChunks(buf) {
  const sig = Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]);
  if (!buf.subarray(0, 8).equals(sig)) throw new Error('not a PNG');
  const chunks = [];
  let off = 8;
  while (off + 8 <= buf.length) {
    const len = buf.readUInt32BE(off);
    const type = buf.toString('latin1', off + 4, off + 8);
    const data = buf.subarray(off + 8, off + 8 + len);
    if (type === 'tEXt' || type === 'iTXt' || type === 'zTXt') {
      const nul = data.indexOf(0);
      const keyword = data.toString('latin1', 0, nul);
      let text = '';
      if (type === 'tEXt') text = data.toString('latin1', nul + 1);
      if (type === 'iTXt') {
        // keyword\0 flag method lang\0 translated\0 text
        const flag = data[nul + 1];
        let p = nul + 3;
        p = data.indexOf(0, p) + 1;
        p = data.indexOf(0, p) + 1;
        text = flag === 0 ? data.toString('utf8', p) : '';
      }
      chunks.push({ type, keyword, text });
    }
    if (type === 'IEND') break;
    off += 12 + len;
  }
  return chunks;
}

export function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}


/** Prints `rows` under the headings `cols` as aligned columns (the benches' reports). */
export function printTable(cols, rows) {
  const widths = cols.map((c, i) => Math.max(c.length, ...rows.map((r) => String(r[i]).length)));
  const line = (cells) => cells.map((c, i) => (i === 0 ? String(c).padEnd(widths[i]) : String(c).padStart(widths[i]))).join('  ');
  console.log(line(cols));
  console.log(widths.map((w) => '-'.repeat(w)).join('  '));
  for (const r of rows) console.log(line(r));
}

/**
 * A loopback server for the ONNX Runtime benchmarks (bench/blocks.mjs, bench/layout.mjs): `/` is `page`,
 * `/worker.mjs` is `worker`, `/ort/NAME` the extension's ORT file NAME, any other `/NAME` the file NAME
 * in `dir`, streamed (weights can be gigabytes). Listening when it resolves.
 */
export async function serveOrtBench({ page, worker, dir }) {
  const types = { '.mjs': 'text/javascript', '.wasm': 'application/wasm' };
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://localhost');
    const send = (body, type) => res.writeHead(200, { 'content-type': type }).end(body);
    if (url.pathname === '/') return send(page, 'text/html');
    if (url.pathname === '/worker.mjs') return send(worker, 'text/javascript');
    const file = url.pathname.startsWith('/ort/')
      ? path.join(DIST, 'ort', path.basename(url.pathname))
      : path.join(dir, path.basename(url.pathname));
    if (!fs.existsSync(file)) return res.writeHead(404).end();
    res.writeHead(200, { 'content-type': types[path.extname(file)] ?? 'application/octet-stream', 'content-length': fs.statSync(file).size });
    fs.createReadStream(file).pipe(res);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return server;
}
