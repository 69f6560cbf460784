"""The pack card's two silent failures, as tests.

(a) RoPE exported as upstream writes it (float64 frequencies) runs on ONNX Runtime's CPU build, so a
    desktop check passes, but ONNX Runtime Web has no float64 Cast kernel and refuses the graph. The
    exporter's float32 RoPE runs there.
(b) A float16 LayerNorm fed a residual stream saturated at +/-65504 (diffusers clips float16
    residuals there) overflows: x - mean and (x - mean)^2 leave the float16 range and the output is
    NaN. Computed in float32 and cast back, the same LayerNorm is finite. The exporter keeps every
    LayerNorm of the transformer in float32 (test_export.test_graph_contents checks the graph).
"""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import export
import models
import onnx_tools as ot
import verify
from conftest import node_ort_web


def _transformer_feeds():
    ex = verify.verification_inputs(models.TINY)["transformer_q8"]
    return {k: v.numpy() for k, v in ex.items()}, ex


def _ref(ex):
    _, tr, _ = models.build_all(models.TINY, None, 0)
    with torch.no_grad():
        return models.Transformer(tr)(**ex).numpy()


@pytest.fixture(scope="module")
def rope64_graph(tmp_path_factory):
    """The tiny transformer exported with upstream's float64 RoPE (float32 activations), weights inline."""
    d = tmp_path_factory.mktemp("rope64")
    cfg = models.TINY
    _, tr, _ = models.build_all(cfg, None, 0)
    mod = models.Transformer(models.patch_transformer(tr, rope_float32=False)).eval()
    ex = export.example_inputs(cfg, "float32")["transformer_q8"]
    m = export.export_float("transformer_q8", mod, ex, str(d / "tmp.onnx"))
    path = str(d / "transformer_rope64.onnx")
    onnx.save(m, path)
    return path


def test_a_float64_rope_runs_on_ort_cpu_but_ort_web_refuses_it(rope64_graph):
    m = onnx.load(rope64_graph)
    doubles = ot.double_uses(m)
    assert any("Cast" in x for x in doubles), "the upstream RoPE should export float64 casts"
    feeds, ex = _transformer_feeds()
    ref = _ref(ex)
    # desktop ORT: runs, and is right -- this is why the failure is silent
    got = ort.InferenceSession(rope64_graph, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert verify.cosine(got, ref) > 0.9999
    # ORT Web as the extension ships it (webgpu bundle + asyncify wasm), wasm backend: refused
    res = node_ort_web(rope64_graph, feeds)
    assert res["build"] == "webgpu"
    assert not res["ok"], "ORT Web ran the float64 graph"
    err = res["error"]
    assert "Cast" in err and ("implementation" in err or "double" in err.lower() or "type" in err.lower()), err
    print(f"\nORT Web on the float64-RoPE graph ({res['stage']}): {err[:300]}")
    # (The package's Node-only build, ort.node.min.mjs, does have the kernel; the browser never gets it.)
    node_build = node_ort_web(rope64_graph, feeds, build="node")
    print(f"onnxruntime-web's Node build on the same graph: {'runs' if node_build['ok'] else node_build['error'][:200]}")


@pytest.mark.parametrize("which", ["unquantized", "int8 pack"])
def test_a_float32_rope_runs_on_ort_web(tiny_packs, which, tmp_path):
    d = tiny_packs["float32"]
    if which == "unquantized":
        model = os.path.join(d, "unquantized", "transformer_q8.onnx")
        data = [os.path.join(d, "unquantized", "transformer_q8.onnx.data")]
        thr = 0.9999
    else:
        model = os.path.join(d, "transformer_q8.onnx")
        data = [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.startswith("transformer_q8-")]
        thr = 0.999
    assert not ot.double_uses(onnx.load(model, load_external_data=False))
    feeds, ex = _transformer_feeds()
    res = node_ort_web(model, feeds, data, tmp=str(tmp_path))
    assert res["ok"], res
    out = res["outputs"]["noise_pred"]
    got = np.array(out["data"], dtype=np.float32).reshape(out["dims"])
    assert np.all(np.isfinite(got))
    c = verify.cosine(got, _ref(ex))
    print(f"\nORT Web wasm, tiny transformer ({which}, float32 RoPE): cosine vs PyTorch {c:.7f}")
    assert c >= thr


def _layernorm_graph(compute):
    """[1, 4, 64] float16 -> float16 LayerNorm (no affine, eps 1e-6), computed in `compute` precision.

    Written out as the ONNX LayerNormalization function body (mean, x - mean, mean of squares, sqrt,
    divide). For float16 every intermediate is stored as float16, as a float16 kernel or an unfused
    float16 graph stores it: ORT's CPU EP has no float16 kernels for these ops and runs them in
    float32 (its own LayerNormalization kernel accumulates float16 in float32 too), so the graph
    computes each op in float32 and rounds its result to float16 with an explicit Cast pair.
    """
    F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
    nodes = [helper.make_node("Cast", ["x"], ["x32"], to=F32)]
    inits = [numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    body = [
        ("ReduceMean", ["x32", "axes"], "mean", {"keepdims": 1}),
        ("Sub", ["x32", "mean"], "d", {}),
        ("Mul", ["d", "d"], "d2", {}),
        ("ReduceMean", ["d2", "axes"], "var", {"keepdims": 1}),
        ("Add", ["var", "eps"], "ve", {}),
        ("Sqrt", ["ve"], "std", {}),
        ("Div", ["d", "std"], "yn", {}),
    ]
    for op, ins, out, attrs in body:
        if compute == F16:
            nodes.append(helper.make_node(op, ins, [out + "_f32"], **attrs))
            nodes.append(helper.make_node("Cast", [out + "_f32"], [out + "_f16"], to=F16))
            nodes.append(helper.make_node("Cast", [out + "_f16"], [out], to=F32))
        else:
            nodes.append(helper.make_node(op, ins, [out], **attrs))
    nodes.append(helper.make_node("Cast", ["yn"], ["y"], to=F16))
    g = helper.make_graph(nodes, "layernorm", [helper.make_tensor_value_info("x", F16, [1, 4, 64])],
                          [helper.make_tensor_value_info("y", F16, [1, 4, 64])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m.SerializeToString()


def test_b_float16_layernorm_on_a_saturated_residual_gives_nan():
    x = np.random.default_rng(0).standard_normal((1, 4, 64)).astype(np.float16)
    x[0, 0, :32], x[0, 0, 32:] = 65504, -65504          # saturated both ways
    x[0, 1, :], x[0, 1, ::3] = 65504, -65504
    x[0, 2, :60] = 65504                                  # mostly saturated
    # row 3 stays a normal residual
    out = {}
    for name, dt in (("float16", TensorProto.FLOAT16), ("float32", TensorProto.FLOAT)):
        so = ort.SessionOptions()
        # no graph optimisation: ORT would drop the Cast pairs and fuse the pattern into its kernel
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(_layernorm_graph(dt), so, providers=["CPUExecutionProvider"])
        out[name] = sess.run(None, {"x": x})[0].astype(np.float32)
    bad16 = ~np.isfinite(out["float16"])
    # row 1 (mean far from 0): x - mean overflows to -inf, (x - mean)^2 to inf, -inf/inf = NaN
    assert np.isnan(out["float16"][0, 1]).any(), "float16 LayerNorm should give NaN on +/-65504"
    # row 0 (mean 0): (x - mean)^2 overflows, x/inf = 0: silently all zeros instead of +/-1
    assert np.all(out["float16"][0, 0] == 0) and np.all(np.abs(out["float32"][0, 0]) > 0.99)
    assert np.all(np.isfinite(out["float32"])), "float32 LayerNorm must stay finite"
    # where float16 is fine (the normal row) both agree; the float32 one is a proper LayerNorm
    np.testing.assert_allclose(out["float16"][0, 3], out["float32"][0, 3], atol=2e-2)
    xs = x.astype(np.float64)
    want = (xs - xs.mean(-1, keepdims=True)) / np.sqrt(xs.var(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(out["float32"], want, atol=2e-3)
    print(f"\nfloat16 LayerNorm on a saturated residual: {int(bad16.sum())} of {bad16.size} outputs "
          f"NaN/inf, a saturated row of zeros; float32 LayerNorm: all finite and right")
