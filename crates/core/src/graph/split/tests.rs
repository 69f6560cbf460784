//! Tests of the split: a decoder in small, sized by hand and cut at every allowed place.

use std::collections::HashSet;

use super::*;
use crate::graph::tests::{
    attr_int, entries, external_tensor, graph_fields, io_types, model, msg, node, raw_tensor, value_info, Dim,
};
use crate::onnx::wire::put_varint_field;

fn attr_ints(name: &str, values: &[i64]) -> Vec<u8> {
    let mut a = msg(&[(1, name.as_bytes())]);
    for v in values {
        put_varint_field(&mut a, 8, *v as u64);
    }
    put_varint_field(&mut a, 20, 7); // INTS
    a
}

fn int64s(name: &str, values: &[i64]) -> Vec<u8> {
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    raw_tensor(name, &[values.len() as u64], INT64, &raw)
}

/// The nodes of [`decoder_like`], by index in the comments.
fn decoder_nodes() -> Vec<Vec<u8>> {
    let pads = attr_ints("pads", &[1, 1, 1, 1]);
    let swap = || attr_ints("perm", &[0, 2, 1]);
    vec![
        node("shape_x", "", "Shape", &["x"], &["s"], &[]), // 0
        node("conv1", "", "Conv", &["x", "w1", "b1"], &["a"], &[pads]), // 1
        node("sigmoid", "", "Sigmoid", &["a"], &["b"], &[]), // 2
        node("silu", "", "Mul", &["a", "b"], &["c"], &[]), // 3
        node("conv2", "", "Conv", &["c", "w2"], &["d"], &[]), // 4
        node("residual", "", "Add", &["d", "a"], &["e"], &[]), // 5
        node("batch", "", "Gather", &["s", "zero"], &["n"], &[]), // 6
        node("flat_shape", "", "Concat", &["n", "eight_rest"], &["flat"], &[attr_int("axis", 0)]), // 7
        node("flatten", "", "Reshape", &["e", "flat"], &["f"], &[]), // 8
        node("tokens", "", "Transpose", &["f"], &["q"], &[swap()]), // 9
        node("scores", "", "MatMul", &["q", "f"], &["scores"], &[]), // 10
        node("softmax", "", "Softmax", &["scores"], &["weights"], &[]), // 11
        node("attend", "", "MatMul", &["weights", "q"], &["o"], &[]), // 12
        node("channels", "", "Transpose", &["o"], &["o2"], &[swap()]), // 13
        node("shape_e", "", "Shape", &["e"], &["se"], &[]), // 14
        node("unflatten", "", "Reshape", &["o2", "se"], &["y"], &[]), // 15
    ]
}

/// A decoder in small: x [batch, 4, h, w] through a residual block (conv, SiLU, conv, add) at 8
/// channels, then a single-head attention over every pixel, its shapes computed the exporter's way
/// (the batch from the input's shape; the way back from an intermediate tensor's). Weights external
/// in `w.data`.
fn decoder_like(nodes: Vec<Vec<u8>>, extra: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let dims = |c| [Dim::Param("batch"), Dim::Value(c), Dim::Param("h"), Dim::Param("w")];
    let mut fields: Vec<(u64, Vec<u8>)> = nodes.into_iter().map(|n| (GRAPH_NODE, n)).collect();
    fields.extend([
        (GRAPH_INITIALIZER, external_tensor("w1", &[8, 4, 3, 3], FLOAT, "w.data", 0, 1152)),
        (GRAPH_INITIALIZER, raw_tensor("b1", &[8], FLOAT, &[0; 32])),
        (GRAPH_INITIALIZER, external_tensor("w2", &[8, 8, 1, 1], FLOAT, "w.data", 1152, 256)),
        (GRAPH_INITIALIZER, int64s("zero", &[0])),
        (GRAPH_INITIALIZER, int64s("eight_rest", &[8, -1])),
        (GRAPH_INPUT, value_info("x", FLOAT, &dims(4))),
        (GRAPH_OUTPUT, value_info("y", FLOAT, &dims(8))),
        (GRAPH_VALUE_INFO, value_info("a", FLOAT, &dims(8))),
    ]);
    fields.extend(extra.iter().cloned());
    model(&fields)
}

/// What one run allocates for a latent of `p` pixels: x (4p floats); a, b, c, d, e (8p each); the
/// tokens q, the attention's o and o2 (8p each); scores and weights (p x p each); the shapes s, n,
/// flat and se (4 + 1 + 3 + 4 int64). The Reshapes f and y alias their inputs.
fn expected_bytes(p: u64) -> u64 {
    4 * (4 * p + 5 * 8 * p + 3 * 8 * p + 2 * p * p) + 8 * (4 + 1 + 3 + 4)
}

#[test]
fn every_output_is_sized_and_attention_is_quadratic() {
    let m = decoder_like(decoder_nodes(), &[]);
    assert_eq!(activation_bytes(&m, 2, 3).unwrap(), expected_bytes(6));
    assert_eq!(activation_bytes(&m, 2, 3).unwrap(), 2016);
    // Sides doubled: the linear part 4x, the scores 16x.
    assert_eq!(activation_bytes(&m, 4, 6).unwrap(), expected_bytes(24));
}

#[test]
fn float16_tensors_take_two_bytes() {
    let m = model(&[
        (GRAPH_NODE, node("half", "", "Cast", &["x"], &["y"], &[attr_int("to", FLOAT16)])),
        (
            GRAPH_INPUT,
            value_info("x", FLOAT, &[Dim::Value(1), Dim::Value(4), Dim::Param("h"), Dim::Param("w")]),
        ),
        (
            GRAPH_OUTPUT,
            value_info("y", FLOAT16, &[Dim::Value(1), Dim::Value(4), Dim::Param("h"), Dim::Param("w")]),
        ),
    ]);
    assert_eq!(activation_bytes(&m, 2, 3).unwrap(), 4 * 24 + 2 * 24);
}

/// The original node payloads of `model`'s graph.
fn node_payloads(model: &[u8]) -> Vec<Vec<u8>> {
    graph_fields(model, GRAPH_NODE)
}

fn names(values: &[&str]) -> Vec<String> {
    values.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_smallest_pieces_cut_wherever_allowed() {
    let m = decoder_like(decoder_nodes(), &[]);
    let original = node_payloads(&m);
    let pieces = split(&m, 2, 3, 0).unwrap();
    let ranges: Vec<Range<usize>> = pieces.iter().map(|p| p.nodes.clone()).collect();
    // Not after the input's Shape (0), the batch's Gather (6) or Concat (7): shape arithmetic goes with
    // its reader. Not between `shape_e` (14) and its Reshape (15): an int64 tensor of an intermediate.
    assert_eq!(ranges, [0..2, 2..3, 3..4, 4..5, 5..6, 6..9, 9..10, 10..11, 11..12, 12..13, 13..14, 14..16]);

    // Each piece runs its own nodes as they were; the one that needs the batch computes it again from x.
    for piece in &pieces {
        let mut expected: Vec<Vec<u8>> = Vec::new();
        if piece.nodes.start == 6 {
            expected.push(original[0].clone());
        }
        expected.extend(original[piece.nodes.clone()].iter().cloned());
        assert_eq!(node_payloads(&piece.model), expected, "{:?}", piece.nodes);
    }
    let reshape = &pieces[5];
    assert_eq!((reshape.inputs.clone(), reshape.outputs.clone()), (names(&["x", "e"]), names(&["f"])));

    // The chain: every input is the graph's or an earlier piece's output, and it ends with y.
    let mut available: HashSet<String> = HashSet::from(["x".to_owned()]);
    for piece in &pieces {
        for input in &piece.inputs {
            assert!(available.contains(input), "{input} before {:?}", piece.nodes);
        }
        available.extend(piece.outputs.iter().cloned());
        // The declared inputs and outputs are the listed ones, all float32 here.
        let declared: Vec<(String, u64)> = piece.inputs.iter().map(|i| (i.clone(), FLOAT)).collect();
        assert_eq!(io_types(&piece.model, GRAPH_INPUT), declared);
        let declared: Vec<(String, u64)> = piece.outputs.iter().map(|o| (o.clone(), FLOAT)).collect();
        assert_eq!(io_types(&piece.model, GRAPH_OUTPUT), declared);
    }
    assert_eq!(pieces.last().unwrap().outputs, names(&["y"]));
    // The residual a crosses cuts until the Add reads it.
    assert_eq!(pieces[1].inputs, names(&["a"]));
    assert_eq!(pieces[1].outputs, names(&["b"]));
    assert_eq!(pieces[4].inputs, names(&["a", "d"]));

    // The scores' piece holds q and f as inputs, writes the p x p scores, and holds e for later.
    let scores = &pieces[7];
    assert_eq!(scores.inputs, names(&["f", "q"]));
    assert_eq!(scores.bytes, 4 * (8 * 6 + 8 * 6 + 6 * 6 + 8 * 6));
}

#[test]
fn pieces_take_only_the_initializers_they_read_byte_for_byte() {
    let m = decoder_like(decoder_nodes(), &[]);
    let original = graph_fields(&m, GRAPH_INITIALIZER);
    let name = |t: &[u8]| read_tensor(t).unwrap().name;
    let pieces = split(&m, 2, 3, 0).unwrap();
    let mut seen = Vec::new();
    for piece in &pieces {
        let read: HashSet<String> = node_payloads(&piece.model)
            .iter()
            .flat_map(|n| read_node(n, 0).unwrap().inputs.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .collect();
        let expected: Vec<Vec<u8>> = original.iter().filter(|t| read.contains(&name(t))).cloned().collect();
        let initializers = graph_fields(&piece.model, GRAPH_INITIALIZER);
        assert_eq!(initializers, expected, "{:?}", piece.nodes);
        seen.extend(initializers.iter().map(|t| name(t)));
    }
    assert_eq!(seen, ["w1", "b1", "w2", "zero", "eight_rest"]);
    let w1 = &graph_fields(&pieces[0].model, GRAPH_INITIALIZER)[0];
    let entry = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    assert_eq!(entries(w1), [entry("location", "w.data"), entry("offset", "0"), entry("length", "1152")]);
}

#[test]
fn the_model_keeps_its_other_fields_and_its_value_info() {
    let m = decoder_like(decoder_nodes(), &[]);
    let pieces = split(&m, 2, 3, 0).unwrap();
    let model_fields = |m: &[u8]| -> Vec<Vec<u8>> {
        wire::parse(m, "m")
            .unwrap()
            .iter()
            .filter(|f| f.number != MODEL_GRAPH)
            .map(|f| f.raw.to_vec())
            .collect()
    };
    for piece in &pieces {
        assert_eq!(model_fields(&piece.model), model_fields(&m));
    }
    // `a`'s declaration goes where a is computed (in value_info) and where it is passed (as an input
    // or output, with its declared shape).
    let a = value_info("a", FLOAT, &[Dim::Param("batch"), Dim::Value(8), Dim::Param("h"), Dim::Param("w")]);
    assert_eq!(graph_fields(&pieces[0].model, GRAPH_OUTPUT), std::slice::from_ref(&a));
    assert_eq!(graph_fields(&pieces[1].model, GRAPH_INPUT), [a]);
    assert!(graph_fields(&pieces[0].model, GRAPH_VALUE_INFO).is_empty());
}

#[test]
fn a_budget_is_kept_where_the_cuts_allow() {
    let m = decoder_like(decoder_nodes(), &[]);
    let smallest = split(&m, 2, 3, 0).unwrap();
    let budget = smallest.iter().map(|p| p.bytes).max().unwrap();
    let pieces = split(&m, 2, 3, budget).unwrap();
    assert!(pieces.iter().all(|p| p.bytes <= budget), "{pieces:?}");
    assert!(pieces.len() > 1 && pieces.len() < smallest.len(), "{}", pieces.len());
    let ends: Vec<usize> = pieces.iter().map(|p| p.nodes.end).collect();
    assert_eq!(ends.last(), Some(&16));
    assert!(ends.windows(2).all(|w| w[0] < w[1]));
    // Over the budget only where no allowed cut comes sooner: then the piece is one of the smallest.
    for budget in [100, 500, 600, 650, 700, 720, 1000, 1500] {
        for piece in split(&m, 2, 3, budget).unwrap().iter().filter(|p| p.bytes > budget) {
            assert!(smallest.iter().any(|s| s.nodes == piece.nodes), "{budget}: {:?}", piece.nodes);
        }
    }
}

#[test]
fn a_graph_that_fits_is_one_piece_as_it_was() {
    let m = decoder_like(decoder_nodes(), &[]);
    let pieces = split(&m, 2, 3, expected_bytes(6)).unwrap();
    assert_eq!(pieces.len(), 1);
    assert_eq!(pieces[0].model, m);
    assert_eq!((pieces[0].inputs.clone(), pieces[0].outputs.clone()), (names(&["x"]), names(&["y"])));
    assert_eq!(pieces[0].bytes, expected_bytes(6));
    assert!(split(&m, 2, 3, expected_bytes(6) - 1).unwrap().len() > 1);
}

#[test]
fn what_cannot_be_sized_is_refused_by_name() {
    let mut nodes = decoder_nodes();
    nodes[2] = node("sigmoid", "", "Fancy", &["a"], &["b"], &[]);
    let m = decoder_like(nodes, &[]);
    assert_eq!(
        split(&m, 2, 3, 0).unwrap_err().to_string(),
        "cannot size node 2 \"sigmoid\" (ai.onnx::Fancy): the split has no rule for the operator"
    );
    let mut nodes = decoder_nodes();
    nodes[2] = node("sigmoid", "com.example", "Sigmoid", &["a"], &["b"], &[]);
    let err = activation_bytes(&decoder_like(nodes, &[]), 2, 3).unwrap_err().to_string();
    assert!(err.contains("(com.example::Sigmoid)"), "{err}");

    // Out of order.
    let mut nodes = decoder_nodes();
    nodes.swap(2, 3);
    let err = activation_bytes(&decoder_like(nodes, &[]), 2, 3).unwrap_err().to_string();
    assert!(err.starts_with("cannot size node 2 \"silu\" (ai.onnx::Mul): it reads \"b\""), "{err}");
    assert!(err.contains("topological order"), "{err}");

    // A declared shape that says otherwise.
    let wrong = value_info("d", FLOAT, &[Dim::Value(1), Dim::Value(5), Dim::Param("h"), Dim::Param("w")]);
    let err =
        activation_bytes(&decoder_like(decoder_nodes(), &[(GRAPH_VALUE_INFO, wrong)]), 2, 3).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot size node 4 \"conv2\" (ai.onnx::Conv): its output \"d\" is sized as type 1 [1, 8, 2, 3], which its declared type and shape contradict"
    );

    // A Reshape target that is not computed from shapes and constants.
    let mut nodes = decoder_nodes();
    nodes[8] = node("flatten", "", "Reshape", &["e", "x"], &["f"], &[]);
    let err = activation_bytes(&decoder_like(nodes, &[]), 2, 3).unwrap_err().to_string();
    assert!(err.contains("its shape (\"x\") is not a value the split can evaluate"), "{err}");
}

#[test]
fn the_latent_needs_its_channels_static() {
    let input =
        value_info("x", FLOAT, &[Dim::Param("batch"), Dim::Param("c"), Dim::Param("h"), Dim::Param("w")]);
    let m = model(&[(GRAPH_NODE, node("id", "", "Identity", &["x"], &["y"], &[])), (GRAPH_INPUT, input)]);
    assert_eq!(
        activation_bytes(&m, 2, 3).unwrap_err().to_string(),
        "cannot size graph input \"x\": its dim 1 is symbolic"
    );
}

/// The committed fixture decoders (closed forms, not the real architecture) size and split too.
#[test]
fn the_fixture_decoders_split() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/packs");
    for pack in ["f32", "f32-vae32", "f16"] {
        let m = std::fs::read(dir.join(pack).join("vae_decoder.onnx")).unwrap();
        let whole = activation_bytes(&m, 4, 6).unwrap();
        let pieces = split(&m, 4, 6, 0).unwrap();
        assert!(pieces.iter().all(|p| p.bytes <= whole), "{pack}");
        assert_eq!(pieces.last().unwrap().outputs, names(&["sample"]), "{pack}");
    }
}

/// Three matrix products in a row, x [batch, 4] through w1, w2, w3 (external in `w.data`: 64, 64 and
/// 128 bytes), with `b` (after the first) declared and `c` (after the second) declared only when
/// `declare_c`; `batch` (a shape) read at the end.
fn three_products(declare_c: bool) -> Vec<u8> {
    let mut fields = vec![
        (GRAPH_NODE, node("shape", "", "Shape", &["x"], &["batch"], &[])),
        (GRAPH_NODE, node("p1", "", "MatMul", &["x", "w1"], &["b"], &[])),
        (GRAPH_NODE, node("p2", "", "MatMul", &["b", "w2"], &["c"], &[])),
        (GRAPH_NODE, node("p3", "", "MatMul", &["c", "w3"], &["d"], &[])),
        (GRAPH_NODE, node("back", "", "Reshape", &["d", "batch"], &["y"], &[])),
        (GRAPH_INITIALIZER, external_tensor("w1", &[4, 4], FLOAT, "w.data", 0, 64)),
        (GRAPH_INITIALIZER, external_tensor("w2", &[4, 4], FLOAT, "w.data", 64, 64)),
        (GRAPH_INITIALIZER, external_tensor("w3", &[4, 8], FLOAT, "w.data", 128, 128)),
        (GRAPH_INPUT, value_info("x", FLOAT, &[Dim::Param("batch"), Dim::Value(4)])),
        (GRAPH_OUTPUT, value_info("y", FLOAT, &[Dim::Param("batch"), Dim::Value(8)])),
        (GRAPH_VALUE_INFO, value_info("b", FLOAT, &[Dim::Param("batch"), Dim::Value(4)])),
        (GRAPH_VALUE_INFO, value_info("batch", INT64, &[Dim::Value(2)])),
        (GRAPH_VALUE_INFO, value_info("d", FLOAT, &[Dim::Param("batch"), Dim::Value(8)])),
    ];
    if declare_c {
        fields.push((GRAPH_VALUE_INFO, value_info("c", FLOAT, &[Dim::Param("batch"), Dim::Value(4)])));
    }
    model(&fields)
}

#[test]
fn by_weights_cuts_where_the_weights_halve_and_passes_what_later_pieces_read() {
    let pieces = by_weights(&three_products(true), 2).unwrap();
    // 256 bytes of weights: the cut before p3 leaves 128 on each side.
    assert_eq!(pieces.iter().map(|p| p.bytes).collect::<Vec<_>>(), [128, 128]);
    assert_eq!(pieces[0].nodes, 0..3);
    assert_eq!(pieces[0].inputs, ["x"]);
    assert_eq!(pieces[0].outputs, ["batch", "c"]);
    assert_eq!(pieces[1].inputs, ["batch", "c"]);
    assert_eq!(pieces[1].outputs, ["y"]);
    // Each piece is a graph of its own nodes and initializers, declaring what it is passed.
    let second = Graph::structure(&pieces[1].model).unwrap();
    assert_eq!(second.nodes.iter().map(|n| n.name).collect::<Vec<_>>(), ["p3", "back"]);
    assert_eq!(second.initializers, HashSet::from(["w3"]));
    assert_eq!(second.inputs, ["batch", "c"]);
    for name in ["c", "batch"] {
        assert!(second.declared.contains_key(name), "{name} declared");
    }
    // One part, or two where no cut is allowed: the model as it was.
    assert_eq!(by_weights(&three_products(true), 1).unwrap()[0].model, three_products(true));
}

#[test]
fn by_weights_never_passes_an_undeclared_value() {
    // Without c's declaration the cut before p3 is refused; the nearest allowed is before p2 (b).
    let pieces = by_weights(&three_products(false), 2).unwrap();
    assert_eq!(pieces.iter().map(|p| p.bytes).collect::<Vec<_>>(), [64, 192]);
    assert_eq!(pieces[1].inputs, ["batch", "b"]);
    // Three parts: at most as many pieces as allowed cuts give, each with weights of its own.
    let three = by_weights(&three_products(false), 3).unwrap();
    assert_eq!(three.len(), 2);
}

#[test]
fn declared_io_is_what_the_graph_declares() {
    use crate::session::{DType, Dim, TensorInfo};
    let (inputs, outputs) = declared_io(&three_products(true)).unwrap();
    let info = |name: &str, width| TensorInfo {
        name: name.into(),
        dtype: DType::Float32,
        shape: vec![Dim::Symbolic("batch".into()), Dim::Fixed(width)],
    };
    assert_eq!(inputs, [info("x", 4)]);
    assert_eq!(outputs, [info("y", 8)]);
}
