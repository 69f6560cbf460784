// Browser internals over CDP: the service worker stopped, the workers listed and watched.

import { sleep } from './process.mjs';

/**
 * Stops the extension's service worker (CDP ServiceWorker.stopAllWorkers) and waits until it has
 * stopped. It may be running again by then: a download worker's next progress message wakes it at once.
 */
export async function stopServiceWorker(context, page, { timeoutMs = 15_000 } = {}) {
  const helper = page ?? (await context.newPage());
  const cdp = await context.newCDPSession(helper);
  const versions = new Map();
  let asked = false;
  let stoppedSinceAsked = false;
  cdp.on('ServiceWorker.workerVersionUpdated', ({ versions: vs }) => {
    for (const v of vs) {
      versions.set(v.versionId, v);
      if (asked && v.scriptURL.startsWith('chrome-extension://') && v.runningStatus === 'stopped') stoppedSinceAsked = true;
    }
  });
  await cdp.send('ServiceWorker.enable');
  asked = true;
  await cdp.send('ServiceWorker.stopAllWorkers');
  const deadline = Date.now() + timeoutMs;
  try {
    for (;;) {
      const ext = [...versions.values()].filter((v) => v.scriptURL.startsWith('chrome-extension://'));
      if (stoppedSinceAsked || (ext.length > 0 && ext.every((v) => v.runningStatus === 'stopped'))) return;
      if (Date.now() > deadline) {
        throw new Error(`service worker did not stop: ${JSON.stringify(ext.map((v) => v.runningStatus))}`);
      }
      await sleep(100);
    }
  } finally {
    await cdp.send('ServiceWorker.disable').catch(() => {});
    await cdp.detach().catch(() => {});
    if (!page) await helper.close();
  }
}

/**
 * The dedicated workers alive in the browser, from a browser-level CDP session (Target.getTargets):
 * [{ targetId, url, parentId, parentUrl, parentType }].
 *
 * Chromium 156 lists a dedicated worker of an offscreen document with an empty `url` and `title`
 * (a page's workers have theirs), and attaching to such a worker and evaluating `location.href`
 * gets no answer. What is always known is its parent: `parentId` is the offscreen document's target
 * (type `background_page`, url `.../offscreen.html`). So stage workers are identified by their
 * parent; a worker appears in the list as soon as it is constructed and disappears when terminated.
 * Chromium 148 (Debian's in December 2026) has no `parentId` in a target's info at all; there, a
 * worker without a url and without a parent is taken for the offscreen document's (the only context
 * of the extension that starts workers).
 */
export async function listWorkers(context) {
  const cdp = await browserSession(context);
  const { targetInfos } = await cdp.send('Target.getTargets');
  const byId = new Map(targetInfos.map((t) => [t.targetId, t]));
  return targetInfos
    .filter((t) => t.type === 'worker')
    .map((w) => {
      const parent = byId.get(w.parentId ?? w.openerId ?? '') ?? null;
      return {
        targetId: w.targetId,
        url: w.url,
        parentId: parent?.targetId ?? null,
        parentUrl: parent?.url ?? '',
        parentType: parent?.type ?? '',
      };
    });
}

const browserSessions = new WeakMap();

export async function browserSession(context) {
  let s = browserSessions.get(context);
  if (!s) {
    s = await context.browser().newBrowserCDPSession();
    browserSessions.set(context, s);
  }
  return s;
}

/**
 * Polls listWorkers every `intervalMs` until stop() is called; returns { stop, samples } where
 * samples is [{ t, workers }] (t: ms since start).
 */
export function watchWorkers(context, { intervalMs = 100 } = {}) {
  const samples = [];
  const t0 = Date.now();
  let running = true;
  const loop = (async () => {
    while (running) {
      try {
        samples.push({ t: Date.now() - t0, workers: await listWorkers(context) });
      } catch (e) {
        if (running) samples.push({ t: Date.now() - t0, error: String(e) });
      }
      await sleep(intervalMs);
    }
  })();
  return {
    samples,
    stop: async () => {
      running = false;
      await loop;
      return samples;
    },
  };
}

/** Whether a worker is a stage (or pack) worker: its parent is the offscreen document (see listWorkers). */
export function isStageWorker(w) {
  return w.parentUrl.includes('/offscreen.html') || w.url.includes('stage-worker') || (w.parentId === null && w.url === '');
}

/**
 * The JavaScript heap of each of the extension's documents and its service worker, from CDP's
 * `Runtime.getHeapUsage`: { "<type> <file>": { used, total, backing } } in bytes (`backing`: array
 * buffers' memory, where Chromium reports it), each after a full garbage collection there when `collect`.
 * The offscreen document's dedicated workers are left out: Chromium answers nothing for them (see
 * listWorkers). A target that does not answer within 5 s is reported as null.
 */
export async function extensionHeaps(context, { collect = false } = {}) {
  const cdp = await browserSession(context);
  const { targetInfos } = await cdp.send('Target.getTargets');
  const heaps = {};
  let nextId = 1;
  for (const target of targetInfos.filter((x) => x.url.startsWith('chrome-extension://') && x.type !== 'worker')) {
    const { sessionId } = await cdp.send('Target.attachToTarget', { targetId: target.targetId, flatten: false });
    const call = (method) => new Promise((resolve) => {
      const id = nextId++;
      const timer = setTimeout(() => done(null), 5_000);
      const listener = (event) => {
        if (event.sessionId !== sessionId) return;
        const message = JSON.parse(event.message);
        if (message.id === id) done(message.result ?? null);
      };
      const done = (value) => {
        clearTimeout(timer);
        cdp.off('Target.receivedMessageFromTarget', listener);
        resolve(value);
      };
      cdp.on('Target.receivedMessageFromTarget', listener);
      cdp.send('Target.sendMessageToTarget', { sessionId, message: JSON.stringify({ id, method }) }).catch(() => done(null));
    });
    if (collect) await call('HeapProfiler.collectGarbage');
    const usage = await call('Runtime.getHeapUsage');
    heaps[`${target.type} ${new URL(target.url).pathname.slice(1)}`] = usage && { used: usage.usedSize, total: usage.totalSize, backing: usage.backingStorageSize ?? null };
    await cdp.send('Target.detachFromTarget', { sessionId }).catch(() => {});
  }
  return heaps;
}

/**
 * Chromium's own accounts of its processes' memory by allocator (memory-infra, over CDP's Tracing):
 * start(), then dump() as often as wanted (each asks every process for a detailed dump), then stop(),
 * which returns the dumps: [{ t (ms since the epoch, when asked), pid, allocators: { name: bytes } }],
 * the allocators named by their path (`partition_alloc/partitions/array_buffer`, `malloc`,
 * `v8/main/heap`, ...), each with its `size`.
 */
export function memoryDumps(context) {
  let cdp;
  const asked = [];
  return {
    async start() {
      cdp = await browserSession(context);
      await cdp.send('Tracing.start', {
        transferMode: 'ReturnAsStream',
        traceConfig: { includedCategories: ['disabled-by-default-memory-infra'], excludedCategories: ['*'], memoryDumpConfig: { triggers: [] } },
      });
    },
    async dump() {
      const t = Date.now();
      const { dumpGuid, success } = await cdp.send('Tracing.requestMemoryDump', { deterministic: false, levelOfDetail: 'detailed' });
      if (success) asked.push({ t, dumpGuid });
    },
    async stop() {
      const complete = new Promise((resolve) => cdp.once('Tracing.tracingComplete', resolve));
      await cdp.send('Tracing.end');
      const { stream } = await complete;
      let text = '';
      for (;;) {
        const { data, eof, base64Encoded } = await cdp.send('IO.read', { handle: stream, size: 1 << 20 });
        text += base64Encoded ? Buffer.from(data, 'base64').toString('utf8') : data;
        if (eof) break;
      }
      await cdp.send('IO.close', { handle: stream });
      const events = JSON.parse(text).traceEvents ?? [];
      const when = new Map(asked.map((a) => [a.dumpGuid, a.t]));
      return events
        .filter((e) => e.ph === 'v' && e.args?.dumps?.allocators && when.has(e.id))
        .map((e) => ({
          t: when.get(e.id),
          pid: e.pid,
          allocators: Object.fromEntries(Object.entries(e.args.dumps.allocators)
            .filter(([, a]) => a.attrs?.size)
            .map(([name, a]) => [name, parseInt(a.attrs.size.value, 16)])),
        }));
    },
  };
}
