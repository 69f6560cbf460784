#!/usr/bin/env python3
"""The converted float16 transformer against the float32-activation export of the same weights.

    python3 tools/gpu-bench/compare_transformer.py --reference F32_DIR/transformer_q8.onnx \
        --converted F16_DIR/transformer_q8.f32.onnx --work DIR [--size 256] [--text 512] [--seed 7] \
        [--cpu] [--node NODE --ort-dir DIR [--dawn dawn.node] [--ep webgpu|wasm] [--build jspi]] \
        [--json FILE] [--min-cosine 0.999]

Makes one set of feeds from `--seed` (numpy): latents for a `--size` px image ((size/16)^2 tokens of
128), `--text` tokens of text-encoder width (read from the graph), timestep 0.7, the pipeline's
image and text position ids; float values rounded through float16, so the float16 pack could take
the same values. Runs both graphs on them with onnxruntime CPU (`--cpu`) and/or ORT Web
(`run_graph.mjs` in Node: WebGPU through Dawn, or wasm), and prints cosine and max abs difference
of `noise_pred` per runtime, plus the runtimes against each other. Exit 1 when a cosine is below
`--min-cosine`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))


def external_files(graph):
    """The external-data files `graph` references, in first-use order (what ORT Web needs)."""
    m = onnx.load(graph, load_external_data=False)
    files = []
    for t in m.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = next(e.value for e in t.external_data if e.key == "location")
            if loc not in files:
                files.append(loc)
    return files


def text_width(graph):
    m = onnx.load(graph, load_external_data=False)
    i = next(i for i in m.graph.input if i.name == "encoder_hidden_states")
    return i.type.tensor_type.shape.dim[2].dim_value


def make_feeds(width, size, text, seed):
    side = size // 16
    n = side * side
    rng = np.random.default_rng(seed)
    f16 = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    hs = f16(rng.standard_normal((1, n, 128), dtype=np.float32))
    enc = f16(rng.standard_normal((1, text, width), dtype=np.float32))
    t = np.array([0.7], dtype=np.float32).astype(np.float16).astype(np.float32)
    hh, ww = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")
    img_ids = np.zeros((1, n, 4), dtype=np.int64)
    img_ids[0, :, 1], img_ids[0, :, 2] = hh.ravel(), ww.ravel()
    txt_ids = np.zeros((1, text, 4), dtype=np.int64)
    txt_ids[0, :, 3] = np.arange(text)
    return {"hidden_states": hs, "encoder_hidden_states": enc, "timestep": t, "img_ids": img_ids, "txt_ids": txt_ids}


def write_feeds(feeds, work):
    spec = []
    for name, arr in feeds.items():
        f = f"feed-{name}.bin"
        np.ascontiguousarray(arr).tofile(os.path.join(work, f))
        spec.append({"name": name, "dtype": {"float32": "float32", "int64": "int64"}[str(arr.dtype)],
                     "dims": list(arr.shape), "file": f})
    path = os.path.join(work, "feeds.json")
    with open(path, "w") as fh:
        json.dump(spec, fh)
    return path


def compare(got, ref):
    got, ref = got.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    cos = float(got @ ref / (np.linalg.norm(got) * np.linalg.norm(ref) + 1e-300))
    return {"cosine": cos, "maxAbsDiff": float(np.abs(got - ref).max()), "refMaxAbs": float(np.abs(ref).max()),
            "finite": bool(np.all(np.isfinite(got)))}


def run_cpu(graph, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    t0 = time.time()
    s = ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"])
    t1 = time.time()
    out = s.run(None, {k: v for k, v in feeds.items() if k in {i.name for i in s.get_inputs()}})[0]
    return out.astype(np.float32), {"createS": round(t1 - t0, 1), "runS": round(time.time() - t1, 1)}


def run_web(a, graph, feeds_json, out):
    jspi = ["--experimental-wasm-jspi"] if a.build == "jspi" else []  # Node 24 needs it; Node 20 has no JSPI
    cmd = [a.node, *jspi, os.path.join(HERE, "run_graph.mjs"), "--graph", graph,
           "--feeds", feeds_json, "--out", out, "--ort-dir", a.ort_dir, "--ep", a.ep, "--build", a.build,
           "--external", ",".join(external_files(graph))]
    if a.dawn:
        cmd += ["--dawn", a.dawn]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    report = json.loads(r.stdout.strip().splitlines()[-1])
    return np.fromfile(out, dtype=np.float32), report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", required=True, help="the float32-activation export's transformer_q8.onnx")
    ap.add_argument("--converted", required=True, help="the converted float16 export's transformer_q8.f32.onnx")
    ap.add_argument("--work", required=True)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--text", type=int, default=512)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--node")
    ap.add_argument("--ort-dir")
    ap.add_argument("--dawn")
    ap.add_argument("--ep", default="webgpu", choices=("webgpu", "wasm"))
    ap.add_argument("--build", default="jspi", choices=("jspi", "asyncify"))
    ap.add_argument("--json")
    ap.add_argument("--min-cosine", type=float, default=0.999)
    a = ap.parse_args(argv)
    os.makedirs(a.work, exist_ok=True)
    width = text_width(a.reference)
    assert width == text_width(a.converted), "the two graphs take different text widths"
    feeds = make_feeds(width, a.size, a.text, a.seed)
    result = {"size": a.size, "imageTokens": (a.size // 16) ** 2, "textTokens": a.text, "textWidth": width,
              "seed": a.seed, "runs": {}, "comparisons": {}}
    outs = {}
    if a.cpu:
        import onnxruntime as ort

        for label, graph in (("reference", a.reference), ("converted", a.converted)):
            outs[f"cpu-{label}"], result["runs"][f"cpu-{label}"] = run_cpu(graph, feeds)
            result["runs"][f"cpu-{label}"]["onnxruntime"] = ort.__version__
            print(f"cpu {label}: {result['runs'][f'cpu-{label}']}", flush=True)
        result["comparisons"]["cpu: converted vs reference"] = compare(outs["cpu-converted"], outs["cpu-reference"])
    if a.node:
        feeds_json = write_feeds(feeds, a.work)
        for label, graph in (("reference", a.reference), ("converted", a.converted)):
            key = f"{a.ep}-{label}"
            outs[key], result["runs"][key] = run_web(a, graph, feeds_json, os.path.join(a.work, f"{key}.bin"))
            print(f"{a.ep} {label}: {result['runs'][key]}", flush=True)
        result["comparisons"][f"{a.ep}: converted vs reference"] = compare(outs[f"{a.ep}-converted"],
                                                                         outs[f"{a.ep}-reference"])
        if a.cpu:
            result["comparisons"][f"{a.ep} vs cpu: reference"] = compare(outs[f"{a.ep}-reference"], outs["cpu-reference"])
    ok = True
    for k, c in result["comparisons"].items():
        good = c["cosine"] >= a.min_cosine and c["finite"]
        ok = ok and good
        print(f"{k:<32} cosine {c['cosine']:.6f}  max abs diff {c['maxAbsDiff']:.4e} (max |ref| {c['refMaxAbs']:.3e})"
              f"  {'ok' if good else 'BELOW ' + str(a.min_cosine)}", flush=True)
    result["ok"] = ok
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=2)
            fh.write("\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
