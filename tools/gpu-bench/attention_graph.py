"""Writes attention-T.onnx: LAYERS chained attentions over T tokens at the FLUX.2 [klein] transformer's
heads (24 x 128), float32, no weights: q' = softmax(q k^T / sqrt(128)) v + q. Each layer's scores are
24 x T x T values (T = 4608, a 1024x1024 image with 512 text tokens: 2.04 GB), the buffers whose
allocation `tests/e2e/bench/buffers.mjs` measures under ONNX Runtime Web's two storage-buffer caches.

    python3 tools/gpu-bench/attention_graph.py --tokens 1536,4608 --out DIR
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper

HEADS, HEAD_DIM = 24, 128


def attention_graph(tokens: int, layers: int) -> onnx.ModelProto:
    shape = [1, HEADS, tokens, HEAD_DIM]
    scale = helper.make_tensor('scale', TensorProto.FLOAT, [], [1 / np.sqrt(HEAD_DIM)])
    nodes = [helper.make_node('Transpose', ['k'], ['kt'], perm=[0, 1, 3, 2])]
    q = 'q'
    for i in range(layers):
        nodes += [
            helper.make_node('MatMul', [q, 'kt'], [f'scores{i}']),
            helper.make_node('Mul', [f'scores{i}', 'scale'], [f'scaled{i}']),
            helper.make_node('Softmax', [f'scaled{i}'], [f'weights{i}'], axis=-1),
            helper.make_node('MatMul', [f'weights{i}', 'v'], [f'mixed{i}']),
            helper.make_node('Add', [f'mixed{i}', q], [f'q{i + 1}']),
        ]
        q = f'q{i + 1}'
    nodes.append(helper.make_node('Identity', [q], ['out']))
    graph = helper.make_graph(
        nodes, f'attention_{tokens}',
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ('q', 'k', 'v')],
        [helper.make_tensor_value_info('out', TensorProto.FLOAT, shape)],
        initializer=[scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument('--tokens', default='1536,4608')
    ap.add_argument('--layers', type=int, default=8)
    ap.add_argument('--out', required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for t in (int(x) for x in a.tokens.split(',')):
        path = os.path.join(a.out, f'attention-{t}.onnx')
        onnx.save(attention_graph(t, a.layers), path)
        print(f'{path}: {a.layers} layers, scores {HEADS * t * t * 4 / 1e6:.0f} MB each')


if __name__ == '__main__':
    main()
