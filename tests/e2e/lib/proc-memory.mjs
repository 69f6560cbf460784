// Memory and CPU of a Chromium launched by the harness, from /proc: RSS (VmRSS) and CPU seconds of
// the browser process and its descendants, by process kind. Used by `cargo xtask bench download` and
// `cargo xtask bench scale`.
//
// Kinds: extension (renderer of the extension: offscreen document, its workers, the popup), gpu,
// network, storage, utility (other utilities), renderer (ordinary pages), browser.

import fs from 'node:fs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Number of CPU cores of this machine. */
export function cpuCores() {
  return fs.readFileSync('/proc/cpuinfo', 'utf8').split('\n').filter((l) => l.startsWith('processor')).length;
}

/** CPU seconds (user + system) a process has used so far. */
function cpuSeconds(pid) {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100; // utime, stime in clock ticks (USER_HZ = 100)
}

/** CPU seconds this Node process (the bench and the fake Hub in it) has used so far. */
function cpuOfNode() {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1e6;
}

/** The pids of `root` and all its descendants (all of /proc read once). */
export function processTree(root) {
  const parent = new Map();
  for (const p of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${p}/stat`, 'utf8');
      parent.set(Number(p), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {}
  }
  const tree = new Set([root]);
  let grew = true;
  while (grew) {
    grew = false;
    for (const [pid, pp] of parent) if (!tree.has(pid) && tree.has(pp)) tree.add(pid), (grew = true);
  }
  return tree;
}

/**
 * Samples the browser launched on `profileDir` and its descendants every `intervalMs` until stop().
 * mark() ends a segment and summarises it; `history` keeps every sample as { t (ms since the epoch),
 * rss: { kind: bytes }, parts: { kind: { anon, file, shmem } } } for benchmarks that cut the timeline
 * afterwards (summarize()); `parts` splits VmRSS into its anonymous memory (heaps: JS, wasm), mapped
 * files and shared memory (such as the buffers a renderer shares with the GPU process). `field`: the
 * line of /proc/PID/status read as a process's memory (VmRSS; RssAnon leaves out shared memory).
 */
export function startSampler(profileDir, intervalMs, field = 'VmRSS') {
  const memoryLine = new RegExp(`${field}:\\s+(\\d+) kB`);
  const PARTS = { anon: /RssAnon:\s+(\d+) kB/, file: /RssFile:\s+(\d+) kB/, shmem: /RssShmem:\s+(\d+) kB/ };
  const seen = new Map();
  const history = [];
  let segment = [];
  let running = true;
  const kindOf = new Map();
  const classify = (pid, cmd) => {
    if (!cmd.includes('--type=')) return 'browser';
    if (cmd.includes('--type=gpu-process')) return 'gpu';
    if (cmd.includes('--type=utility')) {
      if (/network\.mojom\.NetworkService/.test(cmd)) return 'network';
      if (/storage\.mojom\.StorageService/.test(cmd)) return 'storage';
      return 'utility';
    }
    if (cmd.includes('--type=renderer')) return cmd.includes('--extension-process') ? 'extension' : 'renderer';
    return 'utility';
  };
  const findBrowser = () => {
    for (const p of fs.readdirSync('/proc')) {
      if (!/^\d+$/.test(p)) continue;
      try {
        const cmd = fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').replace(/\0/g, ' ');
        if (cmd.includes(`--user-data-dir=${profileDir}`) && !cmd.includes('--type=')) return Number(p);
      } catch {}
    }
    return null;
  };
  // The process tree is walked once a second (all of /proc); in between only its processes are read,
  // so that sampling takes little of the CPU the benchmark measures.
  let tree = null;
  let treeAt = 0;
  const processes = (root) => {
    if (!tree || Date.now() - treeAt > 1000) {
      tree = processTree(root);
      treeAt = Date.now();
    }
    return tree;
  };
  const sample = (root) => {
    const byKind = {};
    const parts = {};
    const cpuByKind = {};
    for (const pid of processes(root)) {
      try {
        if (!kindOf.has(pid)) {
          const cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
          if (!cmd.includes('chrom')) continue; // crashpad handlers etc. are chromium too; shells are not
          const k = classify(pid, cmd);
          kindOf.set(pid, k);
          seen.set(k, (seen.get(k) ?? 0) + 1);
        }
        const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
        const kind = kindOf.get(pid);
        const m = memoryLine.exec(status);
        if (m) byKind[kind] = (byKind[kind] ?? 0) + Number(m[1]) * 1024;
        const of = (parts[kind] ??= { anon: 0, file: 0, shmem: 0 });
        for (const [part, line] of Object.entries(PARTS)) of[part] += Number(line.exec(status)?.[1] ?? 0) * 1024;
        cpuByKind[kindOf.get(pid)] = (cpuByKind[kindOf.get(pid)] ?? 0) + cpuSeconds(pid);
      } catch {}
    }
    cpuByKind.node = cpuOfNode();
    const x = { t: Date.now(), rss: byKind, cpu: cpuByKind };
    history.push({ t: x.t, rss: byKind, parts });
    return x;
  };
  const root = findBrowser();
  if (!root) throw new Error(`no browser process with --user-data-dir=${profileDir}`);
  const loop = (async () => {
    while (running) {
      segment.push(sample(root));
      await sleep(intervalMs);
    }
  })();
  // The download's processes: the extension renderer (offscreen document, its workers, the popup), the
  // GPU process, the network and storage services, other utilities. Not the browser process (added
  // in the "with browser" sum) nor renderers of ordinary pages (none do anything here).
  const sumOf = (s, all) => Object.entries(s).reduce((n, [k, v]) => n + (all || (k !== 'browser' && k !== 'renderer') ? v : 0), 0);
  const median = (xs) => {
    const a = [...xs].sort((x, y) => x - y);
    return a.length ? a[Math.floor(a.length / 2)] : 0;
  };
  return {
    seen,
    history,
    /** Ends the current segment; returns its summary. */
    mark() {
      // A sample at each boundary, also when the segment's work kept the sampling loop waiting.
      const last = sample(root);
      segment.push(last);
      const s = segment.map((x) => x.rss);
      const cpuFirst = segment[0].cpu;
      const cpuLast = last.cpu;
      segment = [last];
      const kinds = new Set(s.flatMap((x) => Object.keys(x)));
      const med = {};
      const peak = {};
      for (const k of kinds) {
        med[k] = median(s.map((x) => x[k] ?? 0));
        peak[k] = Math.max(...s.map((x) => x[k] ?? 0));
      }
      const cpu = {};
      for (const k of Object.keys(cpuLast)) cpu[k] = cpuLast[k] - (cpuFirst[k] ?? 0);
      return {
        samples: s.length,
        cpu,
        median: med,
        peakByKind: peak,
        medianSum: median(s.map((x) => sumOf(x, false))),
        medianAll: median(s.map((x) => sumOf(x, true))),
        peakSum: Math.max(0, ...s.map((x) => sumOf(x, false))),
        peakAll: Math.max(0, ...s.map((x) => sumOf(x, true))),
      };
    },
    async stop() {
      running = false;
      await loop;
    },
  };
}

/**
 * Peak RSS by kind over the samples of `history` with from <= t <= to (bytes; 0 where none), and the
 * number of samples.
 */
export function peakBetween(history, from, to) {
  const peak = {};
  let n = 0;
  for (const x of history) {
    if (x.t < from || x.t > to) continue;
    n++;
    for (const [k, v] of Object.entries(x.rss)) peak[k] = Math.max(peak[k] ?? 0, v);
  }
  return { peak, samples: n };
}

/** Median RSS by kind over the samples with from <= t <= to. */
export function medianBetween(history, from, to) {
  const by = {};
  for (const x of history) {
    if (x.t < from || x.t > to) continue;
    for (const [k, v] of Object.entries(x.rss)) (by[k] ??= []).push(v);
  }
  const med = {};
  for (const [k, xs] of Object.entries(by)) {
    xs.sort((a, b) => a - b);
    med[k] = xs[Math.floor(xs.length / 2)];
  }
  return med;
}
