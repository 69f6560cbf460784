//! Tests of the graph editor, by edit; here the small ONNX writer and reader they (and the split's
//! tests) build their models with.

use std::collections::HashMap;
use std::path::PathBuf;

use half::f16;

use super::proto::{read_node, read_tensor, shape_dims, value_info_name, Tensor};
use super::*;
use crate::onnx::fields::{
    FLOAT, FLOAT16, GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_NODE, GRAPH_OUTPUT, GRAPH_VALUE_INFO, INT64, UINT8,
};
use crate::onnx::wire::{self, put_bytes_field, put_varint_field, Value};

mod attention;
mod clip;
mod float32;
mod projections;
mod reblock;
mod rows;
mod tables;
mod weight_parts;

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
pub(super) fn model_with_opset(graph_fields: &[(u64, Vec<u8>)], version: Option<u64>) -> Vec<u8> {
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

/// Each node as (op, inputs, outputs).
pub(super) fn nodes(model: &[u8]) -> Vec<(String, Vec<String>, Vec<String>)> {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    graph_fields(model, GRAPH_NODE)
        .iter()
        .map(|n| {
            read_node(n, 0).map(|n| (n.op_type.to_owned(), strings(&n.inputs), strings(&n.outputs))).unwrap()
        })
        .collect()
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
