#!/usr/bin/env python3
"""The pack export.py writes, with random weights, in about one tensor of memory: full-size packs on a
small machine.

    python3 tools/export/stream_export.py --config tiny|full --activations float16|float32 --out DIR [--seed N]

export.py holds every model in float32 and quantizes whole graphs in memory: the full config needs
about 48 GiB. Here:

1. The models are built from the same upstream classes (models.py, export.torch_modules) with every
   parameter above LARGE elements created on the meta device (no storage; small parameters and all
   buffers are real, initialised as upstream does), then given a one-element storage expanded to its
   shape (stride 0), which torch.export and the ONNX constant folder read as a view, never copied.
2. The same dynamo export and optimizer (onnx_tools.torch_export_program) give the same graph; the
   large initializers are then replaced by placeholders before the graph is serialized.
3. MatMulNBits is applied to the structure as onnxruntime's MatMulNBitsQuantizer does it (asymmetric,
   block 128: <B>_Q<bits> [N, blocks, 16*bits] uint8, <B>_scales [N, blocks], <B>_zero_points), but
   with no weights to quantize.
4. The shards are written as export.py writes them (onnx_tools.write_external: same order, alignment
   and shard limit), each large tensor generated chunk by chunk from the seed: float weights
   N(0, 0.02), quantized weights uniform bytes with scales that give them the same spread.

The graph structure (nodes, I/O, initializer names, shapes and dtypes) equals export.py's for the same
config and activations (tests/test_stream_export.py checks it on the tiny config); the weights are
random either way but not the same numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402
from torch import nn  # noqa: E402

import export  # noqa: E402
import models  # noqa: E402
import onnx_tools as ot  # noqa: E402

# Parameters with more elements than this are never materialised. Above the constant folder's input
# limit (8192), so only the folds it always does (Transpose) ever see them, and above the initializer
# de-duplication limit (1024 elements), so their (fake) values never merge two of them.
LARGE = 1 << 16
CHUNK = 1 << 24  # elements generated at a time
PENDING = "pending-stream-export"
BITS = {"text_encoder_q4": 4, "transformer_q8": 8}


def log(msg):
    print(msg, flush=True)


@contextlib.contextmanager
def large_parameters_on_meta(limit=LARGE):
    """Every nn.Parameter of more than `limit` elements registered meanwhile is put on the meta device
    (its CPU allocation, never written, is dropped); initialisers then run on it as no-ops."""
    orig = nn.Module.register_parameter

    def register(self, name, param):
        if param is not None and param.device.type != "meta" and param.numel() > limit:
            param = nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device="meta"),
                                 requires_grad=param.requires_grad)
        return orig(self, name, param)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = orig


def expand_meta_parameters(module):
    """Meta parameters -> one-element storage expanded to the shape (no memory, readable)."""
    for mod in module.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None and p.is_meta:
                fake = torch.full((), 0.01, dtype=p.dtype).expand(p.shape)
                mod._parameters[name] = nn.Parameter(fake, requires_grad=False)


def structure(cfg, activations, seed=0, stems=export.STEMS):
    """{stem: ModelProto}: the float graphs, large initializers as placeholders (EXTERNAL, PENDING)."""
    torch.manual_seed(seed)
    with large_parameters_on_meta():
        qwen = models.build_text_encoder(cfg, None)
        tr = models.build_transformer(cfg, None)
        vae = models.build_vae(cfg, None, seed)
    mods = export.torch_modules(cfg, activations, qwen, tr, vae)
    del qwen, tr, vae
    ex = export.example_inputs(cfg, activations)
    out = {}
    for stem in stems:
        t0 = time.time()
        expand_meta_parameters(mods[stem])
        inputs = ex[stem]
        prog = ot.torch_export_program(mods[stem], list(inputs.values()), list(inputs), export.OUTPUTS[stem],
                                       export.dynamic_shapes(stem))
        mods[stem] = None
        out[stem] = _serialize_without_large(prog.model)
        del prog
        ot.set_io_dims(out[stem], export.IO_DIMS[stem])
        ot.assert_no_double(out[stem], stem)
        log(f"{stem}: structure exported in {time.time() - t0:.1f} s")
    return out


def _serialize_without_large(ir_model):
    from onnx_ir import ExternalTensor, serde

    for name, v in ir_model.graph.initializers.items():
        t = v.const_value
        n = math.prod(t.shape.numpy())
        if n > LARGE:
            # uint8: the text encoder's embedding table as float16 bytes (models.TextEncoder)
            assert t.dtype.is_floating_point() or t.dtype.name == "UINT8", \
                f"{name}: a large {t.dtype} initializer cannot be random"
            v.const_value = ExternalTensor(PENDING, 0, n * t.dtype.itemsize, t.dtype, shape=t.shape, name=name)
    return serde.serialize_model(ir_model)


def quantize_structure(model, bits, block_size=128):
    """MatMulNBitsQuantizer's graph change (onnxruntime 1.30, default RTN, asymmetric), without data:
    every MatMul whose B is a 2-D float initializer becomes MatMulNBits; B is replaced by
    B_Q<bits>, B_scales and B_zero_points, appended in node order, placeholders all."""
    inits = {t.name: t for t in model.graph.initializer}
    consumers = {}
    for n in model.graph.node:
        for i in n.input:
            consumers[i] = consumers.get(i, 0) + 1
    new_nodes, new_inits, dropped = [], [], set()
    for n in model.graph.node:
        b = inits.get(n.input[1]) if n.op_type == "MatMul" and n.domain in ("", "ai.onnx") else None
        if b is None:
            new_nodes.append(n)
            continue
        if len(b.dims) != 2:
            raise NotImplementedError(f"{n.name}: MatMul weight of rank {len(b.dims)}")
        k, cols = b.dims
        blocks = (k + block_size - 1) // block_size
        blob = block_size * bits // 8
        zp_cols = blocks if bits == 8 else (blocks + 1) // 2
        new_inits += [_placeholder(f"{b.name}_Q{bits}", [cols, blocks, blob], TensorProto.UINT8),
                      _placeholder(f"{b.name}_scales", [cols, blocks], b.data_type),
                      _placeholder(f"{b.name}_zero_points", [cols, zp_cols], TensorProto.UINT8)]
        new_nodes.append(helper.make_node(
            "MatMulNBits", [n.input[0], f"{b.name}_Q{bits}", f"{b.name}_scales", f"{b.name}_zero_points"],
            list(n.output), name=n.name + f"_Q{bits}" if n.name else "", domain="com.microsoft",
            K=k, N=cols, bits=bits, block_size=block_size))
        consumers[b.name] -= 1
        if consumers[b.name] == 0:
            dropped.add(b.name)
    kept = [t for t in model.graph.initializer if t.name not in dropped]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept + new_inits)
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def _placeholder(name, dims, dtype):
    t = TensorProto(name=name, data_type=dtype, dims=dims)
    nbytes = math.prod(dims) * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype)).itemsize
    ot._set_external(t, PENDING, 0, nbytes)
    return t


def random_payload(rng, bits):
    """write_external payload: placeholders generated chunk by chunk, the rest from the proto."""
    # Uniform bytes around the middle zero point have a spread of about 2^bits / sqrt(12); the scale
    # makes the dequantized weight's spread 0.02, as the float weights.
    q_scale = 0.02 / (2 ** bits / math.sqrt(12)) if bits else None

    def payload(t):
        if t.data_location != TensorProto.EXTERNAL:
            return ot.tensor_bytes(t)
        kv = {e.key: e.value for e in t.external_data}
        assert kv["location"] == PENDING, t.name
        n = math.prod(t.dims)
        npdt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
        if t.name.endswith(("_Q4", "_Q8")):
            gen = lambda k: rng.integers(0, 256, size=k, dtype=np.uint8)  # noqa: E731
        elif t.name.endswith("_zero_points"):
            z = 0x80 if bits == 8 else 0x88  # the middle level (two 4-bit values a byte)
            gen = lambda k: np.full(k, z, np.uint8)  # noqa: E731
        elif t.name.endswith("_scales") and q_scale:
            gen = lambda k: np.full(k, q_scale, npdt)  # noqa: E731
        elif npdt == np.uint8:  # float16 bytes (the embedding table); k is even
            gen = lambda k: (rng.standard_normal(k // 2, dtype=np.float32) * 0.02).astype(np.float16).view(np.uint8)  # noqa: E731
        else:
            gen = lambda k: (rng.standard_normal(k, dtype=np.float32) * 0.02).astype(npdt)  # noqa: E731

        def chunks():
            for i in range(0, n, CHUNK):
                yield gen(min(CHUNK, n - i)).astype(npdt.newbyteorder("<"), copy=False).tobytes()

        return n * npdt.itemsize, chunks()

    return payload


def export_pack(config, activations, out, seed=0, shard_bytes=None, stems=export.STEMS):
    """Writes the pack into `out`; with `stems`, only those graphs (the others' files are left alone)."""
    torch.set_num_threads(min(2, torch.get_num_threads()))
    cfg = models.CONFIGS[config]
    shard_bytes = shard_bytes or cfg.shard_bytes
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.startswith(tuple(stems)) or f == "unquantized":
            p = os.path.join(out, f)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    t0 = time.time()
    graphs = structure(cfg, activations, seed, stems)
    timings = {"structure": round(time.time() - t0, 1)}
    rng = np.random.default_rng(seed)
    for stem in stems:
        t1 = time.time()
        m = graphs.pop(stem)
        bits = BITS.get(stem)
        if bits:
            quantize_structure(m, bits)
            ot.save_sharded(m, out, stem, shard_bytes, payload=random_payload(rng, bits))
        else:
            ot.save_single(m, out, stem, payload=random_payload(rng, None))
        timings[stem] = round(time.time() - t1, 1)
        ops = ot.count_ops(m)
        log(f"{stem}: weights written in {timings[stem]:.1f} s; MatMulNBits {ops.get('MatMulNBits', 0)},"
            f" LayerNormalization {ops.get('LayerNormalization', 0)}")
    info = {"config": config, "activations": activations, "seed": seed, "weights": None, "streamed": True,
            "text_taps": list(cfg.text_taps), "text_layers": cfg.text_layers, "shard_bytes": shard_bytes,
            "versions": export.versions(), "seconds": timings, "stems": list(stems)}
    with open(os.path.join(out, "export_info.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    log(f"wrote {out} in {time.time() - t0:.1f} s")
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(models.CONFIGS), required=True)
    ap.add_argument("--activations", choices=("float16", "float32"), default="float16")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-mb", type=float, help="largest external-data shard in MB (default: the config's)")
    ap.add_argument("--stems", nargs="+", choices=export.STEMS, default=list(export.STEMS),
                    help="only these graphs (the others' files in OUT are left as they are)")
    a = ap.parse_args(argv)
    export_pack(a.config, a.activations, a.out, seed=a.seed,
                shard_bytes=int(a.shard_mb * 1e6) if a.shard_mb else None, stems=a.stems)
    return 0


if __name__ == "__main__":
    sys.exit(main())
