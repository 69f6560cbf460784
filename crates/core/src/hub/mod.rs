//! Downloading a pack from a Hugging Face Hub: the logic, without the network or the disk.
//!
//! The pack worker (web side) does the I/O: it resolves the revision to a commit
//! ([`revision_url`], [`parse_revision`]), lists the files at that commit ([`tree_url`],
//! [`parse_tree`]), downloads the three small graph files (and their shard manifests) first
//! ([`graph_files`], [`verify_small`]), derives the full file list from them ([`plan`](fn@plan)), checks
//! storage ([`check_space`]), and then streams every file into OPFS with `Range` requests ([`resolve_url`],
//! [`parse_content_range`], [`backoff_ms`]), hashing as it writes ([`ResumableSha256`]) and persisting
//! its position ([`DownloadRecord`]) so that a download survives a closed browser.
//!
//! Everything is pinned to one commit: a download record made for another commit (or another
//! source, or another file list) does not [`DownloadRecord::matches`] the new plan, and its partial
//! files are discarded, so an installed pack is never a mix of two revisions.
//!
//! Names from the Hub become OPFS paths and URL segments, so each one passes
//! [`validate_relative_path`](crate::pack::validate_relative_path) and is percent-encoded in URLs.

mod error;
mod json;
mod plan;
mod rate;
mod record;
mod sha256;
mod source;
mod transfer;
mod verify;

pub use error::HubError;
pub use json::{
    next_page, parse_revision, parse_tree, parse_tree_pages, MAX_FILE_SIZE, MAX_LISTING_BYTES, MAX_TREE_PAGES,
};
pub use plan::{graph_files, plan, GraphFiles, MAX_GRAPH_BYTES, MAX_MANIFEST_BYTES};
pub use rate::RateMeter;
pub use record::{DownloadRecord, FileRecord};
pub use sha256::{HashCheckpoint, ResumableSha256};
pub use source::{
    check_redirect, resolve_url, revision_url, tree_url, unused_host_permissions, SourceRule,
    MAX_REVISION_LEN,
};
pub use transfer::{
    backoff_ms, check_space, format_bytes, parse_content_range, range_ends_early, range_matches,
    MAX_ATTEMPTS_WITHOUT_PROGRESS,
};
pub use verify::{git_blob_oid, hex, verify_git_oid, verify_sha256, verify_small, GitBlobHasher};
