"""The transformer cut into pieces of its weights (`imagine_core::graph::split::by_weights`, natively
through `cargo run -p imagine-core --example edit_graph -- by-weights`), as the stage worker streams it
where its weights do not fit beside its work, one piece's session at a time: run one after another, each
fed the graph's inputs and what the pieces before it gave, the pieces compute what the whole graph
computes, as exported and after the memory plan's other edits (the attention in chunks, the
projections per part, the MLPs in chunks of tokens), on ONNX Runtime's CPU. Each piece reads a share of
the weights, not all of them."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import edit_graph
from test_attention_chunks import copy_pack, relative
from test_attention_fusion import transformer_feeds


def pieces(model, prefix, parts):
    n = edit_graph("by-weights", model, prefix, str(parts))
    return [f"{prefix}.{i}.onnx" for i in range(n)]


def run_in_a_row(paths, feeds):
    """The last piece's first output, each piece fed by name from the feeds and earlier outputs."""
    held = dict(feeds)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    for path in paths:
        s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        outputs = s.run(None, {i.name: held[i.name] for i in s.get_inputs()})
        held.update(zip([o.name for o in s.get_outputs()], outputs))
    return held[s.get_outputs()[0].name].astype(np.float64)


def weight_bytes(path):
    graph = onnx.load(path, load_external_data=False).graph
    return sum(int(e.value) for t in graph.initializer for e in t.external_data if e.key == "length")


@pytest.mark.parametrize("edited", [False, True])
@pytest.mark.parametrize("activations", ["float32", "float16"])
def test_pieces_in_a_row_compute_the_whole_graphs_output(tiny_packs, activations, edited, tmp_path):
    pack, graph = copy_pack(tiny_packs, activations, tmp_path)
    if edited:
        chunked, parted, rows = (os.path.join(pack, f"transformer_q8.{e}.onnx") for e in ("chunked", "parted", "rows"))
        assert edit_graph("chunk-attention", graph, chunked, "2") > 0
        assert edit_graph("per-part", chunked, parted) > 0
        assert edit_graph("chunk-rows", parted, rows, "2") > 0
        graph = rows
    whole = weight_bytes(graph)
    for parts in (2, 3):
        paths = pieces(graph, os.path.join(pack, f"transformer_q8.in{parts}"), parts)
        assert len(paths) == parts, paths
        shares = [weight_bytes(p) for p in paths]
        print(f"\n{activations}, {'edited' if edited else 'as exported'}, {parts} pieces: weights {shares} of {whole}")
        assert all(0 < share < whole for share in shares), shares
        assert sum(shares) >= whole
        feeds = transformer_feeds(graph, np.random.default_rng(0))
        expected = run_in_a_row([graph], feeds)
        got = run_in_a_row(paths, feeds)
        assert_close(got, expected, activations, f"{parts} pieces")


def assert_close(got, expected, activations, what):
    rel = relative(got, expected)
    print(f"{activations}, {what}: max difference {rel:.2e} of the largest value")
    assert rel <= (1e-5 if activations == "float32" else 1e-3), rel


def test_a_piece_left_out_is_seen(tiny_packs, tmp_path):
    pack, graph = copy_pack(tiny_packs, "float32", tmp_path)
    paths = pieces(graph, os.path.join(pack, "transformer_q8.in2"), 2)
    feeds = transformer_feeds(graph, np.random.default_rng(0))
    with pytest.raises(KeyError):
        run_in_a_row(paths[1:], feeds)
