"""Attention computed in chunks of query rows (`imagine_core::graph::attention::chunk_attention`), natively
(`cargo run -p imagine-core --example edit_graph -- chunk-attention`): the memory plan's graph edit, which keeps each
layer's attention scores within ONNX Runtime Web's largest cached GPU buffer. The chunked graph must
compute what the original computes: the tiny packs' transformers in 2 and 3 chunks of their 40 tokens
(3 does not divide 40: ONNX Runtime's Split makes parts of 14, 14 and 12) on ONNX Runtime's CPU, and
the float32 one on ONNX Runtime Web's wasm build, the one the extension ships. Parts put back wrong
are seen."""

import os
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import edit_graph, ort_web_output
from test_attention_fusion import HEAD, HEADS, attention_graph, cosine, ops, run, transformer_feeds


def chunk(model, out, chunks):
    return edit_graph("chunk-attention", model, out, str(chunks))


def relative(got, expected):
    """The largest difference, relative to the largest magnitude of `expected`."""
    return float(np.abs(got - expected).max() / np.abs(expected).max())


def copy_pack(tiny_packs, activations, tmp_path):
    pack = str(tmp_path / "pack")
    shutil.copytree(tiny_packs[activations], pack, ignore=shutil.ignore_patterns("unquantized"))
    return pack, os.path.join(pack, "transformer_q8.onnx")


def chunk_nodes(path):
    return [n for n in onnx.load(path, load_external_data=False).graph.node if n.name.startswith("imagine_chunks/")]


@pytest.mark.parametrize("chunks", [2, 3])
@pytest.mark.parametrize("activations", ["float32", "float16"])
def test_tiny_transformers_chunked_compute_the_same(tiny_packs, activations, chunks, tmp_path):
    pack, original = copy_pack(tiny_packs, activations, tmp_path)
    chunked = os.path.join(pack, "transformer_q8.chunked.onnx")
    before = ops(original)
    layers = before.count("Softmax")
    assert layers == 2  # one double-stream and one single-stream block
    assert chunk(original, chunked, chunks) == layers
    after = ops(chunked)
    assert after.count("Softmax") == layers * chunks
    assert after.count("Split") == before.count("Split") + layers  # the exporter's opset 18: Split, no Slices
    assert len(after) == len(before) + layers * (1 + 3 * (chunks - 1) + 1)
    added = [n.op_type for n in chunk_nodes(chunked)]
    assert added.count("Split") == added.count("Concat") == layers and added.count("MatMul") == 2 * chunks * layers

    feeds = transformer_feeds(original, np.random.default_rng(0))  # 24 image + 16 text tokens
    expected, got = run(original, feeds), run(chunked, feeds)
    rel, cos = relative(got, expected), cosine(got, expected)
    print(f"\n{activations}, {chunks} chunks, ORT CPU: max difference {rel:.2e} of the largest value, cosine {cos:.9f}")
    if activations == "float32":
        assert rel <= 1e-5 and cos >= 0.999999, (rel, cos)
    else:
        assert cos >= 0.9999, cos


def test_parts_put_back_wrong_are_seen(tiny_packs, tmp_path):
    pack, original = copy_pack(tiny_packs, "float32", tmp_path)
    chunked = os.path.join(pack, "transformer_q8.chunked.onnx")
    assert chunk(original, chunked, 2) == 2
    feeds = transformer_feeds(original, np.random.default_rng(0))
    expected = run(original, feeds)
    assert relative(run(chunked, feeds), expected) <= 1e-5

    def variant(name, edit):
        model = onnx.load(chunked, load_external_data=False)
        for n in model.graph.node:
            if n.op_type == "Concat" and n.name.startswith("imagine_chunks/"):
                edit(n)
        path = os.path.join(pack, f"transformer_q8.{name}.onnx")
        onnx.save(model, path)
        return path

    # The parts in the other order: the same shapes, rows in the wrong places.
    swapped = variant("swapped", lambda n: n.input.reverse())
    rel = relative(run(swapped, feeds), expected)
    print(f"\nparts swapped: max difference {rel:.2e} of the largest value")
    assert rel > 1e-3  # what passes is under 1e-5 (the attention is a small part of the tiny output)
    # Along the heads instead of the rows, [1, 2 * heads, 20, head]: the exporter's Reshape after it has
    # a -1, so it runs, with values in the wrong places.
    def heads(n):
        next(a for a in n.attribute if a.name == "axis").i = 1

    rel = relative(run(variant("heads_axis", heads), feeds), expected)
    print(f"concat on the heads axis: max difference {rel:.2e} of the largest value")
    assert rel > 1e-3


def test_the_chunked_transformer_runs_on_ort_web(tiny_packs, tmp_path):
    """The extension's build (webgpu bundle, asyncify wasm) on its wasm backend: chunked against the
    graph as exported, on the same runtime and against ONNX Runtime's CPU."""
    pack, original = copy_pack(tiny_packs, "float32", tmp_path)
    chunked = os.path.join(pack, "transformer_q8.chunked.onnx")
    assert chunk(original, chunked, 3) == 2
    data = [os.path.join(pack, f) for f in sorted(os.listdir(pack)) if f.startswith("transformer_q8-")]
    feeds = transformer_feeds(original, np.random.default_rng(0))

    got = ort_web_output(chunked, feeds, data, tmp_path / "chunked")
    web_original = ort_web_output(original, feeds, data, tmp_path / "original")
    cpu = run(original, feeds)
    for against, expected in [("ORT Web, unchunked", web_original), ("ORT CPU, unchunked", cpu)]:
        rel, cos = relative(got, expected), cosine(got, expected)
        print(f"\nORT Web wasm, 3 chunks, against {against}: max difference {rel:.2e} of the largest value, cosine {cos:.9f}")
        assert rel <= 1e-5 and cos >= 0.999999, (against, rel, cos)


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("key,scale", [("transpose", "post"), ("reshape", "pre")])
def test_small_attentions_chunked_by_split_or_slices_compute_the_same(tmp_path, opset, key, scale):
    """Opset 18 cuts the query with one Split; before it, Slices from its Shape cut the same rows."""
    original, chunked = str(tmp_path / "a.onnx"), str(tmp_path / "c.onnx")
    attention_graph(original, key=key, scale=scale)
    model = onnx.load(original)
    model.opset_import[0].version = opset
    onnx.save(model, original)
    assert chunk(original, chunked, 3) == 1
    onnx.checker.check_model(onnx.load(chunked), full_check=True)
    cut = {n.op_type for n in chunk_nodes(chunked)} & {"Split", "Slice"}
    assert cut == ({"Split"} if opset >= 18 else {"Slice"})
    rng = np.random.default_rng(3)
    for sequence in (11, 12):
        feeds = {x: rng.standard_normal((1, sequence, HEADS, HEAD)).astype(np.float32) for x in "qkv"}
        expected, got = run(original, feeds), run(chunked, feeds)
        assert relative(got, expected) <= 1e-6, (sequence, relative(got, expected))


def test_the_text_encoder_causal_attention_is_left_alone(tiny_packs, tmp_path):
    original = os.path.join(tiny_packs["float32"], "text_encoder_q4.onnx")
    out = str(tmp_path / "te.onnx")
    assert chunk(original, out, 3) == 0
    assert open(out, "rb").read() == open(original, "rb").read()
