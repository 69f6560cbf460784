//! Embedding tables looked up outside the graph, on every adapter and backend.
//!
//! A text encoder's first node gathers a prompt's rows of its embedding table (Qwen3's: 151936 x 2560),
//! the largest tensor of the stage. ONNX Runtime Web's JSPI build reads each initializer whole into one
//! buffer before uploading it, so that table alone set the renderer's peak while the session was
//! created, and it then held GPU memory for the few rows a prompt reads (BENCHMARKS.md, "Embedding
//! tables looked up outside the graph"). [`take_out`] takes such tables out of the graph protobuf, in
//! memory, before the session is created, and the stage worker feeds the rows it reads from the table's
//! file ([`TableLookup::gather`]). The float32 conversion has its own lookup for tables too large for
//! one GPU buffer ([`crate::graph::EmbeddingLookup`], converted to float32 as it is read); this one
//! feeds the stored bytes as they are. Tests: `graph/tests/tables.rs` (on the tests' ONNX writer).

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::graph::float32::{lookup_gathers, lookup_input, read_graph, GraphParts, GRAPH_PROTO};
use crate::graph::proto::{model_graph, value_info_name, with_graph, External, Node, Tensor};
use crate::graph::{LookupError, Range, RewriteError};
use crate::onnx::fields::*;
use crate::onnx::wire::{self, Field};

/// The element types a looked-up table may have: those ONNX Runtime Web takes as input tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ElemType {
    /// `FLOAT`.
    Float32,
    /// `UINT8`.
    Uint8,
    /// `INT8`.
    Int8,
    /// `INT32`.
    Int32,
    /// `INT64`.
    Int64,
    /// `FLOAT16`.
    Float16,
}

impl ElemType {
    /// From an ONNX `TensorProto.DataType`; `None` for the others.
    pub fn from_onnx(data_type: u64) -> Option<ElemType> {
        Some(match data_type {
            1 => ElemType::Float32,
            2 => ElemType::Uint8,
            3 => ElemType::Int8,
            6 => ElemType::Int32,
            7 => ElemType::Int64,
            10 => ElemType::Float16,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            ElemType::Uint8 | ElemType::Int8 => 1,
            ElemType::Float16 => 2,
            ElemType::Float32 | ElemType::Int32 => 4,
            ElemType::Int64 => 8,
        }
    }

    /// ONNX Runtime Web's name for it (`ort.Tensor`'s type).
    pub fn ort_name(self) -> &'static str {
        match self {
            ElemType::Float32 => "float32",
            ElemType::Uint8 => "uint8",
            ElemType::Int8 => "int8",
            ElemType::Int32 => "int32",
            ElemType::Int64 => "int64",
            ElemType::Float16 => "float16",
        }
    }
}

/// A table that left the graph: the stage worker gathers its rows and feeds them as `input`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TableLookup {
    /// The new graph input (the removed Gather's output name).
    pub input: String,
    /// The graph input holding the indices (it stays an input).
    pub ids_input: String,
    /// The removed initializer's name.
    pub table: String,
    /// Its element type, which the new input has too.
    pub elem_type: ElemType,
    /// The whole table in its file, row-major.
    pub source: Range,
    /// Rows in the table (its first dim).
    pub rows: u64,
    /// Its other dims: each row's shape.
    pub row_dims: Vec<u64>,
}

/// Takes the tables that can leave `model` (a ModelProto, weights outside) out of it: the new model and
/// what to look up. The model comes back as it was, with no lookups, when no table can leave.
///
/// A table can leave when it is external and read only by `Gather(table, ids, axis=0)`s whose `ids` are
/// a graph input; it goes with its Gathers, and each Gather's output becomes a graph input of the
/// table's element type, shaped like the ids plus the table's trailing dims. Fed the gathered rows, the
/// graph computes exactly what it did. Nothing on disk changes, so packs installed before this work as
/// they are.
pub fn take_out(model: &[u8]) -> Result<(Vec<u8>, Vec<TableLookup>), RewriteError> {
    let fields = wire::parse(model, "ModelProto")?;
    let graph = model_graph(&fields)?;
    let graph_fields = wire::parse(graph, GRAPH_PROTO)?;
    let GraphParts { nodes, initializers, inputs, outputs, .. } = read_graph(&graph_fields, GRAPH_PROTO)?;
    let tensors: Vec<Tensor> = initializers.into_iter().map(|(_, t)| t).collect();
    let found = find_lookups(&tensors, &nodes, &inputs, &outputs)?;
    if found.lookups.is_empty() {
        return Ok((model.to_vec(), found.lookups));
    }
    let out = without_tables(&graph_fields, &tensors, &found, graph.len())?;
    Ok((with_graph(&fields, &out), found.lookups))
}

/// The tables that can leave a graph, and what their leaving changes.
struct Found {
    lookups: Vec<TableLookup>,
    /// The new graph inputs' ValueInfoProtos.
    new_inputs: Vec<Vec<u8>>,
    /// The removed Gathers' node indices.
    removed_nodes: HashSet<usize>,
}

/// Every external table that only `Gather(table, ids, axis=0)`s with graph-input `ids` read: each
/// Gather's output becomes a graph input of the table's element type. Tables of other element types,
/// segmented ones, those whose length is not their elements', and tables anything else reads, stay.
fn find_lookups(
    tensors: &[Tensor],
    nodes: &[Node],
    inputs: &HashMap<&str, &[u8]>,
    outputs: &HashSet<&str>,
) -> Result<Found, RewriteError> {
    let initializer_names: HashSet<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    let mut found = Found { lookups: Vec::new(), new_inputs: Vec::new(), removed_nodes: HashSet::new() };
    for t in tensors {
        let (Some(elem_type), Some(External { file, offset, length: Some(length) })) =
            (ElemType::from_onnx(t.data_type), &t.external)
        else {
            continue;
        };
        if t.segmented || t.elements().ok().and_then(|n| n.checked_mul(elem_type.bytes())) != Some(*length) {
            continue;
        }
        let Ok(gathers) = lookup_gathers(t, nodes, inputs, &initializer_names, outputs) else { continue };
        for g in gathers {
            let ids = g.inputs[1];
            found.new_inputs.push(lookup_input(g.outputs[0], t.data_type, inputs[ids], &t.dims[1..])?);
            found.lookups.push(TableLookup {
                input: g.outputs[0].to_owned(),
                ids_input: ids.to_owned(),
                table: t.name.clone(),
                elem_type,
                source: Range { file: file.clone(), offset: *offset, length: *length },
                rows: t.dims[0],
                row_dims: t.dims[1..].to_vec(),
            });
            found.removed_nodes.insert(g.index);
        }
    }
    Ok(found)
}

/// The GraphProto of `graph_fields` without the found tables, their inputs and Gathers, and any value
/// info of a new input; the new inputs come last.
fn without_tables(
    graph_fields: &[Field],
    tensors: &[Tensor],
    found: &Found,
    graph_len: usize,
) -> Result<Vec<u8>, RewriteError> {
    let removed_tables: HashSet<&str> = found.lookups.iter().map(|l| l.table.as_str()).collect();
    let new_input_names: HashSet<&str> = found.lookups.iter().map(|l| l.input.as_str()).collect();
    let mut out = Vec::with_capacity(graph_len);
    let (mut node_index, mut tensor_index) = (0, 0);
    for f in graph_fields {
        let keep = match f.number {
            GRAPH_NODE => {
                node_index += 1;
                !found.removed_nodes.contains(&(node_index - 1))
            }
            GRAPH_INITIALIZER => {
                tensor_index += 1;
                !removed_tables.contains(tensors[tensor_index - 1].name.as_str())
            }
            GRAPH_INPUT => !removed_tables.contains(value_info_name(f.bytes(GRAPH_PROTO)?)?),
            GRAPH_VALUE_INFO => !new_input_names.contains(value_info_name(f.bytes(GRAPH_PROTO)?)?),
            _ => true,
        };
        if keep {
            out.extend_from_slice(f.raw);
        }
    }
    for input in &found.new_inputs {
        wire::put_bytes_field(&mut out, GRAPH_INPUT, input);
    }
    Ok(out)
}

impl TableLookup {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> u64 {
        self.row_dims.iter().product::<u64>() * self.elem_type.bytes()
    }

    /// Where row `id` lies in `source.file`, with Gather's rule for negative ids.
    pub fn row_range(&self, id: i64) -> Result<Range, LookupError> {
        row_range(&self.table, &self.source, self.rows, self.row_bytes(), id)
    }

    /// The input's shape for ids of shape `ids_dims`.
    pub fn input_dims(&self, ids_dims: &[i64]) -> Vec<i64> {
        ids_dims.iter().copied().chain(self.row_dims.iter().map(|&d| d as i64)).collect()
    }

    /// The input's bytes for `ids` (row after row). `read` fills a buffer from `source.file` at an
    /// offset; each distinct id is read once.
    pub fn gather(
        &self,
        ids: &[i64],
        read: impl FnMut(u64, &mut [u8]) -> Result<(), String>,
    ) -> Result<Vec<u8>, LookupError> {
        gather_rows(ids, self.row_bytes() as usize, |id| self.row_range(id), &self.table, read)
    }
}

/// Where row `id` of a table of `rows` rows of `row_bytes` each lies, with Gather's rule for negative ids.
pub(crate) fn row_range(
    table: &str,
    source: &Range,
    rows: u64,
    row_bytes: u64,
    id: i64,
) -> Result<Range, LookupError> {
    let rows_i = i64::try_from(rows).unwrap_or(i64::MAX);
    let row = if id < 0 { id + rows_i } else { id };
    if !(0..rows_i).contains(&row) {
        return Err(LookupError::Id { id, table: table.to_owned(), rows });
    }
    Ok(Range { file: source.file.clone(), offset: source.offset + row as u64 * row_bytes, length: row_bytes })
}

/// The rows of `ids`, one after the other, each distinct row read once.
pub(crate) fn gather_rows(
    ids: &[i64],
    row_bytes: usize,
    range: impl Fn(i64) -> Result<Range, LookupError>,
    table: &str,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<(), String>,
) -> Result<Vec<u8>, LookupError> {
    let mut out = vec![0u8; ids.len() * row_bytes];
    let mut seen: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for (i, &id) in ids.iter().enumerate() {
        let offset = range(id)?.offset;
        if let Some(&first) = seen.get(&offset) {
            out.copy_within(first * row_bytes..(first + 1) * row_bytes, i * row_bytes);
            continue;
        }
        read(offset, &mut out[i * row_bytes..(i + 1) * row_bytes])
            .map_err(|error| LookupError::Read { table: table.to_owned(), error })?;
        seen.insert(offset, i);
    }
    Ok(out)
}
