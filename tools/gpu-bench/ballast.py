#!/usr/bin/env python3
"""Makes the GPU a small one: holds all but --free-gb of its memory until killed.

    python3 tools/gpu-bench/ballast.py --free-gb 8 [--device 0]

Allocates 256 MiB blocks with torch on CUDA until no more than --free-gb remains free
(`torch.cuda.mem_get_info`), prints `ballast: holding X GB, Y GB free` and then sleeps; every later
allocation on that GPU, Chromium's included, sees only what is left (the driver refuses the rest). Used
by `tests/e2e/bench/memory.mjs --free-gb` on the GPU machine.
"""

import argparse
import signal
import sys
import time

import torch

BLOCK = 256 << 20
GB = 1_000_000_000


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--free-gb", type=float, required=True)
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("ballast: torch sees no CUDA device", flush=True)
        return 2
    device = torch.device("cuda", args.device)
    want_free = int(args.free_gb * GB)
    blocks = []
    while True:
        free, _total = torch.cuda.mem_get_info(device)
        if free - BLOCK < want_free:
            break
        blocks.append(torch.empty(BLOCK, dtype=torch.uint8, device=device))
    # The last bit, to within a MiB of the target.
    free, _total = torch.cuda.mem_get_info(device)
    rest = free - want_free
    if rest > (1 << 20):
        blocks.append(torch.empty(rest, dtype=torch.uint8, device=device))
    free, total = torch.cuda.mem_get_info(device)
    held = sum(b.numel() for b in blocks)
    print(f"ballast: holding {held / GB:.2f} GB, {free / GB:.2f} GB free of {total / GB:.2f} GB", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
