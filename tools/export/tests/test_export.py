"""The exported tiny packs: layout, contract, quantisation, and agreement with PyTorch."""

import json
import os

import numpy as np
import onnx
import pytest
import torch

import models
import onnx_tools as ot
import verify

SHARDED = ("text_encoder_q4", "transformer_q8")


@pytest.mark.parametrize("act", ["float32", "float16"])
def test_layout_and_manifests(tiny_packs, act):
    d = tiny_packs[act]
    files = set(os.listdir(d))
    assert {"text_encoder_q4.onnx", "transformer_q8.onnx", "vae_decoder.onnx", "vae_decoder.onnx.data",
            "text_encoder_q4.manifest.json", "transformer_q8.manifest.json"} <= files
    assert "vae_decoder.manifest.json" not in files
    limit = models.TINY.shard_bytes
    for stem in SHARDED:
        with open(os.path.join(d, f"{stem}.manifest.json"), newline="") as f:
            text = f.read()
        shards = [s["path"] for s in json.loads(text)["shards"]]
        # byte for byte what tests/fixtures/make_packs.py writes
        assert text == json.dumps({"shards": [{"path": s} for s in shards]}, indent=2) + "\n"
        assert shards == [f"{stem}-{i:05d}.data" for i in range(len(shards))], shards
        assert len(shards) >= 2, "the tiny config's small shards make every sharded graph span files"
        m = onnx.load(os.path.join(d, f"{stem}.onnx"), load_external_data=False)
        used, biggest = set(), {}
        for t in m.graph.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                kv = {e.key: e.value for e in t.external_data}
                used.add(kv["location"])
                assert int(kv["offset"]) % ot.ALIGN == 0
                biggest[kv["location"]] = max(biggest.get(kv["location"], 0), int(kv["length"]))
        assert used == set(shards)
        for s in shards:
            size = os.path.getsize(os.path.join(d, s))
            # under the limit, unless one tensor alone is larger (then it has the shard to itself)
            assert size <= limit or size == biggest[s], (s, size)
            assert size < 2_000_000_000
    m = onnx.load(os.path.join(d, "vae_decoder.onnx"), load_external_data=False)
    locs = {e.value for t in m.graph.initializer for e in t.external_data if e.key == "location"}
    assert locs == {"vae_decoder.onnx.data"}


@pytest.mark.parametrize("act", ["float32", "float16"])
def test_graph_contents(tiny_packs, act):
    d = tiny_packs[act]
    fdt = onnx.TensorProto.FLOAT16 if act == "float16" else onnx.TensorProto.FLOAT
    for stem, bits in (("text_encoder_q4", 4), ("transformer_q8", 8)):
        m = onnx.load(os.path.join(d, f"{stem}.onnx"), load_external_data=False)
        assert not ot.double_uses(m), ot.double_uses(m)
        nb = [n for n in m.graph.node if n.op_type == "MatMulNBits"]
        assert nb and not [n for n in m.graph.node if n.op_type == "MatMul" and n.input[1] in
                           {t.name for t in m.graph.initializer}], "a constant-weight MatMul was left float"
        for n in nb:
            at = {a.name: a.i for a in n.attribute}
            assert at["bits"] == bits and at["block_size"] == 128, (n.name, at)
        io = {vi.name: vi.type.tensor_type.elem_type for vi in list(m.graph.input) + list(m.graph.output)}
        for name, t in io.items():
            assert t == (onnx.TensorProto.INT64 if name in ("input_ids", "attention_mask", "img_ids", "txt_ids")
                         else fdt), (stem, name, t)
    tr = onnx.load(os.path.join(d, "transformer_q8.onnx"), load_external_data=False)
    cfg = models.TINY.transformer
    lns = ot.layernorm_types(tr)
    # 4 per double block, 1 per single block, norm_out: the card's 41 at full size
    assert len(lns) == 4 * cfg["num_layers"] + cfg["num_single_layers"] + 1
    assert set(lns.values()) == {onnx.TensorProto.FLOAT}, lns
    vae = onnx.load(os.path.join(d, "vae_decoder.onnx"), load_external_data=False)
    assert not ot.double_uses(vae)
    shape = [x.dim_param or x.dim_value for x in vae.graph.output[0].type.tensor_type.shape.dim]
    assert shape == ["batch", 3, "16*height", "16*width"]


@pytest.mark.parametrize("act", ["float32", "float16"])
def test_verify_against_pytorch(tiny_packs, act, capsys):
    rows = verify.verify(tiny_packs[act])
    with capsys.disabled():
        verify.print_table(rows, f"\ntiny {act}")
    assert len(rows) == 5
    assert all(r[5] == "PASS" for r in rows), rows


def test_prompt_embeds_layout():
    """Per token [h_a | h_b | h_c] for taps (a, b, c), hidden_states as Qwen3Model returns them, pads included."""
    cfg = models.TINY
    torch.manual_seed(0)
    qwen = models.build_text_encoder(cfg, None)
    ids = torch.randint(0, 151936, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.int64)
    mask[0, 9:] = 0
    mask[1, 5:] = 0
    with torch.no_grad():
        got = models.TextEncoder(qwen, cfg.text_taps, True)(ids, mask)
        hs = qwen(input_ids=ids % cfg.text["vocab_size"], attention_mask=mask, output_hidden_states=True).hidden_states
    h = cfg.text["hidden_size"]
    assert got.shape == (2, 12, 3 * h) and 3 * h == 7680
    for i, k in enumerate(cfg.text_taps):
        torch.testing.assert_close(got[..., i * h:(i + 1) * h], hs[k], rtol=1e-5, atol=1e-5)
    assert models.FULL.text_taps == (9, 18, 27) and models.FULL.text_layers == 28


def test_deterministic_and_weights_dir(tmp_path):
    """Same seed, same weights; a diffusers-layout checkpoint dir loads back the same models."""
    cfg = models.TINY
    a = models.build_all(cfg, None, 5)
    b = models.build_all(cfg, None, 5)
    c = models.build_all(cfg, None, 6)
    for x, y in zip(a, b):
        for (k, v), (k2, v2) in zip(x.state_dict().items(), y.state_dict().items()):
            assert k == k2 and torch.equal(v, v2), k
    assert not torch.equal(a[1].x_embedder.weight, c[1].x_embedder.weight)
    # write <dir>/text_encoder (a Qwen3ForCausalLM, as in the klein repo), transformer/, vae/
    from transformers import Qwen3ForCausalLM

    lm = Qwen3ForCausalLM(a[0].config)
    lm.model = a[0]
    lm.save_pretrained(tmp_path / "text_encoder")
    a[1].save_pretrained(tmp_path / "transformer")
    a[2].save_pretrained(tmp_path / "vae")
    d = models.build_all(cfg, str(tmp_path), 123)
    for x, y in zip(a, d):
        sx, sy = x.state_dict(), y.state_dict()
        assert set(sx) == set(sy)
        for k in sx:
            assert torch.equal(sx[k], sy[k]), k


def test_vae_wrapper_folds_bn_and_unpatchify():
    """VaeDecoder(packed) == vae.decode(unpatchify(packed * sqrt(var + eps) + mean)), channel c*4+dy*2+dx."""
    cfg = models.TINY
    _, _, vae = models.build_all(cfg, None, 0)
    x = torch.randn(1, 128, 3, 2)
    z = unpatch = models.unpatchify(x)
    assert unpatch.shape == (1, 32, 6, 4)
    for c, dy, dx in ((0, 0, 0), (5, 1, 0), (31, 1, 1), (7, 0, 1)):
        assert torch.equal(z[0, c, 2 * 1 + dy, 2 * 0 + dx], x[0, c * 4 + dy * 2 + dx, 1, 0])
    std = torch.sqrt(vae.bn.running_var + 1e-4).view(1, -1, 1, 1)
    with torch.no_grad():
        want = vae.decode(models.unpatchify(x * std + vae.bn.running_mean.view(1, -1, 1, 1))).sample
        got = models.VaeDecoder(vae)(x)
    assert got.shape == (1, 3, 48, 32)
    torch.testing.assert_close(got, want)
    assert float(vae.bn.running_var.std()) > 0.1, "random BN statistics, so the fold is tested"
    np.testing.assert_equal(vae.config.batch_norm_eps, 1e-4)


def test_no_quantize(tmp_path):
    """--no-quantize: the float graphs under the pack's names, sharded as usual, no MatMulNBits; what
    tests/reference/diffusers_pipeline.py compares with diffusers. The graphs run in ORT to the outputs
    of the float graphs a quantized export keeps in unquantized/."""
    import export
    import onnxruntime as ort

    d = str(tmp_path / "float")
    info = export.export_pack("tiny", "float32", d, seed=0, quantize=False, keep_unquantized=True)
    assert info["quantized"] is False
    with open(os.path.join(d, "export_info.json")) as f:
        assert json.load(f)["quantized"] is False
    ex = export.example_inputs(models.TINY, "float32")
    for stem in SHARDED:
        with open(os.path.join(d, f"{stem}.manifest.json")) as f:
            assert len(json.load(f)["shards"]) >= 2
        m = onnx.load(os.path.join(d, f"{stem}.onnx"), load_external_data=False)
        assert not [n for n in m.graph.node if n.op_type == "MatMulNBits"]
        feeds = {k: v.numpy() for k, v in ex[stem].items()}
        got = ort.InferenceSession(os.path.join(d, f"{stem}.onnx")).run(None, feeds)[0]
        want = ort.InferenceSession(os.path.join(d, "unquantized", f"{stem}.onnx")).run(None, feeds)[0]
        np.testing.assert_array_equal(got, want)
