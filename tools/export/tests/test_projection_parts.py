"""Wide projections computed per part (`imagine_core::graph::projections::per_part`), and the token-wise
chains after them in chunks of tokens (`imagine_core::graph::rows::chunk_rows`), natively (`cargo run -p
imagine-core --example edit_graph -- per-part | chunk-rows`): the memory plan's graph edits that keep the
transformer's widest tensors (a single-stream block's fused projection, cut at once into query, key,
value and the MLP's halves; then the MLP's and the second projection's input) from ever existing, or
under ONNX Runtime Web's cache limit. Output column n of MatMulNBits reads only row n of its weights, so
each part is the same node over a range of rows, read from the same external file at another offset;
the MLP works token by token, so chunks of tokens give the same rows. The edited graphs must compute what
the originals compute, on ONNX Runtime's CPU and on ONNX Runtime Web's wasm build (the extension's), also
after re-blocking (the stored form the extension loads). Parts or chunks put in the wrong places are
seen."""

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import edit_graph, ort_web_output
from test_attention_chunks import copy_pack, relative
from test_attention_fusion import cosine, ops, run, transformer_feeds
from test_matmul_blocks import block32


def per_part(model, out):
    return edit_graph("per-part", model, out)


def chunk_rows(model, out, chunks):
    return edit_graph("chunk-rows", model, out, str(chunks))


def part_nodes(path):
    return [n for n in onnx.load(path, load_external_data=False).graph.node if "/columns_" in n.name]


def locations(path):
    graph = onnx.load(path, load_external_data=False).graph
    return {e.value for t in graph.initializer for e in t.external_data if e.key == "location"}


def assert_computes_as_exported(original, edited, activations, what):
    """`edited` gives `original`'s output on ORT CPU: float32 within rounding, float16 as ORT's float16
    kernel rounds a narrower product's sums differently."""
    feeds = transformer_feeds(original, np.random.default_rng(0))
    expected, got = run(original, feeds), run(edited, feeds)
    rel, cos = relative(got, expected), cosine(got, expected)
    print(f"\n{activations}, {what}, ORT CPU: max difference {rel:.2e} of the largest value, cosine {cos:.9f}")
    if activations == "float32":
        assert rel <= 1e-5 and cos >= 0.999999, (rel, cos)
    else:
        assert rel <= 1e-3 and cos >= 0.99999, (rel, cos)


def difference_when_edited(original, graph, edit, what):
    """The largest difference from `original`'s output, relative to its largest value, of `graph` after
    `edit(model)`."""
    feeds = transformer_feeds(original, np.random.default_rng(0))
    model = onnx.load(graph, load_external_data=False)
    edit(model)
    broken = graph.replace(".onnx", ".broken.onnx")
    onnx.save(model, broken)
    rel = relative(run(broken, feeds), run(original, feeds))
    print(f"\n{what}: max difference {rel:.2e} of the largest value")
    return rel


@pytest.mark.parametrize("activations", ["float32", "float16"])
def test_tiny_transformers_per_part_compute_the_same(tiny_packs, activations, tmp_path):
    pack, original = copy_pack(tiny_packs, activations, tmp_path)
    files = sorted(os.listdir(pack))
    parted = os.path.join(pack, "transformer_q8.parted.onnx")
    before = ops(original)
    # The double-stream block's two gated MLPs (two Slices each) and the single-stream block's fused
    # projection (a Split into query-key-value, cut in three, and the MLP, cut by two Slices).
    assert per_part(original, parted) == 3
    after = ops(parted)
    assert after.count("MatMulNBits") == before.count("MatMulNBits") - 3 + 9
    assert after.count("Split") == before.count("Split") - 2
    assert after.count("Slice") == before.count("Slice") - 6
    widths = sorted(next(a.i for a in n.attribute if a.name == "N") for n in part_nodes(parted))
    assert widths == [128] * 3 + [384] * 6
    # Nothing copied: the parts read the pack's own files.
    assert locations(parted) <= locations(original) and sorted(os.listdir(pack)) == sorted(files + ["transformer_q8.parted.onnx"])

    assert_computes_as_exported(original, parted, activations, "per part")


@pytest.mark.parametrize("chunks", [2, 3])
@pytest.mark.parametrize("activations", ["float32", "float16"])
def test_tiny_transformers_chains_in_chunks_of_tokens_compute_the_same(tiny_packs, activations, chunks, tmp_path):
    """40 tokens in 2 and 3 chunks (3 does not divide 40: ONNX Runtime's Split makes 14, 14 and 12)."""
    pack, original = copy_pack(tiny_packs, activations, tmp_path)
    parted = os.path.join(pack, "transformer_q8.parted.onnx")
    chunked = os.path.join(pack, "transformer_q8.rows.onnx")
    assert per_part(original, parted) == 3
    # The double-stream block's two MLPs and the single-stream block's MLP with its second projection.
    assert chunk_rows(parted, chunked, chunks) == 3
    before, after = ops(parted), ops(chunked)
    assert after.count("MatMulNBits") == before.count("MatMulNBits") + (chunks - 1) * (3 + 3 + 3)
    assert after.count("Split") == before.count("Split") + 2 + 2
    assert_computes_as_exported(original, chunked, activations, f"{chunks} chunks of tokens")


def test_chunks_of_tokens_put_back_wrong_are_seen(tiny_packs, tmp_path):
    pack, original = copy_pack(tiny_packs, "float32", tmp_path)
    parted = os.path.join(pack, "transformer_q8.parted.onnx")
    chunked = os.path.join(pack, "transformer_q8.rows.onnx")
    assert per_part(original, parted) == 3 and chunk_rows(parted, chunked, 2) == 3

    def swap(model):
        next(n for n in model.graph.node if n.name == "imagine_rows/2/concat").input.reverse()

    assert difference_when_edited(original, chunked, swap, "chunks of tokens swapped") > 1e-3


def test_reblocked_then_per_part_computes_the_same(tiny_packs, tmp_path):
    """The stored form the extension loads on WebGPU: re-blocked to 32 with computed scales and zero
    points in a data file of its own, then cut per part at load."""
    pack, original = copy_pack(tiny_packs, "float32", tmp_path)
    reblocked = os.path.join(pack, "transformer_q8.block32.onnx")
    parted = os.path.join(pack, "transformer_q8.block32.parted.onnx")
    assert block32(original, reblocked) > 0
    assert per_part(reblocked, parted) == 3
    assert "imagine-block32.data" in locations(parted)
    feeds = transformer_feeds(original, np.random.default_rng(1))
    rel = relative(run(parted, feeds), run(original, feeds))
    print(f"\nre-blocked, per part: max difference {rel:.2e} of the largest value")
    assert rel <= 1e-5


def test_parts_computed_into_the_wrong_places_are_seen(tiny_packs, tmp_path):
    pack, original = copy_pack(tiny_packs, "float32", tmp_path)
    parted = os.path.join(pack, "transformer_q8.parted.onnx")
    assert per_part(original, parted) == 3

    def swap(model):
        # Query and key swapped: the same shapes, the columns in the wrong places.
        query, key = [n for n in model.graph.node if n.name.startswith("node_linear_19_Q8/columns_")][:2]
        query.output[0], key.output[0] = key.output[0], query.output[0]

    assert difference_when_edited(original, parted, swap, "query and key swapped") > 1e-3


def test_the_parted_transformer_runs_on_ort_web(tiny_packs, tmp_path):
    """The extension's build (webgpu bundle, asyncify wasm) on its wasm backend, the parts' weights
    read from the pack's files at their rows' offsets, the chains in 3 chunks of tokens."""
    pack, original = copy_pack(tiny_packs, "float32", tmp_path)
    parted = os.path.join(pack, "transformer_q8.parted.onnx")
    assert per_part(original, parted) == 3
    data = [os.path.join(pack, f) for f in sorted(os.listdir(pack)) if f.startswith("transformer_q8-")]
    feeds = transformer_feeds(original, np.random.default_rng(0))

    chunked = os.path.join(pack, "transformer_q8.rows.onnx")
    assert chunk_rows(parted, chunked, 3) == 3
    got = ort_web_output(chunked, feeds, data, tmp_path / "parted")
    web_original = ort_web_output(original, feeds, data, tmp_path / "original")
    for against, expected in [("ORT Web, as exported", web_original), ("ORT CPU, as exported", run(original, feeds))]:
        rel, cos = relative(got, expected), cosine(got, expected)
        print(f"\nORT Web wasm, per part and 3 chunks of tokens, against {against}: max difference {rel:.2e} of the largest value, cosine {cos:.9f}")
        assert rel <= 1e-5 and cos >= 0.999999, (against, rel, cos)


def cut_projection(path, bits, cut, bias=True, k=256, n=96):
    """One MatMulNBits (weights, 4-bit zero points with an odd count per row, bias inline) whose [m, n]
    output `cut` takes apart: "split" (a Split with sizes, then Slices of its second part), "equal"
    (Split into three by num_outputs), "rows" (a Split of axis 0: not a column cut) or "read" (as
    "split", with the second part read whole by another node too)."""
    rng = np.random.default_rng(bits * 100 + n)
    blocks = k // 128 + 1 if bits == 4 else k // 128
    kk = blocks * 128
    b = rng.integers(0, 256, (n, blocks, 128 * bits // 8), dtype=np.uint8)
    inits = [numpy_helper.from_array(b, "B"),
             numpy_helper.from_array((rng.random((n * blocks,)) * 0.1 + 0.01).astype(np.float32), "scales"),
             numpy_helper.from_array(rng.integers(0, 256, (n, -(-blocks * bits // 8)), dtype=np.uint8), "zp")]
    inputs = ["a", "B", "scales", "zp"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
        inputs += ["", "bias"]
    nodes = [helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", K=kk, N=n, bits=bits, block_size=128)]
    outputs = []
    const = lambda name, values: inits.append(numpy_helper.from_array(np.array(values, np.int64), name))
    if cut == "equal":
        nodes.append(helper.make_node("Split", ["y"], ["p0", "p1", "p2"], axis=-1, num_outputs=3))
        outputs = ["p0", "p1", "p2"]
    elif cut == "rows":
        const("halves", [2, 5])
        nodes.append(helper.make_node("Split", ["y", "halves"], ["p0", "p1"], axis=0))
        outputs = ["p0", "p1"]
    else:
        const("sizes", [32, 64])
        nodes.append(helper.make_node("Split", ["y", "sizes"], ["p0", "rest"], axis=1))
        for name, (s, e) in {"first": (0, 40), "second": (40, 2**63 - 1)}.items():
            const(f"{name}_s", [s]), const(f"{name}_e", [e])
            nodes.append(helper.make_node("Slice", ["rest", f"{name}_s", f"{name}_e", "axis"], [name]))
        const("axis", [-1])
        outputs = ["p0", "first", "second"]
        if cut == "read":
            nodes.append(helper.make_node("Relu", ["rest"], ["rest_relu"]))
            outputs.append("rest_relu")
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", f, ["m", kk])],
                              [helper.make_tensor_value_info(o, f, [f"{o}_rows", f"{o}_columns"]) for o in outputs], inits,
                              value_info=[helper.make_tensor_value_info("y", f, ["m", n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    onnx.save(model, path)
    return np.random.default_rng(1).standard_normal((7, kk)).astype(np.float32)


def run_all(path, feeds):
    import onnxruntime as ort
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


@pytest.mark.parametrize("bits, cut, bias, parts", [
    (4, "split", True, 3),   # Split with sizes, then two Slices (one to i64::MAX), 4-bit, bias
    (8, "split", False, 3),
    (8, "equal", True, 3),   # Split by num_outputs on axis -1
    (8, "read", True, 2),    # the second part read whole too: two parts, its Slices kept
    (8, "rows", True, 0),    # a cut of the rows, not the columns: left as it is
])
def test_single_projections_per_part_compute_the_same(tmp_path, bits, cut, bias, parts):
    original, parted = str(tmp_path / "p.onnx"), str(tmp_path / "pp.onnx")
    a = cut_projection(original, bits, cut, bias)
    assert per_part(original, parted) == min(parts, 1)
    assert len(part_nodes(parted)) == parts
    onnx.checker.check_model(onnx.load(parted), full_check=True)
    for got, expected in zip(run_all(parted, {"a": a}), run_all(original, {"a": a})):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
