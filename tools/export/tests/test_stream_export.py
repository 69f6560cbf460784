"""stream_export.py (full-size packs in about one tensor of memory) writes the graphs export.py writes."""

import os

import onnx
import pytest

import export
import onnx_tools as ot
import stream_export


def graph_structure(model):
    """What must not differ: nodes (op, domain, inputs, outputs, attributes), graph I/O (name, dtype,
    dims), initializers (name, dtype, dims) in order, opsets."""
    def io(vi):
        tt = vi.type.tensor_type
        return vi.name, tt.elem_type, [d.dim_param or d.dim_value for d in tt.shape.dim]

    def attrs(n):
        return sorted((a.name, onnx.helper.get_attribute_value(a)) for a in n.attribute
                      if a.type != onnx.AttributeProto.TENSOR) + \
            sorted((a.name, onnx.numpy_helper.to_array(a.t).tolist()) for a in n.attribute
                   if a.type == onnx.AttributeProto.TENSOR)

    g = model.graph
    return {
        "nodes": [(n.op_type, n.domain, list(n.input), list(n.output), attrs(n)) for n in g.node],
        "inputs": [io(v) for v in g.input],
        "outputs": [io(v) for v in g.output],
        "initializers": [(t.name, t.data_type, list(t.dims)) for t in g.initializer],
        "opsets": sorted((o.domain, o.version) for o in model.opset_import),
    }


@pytest.fixture(scope="module", params=["float32", "float16"])
def streamed(request, tmp_path_factory):
    d = str(tmp_path_factory.mktemp(f"streamed-{request.param}"))
    stream_export.export_pack("tiny", request.param, d, seed=0)
    return request.param, d


def test_same_structure_as_export(tiny_packs, streamed):
    act, d = streamed
    for stem in export.STEMS:
        want = graph_structure(onnx.load(os.path.join(tiny_packs[act], f"{stem}.onnx"), load_external_data=False))
        got = graph_structure(onnx.load(os.path.join(d, f"{stem}.onnx"), load_external_data=False))
        for k in want:
            assert got[k] == want[k], f"{stem} ({act}): {k} differ"
    # the same files, the shards split alike (same tensors, same order, same limit)
    assert sorted(os.listdir(d)) == sorted(f for f in os.listdir(tiny_packs[act]) if f != "unquantized")
    for f in os.listdir(d):
        if f.endswith(".data"):
            assert os.path.getsize(os.path.join(d, f)) == os.path.getsize(os.path.join(tiny_packs[act], f)), f


def test_streamed_pack_runs_finite(streamed):
    """Loaded by ONNX Runtime (CPU), every graph runs and gives finite outputs."""
    import numpy as np
    import onnxruntime as ort

    act, d = streamed
    ex = export.example_inputs(stream_export.models.TINY, act)
    for stem in export.STEMS:
        s = ort.InferenceSession(os.path.join(d, f"{stem}.onnx"), providers=["CPUExecutionProvider"])
        out = s.run(None, {k: v.numpy() for k, v in ex[stem].items()})[0]
        assert np.isfinite(out.astype(np.float32)).all(), stem
        assert float(np.abs(out.astype(np.float32)).max()) > 0, stem


def test_large_parameters_take_no_memory():
    """Parameters above LARGE elements are never allocated: a 2^30-element Linear builds instantly."""
    with stream_export.large_parameters_on_meta():
        lin = __import__("torch").nn.Linear(1 << 15, 1 << 15)
    assert lin.weight.is_meta and not lin.bias.is_meta
    stream_export.expand_meta_parameters(lin)
    assert lin.weight.shape == (1 << 15, 1 << 15) and lin.weight.untyped_storage().nbytes() <= 4
    assert ot.OPSET == 18
