// What the tests of the graphs re-blocked to 32 and stored beside the installed pack
// (generate/stored-forms*.test.mjs) share: the pack they install, the image they ask for, and reading
// the stored forms (`<stem>.b32.onnx`, `<stem>.b32.data`).
//
// The pack is the tiny real-architecture float32 pack (tiny-packs.mjs), whose transformer has MatMulNBits
// of block 128 (what is re-blocked and stored), served with the f32 fixture pack's text encoder and
// decoder (closed forms, the same inputs and outputs) in place of its own: neither has anything to
// re-block, and on SwiftShader the tiny pack's text encoder took 8-17 s of a cold image and its VAE
// decoder 7-9 s of each 256x256 image (19-20 s, up to 43 s under load, before its channels were
// halved), the fixture's about 1 s and 0.2 s.
import fs from 'node:fs';
import path from 'node:path';
import * as h from './harness.mjs';
import { tinyPack } from './tiny-packs.mjs';

export const REPO = 'tiny/float32';
/** The smallest size allowed; one step (a job loads each stage once, whatever its steps). */
export const REQ = { prompt: 'a red fox in the snow', width: 256, height: 256, steps: 1, seed: '42' };
export const TRANSFORMER = 'transformer_q8.onnx';

/** The fake Hub's spec of REPO (see the header); a new commit of the same files with `hub.setRepo`. */
export async function packSpec() {
  const dir = await tinyPack('float32');
  const fixture = h.fixtureDir('fixtures/f32');
  const replaced = (f) => f.startsWith('text_encoder_q4') || f.startsWith('vae_decoder');
  const theirs = fs.readdirSync(fixture).filter(replaced);
  return {
    dir,
    // The tiny text encoder's shards that the fixture's has none of.
    remove: fs.readdirSync(dir).filter((f) => replaced(f) && !theirs.includes(f)),
    override: Object.fromEntries(theirs.map((f) => [f, fs.readFileSync(path.join(fixture, f))])),
  };
}

/**
 * A browser with REPO installed (for WebGPU: its forms stored), stages not kept loaded. The object
 * h.setup returned (its `close` is what the test's end calls), with `spec` and `pack` (its directory).
 */
export async function installed(t, launchOpts = {}) {
  const spec = await packSpec();
  const b = await h.setup(t, { pack: null, install: false, hubOptions: { repos: { [REPO]: spec } }, ...launchOpts });
  await h.installPack(b.page, b.hub, REPO);
  // Each image loads its stages afresh, so that each reads the stored forms again.
  await h.api(b.page, { type: 'keepLoaded', seconds: 0 });
  return Object.assign(b, { spec, pack: await h.installedDir(b.page) });
}

/** Each stage's graph file in a result's timings, by stage. */
export function graphFiles(result) {
  return Object.fromEntries(result.timings.stages.map((s) => [s.stage, s.graphFile]));
}

/** The stored form of `graph` the installed pack's record names, or undefined. */
export async function storedForm(page, graph = TRANSFORMER) {
  return (await h.packState(page))?.installed?.block32?.graphs?.find((g) => g.graph === graph);
}

/** Polls `check` (async, truthy when done) every 500 ms for at most `ms`; its last value. */
export async function within(ms, check) {
  let value;
  for (const until = Date.now() + ms; !(value = await check()) && Date.now() < until;) await h.sleep(500);
  return value;
}

/** The stored forms' files in the installed pack's directory. */
export async function storedFiles(b) {
  return Object.keys(await h.opfsTree(b.page)).filter((k) => k.startsWith(`${b.pack}/`) && k.includes('.b32.'));
}

/**
 * The installed pack as a version before the stored forms installed it: its record without them and
 * their files removed. A job then re-blocks the graphs while loading and stores their forms after it.
 */
export async function withoutStoredForms(b) {
  const state = await h.packState(b.page);
  const record = state.installed.block32;
  delete state.installed.block32;
  await h.opfsWrite(b.page, 'packs/state.json', JSON.stringify(state));
  for (const g of record.graphs) for (const f of [g.onnx, g.data]) await h.opfsRemove(b.page, `${b.pack}/${f}`);
  return record;
}
