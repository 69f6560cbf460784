#!/usr/bin/env python3
"""Self-check of the fixture packs and the reference.

    python3 tests/reference/selfcheck.py [--packs tests/fixtures/packs] [--keep DIR]

1. make_packs.py is deterministic (two runs into temporary folders are byte-identical) and the
   committed packs are what it writes.
2. For every variant: a made-up trace (chat-template-like ids, numpy noise, the reference's own
   sigmas) goes through the reference CLI at 512x512, 4 steps, and gives a real picture
   (pixel std > 20, many colours, not saturated).
3. Mistakes an app could make each change the picture: negated sigmas, two text ids swapped, one id
   changed, another pad id, a wrong mask, txt_ids on the wrong axis, img_ids with h and w swapped, sigma*1000 as the
   timestep, a token-order (unpack) mistake, a wrong unpatchify channel order (32-channel decoder).
4. The reference refuses bad traces (wrong schedule, ids not 512 long, wrong noise size).
Exits non-zero on any failure.
"""

import argparse
import base64
import filecmp
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import reference as ref  # noqa: E402

FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILS.append(what)


def make_ids(rng, words=20):
    body = [151644, 872, 198] + rng.integers(0, 151643, words).tolist() + \
           [151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271]
    ids = body + [ref.PAD_ID] * (512 - len(body))
    mask = [1] * len(body) + [0] * (512 - len(body))
    return np.array(ids, np.int64), np.array(mask, np.int64)


def make_trace(width, height, steps=4, schedule="empirical", seed=7):
    rng = np.random.default_rng(seed)
    ids, mask = make_ids(rng)
    n = (width // 16) * (height // 16)
    noise = rng.standard_normal((1, 128, height // 16, width // 16)).astype(np.float32)
    packed = noise.reshape(1, 128, n).transpose(0, 2, 1)
    sigmas, _ = ref.schedule_sigmas(schedule, n, steps)
    return {"job": "selfcheck", "png": "", "prompt": "selfcheck", "seed": str(seed),
            "width": width, "height": height, "steps": steps, "schedule": schedule,
            "tokenCount": int(mask.sum()), "truncated": False,
            "trace": {"inputIds": ids.tolist(), "attentionMask": mask.tolist(),
                      "sigmas": [float(s) for s in sigmas],
                      "noise": base64.b64encode(packed.astype("<f4").tobytes()).decode()}}


def image_stats(rgba):
    rgb = rgba[..., :3].astype(np.float64)
    colours = len(np.unique(rgba[..., :3].reshape(-1, 3), axis=0))
    saturated = float(np.mean((rgba[..., :3] == 0) | (rgba[..., :3] == 255)))
    return rgb.std(), colours, saturated


def diff(a, b):
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return int(d.max()), float(np.mean(d.max(axis=-1) > 0)), float(d.mean())


def run_cli(pack, trace, out, extra=()):
    tr = os.path.join(os.path.dirname(out), "trace.json")
    with open(tr, "w") as fh:
        json.dump(trace, fh)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, os.path.join(HERE, "reference.py"), "--pack", pack,
                        "--trace", tr, "--out", out, *extra], capture_output=True, text=True)
    return p.returncode, p.stderr.strip(), time.perf_counter() - t


def check_determinism(packs):
    mk = os.path.join(ROOT, "tests", "fixtures", "make_packs.py")
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        for d in (a, b):
            subprocess.run([sys.executable, mk, "--out", d], check=True, capture_output=True)
        for variant in sorted(os.listdir(a)):
            files = sorted(os.listdir(os.path.join(a, variant)))
            same = all(filecmp.cmp(os.path.join(a, variant, f), os.path.join(b, variant, f), shallow=False)
                       for f in files)
            check(same, f"make_packs.py deterministic ({variant}: {len(files)} files)")
            committed = os.path.join(packs, variant)
            same = os.path.isdir(committed) and sorted(os.listdir(committed)) == files and all(
                filecmp.cmp(os.path.join(a, variant, f), os.path.join(committed, f), shallow=False)
                for f in files)
            check(same, f"{committed} is what make_packs.py writes")


def perturbed(pack, trace, **patch):
    """Runs generate() with some module functions of the reference swapped for wrong ones."""
    saved = {k: getattr(ref, k) for k in patch if hasattr(ref, k)}
    ids, mask, sigmas, noise = ref.check_trace(trace)
    ids, mask, sigmas, noise = (patch.pop("ids", ids), patch.pop("mask", mask),
                                patch.pop("sigmas", sigmas), patch.pop("noise", noise))
    for k, v in patch.items():
        setattr(ref, k, v)
    try:
        return ref.to_rgba(ref.generate(pack, ids, mask, sigmas, noise, trace["width"], trace["height"]))
    finally:
        for k, v in saved.items():
            setattr(ref, k, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--packs", default=os.path.join(ROOT, "tests", "fixtures", "packs"))
    ap.add_argument("--keep", help="keep the images in this folder")
    args = ap.parse_args()
    check_determinism(args.packs)
    from PIL import Image

    work = args.keep or tempfile.mkdtemp(prefix="selfcheck-")
    os.makedirs(work, exist_ok=True)
    for variant in ("f32", "f32-vae32", "f16"):
        pack = os.path.join(args.packs, variant)
        print(f"--- {variant}")
        trace = make_trace(512, 512)
        out = os.path.join(work, f"{variant}-512.png")
        rc, err, secs = run_cli(pack, trace, out, ["--raw", os.path.join(work, f"{variant}-512.npy")])
        check(rc == 0, f"reference CLI 512x512 4 steps: rc {rc}, {secs:.2f} s wall ({err.splitlines()[0] if err else ''})")
        if rc:
            print(err)
            continue
        img = np.asarray(Image.open(out))
        check(img.shape == (512, 512, 4) and np.all(img[..., 3] == 255), f"RGBA 512x512, alpha 255: {img.shape}")
        std, colours, sat = image_stats(img)
        check(std > 20 and colours > 1000 and sat < 0.05,
              f"picture: pixel std {std:.1f}, {colours} colours, {sat:.2%} saturated channels")
        raw = np.load(os.path.join(work, f"{variant}-512.npy"))
        check(np.array_equal(ref.to_rgba(raw), img), "--raw matches the PNG")

        # mistakes, at 256x256 (cheaper); the picture must change visibly
        small = make_trace(256, 192, seed=11)
        base = perturbed(pack, small)
        ids = np.array(small["trace"]["inputIds"])
        mask = np.array(small["trace"]["attentionMask"])
        sig = np.array(small["trace"]["sigmas"], np.float32)
        h, w = 192 // 16, 256 // 16
        swapped = ids.copy()
        swapped[[4, 5]] = swapped[[5, 4]]
        changed = ids.copy()
        changed[6] += 1
        otherpad = np.where(mask == 1, ids, 151645)
        def tid_axis0(n=512):
            t = np.zeros((1, n, 4), np.int64)
            t[0, :, 0] = np.arange(n)
            return t
        orig_img_ids = ref.img_ids
        def iid_swapped(hh, ww):
            t = orig_img_ids(ww, hh)[..., [0, 2, 1, 3]]
            return t
        def unpack_colmajor(x, hh, ww):
            return np.ascontiguousarray(x.reshape(1, ww, hh, 128).transpose(0, 3, 2, 1))
        def unpatchify_wrong(z):
            b, c4, hh, ww = z.shape
            z = z.reshape(b, 2, 2, c4 // 4, hh, ww).transpose(0, 3, 4, 1, 5, 2)
            return np.ascontiguousarray(z.reshape(b, c4 // 4, 2 * hh, 2 * ww))
        noise2 = np.random.default_rng(99).standard_normal((1, h * w, 128)).astype(np.float32)
        cases = {
            "sigmas negated": dict(sigmas=-sig),
            "sigma*1000 fed as timestep (dt unchanged)": None,
            "two text ids swapped": dict(ids=swapped),
            "one text id changed by 1": dict(ids=changed),
            "pads 151645 instead of 151643": dict(ids=otherpad),
            "mask all ones": dict(mask=np.ones_like(mask)),
            "mask one shorter": dict(mask=np.where(np.arange(512) == mask.sum() - 1, 0, mask)),
            "txt_ids on axis 0": dict(txt_ids=tid_axis0),
            "img_ids h/w swapped": dict(img_ids=iid_swapped),
            "tokens unpacked column-major": dict(unpack=unpack_colmajor),
            "other noise": dict(noise=noise2),
        }
        if variant == "f32-vae32":
            cases["unpatchify channel order (dy,dx,c)"] = dict(unpatchify=unpatchify_wrong)
        for name, patch in cases.items():
            if patch is None:
                # timestep = sigma*1000 but the update still uses sigma: wrap the transformer run
                orig_run = ref.Graph.run
                def run_x1000(self, feeds, output, _orig=orig_run):
                    if "timestep" in feeds:
                        feeds = dict(feeds, timestep=feeds["timestep"] * np.float32(1000))
                    return _orig(self, feeds, output)
                ref.Graph.run = run_x1000
                try:
                    img2 = perturbed(pack, small)
                finally:
                    ref.Graph.run = orig_run
            else:
                img2 = perturbed(pack, small, **patch)
            mx, frac, mean = diff(base, img2)
            check(mx >= 8 and frac > 0.05,
                  f"{name}: max diff {mx}, {frac:.1%} pixels differ, mean abs diff {mean:.2f}")
            if args.keep:
                slug = "".join(ch if ch.isalnum() else "-" for ch in name)
                Image.fromarray(img2).save(os.path.join(work, f"{variant}-256x192-{slug}.png"))
        if args.keep:
            Image.fromarray(base).save(os.path.join(work, f"{variant}-256x192.png"))

    # bad traces are refused
    pack = os.path.join(args.packs, "f32")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "x.png")
        t = make_trace(256, 256, schedule="linear-shift")
        t["schedule"] = "empirical"
        rc, err, _ = run_cli(pack, t, out)
        check(rc != 0 and "sigmas differ" in err, f"linear-shift sigmas labelled empirical refused: {err[:90]}")
        t = make_trace(256, 256)
        t["trace"]["sigmas"][2] += 2e-6
        rc, err, _ = run_cli(pack, t, out)
        check(rc != 0 and "sigmas differ" in err, "sigma off by 2e-6 refused")
        t = make_trace(256, 256)
        t["trace"]["inputIds"] = t["trace"]["inputIds"][:500]
        rc, err, _ = run_cli(pack, t, out)
        check(rc != 0 and "512" in err, f"ids not 512 long refused: {err[:90]}")
        t = make_trace(256, 256)
        t["trace"]["noise"] = base64.b64encode(base64.b64decode(t["trace"]["noise"])[:-512]).decode()
        rc, err, _ = run_cli(pack, t, out)
        check(rc != 0 and "noise" in err, f"noise of the wrong size refused: {err[:90]}")
        t = make_trace(256, 256, schedule="linear-shift")
        rc, err, _ = run_cli(pack, t, out)
        check(rc == 0, "linear-shift trace accepted")

    print(f"images in {work}" if args.keep else "")
    print("selfcheck: " + ("all ok" if not FAILS else f"{len(FAILS)} FAILED"))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
