"""ONNX side of the export: dynamo export, I/O naming, checks, MatMulNBits quantization, shards."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto

OPSET = 18
ALIGN = 64  # byte alignment of tensors inside external-data files (as tests/fixtures/make_packs.py)


def quiet():
    """The exporter, the optimizer and the quantizer log every node at INFO; keep warnings only."""
    import logging

    logging.getLogger().setLevel(logging.WARNING)
    for name in ("onnxscript", "onnx_ir", "onnxruntime", "torch.onnx", "torch.export"):
        logging.getLogger(name).setLevel(logging.WARNING)


def torch_export_program(module, args, input_names, output_names, dynamic_shapes):
    """torch.onnx.export with the dynamo exporter (the TorchScript one fails on aten::rms_norm),
    optimized (constant folding etc.); returns the ONNXProgram, nothing written."""
    import torch

    quiet()
    with torch.no_grad():
        prog = torch.onnx.export(module, tuple(args), dynamo=True, input_names=input_names,
                                 output_names=output_names, dynamic_shapes=dynamic_shapes,
                                 opset_version=OPSET, optimize=True, verbose=False,
                                 external_data=True)
    quiet()
    return prog


def torch_export(module, args, input_names, output_names, dynamic_shapes, path):
    """Writes `path` (torch_export_program) with all weights in one external-data file beside it."""
    torch_export_program(module, args, input_names, output_names, dynamic_shapes).save(path, external_data=True)
    return path


def load(path):
    return onnx.load(path, load_external_data=True)


def set_io_dims(model, dims):
    """dims: {io name: [dim name or int, ...]}. Renames symbolic dims of graph inputs/outputs, and the
    same symbols wherever they appear in value_info, so the graph carries the contract's names."""
    rename = {}
    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.name not in dims:
            continue
        want = dims[vi.name]
        shape = vi.type.tensor_type.shape
        assert len(shape.dim) == len(want), (vi.name, shape, want)
        for d, w in zip(shape.dim, want):
            if isinstance(w, int):
                assert not d.HasField("dim_param") and d.dim_value == w, (vi.name, d, w)
                continue
            if d.HasField("dim_param") and d.dim_param != w:
                rename.setdefault(d.dim_param, w)
            d.Clear()
            d.dim_param = w
    for vi in model.graph.value_info:
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in rename:
                d.dim_param = rename[d.dim_param]


def double_uses(model):
    """Every place float64 appears: initializers, Cast/CastLike targets, Constant values, value types."""
    found = []
    D = TensorProto.DOUBLE

    def graphs(g):
        yield g
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    yield from graphs(a.g)
                for sg in a.graphs:
                    yield from graphs(sg)

    for fn in model.functions:
        for n in fn.node:
            if n.op_type == "Cast" and any(a.name == "to" and a.i == D for a in n.attribute):
                found.append(f"function {fn.name}: Cast {n.name} to DOUBLE")
    for g in graphs(model.graph):
        for t in g.initializer:
            if t.data_type == D:
                found.append(f"initializer {t.name} is DOUBLE")
        for n in g.node:
            for a in n.attribute:
                if n.op_type == "Cast" and a.name == "to" and a.i == D:
                    found.append(f"Cast {n.name} to DOUBLE")
                if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == D:
                    found.append(f"{n.op_type} {n.name} has a DOUBLE tensor attribute")
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.tensor_type.elem_type == D:
                found.append(f"value {vi.name} is DOUBLE")
    return found


def assert_no_double(model, what):
    found = double_uses(model)
    if found:
        raise AssertionError(f"{what}: float64 in the graph ({len(found)}): " + "; ".join(found[:8]))


def layernorm_types(model):
    """{LayerNormalization node name: input elem type} after shape inference."""
    m = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=False)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in
             list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output)}
    for t in m.graph.initializer:
        types[t.name] = t.data_type
    return {n.name: types.get(n.input[0]) for n in m.graph.node if n.op_type == "LayerNormalization"}


def quantize_matmul_nbits(model, bits, block_size=128):
    """onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer, RTN, block 128."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size)
    quiet()
    q.process()
    return q.model.model


def count_ops(model):
    out = {}
    for n in model.graph.node:
        out[n.op_type] = out.get(n.op_type, 0) + 1
    return out


def tensor_bytes(t):
    """(length, chunks) of an in-memory initializer's little-endian bytes."""
    if t.data_location == TensorProto.EXTERNAL:
        raise ValueError(f"{t.name}: load external data first")
    raw = onnx.numpy_helper.to_array(t)
    raw = raw.astype(raw.dtype.newbyteorder("<")).tobytes() if raw.dtype.itemsize > 1 else raw.tobytes()
    return len(raw), (raw,)


def write_external(model, out_dir, shard_name, shard_bytes=None, min_bytes=1024, payload=tensor_bytes):
    """Moves the initializers of >= min_bytes into external-data files, in graph order, ALIGN-aligned.

    shard_name(i) names file i; with shard_bytes a new file starts when the next tensor would take the
    current one past shard_bytes (a single tensor larger than that gets a file of its own); without,
    everything goes to shard_name(0). payload(t) -> (length, iterable of bytes chunks): the tensor's
    bytes, by default from the proto (the streamed exporter generates them instead, chunk by chunk).
    Returns the file names.
    """
    shards, fh, cur_len = [], None, 0
    try:
        for t in model.graph.initializer:
            length, chunks = payload(t)
            if length < min_bytes:
                if t.data_location == TensorProto.EXTERNAL:  # small generated tensor: inline it
                    t.data_location = TensorProto.DEFAULT
                    del t.external_data[:]
                    t.raw_data = b"".join(chunks)
                continue
            pad = (-cur_len) % ALIGN
            if fh is None or (shard_bytes is not None and cur_len + pad + length > shard_bytes and cur_len > 0):
                if fh is not None:
                    fh.close()
                shards.append(shard_name(len(shards)))
                fh = open(os.path.join(out_dir, shards[-1]), "wb")
                cur_len, pad = 0, 0
            fh.write(b"\0" * pad)
            off = cur_len + pad
            n = 0
            for c in chunks:
                fh.write(c)
                n += len(c)
            assert n == length, (t.name, n, length)
            cur_len = off + length
            _set_external(t, shards[-1], off, length)
    finally:
        if fh is not None:
            fh.close()
    return shards


def save_sharded(model, out_dir, stem, shard_bytes, min_bytes=1024, payload=tensor_bytes):
    """Saves <stem>.onnx with its initializers of >= min_bytes in <stem>-00000.data, -00001.data, ...
    (write_external) and <stem>.manifest.json as tests/fixtures/make_packs.py writes it. Returns the
    shard names."""
    shards = write_external(model, out_dir, lambda i: f"{stem}-{i:05d}.data", shard_bytes, min_bytes, payload)
    onnx.save(model, os.path.join(out_dir, f"{stem}.onnx"))
    with open(os.path.join(out_dir, f"{stem}.manifest.json"), "w", newline="\n") as f:
        json.dump({"shards": [{"path": s} for s in sorted(shards)]}, f, indent=2)
        f.write("\n")
    return shards


def save_single(model, out_dir, stem, min_bytes=1024, payload=tensor_bytes):
    """Saves <stem>.onnx with its large initializers in <stem>.onnx.data (no manifest), as the
    fixture packs' decoder does."""
    shards = write_external(model, out_dir, lambda i: f"{stem}.onnx.data", None, min_bytes, payload)
    onnx.save(model, os.path.join(out_dir, f"{stem}.onnx"))
    return shards or [f"{stem}.onnx.data"]


def _set_external(t, loc, off, length):
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        t.ClearField(field)
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    for k, v in (("location", loc), ("offset", str(off)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v


def tmpdir(prefix):
    return tempfile.mkdtemp(prefix=prefix)


def np_dtype(ort_type):
    return {"tensor(float)": np.float32, "tensor(float16)": np.float16,
            "tensor(int64)": np.int64}[ort_type]
