//! The re-blocked forms stored with the installed pack: their record, file names and checksums, and
//! what they take on disk.

use serde::{Deserialize, Serialize};

use super::{sources_to_read, to_block_32_computed};
use crate::graph::RewriteError;

/// The re-blocked form of one graph, made when the pack is installed and stored with it, so that a
/// WebGPU session reads it as it reads the pack's own files: nothing is computed while it loads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReblockedGraph {
    /// The graph it was made from, as a WebGPU stage chooses it: the pack's (`transformer.onnx`) or
    /// its float32 conversion (`transformer.f32.onnx`).
    pub graph: String,
    /// The re-blocked graph, [`ReblockedGraph::names`]'s first.
    pub onnx: String,
    /// The computed scales and zero points it reads, [`ReblockedGraph::names`]'s second.
    pub data: String,
    /// Bytes of the two files.
    pub bytes: u64,
    /// Bytes of the graph file (the data file has the rest of [`ReblockedGraph::bytes`]); 0 in a record
    /// of a version before it, whose forms are then made again ([`ReblockedGraph::check`]).
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

/// How a stored form differs from its record ([`ReblockedGraph::check`]): it is not loaded, and is made
/// again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReblockedDamage {
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

impl ReblockedGraph {
    /// The stored files of `graph`'s re-blocked form: `<stem>.b32.onnx` and `<stem>.b32.data`.
    pub fn names(graph: &str) -> (String, String) {
        let stem = graph.strip_suffix(".onnx").unwrap_or(graph);
        (format!("{stem}.b32.onnx"), format!("{stem}.b32.data"))
    }

    /// The form of `graph` stored as `onnx` (these bytes) and `data` (`data_bytes` bytes, whose
    /// [`PieceDigest`] is `data_digest`).
    pub fn new(graph: &str, onnx: &[u8], data_bytes: u64, data_digest: &[u8; 32]) -> ReblockedGraph {
        use sha2::{Digest, Sha256};
        let (onnx_name, data) = ReblockedGraph::names(graph);
        let onnx_sha256: [u8; 32] = Sha256::digest(onnx).into();
        ReblockedGraph {
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
    ) -> Result<(), ReblockedDamage> {
        if self.onnx_bytes == 0 || self.onnx_sha256.is_empty() || self.data_digest.is_empty() {
            return Err(ReblockedDamage::Unchecked(self.onnx.clone()));
        }
        let data_bytes = self.bytes.saturating_sub(self.onnx_bytes);
        for (file, found, expected) in
            [(&self.onnx, onnx_len, self.onnx_bytes), (&self.data, data_len, data_bytes)]
        {
            if found != expected {
                return Err(ReblockedDamage::Length { file: file.clone(), found, expected });
            }
        }
        if let Some((onnx, data)) = digests {
            for (file, digest, expected) in
                [(&self.onnx, onnx, &self.onnx_sha256), (&self.data, data, &self.data_digest)]
            {
                if crate::hub::hex(digest) != *expected {
                    return Err(ReblockedDamage::Checksum { file: file.clone() });
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
pub struct ReblockedRecord {
    /// The stored forms.
    pub graphs: Vec<ReblockedGraph>,
    /// The graphs that have no node to re-block (the decoder), loaded as they are.
    #[serde(default)]
    pub unchanged: Vec<String>,
}

/// How a WebGPU stage gets `graph` re-blocked to 32, by [`ReblockedRecord::form`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReblockedForm<'r> {
    /// Stored with the pack.
    Stored(&'r ReblockedGraph),
    /// It has no node to re-block.
    Unchanged,
    /// Not made at install: re-blocked in memory while it loads.
    AtLoad,
}

impl ReblockedRecord {
    /// The stored form made from `graph` (a file name of the pack or its conversion), if any.
    pub fn graph(&self, graph: &str) -> Option<&ReblockedGraph> {
        self.graphs.iter().find(|g| g.graph == graph)
    }

    /// How `graph` gets re-blocked when a pack with this record (or `None`: without one) is loaded.
    pub fn form<'r>(record: Option<&'r ReblockedRecord>, graph: &str) -> ReblockedForm<'r> {
        match record {
            Some(record) => match record.graph(graph) {
                Some(stored) => ReblockedForm::Stored(stored),
                None if record.unchanged.iter().any(|g| g == graph) => ReblockedForm::Unchanged,
                None => ReblockedForm::AtLoad,
            },
            None => ReblockedForm::AtLoad,
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
    let (_, data) = ReblockedGraph::names(graph);
    let reblocked = to_block_32_computed(model, &read, &data, &mut |_| {})?;
    Ok(if reblocked.changed == 0 { 0 } else { reblocked.graph.len() as u64 + reblocked.data_length })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_the_record_does_not_name_is_re_blocked_while_it_loads() {
        let stored = ReblockedGraph::new("transformer_q8.f32.onnx", b"graph", 4, &[0; 32]);
        let record =
            ReblockedRecord { graphs: vec![stored.clone()], unchanged: vec!["vae_decoder.onnx".into()] };
        assert_eq!(
            ReblockedRecord::form(Some(&record), "transformer_q8.f32.onnx"),
            ReblockedForm::Stored(&stored)
        );
        assert_eq!(ReblockedRecord::form(Some(&record), "vae_decoder.onnx"), ReblockedForm::Unchanged);
        // Installed without shader-f16, loaded with it: the float16 graph was never re-blocked.
        assert_eq!(ReblockedRecord::form(Some(&record), "transformer_q8.onnx"), ReblockedForm::AtLoad);
        // Installed by a version before the record.
        assert_eq!(ReblockedRecord::form(None, "transformer_q8.f32.onnx"), ReblockedForm::AtLoad);
        // `unchanged` may be absent: read as empty.
        let old: ReblockedRecord = serde_json::from_str(r#"{"graphs":[]}"#).unwrap();
        assert_eq!(ReblockedRecord::form(Some(&old), "vae_decoder.onnx"), ReblockedForm::AtLoad);
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
        let form = ReblockedGraph::new("transformer_q8.onnx", b"graph", data.len() as u64, &digest);
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
            Err(ReblockedDamage::Length { file: "transformer_q8.b32.data".into(), found: 7, expected: 15 })
        );
        // Same length, other bytes: found by the checksum.
        let mut pieces = PieceDigest::new();
        pieces.update(b"repeated scalez");
        let other = pieces.finalize();
        assert_eq!(
            form.check(5, 15, Some((&onnx, &other))),
            Err(ReblockedDamage::Checksum { file: "transformer_q8.b32.data".into() })
        );
        // A record of a version that stored no checksums: made again.
        let old: ReblockedGraph = serde_json::from_str(
            r#"{"graph":"transformer_q8.onnx","onnx":"transformer_q8.b32.onnx","data":"transformer_q8.b32.data","bytes":20}"#,
        )
        .unwrap();
        assert_eq!(old.check(5, 15, None), Err(ReblockedDamage::Unchecked("transformer_q8.b32.onnx".into())));
    }
}
