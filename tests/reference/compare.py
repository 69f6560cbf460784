#!/usr/bin/env python3
"""Compares two images channel by channel.

    python3 tests/reference/compare.py A.png B.png [--tol N] [--max-pixels K]

Either argument may also be a GenerateResult JSON (its base64 `png` field is used; a
`{"status":"done","result":{...}}` job state works too). Both are read as RGBA. Prints the largest
absolute channel difference and how many pixels differ at all; exits 1 when the largest difference
exceeds --tol (default 0) or more than --max-pixels pixels differ by more than --tol, 2 when the
images cannot be compared (unreadable, different sizes).
"""

import argparse
import base64
import io
import json
import sys

import numpy as np
from PIL import Image


def load(path):
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:1] in (b"{", b"[") or path.endswith(".json"):
        doc = json.loads(data)
        if isinstance(doc.get("result"), dict):
            doc = doc["result"]
        data = base64.b64decode(doc["png"])
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGBA"))


def main(argv=None):
    ap = argparse.ArgumentParser(description="Max abs channel difference between two images.")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tol", type=int, default=0, help="largest channel difference allowed (0-255)")
    ap.add_argument("--max-pixels", type=int, default=0,
                    help="pixels allowed to exceed --tol (default 0)")
    args = ap.parse_args(argv)
    try:
        a, b = load(args.a), load(args.b)
    except Exception as e:  # noqa: BLE001 - report any unreadable input the same way
        print(f"compare: cannot read: {e}", file=sys.stderr)
        return 2
    if a.shape != b.shape:
        print(f"compare: sizes differ: {a.shape[1]}x{a.shape[0]} vs {b.shape[1]}x{b.shape[0]}")
        return 2
    d = np.abs(a.astype(np.int16) - b.astype(np.int16)).max(axis=-1)
    mx = int(d.max())
    differing = int(np.count_nonzero(d))
    beyond = int(np.count_nonzero(d > args.tol))
    print(f"max abs channel difference {mx}; {differing} of {d.size} pixels differ; "
          f"{beyond} beyond tolerance {args.tol}; mean abs difference {float(d.mean()):.4f}")
    if beyond > args.max_pixels:
        print("compare: FAIL")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
