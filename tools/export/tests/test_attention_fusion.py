"""Attention fused into `com.microsoft` MultiHeadAttention (`imagine_core::graph::attention`), natively
(`cargo run -p imagine-core --example edit_graph -- fuse-attention`): the stage worker's graph edit before a WebGPU
session. On ONNX Runtime's CPU the fused graph must compute what the original computes: the tiny packs'
transformers (the exporter's pattern: query and key each scaled, the key transposed by Reshape, swap,
Reshape), and small graphs for the other ways a key can be transposed and a score scaled. What the
fusion cannot prove (a mask added to the scores, heads it cannot read) stays as it was."""

import os
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import edit_graph


def fuse(model, out):
    return edit_graph("fuse-attention", model, out)


def ops(path):
    return [n.op_type for n in onnx.load(path, load_external_data=False).graph.node]


def run(path, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})[0].astype(np.float64)


def cosine(a, b):
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def transformer_feeds(path, rng):
    """The transformer's inputs: 24 image and 16 text tokens, ids below 16, timestep 0.7."""
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    tokens = {"batch": 1, "image_sequence": 24, "text_sequence": 16}
    feeds = {}
    for i in s.get_inputs():
        shape = [d if isinstance(d, int) else tokens[d] for d in i.shape]
        if i.type == "tensor(int64)":
            feeds[i.name] = rng.integers(0, 16, shape)
        else:
            dtype = np.float16 if i.type == "tensor(float16)" else np.float32
            feeds[i.name] = np.full(shape, 0.7, dtype) if i.name == "timestep" else rng.standard_normal(shape).astype(dtype)
    return feeds


@pytest.mark.parametrize("activations", ["float32", "float16"])
def test_tiny_transformers_fused_compute_the_same(tiny_packs, activations, tmp_path):
    pack = str(tmp_path / "pack")
    shutil.copytree(tiny_packs[activations], pack, ignore=shutil.ignore_patterns("unquantized"))
    original = os.path.join(pack, "transformer_q8.onnx")
    fused = os.path.join(pack, "transformer_q8.fused.onnx")
    softmaxes = ops(original).count("Softmax")
    assert softmaxes == 2  # one double-stream and one single-stream block
    assert fuse(original, fused) == softmaxes
    after = ops(fused)
    assert after.count("MultiHeadAttention") == softmaxes and "Softmax" not in after and "Transpose" not in after
    feeds = transformer_feeds(original, np.random.default_rng(0))
    expected, got = run(original, feeds), run(fused, feeds)
    # The same function; float16 rounds the scores and weights in another order.
    assert cosine(got, expected) > 0.99999, cosine(got, expected)
    np.testing.assert_allclose(got, expected, atol=1e-5 if activations == "float32" else 4e-3)

    # The check sees a wrong fusion: half the scale.
    model = onnx.load(fused, load_external_data=False)
    for n in model.graph.node:
        if n.op_type == "MultiHeadAttention":
            next(a for a in n.attribute if a.name == "scale").f *= 0.5
    wrong = os.path.join(pack, "transformer_q8.wrong.onnx")
    onnx.save(model, wrong)
    assert np.abs(run(wrong, feeds) - expected).max() > 1e-3


def test_the_text_encoder_causal_attention_is_left_alone(tiny_packs, tmp_path):
    original = os.path.join(tiny_packs["float32"], "text_encoder_q4.onnx")
    assert fuse(original, str(tmp_path / "te.onnx")) == 0


HEADS, HEAD = 2, 8


def attention_graph(path, key="transpose", scale="pre", mask=False, declared=True):
    """q, k, v [1, S, HEADS, HEAD] -> softmax(q kᵀ * s) v, back to [1, S, HEADS * HEAD], built the ways an
    exporter might: `key` "transpose" (one Transpose from BSNH), "bnsh" (to BNSH, then swap the last two),
    "reshape" (the exporter's Reshape, swap, Reshape); `scale` "pre" (q and k each by s^1/2), "post"
    (the scores divided by 1/s); `mask` adds an input to the scores; `declared` False leaves out the
    shapes the heads are read from."""
    n = []
    s = 1 / np.sqrt(HEAD)
    inits = [numpy_helper.from_array(np.array(np.sqrt(s), np.float32), "root"),
             numpy_helper.from_array(np.array(1 / s, np.float32), "inv"),
             numpy_helper.from_array(np.array([0, 0, HEADS * HEAD], np.int64), "bsd")]
    n.append(helper.make_node("Transpose", ["q"], ["q4"], perm=[0, 2, 1, 3]))
    if key == "transpose":
        n.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]))
    else:
        n.append(helper.make_node("Transpose", ["k"], ["k4"], perm=[0, 2, 1, 3]))
        if key == "bnsh":
            n.append(helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 1, 3, 2]))
        else:
            inits += [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
                      [("m1", [-1]), ("m2", [-2]), ("big", [2 ** 63 - 1]), ("small", [-2 ** 63])]]
            n += [helper.make_node("Shape", ["k4"], ["ks"]),
                  helper.make_node("Slice", ["ks", "m2", "big"], ["last2"]),
                  helper.make_node("Concat", ["m1", "last2"], ["flat_shape"], axis=0),
                  helper.make_node("Reshape", ["k4", "flat_shape"], ["k3"]),
                  helper.make_node("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
                  helper.make_node("Slice", ["ks", "small", "m2"], ["lead"]),
                  helper.make_node("Slice", ["ks", "m1", "big"], ["hd"]),
                  helper.make_node("Slice", ["ks", "m2", "m1"], ["sq"]),
                  helper.make_node("Concat", ["lead", "hd", "sq"], ["back_shape"], axis=0),
                  helper.make_node("Reshape", ["k3t", "back_shape"], ["kt"])]
    if scale == "pre":
        n += [helper.make_node("Mul", ["q4", "root"], ["qs"]), helper.make_node("Mul", ["kt", "root"], ["ks_"]),
              helper.make_node("MatMul", ["qs", "ks_"], ["scores"])]
    else:
        n += [helper.make_node("MatMul", ["q4", "kt"], ["raw"]), helper.make_node("Div", ["raw", "inv"], ["scores"])]
    if mask:
        n.append(helper.make_node("Add", ["scores", "mask"], ["masked"]))
    n += [helper.make_node("Softmax", ["masked" if mask else "scores"], ["w"], axis=-1),
          helper.make_node("Transpose", ["v"], ["v4"], perm=[0, 2, 1, 3]),
          helper.make_node("MatMul", ["w", "v4"], ["o4"]),
          helper.make_node("Transpose", ["o4"], ["o"], perm=[0, 2, 1, 3]),
          helper.make_node("Reshape", ["o", "bsd"], ["out"])]
    bsnh = ["batch", "seq", HEADS, HEAD] if declared else None
    inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, bsnh) for x in "qkv"]
    if mask:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", HEADS, "seq", "seq"]))
    graph = helper.make_graph(n, "attention", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", HEADS * HEAD])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.mark.parametrize("key", ["transpose", "bnsh", "reshape"])
@pytest.mark.parametrize("scale", ["pre", "post"])
def test_each_way_of_writing_attention_fuses_to_the_same_function(tmp_path, key, scale):
    original, fused = str(tmp_path / "a.onnx"), str(tmp_path / "f.onnx")
    attention_graph(original, key=key, scale=scale)
    assert fuse(original, fused) == 1
    assert ops(fused) == ["Reshape", "Reshape", "Reshape", "MultiHeadAttention", "Reshape", "Reshape"]
    rng = np.random.default_rng(3)
    feeds = {x: rng.standard_normal((1, 11, HEADS, HEAD)).astype(np.float32) for x in "qkv"}
    np.testing.assert_allclose(run(fused, feeds), run(original, feeds), atol=1e-5)


@pytest.mark.parametrize("variant", [{"mask": True}, {"declared": False}])
def test_what_cannot_be_proven_stays(tmp_path, variant):
    original, out = str(tmp_path / "a.onnx"), str(tmp_path / "f.onnx")
    attention_graph(original, key="reshape", **variant)
    assert fuse(original, out) == 0
    assert open(out, "rb").read() == open(original, "rb").read()
