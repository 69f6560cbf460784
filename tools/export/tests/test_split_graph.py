"""The VAE decoder cut into a chain of smaller graphs (`imagine_core::graph::split`), natively
(`cargo run -p imagine-core --example split_graph`): the stage worker will run the pieces one session
each so that a run's activations fit GPU memory. On ONNX Runtime's CPU the chain must compute exactly
what the whole decoder computes (the tiny packs' decoders, the real architecture); the bytes it counts
must be the tensors' real sizes, growing with the latent's pixels (the attention's scores with their
square); a piece that lost a node must be seen. For the record it prints the full-size decoder's counts
at 512x512 and 1024x1024 (random weights, exported here in some 15 s)."""

import json
import os
import shutil
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import REPO

DECODER = "vae_decoder.onnx"
# A latent that is not square, so that swapped sides would show.
H, W = 4, 6
# Nodes a piece may run again: the shape arithmetic computed from the latent's shape.
SHAPE_OPS = {"Shape", "Squeeze", "Unsqueeze", "Gather", "Slice", "Concat", "Mul", "Reshape", "Cast", "Constant"}
# Their outputs are their input's buffer in ONNX Runtime; the split counts them as nothing.
ALIASES = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}


def split(model, out, h, w, max_bytes):
    cmd = ["cargo", "run", "-q", "-p", "imagine-core", "--example", "split_graph", "--",
           model, out, str(h), str(w), str(max_bytes)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def counted(model, tmp_path, h, w):
    """The split's count of one whole run's bytes at a latent of h x w."""
    return split(model, str(tmp_path / "counted"), h, w, 2 ** 62)["activationBytes"]


def session(path):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    # The same kernels in the chain and the whole graph: no fusion across what became a piece's edge.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run_chain(out, listing, latent):
    values = {"packed_latent": latent}
    for piece in listing["pieces"]:
        s = session(os.path.join(out, piece["file"]))
        assert [i.name for i in s.get_inputs()] == piece["inputs"]
        assert [o.name for o in s.get_outputs()] == piece["outputs"]
        results = s.run(piece["outputs"], {name: values[name] for name in piece["inputs"]})
        values.update(zip(piece["outputs"], results))
    return values["sample"]


def place(source_dir, tmp_path):
    """The decoder copied to tmp_path/whole, and tmp_path/pieces holding its data file: ONNX Runtime reads
    external data from the model's own folder only (and refuses a symbolic link out of it)."""
    whole, pieces = tmp_path / "whole", tmp_path / "pieces"
    whole.mkdir()
    pieces.mkdir()
    for f in os.listdir(source_dir):
        if f.startswith(DECODER):
            shutil.copy(os.path.join(source_dir, f), whole / f)
            if f != DECODER:
                shutil.copy(os.path.join(source_dir, f), pieces / f)
    return str(whole / DECODER), str(pieces)


def latent(seed, h=H, w=W):
    return np.random.default_rng(seed).standard_normal((1, 128, h, w)).astype(np.float32)


@pytest.mark.parametrize("activations", ["float32", "float16"])
def test_the_chain_computes_the_whole_decoder(tiny_packs, activations, tmp_path):
    model, out = place(tiny_packs[activations], tmp_path)
    whole_bytes = counted(model, tmp_path, H, W)
    listing = split(model, out, H, W, whole_bytes // 8)
    pieces = listing["pieces"]
    assert len(pieces) >= 3, pieces
    assert listing["activationBytes"] == whole_bytes
    x = latent(0)
    expected = session(model).run(None, {"packed_latent": x})[0]
    np.testing.assert_allclose(run_chain(out, listing, x), expected, rtol=0, atol=1e-6)

    # Each piece runs its own nodes as they were, and they concatenate to the decoder's; before them it
    # may run earlier shape arithmetic again. It holds exactly the initializers its nodes read, as they
    # were (the same external-data entries).
    graph = onnx.load(model, load_external_data=False).graph
    original = [n.SerializeToString() for n in graph.node]
    concatenated = []
    for piece in pieces:
        g = onnx.load(os.path.join(out, piece["file"]), load_external_data=False).graph
        start, end = piece["nodes"]
        again = len(g.node) - (end - start)
        nodes = [n.SerializeToString() for n in g.node]
        assert nodes[again:] == original[start:end]
        for n in g.node[:again]:
            assert n.op_type in SHAPE_OPS and n.SerializeToString() in original[:start], n
        concatenated += nodes[again:]
        read = {i for n in g.node for i in n.input}
        assert [t.SerializeToString() for t in g.initializer] == \
            [t.SerializeToString() for t in graph.initializer if t.name in read]
    assert concatenated == original


def test_the_counted_bytes_are_the_tensors_ort_computes(tiny_packs, tmp_path):
    """Every node output made a graph output: their real sizes (but the aliases') and the latent's add up
    to the count."""
    model, _ = place(tiny_packs["float32"], tmp_path)
    m = onnx.load(model, load_external_data=False)
    outputs = [(o, n.op_type) for n in m.graph.node for o in n.output if o]
    declared = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=o) for o, _ in outputs if o not in declared)
    every = os.path.join(os.path.dirname(model), "every_output.onnx")
    onnx.save(m, every)
    x = latent(1)
    s = session(every)
    results = dict(zip([o.name for o in s.get_outputs()], s.run(None, {"packed_latent": x})))
    real = x.nbytes + sum(results[o].nbytes for o, op in outputs if op not in ALIASES)
    assert counted(model, tmp_path, H, W) == real


def test_the_count_grows_with_the_pixels_and_the_scores_with_their_square(tiny_packs, tmp_path):
    """bytes = C + L p + Q p^2 for a latent of p pixels: fitted at three sizes, it must give the fourth;
    Q is the mid-block attention's scores and softmax (one head over the 2h x 2w pixels: 2 x 16 p^2
    float32); doubling the sides multiplies the count by 4, plus 12 Q p^2, less 3 C."""
    model, _ = place(tiny_packs["float32"], tmp_path)
    sizes = [(2, 3), (4, 6), (8, 12)]
    p = np.array([h * w for h, w in sizes], dtype=np.float64)
    b = np.array([counted(model, tmp_path, h, w) for h, w in sizes], dtype=np.float64)
    c, lin, q = np.linalg.solve(np.stack([np.ones(3), p, p * p], 1), b)
    assert q == pytest.approx(128)
    assert 0 <= c < 4096, c  # the int64 shapes
    for h, w in [(6, 9), (5, 7)]:
        assert counted(model, tmp_path, h, w) == pytest.approx(c + lin * h * w + q * (h * w) ** 2, abs=1e-3)
    one, two = counted(model, tmp_path, H, W), counted(model, tmp_path, 2 * H, 2 * W)
    assert two - 4 * one == pytest.approx(12 * q * (H * W) ** 2 - 3 * c, abs=1e-3)
    print(f"tiny decoder: {c:.0f} + {lin:.0f} p + {q:.0f} p^2 bytes; {H}x{W}: {one}, {2 * H}x{2 * W}: {two}")


def test_a_piece_that_lost_a_node_is_seen(tiny_packs, tmp_path):
    """The comparison can fail: a middle piece's SiLU loses its Sigmoid (x * x instead of x * sigmoid(x))."""
    model, out = place(tiny_packs["float32"], tmp_path)
    listing = split(model, out, H, W, counted(model, tmp_path, H, W) // 8)
    x = latent(2)
    expected = run_chain(out, listing, x)
    pieces = listing["pieces"]
    for piece in pieces[len(pieces) // 2:] + pieces[:len(pieces) // 2]:
        path = os.path.join(out, piece["file"])
        m = onnx.load(path, load_external_data=False)
        sigmoid = next((n for n in m.graph.node if n.op_type == "Sigmoid" and n.output[0] not in piece["outputs"]),
                       None)
        if sigmoid is not None:
            break
    assert sigmoid is not None
    m.graph.node.remove(sigmoid)
    for n in m.graph.node:
        n.input[:] = [sigmoid.input[0] if i == sigmoid.output[0] else i for i in n.input]
    onnx.save(m, path)
    assert np.abs(run_chain(out, listing, x) - expected).max() > 1e-3


def test_the_full_size_decoder(tmp_path):
    """The real decoder's architecture with random weights: its chain at a small latent computes what it
    computes, and its counts at 512x512 and 1024x1024 are printed for the record."""
    import torch

    import export
    import models
    import onnx_tools as ot

    torch.set_num_threads(min(2, torch.get_num_threads()))
    cfg = models.CONFIGS["full"]
    torch.manual_seed(2)
    vae = models.build_vae(cfg, None, 0)
    example = {"packed_latent": torch.randn(2, 4 * cfg.vae["latent_channels"], 4, 4)}
    source = tmp_path / "full"
    source.mkdir()
    m = export.export_float("vae_decoder", models.VaeDecoder(vae).eval(), example, str(tmp_path / "export.onnx"))
    ot.save_single(m, str(source), "vae_decoder")
    model, out = place(str(source), tmp_path)

    listing = split(model, out, 4, 4, counted(model, tmp_path, 4, 4) // 6)
    assert len(listing["pieces"]) >= 3
    x = latent(3, 4, 4)
    expected = session(model).run(None, {"packed_latent": x})[0]
    np.testing.assert_allclose(run_chain(out, listing, x), expected, rtol=0, atol=1e-6)

    budget = 2 * 10 ** 9
    for image in (512, 1024):
        side = image // 16
        chain = split(model, str(tmp_path / f"at-{image}"), side, side, budget)["pieces"]
        largest = max(p["bytes"] for p in chain)
        over = sum(p["bytes"] > budget for p in chain)
        print(f"full decoder at {image}x{image}: {counted(model, tmp_path, side, side) / 1e9:.2f} GB counted; "
              f"cut for {budget / 1e9:.0f} GB: {len(chain)} pieces, the largest {largest / 1e9:.2f} GB, "
              f"{over} over the budget")
