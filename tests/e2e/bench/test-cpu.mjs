// `cargo xtask bench test-cpu [NAME...]`: where the browser tests' CPU time goes. Each test file (all of
// them, or the named ones; xtask finds them as `e2e` does) runs alone, as `cargo xtask e2e` runs it
// (`node --test`, with the tests' Chromium flags: IMAGINE_TEST_FLAGS), while the machine's busy CPU time
// is read from /proc/stat and split by process: the CPU time of every process the test started, and of
// theirs (/proc/<pid>/stat), sampled twice a second and classed by its command line (Chromium's GPU
// process, which runs SwiftShader's WebGPU; the extension's renderer, which runs its pages, stage
// workers and ORT's wasm; Chromium's other processes; Firefox's parent process, which runs lavapipe's
// WebGPU, and its content processes; node; Python). Printed per file and in all, the busiest first.
//
// The question it answers: CI runs the browser tests a few at a time on 2 cores, all of them busy, so
// the sum of the files' CPU time over 2 is the least the browser tests can take there; which cut shortens it?
// Run it with the machine otherwise idle: the busy time is the whole machine's (the split, the test's own).

import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { ROOT } from '../lib/config.mjs';

const HZ = 100; // USER_HZ: the unit of /proc's CPU times on Linux
const SAMPLE_MS = 500;

/** The machine's busy CPU ticks: all but idle and iowait. */
function busyTicks() {
  const [, ...fields] = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/);
  const v = fields.map(Number);
  return v.reduce((a, b) => a + b, 0) - v[3] - v[4];
}

/** A process's parent and its user + system ticks, or null once it is gone. */
function processStat(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { parent: fields[1], ticks: Number(fields[11]) + Number(fields[12]) };
  } catch {
    return null;
  }
}

/** What a process is, from its command line (Chromium rewrites its own into one line with spaces). */
function processClass(pid) {
  let cmd;
  try {
    cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
  } catch {
    return null;
  }
  const exe = path.basename(cmd.split(' ')[0]);
  if (/chrom/.test(cmd.split(' ')[0]) || exe === 'exe') {
    const type = cmd.match(/--type=([a-z-]+)/)?.[1];
    if (!type) return 'chromium browser';
    if (type === 'gpu-process') return 'chromium GPU (SwiftShader)';
    if (type === 'renderer') return cmd.includes('--extension-process') ? 'chromium extension renderer' : 'chromium other renderers';
    return `chromium ${type}`;
  }
  if (/firefox/.test(exe)) return cmd.includes('-contentproc') ? (/ tab$/.test(cmd.trim()) ? 'firefox content' : 'firefox other') : 'firefox parent (lavapipe)';
  if (exe === 'node') return 'node';
  if (/^python/.test(exe)) return 'python';
  return 'other';
}

/**
 * Runs `file` alone; its wall time, the machine's busy CPU seconds and those of each class of the test's
 * processes (the test's node and what it started, and so on down).
 */
async function measure(file) {
  const lastTicks = new Map(); // the test's processes: pid -> CPU ticks at the last sample
  const others = new Set(fs.readdirSync('/proc')); // pids that are not the test's
  const byClass = {};
  let child;
  const sample = () => {
    const stats = new Map();
    for (const d of fs.readdirSync('/proc')) {
      if (!/^\d+$/.test(d) || others.has(d)) continue;
      const stat = processStat(d);
      if (stat) stats.set(d, stat);
    }
    // The test's processes: its node and every process below it, found through their parents.
    const ours = (pid, depth = 0) =>
      pid === String(child.pid) || lastTicks.has(pid) || (depth < 32 && stats.has(pid) && ours(stats.get(pid).parent, depth + 1));
    for (const [d, { ticks }] of stats) {
      if (!ours(d)) {
        others.add(d);
        continue;
      }
      // Classed again at every sample: a process Chromium's zygote forks says what it is only later.
      const cls = processClass(d);
      if (!cls) continue;
      byClass[cls] = (byClass[cls] ?? 0) + ticks - (lastTicks.get(d) ?? 0);
      lastTicks.set(d, ticks);
    }
  };
  const busy0 = busyTicks();
  const t0 = Date.now();
  const timer = setInterval(sample, SAMPLE_MS);
  child = spawn(process.execPath, ['--test', '--test-timeout=1200000', file], {
    cwd: ROOT,
    env: { ...process.env, IMAGINE_TEST_FLAGS: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  const code = await new Promise((resolve) => child.on('close', resolve));
  sample();
  clearInterval(timer);
  const seconds = (ticks) => ticks / HZ;
  return {
    file: path.relative(path.join(ROOT, 'tests/e2e'), file),
    passed: code === 0,
    output: out,
    wallS: (Date.now() - t0) / 1000,
    busyS: seconds(busyTicks() - busy0),
    byClass: Object.fromEntries(Object.entries(byClass).map(([k, v]) => [k, seconds(v)])),
  };
}

// The test files' paths, as `cargo xtask bench test-cpu` finds them for the names it is given.
const files = process.argv.slice(2).map((f) => path.resolve(f));
if (files.length === 0) throw new Error('usage: node tests/e2e/bench/test-cpu.mjs FILE.test.mjs... (or cargo xtask bench test-cpu [NAME...])');
const results = [];
for (const file of files) {
  const r = await measure(file);
  results.push(r);
  const top = Object.entries(r.byClass).sort((a, b) => b[1] - a[1]).filter(([, s]) => s >= 1);
  console.log(`${r.file}: ${r.passed ? 'passed' : 'FAILED'}, ${r.wallS.toFixed(1)} s wall, ${r.busyS.toFixed(1)} CPU-s busy: ${top.map(([k, s]) => `${k} ${s.toFixed(0)}`).join(', ')}`);
  if (!r.passed) console.log(r.output.slice(-3000));
}

const classes = [...new Set(results.flatMap((r) => Object.keys(r.byClass)))];
const total = (f) => results.reduce((a, r) => a + f(r), 0);
const totals = Object.fromEntries(classes.map((c) => [c, total((r) => r.byClass[c] ?? 0)]));
const shown = classes.filter((c) => totals[c] >= 1).sort((a, b) => totals[b] - totals[a]);
const pad = (s, n) => String(s).padStart(n);
console.log(`\nCPU seconds per test file, each alone, the busiest first (columns: ${shown.join('; ')})`);
console.log(`${'file'.padEnd(36)} ${pad('wall s', 7)} ${pad('busy', 6)} ${shown.map((_, i) => pad(`c${i + 1}`, 6)).join(' ')}`);
for (const r of [...results].sort((a, b) => b.busyS - a.busyS)) {
  console.log(`${r.file.padEnd(36)} ${pad(r.wallS.toFixed(0), 7)} ${pad(r.busyS.toFixed(0), 6)} ${shown.map((c) => pad((r.byClass[c] ?? 0).toFixed(0), 6)).join(' ')}`);
}
const busy = total((r) => r.busyS);
console.log(`${'all'.padEnd(36)} ${pad(total((r) => r.wallS).toFixed(0), 7)} ${pad(busy.toFixed(0), 6)} ${shown.map((c) => pad(totals[c].toFixed(0), 6)).join(' ')}`);
shown.forEach((c, i) => console.log(`  c${i + 1}: ${c}, ${((100 * totals[c]) / busy).toFixed(0)} % of the busy time`));
console.log(`the least the browser tests can take on 2 busy cores: ${(busy / 2).toFixed(0)} s`);
process.exitCode = results.every((r) => r.passed) ? 0 : 1;
