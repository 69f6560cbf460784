#!/usr/bin/env python3
"""Independent reference for one Imagine generation: recomputes the image from a trace.

    python3 tests/reference/reference.py --pack DIR --trace TRACE.json --out OUT.png [--raw OUT.npy] [--threads N]

TRACE.json is a `GenerateResult` (crates/core/src/api.rs; a `{"status":"done","result":{...}}` job state
or a `{"type":"result",...}` event is accepted too). From it only width, height, steps, schedule and
trace {inputIds, attentionMask, sigmas, noise} are used. The sigmas are recomputed here from the
schedule name and must match the trace; ids, position ids, step loop, unpacking and pixel conversion
follow docs/reference-pipeline.md Part B with numpy and onnxruntime (CPU). No app code is used.
"""

import argparse
import base64
import json
import math
import os
import sys
import time

import numpy as np

MAX_TOKENS = 512
PAD_ID = 151643
SIGMA_TOL = 1e-6


class PipelineError(Exception):
    pass


# ----------------------------------------------------------------------------------------------
# schedules (Part B section 4), in float32 like diffusers' FlowMatchEulerDiscreteScheduler
# ----------------------------------------------------------------------------------------------

def compute_empirical_mu(image_seq_len, num_steps):
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    if image_seq_len > 4300:
        return float(a2 * image_seq_len + b2)
    m_200 = a2 * image_seq_len + b2
    m_10 = a1 * image_seq_len + b1
    a = (m_200 - m_10) / 190.0
    b = m_200 - 200.0 * a
    return float(a * num_steps + b)


def calculate_shift(image_seq_len, base_seq_len=256, max_seq_len=4096, base_shift=0.5, max_shift=1.15):
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    b = base_shift - m * base_seq_len
    return float(image_seq_len * m + b)


def schedule_sigmas(schedule, image_seq_len, steps):
    """steps+1 float32 sigmas: exponential time shift of linspace(1, 1/n, n), then a final 0."""
    if schedule == "empirical":
        mu = compute_empirical_mu(image_seq_len, steps)
    elif schedule == "linear-shift":
        mu = calculate_shift(image_seq_len)
    else:
        raise PipelineError(f"unknown schedule {schedule!r} (expected 'empirical' or 'linear-shift')")
    s = np.linspace(1.0, 1.0 / steps, steps).astype(np.float32)       # pipeline, then set_timesteps
    em = np.float32(math.exp(mu))                                       # python float op f32 -> f32
    s = em / (em + (np.float32(1.0) / s - np.float32(1.0)) ** np.float32(1.0))
    s = s.astype(np.float32)
    return np.concatenate([s, np.zeros(1, np.float32)]), mu


# ----------------------------------------------------------------------------------------------
# ids, packing (Part B sections 2 and 3)
# ----------------------------------------------------------------------------------------------

def txt_ids(n=MAX_TOKENS):
    ids = np.zeros((1, n, 4), np.int64)
    ids[0, :, 3] = np.arange(n)
    return ids


def img_ids(h, w):
    ids = np.zeros((1, h * w, 4), np.int64)
    ids[0, :, 1] = np.repeat(np.arange(h), w)       # row i*w + j = (0, i, j, 0)
    ids[0, :, 2] = np.tile(np.arange(w), h)
    return ids


def unpack(x, h, w):
    """[1, h*w, 128] tokens -> [1, 128, h, w]."""
    return np.ascontiguousarray(x.reshape(1, h, w, 128).transpose(0, 3, 1, 2))


def unpatchify(z):
    """[1, 128, h, w] -> [1, 32, 2h, 2w]; channel c*4 + dy*2 + dx goes to pixel (2i+dy, 2j+dx)."""
    b, c4, h, w = z.shape
    z = z.reshape(b, c4 // 4, 2, 2, h, w).transpose(0, 1, 4, 2, 5, 3)
    return np.ascontiguousarray(z.reshape(b, c4 // 4, 2 * h, 2 * w))


def to_rgba(sample):
    """[1, 3, H, W] float in about [-1, 1] -> [H, W, 4] uint8, round half to even, alpha 255."""
    x = sample[0].astype(np.float32)
    u = np.round(np.clip(x / np.float32(2) + np.float32(0.5), 0, 1) * np.float32(255)).astype(np.uint8)
    rgba = np.full((x.shape[1], x.shape[2], 4), 255, np.uint8)
    rgba[..., :3] = u.transpose(1, 2, 0)
    return rgba


# ----------------------------------------------------------------------------------------------
# onnxruntime
# ----------------------------------------------------------------------------------------------

ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
             "tensor(int32)": np.int32}


class Graph:
    def __init__(self, pack, stem, threads=0):
        import onnxruntime as ort
        path = os.path.join(pack, f"{stem}.onnx")
        if not os.path.isfile(path):
            raise PipelineError(f"{stem}: {path} not found")
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = threads  # 0: onnxruntime's default (one per core)
        self.stem = stem
        self.sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.sess.get_inputs()}

    def dtype(self, name):
        if name not in self.inputs:
            raise PipelineError(f"{self.stem}: no input {name!r} (inputs: {list(self.inputs)})")
        t = self.inputs[name].type
        if t not in ORT_TYPES:
            raise PipelineError(f"{self.stem}: input {name!r} has unsupported type {t}")
        return ORT_TYPES[t]

    def run(self, feeds, output):
        cast = {k: np.ascontiguousarray(v.astype(self.dtype(k))) for k, v in feeds.items()}
        missing = set(self.inputs) - set(cast)
        if missing:
            raise PipelineError(f"{self.stem}: inputs not fed: {sorted(missing)}")
        return self.sess.run([output], cast)[0]


# ----------------------------------------------------------------------------------------------
# the pipeline
# ----------------------------------------------------------------------------------------------

def generate(pack, input_ids, attention_mask, sigmas, noise, width, height, log=None, threads=0):
    """Runs text encoder, the Euler loop and the decoder. Returns the decoder's float32 sample."""
    h, w = height // 16, width // 16
    n = h * w
    ids = np.asarray(input_ids, np.int64).reshape(1, -1)
    mask = np.asarray(attention_mask, np.int64).reshape(1, -1)
    sigmas = np.asarray(sigmas, np.float32)
    x = np.asarray(noise, np.float32).reshape(1, n, 128).copy()
    t0 = time.perf_counter()

    te = Graph(pack, "text_encoder_q4", threads)
    emb = te.run({"input_ids": ids, "attention_mask": mask}, "prompt_embeds")
    if emb.shape != (1, ids.shape[1], 7680):
        raise PipelineError(f"text_encoder_q4: prompt_embeds has shape {emb.shape}")
    del te
    t1 = time.perf_counter()

    tr = Graph(pack, "transformer_q8", threads)
    t_ids, i_ids = txt_ids(ids.shape[1]), img_ids(h, w)
    for i in range(len(sigmas) - 1):
        v = tr.run({"hidden_states": x, "encoder_hidden_states": emb,
                    "timestep": np.array([sigmas[i]], np.float32),
                    "img_ids": i_ids, "txt_ids": t_ids}, "noise_pred")
        if v.shape != x.shape:
            raise PipelineError(f"transformer_q8: noise_pred has shape {v.shape}, expected {x.shape}")
        dt = np.float32(sigmas[i + 1] - sigmas[i])
        x = (x + dt * v.astype(np.float32)).astype(np.float32)
    del tr
    t2 = time.perf_counter()

    dec = Graph(pack, "vae_decoder", threads)
    if len(dec.inputs) != 1:
        raise PipelineError(f"vae_decoder: expected one input, found {list(dec.inputs)}")
    (name, info), = dec.inputs.items()
    z = unpack(x, h, w)
    shape = info.shape
    if len(shape) == 4 and shape[1] == 128:
        feed = z
        scale = 16
    elif len(shape) == 4 and shape[1] == 32:
        feed = unpatchify(z)
        scale = 8
    else:
        raise PipelineError(f"vae_decoder: input {name!r} has shape {shape}; "
                             "expected [batch, 128, height, width] or [batch, 32, height, width]")
    if dec.dtype(name) != np.float32:
        raise PipelineError(f"vae_decoder: input {name!r} is {info.type}, expected tensor(float)")
    out_name = dec.sess.get_outputs()[0].name
    sample = dec.run({name: feed}, out_name).astype(np.float32)
    if sample.shape != (1, 3, feed.shape[2] * scale, feed.shape[3] * scale) or \
            sample.shape[2:] != (height, width):
        raise PipelineError(f"vae_decoder: {out_name} has shape {sample.shape}, "
                             f"expected (1, 3, {height}, {width})")
    t3 = time.perf_counter()
    if log:
        log(f"text encoder {t1 - t0:.3f} s, transformer {len(sigmas) - 1} steps {t2 - t1:.3f} s, "
            f"decoder ({name} {list(feed.shape)}) {t3 - t2:.3f} s")
    return sample


def load_trace(path):
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    if isinstance(doc, dict) and isinstance(doc.get("result"), dict):
        doc = doc["result"]                      # JobState::Done
    for key in ("width", "height", "steps", "schedule", "trace"):
        if key not in doc:
            raise PipelineError(f"{path}: no field {key!r}")
    if not isinstance(doc["trace"], dict):
        raise PipelineError(f"{path}: trace is {doc['trace']!r}; generate with \"trace\": true")
    return doc


def check_trace(doc):
    """Validates the trace against Part B and returns (ids, mask, sigmas, noise)."""
    width, height, steps = int(doc["width"]), int(doc["height"]), int(doc["steps"])
    if width <= 0 or height <= 0 or width % 16 or height % 16:
        raise PipelineError(f"size {width}x{height} is not a positive multiple of 16")
    if steps < 1:
        raise PipelineError(f"steps {steps} < 1")
    tr = doc["trace"]
    ids = np.asarray(tr["inputIds"], np.int64)
    mask = np.asarray(tr["attentionMask"], np.int64)
    if ids.shape != (MAX_TOKENS,) or mask.shape != (MAX_TOKENS,):
        raise PipelineError(f"inputIds/attentionMask have lengths {ids.size}/{mask.size}, expected 512")
    if not np.all((mask == 0) | (mask == 1)):
        raise PipelineError("attentionMask holds values other than 0 and 1")
    real = int(mask.sum())
    if real == 0 or not np.all(mask[:real] == 1):
        raise PipelineError("attentionMask is not a run of 1s followed by 0s (right padding)")
    if not np.all(ids[real:] == PAD_ID):
        raise PipelineError(f"padding positions hold ids other than {PAD_ID}")
    if np.any(ids < 0):
        raise PipelineError("negative token id")
    n = (width // 16) * (height // 16)
    mine, mu = schedule_sigmas(doc["schedule"], n, steps)
    traced = np.asarray(tr["sigmas"], np.float64)
    if traced.shape != mine.shape:
        raise PipelineError(f"trace has {traced.size} sigmas, expected steps+1 = {mine.size}")
    diff = np.abs(traced - mine.astype(np.float64))
    if diff.max() > SIGMA_TOL:
        raise PipelineError(f"sigmas differ from schedule {doc['schedule']!r} (mu {mu:.6f}, N {n}): "
                             f"trace {traced.tolist()} vs reference {mine.tolist()} "
                             f"(max diff {diff.max():.3g})")
    raw = base64.b64decode(tr["noise"], validate=True)
    if len(raw) != n * 128 * 4:
        raise PipelineError(f"noise has {len(raw)} bytes, expected [1,{n},128] float32 = {n * 512}")
    noise = np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(1, n, 128)
    if not np.all(np.isfinite(noise)):
        raise PipelineError("noise holds non-finite values")
    return ids, mask, mine, noise


def write_png(path, rgba):
    from PIL import Image
    Image.fromarray(rgba, "RGBA").save(path, format="PNG")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Recompute an Imagine image from its trace.")
    ap.add_argument("--pack", required=True, help="pack directory (the three .onnx graphs and their data)")
    ap.add_argument("--trace", required=True, help="GenerateResult JSON with trace")
    ap.add_argument("--out", required=True, help="output PNG (RGBA)")
    ap.add_argument("--raw", help="also save the decoder's float32 sample [1,3,H,W] as .npy")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="onnxruntime's threads per graph (default: one per core)")
    args = ap.parse_args(argv)
    log = None if args.quiet else (lambda m: print(m, file=sys.stderr))
    try:
        doc = load_trace(args.trace)
        ids, mask, sigmas, noise = check_trace(doc)
        sample = generate(args.pack, ids, mask, sigmas, noise, int(doc["width"]), int(doc["height"]),
                          log=log, threads=args.threads)
    except PipelineError as e:
        print(f"reference: error: {e}", file=sys.stderr)
        return 2
    if args.raw:
        np.save(args.raw, sample)
    write_png(args.out, to_rgba(sample))
    if log:
        log(f"wrote {args.out} ({doc['width']}x{doc['height']}, {doc['steps']} steps, "
            f"schedule {doc['schedule']}, sigmas {sigmas.tolist()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
