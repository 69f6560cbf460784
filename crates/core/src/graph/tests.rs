//! Tests of the rewrite: hand-built models for each rule and refusal, and the committed fixture packs.

use std::collections::HashMap;
use std::path::PathBuf;

use half::f16;

use super::float32::{read_node, read_tensor, shape_dims, value_info_name, Tensor};
use super::*;
use crate::onnx::fields::{
    FLOAT, FLOAT16, GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_NODE, GRAPH_OUTPUT, GRAPH_VALUE_INFO, INT64, UINT8,
};
use crate::onnx::wire::{self, put_bytes_field, put_varint_field, Value};

// ------------------------------------------------------------------------------------------------
// A small ONNX writer for test models (the split's tests use it too).

/// A field no ONNX version defines, put in several messages to check that it survives.
const UNKNOWN: &[u8] = &[0xd8, 0x3e, 0x2a]; // field 999, varint 42

pub(super) fn msg(fields: &[(u64, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (n, payload) in fields {
        put_bytes_field(&mut out, *n, payload);
    }
    out
}

fn halves(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| f16::from_f32(*v).to_bits().to_le_bytes()).collect()
}

fn floats(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn tensor_head(name: &str, dims: &[u64], data_type: u64) -> Vec<u8> {
    let mut t = Vec::new();
    for d in dims {
        put_varint_field(&mut t, 1, *d);
    }
    put_varint_field(&mut t, 2, data_type);
    put_bytes_field(&mut t, 8, name.as_bytes());
    t
}

pub(super) fn raw_tensor(name: &str, dims: &[u64], data_type: u64, raw: &[u8]) -> Vec<u8> {
    let mut t = tensor_head(name, dims, data_type);
    put_bytes_field(&mut t, 9, raw);
    t.extend_from_slice(UNKNOWN);
    t
}

/// float16 in `int32_data`, packed, as Python `onnx.helper.make_tensor` writes it.
fn int32_f16_tensor(name: &str, values: &[f32]) -> Vec<u8> {
    let mut t = tensor_head(name, &[values.len() as u64], FLOAT16);
    let mut packed = Vec::new();
    for v in values {
        wire::put_varint(&mut packed, u64::from(f16::from_f32(*v).to_bits()));
    }
    put_bytes_field(&mut t, 5, &packed);
    t
}

pub(super) fn external_tensor(
    name: &str,
    dims: &[u64],
    data_type: u64,
    location: &str,
    offset: u64,
    length: u64,
) -> Vec<u8> {
    let mut t = tensor_head(name, dims, data_type);
    for (k, v) in
        [("location", location.to_owned()), ("offset", offset.to_string()), ("length", length.to_string())]
    {
        put_bytes_field(&mut t, 13, &msg(&[(1, k.as_bytes()), (2, v.as_bytes())]));
    }
    put_varint_field(&mut t, 14, 1);
    t
}

pub(super) enum Dim<'a> {
    Value(u64),
    Param(&'a str),
}

pub(super) fn value_info(name: &str, elem: u64, dims: &[Dim]) -> Vec<u8> {
    let mut shape = Vec::new();
    for d in dims {
        let mut dim = Vec::new();
        match d {
            Dim::Value(v) => put_varint_field(&mut dim, 1, *v),
            Dim::Param(p) => put_bytes_field(&mut dim, 2, p.as_bytes()),
        }
        put_bytes_field(&mut shape, 1, &dim);
    }
    let mut tensor = Vec::new();
    put_varint_field(&mut tensor, 1, elem);
    put_bytes_field(&mut tensor, 2, &shape);
    let mut vi = msg(&[(1, name.as_bytes()), (2, &msg(&[(1, &tensor)]))]);
    vi.extend_from_slice(UNKNOWN);
    vi
}

pub(super) fn attr_int(name: &str, v: u64) -> Vec<u8> {
    let mut a = msg(&[(1, name.as_bytes())]);
    put_varint_field(&mut a, 3, v);
    put_varint_field(&mut a, 20, 2); // INT
    a
}

fn attr_tensor(name: &str, tensor: &[u8]) -> Vec<u8> {
    let mut a = msg(&[(1, name.as_bytes()), (5, tensor)]);
    put_varint_field(&mut a, 20, 4); // TENSOR
    a
}

fn attr_graph(name: &str, graph: &[u8]) -> Vec<u8> {
    let mut a = msg(&[(1, name.as_bytes()), (6, graph)]);
    put_varint_field(&mut a, 20, 5); // GRAPH
    a
}

pub(super) fn node(
    name: &str,
    domain: &str,
    op: &str,
    inputs: &[&str],
    outputs: &[&str],
    attrs: &[Vec<u8>],
) -> Vec<u8> {
    let mut n = Vec::new();
    for i in inputs {
        put_bytes_field(&mut n, 1, i.as_bytes());
    }
    for o in outputs {
        put_bytes_field(&mut n, 2, o.as_bytes());
    }
    put_bytes_field(&mut n, 3, name.as_bytes());
    put_bytes_field(&mut n, 4, op.as_bytes());
    for a in attrs {
        put_bytes_field(&mut n, 5, a);
    }
    if !domain.is_empty() {
        put_bytes_field(&mut n, 7, domain.as_bytes());
    }
    n.extend_from_slice(UNKNOWN);
    n
}

/// A graph from (field number, payload) pairs, wrapped in a model.
pub(super) fn model(graph_fields: &[(u64, Vec<u8>)]) -> Vec<u8> {
    model_with_opset(graph_fields, None)
}

/// [`model`] importing the default domain at `version` (none given when `None`).
fn model_with_opset(graph_fields: &[(u64, Vec<u8>)], version: Option<u64>) -> Vec<u8> {
    let mut g = Vec::new();
    for (n, payload) in graph_fields {
        put_bytes_field(&mut g, *n, payload);
    }
    g.extend_from_slice(UNKNOWN);
    let mut m = Vec::new();
    put_varint_field(&mut m, 1, 8); // ir_version
    let mut opset = msg(&[(1, b"")]); // opset_import (domain "")
    if let Some(v) = version {
        put_varint_field(&mut opset, 2, v);
    }
    put_bytes_field(&mut m, 8, &opset);
    put_bytes_field(&mut m, 7, &g);
    m.extend_from_slice(UNKNOWN);
    m
}

/// A lookup's `read` over the bytes of `file`, counting the reads.
fn read_from<'a>(
    file: &'a [u8],
    reads: &'a mut usize,
) -> impl FnMut(u64, &mut [u8]) -> Result<(), String> + 'a {
    move |offset, buf| {
        *reads += 1;
        buf.copy_from_slice(&file[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
}

fn options(limit: u64) -> Options {
    Options::new("m", Limits { max_storage_buffer_binding_size: limit, max_buffer_size: u64::MAX })
}

// ------------------------------------------------------------------------------------------------
// Reading a result back.

/// The graph's fields of `number`, as payloads.
pub(super) fn graph_fields(model: &[u8], number: u64) -> Vec<Vec<u8>> {
    let graph = wire::parse(model, "m").unwrap().into_iter().find(|f| f.number == 7).unwrap();
    wire::parse(graph.bytes("g").unwrap(), "g")
        .unwrap()
        .into_iter()
        .filter(|f| f.number == number)
        .map(|f| f.bytes("g").unwrap().to_vec())
        .collect()
}

/// (name, elem_type) of each graph input or output.
pub(super) fn io_types(model: &[u8], number: u64) -> Vec<(String, u64)> {
    graph_fields(model, number)
        .iter()
        .map(|vi| {
            let mut elem = 0;
            for f in wire::parse(vi, "vi").unwrap() {
                if f.number == 2 {
                    for t in wire::parse(f.bytes("t").unwrap(), "t").unwrap() {
                        if t.number == 1 {
                            for e in wire::parse(t.bytes("t").unwrap(), "t").unwrap() {
                                if e.number == 1 {
                                    elem = e.varint("e").unwrap();
                                }
                            }
                        }
                    }
                }
            }
            (value_info_name(vi).unwrap().to_owned(), elem)
        })
        .collect()
}

/// The raw_data of a tensor.
fn raw_data(tensor: &[u8]) -> Vec<u8> {
    wire::parse(tensor, "t")
        .unwrap()
        .into_iter()
        .find(|f| f.number == 9)
        .unwrap()
        .bytes("t")
        .unwrap()
        .to_vec()
}

/// (key, value) external-data entries of a tensor.
pub(super) fn entries(tensor: &[u8]) -> Vec<(String, String)> {
    wire::parse(tensor, "t")
        .unwrap()
        .into_iter()
        .filter(|f| f.number == 13)
        .map(|f| {
            let e = wire::parse(f.bytes("e").unwrap(), "e").unwrap();
            let s = |n| e.iter().find(|x| x.number == n).unwrap().string("e").unwrap().to_owned();
            (s(1), s(2))
        })
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

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

impl super::float32::Node<'_> {
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

fn fixture(variant: &str, file: &str) -> Vec<u8> {
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
fn table_model(extra: &[(u64, Vec<u8>)]) -> Vec<u8> {
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

// ------------------------------------------------------------------------------------------------
// MatMulNBits re-blocked to 32 (`reblock`). What the re-blocked graphs compute, against the originals
// on ONNX Runtime, is checked in tools/export/tests/test_matmul_blocks.py.

/// A model of one `MatMulNBits` (K, N, bits, block) importing the default opset `opset`, its B external,
/// 4-bit zero points inline; `extra` nodes after it.
fn matmul_nbits_model(k: u64, n: u64, bits: u64, block: u64, opset: u64, extra: &[Vec<u8>]) -> Vec<u8> {
    let blocks = k.div_ceil(block);
    let blob = block * bits / 8;
    let attrs = [attr_int("K", k), attr_int("N", n), attr_int("bits", bits), attr_int("block_size", block)];
    let mut fields = vec![
        (GRAPH_INITIALIZER, external_tensor("B", &[n, blocks, blob], UINT8, "w.data", 64, n * blocks * blob)),
        (
            GRAPH_INITIALIZER,
            raw_tensor("scales", &[n, blocks], FLOAT, &floats(&vec![0.5; (n * blocks) as usize])),
        ),
        (
            GRAPH_INITIALIZER,
            raw_tensor("zp", &[n, blocks.div_ceil(2)], UINT8, &vec![0x98; (n * blocks.div_ceil(2)) as usize]),
        ),
        (GRAPH_NODE, node("mm", "com.microsoft", "MatMulNBits", &["a", "B", "scales", "zp"], &["y"], &attrs)),
        (GRAPH_INPUT, value_info("a", FLOAT, &[Dim::Param("m"), Dim::Value(k)])),
        (GRAPH_OUTPUT, value_info("y", FLOAT, &[Dim::Param("m"), Dim::Value(n)])),
    ];
    fields.extend(extra.iter().map(|e| (GRAPH_NODE, e.clone())));
    let mut m = model(&fields);
    let mut opset_import = msg(&[(1, b"")]);
    put_varint_field(&mut opset_import, 2, opset);
    put_bytes_field(&mut m, 8, &opset_import);
    m
}

fn matmul_nbits_node(model: &[u8]) -> (Vec<String>, u64) {
    let nodes = graph_fields(model, GRAPH_NODE);
    let mm = nodes.iter().map(|n| read_node(n, 0).unwrap()).find(|n| n.op_type == "MatMulNBits").unwrap();
    let inputs = mm.inputs.iter().map(|i| (*i).to_owned()).collect();
    (inputs, mm.int_attribute("block_size").unwrap())
}

#[test]
fn matmul_nbits_of_block_128_becomes_block_32_with_b_untouched() {
    let m = matmul_nbits_model(256, 4, 4, 128, 21, &[]);
    let (out, changed) = reblock::to_block_32(&m).unwrap();
    assert_eq!(changed, 1);
    let (inputs, block) = matmul_nbits_node(&out);
    assert_eq!(block, 32);
    // B is read where it was, as [N, K / 32, 16 bytes]; scales and zero points come from added nodes.
    assert_eq!(inputs[..2], ["a", "B"]);
    assert!(
        inputs[2].starts_with("imagine_block32_") && inputs[3].starts_with("imagine_block32_"),
        "{inputs:?}"
    );
    let b = graph_fields(&out, GRAPH_INITIALIZER)
        .iter()
        .map(|t| read_tensor(t).unwrap())
        .find(|t| t.name == "B")
        .unwrap();
    assert_eq!(b.dims, [4, 8, 16]);
    let external = b.external.unwrap();
    assert_eq!((external.file.as_str(), external.offset, external.length), ("w.data", 64, Some(4 * 2 * 64)));
    // The added nodes come first (they read only initializers), and every node keeps its unknown fields.
    let nodes = graph_fields(&out, GRAPH_NODE);
    let ops: Vec<String> = nodes.iter().map(|n| read_node(n, 0).unwrap().op_type.to_owned()).collect();
    assert_eq!(ops.last().map(String::as_str), Some("MatMulNBits"));
    assert!(ops.iter().filter(|o| *o == "Expand").count() == 2, "{ops:?}");
    assert!(nodes.last().unwrap().ends_with(UNKNOWN));
    // Every name an added node reads is an initializer or an earlier node's output.
    let mut known: Vec<String> =
        graph_fields(&out, GRAPH_INITIALIZER).iter().map(|t| read_tensor(t).unwrap().name).collect();
    known.push("a".into());
    for n in &nodes {
        let n = read_node(n, 0).unwrap();
        for i in &n.inputs {
            assert!(known.iter().any(|k| k == i), "{} reads {i}, which nothing made before it", n.name);
        }
        known.extend(n.outputs.iter().map(|o| (*o).to_owned()));
    }
}

#[test]
fn matmul_nbits_that_cannot_be_reblocked_stay() {
    let unchanged = |m: Vec<u8>, why: &str| {
        let (out, changed) = reblock::to_block_32(&m).unwrap();
        assert_eq!((changed, out == m), (0, true), "{why}");
    };
    unchanged(matmul_nbits_model(256, 4, 4, 32, 21, &[]), "block 32 already");
    unchanged(matmul_nbits_model(256, 4, 4, 16, 21, &[]), "a block below 32");
    unchanged(matmul_nbits_model(256, 4, 2, 128, 21, &[]), "2 bits");
    unchanged(matmul_nbits_model(256, 4, 4, 128, 12, &[]), "an opset without Slice and Expand as used");
    let other = node("other", "", "Identity", &["B"], &["b2"], &[]);
    unchanged(matmul_nbits_model(256, 4, 4, 128, 21, &[other]), "another node reads B");
    let attrs = [attr_int("K", 256), attr_int("N", 4), attr_int("bits", 4), attr_int("block_size", 128)];
    let g_idx = node("mm", "com.microsoft", "MatMulNBits", &["a", "B", "scales", "", "g"], &["y"], &attrs);
    unchanged(matmul_nbits_model(256, 4, 4, 128, 21, &[g_idx]), "a node with g_idx (and B read twice)");
}

#[test]
fn a_k_that_is_not_a_multiple_of_the_block_slices_the_padding_off() {
    // K 64 in blocks of 128: one padded block per column; blocks of 32: two, 32 bytes of each column.
    let (out, changed) = reblock::to_block_32(&matmul_nbits_model(64, 4, 4, 128, 21, &[])).unwrap();
    assert_eq!(changed, 1);
    let (inputs, block) = matmul_nbits_node(&out);
    assert_eq!(block, 32);
    assert!(inputs[1].starts_with("imagine_block32_"), "{inputs:?}");
    let b = graph_fields(&out, GRAPH_INITIALIZER)
        .iter()
        .map(|t| read_tensor(t).unwrap())
        .find(|t| t.name == "B")
        .unwrap();
    assert_eq!(b.dims, [4, 1, 64], "the stored B is read as it is");
}

#[test]
fn computed_scales_and_zero_points_repeat_each_block_in_a_data_file_of_their_own() {
    // K 256, N 4, 4 bits, block 128: 2 blocks of 128 per column, 8 of 32. Scales inline (0.5 each),
    // zero points inline 0x98: block 0's nibble 8, block 1's 9.
    let m = matmul_nbits_model(256, 4, 4, 128, 21, &[]);
    assert_eq!(reblock::sources_to_read(&m).unwrap(), [], "inline scales and zero points need no read");
    let mut data = Vec::new();
    let out = reblock::to_block_32_computed(&m, &HashMap::new(), reblock::COMPUTED_DATA, &mut |b| {
        data.extend_from_slice(b)
    })
    .unwrap();
    assert_eq!((out.changed, out.data_length), (1, data.len() as u64));
    let (inputs, block) = matmul_nbits_node(&out.graph);
    assert_eq!(block, 32);
    let tensors: Vec<_> =
        graph_fields(&out.graph, GRAPH_INITIALIZER).iter().map(|t| read_tensor(t).unwrap()).collect();
    let find = |name: &str| tensors.iter().find(|t| t.name == name).unwrap();
    let (scales, zero_points) = (find(&inputs[2]), find(&inputs[3]));
    assert_eq!((scales.data_type, scales.dims.as_slice()), (FLOAT, &[4, 8][..]));
    assert_eq!((zero_points.data_type, zero_points.dims.as_slice()), (UINT8, &[4, 4][..]));
    let at = |t: &Tensor| {
        let e = t.external.as_ref().unwrap();
        assert_eq!(e.file, reblock::COMPUTED_DATA);
        &data[e.offset as usize..(e.offset + e.length.unwrap()) as usize]
    };
    assert_eq!(at(scales), floats(&[0.5; 32]));
    assert_eq!(
        at(zero_points),
        [0x88, 0x88, 0x99, 0x99].repeat(4),
        "each byte: two blocks of 32, one old nibble"
    );
    assert_eq!(find(&inputs[3]).external.as_ref().unwrap().offset % 64, 0, "aligned");
    // No node is added for ONNX Runtime to fold.
    assert_eq!(graph_fields(&out.graph, GRAPH_NODE).len(), 1);
}

/// One int8 `MatMulNBits` of block 128 (K 256, N 4) whose scales are external (4 x 2 blocks of float32,
/// bytes 1024..1056 of `w.data`), without zero points; opset 21.
fn external_scales_model() -> Vec<u8> {
    let attrs = [attr_int("K", 256), attr_int("N", 4), attr_int("bits", 8), attr_int("block_size", 128)];
    let mut m = model(&[
        (GRAPH_INITIALIZER, external_tensor("B", &[4, 2, 128], UINT8, "w.data", 0, 1024)),
        (GRAPH_INITIALIZER, external_tensor("scales", &[4, 2], FLOAT, "w.data", 1024, 32)),
        (GRAPH_NODE, node("mm", "com.microsoft", "MatMulNBits", &["a", "B", "scales"], &["y"], &attrs)),
        (GRAPH_INPUT, value_info("a", FLOAT, &[Dim::Param("m"), Dim::Value(256)])),
        (GRAPH_OUTPUT, value_info("y", FLOAT, &[Dim::Param("m"), Dim::Value(4)])),
    ]);
    let mut opset_import = msg(&[(1, b"")]);
    put_varint_field(&mut opset_import, 2, 21);
    put_bytes_field(&mut m, 8, &opset_import);
    m
}

#[test]
fn computed_scales_are_read_from_external_data_and_fall_back_to_nodes_without_it() {
    let m = external_scales_model();
    let wanted = reblock::sources_to_read(&m).unwrap();
    let range = reblock::DataRange { location: "w.data".into(), offset: 1024, length: 32 };
    assert_eq!(wanted, std::slice::from_ref(&range));
    let values: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let read = HashMap::from([(range.clone(), floats(&values))]);
    let mut data = Vec::new();
    let out =
        reblock::to_block_32_computed(&m, &read, reblock::COMPUTED_DATA, &mut |b| data.extend_from_slice(b))
            .unwrap();
    assert_eq!(out.changed, 1);
    // Column c's blocks 2c and 2c + 1, each 4 times (8 bits: 4 blocks of 32 in one of 128).
    let expected: Vec<f32> = (0..8).flat_map(|i| [i as f32; 4]).collect();
    assert_eq!(data, floats(&expected));
    // Bytes of another length, or none: the scales come from nodes, as `to_block_32` makes them.
    for read in [HashMap::from([(range, floats(&values[..4]))]), HashMap::new()] {
        let mut data = Vec::new();
        let out = reblock::to_block_32_computed(&m, &read, reblock::COMPUTED_DATA, &mut |b| {
            data.extend_from_slice(b)
        })
        .unwrap();
        assert_eq!((out.changed, out.data_length, data.len()), (1, 0, 0));
        assert_eq!(out.graph, reblock::to_block_32(&m).unwrap().0);
    }
}

#[test]
fn the_stored_form_names_its_own_data_file_and_its_size_is_known_before_the_weights() {
    use crate::graph::reblock::{stored_bytes, Block32Graph};
    let m = external_scales_model();
    let (onnx, data_name) = Block32Graph::names("transformer.f32.onnx");
    assert_eq!((onnx.as_str(), data_name.as_str()), ("transformer.f32.b32.onnx", "transformer.f32.b32.data"));
    let range = reblock::DataRange { location: "w.data".into(), offset: 1024, length: 32 };
    let read = HashMap::from([(range, floats(&(0..8).map(|i| i as f32).collect::<Vec<_>>()))]);
    let mut data = Vec::new();
    let out =
        reblock::to_block_32_computed(&m, &read, &data_name, &mut |b| data.extend_from_slice(b)).unwrap();
    let locations: Vec<String> =
        crate::pack::external_data_locations(&out.graph).unwrap().into_iter().map(|f| f.location).collect();
    assert_eq!(locations, ["w.data", "transformer.f32.b32.data"]);
    // Known from the graph alone, to the byte: what the space check charges is what is written.
    assert_eq!(stored_bytes("transformer.f32.onnx", &m).unwrap(), out.graph.len() as u64 + data.len() as u64);
    // A graph with nothing to re-block stores nothing.
    let (unchanged, _) = reblock::to_block_32(&matmul_nbits_model(64, 4, 4, 32, 21, &[])).unwrap();
    assert_eq!(stored_bytes("decoder.onnx", &unchanged).unwrap(), 0);
}

#[test]
fn accuracy_level_is_set_on_every_matmul_nbits_once() {
    let level = |m: &[u8]| {
        let nodes = graph_fields(m, GRAPH_NODE);
        let mm = nodes.iter().map(|n| read_node(n, 0).unwrap()).find(|n| n.op_type == "MatMulNBits").unwrap();
        let count = mm.attributes.iter().filter(|a| a.name == "accuracy_level").count();
        (mm.int_attribute("accuracy_level"), count, mm.int_attribute("block_size"))
    };
    let m = matmul_nbits_model(256, 4, 4, 128, 21, &[node("id", "", "Identity", &["y"], &["z"], &[])]);
    assert_eq!(level(&m), (None, 0, Some(128)));
    let (four, changed) = reblock::with_accuracy_level(&m, 4).unwrap();
    assert_eq!((changed, level(&four)), (1, (Some(4), 1, Some(128))));
    let (again, _) = reblock::with_accuracy_level(&four, 0).unwrap();
    assert_eq!(level(&again), (Some(0), 1, Some(128)), "replaced, not added twice");
    assert_eq!(graph_fields(&again, GRAPH_NODE).len(), 2, "other nodes stay");
    assert_eq!(reblock::with_accuracy_level(&model(&[]), 4).unwrap().1, 0);
}

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
    let (fused, count) = attention::fuse_attention(&attention_model(false)).unwrap();
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
    let again = attention::fuse_attention(&fused).unwrap();
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
        for result in [attention::fuse_attention(&broken), attention::chunk_attention(&broken, 2)] {
            let error = result.unwrap_err().to_string();
            assert!(error.contains("takes at least"), "{error}");
        }
    }
}

#[test]
fn attention_that_cannot_be_proven_stays_byte_for_byte() {
    let masked = attention_model(true);
    assert_eq!(attention::fuse_attention(&masked).unwrap(), (masked.clone(), 0));
    assert_eq!(attention::fuse_attention(&model(&[])).unwrap().1, 0);
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
    let (chunked, count) = attention::chunk_attention(&original, 3).unwrap();
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
    assert_eq!(attention::chunk_attention(&chunked, 3).unwrap().1, 0);
    assert_eq!(attention::fuse_attention(&chunked).unwrap().1, 0);
}

#[test]
fn before_opset_18_the_query_rows_are_sliced_from_its_shape() {
    let original = model_with_opset(&attention_fields(false), Some(17));
    let (chunked, count) = attention::chunk_attention(&original, 3).unwrap();
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
    let (chunked, count) = attention::chunk_attention(&model_with_opset(&fields, Some(18)), 2).unwrap();
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
    let (chunked, count) = attention::chunk_attention(&model_with_opset(&fields, Some(18)), 2).unwrap();
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
        assert_eq!(attention::chunk_attention(&original, chunks).unwrap(), (original.clone(), 0));
    }
    let masked = model_with_opset(&attention_fields(true), Some(18));
    assert_eq!(attention::chunk_attention(&masked, 4).unwrap(), (masked.clone(), 0));
    // Without a default opset of at least 13 there is nothing to cut with.
    for old in [attention_model(false), model_with_opset(&attention_fields(false), Some(12))] {
        assert_eq!(attention::chunk_attention(&old, 4).unwrap(), (old.clone(), 0));
    }
    assert_eq!(attention::chunk_attention(&model(&[]), 4).unwrap().1, 0);
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
