//! Embedding tables looked up outside the graph, on every adapter and backend.
//!
//! # Why
//!
//! A text encoder's first node gathers 512 rows of its embedding table: Qwen3's is 151936 x 2560,
//! 778 MB in float16 (the published pack) or as float16 bytes in uint8 (the float32-activation
//! export), the largest tensor of the stage. ONNX Runtime Web's JSPI build reads each initializer
//! whole into one buffer before uploading it, so that table alone set the renderer's peak while the
//! text encoder's session was created (1.07x the stage's weights, measured at full size), and it then
//! held 778 MB of GPU memory for 2.6 MB of rows a prompt reads.
//!
//! # What
//!
//! [`take_out`] removes every external table that only `Gather(table, ids, axis=0)`s with graph-input
//! `ids` read, and the Gathers; each Gather's output becomes a graph input of the table's element
//! type, shaped like the ids plus the table's trailing dims. The stage worker reads the prompt's rows
//! from the table's file ([`TableLookup::gather`], each distinct row once) and feeds them, so the
//! graph computes exactly what it did. Only the graph protobuf is edited, in memory, before the
//! session is created: nothing on disk changes, and packs installed before this work as they are.
//! The float32 conversion (`graph::rewrite`) has its own lookup for tables too large for one GPU buffer
//! ([`crate::graph::EmbeddingLookup`], converted to float32 as it is read); this one feeds the
//! stored bytes as they are. Tests: `graph/tests/tables.rs` (on the tests' ONNX writer).

use serde::Serialize;

use crate::graph::{LookupError, Range, RewriteError};

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
pub fn take_out(model: &[u8]) -> Result<(Vec<u8>, Vec<TableLookup>), RewriteError> {
    crate::graph::float32::tables_out(model)
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
