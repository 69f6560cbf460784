"""The text encoder's `MatMulNBits` at full size, for `cargo xtask bench blocks`: LAYERS layers of the
seven projections of Qwen3-4B (hidden 2560, 32 query and 8 key/value heads of 128, MLP 9728), int4, block
128, asymmetric (uint8 zero points, two a byte) as the exporter quantizes, float32 scales; each node reads
a graph input of its K and is a graph output. B is zeros (the bytes do not matter to session creation and
the data file stays sparse on disk); scales and zero points are random. Weights in OUT.onnx.data.

    python3 tests/e2e/lib/text_encoder_shaped_model.py OUT.onnx LAYERS"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

PROJECTIONS = [(2560, 4096), (2560, 1024), (2560, 1024), (4096, 2560), (2560, 9728), (2560, 9728), (9728, 2560)]
BLOCK = 128

out, layers = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
location = os.path.basename(out) + ".data"
initializers, nodes, outputs = [], [], []
with open(out + ".data", "wb") as data:

    def external(name, dtype, dims, values=None, nbytes=None):
        t = TensorProto(name=name, data_type=dtype, dims=dims, data_location=TensorProto.EXTERNAL)
        offset = data.seek(0, os.SEEK_END)
        if values is not None:
            data.write(values.tobytes())
        else:
            data.truncate(offset + nbytes)
        length = data.seek(0, os.SEEK_END) - offset
        for key, value in (("location", location), ("offset", offset), ("length", length)):
            t.external_data.add(key=key, value=str(value))
        initializers.append(t)
        return name

    for layer in range(layers):
        for i, (k, n) in enumerate(PROJECTIONS):
            p, blocks = f"l{layer}_{i}", k // BLOCK
            inputs = [
                f"x{k}",
                external(p + "_B", TensorProto.UINT8, [n, blocks, BLOCK // 2], nbytes=n * blocks * BLOCK // 2),
                external(p + "_scales", TensorProto.FLOAT, [n, blocks], (rng.random((n, blocks)) * 0.02).astype(np.float32)),
                external(p + "_zero_points", TensorProto.UINT8, [n, -(-blocks // 2)],
                         rng.integers(0, 256, (n, -(-blocks // 2)), dtype=np.uint8)),
            ]
            nodes.append(helper.make_node("MatMulNBits", inputs, [p + "_y"], domain="com.microsoft",
                                          K=k, N=n, bits=4, block_size=BLOCK))
            outputs.append(helper.make_tensor_value_info(p + "_y", TensorProto.FLOAT, ["tokens", n]))

inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, ["tokens", k]) for k in sorted({k for k, _ in PROJECTIONS})]
graph = helper.make_graph(nodes, "text_encoder_shaped", inputs, outputs, initializers)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
model.ir_version = 10  # what ONNX Runtime Web 1.30 reads
onnx.save(model, out)
