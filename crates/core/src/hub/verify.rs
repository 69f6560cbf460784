//! Verification: size, SHA-256 and git blob id of downloaded files against the listing.

use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::HubError;
use crate::api::PackFile;

/// Lowercase hex of a digest.
pub fn hex(bytes: &[u8; 32]) -> String {
    hex_of(bytes)
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The git blob id of `bytes`: SHA-1 of `"blob {len}\0"` followed by the bytes, lowercase hex.
pub fn git_blob_oid(bytes: &[u8]) -> String {
    let mut hasher = GitBlobHasher::new(bytes.len() as u64);
    hasher.update(bytes);
    hasher.finalize()
}

/// The git blob id of a file of known size fed in pieces (a streamed file read back from disk).
pub struct GitBlobHasher(Sha1);

impl GitBlobHasher {
    /// For a file of `size` bytes (the size is part of what git hashes).
    pub fn new(size: u64) -> Self {
        let mut sha1 = Sha1::new();
        sha1.update(format!("blob {size}\0").as_bytes());
        GitBlobHasher(sha1)
    }

    /// Hashes the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The blob id, lowercase hex.
    pub fn finalize(self) -> String {
        hex_of(&self.0.finalize())
    }
}

/// Checks a file's git blob id (computed with [`GitBlobHasher`]) against the listing's `oid`. A file
/// without a listed git blob id passes.
pub fn verify_git_oid(file: &PackFile, actual: &str) -> Result<(), HubError> {
    match &file.git_oid {
        Some(expected) if expected != actual => Err(HubError::Hash {
            path: file.path.clone(),
            algorithm: "git blob SHA-1",
            expected: expected.clone(),
            actual: actual.to_owned(),
        }),
        _ => Ok(()),
    }
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
    verify_git_oid(file, &git_blob_oid(bytes))
}

/// Checks the SHA-256 of a streamed file
/// ([`ResumableSha256::finalize`](super::ResumableSha256::finalize)) against the listing. A file
/// without a listed SHA-256 passes (check its size separately).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(data: &[u8]) -> [u8; 32] {
        Sha256::digest(data).into()
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
}
