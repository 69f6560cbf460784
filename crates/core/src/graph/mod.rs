//! The ONNX graph editor: the edits that let the pack's graphs run well in ONNX Runtime Web.
//!
//! * `float32`: float16 activations rewritten to float32 for adapters without `shader-f16` ([`rewrite`]).
//! * [`pack_conversion`]: that rewrite planned for a whole pack, and the record kept with it.
//! * [`reblock`]: `MatMulNBits` re-blocked to 32, the only block ORT Web's wide WebGPU kernel takes.
//! * [`attention`]: attention fused into `MultiHeadAttention`, or computed in chunks of query rows.
//! * [`clip`]: `Clip` computed as `Max` then `Min`, which every browser's shader compiler takes.
//! * [`projections`]: a wide `MatMulNBits` only cut apart computed as one per part; [`rows`]: token-wise
//!   chains computed in chunks of tokens; [`weight_parts`]: a `Gemm` or `MatMulNBits` with heavy weights computed in parts of
//!   its weights' rows.
//! * [`split`]: a graph (the VAE decoder) cut into a chain of smaller graphs that fit GPU memory.
//! * `shapes`: each tensor's type and shape at a latent size, which [`split`] sizes pieces by.
//! * [`tables`]: embedding tables taken out of the graph and looked up by the stage worker.
//! * `ops`: the operators [`rewrite`] accepts ([`supported_operators`]) and how each one's dtype follows.
//! * `proto`: nodes, tensors and value infos read, and messages copied with edits; `nodes`: a graph's
//!   nodes as the node edits read them and write them back.
//!
//! The protobuf is read and written by hand over `crate::onnx::wire`: a message is a list of fields that
//! keep their raw bytes, so unknown fields (newer ONNX versions, ORT's annotations) survive byte for byte,
//! which a message crate such as `prost` would not do without ONNX's schema declared by hand.

pub mod attention;
pub mod clip;
mod float32;
mod nodes;
mod ops;
pub mod pack_conversion;
pub mod projections;
mod proto;
pub mod reblock;
pub mod rows;
mod shapes;
pub mod split;
pub mod tables;
pub mod weight_parts;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use float32::{remaining_float16, rewrite};
pub use ops::supported_operators;

/// The adapter limits a tensor must fit (`GPUAdapter.limits`). ONNX Runtime puts each initializer in
/// one GPU buffer, and converting to float32 doubles a tensor: Qwen3's embedding table (151936 x 2560)
/// no longer fits SwiftShader's 1 GiB. A tensor that would not fit is taken out of the graph
/// ([`LookupPolicy`]) or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// `maxStorageBufferBindingSize`.
    pub max_storage_buffer_binding_size: u64,
    /// `maxBufferSize`.
    pub max_buffer_size: u64,
}

impl Limits {
    /// No limit (for tests and native tools).
    pub const UNLIMITED: Limits =
        Limits { max_storage_buffer_binding_size: u64::MAX, max_buffer_size: u64::MAX };

    /// The largest tensor, in bytes, that fits one GPU buffer. ONNX Runtime rounds buffer sizes up to
    /// a multiple of 16, so that rounding must fit too.
    pub fn fits(&self, bytes: u64) -> bool {
        let rounded = bytes.div_ceil(16).saturating_mul(16);
        rounded <= self.max_storage_buffer_binding_size.min(self.max_buffer_size)
    }

    /// The smaller of the two limits.
    pub fn max_tensor_bytes(&self) -> u64 {
        self.max_storage_buffer_binding_size.min(self.max_buffer_size)
    }
}

/// When a float16 table read only by Gathers leaves the graph, to be looked up by the web side.
///
/// A table can leave when all its consumers are `Gather(table, ids, axis=0)` whose `ids` are a graph
/// input: the Gathers and the table are removed, each Gather's output becomes a float32 graph input of
/// the same name, and the web side feeds the rows it reads from the float16 table in its original file
/// ([`EmbeddingLookup`]). That costs no disk and frees the table's GPU memory. Keeping the table float16
/// and casting after the Gather would not do: the Gather itself would then need `shader-f16`. Designed,
/// not implemented: a too-large table cut into row blocks, each Gathered and selected with `Where` (the
/// graph's inputs kept, at twice the table's GPU memory and with int32 index arithmetic on the GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupPolicy {
    /// Only when its float32 form would not fit one GPU buffer (the default).
    WhenTooLarge,
    /// Whenever it can: saves the table's GPU memory on every adapter.
    Always,
    /// Never: a table that does not fit is an error.
    Never,
}

/// What [`rewrite`] needs besides the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The graph's file stem (`text_encoder_q4`); new files are `<stem>.f32-00000.data`, ...
    pub stem: String,
    /// The adapter's limits.
    pub limits: Limits,
    /// The largest new external-data file. Below 2 GiB: one `ArrayBuffer` cannot reach 2 GiB in
    /// Chrome, and ONNX Runtime Web reads each file into one.
    pub max_shard_bytes: u64,
    /// Which tables leave the graph.
    pub lookup: LookupPolicy,
}

impl Options {
    /// Shards of at most 2,000,000,000 bytes, tables looked up outside only when too large.
    pub fn new(stem: &str, limits: Limits) -> Self {
        Options {
            stem: stem.to_owned(),
            limits,
            max_shard_bytes: 2_000_000_000,
            lookup: LookupPolicy::WhenTooLarge,
        }
    }

    /// The name of the `index`-th new external-data file.
    pub fn shard_name(&self, index: usize) -> String {
        format!("{}.f32-{index:05}.data", self.stem)
    }
}

/// The rewritten graph and what the web side must do to complete it.
#[derive(Debug, Clone)]
pub struct Rewrite {
    /// The float32 graph (a ModelProto).
    pub graph: Vec<u8>,
    /// The external data to convert, and the rest.
    pub plan: Plan,
}

/// A byte range in a file of the pack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Range {
    /// The file's name in the pack (normalized, [`crate::pack::validate_relative_path`]).
    pub file: String,
    /// Where the range starts.
    pub offset: u64,
    /// How many bytes.
    pub length: u64,
}

/// One float16 external tensor to convert.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TensorCopy {
    /// The initializer's name.
    pub tensor: String,
    /// Its float16 bytes in an original file.
    pub source: Range,
    /// Its float32 bytes in a new file (twice as long).
    pub target: Range,
}

/// A new external-data file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewFile {
    /// Its name (also the location the new graph records).
    pub name: String,
    /// Its final size: the last tensor's end (gaps between tensors are zeros).
    pub size: u64,
}

/// A float16 table that left the graph: the web side gathers its rows and feeds them as `input`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EmbeddingLookup {
    /// The new float32 graph input (the removed Gather's output name), shaped like `ids_input` plus
    /// the table's trailing dims.
    pub input: String,
    /// The graph input holding the indices (it stays an input).
    pub ids_input: String,
    /// The removed initializer's name.
    pub table: String,
    /// The whole float16 table in its original file, row-major.
    pub source: Range,
    /// Rows in the table (its first dim).
    pub rows: u64,
    /// Elements per row (the product of its other dims).
    pub row_elements: u64,
}

/// A failed lookup.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LookupError {
    /// An id outside the table (Gather accepts `-rows..rows`).
    #[error("id {id} is outside the table {table:?} of {rows} rows")]
    Id {
        /// The id.
        id: i64,
        /// The table's name.
        table: String,
        /// Its rows.
        rows: u64,
    },
    /// The reader failed.
    #[error("reading the table {table:?}: {error}")]
    Read {
        /// The table's name.
        table: String,
        /// What the reader said.
        error: String,
    },
}

impl EmbeddingLookup {
    /// Bytes of one float16 row.
    pub fn row_bytes(&self) -> u64 {
        self.row_elements * 2
    }

    /// Where row `id` lies in `source.file`, with Gather's rule for negative ids.
    pub fn row_range(&self, id: i64) -> Result<Range, LookupError> {
        crate::graph::tables::row_range(&self.table, &self.source, self.rows, self.row_bytes(), id)
    }

    /// The graph input's values for `ids` (row-major, `ids.len() * row_elements` floats). `read`
    /// fills a buffer from `source.file` at an offset; each distinct id is read once.
    pub fn gather(
        &self,
        ids: &[i64],
        read: impl FnMut(u64, &mut [u8]) -> Result<(), String>,
    ) -> Result<Vec<f32>, LookupError> {
        let row_bytes = self.row_bytes() as usize;
        let raw =
            crate::graph::tables::gather_rows(ids, row_bytes, |id| self.row_range(id), &self.table, read)?;
        Ok(raw
            .chunks_exact(2)
            .map(|h| half::f16::from_bits(u16::from_le_bytes([h[0], h[1]])).to_f32())
            .collect())
    }
}

/// What the web side does after [`rewrite`], and what it costs.
///
/// For a graph that declares float16 ([`crate::pack::declares_float16`]) on an adapter without
/// `shader-f16`, the web side stores [`Rewrite::graph`] beside the pack (`<stem>.f32.onnx`); creates each
/// of [`Plan::new_files`] and converts [`Plan::pieces`] into them with [`f16_to_f32`], checkpointing each
/// file's length (targets rise within a file, so a resumed conversion skips the pieces below it), then
/// sets each file to its final size; loads the new graph with `externalData` = [`Plan::graph_files`],
/// feeding and reading float32 for [`Plan::float32_io`]; and feeds each of [`Plan::lookups`] the rows of
/// the ids it is about to feed ([`EmbeddingLookup::gather`]). The plan needs only the graph, so it is
/// made before the weights are downloaded (the quota check includes [`Plan::extra_disk_bytes`]) and
/// recomputed, not stored, on resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The float16 external tensors to convert, ordered by target file and offset.
    pub copies: Vec<TensorCopy>,
    /// The new files, in order.
    pub new_files: Vec<NewFile>,
    /// Every external file the new graph references (new and original), in first-use order: what
    /// to pass to ONNX Runtime as `externalData`, and the new graph's manifest.
    pub graph_files: Vec<String>,
    /// Original files the new graph no longer references (a lookup may still read one).
    pub unused_files: Vec<String>,
    /// Tables that left the graph, to be gathered by the web side.
    pub lookups: Vec<EmbeddingLookup>,
    /// Graph inputs and outputs that were float16 and are now float32.
    pub float32_io: Vec<String>,
    /// Float16 initializers converted inside the graph protobuf.
    pub inline_converted: usize,
    /// Bytes of the new files (padding included): what converting adds on disk while the original
    /// files are kept.
    pub extra_disk_bytes: u64,
    /// Float16 bytes of converted tensors that lie in original files the new graph still references
    /// (shards that mix them with uint8 weights): dead weight on disk while those files are kept.
    pub stale_bytes: u64,
    /// Estimated extra GPU memory for weights: each converted tensor's float16 size (it doubles),
    /// less the float16 size of the tables that left the graph. Activations that were float16 also
    /// double; their size depends on the inputs' shapes and is not included.
    pub extra_gpu_bytes: i64,
}

impl Plan {
    /// The copies cut into pieces of at most `max_source_bytes` float16 bytes (rounded down to an
    /// even number, at least 2), in the order of [`Plan::copies`]. A piece's target is twice as long
    /// as its source. To resume a file, skip the pieces that end at or below its checkpointed length.
    pub fn pieces(&self, max_source_bytes: u64) -> Vec<Piece> {
        let step = (max_source_bytes & !1).max(2);
        let mut pieces = Vec::new();
        for (copy, c) in self.copies.iter().enumerate() {
            let mut done = 0;
            while done < c.source.length {
                let len = step.min(c.source.length - done);
                pieces.push(Piece {
                    copy,
                    source: Range {
                        file: c.source.file.clone(),
                        offset: c.source.offset + done,
                        length: len,
                    },
                    target: Range {
                        file: c.target.file.clone(),
                        offset: c.target.offset + 2 * done,
                        length: 2 * len,
                    },
                });
                done += len;
            }
        }
        pieces
    }

    /// `{"shards":[{"path":...},...]}` for the new graph's files, as the pack's manifests are.
    pub fn manifest_json(&self) -> String {
        let shards: Vec<_> = self.graph_files.iter().map(|p| serde_json::json!({ "path": p })).collect();
        serde_json::json!({ "shards": shards }).to_string()
    }
}

/// A piece of a [`TensorCopy`]: read `source`, convert with [`f16_to_f32`], write at `target`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Piece {
    /// The index of its copy in [`Plan::copies`].
    pub copy: usize,
    /// The float16 bytes.
    pub source: Range,
    /// Where their float32 form goes.
    pub target: Range,
}

/// Converts little-endian float16 bytes to little-endian float32 bytes, exactly (every float16 value,
/// subnormals, infinities and NaNs included, has one float32 value). `dst` must be twice as long as
/// `src`, and `src` of even length.
pub fn f16_to_f32(src: &[u8], dst: &mut [u8]) -> Result<(), RewriteError> {
    if !src.len().is_multiple_of(2) || dst.len() != src.len() * 2 {
        return Err(RewriteError::Length { float16: src.len(), float32: dst.len() });
    }
    for (h, f) in src.chunks_exact(2).zip(dst.chunks_exact_mut(4)) {
        let value = half::f16::from_bits(u16::from_le_bytes([h[0], h[1]])).to_f32();
        f.copy_from_slice(&value.to_le_bytes());
    }
    Ok(())
}

/// [`f16_to_f32`] into a new buffer.
pub fn f16_to_f32_vec(src: &[u8]) -> Result<Vec<u8>, RewriteError> {
    let mut dst = vec![0; src.len() * 2];
    f16_to_f32(src, &mut dst)?;
    Ok(dst)
}

impl From<crate::onnx::wire::WireError> for RewriteError {
    fn from(e: crate::onnx::wire::WireError) -> Self {
        RewriteError::Protobuf { what: e.what, detail: e.detail }
    }
}

/// Why a graph cannot be rewritten.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum RewriteError {
    /// The bytes are not a well-formed ONNX protobuf.
    #[error("the ONNX model is not a valid protobuf: {what}: {detail}")]
    Protobuf {
        /// The message being read.
        what: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// A node the rewrite cannot prove correct in float32.
    #[error("cannot rewrite node {index} {name:?} ({op}) to float32: {reason}")]
    Node {
        /// Its index in the graph's node list.
        index: usize,
        /// Its name (may be empty).
        name: String,
        /// `domain::op_type` (`ai.onnx` for the default domain).
        op: String,
        /// Why.
        reason: String,
    },
    /// A tensor the rewrite cannot convert or place.
    #[error("cannot rewrite tensor {name:?} to float32: {reason}")]
    Tensor {
        /// The tensor's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// Something in the model outside the graph's nodes and tensors.
    #[error("cannot rewrite the model to float32: {0}")]
    Model(String),
    /// Buffers of the wrong sizes for [`f16_to_f32`].
    #[error("cannot convert {float16} float16 bytes into {float32} float32 bytes")]
    Length {
        /// Source bytes.
        float16: usize,
        /// Target bytes.
        float32: usize,
    },
    /// A bug: float16 left after the rewrite.
    #[error("the rewrite left float16 in the graph (a bug): {0}")]
    Leftover(String),
}

#[cfg(test)]
mod tests;
