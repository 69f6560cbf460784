"""Writes external_data.onnx: a tiny model whose initializers keep their data in two external files
(weights_a.data, weights_b.data) plus one inline tensor. Used by pack.rs's tests of
external_data_locations. Run from this directory: python3 make_external_data.py (needs `onnx`).
Only the .onnx is kept; the tests never read the .data files."""

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

tensors = []
for name, location in [("a", "weights_a.data"), ("b", "weights_b.data"), ("a2", "weights_a.data")]:
    t = numpy_helper.from_array(np.arange(4, dtype=np.float32), name)
    set_external_data(t, location=location, offset=0, length=16)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    tensors.append(t)
tensors.append(numpy_helper.from_array(np.ones(4, dtype=np.float32), "inline"))

nodes = [
    helper.make_node("Add", ["x", "a"], ["y1"]),
    helper.make_node("Add", ["y1", "b"], ["y2"]),
    helper.make_node("Add", ["y2", "a2"], ["y3"]),
    helper.make_node("Add", ["y3", "inline"], ["y"]),
]
graph = helper.make_graph(
    nodes,
    "external_data_test",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    initializer=tensors,
)
model = helper.make_model(graph, producer_name="imagine-test")
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "external_data.onnx")
with open(out, "wb") as f:
    f.write(model.SerializeToString())
print(out, os.path.getsize(out), "bytes")
