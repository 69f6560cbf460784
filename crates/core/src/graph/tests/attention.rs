//! Attention fused into `MultiHeadAttention`, and computed in chunks of query rows.

use super::*;

// ------------------------------------------------------------------------------------------------
// Attention fused into MultiHeadAttention (`crate::graph::attention`).

fn attr_ints(name: &str, values: &[i64]) -> Vec<u8> {
    let mut a = msg(&[(1, name.as_bytes())]);
    for v in values {
        put_varint_field(&mut a, 8, *v as u64);
    }
    put_varint_field(&mut a, 20, 7); // INTS
    a
}

/// softmax(Transpose(q) · Transpose(k) * 0.125) · Transpose(v), transposed back; q, k, v declared
/// [1, S, 2, 8]. `mask` adds a graph input to the scores.
fn attention_model(mask: bool) -> Vec<u8> {
    model(&attention_fields(mask))
}

/// The graph of [`attention_model`], as its fields.
fn attention_fields(mask: bool) -> Vec<(u64, Vec<u8>)> {
    let bsnh =
        |name: &str| value_info(name, FLOAT, &[Dim::Value(1), Dim::Param("S"), Dim::Value(2), Dim::Value(8)]);
    let swap = || attr_ints("perm", &[0, 2, 1, 3]);
    let scores = if mask { "masked" } else { "scores" };
    let mut fields = vec![
        (GRAPH_NODE, node("tq", "", "Transpose", &["q"], &["q4"], &[swap()])),
        (GRAPH_NODE, node("tk", "", "Transpose", &["k"], &["kt"], &[attr_ints("perm", &[0, 2, 3, 1])])),
        (GRAPH_NODE, node("qk", "", "MatMul", &["q4", "kt"], &["raw"], &[])),
        (GRAPH_NODE, node("scale", "", "Mul", &["raw", "eighth"], &["scores"], &[])),
    ];
    if mask {
        fields.push((GRAPH_NODE, node("mask", "", "Add", &["scores", "m"], &["masked"], &[])));
    }
    fields.extend([
        (GRAPH_NODE, node("sm", "", "Softmax", &[scores], &["w"], &[attr_int("axis", -1i64 as u64)])),
        (GRAPH_NODE, node("tv", "", "Transpose", &["v"], &["v4"], &[swap()])),
        (GRAPH_NODE, node("wv", "", "MatMul", &["w", "v4"], &["o4"], &[])),
        (GRAPH_NODE, node("back", "", "Transpose", &["o4"], &["o"], &[swap()])),
        (GRAPH_NODE, node("out", "", "Identity", &["o"], &["y"], &[])),
        (GRAPH_INITIALIZER, raw_tensor("eighth", &[], FLOAT, &0.125f32.to_le_bytes())),
        (GRAPH_INPUT, bsnh("q")),
        (GRAPH_INPUT, bsnh("k")),
        (GRAPH_INPUT, bsnh("v")),
        (GRAPH_OUTPUT, bsnh("y")),
        (GRAPH_VALUE_INFO, bsnh("o")),
        (GRAPH_VALUE_INFO, value_info("w", FLOAT, &[])),
    ]);
    if mask {
        fields.push((GRAPH_INPUT, value_info("m", FLOAT, &[])));
    }
    fields
}

#[test]
fn attention_is_fused_under_the_name_the_graph_reads_and_what_fed_only_it_goes() {
    let (fused, count) = crate::graph::attention::fuse_attention(&attention_model(false)).unwrap();
    assert_eq!(count, 1);
    let nodes: Vec<Vec<u8>> = graph_fields(&fused, GRAPH_NODE);
    let nodes: Vec<_> = nodes.iter().map(|n| read_node(n, 0).unwrap()).collect();
    let ops: Vec<(&str, Vec<&str>, Vec<&str>)> =
        nodes.iter().map(|n| (n.op_type, n.inputs.clone(), n.outputs.clone())).collect();
    let bsd = "imagine_attention/bsd_shape";
    assert_eq!(
        ops,
        vec![
            ("Reshape", vec!["q", bsd], vec!["imagine_attention/back/q_bsd"]),
            ("Reshape", vec!["k", bsd], vec!["imagine_attention/back/k_bsd"]),
            ("Reshape", vec!["v", bsd], vec!["imagine_attention/back/v_bsd"]),
            (
                "MultiHeadAttention",
                vec![
                    "imagine_attention/back/q_bsd",
                    "imagine_attention/back/k_bsd",
                    "imagine_attention/back/v_bsd"
                ],
                vec![
                    "imagine_attention/back/output_bsd",
                    "imagine_attention/back/present_key",
                    "imagine_attention/back/present_value"
                ],
            ),
            (
                "Reshape",
                vec!["imagine_attention/back/output_bsd", "imagine_attention/back/bsnh_shape"],
                vec!["o"]
            ),
            ("Identity", vec!["o"], vec!["y"]),
        ]
    );
    let mha = &nodes[3];
    assert_eq!((mha.domain, mha.int_attribute("num_heads")), ("com.microsoft", Some(2)));
    let scale = mha.attributes.iter().find(|a| a.name == "scale").unwrap();
    let bits = scale.fields.iter().find(|f| f.number == 2).unwrap();
    assert_eq!(bits.value, Value::Fixed32(0.125f32.to_bits()));
    // The scale's initializer went with the Mul; the shapes of the new Reshapes came in.
    let initializers: Vec<String> =
        graph_fields(&fused, GRAPH_INITIALIZER).iter().map(|t| read_tensor(t).unwrap().name).collect();
    assert_eq!(initializers, [bsd, "imagine_attention/back/bsnh_shape"]);
    // Declared shapes stay for values that still exist ("o"), not for the scores' weights ("w").
    let declared: Vec<String> = graph_fields(&fused, GRAPH_VALUE_INFO)
        .iter()
        .map(|v| value_info_name(v).unwrap().to_owned())
        .collect();
    assert_eq!(declared, ["o"]);
    // The contrib domain is imported once.
    let again = crate::graph::attention::fuse_attention(&fused).unwrap();
    assert_eq!(again.1, 0);
    let imports = wire::parse(&fused, "m").unwrap().into_iter().filter(|f| f.number == 8).count();
    assert_eq!(imports, 2);
}

#[test]
fn a_malformed_node_is_refused_not_read_past_its_end() {
    // A MatMul with one input, a Softmax with no output: read by position, they would panic the
    // stage worker.
    for bad in [node("mm", "", "MatMul", &["q"], &["s"], &[]), node("sm", "", "Softmax", &["s"], &[], &[])] {
        let broken = model(&[(1, bad)]);
        for result in [
            crate::graph::attention::fuse_attention(&broken),
            crate::graph::attention::chunk_attention(&broken, 2),
        ] {
            let error = result.unwrap_err().to_string();
            assert!(error.contains("takes at least"), "{error}");
        }
    }
}

#[test]
fn attention_that_cannot_be_proven_stays_byte_for_byte() {
    let masked = attention_model(true);
    assert_eq!(crate::graph::attention::fuse_attention(&masked).unwrap(), (masked.clone(), 0));
    assert_eq!(crate::graph::attention::fuse_attention(&model(&[])).unwrap().1, 0);
}

// ------------------------------------------------------------------------------------------------
// Attention in chunks of query rows (`crate::graph::attention::chunk_attention`). What the chunked graphs
// compute, against the originals on ONNX Runtime, is checked in tools/export/tests/test_attention_chunks.py.

/// (op_type, inputs, outputs) of each node of `model`'s graph.
fn node_ops(model: &[u8]) -> Vec<(String, Vec<String>, Vec<String>)> {
    graph_fields(model, GRAPH_NODE)
        .iter()
        .map(|n| {
            let n = read_node(n, 0).unwrap();
            let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            (n.op_type.to_owned(), strings(&n.inputs), strings(&n.outputs))
        })
        .collect()
}

fn op(op: &str, inputs: &[&str], outputs: &[&str]) -> (String, Vec<String>, Vec<String>) {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    (op.to_owned(), strings(inputs), strings(outputs))
}

/// The chain of part `i`: the original MatMul, Mul, Softmax and MatMul with their values renamed.
fn chunk_chain(base: &str, i: usize) -> Vec<(String, Vec<String>, Vec<String>)> {
    let v = |name: &str| format!("{base}/0/part_{i}/{name}");
    vec![
        op("MatMul", &[&v("q4"), "kt"], &[&v("raw")]),
        op("Mul", &[&v("raw"), "eighth"], &[&v("scores")]),
        op("Softmax", &[&v("scores")], &[&v("w")]),
        op("MatMul", &[&v("w"), "v4"], &[&v("o4")]),
    ]
}

#[test]
fn attention_is_chunked_along_the_query_rows_under_the_name_the_graph_reads() {
    let original = model_with_opset(&attention_fields(false), Some(18));
    let (chunked, count) = crate::graph::attention::chunk_attention(&original, 3).unwrap();
    assert_eq!(count, 1);
    let parts: Vec<String> = (0..3).map(|i| format!("imagine_chunks/0/part_{i}/q4")).collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let outputs: Vec<String> = (0..3).map(|i| format!("imagine_chunks/0/part_{i}/o4")).collect();
    let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    let mut expected = vec![
        op("Transpose", &["q"], &["q4"]),
        op("Transpose", &["k"], &["kt"]),
        op("Transpose", &["v"], &["v4"]),
        op("Split", &["q4"], &parts),
    ];
    for i in 0..3 {
        expected.extend(chunk_chain("imagine_chunks", i));
    }
    expected.extend([
        op("Concat", &outputs, &["o4"]),
        op("Transpose", &["o4"], &["o"]),
        op("Identity", &["o"], &["y"]),
    ]);
    assert_eq!(node_ops(&chunked), expected);

    let nodes = graph_fields(&chunked, GRAPH_NODE);
    let nodes: Vec<_> = nodes.iter().map(|n| read_node(n, 0).unwrap()).collect();
    let split = &nodes[3];
    assert_eq!((split.int_attribute("axis"), split.int_attribute("num_outputs")), (Some(2), Some(3)));
    assert_eq!(nodes[nodes.len() - 3].int_attribute("axis"), Some(2));
    // The copies keep the originals' attributes and unknown fields, under new names.
    let softmax = &nodes[6];
    assert_eq!(softmax.int_attribute("axis"), Some(-1i64 as u64));
    assert_eq!(softmax.name, "imagine_chunks/0/part_0/w");
    assert!(contains(softmax.bytes, UNKNOWN));
    // The scale is read by every part; nothing new is stored; the scores' declared shape goes.
    let initializers: Vec<String> =
        graph_fields(&chunked, GRAPH_INITIALIZER).iter().map(|t| read_tensor(t).unwrap().name).collect();
    assert_eq!(initializers, ["eighth"]);
    let declared: Vec<String> = graph_fields(&chunked, GRAPH_VALUE_INFO)
        .iter()
        .map(|v| value_info_name(v).unwrap().to_owned())
        .collect();
    assert_eq!(declared, ["o"]);
    // What is chunked is found no more.
    assert_eq!(crate::graph::attention::chunk_attention(&chunked, 3).unwrap().1, 0);
    assert_eq!(crate::graph::attention::fuse_attention(&chunked).unwrap().1, 0);
}

#[test]
fn before_opset_18_the_query_rows_are_sliced_from_its_shape() {
    let original = model_with_opset(&attention_fields(false), Some(17));
    let (chunked, count) = crate::graph::attention::chunk_attention(&original, 3).unwrap();
    assert_eq!(count, 1);
    let c = |name: &str| format!("imagine_chunks/{name}");
    let v = |name: &str| format!("imagine_chunks/0/{name}");
    let part = |i: usize| format!("imagine_chunks/0/part_{i}/q4");
    let mut expected = vec![
        op("Transpose", &["q"], &["q4"]),
        op("Transpose", &["k"], &["kt"]),
        op("Transpose", &["v"], &["v4"]),
        op("Shape", &["q4"], &[&v("shape")]),
        op("Gather", &[&v("shape"), &c("axis")], &[&v("length")]),
        op("Add", &[&v("length"), &c("round_up")], &[&v("rounded")]),
        op("Div", &[&v("rounded"), &c("chunks")], &[&v("size")]),
        op("Mul", &[&v("size"), &c("times_1")], &[&v("start_1")]),
        op("Mul", &[&v("size"), &c("times_2")], &[&v("start_2")]),
        op("Slice", &["q4", &c("zero"), &v("start_1"), &c("axis")], &[&part(0)]),
        op("Slice", &["q4", &v("start_1"), &v("start_2"), &c("axis")], &[&part(1)]),
        op("Slice", &["q4", &v("start_2"), &c("end"), &c("axis")], &[&part(2)]),
    ];
    for i in 0..3 {
        expected.extend(chunk_chain("imagine_chunks", i));
    }
    let outputs: Vec<String> = (0..3).map(|i| format!("imagine_chunks/0/part_{i}/o4")).collect();
    let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    expected.extend([
        op("Concat", &outputs, &["o4"]),
        op("Transpose", &["o4"], &["o"]),
        op("Identity", &["o"], &["y"]),
    ]);
    assert_eq!(node_ops(&chunked), expected);
    let constants: Vec<(String, Vec<u8>)> = graph_fields(&chunked, GRAPH_INITIALIZER)
        .iter()
        .map(|t| (read_tensor(t).unwrap().name, raw_data(t)))
        .collect();
    let int64 = |v: i64| v.to_le_bytes().to_vec();
    assert_eq!(
        constants,
        [
            ("eighth".to_owned(), 0.125f32.to_le_bytes().to_vec()),
            (c("axis"), int64(2)),
            (c("round_up"), int64(2)),
            (c("chunks"), int64(3)),
            (c("zero"), int64(0)),
            (c("end"), int64(i64::MAX)),
            (c("times_1"), int64(1)),
            (c("times_2"), int64(2)),
        ]
    );
}

#[test]
fn a_value_that_is_the_query_is_read_whole_by_every_part() {
    let mut fields = attention_fields(false);
    fields.remove(5); // tv
    fields[5] = (GRAPH_NODE, node("wv", "", "MatMul", &["w", "q4"], &["o4"], &[]));
    let (chunked, count) =
        crate::graph::attention::chunk_attention(&model_with_opset(&fields, Some(18)), 2).unwrap();
    assert_eq!(count, 1);
    let products: Vec<_> = node_ops(&chunked).into_iter().filter(|(op, ..)| op == "MatMul").collect();
    let v = |i: usize, name: &str| format!("imagine_chunks/0/part_{i}/{name}");
    assert_eq!(
        products,
        [
            op("MatMul", &[&v(0, "q4"), "kt"], &[&v(0, "raw")]),
            op("MatMul", &[&v(0, "w"), "q4"], &[&v(0, "o4")]),
            op("MatMul", &[&v(1, "q4"), "kt"], &[&v(1, "raw")]),
            op("MatMul", &[&v(1, "w"), "q4"], &[&v(1, "o4")]),
        ]
    );
}

#[test]
fn new_names_start_with_a_prefix_no_existing_name_starts_with() {
    let mut fields = attention_fields(false);
    // An existing node named like the prefix, and a value like its first alternative.
    fields[8] = (GRAPH_NODE, node("imagine_chunks", "", "Identity", &["o"], &["imagine_chunks_1x"], &[]));
    fields.push((GRAPH_NODE, node("out", "", "Identity", &["imagine_chunks_1x"], &["y"], &[])));
    let (chunked, count) =
        crate::graph::attention::chunk_attention(&model_with_opset(&fields, Some(18)), 2).unwrap();
    assert_eq!(count, 1);
    let ops = node_ops(&chunked);
    assert_eq!(
        ops[3],
        op("Split", &["q4"], &["imagine_chunks_2/0/part_0/q4", "imagine_chunks_2/0/part_1/q4"])
    );
}

#[test]
fn attention_that_is_not_chunked_stays_byte_for_byte() {
    let original = model_with_opset(&attention_fields(false), Some(18));
    for chunks in [0, 1] {
        assert_eq!(
            crate::graph::attention::chunk_attention(&original, chunks).unwrap(),
            (original.clone(), 0)
        );
    }
    let masked = model_with_opset(&attention_fields(true), Some(18));
    assert_eq!(crate::graph::attention::chunk_attention(&masked, 4).unwrap(), (masked.clone(), 0));
    // Without a default opset of at least 13 there is nothing to cut with.
    for old in [attention_model(false), model_with_opset(&attention_fields(false), Some(12))] {
        assert_eq!(crate::graph::attention::chunk_attention(&old, 4).unwrap(), (old.clone(), 0));
    }
    assert_eq!(crate::graph::attention::chunk_attention(&model(&[]), 4).unwrap().1, 0);
}

#[test]
fn chunks_keep_the_scores_within_the_largest_cached_buffer() {
    use crate::graph::attention::{chunks_for, ORT_LARGEST_CACHED_BUFFER as MAX};
    let scores = |heads: u64, tokens: u64, bytes: u64, c: u64| heads * tokens.div_ceil(c) * tokens * bytes;
    // 1024x1024: 4096 image and 512 text tokens, 24 heads. float16: 6 chunks of 768 rows are 170 MB,
    // 7 of 659 (the last 654) are 146 MB.
    assert_eq!(chunks_for(24, 4608, 2, MAX), 7);
    assert!(scores(24, 4608, 2, 7) <= MAX && scores(24, 4608, 2, 6) > MAX);
    assert_eq!(scores(24, 4608, 2, 1), 1_019_215_872);
    // float32 scores are twice as large.
    assert_eq!(chunks_for(24, 4608, 4, MAX), 13);
    assert!(scores(24, 4608, 4, 13) <= MAX && scores(24, 4608, 4, 12) > MAX);
    // Already under: one chunk; exactly at the bound: one chunk.
    assert_eq!(chunks_for(24, 1536, 2, MAX), 1);
    assert_eq!(chunks_for(1, 4096, 1, 4096 * 4096), 1);
    assert_eq!(chunks_for(1, 4096, 1, 4096 * 4096 - 1), 2);
    // A row a chunk when even one row is over; nothing to cut.
    assert_eq!(chunks_for(24, 4608, 2, 1), 4608);
    assert_eq!(chunks_for(24, 0, 2, MAX), 1);
    assert_eq!(chunks_for(0, 4608, 2, MAX), 1);
}
