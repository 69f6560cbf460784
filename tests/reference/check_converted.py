#!/usr/bin/env python3
"""Numeric check of imagine-core's float16 -> float32 graph rewrite (crates/core/src/graph).

One command: python3 tests/reference/check_converted.py   (from the repository root; needs cargo and
tests/reference/requirements.txt). It

1. converts the committed f16 fixture pack with `cargo run -p imagine-core --example convert_f16`, runs
   the converted graphs, the original f16 graphs and the f32 fixture pack (make_packs.py draws one set of
   float32 weights for every variant, and the f16 variant keeps them float32 and computes in float32
   between a Cast after each float16 input and a Cast before each float16 output) on identical inputs
   with onnxruntime CPU;
2. builds a small Qwen3-like float16 graph that has what the fixture pack lacks (float16 initializers
   inline, in int32_data and in external data beside uint8 weights; a float16 embedding table Gathered
   by input_ids; SimplifiedLayerNormalization, MatMulNBits int4 with float16 scales and uint8 or float16
   zero points, RotaryEmbedding, SkipSimplifiedLayerNormalization, Softmax attention, a float32
   LayerNormalization island between Casts, float16 Constant and ConstantOfShape), and its float32 twin
   (the same graph with every float16 tensor replaced by the same values in float32), converts the
   float16 one twice (the table converted in the graph; and, with a buffer limit below the float32
   table, the table looked up outside the graph, fed from the float16 table file the way the web side
   does), and compares.

It prints max abs error and cosine per output, and fails (exit 1) when a tolerance is not met.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PACKS = os.path.join(ROOT, "tests", "fixtures", "packs")
F16_EPS = 2.0 ** -11  # float16 unit roundoff (round to nearest even, 11-bit significand)
FAILED = []


def convert(src, dst, *extra):
    cmd = ["cargo", "run", "-q", "-p", "imagine-core", "--example", "convert_f16", "--", src, dst, *extra]
    subprocess.run(cmd, cwd=ROOT, check=True)


def session(path):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run(path, feeds):
    s = session(path)
    wanted = {i.name: i.type for i in s.get_inputs()}
    cast = {}
    for name, value in feeds.items():
        if name not in wanted:
            continue
        if wanted[name] == "tensor(float16)":
            value = value.astype(np.float16)
        elif wanted[name] == "tensor(float)":
            value = value.astype(np.float32)
        cast[name] = value
    missing = set(wanted) - set(cast)
    assert not missing, (path, missing)
    return {o.name: r.astype(np.float32) for o, r in zip(s.get_outputs(), s.run(None, cast))}


def compare(label, got, ref, max_abs, min_cos, elementwise=None):
    got, ref = got.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    err = np.abs(got - ref)
    cos = float(got @ ref / (np.linalg.norm(got) * np.linalg.norm(ref) + 1e-300))
    ok = err.max() <= max_abs and cos >= min_cos and np.all(np.isfinite(got))
    if elementwise is not None:
        ok = ok and bool(np.all(err <= elementwise))
    print(f"  {label:<58} max abs {err.max():.3e}  cosine {cos:.9f}  {'ok' if ok else 'FAIL'}")
    if not ok:
        FAILED.append(label)


def f16_exact(rng, shape, scale=1.0):
    """Random values that float16 represents exactly, so every graph sees identical inputs."""
    return (rng.standard_normal(shape) * scale).astype(np.float16).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# 1. the fixture pack
# ----------------------------------------------------------------------------------------------

def check_fixture_pack(tmp):
    out = os.path.join(tmp, "f16-converted")
    convert(os.path.join(PACKS, "f16"), out)
    rng = np.random.default_rng(7)
    s_txt, s_img = 512, 64
    ids = rng.integers(0, 151936, (1, s_txt)).astype(np.int64)
    mask = np.zeros((1, s_txt), dtype=np.int64)
    mask[0, :37] = 1
    img_ids = np.stack(np.meshgrid(np.arange(8), np.arange(8), indexing="ij"), -1).reshape(-1, 2)
    img_ids = np.concatenate([np.zeros((64, 1)), img_ids, np.zeros((64, 1))], 1)[None].astype(np.int64)
    txt_ids = np.zeros((1, s_txt, 4), dtype=np.int64)
    txt_ids[0, :, 3] = np.arange(s_txt)
    feeds = {
        "input_ids": ids, "attention_mask": mask,
        "hidden_states": f16_exact(rng, (1, s_img, 128)),
        "encoder_hidden_states": f16_exact(rng, (1, s_txt, 7680), 0.5),
        "timestep": np.array([0.75], dtype=np.float32), "img_ids": img_ids, "txt_ids": txt_ids,
        "packed_latent": rng.standard_normal((1, 128, 8, 8)).astype(np.float32),
    }
    print("fixture pack f16, converted, against the f32 pack and the f16 pack:")
    for stem in ("text_encoder_q4", "transformer_q8", "vae_decoder"):
        conv = run(os.path.join(out, f"{stem}.onnx"), feeds)
        f32 = run(os.path.join(PACKS, "f32", f"{stem}.onnx"), feeds)
        f16 = run(os.path.join(PACKS, "f16", f"{stem}.onnx"), feeds)
        for name in conv:
            # The converted graph computes exactly what the f32 pack computes (same float32 weights, same
            # float32 ops; the former Casts are float32 -> float32): no difference is allowed.
            compare(f"{stem}.{name} vs f32 pack", conv[name], f32[name], 0.0, 1.0 - 1e-12)
            # The f16 pack computes the same in float32 and rounds the output to float16 once: every
            # element may differ by at most half a float16 ulp (2^-11 relative, 2^-25 absolute near 0).
            bound = F16_EPS * np.abs(conv[name].astype(np.float64)).ravel() + 2.0 ** -25
            compare(f"{stem}.{name} vs f16 pack", conv[name], f16[name], float(bound.max()), 0.999999,
                    elementwise=bound)


# ----------------------------------------------------------------------------------------------
# 2. a Qwen3-like float16 graph with the real pack's operators
# ----------------------------------------------------------------------------------------------

V, H, NH, HD, FF, BLOCK, MAXPOS = 1000, 64, 4, 16, 128, 32, 128


def quantize_int4(rng, k, n, fdt, float_zero_points):
    """MatMulNBits inputs for a random int4 [k, n] weight: B, scales, zero_points."""
    blocks = k // BLOCK
    q = rng.integers(0, 16, (n, blocks, BLOCK)).astype(np.uint8)
    b = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).astype(np.uint8)                 # [n, blocks, BLOCK/2]
    scales = (rng.uniform(0.02, 0.06, n * blocks)).astype(np.float16)
    if float_zero_points:
        zp = rng.uniform(6.0, 9.0, n * blocks).astype(np.float16)
        zp = zp.astype(np.float32) if fdt == TensorProto.FLOAT else zp
    else:
        z = rng.integers(6, 10, (n, blocks)).astype(np.uint8)
        if blocks % 2:
            z = np.concatenate([z, np.zeros((n, 1), np.uint8)], 1)
        zp = (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8).ravel()
    scales = scales.astype(np.float32) if fdt == TensorProto.FLOAT else scales
    return b, scales, zp


def qwen_like(fdt):
    """The graph in float16 (fdt FLOAT16) or its float32 twin (fdt FLOAT), same values."""
    rng = np.random.default_rng(20260601)
    npf = np.float16 if fdt == TensorProto.FLOAT16 else np.float32

    def w(shape, scale=1.0, offset=0.0):
        return (rng.standard_normal(shape) * scale + offset).astype(np.float16).astype(npf)

    inits, nodes, n = [], [], [0]

    def const(name, arr, int32_data=False):
        if int32_data and arr.dtype == np.float16:
            t = helper.make_tensor(name, TensorProto.FLOAT16, arr.shape, arr.ravel().tolist())  # int32_data
        else:
            t = numpy_helper.from_array(np.ascontiguousarray(arr), name)
        inits.append(t)
        return name

    def op(op_type, inputs, outputs=1, domain="", **attrs):
        n[0] += 1
        outs = [f"{op_type.lower()}_{n[0]}_{i}" for i in range(outputs)] if isinstance(outputs, int) else outputs
        nodes.append(helper.make_node(op_type, inputs, outs, name=f"{op_type}_{n[0]}", domain=domain, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def mmnb(x, k, nout, float_zp=None):
        b, s, zp = quantize_int4(rng, k, nout, fdt, bool(float_zp))
        i = n[0]
        ins = [x, const(f"B{i}", b), const(f"scales{i}", s)]
        if float_zp is not None:
            ins.append(const(f"zp{i}", zp))
        return op("MatMulNBits", ins, domain="com.microsoft", K=k, N=nout, bits=4, block_size=BLOCK)

    x = op("Gather", [const("embed_tokens", w((V, H), 0.5)), "input_ids"], axis=0)          # [B,S,H]
    n1 = op("SimplifiedLayerNormalization", [x, const("ln1", w(H, 0.1, 1.0))], axis=-1, epsilon=1e-6)
    q = mmnb(n1, H, H, float_zp=False)
    k = mmnb(n1, H, H, float_zp=True)
    v = mmnb(n1, H, H)
    shape = op("Shape", ["input_ids"])
    seq = op("Gather", [shape, const("one_i", np.array(1, np.int64))], axis=0)                # scalar S
    pos = op("Unsqueeze", [op("Range", [const("zero_i", np.array(0, np.int64)), seq, "one_i"]),
                           const("ax0", np.array([0], np.int64))])                             # [1,S]
    inv = 1.0 / (10000 ** (np.arange(0, HD, 2) / HD))
    ang = np.arange(MAXPOS)[:, None] * inv[None, :]
    cos = const("cos_cache", np.cos(ang).astype(np.float16).astype(npf))
    sin = const("sin_cache", np.sin(ang).astype(np.float16).astype(npf))
    q = op("RotaryEmbedding", [q, pos, cos, sin], domain="com.microsoft", num_heads=NH)
    k = op("RotaryEmbedding", [k, pos, cos, sin], domain="com.microsoft", num_heads=NH)

    def heads(t):  # [B,S,H] -> [B,NH,S,HD]
        r = op("Reshape", [t, const(f"hshape{n[0]}", np.array([0, 0, NH, HD], np.int64))])
        return op("Transpose", [r], perm=[0, 2, 1, 3])

    scale = op("Constant", [], value=numpy_helper.from_array(np.array(HD ** -0.5, npf), "scale"))
    scores = op("Mul", [op("MatMul", [heads(q), op("Transpose", [heads(k)], perm=[0, 1, 3, 2])]), scale])
    maskf = op("Cast", ["attention_mask"], to=fdt)                                            # [B,S]
    neg = op("Mul", [op("Sub", [const("onef", np.array(1.0, npf)), maskf]), const("big", np.array(-10000.0, npf))])
    neg = op("Unsqueeze", [neg, const("ax12", np.array([1, 2], np.int64))])                   # [B,1,1,S]
    probs = op("Softmax", [op("Add", [scores, neg])], axis=-1)
    ctx = op("Reshape", [op("Transpose", [op("MatMul", [probs, heads(v)])], perm=[0, 2, 1, 3]),
                         const("bsh", np.array([0, 0, H], np.int64))])
    o = mmnb(ctx, H, H, float_zp=False)
    h, res = op("SkipSimplifiedLayerNormalization", [o, x, const("ln2", w(H, 0.1, 1.0), int32_data=True)],
                outputs=["h", "", "", "residual"], domain="com.microsoft", epsilon=1e-6)[0::3]
    gate, up = mmnb(h, H, FF), mmnb(h, H, FF)
    act = op("Mul", [op("Mul", [gate, op("Sigmoid", [gate])]), up])
    y = op("Add", [res, mmnb(act, FF, H)])
    # a float32 island, as the FLUX.2 transformer's LayerNorms under float16 activations
    y32 = op("Cast", [y], to=TensorProto.FLOAT)
    ln = op("LayerNormalization", [y32, const("ln3_w", rng.uniform(0.5, 1.5, H).astype(np.float32)),
                                   const("ln3_b", (rng.standard_normal(H) * 0.1).astype(np.float32))], axis=-1)
    back = op("Cast", [ln], to=fdt)
    bias = op("ConstantOfShape", [op("Shape", [back])],
              value=numpy_helper.from_array(np.array([0.125], npf), "bias_value"))
    op("Add", [back, bias], outputs=["hidden"])
    graph = helper.make_graph(
        nodes, "qwen_like",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("hidden", fdt, ["batch", "sequence", H])],
        initializer=inits,
        value_info=[helper.make_tensor_value_info(x, fdt, ["batch", "sequence", H])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                          producer_name="imagine-check-converted")
    m.ir_version = 8
    return m


def save_external(model, directory, stem):
    os.makedirs(directory, exist_ok=True)
    onnx.save_model(model, os.path.join(directory, f"{stem}.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=f"{stem}.data", size_threshold=256)


def check_qwen_like(tmp):
    src, twin = os.path.join(tmp, "qwen16"), os.path.join(tmp, "qwen32")
    save_external(qwen_like(TensorProto.FLOAT16), src, "qwen_like")
    save_external(qwen_like(TensorProto.FLOAT), twin, "qwen_like")
    in_graph, outside = os.path.join(tmp, "qwen16-converted"), os.path.join(tmp, "qwen16-lookup")
    convert(src, in_graph, "--piece", "4096")  # the 128,000-byte table in 32 pieces
    # float32 table: 1000 x 64 x 4 = 256,000 bytes; a 200,000-byte buffer limit leaves it outside.
    convert(src, outside, "--max-buffer", "200000")
    with open(os.path.join(outside, "qwen_like.plan.json")) as fh:
        plan = json.load(fh)
    assert [lk["input"] for lk in plan["lookups"]] == ["gather_1_0"], plan["lookups"]
    lookup = plan["lookups"][0]

    rng = np.random.default_rng(11)
    s = 48
    ids = rng.integers(0, V, (1, s)).astype(np.int64)
    mask = np.zeros((1, s), dtype=np.int64)
    mask[0, :30] = 1
    feeds = {"input_ids": ids, "attention_mask": mask}
    # What the web side does: read each id's float16 row from the table file and widen it.
    with open(os.path.join(outside, lookup["source"]["file"]), "rb") as fh:
        fh.seek(lookup["source"]["offset"])
        table = np.frombuffer(fh.read(lookup["source"]["length"]), dtype="<f2")
    table = table.reshape(lookup["rows"], lookup["rowElements"])
    lookup_feeds = dict(feeds, **{lookup["input"]: table[ids].astype(np.float32)})

    ref32 = run(os.path.join(twin, "qwen_like.onnx"), feeds)["hidden"]
    ref16 = run(os.path.join(src, "qwen_like.onnx"), feeds)["hidden"]
    conv = run(os.path.join(in_graph, "qwen_like.onnx"), feeds)["hidden"]
    conv_outside = run(os.path.join(outside, "qwen_like.onnx"), lookup_feeds)["hidden"]
    print("Qwen3-like float16 graph, converted, against its float32 twin and the float16 original:")
    # Same float32 values and the same float32 kernels: only summation order may differ (MatMulNBits may
    # pick another tiling for a float32 graph built from other initializers); outputs are LayerNorm-scaled,
    # O(1), so 1e-5 absolute is ~100 float32 ulps and still catches any float16 rounding (~5e-4).
    compare("hidden, table in the graph vs float32 twin", conv, ref32, 1e-5, 1.0 - 1e-10)
    compare("hidden, table looked up outside vs float32 twin", conv_outside, ref32, 1e-5, 1.0 - 1e-10)
    # The original computes every activation in float16 (~2^-11 relative per operation) through about 30
    # dependent operations and a LayerNorm that rescales: a few 1e-3 typical, 3e-2 worst case allowed,
    # and the direction must agree to cosine 0.9999.
    compare("hidden, table in the graph vs float16 original", conv, ref16, 3e-2, 0.9999)
    compare("hidden, float32 twin vs float16 original (for scale)", ref32, ref16, 3e-2, 0.9999)


def main():
    with tempfile.TemporaryDirectory(prefix="imagine-f32-") as tmp:
        check_fixture_pack(tmp)
        check_qwen_like(tmp)
    if FAILED:
        print(f"check_converted: {len(FAILED)} comparisons out of tolerance: {FAILED}")
        sys.exit(1)
    print("check_converted: all comparisons within tolerance")


if __name__ == "__main__":
    main()
