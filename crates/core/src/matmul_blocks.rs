//! `MatMulNBits` re-blocked to 32 for ONNX Runtime Web's WebGPU kernels.
//!
//! # Why
//!
//! ONNX Runtime Web 1.30 has a tiled WebGPU kernel for `MatMulNBits` on inputs of 4 rows or more (a
//! prompt's 512 tokens, an image's latents) only for block size 32. Any other block size falls back to
//! a kernel made for one row at a time, which dispatches one workgroup of 128 threads for every row
//! and 8 output columns. The published pack and the exporter quantize with block 128. Measured with
//! one int4 `MatMulNBits` (K 128, N 2560, 512 rows, float32): 97 s at block 128 and 0.57 s at block 32
//! on SwiftShader in Chromium 156, which left the tiny text encoder of the browser tests running for
//! over ten minutes; on an NVIDIA H200 the full-size transformer's step takes 2.96 s at block 128 and
//! 0.60 s at block 32.
//!
//! # What
//!
//! [`to_block_32`] rewrites every `MatMulNBits` whose block size is a power of two above 32 to block
//! 32, exactly: each block of 32 takes the scale and zero point of the block it was part of, so the
//! node computes the same function. The pack's own files never change.
//!
//! * B keeps its bytes. A block of 32 is the old block cut in pieces, so when K is a multiple of the
//!   old block only B's dims change (`[N, K / 32, 4 * bits]`) and its external data is read as
//!   before. Otherwise (only the tiny test graphs, whose K can be 64) a Reshape and a Slice drop the
//!   padding at the end of each column.
//! * Scales and zero points are repeated, each value once per block of 32 of its old block (4-bit zero
//!   points unpacked first). [`to_block_32_computed`] computes them here from the stored values
//!   ([`sources_to_read`] says which ranges of the external data to read) into tensors of an
//!   external-data file of their own: about 6 % of the transformer's int8 weights and 12 % of the
//!   text encoder's int4 ones for the published pack (float16 scales), 4 times those of block 128. [`to_block_32`] adds nodes in
//!   front of the graph instead (Reshape, Expand, Reshape, Slice) that ONNX Runtime's constant folding
//!   computes while it creates the session; it does the same for any input the computed form cannot
//!   read (typed fields, segments). Folding is slow: for 27 layers of the text encoder's shapes, ONNX
//!   Runtime Web's single-threaded wasm took about 4 s longer to create the session with those nodes
//!   than without (2 shared cores, BENCHMARKS.md), seconds of the stage that sets the pace of a cold
//!   image.
//!
//! # When
//!
//! Once, when a pack is installed for WebGPU: the download worker writes each re-blocked graph and its
//! computed data beside the pack ([`Block32Graph::names`]), reads both back against a second
//! computation, and records them with the pack ([`Block32Record`]); [`stored_bytes`] tells the space
//! check what they will take before anything is downloaded. A stage then loads the stored form as it
//! loads any graph. Computing them while a stage loads cost the transformer 2-4 s of CPU on the
//! critical path of every cold image (BENCHMARKS.md). A graph the record does not name
//! ([`Block32Record::form`]: a pack installed by an older version, or the float16 graph where the
//! float32 conversion was stored) is still re-blocked that way, in memory, under [`COMPUTED_DATA`], and
//! its form stored with the installed pack after that job.
//!
//! Nodes it cannot prove it handles stay as they are: 2-bit weights, `g_idx`, a B that is not a uint8
//! initializer of the documented shape or that another node reads too, scales or zero points that are
//! not initializers of one value per block. The wasm backend is left alone: its kernels have no such cliff.
//! Tests: `f32_rewrite/tests.rs` and `tools/export/tests/test_matmul_blocks.py` (the re-blocked tiny
//! graphs against the originals on ONNX Runtime).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::f32_rewrite::RewriteError;

pub use crate::f32_rewrite::reblock::{DataRange, Reblocked, COMPUTED_DATA, TARGET_BLOCK};

/// Rewrites every `MatMulNBits` of `model` (a ModelProto, weights outside or inline) whose block size
/// is a power of two above 32 to block 32; the new model and how many nodes changed. The model comes
/// back as it was, and 0, when none qualifies.
pub fn to_block_32(model: &[u8]) -> Result<(Vec<u8>, usize), RewriteError> {
    crate::f32_rewrite::reblock::to_block_32(model)
}

/// The external-data ranges [`to_block_32_computed`] needs: the stored scales and zero points of every
/// node it re-blocks that are outside the graph (locations as the graph names them).
pub fn sources_to_read(model: &[u8]) -> Result<Vec<DataRange>, RewriteError> {
    crate::f32_rewrite::reblock::sources_to_read(model)
}

/// As [`to_block_32`], with the repeated scales and zero points computed here from `read` (the bytes of
/// each range [`sources_to_read`] listed) into the external-data file `location` the new graph reads
/// ([`COMPUTED_DATA`] when it is handed to ONNX Runtime from memory, [`Block32Graph::data`] when it is
/// stored), whose bytes go to `write` in order, a tensor at a time. Inputs it cannot compute are
/// repeated by nodes.
pub fn to_block_32_computed(
    model: &[u8],
    read: &HashMap<DataRange, Vec<u8>>,
    location: &str,
    write: &mut dyn FnMut(&[u8]),
) -> Result<Reblocked, RewriteError> {
    crate::f32_rewrite::reblock::to_block_32_computed(model, read, location, write)
}

/// The re-blocked form of one graph, made when the pack is installed and stored with it, so that a
/// WebGPU session reads it as it reads the pack's own files: nothing is computed while it loads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Block32Graph {
    /// The graph it was made from, as a WebGPU stage chooses it: the pack's (`transformer.onnx`) or
    /// its float32 conversion (`transformer.f32.onnx`).
    pub graph: String,
    /// The re-blocked graph, [`Block32Graph::names`]'s first.
    pub onnx: String,
    /// The computed scales and zero points it reads, [`Block32Graph::names`]'s second.
    pub data: String,
    /// Bytes of the two files.
    pub bytes: u64,
    /// Bytes of the graph file (the data file has the rest of [`Block32Graph::bytes`]); 0 in a record
    /// of a version before it, whose forms are then made again ([`Block32Graph::check`]).
    #[serde(default)]
    pub onnx_bytes: u64,
    /// SHA-256 of the graph file, lowercase hex.
    #[serde(default)]
    pub onnx_sha256: String,
    /// The data file's [`PieceDigest`], lowercase hex.
    #[serde(default)]
    pub data_digest: String,
}

/// Bytes of each piece of a stored form's data file that [`PieceDigest`] hashes on its own.
pub const DIGEST_PIECE_BYTES: u64 = 8 << 20;

/// The checksum of a stored form's data file: the SHA-256 of the SHA-256 of each of its
/// [`DIGEST_PIECE_BYTES`] pieces in order (the last may be shorter; an empty file has none). Written
/// so, a stage checks a file of hundreds of MB a piece at a time with the browser's own SHA-256
/// (`crypto.subtle`, at about the speed of the disk), where SHA-256 in wasm would take seconds, and
/// holds one piece in memory.
#[derive(Debug, Clone, Default)]
pub struct PieceDigest {
    outer: sha2::Sha256,
    piece: sha2::Sha256,
    in_piece: u64,
}

impl PieceDigest {
    /// Nothing hashed yet.
    pub fn new() -> PieceDigest {
        PieceDigest::default()
    }

    /// Hashes the next bytes of the file, in pieces of any length.
    pub fn update(&mut self, mut data: &[u8]) {
        use sha2::Digest;
        while !data.is_empty() {
            let take = (DIGEST_PIECE_BYTES - self.in_piece).min(data.len() as u64) as usize;
            self.piece.update(&data[..take]);
            self.in_piece += take as u64;
            data = &data[take..];
            if self.in_piece == DIGEST_PIECE_BYTES {
                let digest = self.piece.finalize_reset();
                self.outer.update(digest);
                self.in_piece = 0;
            }
        }
    }

    /// Takes the SHA-256 of the next whole piece, computed elsewhere (by the browser); only between
    /// whole pieces.
    pub fn piece(&mut self, digest: &[u8; 32]) {
        use sha2::Digest;
        debug_assert_eq!(self.in_piece, 0, "a piece's digest in the middle of a piece");
        self.outer.update(digest);
    }

    /// The checksum.
    pub fn finalize(mut self) -> [u8; 32] {
        use sha2::Digest;
        if self.in_piece > 0 {
            let digest = self.piece.finalize();
            self.outer.update(digest);
        }
        self.outer.finalize().into()
    }
}

/// How a stored form differs from its record ([`Block32Graph::check`]): it is not loaded, and is made
/// again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Block32Damage {
    /// A file's length is not the recorded one (cut short, say).
    #[error("{file} is {found} bytes, {expected} were stored")]
    Length {
        /// The file.
        file: String,
        /// Its length on disk.
        found: u64,
        /// The length recorded.
        expected: u64,
    },
    /// A file's bytes are not the recorded ones (same length, other bytes).
    #[error("{file} does not have the checksum it was stored with")]
    Checksum {
        /// The file.
        file: String,
    },
    /// The record has no lengths and checksums to check the files against (an older version's).
    #[error("{0} was stored without a checksum")]
    Unchecked(String),
}

impl Block32Graph {
    /// The stored files of `graph`'s re-blocked form: `<stem>.b32.onnx` and `<stem>.b32.data`.
    pub fn names(graph: &str) -> (String, String) {
        let stem = graph.strip_suffix(".onnx").unwrap_or(graph);
        (format!("{stem}.b32.onnx"), format!("{stem}.b32.data"))
    }

    /// The form of `graph` stored as `onnx` (these bytes) and `data` (`data_bytes` bytes, whose
    /// [`PieceDigest`] is `data_digest`).
    pub fn new(graph: &str, onnx: &[u8], data_bytes: u64, data_digest: &[u8; 32]) -> Block32Graph {
        use sha2::{Digest, Sha256};
        let (onnx_name, data) = Block32Graph::names(graph);
        let onnx_sha256: [u8; 32] = Sha256::digest(onnx).into();
        Block32Graph {
            graph: graph.to_owned(),
            onnx: onnx_name,
            data,
            bytes: onnx.len() as u64 + data_bytes,
            onnx_bytes: onnx.len() as u64,
            onnx_sha256: crate::hub::hex(&onnx_sha256),
            data_digest: crate::hub::hex(data_digest),
        }
    }

    /// Checks the stored files against the record: their lengths (`onnx_len`, `data_len`), which is
    /// cheap and done at every load, and, when given, their checksums (`digests`: the graph's SHA-256
    /// and the data's [`PieceDigest`]), which reads them whole.
    pub fn check(
        &self,
        onnx_len: u64,
        data_len: u64,
        digests: Option<(&[u8; 32], &[u8; 32])>,
    ) -> Result<(), Block32Damage> {
        if self.onnx_bytes == 0 || self.onnx_sha256.is_empty() || self.data_digest.is_empty() {
            return Err(Block32Damage::Unchecked(self.onnx.clone()));
        }
        let data_bytes = self.bytes.saturating_sub(self.onnx_bytes);
        for (file, found, expected) in
            [(&self.onnx, onnx_len, self.onnx_bytes), (&self.data, data_len, data_bytes)]
        {
            if found != expected {
                return Err(Block32Damage::Length { file: file.clone(), found, expected });
            }
        }
        if let Some((onnx, data)) = digests {
            for (file, digest, expected) in
                [(&self.onnx, onnx, &self.onnx_sha256), (&self.data, data, &self.data_digest)]
            {
                if crate::hub::hex(digest) != *expected {
                    return Err(Block32Damage::Checksum { file: file.clone() });
                }
            }
        }
        Ok(())
    }
}

/// The re-blocked forms stored with an installed pack (in its record), for the graphs a WebGPU stage
/// loaded on the adapter it was installed for. A graph in neither list (another adapter's choice: the
/// pack's float16 graph where the float32 conversion was stored, say), or a pack without this record
/// (installed for the wasm backend, or by an older version), is re-blocked while it loads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Block32Record {
    /// The stored forms.
    pub graphs: Vec<Block32Graph>,
    /// The graphs that have no node to re-block (the decoder), loaded as they are.
    #[serde(default)]
    pub unchanged: Vec<String>,
}

/// How a WebGPU stage gets `graph` re-blocked to 32, by [`Block32Record::form`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block32Form<'r> {
    /// Stored with the pack.
    Stored(&'r Block32Graph),
    /// It has no node to re-block.
    Unchanged,
    /// Not made at install: re-blocked in memory while it loads.
    AtLoad,
}

impl Block32Record {
    /// The stored form made from `graph` (a file name of the pack or its conversion), if any.
    pub fn graph(&self, graph: &str) -> Option<&Block32Graph> {
        self.graphs.iter().find(|g| g.graph == graph)
    }

    /// How `graph` gets re-blocked when a pack with this record (or `None`: without one) is loaded.
    pub fn form<'r>(record: Option<&'r Block32Record>, graph: &str) -> Block32Form<'r> {
        match record {
            Some(record) => match record.graph(graph) {
                Some(stored) => Block32Form::Stored(stored),
                None if record.unchanged.iter().any(|g| g == graph) => Block32Form::Unchanged,
                None => Block32Form::AtLoad,
            },
            None => Block32Form::AtLoad,
        }
    }

    /// Bytes of all stored forms.
    pub fn bytes(&self) -> u64 {
        self.graphs.iter().map(|g| g.bytes).sum()
    }
}

/// Bytes the stored re-blocked form of `model` (the graph file `graph`) takes, its graph and computed
/// data; 0 when no node is re-blocked. Computed as [`to_block_32_computed`] does, on zeros, so it is
/// known before the weights are downloaded.
pub fn stored_bytes(graph: &str, model: &[u8]) -> Result<u64, RewriteError> {
    let read = sources_to_read(model)?.into_iter().map(|r| (r.clone(), vec![0; r.length as usize])).collect();
    let (_, data) = Block32Graph::names(graph);
    let reblocked = to_block_32_computed(model, &read, &data, &mut |_| {})?;
    Ok(if reblocked.changed == 0 { 0 } else { reblocked.graph.len() as u64 + reblocked.data_length })
}

/// `model` with `accuracy_level` `level` on every `MatMulNBits` (ONNX Runtime's compute type for it: 4
/// quantizes the activations to int8, faster on WebGPU and less exact), and how many nodes changed.
pub fn with_accuracy_level(model: &[u8], level: u8) -> Result<(Vec<u8>, usize), RewriteError> {
    crate::f32_rewrite::reblock::with_accuracy_level(model, level.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_the_record_does_not_name_is_re_blocked_while_it_loads() {
        let stored = Block32Graph::new("transformer_q8.f32.onnx", b"graph", 4, &[0; 32]);
        let record =
            Block32Record { graphs: vec![stored.clone()], unchanged: vec!["vae_decoder.onnx".into()] };
        assert_eq!(
            Block32Record::form(Some(&record), "transformer_q8.f32.onnx"),
            Block32Form::Stored(&stored)
        );
        assert_eq!(Block32Record::form(Some(&record), "vae_decoder.onnx"), Block32Form::Unchanged);
        // Installed without shader-f16, loaded with it: the float16 graph was never re-blocked.
        assert_eq!(Block32Record::form(Some(&record), "transformer_q8.onnx"), Block32Form::AtLoad);
        // Installed by a version before the record.
        assert_eq!(Block32Record::form(None, "transformer_q8.f32.onnx"), Block32Form::AtLoad);
        // `unchanged` may be absent: read as empty.
        let old: Block32Record = serde_json::from_str(r#"{"graphs":[]}"#).unwrap();
        assert_eq!(Block32Record::form(Some(&old), "vae_decoder.onnx"), Block32Form::AtLoad);
    }

    #[test]
    fn the_piece_digest_is_the_sha256_of_each_pieces_sha256() {
        use sha2::{Digest, Sha256};
        let piece = DIGEST_PIECE_BYTES as usize;
        let file: Vec<u8> = (0..2 * piece + 1000).map(|i| (i * 7 % 251) as u8).collect();
        let mut outer = Sha256::new();
        for part in file.chunks(piece) {
            outer.update(Sha256::digest(part));
        }
        let expected: [u8; 32] = outer.finalize().into();
        // Fed in chunks that do not line up with the pieces, as the install writes it.
        let mut written = PieceDigest::new();
        for chunk in file.chunks(999_983) {
            written.update(chunk);
        }
        assert_eq!(written.finalize(), expected);
        // A piece at a time, each hashed elsewhere, as a stage checks it.
        let mut checked = PieceDigest::new();
        for part in file.chunks(piece) {
            checked.piece(&Sha256::digest(part).into());
        }
        assert_eq!(checked.finalize(), expected);
        assert_eq!(PieceDigest::new().finalize(), <[u8; 32]>::from(Sha256::digest(b"")));
    }

    #[test]
    fn a_stored_form_is_checked_by_its_lengths_and_its_checksums() {
        use sha2::{Digest, Sha256};
        let data = b"repeated scales";
        let mut pieces = PieceDigest::new();
        pieces.update(data);
        let digest = pieces.finalize();
        let form = Block32Graph::new("transformer_q8.onnx", b"graph", data.len() as u64, &digest);
        assert_eq!(
            (form.onnx.as_str(), form.data.as_str()),
            ("transformer_q8.b32.onnx", "transformer_q8.b32.data")
        );
        assert_eq!((form.bytes, form.onnx_bytes), (20, 5));
        let onnx: [u8; 32] = Sha256::digest(b"graph").into();
        assert_eq!(form.check(5, 15, None), Ok(()));
        assert_eq!(form.check(5, 15, Some((&onnx, &digest))), Ok(()));
        // Cut short: found by its length alone.
        assert_eq!(
            form.check(5, 7, None),
            Err(Block32Damage::Length { file: "transformer_q8.b32.data".into(), found: 7, expected: 15 })
        );
        // Same length, other bytes: found by the checksum.
        let mut pieces = PieceDigest::new();
        pieces.update(b"repeated scalez");
        let other = pieces.finalize();
        assert_eq!(
            form.check(5, 15, Some((&onnx, &other))),
            Err(Block32Damage::Checksum { file: "transformer_q8.b32.data".into() })
        );
        // A record of a version that stored no checksums: made again.
        let old: Block32Graph = serde_json::from_str(
            r#"{"graph":"transformer_q8.onnx","onnx":"transformer_q8.b32.onnx","data":"transformer_q8.b32.data","bytes":20}"#,
        )
        .unwrap();
        assert_eq!(old.check(5, 15, None), Err(Block32Damage::Unchecked("transformer_q8.b32.onnx".into())));
    }
}
