"""The stage worker's embedding lookup outside the graph (`imagine_core::graph::tables`),
natively (`cargo run -p imagine-core --example take_tables_out`), on the tiny packs' text encoders: the
graph without its table, fed the rows gathered here from the table's file, computes exactly what the
original graph computes, for the float32-activation pack (a uint8 table) and the float16 one.

The tiny graphs gather `input_ids % 4096` (their vocabulary is cut to 4096 rows); the full-size ones
gather `input_ids` itself, which is what a table needs to leave the graph. So the test first makes the
tiny graph gather `input_ids` as the full-size one does, and feeds ids below 4096."""

import json
import os
import shutil
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import REPO

DTYPES = {"float32": np.float32, "uint8": np.uint8, "int8": np.int8, "int32": np.int32,
          "int64": np.int64, "float16": np.float16}


def take_tables_out(model, out):
    summary = out + ".json"
    cmd = ["cargo", "run", "-q", "-p", "imagine-core", "--example", "take_tables_out", "--", model, out,
           "--json", summary]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open(summary) as f:
        return json.load(f)


def gather(pack, lookup, ids):
    """The rows of `ids` read from the table's file, as the stage worker reads them."""
    dtype = np.dtype(DTYPES[lookup["elemType"]])
    row_elements = int(np.prod(lookup["rowDims"], dtype=np.int64))
    src = lookup["source"]
    with open(os.path.join(pack, src["file"]), "rb") as f:
        f.seek(src["offset"])
        table = np.frombuffer(f.read(src["length"]), dtype=dtype).reshape(lookup["rows"], row_elements)
    return table[ids.ravel()].reshape(*ids.shape, *lookup["rowDims"])


def run(path, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    return names, s.run(None, {k: feeds[k] for k in names})[0]


@pytest.mark.parametrize("activations", ["float32", "float16"])
def test_text_encoder_without_its_table_computes_the_same(tiny_packs, activations, tmp_path):
    # A copy of the pack (onnxruntime follows no external data out of a graph's directory).
    pack = str(tmp_path / "pack")
    shutil.copytree(tiny_packs[activations], pack, ignore=shutil.ignore_patterns("unquantized"))
    original = os.path.join(pack, "text_encoder_q4.full-ids.onnx")
    model = onnx.load(os.path.join(pack, "text_encoder_q4.onnx"), load_external_data=False)
    (wrap,) = [n for n in model.graph.node if n.op_type == "Mod" and n.input[0] == "input_ids"]
    for n in model.graph.node:
        n.input[:] = ["input_ids" if i == wrap.output[0] else i for i in n.input]
    model.graph.node.remove(wrap)
    onnx.save(model, original)
    taken = os.path.join(pack, "text_encoder_q4.lookup.onnx")
    lookups = take_tables_out(original, taken)
    assert len(lookups) == 1, lookups
    (lookup,) = lookups
    table = next(t for t in onnx.load(original, load_external_data=False).graph.initializer
                 if t.name == lookup["table"])
    assert lookup["rows"] == table.dims[0] and lookup["rowDims"] == list(table.dims[1:])
    assert lookup["elemType"] == {"float32": "uint8", "float16": "float16"}[activations]
    graph = onnx.load(taken, load_external_data=False).graph
    assert lookup["table"] not in {t.name for t in graph.initializer}
    assert not [n for n in graph.node if n.op_type == "Gather" and lookup["table"] in n.input]

    rng = np.random.default_rng(0)
    ids = np.full((1, 512), 7, dtype=np.int64)  # one row repeated, as the prompt encoder pads
    ids[0, :40] = rng.integers(0, lookup["rows"], 40)
    ids[0, 40] = -1  # Gather's negative index: the last row
    mask = (np.arange(512) < 41).astype(np.int64)[None]
    feeds = {"input_ids": ids, "attention_mask": mask}
    _, without_lookup = run(os.path.join(pack, "text_encoder_q4.onnx"), feeds)
    _, expected = run(original, feeds)
    np.testing.assert_array_equal(expected, without_lookup)  # ids below 4096: the wrap changed nothing
    names, got = run(taken, {**feeds, lookup["input"]: gather(pack, lookup, ids)})
    assert lookup["input"] in names
    assert np.isfinite(expected).all()
    np.testing.assert_array_equal(got, expected)
