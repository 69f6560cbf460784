#!/usr/bin/env python3
"""Verifies an exported pack against PyTorch on identical inputs, graph by graph, with ONNX Runtime
on the CPU.

    python3 tools/export/verify.py --pack DIR [--seed N]

Rebuilds the upstream PyTorch models from DIR/export_info.json (same config, seed or --weights), runs
them in float32 (the upstream code as is: float64 RoPE, float32 everywhere), runs every graph of the
pack (and DIR/unquantized/ when present) on the same inputs, and prints one row per graph:
graph, variant, cosine, max abs err, threshold, PASS/FAIL. Also checks each graph's I/O names, dtypes
and ranks against the pack contract. Exits 1 on any FAIL.

Thresholds: cosine >= 0.9999 before quantization, >= 0.999 for the int8 transformer and the float32
VAE decoder, >= 0.99 for the int4 text encoder.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import models  # noqa: E402
import onnx_tools as ot  # noqa: E402

THRESHOLD = {("text_encoder_q4", "int4"): 0.99, ("transformer_q8", "int8"): 0.999,
             ("vae_decoder", "float32"): 0.999}
THRESHOLD_UNQUANTIZED = 0.9999


def contract(activations):
    """Expected (name, ort type, rank) of inputs and outputs for each graph, from the pack card."""
    f = "tensor(float16)" if activations == "float16" else "tensor(float)"
    i64 = "tensor(int64)"
    return {
        "text_encoder_q4": ([("input_ids", i64, 2), ("attention_mask", i64, 2)], [("prompt_embeds", f, 3)]),
        "transformer_q8": ([("hidden_states", f, 3), ("encoder_hidden_states", f, 3), ("timestep", f, 1),
                            ("img_ids", i64, 3), ("txt_ids", i64, 3)], [("noise_pred", f, 3)]),
        "vae_decoder": ([("packed_latent", "tensor(float)", 4)], [("sample", "tensor(float)", 4)]),
    }


def verification_inputs(cfg, seed=1):
    """Other shapes than the export's examples (batch 1, 24 text tokens, 6x5 latents), so the dynamic
    dims are exercised too. float32; cast per graph."""
    import export

    return export.example_inputs(cfg, "float32", batch=1, seq=24, img_hw=(6, 5), seed=seed)


def cosine(a, b):
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))


def torch_reference(cfg, qwen, tr, vae, inputs):
    with torch.no_grad():
        te = inputs["text_encoder_q4"]
        out = {"text_encoder_q4": models.text_encoder_reference(qwen, cfg.text_taps, te["input_ids"],
                                                                te["attention_mask"], cfg.vocab_wrap)}
        out["transformer_q8"] = models.Transformer(tr)(**inputs["transformer_q8"])
        out["vae_decoder"] = models.VaeDecoder(vae)(**inputs["vae_decoder"])
    return {k: v.float().numpy() for k, v in out.items()}


def run_ort(path, inputs, activations):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = {}
    for i in sess.get_inputs():
        v = inputs[i.name].numpy()
        feeds[i.name] = v.astype(ot.np_dtype(i.type))
    res = sess.run(None, feeds)[0]
    io = ([(i.name, i.type, len(i.shape)) for i in sess.get_inputs()],
          [(o.name, o.type, len(o.shape)) for o in sess.get_outputs()])
    return res.astype(np.float32), io


def verify(pack, seed=1, stream=sys.stdout):
    with open(os.path.join(pack, "export_info.json")) as f:
        info = json.load(f)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    cfg = models.CONFIGS[info["config"]]
    act = info["activations"]
    qwen, tr, vae = models.build_all(cfg, info["weights"], info["seed"])
    inputs = verification_inputs(cfg, seed)
    ref = torch_reference(cfg, qwen, tr, vae, inputs)
    want = contract(act)
    rows = []
    graphs = []
    unq = os.path.join(pack, "unquantized")
    for stem in ("text_encoder_q4", "transformer_q8", "vae_decoder"):
        if os.path.isdir(unq) and stem != "vae_decoder":
            graphs.append((stem, os.path.join(unq, f"{stem}.onnx"), f"{act} unquantized", THRESHOLD_UNQUANTIZED))
        kind = {"text_encoder_q4": "int4", "transformer_q8": "int8", "vae_decoder": "float32"}[stem]
        graphs.append((stem, os.path.join(pack, f"{stem}.onnx"), f"{act} {kind}" if stem != "vae_decoder"
                       else "float32", THRESHOLD[(stem, kind)]))
    for stem, path, variant, thr in graphs:
        got, io = run_ort(path, inputs[stem], act)
        r = ref[stem]
        ok_io = [(n, t, k) for n, t, k in io[0]] == want[stem][0] and list(io[1]) == want[stem][1]
        if got.shape != r.shape or not ok_io:
            rows.append((stem, variant, float("nan"), float("nan"), thr, "FAIL",
                         f"shape {got.shape} vs {r.shape}, io {io} vs {want[stem]}"))
            continue
        c = cosine(got, r)
        err = float(np.max(np.abs(got - r)))
        finite = bool(np.all(np.isfinite(got)))
        rows.append((stem, variant, c, err, thr, "PASS" if (c >= thr and finite) else "FAIL",
                     "" if finite else "non-finite output"))
    print_table(rows, f"{info['config']} pack {pack} vs PyTorch float32 (ORT CPU)", stream)
    return rows


def print_table(rows, title, stream=sys.stdout):
    print(title, file=stream)
    hdr = ("graph", "variant", "cosine", "max abs err", "threshold", "result")
    fmt = "| {:<16} | {:<20} | {:>10} | {:>11} | {:>9} | {:<6} |"
    print(fmt.format(*hdr), file=stream)
    print("|" + "|".join("-" * (w + 2) for w in (16, 20, 10, 11, 9, 6)) + "|", file=stream)
    for stem, variant, c, err, thr, res, note in rows:
        print(fmt.format(stem, variant, f"{c:.7f}", f"{err:.3g}", f"{thr}", res) + (f" {note}" if note else ""),
              file=stream)
    stream.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", required=True)
    ap.add_argument("--seed", type=int, default=1, help="seed of the verification inputs")
    a = ap.parse_args(argv)
    rows = verify(a.pack, a.seed)
    bad = [r for r in rows if r[5] != "PASS"]
    print(f"{len(rows) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
