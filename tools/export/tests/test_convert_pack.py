"""The core's pack conversion, natively (`cargo run -p imagine-core --example convert_pack`), on the tiny
float16 pack: the converted graphs compute what the float32-activation export of the same weights
computes (tools/gpu-bench/device-convert.sh does the same at full size on a GPU)."""

import json
import os
import shutil
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

import export
import models

from conftest import REPO

# The H200's Dawn adapter (BENCHMARKS.md, "A real GPU"): what device-convert.sh converts for.
MAX_BUFFER_SIZE = 1 << 40
MAX_STORAGE_BUFFER_BINDING_SIZE = (2 << 30) - 4


def convert_pack(pack, *limits):
    limits = limits or (MAX_BUFFER_SIZE, MAX_STORAGE_BUFFER_BINDING_SIZE)
    summary = os.path.join(pack, "..", "convert.json")
    cmd = ["cargo", "run", "-q", "-p", "imagine-core", "--example", "convert_pack", "--", pack,
           "--max-buffer-size", str(limits[0]), "--max-storage-buffer-binding-size", str(limits[1]),
           "--json", summary]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        return r, None
    with open(summary) as f:
        return r, json.load(f)


def run_cpu(path, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = {i.name for i in s.get_inputs()}
    assert all(i.type != "tensor(float16)" for i in s.get_inputs()), path
    return s.run(None, {k: v for k, v in feeds.items() if k in names})[0]


def cosine(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_converted_tiny_pack_matches_the_float32_export(tiny_packs, tmp_path):
    pack = str(tmp_path / "pack")
    shutil.copytree(tiny_packs["float16"], pack, ignore=shutil.ignore_patterns("unquantized"))
    before = set(os.listdir(pack))
    r, summary = convert_pack(pack)
    assert r.returncode == 0, r.stderr
    new = set(os.listdir(pack)) - before
    assert {"text_encoder_q4.f32.onnx", "transformer_q8.f32.onnx"} <= new, new
    assert all(n.endswith(".f32.onnx") or ".f32-" in n for n in new), new
    # The cost the popup states is what was written; the record names both converted graphs.
    assert summary["cost"]["extraDiskBytes"] == sum(os.path.getsize(os.path.join(pack, n)) for n in new)
    assert summary["bytesWritten"] == summary["cost"]["extraDiskBytes"]
    assert summary["cost"]["gpuBytes"] > 0
    assert summary["record"]["limits"] == {"maxStorageBufferBindingSize": MAX_STORAGE_BUFFER_BINDING_SIZE,
                                           "maxBufferSize": MAX_BUFFER_SIZE}
    graphs = {g["graph"]: g for g in summary["record"]["graphs"]}
    assert set(graphs) == {"text_encoder_q4.onnx", "transformer_q8.onnx"}
    # The tiny encoder's Gather takes `input_ids % vocab`, not a graph input: no table leaves it.
    assert graphs["text_encoder_q4.onnx"]["lookups"] == []

    # The same inputs, float16-representable, for the converted graphs and the float32 export.
    ex = export.example_inputs(models.TINY, "float32")
    f32 = tiny_packs["float32"]
    for stem in ("transformer_q8", "text_encoder_q4"):
        feeds = {k: v.numpy() for k, v in ex[stem].items()}
        feeds = {k: v.astype(np.float16).astype(np.float32) if v.dtype == np.float32 else v for k, v in feeds.items()}
        got = run_cpu(os.path.join(pack, f"{stem}.f32.onnx"), feeds)
        ref = run_cpu(os.path.join(f32, f"{stem}.onnx"), feeds)
        assert got.dtype == np.float32 and got.shape == ref.shape
        assert np.all(np.isfinite(got))
        c = cosine(got, ref)
        print(f"{stem}: cosine {c:.7f}, max abs diff {np.abs(got - ref).max():.3e} (max |ref| {np.abs(ref).max():.3e})")
        assert c >= 0.999, (stem, c)


def test_float16_and_float32_exports_hold_the_same_weights(tiny_packs):
    """What makes the comparison above (and device-convert.sh's) fair: one seed draws one set of float32
    weights; the float16 export rounds them to float16 before quantising, which moves an int8 weight
    by a step or two, and only a few."""
    def inits(d):
        m = onnx.load(os.path.join(d, "transformer_q8.onnx"))
        return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}

    a, b = inits(tiny_packs["float16"]), inits(tiny_packs["float32"])
    q = [k for k in a if k in b and a[k].dtype == np.uint8 and k.endswith("_Q8")] or \
        [k for k in a if k in b and a[k].dtype == np.uint8]
    assert q, "no int8 MatMulNBits weights in common"
    total = same = 0
    for k in q:
        x, y = a[k].astype(np.int16), b[k].astype(np.int16)
        assert x.shape == y.shape, k
        assert np.abs(x - y).max() <= 2, k
        total, same = total + x.size, same + int((x == y).sum())
    assert same / total >= 0.9, same / total


def test_convert_pack_refuses_a_directory_without_graphs(tmp_path):
    r, _ = convert_pack(str(tmp_path))
    assert r.returncode == 1 and "none of the pack's graphs" in r.stderr, r.stderr
