//! Source validation and URLs: a [`PackSource`] checked and normalized, and the Hub URLs built from it.

use super::HubError;
use crate::api::PackSource;
use crate::message::{arg, Localize, Message};

/// The rule a source field breaks (the `reason` of [`HubError::Source`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[allow(missing_docs)] // each variant's `#[error]` text says it
pub enum SourceRule {
    #[error("it must start with https:// or http://")]
    Scheme,
    #[error("it must not contain whitespace or control characters")]
    Whitespace,
    #[error("it must not have a query (?) or a fragment (#)")]
    Query,
    #[error("it must not contain credentials (user@host)")]
    Credentials,
    #[error("it has no host")]
    NoHost,
    #[error("its host may only contain letters, digits, '.', '-', '_', ':' and IPv6 brackets")]
    HostChars,
    #[error("its path must not contain '.' or '..' segments")]
    DotSegments,
    #[error("http:// is allowed only for a Hub on this machine (localhost, 127.0.0.1, [::1]): use https://")]
    HttpNotLoopback,
    #[error("it must be owner/name")]
    NotOwnerName,
    #[error("it must be owner/name, both non-empty")]
    EmptyPart,
    #[error("owner and name must each start with a letter or digit")]
    PartStart,
    #[error("it must be owner/name, each of letters, digits, '.', '_' and '-'")]
    PartChars,
    #[error("it must not contain '..'")]
    DotDot,
    #[error("it must be a branch, tag or commit, not empty")]
    EmptyRevision,
    #[error("it must be at most {MAX_REVISION_LEN} characters")]
    TooLong,
    #[error("it must not start with '/'")]
    LeadingSlash,
}

impl SourceRule {
    /// Every rule, for tests.
    pub const ALL: [SourceRule; 16] = [
        SourceRule::Scheme,
        SourceRule::Whitespace,
        SourceRule::Query,
        SourceRule::Credentials,
        SourceRule::NoHost,
        SourceRule::HostChars,
        SourceRule::DotSegments,
        SourceRule::HttpNotLoopback,
        SourceRule::NotOwnerName,
        SourceRule::EmptyPart,
        SourceRule::PartStart,
        SourceRule::PartChars,
        SourceRule::DotDot,
        SourceRule::EmptyRevision,
        SourceRule::TooLong,
        SourceRule::LeadingSlash,
    ];
}

impl Localize for SourceRule {
    fn message(&self) -> Message {
        match self {
            SourceRule::TooLong => Message::new("errSourceTooLong", [arg(MAX_REVISION_LEN)]),
            SourceRule::Scheme => Message::new("errSourceScheme", []),
            SourceRule::Whitespace => Message::new("errSourceWhitespace", []),
            SourceRule::Query => Message::new("errSourceQuery", []),
            SourceRule::Credentials => Message::new("errSourceCredentials", []),
            SourceRule::NoHost => Message::new("errSourceNoHost", []),
            SourceRule::HostChars => Message::new("errSourceHostChars", []),
            SourceRule::DotSegments => Message::new("errSourceDotSegments", []),
            SourceRule::HttpNotLoopback => Message::new("errSourceHttpNotLoopback", []),
            SourceRule::NotOwnerName => Message::new("errSourceNotOwnerName", []),
            SourceRule::EmptyPart => Message::new("errSourceEmptyPart", []),
            SourceRule::PartStart => Message::new("errSourcePartStart", []),
            SourceRule::PartChars => Message::new("errSourcePartChars", []),
            SourceRule::DotDot => Message::new("errSourceDotDot", []),
            SourceRule::EmptyRevision => Message::new("errSourceEmptyRevision", []),
            SourceRule::LeadingSlash => Message::new("errSourceLeadingSlash", []),
        }
    }
}

/// Longest revision accepted (git allows longer ref names, the Hub's users do not write them).
pub const MAX_REVISION_LEN: usize = 256;

impl PackSource {
    /// The source with its fields checked and normalized: surrounding whitespace trimmed, the
    /// endpoint's scheme lowercased and trailing `/` removed. Only `https://` endpoints, or `http://`
    /// ones on this machine (loopback), without query, fragment or credentials; a repo `owner/name` with each part
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

impl PackSource {
    /// The host permission (a match pattern) that downloading from this source needs: its checked
    /// endpoint's scheme and host, any port, any path (`https://mirror.example/*`). `None` for the
    /// published pack's Hub, whose hosts the manifest grants, and for an endpoint that fails its check
    /// (asking for the raw field would ask for far more: `https://*` is every site).
    pub fn host_permission(&self) -> Option<String> {
        if self.endpoint.trim() == PackSource::default().endpoint {
            return None;
        }
        let endpoint = validate_endpoint(&self.endpoint).ok()?;
        let (scheme, rest) = endpoint.split_once("://")?;
        let authority = rest.split('/').next()?;
        let host = match authority.strip_prefix('[') {
            Some(bracketed) => format!("[{}]", bracketed.split_once(']')?.0),
            None => authority.split(':').next()?.to_owned(),
        };
        Some(format!("{scheme}://{}/*", host.to_ascii_lowercase()))
    }
}

/// The host permissions granted earlier that no source in use needs any more: all of `granted` but
/// those `in_use` and those the manifest grants for good (`required`).
pub fn unused_host_permissions(granted: &[String], in_use: &[String], required: &[String]) -> Vec<String> {
    granted.iter().filter(|origin| !in_use.contains(origin) && !required.contains(origin)).cloned().collect()
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
        return refuse(SourceRule::Scheme);
    };
    if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return refuse(SourceRule::Whitespace);
    }
    if v.contains('?') || v.contains('#') {
        return refuse(SourceRule::Query);
    }
    let rest = rest.trim_end_matches('/');
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    if authority.contains('@') {
        return refuse(SourceRule::Credentials);
    }
    if authority.is_empty() {
        return refuse(SourceRule::NoHost);
    }
    if !authority.chars().all(|c| c.is_ascii_alphanumeric() || ".-_:[]".contains(c)) {
        return refuse(SourceRule::HostChars);
    }
    if path.split('/').any(|s| s == ".." || s == ".") {
        return refuse(SourceRule::DotSegments);
    }
    if scheme == "http://" && !is_loopback(authority) {
        return refuse(SourceRule::HttpNotLoopback);
    }
    Ok(format!("{scheme}{rest}"))
}

/// Checks where a request to `url` ended up after the redirects the browser followed (`to`): only
/// `https://`, or `http://` on this machine, as for the endpoint itself. A redirect from the Hub to
/// plain HTTP elsewhere would hand the pack to anyone on the way.
pub fn check_redirect(url: &str, to: &str) -> Result<(), HubError> {
    let lower = to.to_ascii_lowercase();
    let allowed = lower.starts_with("https://")
        || lower.strip_prefix("http://").is_some_and(|rest| {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
            // Credentials, if any, come before the host.
            is_loopback(authority.rsplit('@').next().unwrap_or_default())
        });
    if allowed {
        return Ok(());
    }
    Err(HubError::Redirect { url: url.to_owned(), to: to.to_owned() })
}

/// Whether `authority` (host and optional port) names this machine: only there does plain HTTP not
/// expose the download to the network.
fn is_loopback(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']').map_or("", |(host, _)| host),
        None => authority.split(':').next().unwrap_or_default(),
    };
    let host = host.to_ascii_lowercase();
    host == "localhost"
        || host == "::1"
        || host.strip_prefix("127.").is_some_and(|rest| {
            let parts: Vec<&str> = rest.split('.').collect();
            parts.len() == 3 && parts.iter().all(|p| p.parse::<u8>().is_ok())
        })
}

fn validate_repo(value: &str) -> Result<String, HubError> {
    let refuse = |reason| Err(HubError::Source { field: "repo", value: value.to_owned(), reason });
    let v = value.trim();
    let Some((owner, name)) = v.split_once('/') else {
        return refuse(SourceRule::NotOwnerName);
    };
    for part in [owner, name] {
        let mut chars = part.chars();
        match chars.next() {
            None => return refuse(SourceRule::EmptyPart),
            Some(c) if !c.is_ascii_alphanumeric() => {
                return refuse(SourceRule::PartStart);
            }
            Some(_) => {}
        }
        if !chars.all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
            return refuse(SourceRule::PartChars);
        }
    }
    if v.contains("..") {
        return refuse(SourceRule::DotDot);
    }
    Ok(v.to_owned())
}

fn validate_revision(value: &str) -> Result<String, HubError> {
    let refuse = |reason| Err(HubError::Source { field: "revision", value: value.to_owned(), reason });
    let v = value.trim();
    if v.is_empty() {
        return refuse(SourceRule::EmptyRevision);
    }
    if v.chars().count() > MAX_REVISION_LEN {
        return refuse(SourceRule::TooLong);
    }
    if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return refuse(SourceRule::Whitespace);
    }
    if v.contains("..") {
        return refuse(SourceRule::DotDot);
    }
    if v.starts_with('/') {
        return refuse(SourceRule::LeadingSlash);
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

/// `GET` this to resolve the revision to a commit ([`parse_revision`](super::parse_revision)). `src`
/// must come from [`PackSource::validate`]. The revision is one URL segment, its `/` percent-encoded.
pub fn revision_url(src: &PackSource) -> String {
    format!("{}/api/models/{}/revision/{}", src.endpoint, src.repo, percent_encode(&src.revision, false))
}

/// `GET` this to list every file at `commit` ([`parse_tree`](super::parse_tree)). `src` must come
/// from [`PackSource::validate`]. The Hub pages long listings: the caller follows
/// [`next_page`](super::next_page) and reads the pages with [`parse_tree_pages`](super::parse_tree_pages).
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

#[cfg(test)]
mod tests {
    use super::*;

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
        for loopback in ["http://localhost", "http://LOCALHOST:80/hub", "http://127.1.2.3:8"] {
            assert!(src(loopback, "a/b", "v1").validate().is_ok(), "{loopback}");
        }
    }

    #[test]
    fn the_host_permission_is_the_checked_origin_and_unused_ones_go() {
        for (endpoint, permission) in [
            ("https://Mirror.Example:8443/hub/", Some("https://mirror.example/*")),
            ("http://127.0.0.1:5000", Some("http://127.0.0.1/*")),
            ("http://[::1]:8080/x", Some("http://[::1]/*")),
            ("https://*", None),
            ("https://*.example", None),
            ("http://mirror.example", None),
            ("https://huggingface.co", None),
        ] {
            assert_eq!(src(endpoint, "a/b", "v1").host_permission().as_deref(), permission, "{endpoint}");
        }
        let granted =
            ["https://a.example/*", "http://127.0.0.1/*", "https://huggingface.co/*"].map(String::from);
        let unused = unused_host_permissions(
            &granted,
            &["http://127.0.0.1/*".into()],
            &["https://huggingface.co/*".into()],
        );
        assert_eq!(unused, ["https://a.example/*"]);
    }

    #[test]
    fn plain_http_only_on_this_machine() {
        for remote in [
            "http://huggingface.co",
            "http://mirror.example:8080",
            "http://127.0.0.1.evil.example",
            "http://localhost.evil.example",
            "http://[::2]",
            "http://10.0.0.1",
        ] {
            let e = src(remote, "a/b", "v1").validate().unwrap_err();
            assert!(
                e.to_string().contains("http:// is allowed only for a Hub on this machine"),
                "{remote}: {e}"
            );
        }
    }

    #[test]
    fn redirects_only_to_https_or_to_this_machine() {
        let url = "https://huggingface.co/a/b/resolve/c/x.data";
        for to in [
            "https://cdn-lfs.hf.co/x?sig=1",
            "HTTPS://cas-bridge.xethub.hf.co/x",
            "http://127.0.0.1:8080/blobs/x",
            "http://localhost/x",
            "http://[::1]:9000/x?y=1",
        ] {
            assert!(check_redirect(url, to).is_ok(), "{to}");
        }
        for to in [
            "http://cdn.example/x",
            "http://127.0.0.1.evil.example/x",
            "http://localhost@evil.example/x",
            "ftp://cdn.example/x",
            "data:application/octet-stream,x",
            "file:///etc/passwd",
            "",
        ] {
            let e = check_redirect(url, to).unwrap_err();
            assert!(matches!(&e, HubError::Redirect { to: t, .. } if t == to), "{to}: {e:?}");
        }
        assert_eq!(
            check_redirect(url, "http://cdn.example/x").unwrap_err().to_string(),
            "https://huggingface.co/a/b/resolve/c/x.data redirected to http://cdn.example/x, which is \
             refused: only https:// addresses are followed, or http:// on this machine (localhost, \
             127.0.0.1, [::1])"
        );
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
}
