//! Hub JSON: the revision and file-list responses of the Hub API, parsed and checked.

use serde::Deserialize;

use super::HubError;
use crate::api::PackFile;
use crate::pack::{validate_relative_path, PackError};

/// The largest file size accepted from a listing. The real pack's largest shard is under 2 GB; a
/// larger size is a broken listing, not a file to make room for.
pub const MAX_FILE_SIZE: u64 = 64 << 30;

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[derive(Deserialize)]
struct Revision {
    sha: String,
}

/// The commit (40 lowercase hex) from the body of [`revision_url`](super::revision_url)
/// (`{"sha": "…", …}`).
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

/// The most bytes a file list may hold, all its pages together (they are all held before they are
/// parsed). A pack's repo lists a few dozen files in a few kB; the Hub sends about 300 bytes a file.
pub const MAX_LISTING_BYTES: u64 = 16 << 20;

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

/// The files of the body of [`tree_url`](super::tree_url): an array of
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
    let mut seen = std::collections::HashSet::new();
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
        if !seen.insert(file.path.clone()) {
            return refuse("it is listed twice".into());
        }
        files.push(file);
    }
    Ok(files)
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
}
