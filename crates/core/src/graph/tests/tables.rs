//! Embedding tables taken out of a graph, on every adapter.

use super::float32::{fixture, table_model};
use super::*;

// ------------------------------------------------------------------------------------------------
// Tables taken out on every adapter (`crate::graph::tables`).

#[test]
fn a_table_leaves_the_graph_in_its_own_type() {
    use crate::graph::tables::{take_out, ElemType, TableLookup};
    let original = table_model(&[]);
    let (graph, lookups) = take_out(&original).unwrap();
    assert!(graph_fields(&graph, GRAPH_INITIALIZER).is_empty(), "the table left the graph");
    assert_eq!(
        graph_fields(&graph, GRAPH_NODE),
        graph_fields(&original, GRAPH_NODE)[1..],
        "only the Gather left"
    );
    assert!(
        graph_fields(&graph, GRAPH_VALUE_INFO).is_empty(),
        "the Gather output's value_info became an input"
    );
    assert_eq!(io_types(&graph, GRAPH_INPUT), [("input_ids".into(), INT64), ("emb".into(), FLOAT16)]);
    assert_eq!(io_types(&graph, GRAPH_OUTPUT), io_types(&original, GRAPH_OUTPUT));
    assert!(contains(&graph, UNKNOWN), "unknown fields survive");
    let lookup = TableLookup {
        input: "emb".into(),
        ids_input: "input_ids".into(),
        table: "table".into(),
        elem_type: ElemType::Float16,
        source: Range { file: "te.data".into(), offset: 32, length: 30 },
        rows: 5,
        row_dims: vec![3],
    };
    assert_eq!(lookups, std::slice::from_ref(&lookup));
    assert_eq!(lookup.input_dims(&[1, 4]), [1, 4, 3]);

    // The stage worker's part: the rows' bytes as stored, each distinct row read once.
    let file: Vec<u8> = (0..62).collect();
    let mut reads = 0;
    let got = lookup.gather(&[4, 0, -1, 4], read_from(&file, &mut reads)).unwrap();
    assert_eq!(got, [&file[56..62], &file[32..38], &file[56..62], &file[56..62]].concat());
    assert_eq!(reads, 2);
    assert_eq!(
        lookup.row_range(5).unwrap_err().to_string(),
        r#"id 5 is outside the table "table" of 5 rows"#
    );

    // Any element type ONNX Runtime Web feeds; a 1-D table (the fixture packs') gives rows of one.
    let uint8 = model(&[
        (GRAPH_INPUT, value_info("input_ids", INT64, &[Dim::Value(1), Dim::Value(4)])),
        (GRAPH_OUTPUT, value_info("h", UINT8, &[])),
        (GRAPH_NODE, node("embed", "", "Gather", &["table", "input_ids"], &["h0"], &[])),
        (GRAPH_NODE, node("id", "", "Identity", &["h0"], &["h"], &[])),
        (GRAPH_INITIALIZER, external_tensor("table", &[7], UINT8, "t.data", 0, 7)),
    ]);
    let (graph, lookups) = take_out(&uint8).unwrap();
    assert_eq!(io_types(&graph, GRAPH_INPUT), [("input_ids".into(), INT64), ("h0".into(), UINT8)]);
    assert_eq!((lookups[0].elem_type, lookups[0].row_bytes()), (ElemType::Uint8, 1));
    assert_eq!(lookups[0].input_dims(&[1, 4]), [1, 4]);
}

#[test]
fn tables_that_cannot_leave_stay() {
    use crate::graph::tables::take_out;
    let stays = |fields: &[(u64, Vec<u8>)]| {
        let m = model(fields);
        let (graph, lookups) = take_out(&m).unwrap();
        assert!(lookups.is_empty());
        assert_eq!(graph, m, "unchanged, byte for byte");
    };
    let ids = || (GRAPH_INPUT, value_info("input_ids", INT64, &[]));
    let gather = |table: &str, ids: &str| (GRAPH_NODE, node("g", "", "Gather", &[table, ids], &["e"], &[]));
    let table = |data_type, length| {
        (GRAPH_INITIALIZER, external_tensor("table", &[5, 3], data_type, "t.data", 0, length))
    };
    // Read by something else too; gathered along axis 1; by ids that are not a graph input; stored
    // inside the graph; of a type ORT Web cannot feed (bfloat16); its length not its dims'.
    stays(&[
        ids(),
        gather("table", "input_ids"),
        (GRAPH_NODE, node("n", "", "Neg", &["table"], &["x"], &[])),
        table(FLOAT, 60),
    ]);
    stays(&[
        ids(),
        (GRAPH_NODE, node("g", "", "Gather", &["table", "input_ids"], &["e"], &[attr_int("axis", 1)])),
        table(FLOAT, 60),
    ]);
    stays(&[gather("table", "other"), table(FLOAT, 60)]);
    stays(&[
        ids(),
        gather("table", "input_ids"),
        (GRAPH_INITIALIZER, raw_tensor("table", &[2], FLOAT, &floats(&[1.0, 2.0]))),
    ]);
    stays(&[ids(), gather("table", "input_ids"), table(16, 30)]);
    stays(&[ids(), gather("table", "input_ids"), table(FLOAT, 59)]);
    // The transformer and the decoder of the fixture packs have no table; every text encoder has one.
    for variant in ["f32", "f16", "f32-vae32"] {
        for graph in crate::pack::Graph::ALL {
            let (_, lookups) = take_out(&fixture(variant, &graph.file_name())).unwrap();
            let tables: Vec<&str> = lookups.iter().map(|l| l.table.as_str()).collect();
            let expected: &[&str] =
                if graph == crate::pack::Graph::TextEncoder { &["te_table"] } else { &[] };
            assert_eq!(tables, expected, "{variant} {graph:?}");
        }
    }
}

#[test]
fn a_too_large_tensor_that_is_not_a_table_is_refused() {
    let other_reader = node("mm", "", "MatMul", &["emb", "table"], &["z"], &[]);
    assert_eq!(
        rewrite(&table_model(&[(GRAPH_NODE, other_reader)]), &options(48)).unwrap_err().to_string(),
        r#"cannot rewrite tensor "table" to float32: its float32 form (60 bytes) does not fit one GPU buffer (48 bytes), and it cannot be looked up outside the graph: node 2 "mm" (ai.onnx::MatMul) reads it, and only Gathers of its rows can be looked up"#
    );
    // Unconverted tensors are checked too.
    let m = model(&[
        (GRAPH_NODE, node("mm", "com.microsoft", "MatMulNBits", &["x", "B"], &["y"], &[])),
        (GRAPH_INITIALIZER, external_tensor("B", &[64], UINT8, "w.data", 0, 64)),
    ]);
    assert_eq!(
        rewrite(&m, &options(48)).unwrap_err().to_string(),
        r#"cannot rewrite tensor "B" to float32: it is not converted and its 64 bytes already do not fit one GPU buffer (48 bytes)"#
    );
    // ONNX Runtime rounds buffers up to 16 bytes: 60 bytes need 64.
    assert!(rewrite(&table_model(&[]), &options(63)).unwrap().plan.lookups.len() == 1);
    assert!(rewrite(&table_model(&[]), &options(64)).unwrap().plan.lookups.is_empty());
}
