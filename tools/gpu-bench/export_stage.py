#!/usr/bin/env python3
"""Exports ONE graph of the pack with tools/export's code, so the three can be exported in parallel.

    python3 tools/gpu-bench/export_stage.py --stem transformer_q8 --config full --activations float32|float16 \
        --out DIR [--seed 0] [--threads 5]

Same models, seeds, wrappers, export, quantisation and storage as `tools/export/export.py`
(`export_pack`), graph by graph: `export_pack` builds all three models and exports them one after
the other with 2 torch threads, about 7 minutes at full size on the GPU machine's CPU
(measured there). Here each process builds only its own model, exports it
without keeping a second copy (the float32 pack needs no copy: `export_pack` deep-copies so it can
also cast to float16), frees the PyTorch model before loading the ONNX one, then quantises
(int4 text encoder, int8 transformer, MatMulNBits block 128) and writes the shards. No verification
against PyTorch here (`tools/export/verify.py` does that); the benchmark only checks that every
output is finite.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "export"))

import torch  # noqa: E402

import export  # noqa: E402  tools/export/export.py
import models  # noqa: E402
import onnx_tools as ot  # noqa: E402


def log(msg):
    print(msg, flush=True)


def build(stem, cfg, seed, activations="float32"):
    """The wrapper for `stem`, seeded exactly as models.build_all seeds each model. The weights are
    drawn in float32 whatever `activations` is, then cast in place, as `export.torch_modules` casts its
    copies: so a float16 and a float32 export of one seed hold the same weights (up to float16
    rounding)."""
    dt = getattr(torch, activations)
    if stem == "text_encoder_q4":
        torch.manual_seed(seed)
        return models.TextEncoder(models.build_text_encoder(cfg, None).to(dt), cfg.text_taps, cfg.vocab_wrap).eval()
    if stem == "transformer_q8":
        torch.manual_seed(seed + 1)
        tr = models.patch_transformer(models.build_transformer(cfg, None))
        return models.Transformer(tr.to(dt)).eval()
    torch.manual_seed(seed + 2)
    return models.VaeDecoder(models.build_vae(cfg, None, seed)).eval()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stem", choices=export.STEMS, required=True)
    ap.add_argument("--config", choices=sorted(models.CONFIGS), default="full")
    ap.add_argument("--activations", choices=("float32", "float16"), default="float32")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=5)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg = models.CONFIGS[a.config]
    os.makedirs(a.out, exist_ok=True)
    stem = a.stem
    t0 = time.time()
    with torch.no_grad():
        module = build(stem, cfg, a.seed, a.activations)
    params = sum(p.numel() for p in module.parameters())
    t1 = time.time()
    log(f"{stem}: built {params / 1e9:.2f} B parameters in {t1 - t0:.1f} s")
    ex = export.example_inputs(cfg, a.activations)[stem]
    tmp = ot.tmpdir(f"export-{stem}-")
    info = {"stem": stem, "config": a.config, "activations": a.activations, "seed": a.seed,
            "parameters": params, "versions": export.versions()}
    try:
        path = os.path.join(tmp, f"{stem}.onnx")
        ot.torch_export(module, list(ex.values()), list(ex), export.OUTPUTS[stem], export.dynamic_shapes(stem), path)
        del module
        gc.collect()
        m = ot.load(path)
        ot.set_io_dims(m, export.IO_DIMS[stem])
        ot.assert_no_double(m, stem)
        t2 = time.time()
        log(f"{stem}: exported in {t2 - t1:.1f} s")
        info["export_s"] = round(t2 - t1, 1)
        if stem == "vae_decoder":
            ot.save_single(m, a.out, stem)
        else:
            m = ot.quantize_matmul_nbits(m, bits=4 if stem == "text_encoder_q4" else 8, block_size=128)
            ot.assert_no_double(m, stem + " (quantized)")
            t3 = time.time()
            info["quantize_s"] = round(t3 - t2, 1)
            log(f"{stem}: quantized in {t3 - t2:.1f} s")
            ot.save_sharded(m, a.out, stem, cfg.shard_bytes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ops = ot.count_ops(m)
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out) if f.startswith(stem))
    info.update(seconds=round(time.time() - t0, 1), bytes=size, MatMulNBits=ops.get("MatMulNBits", 0),
                LayerNormalization=ops.get("LayerNormalization", 0))
    with open(os.path.join(a.out, f"{stem}.export.json"), "w") as f:
        json.dump(info, f, indent=2)
    log(f"{stem}: {size / 1e9:.2f} GB written, {time.time() - t0:.1f} s in all; "
        f"MatMulNBits {info['MatMulNBits']}, LayerNormalization {info['LayerNormalization']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
