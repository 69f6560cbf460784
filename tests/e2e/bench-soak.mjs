// `cargo xtask bench soak`: many generations in one browser, two fixture packs installed in turn, to
// see whether a stage worker ever stops. Written to decide whether ORT's JSPI build can replace the
// asyncify build we ship (README, limits).
//
//   node tests/e2e/bench-soak.mjs [--runs 12] [--ort asyncify|jspi] [--timeout-s 120]
//
// `--ort jspi` runs a copy of dist/ (target/dist-jspi/) whose stage workers import ORT's JSPI bundle
// instead of the asyncify one; everything else is the same build. When a generation does not end
// within the timeout, the stage worker still alive is asked over DevTools to evaluate `1`: an idle
// worker waiting on a promise answers at once; one whose thread is blocked does not.

import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as h from './harness.mjs';

const { values: o } = parseArgs({
  options: {
    runs: { type: 'string', default: '12' },
    ort: { type: 'string', default: 'asyncify' },
    'timeout-s': { type: 'string', default: '120' },
  },
});
const BUNDLES = { asyncify: ['ort.webgpu.bundle.min.mjs', 'ort-wasm-simd-threaded.asyncify.wasm'], jspi: ['ort.jspi.bundle.min.mjs', 'ort-wasm-simd-threaded.jspi.wasm'] };
if (!BUNDLES[o.ort]) throw new Error(`--ort: ${o.ort} (allowed: asyncify, jspi)`);

/** dist/, or a copy of it whose stage workers load the JSPI bundle. */
function extensionDir() {
  if (o.ort === 'asyncify') return h.DIST;
  const dir = path.join(h.ROOT, 'target/dist-jspi');
  fs.rmSync(dir, { recursive: true, force: true });
  fs.cpSync(h.DIST, dir, { recursive: true });
  for (const f of BUNDLES.jspi) fs.copyFileSync(path.join(h.ROOT, 'node_modules/onnxruntime-web/dist', f), path.join(dir, 'ort', f));
  const shim = path.join(dir, 'stage-worker.js');
  const text = fs.readFileSync(shim, 'utf8');
  if (!text.includes(BUNDLES.asyncify[0])) throw new Error(`${shim} does not import ${BUNDLES.asyncify[0]}`);
  fs.writeFileSync(shim, text.replace(BUNDLES.asyncify[0], BUNDLES.jspi[0]));
  return dir;
}

/** A raw DevTools connection to the browser (Playwright's own does not reach offscreen workers). */
async function devtools(port) {
  const { webSocketDebuggerUrl } = await (await fetch(`http://127.0.0.1:${port}/json/version`)).json();
  const ws = new WebSocket(webSocketDebuggerUrl);
  await new Promise((resolve, reject) => (ws.addEventListener('open', resolve), ws.addEventListener('error', reject)));
  let nextId = 1;
  const pending = new Map();
  ws.addEventListener('message', (ev) => {
    const m = JSON.parse(ev.data);
    pending.get(m.id)?.(m);
    pending.delete(m.id);
  });
  const send = (method, params = {}, sessionId) =>
    new Promise((resolve) => {
      const id = nextId++;
      pending.set(id, resolve);
      ws.send(JSON.stringify({ id, method, params, sessionId }));
    });
  return { send, close: () => ws.close() };
}

/** Whether each worker alive answers `Runtime.evaluate` within 5 s. */
async function workersAnswer(cdp) {
  const { result } = await cdp.send('Target.getTargets');
  const answers = [];
  for (const t of result.targetInfos.filter((t) => t.type === 'worker')) {
    const attached = await cdp.send('Target.attachToTarget', { targetId: t.targetId, flatten: true });
    const reply = await Promise.race([
      cdp.send('Runtime.evaluate', { expression: '1' }, attached.result.sessionId),
      h.sleep(5000).then(() => null),
    ]);
    answers.push(reply?.result?.result?.value === 1);
  }
  return answers;
}

const port = 9300 + Math.floor(Math.random() * 600);
const b = await h.launch({ extDir: extensionDir(), args: [`--remote-debugging-port=${port}`] });
const hub = await h.startHub({ repos: ['f32', 'f32-vae32'] });
const cdp = await devtools(port);
const runs = Number(o.runs);
const t0 = Date.now();
const at = () => `${((Date.now() - t0) / 1000).toFixed(1)} s`;
let finished = 0;
try {
  for (let i = 0; i < runs; i++) {
    const repo = i % 2 ? 'fixtures/f32-vae32' : 'fixtures/f32';
    await h.installPack(b.page, hub, repo);
    try {
      await h.generateOk(b.page, { prompt: `a red fox, take ${i}`, width: 256, height: 256, steps: 2, seed: String(i) }, Number(o['timeout-s']) * 1000);
      finished++;
      console.log(`${at()}: generation ${i + 1} of ${runs} (${repo}): finished`);
    } catch (e) {
      const answers = await workersAnswer(cdp);
      console.log(`${at()}: generation ${i + 1} of ${runs} (${repo}): no result within ${o['timeout-s']} s; workers alive: ${answers.length}, answering DevTools: ${answers.filter(Boolean).length}`);
      break;
    }
  }
} finally {
  cdp.close();
  await b.close();
  await hub.close();
}
console.log(`\nbench soak --ort ${o.ort}: ${finished} of ${runs} generations finished in one browser`);
