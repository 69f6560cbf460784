"""Shared fixtures of the exporter's tests: the two tiny packs are exported once per session."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXPORT = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(EXPORT))
sys.path.insert(0, EXPORT)

import export  # noqa: E402


@pytest.fixture(scope="session")
def tiny_packs(tmp_path_factory):
    """{"float32": dir, "float16": dir}: tiny packs with their unquantized graphs."""
    root = tmp_path_factory.mktemp("packs")
    out = {}
    for act in ("float32", "float16"):
        d = str(root / f"tiny-{act}")
        export.export_pack("tiny", act, d, seed=0, keep_unquantized=True)
        out[act] = d
    return out


def node_ort_web(model, feeds, data_files=(), tmp=None, build="webgpu"):
    """Runs `model` with the project's onnxruntime-web (wasm backend) in Node; returns its result dict."""
    node = shutil.which("node")
    assert node, "node is needed for the ORT Web tests"
    assert os.path.isdir(os.path.join(REPO, "node_modules", "onnxruntime-web")), \
        "node_modules/onnxruntime-web is missing: run `npm ci` in the repository root"
    tmp = tmp or os.path.dirname(model)
    spec = {}
    for name, arr in feeds.items():
        arr = np.ascontiguousarray(arr)
        typ = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16",
               np.dtype(np.int64): "int64"}[arr.dtype]
        data = arr.view(np.uint16) if typ == "float16" else arr
        spec[name] = {"type": typ, "dims": list(arr.shape), "data": data.ravel().tolist()}
    fp, rp = os.path.join(tmp, "feeds.json"), os.path.join(tmp, "result.json")
    with open(fp, "w") as f:
        json.dump(spec, f)
    # --liftoff-only: V8 otherwise tiers the 26 MB asyncify wasm up with TurboFan in the background and
    # holds the process for about a minute (on 2 busy cores) after the graph ran.
    subprocess.run([node, "--liftoff-only", os.path.join(HERE, "ort_web_run.mjs"), model, fp, rp, *data_files],
                   check=True, cwd=REPO, timeout=300, env=dict(os.environ, ORT_WEB_BUILD=build))
    with open(rp) as f:
        return json.load(f)


def edit_graph(edit, model, out, *extra):
    """One of the stage worker's node edits applied on disk (`cargo run --example edit_graph`); how many
    places it changed."""
    cmd = ["cargo", "run", "-q", "-p", "imagine-core", "--example", "edit_graph", "--", edit, model, out, *extra]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return int(r.stdout)


def ort_web_output(path, feeds, data_files, tmp_dir):
    """`path`'s first output on the project's onnxruntime-web (webgpu bundle, wasm backend), float64."""
    os.makedirs(tmp_dir)
    res = node_ort_web(path, feeds, data_files, tmp=str(tmp_dir))
    assert res["ok"] and res["build"] == "webgpu", res
    out = next(iter(res["outputs"].values()))
    return np.array(out["data"], np.float64).reshape(out["dims"])
