// `cargo xtask run` (tools/run.mjs) where nobody watches: headless, and without the Internet.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const run = (args) =>
  h.run(process.execPath, ['tools/run.mjs', '--fresh', ...args], { timeoutMs: 180_000, env: { ...process.env, IMAGINE_HEADLESS: '1' } });

test('headless without --prompt: the demo pack is installed, and it says what to do instead of waiting', { timeout: 200_000 }, async () => {
  const r = await run(['--demo']);
  assert.equal(r.code, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /run: pack installed/);
  assert.match(r.stdout, /The browser is headless .* add --prompt P --out F\.png to make an image, or run where there is a display/);
  // Said before the install too, which on the published pack takes long with nothing to see.
  const lines = r.stdout.split('\n');
  const note = lines.findIndex((l) => /^run: headless .*nobody sees this browser, so this run only installs the pack and exits; add --prompt P --out F\.png to make an image/.test(l));
  assert.ok(note >= 0 && note < lines.findIndex((l) => /^run: installing /.test(l)), r.stdout);
});

test('a Hub that cannot be reached: the error, and that --demo works offline', { timeout: 300_000 }, async () => {
  // As a person types it (xtask adds no line of its own after run.mjs's), on a loopback port nothing
  // listens on.
  const r = await h.run('cargo', ['xtask', 'run', '--no-build', '--fresh', '--hub', 'http://127.0.0.1:9'], {
    timeoutMs: 280_000,
    env: { ...process.env, IMAGINE_HEADLESS: '1' },
  });
  assert.equal(r.code, 1, r.stdout + r.stderr);
  assert.match(r.stderr, /could not reach http:\/\/127\.0\.0\.1:9/);
  assert.match(r.stderr, /`cargo xtask run --demo` installs a tiny demo pack from a local fake Hub and works offline/);
  // One line, the last: what failed, then what works offline; no stack trace.
  const last = r.stderr.trim().split('\n').at(-1);
  assert.match(last, /^run: could not reach http:\/\/127\.0\.0\.1:9\/.*`cargo xtask run --demo` installs a tiny demo pack from a local fake Hub and works offline$/);
  assert.doesNotMatch(r.stderr, /\n\s+at /);
});

test('--browser firefox: Firefox ESR with the Firefox build installs the demo pack and writes the image', { timeout: 200_000 }, async () => {
  const out = `${h.OUT}/run-firefox.png`;
  const r = await run(['--browser', 'firefox', '--demo', '--prompt', 'a red fox', '--out', out, '--width', '256', '--height', '256', '--steps', '2', '--seed', '7']);
  assert.equal(r.code, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /^run: launching \S*firefox/m);
  assert.match(r.stdout, /run: extension at moz-extension:\/\//);
  assert.match(r.stdout, /run: wrote .*run-firefox\.png/);
  const png = fs.readFileSync(out);
  assert.deepEqual([png.readUInt32BE(16), png.readUInt32BE(20)], [256, 256], 'the PNG header\'s width and height');
});
