"""Where a Chromium extension renderer's memory grows, by mapping (tools/gpu-bench/README.md).

    python3 renderer_maps.py [--every 0.25] -- COMMAND...

Runs COMMAND; meanwhile reads /proc/PID/smaps of every process started with --extension-process. Then,
per renderer: its resident memory by kind of mapping over time, and the mappings that grew most from its
lowest sample to its highest (by start address). Kinds: `aligned`, anonymous mappings that start on a
4 GiB boundary (wasm memories, reserved with their guard regions, and V8's cages); `shared`, shared
memory (what the renderer shares with the GPU process: mapped and uploaded buffers, command transfer);
`anon<1M` ... `anon>=64M`, other anonymous memory by mapping size (malloc, PartitionAlloc, array
buffers, V8's pages); `file`, mapped files (code).
"""
import argparse, os, re, subprocess, sys, time

ap = argparse.ArgumentParser()
ap.add_argument('--every', type=float, default=0.25)
ap.add_argument('command', nargs=argparse.REMAINDER)
a = ap.parse_args()
cmd = a.command[1:] if a.command[:1] == ['--'] else a.command
head = re.compile(r'^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$')

def renderers():
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                c = open(f'/proc/{p}/cmdline', 'rb').read()
            except OSError:
                continue
            if b'--extension-process' in c and b'--type=renderer' in c:
                yield int(p)

def maps(pid):
    out, cur = {}, None
    with open(f'/proc/{pid}/smaps') as f:
        for line in f:
            m = head.match(line)
            if m:
                start, end = int(m[1], 16), int(m[2], 16)
                cur = [end - start, m[3], m[4] or '[anon]', 0]
                out[start] = cur
            elif line.startswith('Rss:'):
                cur[3] = int(line.split()[1]) * 1024
    return out

def kind(start, size, name):
    if 'memfd' in name or 'shared' in name:
        return 'shared'
    if name != '[anon]':
        return 'file'
    if start % (1 << 32) == 0:
        return 'aligned'  # wasm memories (reserved with guard regions) and V8's cages start at 4 GiB
    return 'anon<1M' if size < 2**20 else 'anon<8M' if size < 8 * 2**20 else 'anon<64M' if size < 64 * 2**20 else 'anon>=64M'

KINDS = ['aligned', 'shared', 'anon<1M', 'anon<8M', 'anon<64M', 'anon>=64M', 'file']

def classes(m):
    out = dict.fromkeys(KINDS, 0)
    for start, (size, perms, name, rss) in m.items():
        out[kind(start, size, name)] += rss
    return out

timeline = {}
child = subprocess.Popen(cmd)
t0 = time.time()
samples = {}  # pid -> [(t, total rss, maps)]
while child.poll() is None:
    for pid in renderers():
        try:
            m = maps(pid)
        except OSError:
            continue
        samples.setdefault(pid, []).append((time.time() - t0, sum(v[3] for v in m.values()), m))
        timeline.setdefault(pid, []).append((time.time() - t0, classes(m)))
        # Memory bounded: the highest so far, the lowest before it, the lowest of all (for a higher peak
        # to come) and the newest.
        s = samples[pid]
        if len(s) > 4:
            hi = max(range(len(s)), key=lambda i: s[i][1])
            lo = min(range(hi + 1), key=lambda i: s[i][1])
            low = min(range(len(s)), key=lambda i: s[i][1])
            samples[pid] = [s[i] for i in sorted({lo, hi, low, len(s) - 1})]
    time.sleep(a.every)
rc = child.returncode
GB = 1e9
for pid, s in samples.items():
    hi = max(range(len(s)), key=lambda i: s[i][1])
    lo = min(range(hi + 1), key=lambda i: s[i][1])
    (tl, rl, ml), (th, rh, mh) = s[lo], s[hi]
    print(f'renderer {pid}: lowest {rl / GB:.3f} GB at {tl:.1f} s, highest {rh / GB:.3f} GB at {th:.1f} s')
    rows = []
    for start, (size, perms, name, rss) in mh.items():
        before = ml.get(start)
        grew = rss - (before[3] if before else 0)
        rows.append((grew, start, size, perms, name, rss, 'new' if before is None else f'was {before[3] / 2**20:.0f} MiB'))
    gone = sum(v[3] for k, v in ml.items() if k not in mh)
    rows.sort(reverse=True)
    big = sum(r[0] for r in rows if r[2] >= 64 * 2**20)
    print(f'  grown in mappings of 64 MiB or more: {big / GB:.3f} GB; in smaller ones: {(sum(r[0] for r in rows) - big) / GB:.3f} GB; mappings gone: {gone / GB:.3f} GB')
    by = dict.fromkeys(KINDS, 0)
    for grew, start, size, perms, name, rss, was in rows:
        by[kind(start, size, name)] += grew
    print('  grown by kind (MiB): ' + ', '.join(f'{k} {v / 2**20:.0f}' for k, v in by.items()))
    print('  timeline (s: MiB by kind ' + ' '.join(KINDS) + '):')
    for t, c in timeline[pid][::2]:
        print(f'    {t:6.1f}: ' + ' '.join(f'{c[k] / 2**20:6.0f}' for k in KINDS))
    for grew, start, size, perms, name, rss, was in [r for r in rows if r[0] > 2**20][:30]:
        print(f'  {grew / 2**20:8.1f} MiB  at {start:#x}  size {size / 2**20:10.1f} MiB  {perms}  rss {rss / 2**20:8.1f} MiB  {was}  {name}')
sys.exit(rc)
