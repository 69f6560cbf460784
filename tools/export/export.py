#!/usr/bin/env python3
"""Rebuilds the FLUX.2 [klein] 4B browser pack (cgb/flux2-klein-4b-onnx-webgpu layout) from the
upstream model classes.

    python3 tools/export/export.py --config tiny|full --activations float16|float32 \
        [--weights DIR] --out DIR [--seed N] [--verify] [--keep-unquantized] [--no-quantize]

Writes DIR/text_encoder_q4.onnx (int4 MatMulNBits, block 128) + shards + manifest,
DIR/transformer_q8.onnx (int8 MatMulNBits, block 128) + shards + manifest, DIR/vae_decoder.onnx
(float32) + vae_decoder.onnx.data, and DIR/export_info.json (what was built, for verify.py).
With --keep-unquantized (implied by --verify) the float graphs go to DIR/unquantized/ as well.
With --no-quantize the text encoder's and the transformer's float graphs take the quantized ones' names.
Random weights are deterministic for a seed; --weights DIR loads a diffusers-layout checkpoint
(DIR/text_encoder, DIR/transformer, DIR/vae) instead.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import models  # noqa: E402
import onnx_tools as ot  # noqa: E402

STEMS = ("text_encoder_q4", "transformer_q8", "vae_decoder")


def log(msg):
    print(msg, flush=True)


def example_inputs(cfg, activations, batch=2, seq=16, img_hw=(4, 4), seed=0):
    """Small deterministic example inputs for each graph (also used by verify.py)."""
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, activations)
    # text: right-padded prompts, real ids of the full Qwen3 vocab when the graph wraps them
    vocab = 151936 if cfg.vocab_wrap else cfg.text["vocab_size"]
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    for b in range(batch):
        mask[b, seq - 3 - 2 * b:] = 0
    h, w = img_hw
    n = h * w
    width = 3 * cfg.text["hidden_size"]
    hs = torch.randn(batch, n, cfg.transformer["in_channels"], generator=g)
    enc = torch.randn(batch, seq, width, generator=g)
    t = torch.full((batch,), 0.7)
    # ids as the klein pipeline makes them: image (t=0, h, w, l=0), text (0, 0, 0, l)
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(h).float(), torch.arange(w).float(), torch.zeros(1),
                                         indexing="ij"), -1).reshape(1, n, 4).long().expand(batch, n, 4).contiguous()
    txt_ids = torch.zeros(batch, seq, 4, dtype=torch.int64)
    txt_ids[..., 3] = torch.arange(seq)
    lat = torch.randn(batch, 4 * cfg.vae["latent_channels"], h, w, generator=g)
    return {
        "text_encoder_q4": {"input_ids": ids, "attention_mask": mask},
        "transformer_q8": {"hidden_states": hs.to(dt), "encoder_hidden_states": enc.to(dt),
                           "timestep": t.to(dt), "img_ids": img_ids, "txt_ids": txt_ids},
        "vae_decoder": {"packed_latent": lat},
    }


IO_DIMS = {
    "text_encoder_q4": {"input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"],
                        "prompt_embeds": ["batch", "sequence", 7680]},
    "transformer_q8": {"hidden_states": ["batch", "image_sequence", 128],
                       "encoder_hidden_states": ["batch", "text_sequence", 7680],
                       "timestep": ["batch"],
                       "img_ids": ["batch", "image_sequence", 4],
                       "txt_ids": ["batch", "text_sequence", 4],
                       "noise_pred": ["batch", "image_sequence", 128]},
    "vae_decoder": {"packed_latent": ["batch", 128, "height", "width"],
                    "sample": ["batch", 3, "16*height", "16*width"]},
}

OUTPUTS = {"text_encoder_q4": ["prompt_embeds"], "transformer_q8": ["noise_pred"], "vae_decoder": ["sample"]}


def dynamic_shapes(stem):
    from torch.export import Dim

    b = Dim("batch", min=1, max=64)
    if stem == "text_encoder_q4":
        s = Dim("sequence", min=2, max=4096)
        return {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}
    if stem == "transformer_q8":
        n = Dim("image_sequence", min=2, max=65536)
        t = Dim("text_sequence", min=2, max=4096)
        return {"hidden_states": {0: b, 1: n}, "encoder_hidden_states": {0: b, 1: t}, "timestep": {0: b},
                "img_ids": {0: b, 1: n}, "txt_ids": {0: b, 1: t}}
    h = Dim("height", min=2, max=1024)
    w = Dim("width", min=2, max=1024)
    return {"packed_latent": {0: b, 2: h, 3: w}}


def torch_modules(cfg, activations, qwen, tr, vae, rope_float32=True, layernorm_float32=True):
    """The three export-ready wrappers (copies; the float32 upstream models are left untouched)."""
    dt = getattr(torch, activations)
    te = models.TextEncoder(copy.deepcopy(qwen).to(dt), cfg.text_taps, cfg.vocab_wrap).eval()
    if dt == torch.float32:
        # float16 storage for the embedding table, as published (TextEncoder.store_table_as_f16_bytes)
        te.store_table_as_f16_bytes()
    trm = models.Transformer(models.patch_transformer(copy.deepcopy(tr), rope_float32=rope_float32,
                                                      layernorm_float32=layernorm_float32).to(dt)).eval()
    dec = models.VaeDecoder(vae).eval()  # float32 always
    return {"text_encoder_q4": te, "transformer_q8": trm, "vae_decoder": dec}


def export_float(stem, module, inputs, path):
    """Dynamo export of one wrapper; contract names on the I/O; no float64 anywhere. Returns ModelProto."""
    ot.torch_export(module, list(inputs.values()), list(inputs), OUTPUTS[stem], dynamic_shapes(stem), path)
    m = ot.load(path)
    ot.set_io_dims(m, IO_DIMS[stem])
    return m


def export_pack(config, activations, out, seed=0, weights=None, keep_unquantized=False, shard_bytes=None,
                quantize=True):
    torch.set_num_threads(min(2, torch.get_num_threads()))
    cfg = models.CONFIGS[config]
    shard_bytes = shard_bytes or cfg.shard_bytes
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.startswith(STEMS) or f in ("unquantized", "export_info.json"):
            p = os.path.join(out, f)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    t0 = time.time()
    qwen, tr, vae = models.build_all(cfg, weights, seed)
    log(f"built the {config} models in {time.time() - t0:.1f} s")
    mods = torch_modules(cfg, activations, qwen, tr, vae)
    ex = example_inputs(cfg, activations)
    timings, ops = {}, {}
    unq = os.path.join(out, "unquantized")
    for stem in STEMS:
        t1 = time.time()
        tmp = ot.tmpdir(f"export-{stem}-")
        try:
            m = export_float(stem, mods[stem], ex[stem], os.path.join(tmp, f"{stem}.onnx"))
            ot.assert_no_double(m, stem)
            t_exp = time.time() - t1
            if keep_unquantized:
                os.makedirs(unq, exist_ok=True)
                ot.save_single(copy.deepcopy(m), unq, stem)
            if stem == "vae_decoder":
                ot.save_single(m, out, stem)
            elif not quantize:
                t_q = 0.0
                ot.save_sharded(m, out, stem, shard_bytes)
            else:
                t2 = time.time()
                m = ot.quantize_matmul_nbits(m, bits=4 if stem == "text_encoder_q4" else 8, block_size=128)
                ot.assert_no_double(m, stem + " (quantized)")
                t_q = time.time() - t2
                ot.save_sharded(m, out, stem, shard_bytes)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        ops[stem] = ot.count_ops(m)
        timings[stem] = round(time.time() - t1, 1)
        log(f"{stem}: exported in {t_exp:.1f} s" + ("" if stem == "vae_decoder" else f", quantized in {t_q:.1f} s")
            + f", {timings[stem]:.1f} s in all; MatMulNBits {ops[stem].get('MatMulNBits', 0)},"
            f" LayerNormalization {ops[stem].get('LayerNormalization', 0)}")
    info = {"config": config, "activations": activations, "seed": seed, "weights": weights and os.path.abspath(weights),
            "text_taps": list(cfg.text_taps), "text_layers": cfg.text_layers, "shard_bytes": shard_bytes,
            "quantized": quantize,
            "versions": versions(), "seconds": timings}
    with open(os.path.join(out, "export_info.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    log(f"wrote {out} in {time.time() - t0:.1f} s")
    return info


def versions():
    import diffusers
    import onnx
    import onnxruntime
    import onnxscript
    import transformers

    return {"torch": torch.__version__, "diffusers": diffusers.__version__, "transformers": transformers.__version__,
            "onnx": onnx.__version__, "onnxscript": onnxscript.__version__, "onnxruntime": onnxruntime.__version__}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(models.CONFIGS), required=True)
    ap.add_argument("--activations", choices=("float16", "float32"), default="float16",
                    help="dtype of the text encoder's and the transformer's activations and float I/O "
                         "(float16 as published; the VAE decoder is float32 either way)")
    ap.add_argument("--weights", help="diffusers-layout checkpoint dir (text_encoder/, transformer/, vae/); "
                                      "default: random weights from --seed")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-mb", type=float, help="largest external-data shard in MB (default: the config's)")
    ap.add_argument("--keep-unquantized", action="store_true", help="also write the float graphs to OUT/unquantized/")
    ap.add_argument("--no-quantize", action="store_true",
                    help="write the text encoder's and the transformer's float graphs under the pack's names "
                         "(no MatMulNBits): what tests/reference/diffusers_pipeline.py compares with diffusers")
    ap.add_argument("--verify", action="store_true", help="then verify every graph against PyTorch (verify.py)")
    a = ap.parse_args(argv)
    export_pack(a.config, a.activations, a.out, seed=a.seed, weights=a.weights,
                keep_unquantized=a.keep_unquantized or a.verify,
                shard_bytes=int(a.shard_mb * 1e6) if a.shard_mb else None, quantize=not a.no_quantize)
    if a.verify:
        import verify

        return verify.main(["--pack", a.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
