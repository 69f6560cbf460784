"""A `Gemm` or a `MatMulNBits` with heavy weights computed in parts of its weights' rows
(`imagine_core::graph::weight_parts::by_rows`, natively through `cargo run -p imagine-core --example
edit_graph -- gemm-parts | matmul-parts`): the load-time edit that keeps ONNX Runtime Web from uploading
FLUX.2's modulation projections (113 MB each in float16), and where stages load one at a time its largest
int8 projections (28 to 54 MB), through one staging buffer each, which Chromium keeps as shared memory in
the renderer. Output column n reads only row n of the weights (B with `transB` set and a per-column bias;
for `MatMulNBits` B, scales, zero points and bias), so each part reads its rows from the same file at
another offset, and the output must be the same: bit for bit for a `Gemm`, on ONNX Runtime's CPU and on
ONNX Runtime Web's wasm build (the extension's), in float16 and float32; for `MatMulNBits` within rounding,
also for the tiny transformers with their chains in chunks of tokens. Parts joined in the wrong order are
seen."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import edit_graph, node_ort_web, ort_web_output
from test_attention_chunks import copy_pack, relative
from test_attention_fusion import cosine, ops, run, transformer_feeds
from test_projection_parts import assert_computes_as_exported, chunk_rows, per_part

N, K = 40, 24


def gemm_parts(model, out, max_part_bytes):
    return edit_graph("gemm-parts", model, out, str(max_part_bytes))


def gemm(path, dtype, bias):
    """y = Gemm(x, w, b; transB=1, alpha 0.5, beta 2) with w [N, K] in `<path>.data`, after 16 bytes of
    other data; `b`: "column" (N values), "one" (a single value) or None."""
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    rng = np.random.default_rng(3)
    w = rng.standard_normal((N, K)).astype(dtype)
    data = os.path.basename(path) + ".data"
    with open(path + ".data", "wb") as f:
        f.write(b"\0" * 16 + w.tobytes())
    weights = TensorProto(name="w", data_type=elem, dims=[N, K], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", data), ("offset", "16"), ("length", str(w.nbytes))):
        weights.external_data.add(key=key, value=value)
    inits, inputs = [weights], ["x", "w"]
    if bias:
        values = rng.standard_normal((N,) if bias == "column" else (1,)).astype(dtype)
        inits.append(numpy_helper.from_array(values, "b"))
        inputs.append("b")
    node = helper.make_node("Gemm", inputs, ["y"], name="modulation", transB=1, alpha=0.5, beta=2.0)
    graph = helper.make_graph([node], "gemm", [helper.make_tensor_value_info("x", elem, ["m", K])],
                              [helper.make_tensor_value_info("y", elem, ["m", N])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return w.nbytes


def web_output(path, data, feeds, tmp_dir):
    os.makedirs(tmp_dir)
    res = node_ort_web(path, feeds, [data], tmp=str(tmp_dir))
    assert res["ok"], res
    out = res["outputs"]["y"]
    data = np.array(out["data"], np.uint16 if out["type"] == "float16" else np.float32)
    return (data.view(np.float16) if out["type"] == "float16" else data).reshape(out["dims"])


@pytest.mark.parametrize("bias", ["column", "one", None])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_gemm_in_parts_computes_what_the_whole_one_does(dtype, bias, tmp_path):
    original, parted = str(tmp_path / "gemm.onnx"), str(tmp_path / "gemm.parts.onnx")
    weight_bytes = gemm(original, dtype, bias)
    # Parts of at most a third of the weights: 3 parts of 14, 14 and 12 rows.
    assert gemm_parts(original, parted, weight_bytes // 3 + 1) == 1
    assert sorted(ops(parted)) == ["Concat", "Gemm", "Gemm", "Gemm"]
    onnx.checker.check_model(onnx.load(parted), full_check=True)
    graph = onnx.load(parted, load_external_data=False).graph
    offsets = sorted(int(e.value) for t in graph.initializer for e in t.external_data if e.key == "offset")
    row = K * np.dtype(dtype).itemsize
    assert offsets == [16, 16 + 14 * row, 16 + 28 * row]

    x = np.random.default_rng(4).standard_normal((3, K)).astype(dtype)
    expected = run(original, {"x": x})
    assert np.array_equal(run(parted, {"x": x}), expected)
    # ORT Web's kernels are not ORT CPU's: the parts against the whole on the same build.
    web = [web_output(p, original + ".data", {"x": x}, tmp_path / d) for p, d in [(original, "web"), (parted, "web-parts")]]
    assert np.array_equal(web[1], web[0])


def with_parts_swapped(parted):
    """`parted` with its Concat's first two parts in each other's place, saved beside it."""
    model = onnx.load(parted, load_external_data=False)
    concat = next(n for n in model.graph.node if n.op_type == "Concat")
    concat.input[0], concat.input[1] = concat.input[1], concat.input[0]
    swapped = parted.replace(".onnx", ".swapped.onnx")
    onnx.save(model, swapped)
    return swapped


def test_parts_joined_in_the_wrong_order_are_seen(tmp_path):
    original, parted = str(tmp_path / "gemm.onnx"), str(tmp_path / "gemm.parts.onnx")
    weight_bytes = gemm(original, np.float32, "column")
    assert gemm_parts(original, parted, weight_bytes // 2) == 1
    x = np.random.default_rng(4).standard_normal((3, K)).astype(np.float32)
    assert not np.array_equal(run(with_parts_swapped(parted), {"x": x}), run(original, {"x": x}))


def with_gemm_outputs(path, out):
    """`path` with every Gemm's output an output of the graph too (its weights beside it)."""
    model = onnx.load(path, load_external_data=False)
    elem = model.graph.output[0].type.tensor_type.elem_type
    names = [n.output[0] for n in model.graph.node if n.op_type == "Gemm"]
    model.graph.output.extend(helper.make_tensor_value_info(name, elem, None) for name in names)
    onnx.save(model, out)
    return names


def run_all(path, feeds):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})))


@pytest.mark.parametrize("activations", ["float32", "float16"])
def test_tiny_transformers_in_parts_give_the_same_values(tiny_packs, activations, tmp_path):
    pack, exported = copy_pack(tiny_packs, activations, tmp_path)
    original = os.path.join(pack, "transformer_q8.gemms.onnx")
    parted = os.path.join(pack, "transformer_q8.gemm_parts.onnx")
    # The modulations (img and txt 768 x 128, single 384 x 128), the time embedder's two projections and
    # norm_out's: every Gemm has float weights over 16 KB.
    gemms = with_gemm_outputs(exported, original)
    assert len(gemms) == 6
    assert gemm_parts(original, parted, 16 << 10) == 6
    assert ops(parted).count("Gemm") > 12 and ops(parted).count("Concat") == ops(original).count("Concat") + 6
    feeds = transformer_feeds(original, np.random.default_rng(0))
    expected, got = run_all(original, feeds), run_all(parted, feeds)
    assert set(got) == set(expected) and len(expected) == 7
    for name, values in expected.items():
        if activations == "float32":
            assert np.array_equal(got[name], values), name
        else:
            # ORT's CPU has no float16 Gemm, Sigmoid or Mul: it computes runs of them in float32 between
            # Casts, and a Concat (which it has in float16) ends such a run where the export's Gemm
            # went on in float32, so a value is rounded to float16 once more and the difference
            # travels on. A GPU with shader-f16 rounds after every node either way, and one Gemm alone
            # is the same bit for bit in float16 (above); here, as close as the other float16 edits.
            a, b = got[name].astype(np.float64), values.astype(np.float64)
            rel, cos = relative(a, b), cosine(a, b)
            print(f"\nfloat16 {name}: max difference {rel:.2e} of the largest value, cosine {cos:.9f}")
            assert rel <= 2e-3 and cos >= 0.99999, (name, rel, cos)


def matmul_parts(model, out, max_part_bytes):
    return edit_graph("matmul-parts", model, out, str(max_part_bytes))


def matmul(path, bits, bias, k=256, n=96):
    """y = MatMulNBits(a [1, m, k]) of `n` columns, block 128, `bits` bits with zero points (4-bit: packed,
    an odd count per row), B and scales in `<path>.data` after 16 bytes of other data, the bias (when
    asked) inline. Returns the input and B's bytes."""
    rng = np.random.default_rng(bits * 10 + n)
    blocks = k // 128
    b = rng.integers(0, 256, (n, blocks, 128 * bits // 8), dtype=np.uint8)
    scales = (rng.random((n * blocks,)) * 0.1 + 0.01).astype(np.float32)
    data = os.path.basename(path) + ".data"
    with open(path + ".data", "wb") as f:
        f.write(b"\0" * 16 + b.tobytes() + scales.tobytes())
    inits = []
    for name, array, offset in (("B", b, 16), ("scales", scales, 16 + b.nbytes)):
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape,
                        data_location=TensorProto.EXTERNAL)
        for key, value in (("location", data), ("offset", str(offset)), ("length", str(array.nbytes))):
            t.external_data.add(key=key, value=value)
        inits.append(t)
    inits.append(numpy_helper.from_array(rng.integers(0, 256, (n, -(-blocks * bits // 8)), dtype=np.uint8), "zp"))
    inputs = ["a", "B", "scales", "zp"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
        inputs += ["", "bias"]
    node = helper.make_node("MatMulNBits", inputs, ["y"], name="projection", domain="com.microsoft",
                            K=k, N=n, bits=bits, block_size=128)
    f = TensorProto.FLOAT
    graph = helper.make_graph([node], "matmul", [helper.make_tensor_value_info("a", f, [1, "m", k])],
                              [helper.make_tensor_value_info("y", f, [1, "m", n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    onnx.save(model, path)
    return np.random.default_rng(1).standard_normal((1, 7, k)).astype(np.float32), b.nbytes


@pytest.mark.parametrize("bits, bias", [(8, True), (8, False), (4, True)])
def test_a_matmul_nbits_in_parts_computes_what_the_whole_one_does(bits, bias, tmp_path):
    original, parted = str(tmp_path / "m.onnx"), str(tmp_path / "m.parts.onnx")
    a, weight_bytes = matmul(original, bits, bias)
    # Parts of at most a third of B: 3 parts of 32 columns, each reading its rows of B, scales and
    # zero points (and bias), the first two from the same file.
    assert matmul_parts(original, parted, weight_bytes // 3) == 1
    assert sorted(ops(parted)) == ["Concat"] + ["MatMulNBits"] * 3
    onnx.checker.check_model(onnx.load(parted), full_check=True)
    graph = onnx.load(parted, load_external_data=False).graph
    assert [next(a.i for a in n.attribute if a.name == "N") for n in graph.node[:3]] == [32, 32, 32]
    row = weight_bytes // 96
    offsets = sorted(int(e.value) for t in graph.initializer if t.name.startswith("B/") for e in t.external_data if e.key == "offset")
    assert offsets == [16, 16 + 32 * row, 16 + 64 * row]

    expected = run(original, {"a": a})
    got = run(parted, {"a": a})
    rel = relative(got, expected)
    print(f"\n{bits}-bit, ORT CPU: max difference {rel:.2e} of the largest value")
    assert rel <= 1e-6, rel
    data = [original + ".data"]
    web = [ort_web_output(p, {"a": a}, data, tmp_path / d) for p, d in [(original, "web"), (parted, "web-parts")]]
    rel = relative(web[1], web[0])
    print(f"{bits}-bit, ORT Web wasm: max difference {rel:.2e} of the largest value")
    assert rel <= 1e-6, rel


def test_matmul_parts_joined_in_the_wrong_order_are_seen(tmp_path):
    original, parted = str(tmp_path / "m.onnx"), str(tmp_path / "m.parts.onnx")
    a, weight_bytes = matmul(original, 8, True)
    assert matmul_parts(original, parted, weight_bytes // 2) == 1
    assert relative(run(with_parts_swapped(parted), {"a": a}), run(original, {"a": a})) > 1e-3


@pytest.mark.parametrize("activations", ["float32", "float16"])
def test_tiny_transformers_matmuls_in_parts_compute_the_same(tiny_packs, activations, tmp_path):
    """As the stage worker edits the transformer under a small budget: projections per part, chains in 3
    chunks of tokens, then every MatMulNBits over 16 KB in parts, the chunks' copies reading one set of
    parts."""
    pack, original = copy_pack(tiny_packs, activations, tmp_path)
    parted = os.path.join(pack, "transformer_q8.parted.onnx")
    chunked = os.path.join(pack, "transformer_q8.rows.onnx")
    in_parts = os.path.join(pack, "transformer_q8.matmul_parts.onnx")
    assert per_part(original, parted) == 3 and chunk_rows(parted, chunked, 3) == 3
    before = onnx.load(chunked, load_external_data=False).graph
    # Over 16 KB of B: the MLP's down projections (K 384), the second projection (K 512), the context
    # embedder (K 7680) and the MLPs' halves (N 384), each in the 3 chunks where chained.
    changed = matmul_parts(chunked, in_parts, 16 << 10)
    heavy = [n for n in before.node if n.op_type == "MatMulNBits" and
             next(t for t in before.initializer if t.name == n.input[1]).dims[0] *
             np.prod(next(t for t in before.initializer if t.name == n.input[1]).dims[1:]) > 16 << 10]
    assert changed == len(heavy) and changed > 9, (changed, len(heavy))
    after = onnx.load(in_parts, load_external_data=False).graph
    assert ops(in_parts).count("Concat") == ops(chunked).count("Concat") + changed
    # Each part's rows are one initializer, whichever chunk reads them.
    names = [t.name for t in after.initializer]
    assert len(names) == len(set(names))
    read = {i for n in after.node for i in n.input}
    heavy_weights = {n.input[1] for n in heavy}
    parts = [t for t in names if t.split("/imagine_rows_")[0] in heavy_weights]
    assert parts and all(p in read for p in parts)
    assert_computes_as_exported(original, in_parts, activations, "MatMulNBits in parts")
