// `cargo xtask run` (tools/run.mjs) where nobody watches: headless, and without the Internet.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const run = (args) =>
  h.run(process.execPath, ['tools/run.mjs', '--fresh', ...args], { timeoutMs: 180_000, env: { ...process.env, IMAGINE_HEADLESS: '1' } });

test('headless without --prompt: the demo pack is installed, and it says what to do instead of waiting', { timeout: 200_000 }, async () => {
  const r = await run(['--demo']);
  assert.equal(r.code, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /run: pack installed/);
  assert.match(r.stdout, /The browser is headless .* add --prompt P --out F\.png to make an image, or run where there is a display/);
});

test('a Hub that cannot be reached: the error, and that --demo works offline', { timeout: 200_000 }, async () => {
  // A loopback port nothing listens on.
  const r = await run(['--hub', 'http://127.0.0.1:9']);
  assert.equal(r.code, 1, r.stdout + r.stderr);
  assert.match(r.stderr, /could not reach http:\/\/127\.0\.0\.1:9/);
  assert.match(r.stderr, /`cargo xtask run --demo` installs a tiny demo pack from a local fake Hub and works offline/);
});
