//! The float32 rewrite: each rule and refusal on hand-built models, the committed fixture packs,
//! lookups outside the graph, and the conversion of values.

use super::*;

// ------------------------------------------------------------------------------------------------
// The rewrite.

/// A model with one of everything the rewrite changes, and things it must keep.
fn everything() -> Vec<u8> {
    let cast_to_f16 = node("cast_in", "", "Cast", &["x"], &["x16"], &[attr_int("to", FLOAT16)]);
    let constant = node(
        "const",
        "",
        "Constant",
        &[],
        &["c"],
        &[attr_tensor("value", &raw_tensor("", &[2], FLOAT16, &halves(&[0.5, -2.0])))],
    );
    let fill = node(
        "fill",
        "",
        "ConstantOfShape",
        &["shape"],
        &["f"],
        &[attr_tensor("value", &int32_f16_tensor("", &[0.25]))],
    );
    let eye = node("eye", "", "EyeLike", &["m"], &["eye"], &[attr_int("dtype", FLOAT16), attr_int("k", 10)]);
    let cast_int = node("cast_int", "", "Cast", &["x16"], &["xi"], &[attr_int("to", INT64)]);
    let mm =
        node("mm", "com.microsoft", "MatMulNBits", &["x16", "B", "scales"], &["y"], &[attr_int("bits", 4)]);
    model(&[
        (GRAPH_INPUT, value_info("x", FLOAT16, &[Dim::Param("batch"), Dim::Value(4)])),
        (GRAPH_INPUT, value_info("shape", INT64, &[Dim::Value(2)])),
        (GRAPH_OUTPUT, value_info("y", FLOAT16, &[Dim::Param("batch"), Dim::Value(2)])),
        (GRAPH_OUTPUT, value_info("xi", INT64, &[Dim::Param("batch"), Dim::Value(4)])),
        (GRAPH_VALUE_INFO, value_info("x16", FLOAT16, &[])),
        (GRAPH_NODE, cast_to_f16),
        (GRAPH_NODE, constant),
        (GRAPH_NODE, fill),
        (GRAPH_NODE, eye),
        (GRAPH_NODE, cast_int),
        (GRAPH_NODE, mm),
        (GRAPH_INITIALIZER, raw_tensor("norm", &[3], FLOAT16, &halves(&[1.0, 65504.0, -0.0]))),
        (GRAPH_INITIALIZER, int32_f16_tensor("bias", &[0.125, -1.5])),
        (GRAPH_INITIALIZER, external_tensor("B", &[2, 1, 2], UINT8, "w.data", 0, 4)),
        (GRAPH_INITIALIZER, external_tensor("scales", &[2, 3], FLOAT16, "./w.data", 64, 12)),
        (GRAPH_INITIALIZER, external_tensor("other", &[5], FLOAT16, "v.data", 6, 10)),
        (GRAPH_INITIALIZER, raw_tensor("float32", &[1], FLOAT, &floats(&[3.0]))),
    ])
}

/// One graph holding every kind of rewrite, checked field by field: long, as a table of expectations is.
#[test]
fn rewrites_types_casts_constants_and_initializers() {
    let original = everything();
    let Rewrite { graph, plan } = rewrite(&original, &options(u64::MAX)).unwrap();
    assert_eq!(
        remaining_float16(&original).unwrap().len(),
        3 + 4 + 4,
        "types, node attributes, initializers"
    );
    assert_eq!(remaining_float16(&graph).unwrap(), Vec::<String>::new());

    // I/O: names and order unchanged, float16 ones now float32.
    assert_eq!(io_types(&graph, GRAPH_INPUT), [("x".into(), FLOAT), ("shape".into(), INT64)]);
    assert_eq!(io_types(&graph, GRAPH_OUTPUT), [("y".into(), FLOAT), ("xi".into(), INT64)]);
    assert_eq!(plan.float32_io, ["x", "y"]);
    assert_eq!(io_types(&graph, GRAPH_VALUE_INFO), [("x16".into(), FLOAT)]);
    // Shapes are kept.
    assert_eq!(
        shape_dims(&graph_fields(&graph, GRAPH_INPUT)[0]).unwrap().unwrap(),
        shape_dims(&graph_fields(&original, GRAPH_INPUT)[0]).unwrap().unwrap()
    );

    // Nodes: dtype attributes and value tensors.
    let nodes = graph_fields(&graph, GRAPH_NODE);
    let int_attr = |n: &[u8], name: &str| read_node(n, 0).unwrap().int_attribute_for_tests(name);
    assert_eq!(int_attr(&nodes[0], "to"), Some(FLOAT));
    assert_eq!(int_attr(&nodes[3], "dtype"), Some(FLOAT));
    assert_eq!(int_attr(&nodes[3], "k"), Some(10), "only dtype attributes change");
    assert_eq!(int_attr(&nodes[4], "to"), Some(INT64));
    assert_eq!(
        nodes[5],
        graph_fields(&original, GRAPH_NODE)[5],
        "a node without dtype is copied byte for byte"
    );
    let value = |n: &[u8]| {
        let node = read_node(n, 0).unwrap();
        let t =
            node.attributes[0].fields.iter().find(|f| f.number == 5).unwrap().bytes("a").unwrap().to_vec();
        (read_tensor(&t).unwrap().data_type, raw_data(&t))
    };
    assert_eq!(value(&nodes[1]), (FLOAT, floats(&[0.5, -2.0])));
    assert_eq!(value(&nodes[2]), (FLOAT, floats(&[0.25])));

    // Initializers.
    let inits = graph_fields(&graph, GRAPH_INITIALIZER);
    assert_eq!(read_tensor(&inits[0]).unwrap().data_type, FLOAT);
    assert_eq!(raw_data(&inits[0]), floats(&[1.0, 65504.0, -0.0]));
    assert!(contains(&inits[0], UNKNOWN), "unknown tensor fields survive");
    assert_eq!(raw_data(&inits[1]), floats(&[0.125, -1.5]));
    assert_eq!(inits[2], graph_fields(&original, GRAPH_INITIALIZER)[2], "uint8 weights stay as they are");
    assert_eq!(inits[5], graph_fields(&original, GRAPH_INITIALIZER)[5], "float32 tensors stay as they are");
    let e = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    assert_eq!(entries(&inits[3]), [e("location", "m.f32-00000.data"), e("offset", "0"), e("length", "24")]);
    assert_eq!(entries(&inits[4]), [e("location", "m.f32-00000.data"), e("offset", "64"), e("length", "20")]);
    assert_eq!(read_tensor(&inits[3]).unwrap().dims, [2, 3]);

    // The plan.
    let range = |file: &str, offset, length| Range { file: file.into(), offset, length };
    assert_eq!(
        plan.copies,
        [
            TensorCopy {
                tensor: "scales".into(),
                source: range("w.data", 64, 12),
                target: range("m.f32-00000.data", 0, 24)
            },
            TensorCopy {
                tensor: "other".into(),
                source: range("v.data", 6, 10),
                target: range("m.f32-00000.data", 64, 20)
            },
        ]
    );
    assert_eq!(plan.new_files, [NewFile { name: "m.f32-00000.data".into(), size: 84 }]);
    assert_eq!(plan.graph_files, ["w.data", "m.f32-00000.data"]);
    assert_eq!(plan.unused_files, ["v.data"]);
    assert_eq!(plan.inline_converted, 2);
    assert_eq!(plan.extra_disk_bytes, 84);
    assert_eq!(plan.stale_bytes, 12, "scales stay in w.data beside B; v.data is unused");
    assert_eq!(plan.extra_gpu_bytes, 6 + 4 + 12 + 10);
    assert_eq!(plan.manifest_json(), r#"{"shards":[{"path":"w.data"},{"path":"m.f32-00000.data"}]}"#);

    // Unknown fields of the model, graph, nodes and value infos survive.
    let count = |b: &[u8]| b.windows(UNKNOWN.len()).filter(|w| *w == UNKNOWN).count();
    assert_eq!(count(&graph), count(&original));

    // A second rewrite changes nothing.
    assert_eq!(rewrite(&graph, &options(u64::MAX)).unwrap().graph, graph);
}

impl crate::graph::proto::Node<'_> {
    fn int_attribute_for_tests(&self, name: &str) -> Option<u64> {
        let a = self.attributes.iter().find(|a| a.name == name)?;
        a.fields.iter().find(|f| f.number == 3).map(|f| f.varint("a").unwrap())
    }
}

/// Three float16 tensors (200, 120 and 40 bytes as float32) and new shards of at most 300 bytes.
fn three_tensors_for_two_shards() -> (Vec<u8>, Options) {
    let m = model(&[
        (GRAPH_NODE, node("add", "", "Add", &["a", "b"], &["c"], &[])),
        (GRAPH_INITIALIZER, external_tensor("a", &[50], FLOAT16, "w.data", 0, 100)),
        (GRAPH_INITIALIZER, external_tensor("b", &[30], FLOAT16, "w.data", 100, 60)),
        (GRAPH_INITIALIZER, external_tensor("d", &[10], FLOAT16, "w.data", 160, 20)),
    ]);
    let mut o = options(u64::MAX);
    o.max_shard_bytes = 300;
    (m, o)
}

#[test]
fn shards_stay_under_the_limit_and_tensors_are_aligned() {
    let (m, mut o) = three_tensors_for_two_shards();
    let plan = rewrite(&m, &o).unwrap().plan;
    let targets: Vec<_> = plan.copies.iter().map(|c| (c.target.file.as_str(), c.target.offset)).collect();
    assert_eq!(targets, [("m.f32-00000.data", 0), ("m.f32-00001.data", 0), ("m.f32-00001.data", 128)]);
    assert_eq!(plan.new_files.iter().map(|f| f.size).collect::<Vec<_>>(), [200, 168]);
    assert_eq!(plan.unused_files, ["w.data"]);
    o.max_shard_bytes = 199;
    assert_eq!(
        rewrite(&m, &o).unwrap_err().to_string(),
        r#"cannot rewrite tensor "a" to float32: its float32 form (200 bytes) is larger than a new external-data file may be (199 bytes)"#
    );
}

#[test]
fn pieces_cover_each_copy_in_order() {
    let m = model(&[
        (GRAPH_NODE, node("add", "", "Add", &["a", "b"], &["c"], &[])),
        (GRAPH_INITIALIZER, external_tensor("a", &[7], FLOAT16, "w.data", 10, 14)),
        (GRAPH_INITIALIZER, external_tensor("b", &[2], FLOAT16, "w.data", 30, 4)),
    ]);
    let plan = rewrite(&m, &options(u64::MAX)).unwrap().plan;
    let pieces = plan.pieces(5); // rounded down to 4 float16 bytes
    let summary: Vec<_> = pieces
        .iter()
        .map(|p| (p.copy, p.source.offset, p.source.length, p.target.offset, p.target.length))
        .collect();
    assert_eq!(
        summary,
        [(0, 10, 4, 0, 8), (0, 14, 4, 8, 8), (0, 18, 4, 16, 8), (0, 22, 2, 24, 4), (1, 30, 4, 64, 8)]
    );
    assert_eq!(plan.pieces(0).len(), 7 + 2, "at least one element per piece");
}

#[test]
fn file_pieces_group_each_new_file_in_writing_order() {
    let (m, o) = three_tensors_for_two_shards();
    let plan = pack_conversion::GraphPlan {
        graph: crate::pack::Graph::Transformer,
        rewrite: rewrite(&m, &o).unwrap(),
    };
    let by_file = plan.file_pieces(32);
    let summary: Vec<_> = by_file
        .iter()
        .map(|(new, pieces)| {
            assert!(pieces.iter().all(|p| p.target.file == new.name));
            (new.name.as_str(), pieces.iter().map(|p| (p.target.offset, p.target.length)).collect::<Vec<_>>())
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("m.f32-00000.data", vec![(0, 64), (64, 64), (128, 64), (192, 8)]),
            ("m.f32-00001.data", vec![(0, 64), (64, 56), (128, 40)]),
        ]
    );
    let total: usize = by_file.iter().map(|(_, p)| p.len()).sum();
    assert_eq!(total, plan.rewrite.plan.pieces(32).len());
}

#[test]
fn a_float32_graph_is_copied_byte_for_byte() {
    for variant in ["f32", "f32-vae32"] {
        for graph in crate::pack::Graph::ALL {
            let bytes = fixture(variant, &graph.file_name());
            let r = rewrite(&bytes, &Options::new(graph.stem(), Limits::UNLIMITED)).unwrap();
            assert_eq!(r.graph, bytes, "{variant} {graph:?}");
            assert!(r.plan.copies.is_empty() && r.plan.float32_io.is_empty());
            let files: Vec<_> =
                crate::pack::external_data_locations(&bytes).unwrap().into_iter().map(|f| f.file).collect();
            assert_eq!(r.plan.graph_files, files);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// The f16 fixture pack.

pub(super) fn fixture(variant: &str, file: &str) -> Vec<u8> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/packs").join(variant).join(file);
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run tests/fixtures/make_packs.py)", path.display()))
}

#[test]
fn the_f16_fixture_pack_becomes_float32() {
    for graph in crate::pack::Graph::ALL {
        let original = fixture("f16", &graph.file_name());
        let Rewrite { graph: new, plan } =
            rewrite(&original, &Options::new(graph.stem(), Limits::UNLIMITED)).unwrap();
        // No float16 anywhere: types, initializers, Cast targets, attribute tensors.
        assert_eq!(remaining_float16(&new).unwrap(), Vec::<String>::new(), "{graph:?}");
        // I/O names unchanged; float16 ones float32, the others as they were; as in the f32 pack.
        for number in [GRAPH_INPUT, GRAPH_OUTPUT] {
            let (before, after) = (io_types(&original, number), io_types(&new, number));
            assert_eq!(before.len(), after.len());
            for ((name, was), (new_name, now)) in before.iter().zip(&after) {
                assert_eq!(name, new_name);
                assert_eq!(*now, if *was == FLOAT16 { FLOAT } else { *was }, "{graph:?} {name}");
            }
            assert_eq!(after, io_types(&fixture("f32", &graph.file_name()), number), "{graph:?}");
        }
        // The fixture keeps its weights float32: nothing to convert, every external entry unchanged
        // and inside its file.
        assert!(plan.copies.is_empty() && plan.new_files.is_empty() && plan.lookups.is_empty());
        assert_eq!(graph_fields(&new, GRAPH_INITIALIZER), graph_fields(&original, GRAPH_INITIALIZER));
        for t in graph_fields(&new, GRAPH_INITIALIZER) {
            let t = read_tensor(&t).unwrap();
            if let Some(ext) = &t.external {
                let size = std::fs::metadata(
                    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                        .join("../../tests/fixtures/packs/f16")
                        .join(&ext.file),
                )
                .unwrap()
                .len();
                assert!(ext.offset + ext.length.unwrap() <= size, "{}", t.name);
                assert!(plan.graph_files.contains(&ext.file));
            }
        }
        let expected_io: &[&str] = match graph {
            crate::pack::Graph::TextEncoder => &["prompt_embeds"],
            crate::pack::Graph::Transformer => {
                &["hidden_states", "encoder_hidden_states", "timestep", "noise_pred"]
            }
            crate::pack::Graph::Decoder => &[],
        };
        assert_eq!(plan.float32_io, expected_io);
        assert!(!crate::pack::declares_float16(&new).unwrap());
    }
}

// ------------------------------------------------------------------------------------------------
// Lookups outside the graph.

/// Qwen3's layout in miniature: a [5, 3] float16 table Gathered by `input_ids`.
pub(super) fn table_model(extra: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut fields = vec![
        (GRAPH_INPUT, value_info("input_ids", INT64, &[Dim::Param("batch"), Dim::Param("sequence")])),
        (
            GRAPH_OUTPUT,
            value_info("h", FLOAT16, &[Dim::Param("batch"), Dim::Param("sequence"), Dim::Value(3)]),
        ),
        (GRAPH_VALUE_INFO, value_info("emb", FLOAT16, &[])),
        (GRAPH_NODE, node("embed", "", "Gather", &["table", "input_ids"], &["emb"], &[attr_int("axis", 0)])),
        (GRAPH_NODE, node("act", "", "Tanh", &["emb"], &["h"], &[])),
        (GRAPH_INITIALIZER, external_tensor("table", &[5, 3], FLOAT16, "te.data", 32, 30)),
    ];
    fields.extend_from_slice(extra);
    model(&fields)
}

/// One table taken out and everything that follows from it checked in turn (the graph left, its inputs,
/// the plan's bytes, the rows the web side reads, the policies): long, as a list of expectations is.
#[test]
fn a_table_too_large_for_one_buffer_is_looked_up_outside() {
    // float32 table: 60 bytes; a 48-byte limit leaves it outside.
    let Rewrite { graph, plan } = rewrite(&table_model(&[]), &options(48)).unwrap();
    assert!(graph_fields(&graph, GRAPH_INITIALIZER).is_empty(), "the table left the graph");
    let nodes = graph_fields(&graph, GRAPH_NODE);
    assert_eq!(nodes.len(), 1, "the Gather left the graph");
    assert!(
        graph_fields(&graph, GRAPH_VALUE_INFO).is_empty(),
        "the Gather output's value_info became an input"
    );
    assert_eq!(io_types(&graph, GRAPH_INPUT), [("input_ids".into(), INT64), ("emb".into(), FLOAT)]);
    let dims: Vec<Vec<u8>> = shape_dims(&graph_fields(&graph, GRAPH_INPUT)[1])
        .unwrap()
        .unwrap()
        .iter()
        .map(|d| d.to_vec())
        .collect();
    let mut three = Vec::new();
    put_bytes_field(&mut three, 1, &[0x08, 3]);
    assert_eq!(dims.len(), 3);
    assert_eq!(dims[2], three);
    assert_eq!(
        plan.lookups,
        [EmbeddingLookup {
            input: "emb".into(),
            ids_input: "input_ids".into(),
            table: "table".into(),
            source: Range { file: "te.data".into(), offset: 32, length: 30 },
            rows: 5,
            row_elements: 3,
        }]
    );
    assert_eq!(plan.extra_gpu_bytes, -30);
    assert_eq!(plan.extra_disk_bytes, 0);
    assert_eq!(plan.stale_bytes, 0);
    assert_eq!(plan.unused_files, ["te.data"], "the graph no longer reads it (the lookup does)");

    // The web side's part.
    let lookup = &plan.lookups[0];
    let rows: Vec<f32> = (0..15).map(|i| i as f32 * 0.5 - 3.0).collect();
    let mut file = vec![0u8; 32];
    file.extend(halves(&rows));
    let mut reads = 0;
    let got = lookup.gather(&[4, 0, -1, 4], read_from(&file, &mut reads)).unwrap();
    assert_eq!(got, [&rows[12..15], &rows[0..3], &rows[12..15], &rows[12..15]].concat());
    assert_eq!(reads, 2, "each distinct row is read once");
    assert_eq!(lookup.row_range(1).unwrap(), Range { file: "te.data".into(), offset: 38, length: 6 });
    assert_eq!(
        lookup.row_range(5).unwrap_err().to_string(),
        r#"id 5 is outside the table "table" of 5 rows"#
    );
    assert_eq!(
        lookup.row_range(-6).unwrap_err().to_string(),
        r#"id -6 is outside the table "table" of 5 rows"#
    );
    let failed = lookup.gather(&[1], |_, _| Err("gone".into())).unwrap_err();
    assert_eq!(failed.to_string(), r#"reading the table "table": gone"#);

    // Policies.
    let mut o = options(u64::MAX);
    o.lookup = LookupPolicy::Always;
    assert_eq!(rewrite(&table_model(&[]), &o).unwrap().plan.lookups.len(), 1);
    assert!(rewrite(&table_model(&[]), &options(u64::MAX)).unwrap().plan.lookups.is_empty());
    o = options(48);
    o.lookup = LookupPolicy::Never;
    assert_eq!(
        rewrite(&table_model(&[]), &o).unwrap_err().to_string(),
        r#"cannot rewrite tensor "table" to float32: its float32 form (60 bytes) does not fit one GPU buffer (48 bytes), and lookups outside the graph are off"#
    );
}

// ------------------------------------------------------------------------------------------------
// Refusals, with their exact text.

fn refusal(fields: &[(u64, Vec<u8>)]) -> String {
    rewrite(&model(fields), &options(u64::MAX)).unwrap_err().to_string()
}

#[test]
fn an_unknown_operator_is_refused() {
    let fields = [
        (GRAPH_NODE, node("ok", "", "Relu", &["x"], &["y"], &[])),
        (GRAPH_NODE, node("mystery", "com.example", "Frobnicate", &["y"], &["z"], &[])),
    ];
    assert_eq!(
        refusal(&fields),
        r#"cannot rewrite node 1 "mystery" (com.example::Frobnicate) to float32: the operator is not in the list of operators known to compute the same function in float32"#
    );
    assert_eq!(
        refusal(&[(GRAPH_NODE, node("", "", "NonMaxSuppression", &[], &[], &[]))]),
        r#"cannot rewrite node 0 "" (ai.onnx::NonMaxSuppression) to float32: the operator is not in the list of operators known to compute the same function in float32"#
    );
}

#[test]
fn a_subgraph_is_refused() {
    let body = msg(&[(1, &node("inner", "", "Identity", &["a"], &["b"], &[]))]);
    let fields =
        [(GRAPH_NODE, node("branch", "", "If", &["cond"], &["out"], &[attr_graph("then_branch", &body)]))];
    assert_eq!(
        refusal(&fields),
        r#"cannot rewrite node 0 "branch" (ai.onnx::If) to float32: attribute `then_branch` is a subgraph; graphs inside nodes are not rewritten"#
    );
}

#[test]
fn a_sparse_initializer_is_refused() {
    let sparse = msg(&[(1, &raw_tensor("sp", &[2], FLOAT16, &halves(&[1.0, 2.0])))]);
    assert_eq!(
        refusal(&[(15, sparse)]),
        r#"cannot rewrite tensor "sp" to float32: it is a sparse initializer, which the rewrite does not convert"#
    );
}

#[test]
fn float16_attributes_it_cannot_convert_are_refused() {
    let t = raw_tensor("", &[1], FLOAT16, &halves(&[1.0]));
    assert_eq!(
        refusal(&[(GRAPH_NODE, node("m", "", "Mul", &["a", "b"], &["c"], &[attr_tensor("weird", &t)]))]),
        r#"cannot rewrite node 0 "m" (ai.onnx::Mul) to float32: attribute `weird` holds a float16 tensor, which this operator's rewrite does not convert"#
    );
    let ext = external_tensor("", &[1], FLOAT16, "w.data", 0, 2);
    assert_eq!(
        refusal(&[(GRAPH_NODE, node("c", "", "Constant", &[], &["c"], &[attr_tensor("value", &ext)]))]),
        r#"cannot rewrite node 0 "c" (ai.onnx::Constant) to float32: attribute `value` holds a float16 tensor stored as external data"#
    );
    assert_eq!(
        refusal(&[(GRAPH_NODE, node("s", "", "Shape", &["x"], &["y"], &[attr_int("dtype", FLOAT16)]))]),
        r#"cannot rewrite node 0 "s" (ai.onnx::Shape) to float32: attribute `dtype` names float16, and this operator's rewrite does not handle it"#
    );
}

#[test]
fn model_level_refusals() {
    let mut m = model(&[]);
    put_bytes_field(&mut m, 25, b"");
    assert_eq!(
        rewrite(&m, &options(u64::MAX)).unwrap_err().to_string(),
        "cannot rewrite the model to float32: it has model-local functions (ModelProto.functions), which are not rewritten; inline them when exporting"
    );
    assert_eq!(
        rewrite(&[0x08, 1], &options(u64::MAX)).unwrap_err().to_string(),
        "cannot rewrite the model to float32: it has no graph"
    );
    let bad = model(&[(GRAPH_INITIALIZER, raw_tensor("short", &[3], FLOAT16, &halves(&[1.0])))]);
    assert_eq!(
        rewrite(&bad, &options(u64::MAX)).unwrap_err().to_string(),
        r#"cannot rewrite tensor "short" to float32: it holds 2 bytes of float16 data for 3 elements"#
    );
    let wrong_length = model(&[(GRAPH_INITIALIZER, external_tensor("w", &[3], FLOAT16, "w.data", 0, 8))]);
    assert_eq!(
        rewrite(&wrong_length, &options(u64::MAX)).unwrap_err().to_string(),
        r#"cannot rewrite tensor "w" to float32: its external data is 8 bytes long, but 3 float16 elements take 6"#
    );
    let escaping = model(&[(GRAPH_INITIALIZER, external_tensor("w", &[1], FLOAT16, "../w.data", 0, 2))]);
    assert_eq!(
        rewrite(&escaping, &options(u64::MAX)).unwrap_err().to_string(),
        r#"cannot rewrite tensor "w" to float32: "../w.data" is not allowed as a file name in the pack: it has a `..` component"#
    );
    assert!(matches!(rewrite(&[0x3a, 5, 1], &options(u64::MAX)), Err(RewriteError::Protobuf { .. })));
}

// ------------------------------------------------------------------------------------------------
// The conversion of values.

#[test]
fn every_float16_value_converts_exactly() {
    let all: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
    let wide = f16_to_f32_vec(&all).unwrap();
    for (bits, f) in (0..=u16::MAX).zip(wide.chunks_exact(4)) {
        let f = f32::from_le_bytes(f.try_into().unwrap());
        let h = f16::from_bits(bits);
        if h.is_nan() {
            assert!(f.is_nan(), "{bits:#06x}");
            assert_eq!(f.is_sign_negative(), h.is_sign_negative());
        } else {
            assert_eq!(f16::from_f32(f).to_bits(), bits, "{bits:#06x} round trip");
        }
    }
    let one =
        |bits: u16| f32::from_le_bytes(f16_to_f32_vec(&bits.to_le_bytes()).unwrap().try_into().unwrap());
    assert_eq!(one(0x7bff), 65504.0);
    assert_eq!(one(0xfbff), -65504.0);
    assert_eq!(one(0x7c00), f32::INFINITY);
    assert_eq!(one(0xfc00), f32::NEG_INFINITY);
    assert!(one(0x7e00).is_nan() && one(0x7c01).is_nan());
    assert_eq!(one(0x0001), 2f32.powi(-24), "smallest subnormal");
    assert_eq!(one(0x03ff), 1023.0 * 2f32.powi(-24), "largest subnormal");
    assert_eq!(one(0x0400), 2f32.powi(-14), "smallest normal");
    assert_eq!(one(0x8000).to_bits(), (-0.0f32).to_bits());
    assert_eq!(one(0x3c00), 1.0);
    assert_eq!(
        f16_to_f32(&[0; 3], &mut [0; 6]).unwrap_err().to_string(),
        "cannot convert 3 float16 bytes into 6 float32 bytes"
    );
    assert!(f16_to_f32(&[0; 4], &mut [0; 4]).is_err());
    assert_eq!(f16_to_f32_vec(&[]).unwrap(), Vec::<u8>::new());
}

#[test]
fn wire_values_read_by_the_tests_match() {
    // The helpers above read what they wrote.
    let t = raw_tensor("t", &[2], FLOAT16, &halves(&[1.0, 2.0]));
    let read = read_tensor(&t).unwrap();
    assert_eq!((read.name.as_str(), read.data_type, read.dims.as_slice()), ("t", FLOAT16, &[2u64][..]));
    assert!(wire::parse(&t, "t").unwrap().iter().any(|f| f.value == Value::Varint(42)));
}

#[test]
fn the_qwen3_embedding_table_at_full_size() {
    // 151936 x 2560 float16: 778 MB; float32: 1.56 GB. Only the graph is read, so no data is needed.
    let bytes = 151_936 * 2560 * 2;
    let qwen = |extra: &[(u64, Vec<u8>)]| {
        let mut fields = vec![
            (GRAPH_INPUT, value_info("input_ids", INT64, &[Dim::Param("batch"), Dim::Param("sequence")])),
            (GRAPH_OUTPUT, value_info("h", FLOAT16, &[])),
            (
                GRAPH_NODE,
                node("/model/embed_tokens/Gather", "", "Gather", &["embed", "input_ids"], &["emb"], &[]),
            ),
            (GRAPH_NODE, node("n", "", "SimplifiedLayerNormalization", &["emb", "ln"], &["h"], &[])),
            (
                GRAPH_INITIALIZER,
                external_tensor("embed", &[151_936, 2560], FLOAT16, "text_encoder_q4-00000.data", 0, bytes),
            ),
            (
                GRAPH_INITIALIZER,
                external_tensor("ln", &[2560], FLOAT16, "text_encoder_q4-00001.data", 0, 5120),
            ),
        ];
        fields.extend_from_slice(extra);
        model(&fields)
    };
    let swiftshader = Limits { max_storage_buffer_binding_size: 1 << 30, max_buffer_size: 1 << 30 };
    let h200 = Limits { max_storage_buffer_binding_size: 2 << 30, max_buffer_size: 1 << 40 };
    let plan = rewrite(&qwen(&[]), &Options::new("text_encoder_q4", swiftshader)).unwrap().plan;
    assert_eq!(plan.lookups.len(), 1);
    assert_eq!(plan.lookups[0].source.length, 777_912_320);
    assert_eq!(plan.lookups[0].row_range(151_935).unwrap().offset, 151_935 * 5120);
    assert_eq!(plan.copies.len(), 1, "only the norm weight is converted");
    assert_eq!(plan.extra_gpu_bytes, 5120 - 777_912_320);
    let plan = rewrite(&qwen(&[]), &Options::new("text_encoder_q4", h200)).unwrap().plan;
    assert!(plan.lookups.is_empty(), "2 GiB bindings hold the float32 table");
    assert_eq!(
        plan.new_files,
        [NewFile { name: "text_encoder_q4.f32-00000.data".into(), size: 1_555_824_640 + 10240 }]
    );
    assert_eq!(plan.extra_gpu_bytes, 777_912_320 + 5120);
    // Tied embeddings read by an lm_head too cannot leave the graph.
    let lm_head = node("lm_head", "", "MatMul", &["h", "embed"], &["logits"], &[]);
    assert_eq!(
        rewrite(&qwen(&[(GRAPH_NODE, lm_head)]), &Options::new("text_encoder_q4", swiftshader))
            .unwrap_err()
            .to_string(),
        r#"cannot rewrite tensor "embed" to float32: its float32 form (1555824640 bytes) does not fit one GPU buffer (1073741824 bytes), and it cannot be looked up outside the graph: node 2 "lm_head" (ai.onnx::MatMul) reads it, and only Gathers of its rows can be looked up"#
    );
}
