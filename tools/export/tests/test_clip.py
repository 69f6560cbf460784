"""`Clip` computed as `Max` then `Min` (`imagine_core::graph::clip::as_max_min`, natively through `cargo
run -p imagine-core --example edit_graph -- clip-as-max-min`): the load-time edit that lets Firefox's
WebGPU shader compiler take the transformer (it refuses ONNX Runtime Web's float16 `Clip` shader). The
edited graph must compute exactly what `Clip` computes, for every form of its bounds (both, one, none,
a lower bound above the upper), in float16 and float32, on ONNX Runtime's CPU and on ONNX Runtime Web's
wasm build (the extension's); the tiny transformers must give the same output bit for bit. The order
of the two steps matters (a lower bound above the upper gives the upper bound) and is seen."""

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import edit_graph, node_ort_web
from test_attention_chunks import copy_pack
from test_attention_fusion import ops, run, transformer_feeds


def as_max_min(model, out):
    return edit_graph("clip-as-max-min", model, out)


# (lower, upper) of each Clip; None: that input left empty.
BOUNDS = [(-1.5, 2.0), (3.0, -2.0), (None, 0.25), (-0.5, None), (None, None)]


def clips(path, dtype):
    """`y`: `x` through one Clip per BOUNDS entry, the results side by side."""
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    inits, nodes, outs = [], [], []
    for k, (low, high) in enumerate(BOUNDS):
        names = ["x"]
        for side, value in (("low", low), ("high", high)):
            if value is None:
                names.append("")
            else:
                inits.append(numpy_helper.from_array(np.array(value, dtype), f"{side}_{k}"))
                names.append(f"{side}_{k}")
        while names[-1] == "":
            names.pop()
        nodes.append(helper.make_node("Clip", names, [f"clip_{k}"], name=f"clip_{k}"))
        outs.append(f"clip_{k}")
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=0))
    graph = helper.make_graph(
        nodes, "clips", [helper.make_tensor_value_info("x", elem, [1, 64])],
        [helper.make_tensor_value_info("y", elem, [len(BOUNDS), 64])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def web_output(path, feeds, tmp_dir):
    os.makedirs(tmp_dir)
    res = node_ort_web(path, feeds, tmp=str(tmp_dir))
    assert res["ok"], res
    out = res["outputs"]["y"]
    data = np.array(out["data"], np.uint16 if out["type"] == "float16" else np.float32)
    return (data.view(np.float16) if out["type"] == "float16" else data).reshape(out["dims"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_every_form_of_clip_computes_as_clip_does(dtype, tmp_path):
    original, edited = str(tmp_path / "clips.onnx"), str(tmp_path / "clips.edited.onnx")
    clips(original, dtype)
    assert as_max_min(original, edited) == len(BOUNDS)
    assert "Clip" not in ops(edited)
    assert sorted(ops(edited)) == sorted(["Max", "Min", "Min", "Max", "Max", "Min", "Identity", "Concat"])
    onnx.checker.check_model(onnx.load(edited), full_check=True)

    x = np.linspace(-4, 4, 64).astype(dtype)[None, :]
    expected = run(original, {"x": x})
    # The lower bound above the upper gives the upper bound everywhere, as ONNX defines Clip.
    assert (expected[1] == -2.0).all()
    assert np.array_equal(run(edited, {"x": x}), expected)
    web = web_output(edited, {"x": x}, tmp_path / "web")
    assert np.array_equal(web.astype(np.float64), expected)


def test_min_before_max_is_seen(tmp_path):
    original, edited = str(tmp_path / "clips.onnx"), str(tmp_path / "clips.edited.onnx")
    clips(original, np.float32)
    as_max_min(original, edited)
    model = onnx.load(edited)
    # In the clips with both bounds: Min with the upper bound first, then Max with the lower.
    pairs = {}
    for n in model.graph.node:
        low = next((v for v in [*n.input, *n.output] if v.endswith("/imagine_at_least_min")), None)
        if low:
            pairs.setdefault(low, []).append(n)
    assert len(pairs) == 2
    for first, second in pairs.values():
        first.op_type, second.op_type = "Min", "Max"
        first.input[1], second.input[1] = second.input[1], first.input[1]
    swapped = str(tmp_path / "clips.swapped.onnx")
    onnx.save(model, swapped)
    x = np.linspace(-4, 4, 64).astype(np.float32)[None, :]
    expected, got = run(original, {"x": x}), run(swapped, {"x": x})
    assert np.array_equal(got[[0, 2, 3, 4]], expected[[0, 2, 3, 4]])
    assert not np.array_equal(got[1], expected[1])


@pytest.mark.parametrize("activations,clamps", [("float32", 0), ("float16", 2)])
def test_tiny_transformers_give_the_same_output_bit_for_bit(tiny_packs, activations, clamps, tmp_path):
    pack, original = copy_pack(tiny_packs, activations, tmp_path)
    edited = os.path.join(pack, "transformer_q8.max_min.onnx")
    # In float16 the residual stream is clamped to float16's range after the double-stream and the
    # single-stream blocks; the float32 export has no clamp, and the edit leaves it as it was.
    assert ops(original).count("Clip") == clamps
    assert as_max_min(original, edited) == clamps
    after = ops(edited)
    assert "Clip" not in after and after.count("Max") == clamps and after.count("Min") == clamps
    feeds = transformer_feeds(original, np.random.default_rng(0))
    assert np.array_equal(run(edited, feeds), run(original, feeds))
