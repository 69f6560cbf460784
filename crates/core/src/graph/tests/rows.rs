//! `chunk_rows` on small graphs: which chains it cuts and how. That the chunks compute what the chain
//! did is checked on ONNX Runtime (`tools/export/tests/test_projection_parts.py`).

use super::*;
use crate::graph::proto::read_node;
use crate::graph::rows::chunk_rows;

/// `x [b, t, 64]` through a gate `MatMulNBits` (N 16), `Sigmoid`, `Mul` by `other` and a down
/// `MatMulNBits` (K 16, N 8) into `y`; `other` declared with `other_dims`.
fn mlp(other_dims: &[Dim]) -> Vec<u8> {
    let linear = |k, n| [attr_int("K", k), attr_int("N", n), attr_int("bits", 8), attr_int("block_size", 32)];
    let tokens = |c| vec![Dim::Param("b"), Dim::Param("t"), Dim::Value(c)];
    let weights = |name: &str, n: u64, blocks: u64| {
        [
            (
                GRAPH_INITIALIZER,
                raw_tensor(
                    &format!("{name}_B"),
                    &[n, blocks, 32],
                    UINT8,
                    &vec![1; (n * blocks * 32) as usize],
                ),
            ),
            (
                GRAPH_INITIALIZER,
                raw_tensor(&format!("{name}_s"), &[n * blocks], FLOAT, &vec![0; (n * blocks * 4) as usize]),
            ),
        ]
    };
    let mut fields = vec![
        (GRAPH_INPUT, value_info("x", FLOAT, &tokens(64))),
        (GRAPH_INPUT, value_info("other", FLOAT, other_dims)),
        (
            GRAPH_NODE,
            node("gate", "com.microsoft", "MatMulNBits", &["x", "gate_B", "gate_s"], &["g"], &linear(64, 16)),
        ),
        (GRAPH_NODE, node("sig", "", "Sigmoid", &["g"], &["s"], &[])),
        (GRAPH_NODE, node("mul", "", "Mul", &["s", "other"], &["m"], &[])),
        (
            GRAPH_NODE,
            node("down", "com.microsoft", "MatMulNBits", &["m", "down_B", "down_s"], &["y"], &linear(16, 8)),
        ),
        (GRAPH_VALUE_INFO, value_info("y", FLOAT, &tokens(8))),
        (GRAPH_OUTPUT, value_info("y", FLOAT, &tokens(8))),
    ];
    fields.extend(weights("gate", 16, 2));
    fields.extend(weights("down", 8, 1));
    model_with_opset(&fields, Some(18))
}

fn ops(model: &[u8]) -> Vec<(String, String)> {
    graph_fields(model, GRAPH_NODE)
        .iter()
        .map(|n| read_node(n, 0).map(|n| (n.op_type.to_owned(), n.outputs.join(","))).unwrap())
        .collect()
}

#[test]
fn a_token_wise_chain_is_cut_along_the_tokens_and_put_back_under_its_name() {
    let model = mlp(&[Dim::Param("b"), Dim::Param("t"), Dim::Value(16)]);
    let (chunked, count) = chunk_rows(&model, 2).unwrap();
    assert_eq!(count, 1);
    let ops = ops(&chunked);
    let count_of = |op: &str| ops.iter().filter(|(o, _)| o == op).count();
    // Each outside input cut once; the chain's four nodes twice; one Concat under the old name.
    assert_eq!(
        (count_of("Split"), count_of("MatMulNBits"), count_of("Sigmoid"), count_of("Mul")),
        (2, 4, 2, 2)
    );
    assert_eq!(ops.last().unwrap(), &("Concat".to_owned(), "y".to_owned()));
    assert_eq!(chunk_rows(&model, 1).unwrap(), (model.clone(), 0));
}

#[test]
fn a_chain_reading_something_without_the_tokens_axis_stays() {
    // A broadcast input ([b, 1, 16]) would be cut wrong along the tokens; an undeclared one is unknown.
    for dims in [vec![Dim::Param("b"), Dim::Value(1), Dim::Value(16)], vec![]] {
        let model = mlp(&dims);
        assert_eq!(chunk_rows(&model, 2).unwrap(), (model.clone(), 0));
    }
}
