//! Why a pack cannot be planned, downloaded or verified: [`HubError`].

use thiserror::Error;

use super::format_bytes;
use super::SourceRule;
use crate::message::{arg, cause, number, quoted, Localize, Message};
use crate::pack::PackError;

/// Why a pack cannot be planned, downloaded or verified. Each message names what was wrong (field,
/// value, file, commit) and, where the user can act, what to do.
#[derive(Debug, Error)]
pub enum HubError {
    /// A field of [`PackSource`](crate::api::PackSource) that cannot be used.
    #[error("the {field} {value:?} is not allowed: {reason}")]
    Source {
        /// `endpoint`, `repo` or `revision`.
        field: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong and what is allowed.
        reason: SourceRule,
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
    /// The listing gives neither a SHA-256 nor a git blob id for a file the pack needs, so it could not
    /// be verified.
    #[error(
        "the Hub lists no SHA-256 or git blob id for {file}, so it cannot be verified; the download stopped"
    )]
    Unverifiable {
        /// The file.
        file: String,
    },
    /// [`plan`](fn@super::plan) was not given the bytes it needs (a bug in the caller, not in the pack).
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
    /// A graph or manifest listed larger than any pack's: these are read whole into memory to plan, so
    /// they are refused before a byte is fetched.
    #[error(
        "the Hub lists {file} at {}, over the {} allowed for a pack's graph or manifest (the published \
         pack's are a few MB), so it was not downloaded",
        format_bytes(*size),
        format_bytes(*cap)
    )]
    TooLargeToRead {
        /// The graph or manifest.
        file: String,
        /// Its size in the listing.
        size: u64,
        /// The most accepted for such a file.
        cap: u64,
    },
    /// A file the pack needs in a sub-folder of the repo: the pack is stored flat, so it is refused when
    /// planning rather than failing when written.
    #[error("{needed_by} names {file}, which is in a sub-folder: a pack's files must all be at the top of the repo")]
    SubFolder {
        /// The file as named.
        file: String,
        /// The graph or manifest that names it.
        needed_by: String,
    },
    /// A request redirected to an address the download does not follow.
    #[error(
        "{url} redirected to {to}, which is refused: only https:// addresses are followed, or http:// on \
         this machine (localhost, 127.0.0.1, [::1])"
    )]
    Redirect {
        /// The address asked for.
        url: String,
        /// Where it was redirected to.
        to: String,
    },
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

impl Localize for HubError {
    fn message(&self) -> Message {
        match self {
            HubError::Source { field, value, reason } => {
                Message::new("errHubSource", [arg(field), quoted(value), cause(reason)])
            }
            HubError::Response { what, reason } => Message::new("errHubResponse", [arg(what), arg(reason)]),
            HubError::Entry { path, reason } => Message::new("errHubEntry", [quoted(path), arg(reason)]),
            HubError::MissingGraph { repo, file, commit } => {
                Message::new("errHubMissingGraph", [arg(repo), arg(file), arg(commit)])
            }
            HubError::MissingFile { repo, file, needed_by, commit } => {
                Message::new("errHubMissingFile", [arg(repo), arg(commit), arg(file), arg(needed_by)])
            }
            HubError::Unverifiable { file } => Message::new("errHubUnverifiable", [arg(file)]),
            HubError::GraphBytes { file, reason } => {
                Message::new("errHubGraphBytes", [arg(file), arg(reason)])
            }
            HubError::PackFile { file, error } => Message::new("errFileDetail", [arg(file), cause(error)]),
            HubError::Pack(error) => error.message(),
            HubError::TooLargeToRead { file, size, cap } => Message::new(
                "errHubTooLargeToRead",
                [arg(file), number(format_bytes(*size)), number(format_bytes(*cap))],
            ),
            HubError::SubFolder { file, needed_by } => {
                Message::new("errHubSubFolder", [arg(needed_by), arg(file)])
            }
            HubError::Redirect { url, to } => Message::new("errHubRedirect", [arg(url), arg(to)]),
            HubError::Size { path, expected, actual } => {
                Message::new("errHubSize", [arg(path), arg(actual), arg(expected)])
            }
            HubError::Hash { path, algorithm, expected, actual } => {
                Message::new("errHubHash", [arg(path), arg(algorithm), arg(actual), arg(expected)])
            }
            HubError::Checkpoint { offset, reason } => {
                Message::new("errHubCheckpoint", [arg(offset), arg(reason)])
            }
            HubError::ContentRange { header, reason } => {
                Message::new("errHubContentRange", [quoted(header), arg(reason)])
            }
            HubError::Space { needed, free, quota } => Message::new(
                "errHubSpace",
                [number(format_bytes(*needed)), number(format_bytes(*free)), number(format_bytes(*quota))],
            ),
        }
    }
}
