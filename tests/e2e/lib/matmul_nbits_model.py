"""One MatMulNBits as the exporter quantizes (asymmetric, uint8 zero points), random weights, for
`cargo xtask bench blocks`:

    python3 tests/e2e/lib/matmul_nbits_model.py OUT.onnx K N BITS BLOCK

Input `a` [tokens, K] float32, output `y` [tokens, N]; weights inline."""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out, k, n, bits, block = sys.argv[1], *map(int, sys.argv[2:6])
rng = np.random.default_rng(0)
blocks = -(-k // block)
inits = [
    numpy_helper.from_array(rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8), "B"),
    numpy_helper.from_array((rng.random((n, blocks)) * 0.02 + 0.001).astype(np.float32), "scales"),
    numpy_helper.from_array(rng.integers(0, 256, (n, -(-blocks * bits // 8)), dtype=np.uint8), "zero_points"),
]
node = helper.make_node("MatMulNBits", ["a", "B", "scales", "zero_points"], ["y"], domain="com.microsoft",
                        K=k, N=n, bits=bits, block_size=block)
graph = helper.make_graph([node], "matmul_nbits", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["tokens", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["tokens", n])], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
model.ir_version = 10  # what ONNX Runtime Web 1.30 reads
onnx.save(model, out)
