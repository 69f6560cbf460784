//! `per_part` on small graphs: which projections it cuts and what the parts read. That the parts
//! compute what the wide node did is checked on ONNX Runtime (`tools/export/tests/test_projection_parts.py`).

use super::*;
use crate::graph::projections::per_part;

const DATA: &str = "weights.data";

/// A MatMulNBits of 12 columns (K 64, block 32, 8 bits: 2 blocks of 32 bytes a row) with its weights
/// in `DATA`, its `[m, 12]` output cut by `cut` (nodes, and their constants), whose outputs `outputs`
/// the graph gives.
fn projection(cut: Vec<Vec<u8>>, constants: Vec<Vec<u8>>, outputs: &[&str]) -> Vec<u8> {
    let attrs = [attr_int("K", 64), attr_int("N", 12), attr_int("bits", 8), attr_int("block_size", 32)];
    let mut fields = vec![
        (GRAPH_INPUT, value_info("a", FLOAT, &[Dim::Param("m"), Dim::Value(64)])),
        (
            GRAPH_NODE,
            node("wide", "com.microsoft", "MatMulNBits", &["a", "B", "scales", "zp"], &["y"], &attrs),
        ),
        (GRAPH_INITIALIZER, external_tensor("B", &[12, 2, 32], UINT8, DATA, 1000, 768)),
        (GRAPH_INITIALIZER, external_tensor("scales", &[24], FLOAT, DATA, 2000, 96)),
        (GRAPH_INITIALIZER, raw_tensor("zp", &[12, 2], UINT8, &(0..24).collect::<Vec<u8>>())),
        (GRAPH_VALUE_INFO, value_info("y", FLOAT, &[Dim::Param("m"), Dim::Value(12)])),
    ];
    fields.extend(cut.into_iter().map(|n| (GRAPH_NODE, n)));
    fields.extend(constants.into_iter().map(|t| (GRAPH_INITIALIZER, t)));
    fields.extend(
        outputs.iter().map(|o| (GRAPH_OUTPUT, value_info(o, FLOAT, &[Dim::Param("m"), Dim::Param("w")]))),
    );
    model_with_opset(&fields, Some(18))
}

fn int64s(name: &str, values: &[i64]) -> Vec<u8> {
    raw_tensor(
        name,
        &[values.len() as u64],
        INT64,
        &values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
    )
}

fn split(inputs: &[&str], outputs: &[&str], axis: i64) -> Vec<u8> {
    node("cut", "", "Split", inputs, outputs, &[attr_int("axis", axis as u64)])
}

fn initializer(model: &[u8], name: &str) -> Option<Vec<u8>> {
    graph_fields(model, GRAPH_INITIALIZER)
        .into_iter()
        .find(|t| crate::graph::proto::read_tensor(t).is_ok_and(|t| t.name == name))
}

#[test]
fn a_split_projection_becomes_one_node_per_part_reading_its_rows_in_place() {
    let model = projection(
        vec![split(&["y", "sizes"], &["q", "mlp"], -1)],
        vec![int64s("sizes", &[4, 8])],
        &["q", "mlp"],
    );
    let (parted, count) = per_part(&model).unwrap();
    assert_eq!(count, 1);
    let nodes: Vec<_> = graph_fields(&parted, GRAPH_NODE)
        .iter()
        .map(|n| {
            crate::graph::proto::read_node(n, 0)
                .map(|n| (n.name.to_owned(), n.op_type.to_owned(), n.outputs.join(",")))
                .unwrap()
        })
        .collect();
    assert_eq!(
        nodes,
        [
            ("wide/columns_0_4".to_owned(), "MatMulNBits".to_owned(), "q".to_owned()),
            ("wide/columns_4_12".to_owned(), "MatMulNBits".to_owned(), "mlp".to_owned())
        ]
    );
    // B: 64 bytes a row, scales 2 floats (8 bytes) a row, from the same file at the rows' offsets.
    let b = initializer(&parted, "wide/columns_4_12/B").unwrap();
    assert_eq!(
        entries(&b),
        [("location", "weights.data"), ("offset", "1256"), ("length", "512")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
    );
    let scales = initializer(&parted, "wide/columns_0_4/scales").unwrap();
    assert_eq!(
        entries(&scales)[1..],
        [("offset".to_owned(), "2000".to_owned()), ("length".to_owned(), "32".to_owned())]
    );
    assert_eq!(crate::graph::proto::read_tensor(&scales).unwrap().dims, [8]);
    // Inline zero points: their rows' bytes.
    let zp = initializer(&parted, "wide/columns_4_12/zp").unwrap();
    assert_eq!(raw_data(&zp), (8..24).collect::<Vec<u8>>());
    // The wide node's weights, the Split and its sizes are gone.
    for gone in ["B", "scales", "zp", "sizes"] {
        assert!(initializer(&parted, gone).is_none(), "{gone}");
    }
}

#[test]
fn slices_of_a_part_and_equal_splits_are_followed() {
    let cut = vec![
        split(&["y", "sizes"], &["qkv", "mlp"], 1),
        node(
            "qkv",
            "",
            "Split",
            &["qkv"],
            &["q", "k", "v"],
            &[attr_int("axis", 1), attr_int("num_outputs", 3)],
        ),
        node("gate", "", "Slice", &["mlp", "zero", "four", "last"], &["gate"], &[]),
        node("up", "", "Slice", &["mlp", "four", "end", "last"], &["up"], &[]),
    ];
    let constants = vec![
        int64s("sizes", &[6, 6]),
        int64s("zero", &[0]),
        int64s("four", &[4]),
        int64s("end", &[i64::MAX]),
        int64s("last", &[-1]),
    ];
    let (parted, count) = per_part(&projection(cut, constants, &["q", "k", "v", "gate", "up"])).unwrap();
    assert_eq!(count, 1);
    let parts: Vec<String> = graph_fields(&parted, GRAPH_NODE)
        .iter()
        .map(|n| crate::graph::proto::read_node(n, 0).unwrap().name.to_owned())
        .collect();
    assert_eq!(
        parts,
        [
            "wide/columns_0_2",
            "wide/columns_2_4",
            "wide/columns_4_6",
            "wide/columns_6_10",
            "wide/columns_10_12"
        ]
    );
}

#[test]
fn projections_not_only_cut_along_their_columns_stay() {
    let outputs = ["y0", "y1"];
    let cases = [
        // Rows, not columns.
        (split(&["y", "sizes"], &outputs, 0), vec![int64s("sizes", &[1, 1])]),
        // Sizes that are not constants.
        (split(&["y", "a_sizes"], &outputs, 1), vec![]),
        // Sizes that do not add up to the columns.
        (split(&["y", "sizes"], &outputs, 1), vec![int64s("sizes", &[4, 4])]),
    ];
    for (cut, constants) in cases {
        let model = projection(vec![cut], constants, &outputs);
        assert_eq!(per_part(&model).unwrap(), (model.clone(), 0));
    }
    // Read whole by another node: nothing to cut.
    let model = projection(vec![node("relu", "", "Relu", &["y"], &["r"], &[])], vec![], &["r"]);
    assert_eq!(per_part(&model).unwrap().1, 0);
}
