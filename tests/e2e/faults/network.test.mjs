// Once the pack is installed, a generation makes no network request at all.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as h from '../lib/harness.mjs';

const LOCAL = /^(chrome-extension|data|blob|about|chrome):/;

test('a generation after install touches no network', { timeout: 600_000 }, async (t) => {
  const b = await h.setup(t);
  const port = new URL(b.hub.url).port;
  await b.hub.close();

  const requests = [];
  // Pages and the service worker, as Playwright sees them.
  b.context.on('request', (r) => requests.push(`context: ${r.url()}`));
  // The offscreen document and its workers, which Playwright does not see: the Fetch domain on the
  // browser-level CDP session pauses every request of every target; record it and let it go.
  // (Checked with a probe extension: a fetch from an offscreen document and from its module worker
  // both show up here; pages and the service worker show up in context.on('request').)
  const cdp = b.browserCdp;
  cdp.on('Fetch.requestPaused', async (ev) => {
    requests.push(`fetch: ${ev.request.url}`);
    await cdp.send('Fetch.continueRequest', { requestId: ev.requestId }).catch(() => {});
  });
  await cdp.send('Fetch.enable', { patterns: [{ urlPattern: '*' }] });

  const { result } = await h.generateOk(b.page, {
    prompt: 'an empty street at night',
    width: 256,
    height: 256,
    steps: 2,
    seed: '3',
  });
  assert.ok(result.png.length > 0);
  await cdp.send('Fetch.disable').catch(() => {});

  const remote = requests.filter((r) => !LOCAL.test(r.replace(/^\w+: /, '')));
  assert.deepEqual(remote, [], `network requests during generation (the fake Hub was on port ${port})`);
});
