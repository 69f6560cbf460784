//! Resumable SHA-256: hashing a file as it is written, with a state that survives restarts.

use serde::{Deserialize, Serialize};

use super::HubError;

const SHA256_IV: [u32; 8] =
    [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

/// The state of a [`ResumableSha256`] at a 64-byte block boundary: enough to continue hashing a
/// file from `offset` after the worker, the browser or the machine restarted. Persisted in the
/// [`DownloadRecord`](super::DownloadRecord).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HashCheckpoint {
    /// Bytes hashed; a multiple of 64.
    pub offset: u64,
    /// The SHA-256 chaining state after them.
    pub state: [u32; 8],
}

/// SHA-256 whose state can be saved and restored ([`HashCheckpoint`]), so a multi-GB file is
/// hashed once, as it is written, across any number of interruptions. `sha2::Sha256` cannot
/// export its state, so this runs the raw compression function (`sha2::block_api::compress256`,
/// hardware-accelerated where available) with standard padding.
#[derive(Debug, Clone)]
pub struct ResumableSha256 {
    state: [u32; 8],
    /// Bytes fed so far.
    offset: u64,
    /// The tail that does not fill a block yet (`offset % 64` bytes).
    buf: [u8; 64],
    buf_len: usize,
}

impl Default for ResumableSha256 {
    fn default() -> Self {
        Self::new()
    }
}

impl ResumableSha256 {
    /// At offset 0.
    pub fn new() -> Self {
        ResumableSha256 { state: SHA256_IV, offset: 0, buf: [0; 64], buf_len: 0 }
    }

    /// Continues from a checkpoint. Refuses an offset that is not a multiple of 64 (a damaged
    /// record): start the file over then.
    pub fn from_checkpoint(checkpoint: &HashCheckpoint) -> Result<Self, HubError> {
        if !checkpoint.offset.is_multiple_of(64) {
            return Err(HubError::Checkpoint {
                offset: checkpoint.offset,
                reason: "the offset is not a multiple of 64",
            });
        }
        Ok(ResumableSha256 { state: checkpoint.state, offset: checkpoint.offset, buf: [0; 64], buf_len: 0 })
    }

    /// Hashes `data`. Whole blocks go straight to the compression function; only a tail of less
    /// than 64 bytes is copied.
    pub fn update(&mut self, mut data: &[u8]) {
        self.offset += data.len() as u64;
        if self.buf_len > 0 {
            let take = (64 - self.buf_len).min(data.len());
            self.buf[self.buf_len..self.buf_len + take].copy_from_slice(&data[..take]);
            self.buf_len += take;
            data = &data[take..];
            if self.buf_len < 64 {
                return;
            }
            sha2::block_api::compress256(&mut self.state, std::slice::from_ref(&self.buf));
            self.buf_len = 0;
        }
        let (blocks, tail) = data.as_chunks::<64>();
        if !blocks.is_empty() {
            sha2::block_api::compress256(&mut self.state, blocks);
        }
        self.buf[..tail.len()].copy_from_slice(tail);
        self.buf_len = tail.len();
    }

    /// Bytes fed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The state, when no partial block is buffered (`offset() % 64 == 0`); otherwise `None`, and
    /// [`aligned_checkpoint`](Self::aligned_checkpoint) gives the last block boundary.
    pub fn checkpoint(&self) -> Option<HashCheckpoint> {
        (self.buf_len == 0).then_some(HashCheckpoint { offset: self.offset, state: self.state })
    }

    /// The state at the last block boundary, `offset() - offset() % 64`: always available, because
    /// the buffered tail is not part of the chaining state yet. The writer persists this and, on
    /// resume, truncates the file to its offset (losing at most 63 bytes) and downloads from there,
    /// so it need not cut its writes at multiples of 64.
    pub fn aligned_checkpoint(&self) -> HashCheckpoint {
        HashCheckpoint { offset: self.offset - self.buf_len as u64, state: self.state }
    }

    /// The digest of everything fed.
    pub fn finalize(mut self) -> [u8; 32] {
        let bit_len = self.offset.wrapping_mul(8);
        let mut tail = [0u8; 128];
        tail[..self.buf_len].copy_from_slice(&self.buf[..self.buf_len]);
        tail[self.buf_len] = 0x80;
        let len = if self.buf_len < 56 { 64 } else { 128 };
        tail[len - 8..len].copy_from_slice(&bit_len.to_be_bytes());
        let (blocks, _) = tail[..len].as_chunks::<64>();
        sha2::block_api::compress256(&mut self.state, blocks);
        let mut out = [0u8; 32];
        for (chunk, word) in out.chunks_exact_mut(4).zip(self.state) {
            chunk.copy_from_slice(&word.to_be_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;
    use crate::hub::hex;

    /// xorshift64*, enough for test data and split points.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    fn reference(data: &[u8]) -> [u8; 32] {
        Sha256::digest(data).into()
    }

    #[test]
    fn sha256_matches_reference_with_random_splits() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        assert_eq!(ResumableSha256::new().finalize(), reference(b""));
        assert_eq!(
            hex(&ResumableSha256::new().finalize()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        // Every length around the padding boundaries, fed in one piece.
        for len in 0..300 {
            let data = rng.bytes(len);
            let mut h = ResumableSha256::new();
            h.update(&data);
            assert_eq!(h.offset(), len as u64);
            assert_eq!(h.finalize(), reference(&data), "len {len}");
        }
        for _ in 0..200 {
            let len = rng.below(5000) as usize;
            let data = rng.bytes(len);
            let mut h = ResumableSha256::new();
            let mut at = 0;
            while at < len {
                let n = (rng.below(200) as usize).min(len - at);
                h.update(&data[at..at + n]);
                at += n;
            }
            assert_eq!(h.finalize(), reference(&data), "len {len}");
        }
    }

    #[test]
    fn sha256_checkpoint_restore_at_every_aligned_point() {
        let mut rng = Rng(42);
        let data = rng.bytes(64 * 20 + 37);
        let expected = reference(&data);
        let mut h = ResumableSha256::new();
        let mut at = 0;
        while at < data.len() {
            let n = (1 + rng.below(100) as usize).min(data.len() - at);
            h.update(&data[at..at + n]);
            at += n;
            // Restore from the aligned checkpoint (what the writer persists), through JSON.
            let cp = h.aligned_checkpoint();
            assert_eq!(cp.offset % 64, 0);
            assert_eq!(h.checkpoint().is_some(), h.offset().is_multiple_of(64));
            let json = serde_json::to_string(&cp).unwrap();
            assert!(json.starts_with(r#"{"offset":"#));
            let cp: HashCheckpoint = serde_json::from_str(&json).unwrap();
            let mut resumed = ResumableSha256::from_checkpoint(&cp).unwrap();
            resumed.update(&data[cp.offset as usize..]);
            assert_eq!(resumed.finalize(), expected, "resumed at {}", cp.offset);
        }
        for k in 0..=data.len() / 64 {
            let mut h = ResumableSha256::new();
            h.update(&data[..k * 64]);
            let cp = h.checkpoint().unwrap();
            assert_eq!(cp.offset, (k * 64) as u64);
            let mut resumed = ResumableSha256::from_checkpoint(&cp).unwrap();
            resumed.update(&data[k * 64..]);
            assert_eq!(resumed.finalize(), expected, "block {k}");
        }
        let bad = HashCheckpoint { offset: 65, state: [0; 8] };
        assert!(matches!(ResumableSha256::from_checkpoint(&bad), Err(HubError::Checkpoint { .. })));
        let mut h = ResumableSha256::new();
        h.update(&[1; 10]);
        assert_eq!(h.checkpoint(), None);
    }
}
