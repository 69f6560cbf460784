// A local stand-in for the Hugging Face Hub, for the download tests and benchmarks.
//
// Two HTTP servers on 127.0.0.1, i.e. two origins, the way the Hub works:
//   HUB  /api/models/{owner}/{name}/revision/{rev}        -> { id, sha, siblings }
//        /api/models/{owner}/{name}/tree/{rev}?recursive=true -> [{ type, oid, size, path, lfs? }]
//                                                              (in pages when setTreePageSize is set)
//        /{owner}/{name}/resolve/{rev}/{path}             -> LFS: 302 to CDN/blobs/<sha256>, else 200
//   CDN  /blobs/<sha256>                                    -> the bytes, with Range, ETag
//
// Repos are directories (the fixture packs) plus extra files that are not part of the pack (README.md,
// samples/cat.png) that the extension must never fetch. A file can be padded with deterministic filler
// up to a size (ORT reads only the byte ranges the graph records, so a padded pack still generates),
// and a file can be entirely generated: filler bytes are computed from the offset, never held in
// memory, so a 2 GB pack costs nothing but one SHA-256 pass at startup.
//
// Every repo keeps its history: `setRepo` makes a new commit and moves `main`; older commits still
// resolve. Faults are injected per pack-relative path (see `inject`), and every byte of body written
// to a socket is counted per path (see `stats`).
//
//   import { startFakeHub } from './fake-hub.mjs';
//   const hub = await startFakeHub({ repos: { 'fixtures/f32': { dir: 'tests/fixtures/packs/f32' } } });
//   hub.url  // http://127.0.0.1:PORT   (the endpoint to give the extension)
//   hub.inject('transformer_q8-00000.data', { type: 'cut', afterBytes: 5 << 20 });
//   hub.stats('transformer_q8-00000.data')  // { requests, bodyBytes, ranges, statuses, ... }
//   await hub.close();

import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

/** Files stored with LFS on the Hub (the tree lists `lfs: { oid: sha256 }` and resolve redirects). */
export const LFS_PATTERN = /\.(onnx|data|png|bin|safetensors)$/;

/** Extra files every repo carries unless the spec says otherwise: not part of the pack. */
export function defaultExtras() {
  return {
    'README.md': Buffer.from('---\nlicense: apache-2.0\n---\n# Fixture pack\n\nNot part of the pack; never downloaded.\n'),
    '.gitattributes': Buffer.from('*.onnx filter=lfs diff=lfs merge=lfs -text\n*.data filter=lfs diff=lfs merge=lfs -text\n'),
    'samples/cat.png': filler('samples/cat.png', 0, 300_000),
  };
}

// ---------------------------------------------------------------------------------------------
// Deterministic filler

const PATTERN_LEN = (1 << 20) + 9973; // not a power of two, so chunk edges never line up with it
const patterns = new Map();

/** The filler pattern of a file (seeded by its path). */
function pattern(seed) {
  let p = patterns.get(seed);
  if (!p) {
    p = Buffer.alloc(PATTERN_LEN);
    let block = crypto.createHash('sha256').update(`imagine-fake-hub:${seed}`).digest();
    for (let off = 0; off < PATTERN_LEN; off += 32) {
      block.copy(p, off, 0, Math.min(32, PATTERN_LEN - off));
      block = crypto.createHash('sha256').update(block).digest();
    }
    patterns.set(seed, p);
  }
  return p;
}

/**
 * Filler bytes [start, end) of the file seeded `seed` (absolute offsets): a view of the pattern when
 * the range does not wrap around it (serving gigabytes then allocates nothing), else a copy. Read-only.
 */
export function filler(seed, start, end) {
  const p = pattern(seed);
  const from = start % PATTERN_LEN;
  if (from + (end - start) <= PATTERN_LEN) return p.subarray(from, from + (end - start));
  const out = Buffer.allocUnsafe(end - start);
  let o = 0;
  while (o < out.length) {
    const at = (start + o) % PATTERN_LEN;
    const n = Math.min(PATTERN_LEN - at, out.length - o);
    p.copy(out, o, at, at + n);
    o += n;
  }
  return out;
}

/**
 * A file's content: `base` (a Buffer, the real bytes) followed by filler up to `size`.
 * `read(start, end)` yields Buffers of at most `chunk` bytes.
 */
class Content {
  constructor(seed, base, size) {
    this.seed = seed;
    this.base = base ?? Buffer.alloc(0);
    this.size = Math.max(size ?? this.base.length, this.base.length);
  }
  *read(start, end, chunk = 256 << 10) {
    for (let o = start; o < end; ) {
      const n = Math.min(chunk, end - o);
      if (o + n <= this.base.length) yield this.base.subarray(o, o + n);
      else if (o >= this.base.length) yield filler(this.seed, o, o + n);
      else yield Buffer.concat([this.base.subarray(o), filler(this.seed, this.base.length, o + n)]);
      o += n;
    }
  }
  bytes() {
    return Buffer.concat([...this.read(0, this.size, 64 << 20)]);
  }
  sha256() {
    const h = crypto.createHash('sha256');
    for (const b of this.read(0, this.size, 16 << 20)) h.update(b);
    return h.digest('hex');
  }
  gitOid() {
    const h = crypto.createHash('sha1');
    h.update(`blob ${this.size}\0`);
    for (const b of this.read(0, this.size, 16 << 20)) h.update(b);
    return h.digest('hex');
  }
}

/**
 * A file's content read from disk on demand (`disk: true` repos: packs of gigabytes are never held in
 * memory). Same interface as Content.
 */
class FileContent extends Content {
  constructor(file) {
    super(null, null, 0);
    this.file = file;
    this.size = fs.statSync(file).size;
  }
  *read(start, end, chunk = 256 << 10) {
    const fd = fs.openSync(this.file, 'r');
    try {
      for (let o = start; o < end; ) {
        const buf = Buffer.allocUnsafe(Math.min(chunk, end - o));
        const n = fs.readSync(fd, buf, 0, buf.length, o);
        if (n <= 0) throw new Error(`${this.file}: short read at ${o}`);
        yield n === buf.length ? buf : buf.subarray(0, n);
        o += n;
      }
    } finally {
      fs.closeSync(fd);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Repos and commits

/**
 * Builds one commit of a repo from a spec:
 *   dir       a directory whose files (recursively) are the repo's files
 *   disk      with dir: read its files from disk when served instead of holding them in memory
 *   files     { path: Buffer | string | { size, base?: Buffer } }: more files (a `{ size }` one is all filler)
 *   pad       { path: size }: pad these files with filler up to size
 *   extra     { path: Buffer | string }: files not in the pack (default: defaultExtras())
 *   override  { path: Buffer | string }: replace a file's content (e.g. a tampered manifest)
 *   remove    [path]: drop files
 *   mutateTree (entries) => entries: edit the tree listing as served (sizes that make no sense, …)
 *   salt      a string mixed into the filler, so that a new commit's padded files differ from the old
 *   git       [path]: files stored in git (listed with their blob id, no LFS SHA-256) whatever their name
 */
function buildCommit(repo, spec) {
  const contents = new Map();
  const put = (p, c) => contents.set(p, c);
  if (spec.dir) {
    const walk = (d, prefix) => {
      for (const e of fs.readdirSync(d, { withFileTypes: true })) {
        const rel = prefix ? `${prefix}/${e.name}` : e.name;
        if (e.isDirectory()) walk(path.join(d, e.name), rel);
        else if (e.isFile()) put(rel, spec.disk ? new FileContent(path.join(d, e.name)) : fs.readFileSync(path.join(d, e.name)));
      }
    };
    walk(spec.dir, '');
  }
  for (const [p, v] of Object.entries(spec.extra ?? defaultExtras())) put(p, toBuf(v));
  for (const [p, v] of Object.entries(spec.files ?? {})) put(p, v);
  for (const [p, v] of Object.entries(spec.override ?? {})) put(p, toBuf(v));
  for (const p of spec.remove ?? []) contents.delete(p);
  const files = new Map();
  const pad = spec.pad ?? {};
  for (const [p, v] of [...contents.entries()].sort(([a], [b]) => (a < b ? -1 : 1))) {
    const isObj = v && !Buffer.isBuffer(v) && typeof v === 'object';
    const base = isObj ? (v.base ?? null) : toBuf(v);
    const size = isObj ? v.size : Math.max(base.length, pad[p] ?? 0);
    const c = v instanceof FileContent ? v : new Content(`${repo}/${p}${spec.salt ?? ''}`, base, size);
    const lfs = LFS_PATTERN.test(p) && !(spec.git ?? []).includes(p);
    files.set(p, {
      path: p,
      size: c.size,
      lfs,
      content: c,
      sha256: c.sha256(),
      gitOid: lfs ? null : c.gitOid(),
    });
  }
  for (const f of files.values()) if (f.lfs) f.gitOid = sha1(`lfs-pointer:${f.sha256}:${f.size}`);
  const h = crypto.createHash('sha1');
  h.update(`${repo}\n`);
  for (const f of files.values()) h.update(`${f.path}\0${f.size}\0${f.sha256}\n`);
  // Two commits with the same files would get the same id; a generation counter keeps them apart.
  h.update(String(spec.generation ?? 0));
  return { sha: h.digest('hex'), files, mutateTree: spec.mutateTree ?? null };
}

function toBuf(v) {
  return Buffer.isBuffer(v) ? v : Buffer.from(String(v));
}

function sha1(s) {
  return crypto.createHash('sha1').update(s).digest('hex');
}

function treeEntries(commit, { recursive = true, prefix = '' } = {}) {
  const dirs = new Set();
  const out = [];
  for (const f of commit.files.values()) {
    const parts = f.path.split('/');
    for (let i = 1; i < parts.length; i++) dirs.add(parts.slice(0, i).join('/'));
  }
  for (const d of [...dirs].sort()) out.push({ type: 'directory', oid: sha1(`tree:${commit.sha}:${d}`), size: 0, path: d });
  for (const f of commit.files.values()) {
    const e = { type: 'file', oid: f.gitOid, size: f.size, path: f.path };
    if (f.lfs) e.lfs = { oid: f.sha256, size: f.size, pointerSize: 134 };
    out.push(e);
  }
  let entries = out.filter((e) => {
    if (prefix && !e.path.startsWith(`${prefix}/`)) return false;
    const rest = prefix ? e.path.slice(prefix.length + 1) : e.path;
    return recursive || !rest.includes('/');
  });
  if (commit.mutateTree) entries = commit.mutateTree(entries.map((e) => structuredClone(e)));
  return entries;
}

// ---------------------------------------------------------------------------------------------
// Servers

const EXPOSE = 'Link, Content-Range, Content-Length, ETag, Accept-Ranges, X-Repo-Commit, X-Linked-Etag, X-Linked-Size, Location, X-Error-Code';
const CORS = {
  'Access-Control-Allow-Origin': '*',
  'Access-Control-Expose-Headers': EXPOSE,
};

/**
 * Starts the fake Hub. `repos`: { 'owner/name': spec } (see buildCommit; a string is taken as `dir`).
 * `pad`: padding applied to every repo that has no `pad` of its own. `throttle`: global bytes/s.
 */
export async function startFakeHub({ repos = {}, pad = null, throttle = null, quiet = true } = {}) {
  const state = {
    repos: new Map(), // repo -> { commits: Map(sha -> commit), main: sha, generation }
    blobs: new Map(), // sha256 -> file (any repo, any commit)
    faults: new Map(), // path -> [fault]
    stats: new Map(), // path -> stats
    log: [],
    throttle,
    treePageSize: null,
    sockets: new Set(),
    t0: Date.now(),
  };

  const hub = {
    url: '',
    cdnUrl: '',
    log: state.log,
    /** Adds a commit to `repo` (creating it) and moves `main` to it; returns the commit id. */
    setRepo(repo, spec) {
      if (typeof spec === 'string') spec = { dir: spec };
      if (pad && !spec.pad) spec = { ...spec, pad };
      let r = state.repos.get(repo);
      if (!r) state.repos.set(repo, (r = { commits: new Map(), main: null, generation: 0 }));
      const commit = buildCommit(repo, { ...spec, generation: r.generation++ });
      r.commits.set(commit.sha, commit);
      r.main = commit.sha;
      for (const f of commit.files.values()) state.blobs.set(f.sha256, f);
      return commit.sha;
    },
    /** The commit `main` points at. */
    commit(repo) {
      return repoOf(repo).main;
    },
    /** [{ path, size, sha256, lfs, gitOid }] of a repo at a commit (default main), extras included. */
    files(repo, commit) {
      const c = repoOf(repo).commits.get(commit ?? repoOf(repo).main);
      return [...c.files.values()].map(({ content, ...f }) => f);
    },
    /** One file's record. */
    file(repo, p, commit) {
      return hub.files(repo, commit).find((f) => f.path === p);
    },
    /** The whole content of a file (small files only). */
    content(repo, p, commit) {
      const c = repoOf(repo).commits.get(commit ?? repoOf(repo).main);
      return c.files.get(p).content.bytes();
    },
    /**
     * Injects a fault for requests of the pack-relative `p` (any repo). Faults apply to the response
     * that carries the body (the CDN for LFS files, the hub for others), except `status`, which the
     * resolve request gets (`at: 'cdn'` moves it to the body). `times` (default 1; Infinity for ever)
     * says how many responses it affects.
     *   { type: 'cut', afterBytes }            headers, afterBytes of body, then the socket is destroyed
     *   { type: 'status', status }             500/503/404/… with a JSON error body
     *   { type: 'ignoreRange' }                200 with the whole body even for a Range request
     *   { type: 'corrupt', at? }               one byte flipped (absolute offset `at`, default the middle,
     *                                          or the first byte sent if the response does not cover it)
     *   { type: 'slow', bytesPerSecond }       throttled (default times: Infinity)
     *   { type: 'resize', by }                 serves the file as if it were `by` bytes longer (zeros
     *                                          appended) or shorter, headers included
     *   { type: 'stall', afterBytes? }         headers, afterBytes (default 0) of body, then nothing, the
     *                                          connection left open until the client closes it
     *   { type: 'shortRange', bytes }          a Range request gets a 206 of only `bytes` bytes from where
     *                                          it asked, its Content-Range ending there (as servers may)
     *   { type: 'redirect', to }               the resolve request is redirected to `to` (an origin, e.g.
     *                                          `http://other.test:PORT`) + `/blobs/<sha256>`, which the CDN
     *                                          serves, for any file
     *   { type: 'refuse' }                     no answer: the connection is dropped before any header, as
     *                                          when the network is down (the browser's fetch rejects)
     * The API answers take `status`, `stall` and `refuse` faults under the paths ':revision' and ':tree'
     * (every page of the list).
     */
    inject(p, fault) {
      const f = { times: fault.type === 'slow' ? Infinity : 1, ...fault, applied: 0 };
      if (!state.faults.has(p)) state.faults.set(p, []);
      state.faults.get(p).push(f);
      return f;
    },
    clearFaults(p) {
      if (p) state.faults.delete(p);
      else state.faults.clear();
    },
    /**
     * Serves tree listings `n` entries a page (null: one page), the next page named by a
     * `Link: <url>; rel="next"` header with a `cursor`, as the Hub does.
     */
    setTreePageSize(n) {
      state.treePageSize = n;
    },
    /**
     * { requests, resolveRequests, cdnRequests, bodyBytes, ranges, statuses, commits } of a path;
     * requests counts resolve and CDN requests (a redirected download is 2); bodyBytes counts what
     * was written to sockets (cut responses included).
     */
    stats(p) {
      return state.stats.get(p) ?? emptyStats();
    },
    /** Stats of every path seen. */
    allStats() {
      return Object.fromEntries(state.stats.entries());
    },
    totalBodyBytes() {
      let n = 0;
      for (const s of state.stats.values()) n += s.bodyBytes;
      return n;
    },
    /** Forgets stats and the log (faults stay). */
    reset() {
      state.stats.clear();
      state.log.length = 0;
    },
    close() {
      for (const s of state.sockets) s.destroy();
      return Promise.all([hubServer, cdnServer].map((s) => new Promise((r) => s.close(() => r()))));
    },
  };

  function repoOf(repo) {
    const r = state.repos.get(repo);
    if (!r) throw new Error(`fake hub: no repo ${repo}`);
    return r;
  }

  function statsOf(p) {
    let s = state.stats.get(p);
    if (!s) state.stats.set(p, (s = emptyStats()));
    return s;
  }

  function takeFault(p, types) {
    const list = state.faults.get(p) ?? [];
    const f = list.find((f) => types.includes(f.type) && f.applied < f.times);
    if (f && f.type !== 'slow') f.applied++;
    return f ?? null;
  }

  function record(server, req, extra = {}) {
    const rec = {
      t: Date.now() - state.t0,
      server,
      method: req.method,
      url: req.url,
      range: req.headers.range ?? null,
      status: 0,
      bytes: 0,
      ...extra,
    };
    state.log.push(rec);
    if (!quiet) console.log(`fake-hub: ${server} ${req.method} ${req.url} ${rec.range ?? ''}`);
    return rec;
  }

  function send(res, rec, status, headers = {}, body = null) {
    rec.status = status;
    if (rec.path) statsOf(rec.path).statuses.push(status);
    res.writeHead(status, { ...CORS, ...headers });
    if (body && rec.method !== 'HEAD') {
      rec.bytes += body.length;
      res.end(body);
    } else res.end();
  }

  function sendError(res, rec, status, code, message) {
    send(res, rec, status, { 'Content-Type': 'application/json', 'X-Error-Code': code, 'X-Error-Message': message }, Buffer.from(JSON.stringify({ error: message })));
  }

  function preflight(req, res) {
    res.writeHead(204, {
      ...CORS,
      'Access-Control-Allow-Methods': 'GET, HEAD, OPTIONS',
      'Access-Control-Allow-Headers': req.headers['access-control-request-headers'] || 'Range, Content-Type',
      'Access-Control-Allow-Private-Network': 'true',
      'Access-Control-Max-Age': '600',
    });
    res.end();
  }

  /** Streams `file` (with Range, faults and throttling); counts body bytes for `p`. */
  async function serveBody(req, res, rec, file, p, extraHeaders) {
    const st = statsOf(p);
    st.ranges.push(req.headers.range ?? null);
    const headers = {
      'Content-Type': 'application/octet-stream',
      'Accept-Ranges': 'bytes',
      ETag: `"${file.lfs ? file.sha256 : file.gitOid}"`,
      ...extraHeaders,
    };
    const resize = takeFault(p, ['resize']);
    const size = file.size + (resize?.by ?? 0);
    let start = 0;
    let end = size; // exclusive
    let status = 200;
    const m = /^bytes=(\d*)-(\d*)$/.exec(req.headers.range ?? '');
    const ignore = m ? takeFault(p, ['ignoreRange']) : null;
    if (m && (m[1] !== '' || m[2] !== '') && !ignore) {
      if (m[1] === '') {
        start = Math.max(0, size - Number(m[2]));
      } else {
        start = Number(m[1]);
        if (m[2] !== '') end = Math.min(Number(m[2]) + 1, size);
      }
      if (start >= size || start >= end) {
        return send(res, rec, 416, { ...headers, 'Content-Range': `bytes */${size}` });
      }
      const short = takeFault(p, ['shortRange']);
      if (short) end = Math.min(end, start + short.bytes);
      status = 206;
      headers['Content-Range'] = `bytes ${start}-${end - 1}/${size}`;
    }
    const statusFault = takeFault(p, ['status-cdn']);
    if (statusFault) return sendError(res, rec, statusFault.status, 'Injected', `injected ${statusFault.status}`);
    headers['Content-Length'] = String(end - start);
    rec.status = status;
    st.statuses.push(status);
    res.writeHead(status, { ...CORS, ...headers });
    if (req.method === 'HEAD') return res.end();

    const cut = takeFault(p, ['cut']);
    const stall = cut ? null : takeFault(p, ['stall']);
    const corrupt = takeFault(p, ['corrupt']);
    const slow = takeFault(p, ['slow']);
    let corruptAt = corrupt ? (corrupt.at ?? Math.floor(size / 2)) : -1;
    if (corrupt && (corruptAt < start || corruptAt >= end)) corruptAt = start;
    const stopAt = cut?.afterBytes ?? stall?.afterBytes ?? (stall ? 0 : null);
    const limit = stopAt !== null ? Math.min(end, start + stopAt) : end;
    let closed = false;
    res.on('close', () => (closed = true));
    const t0 = Date.now();
    let sent = 0;
    const bps = Math.min(slow?.bytesPerSecond ?? Infinity, state.throttle ?? Infinity);
    const chunkSize = bps === Infinity ? 256 << 10 : Math.max(1024, Math.min(256 << 10, Math.floor(bps / 20)));
    let o = start;
    while (o < limit && !closed) {
      const n = Math.min(chunkSize, limit - o);
      // Past the real end (a `resize` fault), zeros.
      const real = Math.max(0, Math.min(o + n, file.size) - o);
      let [chunk] = real > 0 ? file.content.read(o, o + real, real) : [Buffer.alloc(0)];
      if (real < n) chunk = Buffer.concat([chunk, Buffer.alloc(n - real)]);
      if (corruptAt >= o && corruptAt < o + n) {
        chunk = Buffer.from(chunk);
        chunk[corruptAt - o] ^= 0xff;
      }
      const ok = res.write(chunk);
      sent += n;
      st.bodyBytes += n;
      rec.bytes += n;
      o += n;
      if (!ok && !closed) {
        await new Promise((r) => {
          const done = () => {
            res.off('drain', done);
            res.off('close', done);
            r();
          };
          res.on('drain', done);
          res.on('close', done);
        });
      }
      if (bps !== Infinity) {
        const due = t0 + (sent / bps) * 1000;
        const wait = due - Date.now();
        if (wait > 0) await sleep(wait);
      }
    }
    if (stall && !closed) {
      rec.stalled = true;
      res.flushHeaders();
      return silence(res);
    }
    if (cut && !closed) {
      // Flush what was counted, then close before Content-Length is reached: the client sees a
      // truncated body (a network error), and every byte counted was delivered.
      rec.cut = true;
      const sock = res.socket;
      sock?.end();
      setTimeout(() => sock?.destroy(), 2000).unref();
      return;
    }
    res.end();
  }

  /** Says nothing more on `res` until the client closes the connection. */
  function silence(res) {
    return new Promise((r) => res.on('close', r));
  }

  /** An API answer, unless a fault under `:kind` (see `inject`) says otherwise. */
  function sendApi(res, rec, kind, headers, body) {
    const fault = takeFault(`:${kind}`, ['status', 'stall', 'refuse']);
    if (fault?.type === 'status') return sendError(res, rec, fault.status, 'Injected', `injected ${fault.status}`);
    if (fault?.type === 'refuse') {
      rec.status = 0;
      rec.refused = true;
      res.socket.destroy();
      return;
    }
    if (fault?.type === 'stall') {
      rec.status = 200;
      rec.stalled = true;
      res.writeHead(200, { ...CORS, ...headers, 'Content-Length': String(body.length) });
      const part = body.subarray(0, Math.min(body.length, fault.afterBytes ?? 0));
      if (part.length > 0) res.write(part);
      else res.flushHeaders();
      rec.bytes += part.length;
      return silence(res);
    }
    return send(res, rec, 200, headers, body);
  }

  async function onHub(req, res) {
    const rec = record('hub', req);
    if (req.method === 'OPTIONS') return preflight(req, res);
    if (req.method !== 'GET' && req.method !== 'HEAD') return sendError(res, rec, 405, 'MethodNotAllowed', 'method not allowed');
    const url = new URL(req.url, 'http://x');
    const parts = url.pathname.split('/').slice(1).map(decodeURIComponent);
    // /api/models/{owner}/{name}/(revision|tree)/{rev}[/{path}]
    if (parts[0] === 'api' && parts[1] === 'models') {
      const repo = `${parts[2]}/${parts[3]}`;
      rec.repo = repo;
      const r = state.repos.get(repo);
      if (!r) return sendError(res, rec, 404, 'RepoNotFound', `Repository not found`);
      const kind = parts[4];
      const rev = parts[5];
      const commit = rev === 'main' ? r.commits.get(r.main) : r.commits.get(rev);
      if (!commit) return sendError(res, rec, 404, 'RevisionNotFound', `Invalid rev id: ${rev}`);
      rec.commit = commit.sha;
      if (kind === 'revision' && parts.length === 6) {
        const body = { id: repo, modelId: repo, sha: commit.sha, siblings: [...commit.files.keys()].map((rfilename) => ({ rfilename })) };
        return sendApi(res, rec, 'revision', { 'Content-Type': 'application/json' }, Buffer.from(JSON.stringify(body)));
      }
      if (kind === 'tree') {
        const prefix = parts.slice(6).join('/');
        const entries = treeEntries(commit, { recursive: url.searchParams.get('recursive') === 'true', prefix });
        const headers = { 'Content-Type': 'application/json' };
        const size = state.treePageSize ?? entries.length;
        const from = Number(Buffer.from(url.searchParams.get('cursor') ?? '', 'base64').toString() || 0);
        if (from + size < entries.length) {
          const next = new URL(req.url, hub.url);
          next.searchParams.set('cursor', Buffer.from(String(from + size)).toString('base64'));
          headers.Link = `<${next}>; rel="next"`;
        }
        const page = entries.slice(from, from + size);
        return sendApi(res, rec, 'tree', headers, Buffer.from(JSON.stringify(page)));
      }
      return sendError(res, rec, 404, 'NotFound', 'Not Found');
    }
    // /{owner}/{name}/resolve/{rev}/{path...}
    if (parts[2] === 'resolve' && parts.length >= 5) {
      const repo = `${parts[0]}/${parts[1]}`;
      const rev = parts[3];
      const p = parts.slice(4).join('/');
      Object.assign(rec, { repo, path: p, rev });
      const st = statsOf(p);
      st.requests++;
      st.resolveRequests++;
      st.revs.push(rev);
      const r = state.repos.get(repo);
      if (!r) return sendError(res, rec, 404, 'RepoNotFound', 'Repository not found');
      const commit = rev === 'main' ? r.commits.get(r.main) : r.commits.get(rev);
      if (!commit) return sendError(res, rec, 404, 'RevisionNotFound', `Invalid rev id: ${rev}`);
      rec.commit = commit.sha;
      const fault = takeFault(p, ['status']);
      if (fault) {
        st.ranges.push(req.headers.range ?? null);
        return sendError(res, rec, fault.status, fault.status === 404 ? 'EntryNotFound' : 'Injected', fault.status === 404 ? `Entry not found` : `injected ${fault.status}`);
      }
      const file = commit.files.get(p);
      if (!file) {
        st.statuses.push(404);
        return sendError(res, rec, 404, 'EntryNotFound', 'Entry not found');
      }
      const meta = { 'X-Repo-Commit': commit.sha };
      const redirect = takeFault(p, ['redirect']);
      if (file.lfs || redirect) {
        const q = new URLSearchParams({ repo, path: p, commit: commit.sha });
        const location = `${redirect?.to ?? hub.cdnUrl}/blobs/${file.sha256}?${q}`;
        st.statuses.push(302);
        return send(res, rec, 302, {
          ...meta,
          Location: location,
          'X-Linked-Etag': `"${file.sha256}"`,
          'X-Linked-Size': String(file.size),
          ETag: `"${file.gitOid}"`,
          'Content-Type': 'text/plain; charset=utf-8',
        }, Buffer.from(`Found. Redirecting to ${location}`));
      }
      return serveBody(req, res, rec, file, p, meta);
    }
    return sendError(res, rec, 404, 'NotFound', 'Not Found');
  }

  async function onCdn(req, res) {
    const rec = record('cdn', req);
    if (req.method === 'OPTIONS') return preflight(req, res);
    const url = new URL(req.url, 'http://x');
    const m = /^\/blobs\/([0-9a-f]{64})$/.exec(url.pathname);
    const file = m ? state.blobs.get(m[1]) : null;
    if (!file) return sendError(res, rec, 404, 'NotFound', 'NoSuchKey');
    const p = url.searchParams.get('path') ?? file.path;
    rec.path = p;
    rec.commit = url.searchParams.get('commit');
    const st = statsOf(p);
    st.requests++;
    st.cdnRequests++;
    return serveBody(req, res, rec, file, p, {});
  }

  const wrap = (fn) => (req, res) => {
    fn(req, res).catch((e) => {
      console.error(`fake-hub: ${req.url}: ${e.stack ?? e}`);
      res.destroy();
    });
  };
  const hubServer = http.createServer(wrap(onHub));
  const cdnServer = http.createServer(wrap(onCdn));
  for (const s of [hubServer, cdnServer]) {
    s.keepAliveTimeout = 5000;
    s.on('connection', (sock) => {
      state.sockets.add(sock);
      sock.on('close', () => state.sockets.delete(sock));
    });
    await new Promise((r) => s.listen(0, '127.0.0.1', r));
  }
  hub.url = `http://127.0.0.1:${hubServer.address().port}`;
  hub.cdnUrl = `http://127.0.0.1:${cdnServer.address().port}`;
  // `status` faults given with at: 'cdn' are stored under their own type.
  const inject = hub.inject;
  hub.inject = (p, fault) => inject(p, fault.type === 'status' && fault.at === 'cdn' ? { ...fault, type: 'status-cdn' } : fault);
  for (const [repo, spec] of Object.entries(repos)) hub.setRepo(repo, spec);
  return hub;
}

function emptyStats() {
  return { requests: 0, resolveRequests: 0, cdnRequests: 0, bodyBytes: 0, ranges: [], statuses: [], revs: [] };
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}
