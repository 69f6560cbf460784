//! Downloading a pack from a Hugging Face Hub: the logic, without the network or the disk.
//!
//! The pack worker (web side) does the I/O: it resolves the revision to a commit
//! ([`revision_url`], [`parse_revision`]), lists the files at that commit ([`tree_url`],
//! [`parse_tree`]), downloads the three small graph files (and their shard manifests) first
//! ([`graph_files`], [`verify_small`]), derives the full file list from them ([`plan`]), checks storage
//! ([`check_space`]), and then streams every file into OPFS with `Range` requests ([`resolve_url`],
//! [`parse_content_range`], [`backoff_ms`]), hashing as it writes ([`ResumableSha256`]) and persisting
//! its position ([`DownloadRecord`]) so that a download survives a closed browser.
//!
//! Everything is pinned to one commit: a download record made for another commit (or another
//! source, or another file list) does not [`DownloadRecord::matches`] the new plan, and its partial
//! files are discarded, so an installed pack is never a mix of two revisions.
//!
//! Names from the Hub become OPFS paths and URL segments, so each one passes
//! [`validate_relative_path`] and is percent-encoded in URLs.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use sha1::Sha1;
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::api::{DownloadProgress, DownloadState, FileProgress, PackFile, PackPlan, PackSource};
use crate::pack::{external_data_locations, parse_manifest, validate_relative_path, Graph, PackError};

/// The largest file size accepted from a listing. The real pack's largest shard is under 2 GB; a
/// larger size is a broken listing, not a file to make room for.
pub const MAX_FILE_SIZE: u64 = 64 << 30;

/// Longest revision accepted (git allows longer ref names, the Hub's users do not write them).
pub const MAX_REVISION_LEN: usize = 256;

/// Attempts at one file in a row that save no new checkpoint before the download fails, waiting
/// [`backoff_ms`] between them (15.5 s in all). A saved checkpoint resets the count, so a long
/// download over a flaky link goes on as long as it moves, and a server that always cuts a response
/// short of the next checkpoint is given up on.
pub const MAX_ATTEMPTS_WITHOUT_PROGRESS: u32 = 6;

/// Why a pack cannot be planned, downloaded or verified. Each message names what was wrong (field,
/// value, file, commit) and, where the user can act, what to do.
#[derive(Debug, Error)]
pub enum HubError {
    /// A field of [`PackSource`] that cannot be used.
    #[error("the {field} {value:?} is not allowed: {reason}")]
    Source {
        /// `endpoint`, `repo` or `revision`.
        field: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong and what is allowed.
        reason: &'static str,
    },
    /// A Hub API response that is not of the expected shape.
    #[error("the Hub's {what} is not what Imagine expects: {reason}")]
    Response {
        /// Which response (`revision`, `file list`).
        what: &'static str,
        /// The parse error, or what was wrong.
        reason: String,
    },
    /// One entry of a file listing that is refused (unsafe path, impossible size, malformed hash).
    #[error("the Hub lists {path:?}, which is refused: {reason}")]
    Entry {
        /// The path as listed.
        path: String,
        /// Why.
        reason: String,
    },
    /// One of the three graphs is not in the repo at that commit.
    #[error("{repo} has no {file} at commit {commit}: is it a FLUX.2 klein ONNX pack?")]
    MissingGraph {
        /// `owner/name`.
        repo: String,
        /// The graph's file name.
        file: String,
        /// The commit listed.
        commit: String,
    },
    /// A file the graphs need (a shard, a manifest's file) is not in the repo at that commit.
    #[error("{repo} at commit {commit} has no {file}, which {needed_by} needs; the pack is incomplete")]
    MissingFile {
        /// `owner/name`.
        repo: String,
        /// The missing file.
        file: String,
        /// The graph or manifest that names it.
        needed_by: String,
        /// The commit listed.
        commit: String,
    },
    /// [`plan`] was not given the bytes it needs (a bug in the caller, not in the pack).
    #[error("cannot plan the pack: {file}: {reason}")]
    GraphBytes {
        /// The graph or manifest file.
        file: String,
        /// What is missing.
        reason: &'static str,
    },
    /// A pack file (graph or manifest) that breaks the pack contract.
    #[error("{file}: {error}")]
    PackFile {
        /// The file that was read.
        file: String,
        /// What was wrong with it.
        #[source]
        error: PackError,
    },
    /// A pack contract error without a file name.
    #[error(transparent)]
    Pack(#[from] PackError),
    /// A downloaded file of the wrong size.
    #[error("{path} is {actual} bytes, but the Hub lists {expected} bytes for it")]
    Size {
        /// The file.
        path: String,
        /// Size from the listing.
        expected: u64,
        /// Size downloaded.
        actual: u64,
    },
    /// A downloaded file whose content does not match the listing's hash.
    #[error("{path} is corrupt: its {algorithm} is {actual}, but the Hub lists {expected}")]
    Hash {
        /// The file.
        path: String,
        /// `SHA-256` or `git blob SHA-1`.
        algorithm: &'static str,
        /// Hash from the listing.
        expected: String,
        /// Hash of what was downloaded.
        actual: String,
    },
    /// A hash checkpoint that cannot be resumed from (a damaged download record).
    #[error("the saved hash state at offset {offset} cannot be resumed: {reason}")]
    Checkpoint {
        /// The checkpoint's offset.
        offset: u64,
        /// Why.
        reason: &'static str,
    },
    /// A `Content-Range` response header that is not `bytes N-M/T` or `bytes N-M/*`.
    #[error("the server sent Content-Range {header:?}, which is not usable: {reason}")]
    ContentRange {
        /// The header as received.
        header: String,
        /// Why.
        reason: &'static str,
    },
    /// The download would not fit in the extension's storage.
    #[error(
        "not enough storage: the pack needs {} more, {} is free (quota {}). Free space on the disk, \
         then install again.",
        format_bytes(*needed),
        format_bytes(*free),
        format_bytes(*quota)
    )]
    Space {
        /// Bytes still to write.
        needed: u64,
        /// `quota - usage`.
        free: u64,
        /// The origin's quota.
        quota: u64,
    },
}

// ---------------------------------------------------------------------------------------------
// Source validation and URLs

impl PackSource {
    /// The source with its fields checked and normalized: surrounding whitespace trimmed, the
    /// endpoint's scheme lowercased and trailing `/` removed. Only `http://` and `https://`
    /// endpoints without query, fragment or credentials; a repo `owner/name` with each part
    /// `[A-Za-z0-9][A-Za-z0-9._-]*`; a revision (branch, tag or commit; branches may contain `/`)
    /// without whitespace, `..` or a leading `/`, at most [`MAX_REVISION_LEN`] characters.
    pub fn validate(&self) -> Result<PackSource, HubError> {
        Ok(PackSource {
            endpoint: validate_endpoint(&self.endpoint)?,
            repo: validate_repo(&self.repo)?,
            revision: validate_revision(&self.revision)?,
        })
    }
}

fn validate_endpoint(value: &str) -> Result<String, HubError> {
    let refuse = |reason| Err(HubError::Source { field: "endpoint", value: value.to_owned(), reason });
    let v = value.trim();
    let lower = v.to_ascii_lowercase();
    let (scheme, rest) = if lower.starts_with("https://") {
        ("https://", &v[8..])
    } else if lower.starts_with("http://") {
        ("http://", &v[7..])
    } else {
        return refuse("it must start with https:// or http://");
    };
    if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return refuse("it must not contain whitespace or control characters");
    }
    if v.contains('?') || v.contains('#') {
        return refuse("it must not have a query (?) or a fragment (#)");
    }
    let rest = rest.trim_end_matches('/');
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    if authority.contains('@') {
        return refuse("it must not contain credentials (user@host)");
    }
    if authority.is_empty() {
        return refuse("it has no host");
    }
    if !authority.chars().all(|c| c.is_ascii_alphanumeric() || ".-_:[]".contains(c)) {
        return refuse("its host may only contain letters, digits, '.', '-', '_', ':' and IPv6 brackets");
    }
    if path.split('/').any(|s| s == ".." || s == ".") {
        return refuse("its path must not contain '.' or '..' segments");
    }
    Ok(format!("{scheme}{rest}"))
}

fn validate_repo(value: &str) -> Result<String, HubError> {
    let refuse = |reason| Err(HubError::Source { field: "repo", value: value.to_owned(), reason });
    let v = value.trim();
    let Some((owner, name)) = v.split_once('/') else {
        return refuse("it must be owner/name");
    };
    for part in [owner, name] {
        let mut chars = part.chars();
        match chars.next() {
            None => return refuse("it must be owner/name, both non-empty"),
            Some(c) if !c.is_ascii_alphanumeric() => {
                return refuse("owner and name must each start with a letter or digit");
            }
            Some(_) => {}
        }
        if !chars.all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
            return refuse("it must be owner/name, each of letters, digits, '.', '_' and '-'");
        }
    }
    if v.contains("..") {
        return refuse("it must not contain '..'");
    }
    Ok(v.to_owned())
}

fn validate_revision(value: &str) -> Result<String, HubError> {
    let refuse = |reason| Err(HubError::Source { field: "revision", value: value.to_owned(), reason });
    let v = value.trim();
    if v.is_empty() {
        return refuse("it must be a branch, tag or commit, not empty");
    }
    if v.chars().count() > MAX_REVISION_LEN {
        return refuse("it must be at most 256 characters");
    }
    if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return refuse("it must not contain whitespace or control characters");
    }
    if v.contains("..") {
        return refuse("it must not contain '..'");
    }
    if v.starts_with('/') {
        return refuse("it must not start with '/'");
    }
    Ok(v.to_owned())
}

/// Percent-encodes everything but the URL-unreserved characters (`A-Z a-z 0-9 - . _ ~`), and `/`
/// when `keep_slash` (what Python's `urllib.parse.quote` does, as `huggingface_hub` uses it).
fn percent_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `GET` this to resolve the revision to a commit ([`parse_revision`]). `src` must come from
/// [`PackSource::validate`]. The revision is one URL segment, its `/` percent-encoded.
pub fn revision_url(src: &PackSource) -> String {
    format!("{}/api/models/{}/revision/{}", src.endpoint, src.repo, percent_encode(&src.revision, false))
}

/// `GET` this to list every file at `commit` ([`parse_tree`]). `src` must come from
/// [`PackSource::validate`]. The Hub pages long listings: the caller follows [`next_page`] and reads
/// the pages with [`parse_tree_pages`].
pub fn tree_url(src: &PackSource, commit: &str) -> String {
    format!("{}/api/models/{}/tree/{}?recursive=true", src.endpoint, src.repo, percent_encode(commit, false))
}

/// Where to download `path` at `commit` (the Hub redirects LFS files to its CDN). `src` must come
/// from [`PackSource::validate`]; each segment of `path` is percent-encoded, `/` kept between them.
pub fn resolve_url(src: &PackSource, commit: &str, path: &str) -> String {
    format!(
        "{}/{}/resolve/{}/{}",
        src.endpoint,
        src.repo,
        percent_encode(commit, false),
        percent_encode(path, true)
    )
}

// ---------------------------------------------------------------------------------------------
// Hub JSON

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[derive(Deserialize)]
struct Revision {
    sha: String,
}

/// The commit (40 lowercase hex) from the body of [`revision_url`] (`{"sha": "…", …}`).
pub fn parse_revision(bytes: &[u8]) -> Result<String, HubError> {
    let r: Revision = serde_json::from_slice(bytes)
        .map_err(|e| HubError::Response { what: "revision", reason: e.to_string() })?;
    if !is_lower_hex(&r.sha, 40) {
        return Err(HubError::Response {
            what: "revision",
            reason: format!("its sha {:?} is not a commit (40 lowercase hex digits)", r.sha),
        });
    }
    Ok(r.sha)
}

#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    size: Option<serde_json::Value>,
    oid: Option<String>,
    lfs: Option<Lfs>,
}

#[derive(Deserialize)]
struct Lfs {
    oid: String,
    size: Option<serde_json::Value>,
}

fn entry_size(path: &str, value: &serde_json::Value) -> Result<u64, HubError> {
    let refuse = |reason: String| Err(HubError::Entry { path: path.to_owned(), reason });
    match value.as_u64() {
        None => refuse(format!("its size {value} is not a non-negative integer")),
        Some(n) if n > MAX_FILE_SIZE => refuse(format!("its size {n} is over the 64 GiB limit")),
        Some(n) => Ok(n),
    }
}

/// Pages of a file list followed at most: a pack lists a few dozen files, and the Hub pages by the
/// thousand, so more means something is wrong.
pub const MAX_TREE_PAGES: usize = 100;

/// The next page of a file list, from the response's `Link` header (`<url>; rel="next"`, the format of
/// GitHub's API, which the Hub follows). The page must be on `endpoint`: a listing never sends the
/// installer to another server.
pub fn next_page(link: &str, endpoint: &str) -> Result<Option<String>, HubError> {
    let mut rest = link;
    while let Some(open) = rest.find('<') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('>') else { break };
        let url = &after[..close];
        let params_end = after[close + 1..].find('<').map_or(after.len(), |i| close + 1 + i);
        let is_next = after[close + 1..params_end].split([';', ',']).any(|param| {
            let param = param.trim().replace(' ', "");
            param.eq_ignore_ascii_case("rel=\"next\"") || param.eq_ignore_ascii_case("rel=next")
        });
        if is_next {
            let on_endpoint = url.strip_prefix(endpoint).is_some_and(|path| path.starts_with('/'));
            if !on_endpoint {
                return Err(HubError::Response {
                    what: "file list",
                    reason: format!("its next page {url:?} is not on {endpoint}"),
                });
            }
            return Ok(Some(url.to_owned()));
        }
        rest = &after[params_end..];
    }
    Ok(None)
}

/// The files of the body of [`tree_url`]: an array of
/// `{type, path, size, oid, lfs?: {oid, size, pointerSize}}`. Directories (and any other
/// non-file entry) are skipped. An LFS file gets `sha256 = lfs.oid` (64 lowercase hex) and
/// `size = lfs.size`, which must equal `size` when both are given; a file stored in git gets
/// `git_oid = oid` (40 lowercase hex, the SHA-1 of the git blob). Paths are checked with
/// [`validate_relative_path`] and returned normalized; duplicates are refused.
pub fn parse_tree(bytes: &[u8]) -> Result<Vec<PackFile>, HubError> {
    parse_tree_pages(&[bytes])
}

/// [`parse_tree`] over a list given in pages (see [`next_page`]), as one list.
pub fn parse_tree_pages(pages: &[&[u8]]) -> Result<Vec<PackFile>, HubError> {
    let mut entries: Vec<TreeEntry> = Vec::new();
    for page in pages {
        let page: Vec<TreeEntry> = serde_json::from_slice(page)
            .map_err(|e| HubError::Response { what: "file list", reason: e.to_string() })?;
        entries.extend(page);
    }
    let mut files: Vec<PackFile> = Vec::new();
    for e in entries {
        if e.kind != "file" {
            continue;
        }
        let refuse = |reason: String| Err(HubError::Entry { path: e.path.clone(), reason });
        let path = match validate_relative_path(&e.path) {
            Ok(p) => p.to_owned(),
            Err(PackError::Path { reason, .. }) => return refuse(reason.to_owned()),
            Err(other) => return refuse(other.to_string()),
        };
        let size = e.size.as_ref().map(|v| entry_size(&e.path, v)).transpose()?;
        let file = if let Some(lfs) = &e.lfs {
            let lfs_size = lfs.size.as_ref().map(|v| entry_size(&e.path, v)).transpose()?;
            let size = match (size, lfs_size) {
                (Some(a), Some(b)) if a != b => {
                    return refuse(format!("its size {a} differs from its LFS size {b}"));
                }
                (_, Some(s)) | (Some(s), None) => s,
                (None, None) => return refuse("it has no size".into()),
            };
            if !is_lower_hex(&lfs.oid, 64) {
                return refuse(format!("its LFS oid {:?} is not a SHA-256 (64 lowercase hex)", lfs.oid));
            }
            PackFile { path, size, sha256: Some(lfs.oid.clone()), git_oid: None }
        } else {
            let Some(size) = size else { return refuse("it has no size".into()) };
            if let Some(oid) = &e.oid {
                if !is_lower_hex(oid, 40) {
                    return refuse(format!("its oid {oid:?} is not a git blob id (40 lowercase hex)"));
                }
            }
            PackFile { path, size, sha256: None, git_oid: e.oid.clone() }
        };
        if files.iter().any(|f| f.path == file.path) {
            return refuse("it is listed twice".into());
        }
        files.push(file);
    }
    Ok(files)
}

// ---------------------------------------------------------------------------------------------
// Planning

/// The already-downloaded small files of one graph, from which [`plan`] reads the data files it
/// needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphFiles {
    /// Which graph.
    pub graph: Graph,
    /// `<stem>.onnx`.
    pub onnx: Vec<u8>,
    /// `<stem>.manifest.json`, exactly when the listing has one.
    pub manifest: Option<Vec<u8>>,
}

/// The listing entries of each graph in pipeline order: `(graph, <stem>.onnx, <stem>.manifest.json
/// if listed)`. These are what the worker downloads (and checks with [`verify_small`]) before
/// [`plan`]. Every graph must be listed. `source` and `commit` only name the repo in the error.
pub fn graph_files(
    source: &PackSource,
    commit: &str,
    listing: &[PackFile],
) -> Result<Vec<(Graph, PackFile, Option<PackFile>)>, HubError> {
    let find = |name: &str| listing.iter().find(|f| f.path == name).cloned();
    Graph::ALL
        .iter()
        .map(|&graph| {
            let onnx = find(&graph.file_name()).ok_or_else(|| HubError::MissingGraph {
                repo: source.repo.clone(),
                file: graph.file_name(),
                commit: commit.to_owned(),
            })?;
            Ok((graph, onnx, find(&graph.manifest_name())))
        })
        .collect()
}

/// What an install downloads: for each graph in pipeline order, its `<stem>.onnx`, its
/// `<stem>.manifest.json` if listed, then every data file its manifest lists and its initializers
/// name ([`external_data_locations`]), manifest order first, each file once. Files of the repo the
/// graphs do not need (README, samples, other variants) are left out. Every needed file must be in
/// `listing`. The graph and manifest bytes in `graphs` are checked against the listing
/// ([`verify_small`]) so the plan never derives from other bytes than the commit's.
pub fn plan(
    source: &PackSource,
    commit: &str,
    listing: &[PackFile],
    graphs: &[GraphFiles],
) -> Result<PackPlan, HubError> {
    let mut files: Vec<PackFile> = Vec::new();
    let push = |files: &mut Vec<PackFile>, file: PackFile| {
        if !files.iter().any(|f| f.path == file.path) {
            files.push(file);
        }
    };
    for (graph, onnx_entry, manifest_entry) in graph_files(source, commit, listing)? {
        let given = graphs.iter().find(|g| g.graph == graph).ok_or_else(|| HubError::GraphBytes {
            file: graph.file_name(),
            reason: "its bytes were not given",
        })?;
        verify_small(&onnx_entry, &given.onnx)?;
        let pack_err = |file: &str| {
            let file = file.to_owned();
            move |error| HubError::PackFile { file, error }
        };
        let mut needed: Vec<(String, String)> = Vec::new(); // (data file, who names it)
        match (&manifest_entry, &given.manifest) {
            (Some(entry), Some(bytes)) => {
                verify_small(entry, bytes)?;
                for shard in parse_manifest(bytes).map_err(pack_err(&entry.path))? {
                    needed.push((shard, entry.path.clone()));
                }
            }
            (Some(entry), None) => {
                return Err(HubError::GraphBytes {
                    file: entry.path.clone(),
                    reason: "the listing has this manifest, but its bytes were not given",
                });
            }
            (None, Some(_)) => {
                return Err(HubError::GraphBytes {
                    file: graph.manifest_name(),
                    reason: "manifest bytes were given, but the listing has no such file",
                });
            }
            (None, None) => {}
        }
        for location in external_data_locations(&given.onnx).map_err(pack_err(&onnx_entry.path))? {
            let normalized = validate_relative_path(&location)?.to_owned();
            needed.push((normalized, onnx_entry.path.clone()));
        }
        push(&mut files, onnx_entry);
        if let Some(entry) = manifest_entry {
            push(&mut files, entry);
        }
        for (name, needed_by) in needed {
            let entry = listing.iter().find(|f| f.path == name).ok_or_else(|| HubError::MissingFile {
                repo: source.repo.clone(),
                file: name.clone(),
                needed_by,
                commit: commit.to_owned(),
            })?;
            push(&mut files, entry.clone());
        }
    }
    let total_bytes = files.iter().map(|f| f.size).sum();
    Ok(PackPlan { source: source.clone(), commit: commit.to_owned(), files, total_bytes })
}

// ---------------------------------------------------------------------------------------------
// Verification

/// Lowercase hex of a digest.
pub fn hex(bytes: &[u8; 32]) -> String {
    hex_of(bytes)
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The git blob id of `bytes`: SHA-1 of `"blob {len}\0"` followed by the bytes, lowercase hex.
pub fn git_blob_oid(bytes: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    hex_of(&h.finalize())
}

/// Checks a small file downloaded whole: its size, then its SHA-256 if listed, else its git blob
/// id if listed. A file with neither is checked by size only (the Hub lists one or the other for
/// every file).
pub fn verify_small(file: &PackFile, bytes: &[u8]) -> Result<(), HubError> {
    if bytes.len() as u64 != file.size {
        return Err(HubError::Size {
            path: file.path.clone(),
            expected: file.size,
            actual: bytes.len() as u64,
        });
    }
    if file.sha256.is_some() {
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        return verify_sha256(file, &digest);
    }
    if let Some(expected) = &file.git_oid {
        let actual = git_blob_oid(bytes);
        if &actual != expected {
            return Err(HubError::Hash {
                path: file.path.clone(),
                algorithm: "git blob SHA-1",
                expected: expected.clone(),
                actual,
            });
        }
    }
    Ok(())
}

/// Checks the SHA-256 of a streamed file ([`ResumableSha256::finalize`]) against the listing. A
/// file without a listed SHA-256 passes (check its size separately).
pub fn verify_sha256(file: &PackFile, digest: &[u8; 32]) -> Result<(), HubError> {
    match &file.sha256 {
        Some(expected) if *expected != hex(digest) => Err(HubError::Hash {
            path: file.path.clone(),
            algorithm: "SHA-256",
            expected: expected.clone(),
            actual: hex(digest),
        }),
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// Resumable SHA-256

const SHA256_IV: [u32; 8] =
    [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

/// The state of a [`ResumableSha256`] at a 64-byte block boundary: enough to continue hashing a
/// file from `offset` after the worker, the browser or the machine restarted. Persisted in the
/// [`DownloadRecord`].
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

// ---------------------------------------------------------------------------------------------
// Download record

/// Where the download of one file stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileRecord {
    /// The file, as planned.
    pub file: PackFile,
    /// Bytes of the file written so far (what progress shows). A resume trusts only those up to
    /// `hash`'s offset ([`resume`](Self::resume)); [`save`](Self::save) sets both together.
    pub done: u64,
    /// The hash state at `done` (streamed files); `None` before the first checkpoint and for files
    /// checked whole with [`verify_small`].
    pub hash: Option<HashCheckpoint>,
    /// Size and hash checked; the file is complete.
    pub verified: bool,
    /// The file was started over after some of it had been recorded (a server ignored a range, or the
    /// file on disk was shorter than its checkpoint): before it counts as verified, what is on disk is
    /// hashed again, so no record can vouch for bytes the file does not hold.
    #[serde(default)]
    pub restarted: bool,
}

impl FileRecord {
    /// Starts the file over from byte 0, remembering that it was ([`restarted`](Self::restarted)).
    pub fn restart(&mut self) {
        self.done = 0;
        self.hash = None;
        self.restarted = true;
    }

    /// Records a checkpoint of the file's hasher ([`ResumableSha256::aligned_checkpoint`], taken after
    /// the bytes it has seen are flushed to disk): `done` becomes the checkpoint's offset.
    pub fn save(&mut self, checkpoint: HashCheckpoint) {
        self.done = checkpoint.offset;
        self.hash = Some(checkpoint);
    }

    /// The hasher to continue this file with. Its [`offset`](ResumableSha256::offset) is where
    /// to truncate the staged file and request `Range: bytes=<offset>-` from: the saved
    /// checkpoint's, or 0 when there is none or it does not fit the record (then the file starts
    /// over). Bytes past the checkpoint are re-downloaded, never trusted unhashed.
    pub fn resume(&self) -> ResumableSha256 {
        self.hash
            .as_ref()
            .filter(|c| c.offset <= self.done && c.offset <= self.file.size)
            .and_then(|c| ResumableSha256::from_checkpoint(c).ok())
            .unwrap_or_default()
    }
}

/// The state of a pack download, persisted by the worker (as JSON in OPFS, next to the staged
/// files) after each checkpoint, so a download resumes after the browser closes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownloadRecord {
    /// Where the pack comes from.
    pub source: PackSource,
    /// The commit every file is downloaded at.
    pub commit: String,
    /// One per planned file, in plan order.
    pub files: Vec<FileRecord>,
}

impl DownloadRecord {
    /// A fresh record: nothing downloaded.
    pub fn new(plan: &PackPlan) -> Self {
        DownloadRecord {
            source: plan.source.clone(),
            commit: plan.commit.clone(),
            files: plan
                .files
                .iter()
                .map(|f| FileRecord {
                    file: f.clone(),
                    done: 0,
                    hash: None,
                    verified: false,
                    restarted: false,
                })
                .collect(),
        }
    }

    /// Whether this record belongs to `plan`: same source, commit and files (names, sizes and
    /// hashes, in order). If not, the staged files must be discarded and a new record started, so a
    /// pack is never a mix of two revisions.
    pub fn matches(&self, plan: &PackPlan) -> bool {
        self.source == plan.source
            && self.commit == plan.commit
            && self.files.len() == plan.files.len()
            && self.files.iter().zip(&plan.files).all(|(r, f)| r.file == *f)
    }

    /// Bytes downloaded and hashed (a verified file counts whole).
    pub fn done_bytes(&self) -> u64 {
        self.files.iter().map(|r| if r.verified { r.file.size } else { r.done.min(r.file.size) }).sum()
    }

    /// Bytes of the whole pack.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|r| r.file.size).sum()
    }

    /// Bytes still to download (what [`check_space`] needs free).
    pub fn remaining_bytes(&self) -> u64 {
        self.total_bytes() - self.done_bytes()
    }

    /// Whether every file is verified.
    pub fn complete(&self) -> bool {
        self.files.iter().all(|r| r.verified)
    }

    /// The progress to report. The rate and time left come from `rate` only while `state` is
    /// `Downloading`; a paused or failed download reports no rate.
    pub fn to_progress(
        &self,
        state: DownloadState,
        rate: &RateMeter,
        error: Option<String>,
    ) -> DownloadProgress {
        let downloading = state == DownloadState::Downloading;
        let remaining = self.remaining_bytes();
        DownloadProgress {
            state,
            source: self.source.clone(),
            commit: Some(self.commit.clone()),
            total_bytes: self.total_bytes(),
            done_bytes: self.done_bytes(),
            files: self
                .files
                .iter()
                .map(|r| FileProgress {
                    path: r.file.path.clone(),
                    size: r.file.size,
                    done_bytes: if r.verified { r.file.size } else { r.done.min(r.file.size) },
                    verified: r.verified,
                })
                .collect(),
            bytes_per_second: if downloading { rate.bytes_per_second() } else { 0.0 },
            seconds_left: if downloading { rate.seconds_left(remaining) } else { None },
            error,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rate

/// The download rate over the last few seconds, from `(time, total bytes done)` samples. A sliding
/// window rather than an average since the start, so the estimate follows a link that speeds up or
/// slows down, and ignores time spent paused (call [`reset`](Self::reset) on resume).
#[derive(Debug, Clone)]
pub struct RateMeter {
    window_ms: f64,
    samples: VecDeque<(f64, u64)>,
}

impl Default for RateMeter {
    fn default() -> Self {
        Self::new()
    }
}

impl RateMeter {
    /// The window, in milliseconds.
    pub const WINDOW_MS: f64 = 5000.0;
    /// The newest sample replaces the one before it while that one is closer than this to its
    /// predecessor, so a fast link does not pile up thousands of samples per window.
    const MIN_SPACING_MS: f64 = 100.0;

    /// No samples, a [`Self::WINDOW_MS`] window.
    pub fn new() -> Self {
        RateMeter { window_ms: Self::WINDOW_MS, samples: VecDeque::new() }
    }

    /// Forgets all samples (after a pause, or when a file starts over).
    pub fn reset(&mut self) {
        self.samples.clear();
    }

    /// Adds a sample: at `time_ms` (any monotonic clock, e.g. `performance.now()`), `done_bytes`
    /// of the whole download were done. A sample going back in time or bytes starts over.
    pub fn push(&mut self, time_ms: f64, done_bytes: u64) {
        if !time_ms.is_finite() {
            return;
        }
        if let Some(&(t, b)) = self.samples.back() {
            if time_ms < t || done_bytes < b {
                self.samples.clear();
            }
        }
        let n = self.samples.len();
        if n >= 2 && self.samples[n - 1].0 - self.samples[n - 2].0 < Self::MIN_SPACING_MS {
            self.samples[n - 1] = (time_ms, done_bytes);
        } else {
            self.samples.push_back((time_ms, done_bytes));
        }
        // Keep the newest sample at or before the window's start, so the window is fully spanned.
        while self.samples.len() >= 2 && self.samples[1].0 <= time_ms - self.window_ms {
            self.samples.pop_front();
        }
    }

    /// Bytes per second over the window; 0 before two samples some time apart.
    pub fn bytes_per_second(&self) -> f64 {
        match (self.samples.front(), self.samples.back()) {
            (Some(&(t0, b0)), Some(&(t1, b1))) if t1 > t0 => (b1 - b0) as f64 * 1000.0 / (t1 - t0),
            _ => 0.0,
        }
    }

    /// Seconds to download `remaining_bytes` at [`bytes_per_second`](Self::bytes_per_second);
    /// `None` while there is no rate.
    pub fn seconds_left(&self, remaining_bytes: u64) -> Option<f64> {
        let rate = self.bytes_per_second();
        (rate > 0.0).then(|| remaining_bytes as f64 / rate)
    }
}

// ---------------------------------------------------------------------------------------------
// Retries, ranges, storage

/// Milliseconds to wait before retry number `attempt` (0 for the first retry): 500 ms doubling per
/// attempt, capped at 30 s, then shortened by up to 20% with `jitter` (`0..=1`, from the caller's
/// random source, so many clients do not retry in lockstep; out-of-range values are clamped).
pub fn backoff_ms(attempt: u32, jitter: f64) -> u64 {
    const BASE_MS: u64 = 500;
    const CAP_MS: u64 = 30_000;
    let base = BASE_MS.checked_shl(attempt.min(16)).unwrap_or(CAP_MS).min(CAP_MS);
    let jitter = if jitter.is_nan() { 0.0 } else { jitter.clamp(0.0, 1.0) };
    (base as f64 * (1.0 - 0.2 * jitter)).round() as u64
}

/// `(start, end inclusive, total if known)` of a `Content-Range` header: `bytes N-M/T` or
/// `bytes N-M/*`. Refuses `bytes */T` (an unsatisfiable range), `M < N` and `M >= T`.
pub fn parse_content_range(header: &str) -> Result<(u64, u64, Option<u64>), HubError> {
    let refuse = |reason| Err(HubError::ContentRange { header: header.to_owned(), reason });
    let h = header.trim();
    let Some(unit) = h.get(..6) else { return refuse("it does not start with `bytes `") };
    if !unit.eq_ignore_ascii_case("bytes ") {
        return refuse("it does not start with `bytes `");
    }
    let Some((range, total)) = h[6..].trim_start().split_once('/') else {
        return refuse("it has no `/total`");
    };
    let number =
        |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten();
    let Some((start, end)) = range.split_once('-') else {
        return refuse("it has no `start-end` range");
    };
    let (Some(start), Some(end)) = (number(start), number(end)) else {
        return refuse("its range is not `start-end` in decimal digits");
    };
    if end < start {
        return refuse("its range ends before it starts");
    }
    let total = match total {
        "*" => None,
        t => match number(t) {
            Some(t) if end < t => Some(t),
            Some(_) => return refuse("its range ends past the total size"),
            None => return refuse("its total is neither a number nor `*`"),
        },
    };
    Ok((start, end, total))
}

/// Whether a 206 response's `Content-Range` starts exactly where the staged file ends. Any other
/// answer (another start, or a header that does not parse) must not be appended.
pub fn range_matches(header: &str, expected_start: u64) -> bool {
    parse_content_range(header).is_ok_and(|(start, _, _)| start == expected_start)
}

/// Checks that `needed_bytes` more fit in the origin's storage (`navigator.storage.estimate()`'s
/// `usage` and `quota`), before downloading anything.
pub fn check_space(needed_bytes: u64, usage: u64, quota: u64) -> Result<(), HubError> {
    let free = quota.saturating_sub(usage);
    if needed_bytes > free {
        return Err(HubError::Space { needed: needed_bytes, free, quota });
    }
    Ok(())
}

/// A size for people, in decimal units as disks are sold: `6.52 GB`, `12.3 MB`, `4.1 KB`,
/// `12 bytes`.
pub fn format_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    // Thresholds at what rounds up to the next unit, so 999,999,999 bytes is `1.00 GB`, not `1000.0 MB`.
    if b >= 999_995_000.0 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 999_950.0 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} KB", b / 1e3)
    } else if bytes == 1 {
        "1 byte".to_owned()
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_page_follows_rel_next_on_the_endpoint_only() {
        let hub = "https://huggingface.co";
        let next = "https://huggingface.co/api/models/a/b/tree/c?recursive=true&cursor=Mg%3D%3D";
        let link = format!("<{next}>; rel=\"next\"");
        assert_eq!(next_page(&link, hub).unwrap().as_deref(), Some(next));
        let both = format!("<{hub}/api/models/a/b/tree/c?cursor=0>; rel=\"prev\", <{next}>; rel=\"next\"");
        assert_eq!(next_page(&both, hub).unwrap().as_deref(), Some(next));
        assert_eq!(next_page(&format!("<{next}>; rel=\"prev\""), hub).unwrap(), None);
        assert_eq!(next_page("", hub).unwrap(), None);
        for elsewhere in
            ["https://evil.example/api/models/a/b/tree/c", "https://huggingface.co.evil.example/x"]
        {
            let error = next_page(&format!("<{elsewhere}>; rel=next"), hub).unwrap_err().to_string();
            assert!(error.contains("not on https://huggingface.co"), "{error}");
        }
    }

    #[test]
    fn tree_pages_are_one_list() {
        let page = |path: &str| {
            format!(r#"[{{"type":"file","path":"{path}","size":3,"oid":"{}"}}]"#, "a".repeat(40))
        };
        let (one, two) = (page("a.onnx"), page("b.onnx"));
        let files = parse_tree_pages(&[one.as_bytes(), two.as_bytes()]).unwrap();
        assert_eq!(files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["a.onnx", "b.onnx"]);
        let error = parse_tree_pages(&[one.as_bytes(), one.as_bytes()]).unwrap_err().to_string();
        assert!(error.contains("listed twice"), "{error}");
    }

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

    fn src(endpoint: &str, repo: &str, revision: &str) -> PackSource {
        PackSource { endpoint: endpoint.into(), repo: repo.into(), revision: revision.into() }
    }

    #[test]
    fn default_source_is_valid_and_urls() {
        let s = PackSource::default().validate().unwrap();
        assert_eq!(s, PackSource::default());
        assert_eq!(
            revision_url(&s),
            "https://huggingface.co/api/models/cgb/flux2-klein-4b-onnx-webgpu/revision/main"
        );
        let c = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(
            tree_url(&s, c),
            format!(
                "https://huggingface.co/api/models/cgb/flux2-klein-4b-onnx-webgpu/tree/{c}?recursive=true"
            )
        );
        assert_eq!(
            resolve_url(&s, c, "dir/a b+c%.onnx"),
            format!(
                "https://huggingface.co/cgb/flux2-klein-4b-onnx-webgpu/resolve/{c}/dir/a%20b%2Bc%25.onnx"
            )
        );
    }

    #[test]
    fn source_normalization() {
        let s = src(" HTTPS://Mirror.example:8080/hf/// ", " a/b.c-d_e ", " refs/pr/1 ").validate().unwrap();
        assert_eq!(s.endpoint, "https://Mirror.example:8080/hf");
        assert_eq!(s.repo, "a/b.c-d_e");
        assert_eq!(s.revision, "refs/pr/1");
        assert_eq!(
            revision_url(&s),
            "https://Mirror.example:8080/hf/api/models/a/b.c-d_e/revision/refs%2Fpr%2F1"
        );
        assert_eq!(
            src("http://127.0.0.1:9000/", "a/b", "v1").validate().unwrap().endpoint,
            "http://127.0.0.1:9000"
        );
        assert_eq!(src("http://[::1]:9000", "a/b", "v1").validate().unwrap().endpoint, "http://[::1]:9000");
    }

    #[test]
    fn source_refusals_name_field_and_value() {
        let ok = PackSource::default();
        for endpoint in [
            "",
            "ftp://x",
            "huggingface.co",
            "https://",
            "https:///path",
            "https://u:p@host",
            "https://host?x=1",
            "https://host/#f",
            "https://ho st",
            "https://host/../x",
            "javascript:alert(1)",
        ] {
            let e = PackSource { endpoint: endpoint.into(), ..ok.clone() }.validate().unwrap_err();
            assert!(matches!(e, HubError::Source { field: "endpoint", .. }), "{endpoint:?}: {e}");
        }
        for repo in ["", "a", "a/", "/b", "a/b/c", "-a/b", "a/.b", "a/b..c", "a b/c", "a/b%2f", "a/ü"] {
            let e = PackSource { repo: repo.into(), ..ok.clone() }.validate().unwrap_err();
            assert!(matches!(e, HubError::Source { field: "repo", .. }), "{repo:?}: {e}");
        }
        let long = "x".repeat(257);
        for revision in ["", "  ", "a b", "a\tb", "../main", "a..b", "/main", long.as_str()] {
            let e = PackSource { revision: revision.into(), ..ok.clone() }.validate().unwrap_err();
            assert!(matches!(e, HubError::Source { field: "revision", .. }), "{revision:?}: {e}");
        }
        assert!(PackSource { revision: "x".repeat(256), ..ok.clone() }.validate().is_ok());
        assert_eq!(
            PackSource { endpoint: "ftp://x".into(), ..ok }.validate().unwrap_err().to_string(),
            r#"the endpoint "ftp://x" is not allowed: it must start with https:// or http://"#
        );
    }

    #[test]
    fn revision_json() {
        let c = "a".repeat(40);
        assert_eq!(
            parse_revision(format!(r#"{{"id":"x","sha":"{c}","siblings":[]}}"#).as_bytes()).unwrap(),
            c
        );
        for bad in [r#"{"sha":"ABC"}"#, r#"{"sha":"g"}"#, r#"{}"#, "[]", "nope"] {
            assert!(matches!(parse_revision(bad.as_bytes()), Err(HubError::Response { .. })), "{bad}");
        }
        let upper = format!(r#"{{"sha":"{}"}}"#, "A".repeat(40));
        assert!(parse_revision(upper.as_bytes()).unwrap_err().to_string().contains("40 lowercase hex"));
    }

    #[test]
    fn tree_json() {
        let sha = "b".repeat(64);
        let oid = "c".repeat(40);
        let body = format!(
            r#"[
              {{"type":"directory","oid":"{oid}","size":0,"path":"samples"}},
              {{"type":"file","oid":"{oid}","size":133,"path":"a.manifest.json","lastCommit":{{}}}},
              {{"type":"file","oid":"{oid}","size":1900000000,"path":"a-00000.data",
                "lfs":{{"oid":"{sha}","size":1900000000,"pointerSize":135}},"xetHash":"z"}},
              {{"type":"file","oid":"{oid}","path":"samples/x.png","lfs":{{"oid":"{sha}","size":7}}}}
            ]"#
        );
        let files = parse_tree(body.as_bytes()).unwrap();
        assert_eq!(
            files,
            vec![
                PackFile {
                    path: "a.manifest.json".into(),
                    size: 133,
                    sha256: None,
                    git_oid: Some(oid.clone())
                },
                PackFile {
                    path: "a-00000.data".into(),
                    size: 1_900_000_000,
                    sha256: Some(sha.clone()),
                    git_oid: None
                },
                PackFile { path: "samples/x.png".into(), size: 7, sha256: Some(sha.clone()), git_oid: None },
            ]
        );
    }

    #[test]
    fn tree_refusals_name_the_path() {
        let sha = "b".repeat(64);
        let entry = |path: &str, size: &str, extra: &str| {
            let path = serde_json::to_string(path).unwrap();
            format!(r#"[{{"type":"file","path":{path},"size":{size},"oid":"{}"{extra}}}]"#, "c".repeat(40))
        };
        let cases = [
            ("../etc/passwd", entry("../etc/passwd", "1", "")),
            ("/abs", entry("/abs", "1", "")),
            ("a\\b", entry("a\\b", "1", "")),
            ("a//b", entry("a//b", "1", "")),
            ("a\u{0}b", entry("a\u{0}b", "1", "")),
            ("neg", entry("neg", "-1", "")),
            ("frac", entry("frac", "1.5", "")),
            ("str", entry("str", "\"1\"", "")),
            ("huge", entry("huge", &(MAX_FILE_SIZE + 1).to_string(), "")),
            ("mismatch", entry("mismatch", "10", &format!(r#","lfs":{{"oid":"{sha}","size":11}}"#))),
            ("badsha", entry("badsha", "10", r#","lfs":{"oid":"xyz","size":10}"#)),
            ("badlfs", entry("badlfs", "10", &format!(r#","lfs":{{"oid":"{sha}","size":-3}}"#))),
            (
                "nosize",
                r#"[{"type":"file","path":"nosize","oid":"cccccccccccccccccccccccccccccccccccccccc"}]"#
                    .into(),
            ),
            ("badoid", r#"[{"type":"file","path":"badoid","size":1,"oid":"xyz"}]"#.into()),
        ];
        for (expected, body) in &cases {
            match parse_tree(body.as_bytes()) {
                Err(HubError::Entry { path, reason }) => {
                    assert_eq!(&path, expected);
                    assert!(!reason.is_empty());
                }
                other => panic!("{body}: {other:?}"),
            }
        }
        let dup = format!(
            "[{},{}]",
            entry("a", "1", "").trim_matches(['[', ']']),
            entry("./a", "1", "").trim_matches(['[', ']'])
        );
        assert!(parse_tree(dup.as_bytes()).unwrap_err().to_string().contains("listed twice"));
        assert!(matches!(parse_tree(b"{}"), Err(HubError::Response { .. })));
        let e = parse_tree(entry("neg", "-1", "").as_bytes()).unwrap_err().to_string();
        assert_eq!(e, r#"the Hub lists "neg", which is refused: its size -1 is not a non-negative integer"#);
    }

    #[test]
    fn small_file_verification() {
        let data = b"hello world\n";
        // `git hash-object` of "hello world\n".
        assert_eq!(git_blob_oid(data), "3b18e512dba79e4c8300dd08aeb37f8e728b8dad");
        let by_git = PackFile {
            path: "a.json".into(),
            size: 12,
            sha256: None,
            git_oid: Some("3b18e512dba79e4c8300dd08aeb37f8e728b8dad".into()),
        };
        verify_small(&by_git, data).unwrap();
        assert!(matches!(verify_small(&by_git, b"hello world!"), Err(HubError::Hash { .. })));
        assert!(matches!(
            verify_small(&by_git, b"hello"),
            Err(HubError::Size { expected: 12, actual: 5, .. })
        ));
        let by_sha = PackFile { sha256: Some(hex(&reference(data))), git_oid: None, ..by_git.clone() };
        verify_small(&by_sha, data).unwrap();
        let e = verify_small(&by_sha, b"hello world!").unwrap_err();
        assert!(e.to_string().starts_with("a.json is corrupt: its SHA-256 is "), "{e}");
        verify_small(&PackFile { sha256: None, git_oid: None, ..by_git }, b"anything 12b").unwrap();
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

    fn plan_of(sizes: &[u64]) -> PackPlan {
        let files: Vec<PackFile> = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| PackFile {
                path: format!("f{i}"),
                size,
                sha256: Some("0".repeat(64)),
                git_oid: None,
            })
            .collect();
        PackPlan {
            source: PackSource::default(),
            commit: "a".repeat(40),
            total_bytes: sizes.iter().sum(),
            files,
        }
    }

    #[test]
    fn download_record() {
        let plan = plan_of(&[100, 1000, 50]);
        let mut r = DownloadRecord::new(&plan);
        assert!(r.matches(&plan));
        assert_eq!((r.done_bytes(), r.total_bytes(), r.remaining_bytes()), (0, 1150, 1150));
        r.files[0].done = 100;
        r.files[0].verified = true;
        let mut h = ResumableSha256::new();
        h.update(&[7; 300]);
        r.files[1].save(h.aligned_checkpoint());
        assert_eq!(r.files[1].done, 256);
        assert_eq!(r.files[1].resume().offset(), 256);
        assert_eq!(r.done_bytes(), 356);
        assert!(!r.complete());

        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(r#""gitOid":null"#) && json.contains(r#""verified":true"#), "{json}");
        let back: DownloadRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);

        let mut rate = RateMeter::new();
        rate.push(0.0, 0);
        rate.push(1000.0, 356);
        let p = r.to_progress(DownloadState::Downloading, &rate, None);
        assert_eq!((p.done_bytes, p.total_bytes, p.commit.as_deref()), (356, 1150, Some(&*"a".repeat(40))));
        assert_eq!(
            p.files[1],
            FileProgress { path: "f1".into(), size: 1000, done_bytes: 256, verified: false }
        );
        assert_eq!(p.bytes_per_second, 356.0);
        assert_eq!(p.seconds_left, Some(794.0 / 356.0));
        let p = r.to_progress(DownloadState::Failed, &rate, Some("boom".into()));
        assert_eq!((p.bytes_per_second, p.seconds_left, p.error.as_deref()), (0.0, None, Some("boom")));

        // Another commit, source or file list: the staged files belong to something else.
        let mut other = plan.clone();
        other.commit = "b".repeat(40);
        assert!(!r.matches(&other));
        let mut other = plan.clone();
        other.files[2].size = 51;
        assert!(!r.matches(&other));
        let mut other = plan.clone();
        other.source.revision = "v2".into();
        assert!(!r.matches(&other));
        assert!(!r.matches(&plan_of(&[100, 1000])));
    }

    #[test]
    fn resume_falls_back_to_zero_on_inconsistent_record() {
        let plan = plan_of(&[1000]);
        let mut r = DownloadRecord::new(&plan);
        assert_eq!(r.files[0].resume().offset(), 0);
        r.files[0].hash = Some(HashCheckpoint { offset: 512, state: [1; 8] });
        r.files[0].done = 100; // checkpoint past what is durable
        assert_eq!(r.files[0].resume().offset(), 0);
        r.files[0].done = 600; // bytes past the checkpoint are re-downloaded
        assert_eq!(r.files[0].resume().offset(), 512);
        r.files[0].hash = Some(HashCheckpoint { offset: 500, state: [1; 8] });
        assert_eq!(r.files[0].resume().offset(), 0);
    }

    #[test]
    fn rate_meter_window() {
        let mut m = RateMeter::new();
        assert_eq!(m.bytes_per_second(), 0.0);
        assert_eq!(m.seconds_left(100), None);
        m.push(0.0, 0);
        assert_eq!(m.bytes_per_second(), 0.0);
        // 1 MB/s for 10 s, sampled every 50 ms.
        for i in 1..=200 {
            m.push(i as f64 * 50.0, i * 50_000);
        }
        assert!((m.bytes_per_second() - 1e6).abs() < 1.0, "{}", m.bytes_per_second());
        assert!(m.samples.len() < 60, "{} samples", m.samples.len());
        // Then 3 MB/s for 10 s: after 10 s the old rate has left the window.
        for i in 1..=100 {
            m.push(10_000.0 + i as f64 * 100.0, 10_000_000 + i * 300_000);
        }
        assert!((m.bytes_per_second() - 3e6).abs() < 1.0, "{}", m.bytes_per_second());
        assert_eq!(m.seconds_left(6_000_000), Some(2.0));
        // Halfway through a change the window mixes both rates.
        for i in 1..=25 {
            m.push(20_000.0 + i as f64 * 100.0, 40_000_000 + i * 100_000);
        }
        let r = m.bytes_per_second();
        assert!(r > 1e6 && r < 3e6, "{r}");
        // Bytes going back (a file restarted) or time going back starts over.
        m.push(30_000.0, 5);
        assert_eq!(m.bytes_per_second(), 0.0);
        m.push(31_000.0, 1005);
        assert_eq!(m.bytes_per_second(), 1000.0);
        m.push(1.0, 2000);
        assert_eq!(m.bytes_per_second(), 0.0);
        m.reset();
        assert_eq!(m.seconds_left(1), None);
        // A stall: no new bytes for the whole window.
        let mut m = RateMeter::new();
        m.push(0.0, 1000);
        m.push(6000.0, 1000);
        assert_eq!(m.bytes_per_second(), 0.0);
        assert_eq!(m.seconds_left(1), None);
    }

    #[test]
    fn backoff() {
        let no_jitter: Vec<u64> = (0..9).map(|a| backoff_ms(a, 0.0)).collect();
        assert_eq!(no_jitter, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
        assert_eq!(backoff_ms(u32::MAX, 0.0), 30_000);
        assert_eq!(backoff_ms(0, 1.0), 400);
        assert_eq!(backoff_ms(10, 1.0), 24_000);
        assert_eq!(backoff_ms(1, 0.5), 900);
        assert_eq!(backoff_ms(1, 7.0), 800);
        assert_eq!(backoff_ms(1, -1.0), 1000);
        assert_eq!(backoff_ms(1, f64::NAN), 1000);
        // The bound the docs state: the waits before giving up add up to about 15 s.
        let waits: u64 = (0..MAX_ATTEMPTS_WITHOUT_PROGRESS - 1).map(|a| backoff_ms(a, 0.0)).sum();
        assert_eq!(waits, 15_500);
    }

    #[test]
    fn content_range() {
        assert_eq!(parse_content_range("bytes 0-99/1000").unwrap(), (0, 99, Some(1000)));
        assert_eq!(parse_content_range("bytes 100-999/*").unwrap(), (100, 999, None));
        assert_eq!(parse_content_range(" Bytes 5-5/6 ").unwrap(), (5, 5, Some(6)));
        let big = "bytes 1900000000-1999999999/2000000000";
        assert_eq!(parse_content_range(big).unwrap(), (1_900_000_000, 1_999_999_999, Some(2_000_000_000)));
        for bad in [
            "",
            "bytes",
            "bytes */1000",
            "bytes 5-4/10",
            "bytes 0-10/10",
            "bytes -5/10",
            "bytes 0-/10",
            "bytes 0-9",
            "bytes +1-9/10",
            "bytes 0-9/x",
            "items 0-9/10",
            "bytes 99999999999999999999-1/*",
        ] {
            assert!(matches!(parse_content_range(bad), Err(HubError::ContentRange { .. })), "{bad:?}");
        }
        assert!(range_matches("bytes 512-1023/1024", 512));
        assert!(!range_matches("bytes 0-1023/1024", 512));
        assert!(!range_matches("garbage", 0));
    }

    #[test]
    fn storage() {
        check_space(100, 0, 100).unwrap();
        check_space(0, 200, 100).unwrap();
        assert_eq!(
            check_space(6_520_000_000, 8_800_000_000, 10_000_000_000).unwrap_err().to_string(),
            "not enough storage: the pack needs 6.52 GB more, 1.20 GB is free (quota 10.00 GB). Free space \
             on the disk, then install again."
        );
        assert!(check_space(1, 200, 100).is_err());
        assert_eq!(format_bytes(0), "0 bytes");
        assert_eq!(format_bytes(1), "1 byte");
        assert_eq!(format_bytes(999), "999 bytes");
        assert_eq!(format_bytes(4_100), "4.1 KB");
        assert_eq!(format_bytes(12_345_678), "12.3 MB");
        assert_eq!(format_bytes(999_999_999), "1.00 GB");
        assert_eq!(format_bytes(999_999), "1.0 MB");
        assert_eq!(format_bytes(1_000_000_000), "1.00 GB");
        assert_eq!(format_bytes(6_524_000_000), "6.52 GB");
    }
}
