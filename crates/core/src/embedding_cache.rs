//! The cache of prompt embeddings: a repeat of a prompt (or a new seed for it) skips the text encoder.
//!
//! ```text
//! cache/embeddings/index.json   the pack commit the entries belong to, and the entries, by key
//! cache/embeddings/<key>.bin    one entry: the text encoder's `prompt_embeds` ([`encode_entry`])
//! ```
//!
//! The key ([`key`]) is the SHA-256 of the installed pack's commit, the backend the embeddings were
//! computed on and the prompt's token ids and length: the same tokens on the same graphs give the
//! same embeddings, so a cached entry reproduces a cold run bit for bit. The index names its commit;
//! an index of another commit (a new pack, or none) is dropped whole with its files.
//!
//! The cache is bounded by [`MAX_BYTES`]: the least recently used entries are dropped first. An entry
//! carries its length and the SHA-256 of its values, so a short or damaged file is detected
//! ([`check_entry_header`], then the values' hash) and the prompt is encoded again instead of giving a
//! wrong picture.
//!
//! The index is written before an entry's file and after the files of dropped entries are removed, so
//! an interruption anywhere leaves no file outside the index (at most an entry whose file is missing or
//! short, which reads as a miss).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::params::Backend;
use crate::prompt::EncodedPrompt;

/// The cache's directory in OPFS, and its subdirectory of embeddings.
pub const CACHE_DIR: &str = "cache";
/// The embeddings' directory inside [`CACHE_DIR`].
pub const EMBEDDINGS_DIR: &str = "embeddings";
/// The index file in the embeddings' directory.
pub const INDEX_FILE: &str = "index.json";
/// Most bytes of entries kept: 16 prompts of the published pack (`[512, 7680]` float32, 15 MiB each).
pub const MAX_BYTES: u64 = 256 << 20;

/// First bytes of an entry file (format version 1).
const MAGIC: &[u8; 8] = b"IMEMB\x001\n";
/// Magic, value count (u64 LE), SHA-256 of the values.
pub const HEADER_BYTES: usize = 8 + 8 + 32;

/// Which form of the pack's text encoder computed the embeddings. The float32 conversion (WebGPU
/// without `shader-f16`) and the float16 graph it was made from differ in their last bits, so an entry
/// of one is not the other's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderForm {
    /// The graph as the pack has it.
    Pack,
    /// The install's float32 conversion of it.
    Float32Conversion,
}

/// The cache key of `prompt`'s embeddings computed by the pack at `commit` on `backend`, in `form`:
/// lowercase hex SHA-256.
pub fn key(commit: &str, backend: Backend, form: EncoderForm, prompt: &EncodedPrompt) -> String {
    let mut hash = Sha256::new();
    hash.update(b"imagine prompt embeddings 1\0");
    // The pack's own form hashes as before the conversion existed, so those entries stay valid.
    let form = match form {
        EncoderForm::Pack => None,
        EncoderForm::Float32Conversion => Some("float32 conversion"),
    };
    for text in [commit, backend.name()].into_iter().chain(form) {
        hash.update((text.len() as u64).to_le_bytes());
        hash.update(text.as_bytes());
    }
    // The mask is 1 for the first `token_count` ids: the count fixes it.
    hash.update((prompt.token_count as u64).to_le_bytes());
    hash.update((prompt.input_ids.len() as u64).to_le_bytes());
    for id in &prompt.input_ids {
        hash.update(id.to_le_bytes());
    }
    hex(&hash.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The file name of the entry `key`.
pub fn entry_file(key: &str) -> String {
    format!("{key}.bin")
}

/// One cached prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    /// [`key`].
    pub key: String,
    /// Size of the entry's file.
    pub bytes: u64,
    /// Prompt tokens used, as the text encoder reports them (the result carries them).
    pub token_count: u32,
    /// Whether the prompt was truncated.
    pub truncated: bool,
    /// When it was last written or read, in [`Index::clock`] ticks.
    pub last_used: u64,
}

/// `index.json`: the entries of one pack commit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Index {
    /// The commit of the pack the entries were computed with.
    pub commit: String,
    /// A counter, bumped at each use: the order of use survives restarts without a wall clock.
    pub clock: u64,
    /// The entries, in no particular order.
    pub entries: Vec<Entry>,
}

/// What to do with the stored index for the installed pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    /// It is the installed pack's.
    Current(Index),
    /// It is missing, unreadable or of another pack: every file goes, and the cache starts empty.
    Reset(Index),
}

impl Index {
    /// The index to use for the pack at `commit`, from the stored `index.json` bytes (if any).
    pub fn load(stored: Option<&[u8]>, commit: &str) -> Loaded {
        let empty = Index { commit: commit.to_owned(), ..Index::default() };
        match stored.map(serde_json::from_slice::<Index>) {
            Some(Ok(index)) if index.commit == commit => Loaded::Current(index),
            None => Loaded::Current(empty),
            Some(_) => Loaded::Reset(empty),
        }
    }

    /// The index as stored.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("the index always serializes")
    }

    /// The entry `key`, marked as just used.
    pub fn touch(&mut self, key: &str) -> Option<Entry> {
        self.clock += 1;
        let clock = self.clock;
        let entry = self.entries.iter_mut().find(|e| e.key == key)?;
        entry.last_used = clock;
        Some(entry.clone())
    }

    /// Forgets `key` (its file is missing or damaged).
    pub fn remove(&mut self, key: &str) {
        self.entries.retain(|e| e.key != key);
    }

    /// Bytes of all entries.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// Adds (or replaces) an entry as just used and drops the least recently used ones until the
    /// entries fit in `max_bytes`. Returns the keys dropped, whose files the caller removes; an entry
    /// larger than `max_bytes` on its own is not added (and is among those returned).
    pub fn insert(&mut self, mut entry: Entry, max_bytes: u64) -> Vec<String> {
        self.remove(&entry.key);
        self.clock += 1;
        entry.last_used = self.clock;
        if entry.bytes > max_bytes {
            return vec![entry.key];
        }
        self.entries.push(entry);
        let mut dropped = Vec::new();
        while self.bytes() > max_bytes {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i)
                .expect("over the cap means not empty");
            dropped.push(self.entries.remove(oldest).key);
        }
        dropped
    }
}

/// The header of an entry file of `values` values whose bytes (f32 LE) hash to `digest`: magic, value
/// count (u64 LE), the SHA-256 of the values. The values follow it.
pub fn entry_header(values: usize, digest: &[u8; 32]) -> [u8; HEADER_BYTES] {
    let mut header = [0; HEADER_BYTES];
    header[..8].copy_from_slice(MAGIC);
    header[8..16].copy_from_slice(&(values as u64).to_le_bytes());
    header[16..].copy_from_slice(digest);
    header
}

/// An entry file's bytes for `values`: [`entry_header`], then the values (f32 LE). The browser writes
/// the same bytes with the values' hash computed by the browser.
pub fn encode_entry(values: &[f32]) -> Vec<u8> {
    let payload: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut bytes = entry_header(values.len(), &Sha256::digest(&payload).into()).to_vec();
    bytes.extend_from_slice(&payload);
    bytes
}

/// Why an entry file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EntryError {
    #[error("the cached embeddings are not a cache entry")]
    /// The magic is wrong or the header is cut.
    NotAnEntry,
    /// Another number of values than the stage needs, or a file of another length than its header says.
    #[error("the cached embeddings have {found} bytes where {expected} were expected")]
    Length {
        /// Bytes needed.
        expected: usize,
        /// Bytes there.
        found: usize,
    },
    /// The values do not hash to what the header says.
    #[error("the cached embeddings are damaged (their SHA-256 differs)")]
    Damaged,
}

/// Checks the start of an entry file of `file_bytes` bytes (`start`: its first bytes, at least the
/// header's when the file has them) against an entry of exactly `values` values: the SHA-256 the
/// values (the bytes after [`HEADER_BYTES`]) must have.
pub fn check_entry_header(start: &[u8], file_bytes: usize, values: usize) -> Result<[u8; 32], EntryError> {
    let expected = HEADER_BYTES + values * 4;
    if start.len() < HEADER_BYTES || &start[..8] != MAGIC {
        return Err(EntryError::NotAnEntry);
    }
    let count = u64::from_le_bytes(start[8..16].try_into().expect("8 bytes"));
    if count != values as u64 || file_bytes != expected {
        return Err(EntryError::Length { expected, found: file_bytes });
    }
    Ok(start[16..HEADER_BYTES].try_into().expect("32 bytes"))
}

/// The values of an entry file holding exactly `values` values, checked against its length and hash
/// ([`check_entry_header`]; the browser hashes the values itself).
pub fn decode_entry(bytes: &[u8], values: usize) -> Result<Vec<f32>, EntryError> {
    let digest = check_entry_header(bytes, bytes.len(), values)?;
    let payload = &bytes[HEADER_BYTES..];
    if Sha256::digest(payload).as_slice() != digest {
        return Err(EntryError::Damaged);
    }
    Ok(payload.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
}

/// The size of the entry file of `values` values.
pub fn entry_bytes(values: usize) -> u64 {
    (HEADER_BYTES + values * 4) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::tests::qwen3;

    fn entry(key: &str, bytes: u64) -> Entry {
        Entry { key: key.into(), bytes, token_count: 14, truncated: false, last_used: 0 }
    }

    #[test]
    fn the_key_follows_commit_backend_form_and_tokens_only() {
        let enc = qwen3();
        let cat = enc.encode("a cat").unwrap();
        let k = key("c1", Backend::WebGpu, EncoderForm::Pack, &cat);
        assert_eq!(k.len(), 64);
        assert!(k.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(k, key("c1", Backend::WebGpu, EncoderForm::Pack, &enc.encode("a cat").unwrap()));
        assert_ne!(k, key("c2", Backend::WebGpu, EncoderForm::Pack, &cat));
        assert_ne!(k, key("c1", Backend::Wasm, EncoderForm::Pack, &cat));
        assert_ne!(k, key("c1", Backend::WebGpu, EncoderForm::Pack, &enc.encode("a cat ").unwrap()));
        assert_ne!(k, key("c1", Backend::WebGpu, EncoderForm::Pack, &enc.encode("a dog").unwrap()));
        // The same ids with another length (a pad id as the last real token) are another prompt.
        let mut shorter = cat.clone();
        shorter.token_count -= 1;
        assert_ne!(k, key("c1", Backend::WebGpu, EncoderForm::Pack, &shorter));
        // Commit and backend are length-prefixed: moving a character between them changes the key.
        assert_ne!(
            key("ab", Backend::WebGpu, EncoderForm::Pack, &cat),
            key("a", Backend::WebGpu, EncoderForm::Pack, &cat)
        );
        // The float32 conversion's embeddings are not the float16 graph's.
        assert_ne!(k, key("c1", Backend::WebGpu, EncoderForm::Float32Conversion, &cat));
    }

    #[test]
    fn entries_round_trip_and_damage_is_detected() {
        let values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.25 - 7.0).collect();
        let bytes = encode_entry(&values);
        assert_eq!(bytes.len() as u64, entry_bytes(values.len()));
        assert_eq!(decode_entry(&bytes, values.len()).unwrap(), values);
        // Short, long, another count, a flipped bit, another magic.
        let found = bytes.len() - 4;
        assert_eq!(
            decode_entry(&bytes[..found], values.len()),
            Err(EntryError::Length { expected: bytes.len(), found })
        );
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(decode_entry(&long, values.len()), Err(EntryError::Length { .. })));
        assert!(matches!(decode_entry(&bytes, values.len() + 1), Err(EntryError::Length { .. })));
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(decode_entry(&flipped, values.len()), Err(EntryError::Damaged));
        let mut other = bytes.clone();
        other[0] = b'X';
        assert_eq!(decode_entry(&other, values.len()), Err(EntryError::NotAnEntry));
        assert_eq!(decode_entry(&bytes[..20], values.len()), Err(EntryError::NotAnEntry));
        assert_eq!(decode_entry(&[], 0), Err(EntryError::NotAnEntry));
        // The header alone says what the values must hash to (the browser hashes them itself).
        let digest: [u8; 32] = Sha256::digest(&bytes[HEADER_BYTES..]).into();
        assert_eq!(bytes[..HEADER_BYTES], entry_header(values.len(), &digest));
        let header = &bytes[..HEADER_BYTES];
        assert_eq!(check_entry_header(header, bytes.len(), values.len()), Ok(digest));
        assert_eq!(
            check_entry_header(header, found, values.len()),
            Err(EntryError::Length { expected: bytes.len(), found })
        );
        assert_eq!(check_entry_header(&bytes[..20], bytes.len(), values.len()), Err(EntryError::NotAnEntry));
    }

    #[test]
    fn the_least_recently_used_go_first_past_the_cap() {
        let mut index = Index { commit: "c".into(), ..Index::default() };
        assert!(index.insert(entry("a", 40), 100).is_empty());
        assert!(index.insert(entry("b", 40), 100).is_empty());
        // `a` is used again, so `b` is the oldest when `c` needs room.
        assert_eq!(index.touch("a").map(|e| e.token_count), Some(14));
        assert_eq!(index.insert(entry("c", 40), 100), vec!["b".to_owned()]);
        assert_eq!(index.bytes(), 80);
        // A big entry pushes out several.
        assert_eq!(index.insert(entry("d", 90), 100), vec!["a".to_owned(), "c".to_owned()]);
        // Replacing an entry does not count it twice.
        assert!(index.insert(entry("d", 95), 100).is_empty());
        assert_eq!(index.entries.len(), 1);
        // One larger than the cap is not kept, and nothing else goes for it.
        assert_eq!(index.insert(entry("e", 101), 100), vec!["e".to_owned()]);
        assert_eq!(index.entries.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["d"]);
        assert_eq!(index.touch("missing"), None);
        index.remove("d");
        assert!(index.entries.is_empty());
    }

    #[test]
    fn an_index_of_another_pack_or_unreadable_is_reset() {
        let mut index = Index { commit: "c1".into(), ..Index::default() };
        index.insert(entry("a", 1), MAX_BYTES);
        let stored = index.to_bytes();
        assert_eq!(Index::load(Some(&stored), "c1"), Loaded::Current(index.clone()));
        let empty = |commit: &str| Index { commit: commit.into(), ..Index::default() };
        assert_eq!(Index::load(Some(&stored), "c2"), Loaded::Reset(empty("c2")));
        assert_eq!(Index::load(Some(b"{not json"), "c1"), Loaded::Reset(empty("c1")));
        assert_eq!(Index::load(None, "c1"), Loaded::Current(empty("c1")));
        // The order of use survives a restart (the clock is stored).
        let Loaded::Current(mut again) = Index::load(Some(&stored), "c1") else { panic!() };
        again.insert(entry("b", 1), MAX_BYTES);
        assert!(again.entries[1].last_used > again.entries[0].last_used);
    }
}
