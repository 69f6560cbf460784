"""MatMulNBits re-blocked to 32 (`imagine_core::graph::reblock`), natively
(`cargo run -p imagine-core --example block32`): the stage worker's graph edit before a WebGPU session,
in both forms: the repeated scales and zero points computed beforehand into a data file of their own
(`to_block_32_computed`, what the stage worker runs) and as nodes ONNX Runtime folds (`to_block_32`).
Re-blocking is exact (each block of 32 takes the scale and zero point of the block it was part of), so
on ONNX Runtime's CPU the re-blocked graph gives what the original gives: the tiny packs' text encoders
(int4, zero points, K = 64 below the block) and transformers (int8), and single nodes for the layouts
the tiny packs lack (an odd number of 4-bit zero points, K not a multiple of 32, float16 scales with
float16 zero points, no zero points)."""

import os
import shutil
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import REPO


FORMS = ["computed", "nodes"]


def block32(model, out, form="computed"):
    flags = ["--computed"] if form == "computed" else []
    cmd = ["cargo", "run", "-q", "-p", "imagine-core", "--example", "block32", "--", *flags, model, out]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    changed = int(r.stdout)
    graph = onnx.load(out, load_external_data=False).graph
    location = {t.name: next((e.value for e in t.external_data if e.key == "location"), None) for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "MatMulNBits":
            # Scales and zero points: in the computed file, or made by nodes for ONNX Runtime to fold.
            computed = [location.get(i) == "imagine-block32.data" for i in n.input[2:4] if i]
            assert all(computed) if form == "computed" else not any(computed), (n.name, list(n.input))
    return changed


def blocks(path):
    graph = onnx.load(path, load_external_data=False).graph
    return [next(a.i for a in n.attribute if a.name == "block_size")
            for n in graph.node if n.op_type == "MatMulNBits"]


def run(path, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})[0]


def feeds_for(path, rng, tokens):
    """Random inputs for every graph input: floats in its type, int64 ids below 4096, a mask of ones."""
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {}
    for i in s.get_inputs():
        shape = [d if isinstance(d, int) else (1 if d == "batch" else tokens) for d in i.shape]
        if i.type == "tensor(int64)":
            feeds[i.name] = np.ones(shape, np.int64) if "mask" in i.name else rng.integers(0, 4096, shape)
        else:
            dtype = np.float16 if i.type == "tensor(float16)" else np.float32
            feeds[i.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("activations", ["float32", "float16"])
@pytest.mark.parametrize("stem", ["text_encoder_q4", "transformer_q8"])
def test_tiny_graphs_reblocked_compute_the_same(tiny_packs, activations, stem, form, tmp_path):
    pack = str(tmp_path / "pack")
    shutil.copytree(tiny_packs[activations], pack, ignore=shutil.ignore_patterns("unquantized"))
    original = os.path.join(pack, f"{stem}.onnx")
    reblocked = os.path.join(pack, f"{stem}.block32.onnx")
    before = blocks(original)
    assert before and set(before) == {128}, before
    assert block32(original, reblocked, form) == len(before)
    assert blocks(reblocked) == [32] * len(before)
    feeds = feeds_for(original, np.random.default_rng(0), tokens=24)
    expected = run(original, feeds)
    assert np.isfinite(expected).all()
    np.testing.assert_array_equal(run(reblocked, feeds), expected)


def single_node(path, k, n, bits, block, scale_type=np.float32, zero_points="uint8"):
    """One MatMulNBits with random weights, scales and zero points ("uint8", "float" or None), saved
    at `path` with its weights inline."""
    rng = np.random.default_rng(k * 1000 + n + bits)
    nb = -(-k // block)
    b = rng.integers(0, 256, (n, nb, block * bits // 8), dtype=np.uint8)
    scales = (rng.random((n, nb)) * 0.1 + 0.01).astype(scale_type)
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")]
    inputs = ["a", "B", "scales"]
    if zero_points == "uint8":
        per_byte = 8 // bits
        zp = rng.integers(0, 256, (n, -(-nb // per_byte)), dtype=np.uint8)
        inits.append(numpy_helper.from_array(zp, "zp"))
        inputs.append("zp")
    elif zero_points == "float":
        zp = rng.integers(0, 2 ** bits, (n, nb)).astype(scale_type)
        inits.append(numpy_helper.from_array(zp, "zp"))
        inputs.append("zp")
    act = TensorProto.FLOAT16 if scale_type == np.float16 else TensorProto.FLOAT
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft",
                            K=k, N=n, bits=bits, block_size=block)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", act, ["m", k])],
                              [helper.make_tensor_value_info("y", act, ["m", n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    onnx.save(model, path)
    return np.random.default_rng(1).standard_normal((7, k)).astype(scale_type)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("k, n, bits, block, scale_type, zero_points", [
    (384, 24, 4, 128, np.float32, "uint8"),   # 3 blocks: an odd number of 4-bit zero points
    (100, 16, 4, 128, np.float32, "uint8"),   # K below the block and not a multiple of 32
    (320, 8, 8, 64, np.float32, "uint8"),     # 8 bits, 5 blocks of 64 -> 10 of 32
    (256, 8, 4, 256, np.float32, None),       # the default zero point
    (256, 16, 8, 128, np.float16, "uint8"),   # float16 scales
    (256, 16, 4, 128, np.float16, "float"),   # float16 scales and zero points
])
def test_single_nodes_reblocked_compute_the_same(tmp_path, k, n, bits, block, scale_type, zero_points, form):
    original, reblocked = str(tmp_path / "mm.onnx"), str(tmp_path / "mm32.onnx")
    a = single_node(original, k, n, bits, block, scale_type, zero_points)
    assert block32(original, reblocked, form) == 1
    assert blocks(reblocked) == [32]
    expected = run(original, {"a": a})
    np.testing.assert_array_equal(run(reblocked, {"a": a}), expected)


@pytest.mark.parametrize("form", FORMS)
def test_a_reblocked_graph_with_one_scale_moved_differs(tmp_path, form):
    """The comparison above can fail: the same node with one column's scales shifted by one block."""
    original, reblocked = str(tmp_path / "mm.onnx"), str(tmp_path / "mm32.onnx")
    a = single_node(original, 384, 24, 4, 128)
    block32(original, reblocked, form)
    model = onnx.load(original)
    scales = next(t for t in model.graph.initializer if t.name == "scales")
    values = numpy_helper.to_array(scales).copy()
    values[0] = np.roll(values[0], 1)
    scales.CopyFrom(numpy_helper.from_array(values, "scales"))
    onnx.save(model, original)
    assert not np.array_equal(run(reblocked, {"a": a}), run(original, {"a": a}))
