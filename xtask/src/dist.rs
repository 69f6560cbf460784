//! `cargo xtask dist`: the store-ready zip of the release build (`target/imagine-<version>.zip`).
//!
//! The zip holds exactly what `build` put into dist/ (manifest.json at its root), with fixed dates
//! and permissions and in sorted order, so the same dist/ always gives the same bytes. Before and
//! after writing it, [`check_package`] checks the contents: the manifest, the four icon sizes, every
//! file the manifest, the pages and the wasm code load, and no test files.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipArchive, ZipWriter};

use crate::Result;

/// The icon sizes the Chrome Web Store and the toolbar use; manifest.json names each under
/// `icons` and `action.default_icon`.
pub const ICON_SIZES: [u32; 4] = [16, 32, 48, 128];

/// Files the code loads by name (the wasm module creates the workers, opens the offscreen
/// document and the result page, fetches the tokenizer; the shims import the bindings and ORT).
const LOADED_BY_NAME: &[&str] = &[
    "offscreen.html",
    "result.html",
    "popup.html",
    "studio.html",
    "stage-worker.js",
    "download-worker.js",
    "hash-worker.js",
    "pkg/imagine_web.js",
    "pkg/imagine_web_bg.wasm",
    "ort/ort.jspi.bundle.min.mjs",
    "ort/ort-wasm-simd-threaded.jspi.wasm",
    "tokenizer/tokenizer.json.gz",
    "tokenizer/tokenizer_config.json",
];

/// Writes the zip of `dist_dir` to `target/` ([`Browser::zip_name`]), reads it back and checks it.
/// Returns its path.
pub fn write_dist_zip(root: &Path, dist_dir: &Path, browser: Browser) -> Result<PathBuf> {
    let files = package_files(dist_dir)?;
    let read_dir_file = |p: &str| fs::read(dist_dir.join(p)).map_err(|e| format!("dist/{p}: {e}"));
    let problems = check_package(&files, &read_dir_file)?;
    if !problems.is_empty() {
        return Err(format!("dist/ is not a complete extension:\n  {}", problems.join("\n  ")));
    }
    let manifest: serde_json::Value = serde_json::from_slice(&read_dir_file("manifest.json")?)
        .map_err(|e| format!("dist/manifest.json: {e}"))?;
    let version =
        manifest.get("version").and_then(|v| v.as_str()).ok_or("dist/manifest.json has no \"version\"")?;
    let out = root.join("target").join(browser.zip_name(version));
    fs::create_dir_all(root.join("target")).map_err(|e| format!("mkdir target: {e}"))?;
    write_zip(dist_dir, &files, &out)?;

    // Check what a user gets: the zip as written.
    let contents = read_zip(&out)?;
    let names: Vec<String> = contents.keys().cloned().collect();
    if names != files {
        return Err(format!("{} does not hold the files of dist/", out.display()));
    }
    let read_zip_file = |p: &str| contents.get(p).cloned().ok_or_else(|| format!("{p} is not in the zip"));
    let problems = check_package(&names, &read_zip_file)?;
    if !problems.is_empty() {
        return Err(format!("{} is not a complete extension:\n  {}", out.display(), problems.join("\n  ")));
    }
    Ok(out)
}

/// The browser a build is for: one set of pages and one wasm module, a manifest each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Browser {
    Chrome,
    Firefox,
}

/// The Firefox add-on's id (`browser_specific_settings.gecko.id`): what Firefox keys its storage and
/// permissions by, so it never changes.
pub const FIREFOX_ID: &str = "imagine@imagine-extension.org";

/// The first Firefox with WebGPU on by default (on Windows).
pub const FIREFOX_MIN_VERSION: &str = "141.0";

impl Browser {
    pub fn parse(name: &str) -> Result<Browser> {
        match name {
            "chrome" | "chromium" => Ok(Browser::Chrome),
            "firefox" => Ok(Browser::Firefox),
            other => Err(format!("--browser {other}: not a browser Imagine builds for (chrome, firefox)")),
        }
    }

    /// Where `cargo xtask build` puts this browser's extension.
    pub fn dist_dir(self) -> &'static str {
        match self {
            Browser::Chrome => "dist",
            Browser::Firefox => "dist-firefox",
        }
    }

    /// The store zip's name for `version`.
    pub fn zip_name(self, version: &str) -> String {
        match self {
            Browser::Chrome => format!("imagine-{version}.zip"),
            Browser::Firefox => format!("imagine-{version}-firefox.zip"),
        }
    }

    /// The manifest for this browser, from the repository's (Chrome's). Firefox's background is an event
    /// page running the same `sw.js` (it has no extension service workers), which opens the offscreen
    /// document as an iframe (it has no `offscreen` API); the studio is its sidebar rather than a side
    /// panel; it wants an id of its own and no Chrome-only keys.
    pub fn manifest(self, chrome: &serde_json::Value) -> Result<serde_json::Value> {
        let mut m = chrome.clone();
        if self == Browser::Chrome {
            return Ok(m);
        }
        let object = m.as_object_mut().ok_or("manifest.json is not an object")?;
        object.remove("minimum_chrome_version");
        let background = object.remove("background").ok_or("manifest.json has no background")?;
        let script = background
            .get("service_worker")
            .cloned()
            .ok_or("manifest.json has no background.service_worker")?;
        object.insert("background".into(), serde_json::json!({ "scripts": [script], "type": "module" }));
        if let Some(panel) = object.remove("side_panel") {
            let page =
                panel.get("default_path").cloned().ok_or("manifest.json side_panel has no default_path")?;
            let mut sidebar = serde_json::json!({ "default_panel": page, "open_at_install": false });
            for (from, to) in
                [("/action/default_title", "default_title"), ("/action/default_icon", "default_icon")]
            {
                if let Some(value) = chrome.pointer(from) {
                    sidebar[to] = value.clone();
                }
            }
            object.insert("sidebar_action".into(), sidebar);
        }
        // The background page holds the offscreen document in a frame: the extension's pages may be
        // framed by its own pages, and by nothing else (in Chrome by nothing at all).
        if let Some(csp) =
            object.get_mut("content_security_policy").and_then(|c| c.get_mut("extension_pages"))
        {
            let policy =
                csp.as_str().unwrap_or_default().replace("frame-ancestors 'none'", "frame-ancestors 'self'");
            *csp = policy.into();
        }
        if let Some(permissions) = object.get_mut("permissions").and_then(|p| p.as_array_mut()) {
            permissions.retain(|p| !matches!(p.as_str(), Some("offscreen" | "sidePanel")));
        }
        object.insert(
            "browser_specific_settings".into(),
            // Nothing the user types or makes leaves the machine: Firefox asks add-ons to say so.
            serde_json::json!({ "gecko": {
                "id": FIREFOX_ID,
                "strict_min_version": FIREFOX_MIN_VERSION,
                "data_collection_permissions": { "required": ["none"] },
            } }),
        );
        Ok(m)
    }
}

/// Every file under `dir`, as sorted `/`-separated relative paths.
pub fn package_files(dir: &Path) -> Result<Vec<String>> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) -> Result {
        let rd = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for e in rd {
            let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
            let p = e.path();
            let kind = e.file_type().map_err(|e| format!("{}: {e}", p.display()))?;
            if kind.is_dir() {
                walk(base, &p, out)?;
            } else {
                let rel = p.strip_prefix(base).map_err(|e| e.to_string())?;
                let parts: Vec<String> =
                    rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
                out.push(parts.join("/"));
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(dir, dir, &mut files)?;
    files.sort();
    Ok(files)
}

/// What is wrong with a package holding `files` (empty: nothing); `read` gives a file's bytes.
pub fn check_package(files: &[String], read: &dyn Fn(&str) -> Result<Vec<u8>>) -> Result<Vec<String>> {
    let present: BTreeSet<&str> = files.iter().map(String::as_str).collect();
    let mut problems = Vec::new();
    for f in files {
        if is_test_file(f) {
            problems.push(format!("{f} is a test file"));
        }
    }
    if !present.contains("manifest.json") {
        problems.push("manifest.json is missing".into());
        return Ok(problems);
    }
    let manifest: serde_json::Value =
        serde_json::from_slice(&read("manifest.json")?).map_err(|e| format!("manifest.json: {e}"))?;
    for (key, icons) in
        [("icons", manifest.get("icons")), ("action.default_icon", manifest.pointer("/action/default_icon"))]
    {
        for size in ICON_SIZES {
            if icons.and_then(|i| i.get(size.to_string())).and_then(|p| p.as_str()).is_none() {
                problems.push(format!("manifest.json {key} has no {size} px icon"));
            }
        }
    }
    // (file, who names it)
    let mut named: Vec<(String, String)> =
        manifest_files(&manifest).into_iter().map(|p| (p, "manifest.json".to_string())).collect();
    named.extend(LOADED_BY_NAME.iter().map(|f| (f.to_string(), "the extension's code".to_string())));
    if let Some(locale) = manifest.get("default_locale").and_then(|l| l.as_str()) {
        named.push((format!("_locales/{locale}/messages.json"), "manifest.json default_locale".to_string()));
    }
    for f in files.iter().filter(|f| scans_references(f)) {
        let text = String::from_utf8_lossy(&read(f)?).into_owned();
        named.extend(references(&text).iter().map(|r| (resolve(f, r), f.clone())));
    }
    let wanted: BTreeSet<&str> = named.iter().map(|(p, _)| p.as_str()).collect();
    for w in wanted {
        if !present.contains(w) {
            let by: BTreeSet<&str> = named.iter().filter(|(p, _)| p == w).map(|(_, b)| b.as_str()).collect();
            problems
                .push(format!("{w} is missing (named by {})", by.into_iter().collect::<Vec<_>>().join(", ")));
        }
    }
    Ok(problems)
}

fn is_test_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    path.split('/').any(|c| c == "tests" || c == "test" || c == "e2e")
        || name.contains(".test.")
        || name.contains(".spec.")
}

/// The extension files manifest.json names (globs and URLs are skipped).
fn manifest_files(m: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut push = |v: Option<&serde_json::Value>| {
        match v {
            Some(serde_json::Value::String(s)) => out.push(s.clone()),
            Some(serde_json::Value::Object(o)) => {
                out.extend(o.values().filter_map(|x| x.as_str()).map(str::to_string))
            }
            Some(serde_json::Value::Array(a)) => {
                out.extend(a.iter().filter_map(|x| x.as_str()).map(str::to_string))
            }
            _ => {}
        };
    };
    for ptr in [
        "/icons",
        "/action/default_icon",
        "/action/default_popup",
        "/background/service_worker",
        "/background/scripts",
        "/sidebar_action/default_panel",
        "/sidebar_action/default_icon",
        "/options_page",
        "/options_ui/page",
        "/side_panel/default_path",
        "/devtools_page",
        "/chrome_url_overrides",
    ] {
        push(m.pointer(ptr));
    }
    for cs in m.get("content_scripts").and_then(|c| c.as_array()).into_iter().flatten() {
        push(cs.get("js"));
        push(cs.get("css"));
    }
    out.into_iter()
        .map(|p| p.trim_start_matches('/').to_string())
        .filter(|p| !p.contains('*') && !p.contains("://"))
        .collect()
}

/// Our own pages and scripts (not the vendored ORT bundle, whose strings name files we do not ship
/// on purpose).
fn scans_references(path: &str) -> bool {
    (path.ends_with(".html") || path.ends_with(".js") || path.ends_with(".css")) && !path.starts_with("ort/")
}

/// Relative file references in a page or script: `src="…"`, `href="…"`, `from '…'`, `import('…')`,
/// `new URL('…'`, `url(…)` whose target starts with `./`, `../` or is a bare file name with an
/// extension (HTML attributes only).
fn references(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (prefix, bare_ok) in
        [("src=", true), ("href=", true), ("from ", false), ("import(", false), ("new URL(", false)]
    {
        let mut rest = text;
        while let Some(i) = rest.find(prefix) {
            rest = &rest[i + prefix.len()..];
            let Some(q) = rest.chars().next().filter(|c| matches!(c, '"' | '\'' | '`')) else {
                continue;
            };
            let Some(end) = rest[1..].find(q) else { continue };
            let r = &rest[1..1 + end];
            let relative = r.starts_with("./") || r.starts_with("../");
            let bare =
                bare_ok && !r.contains(':') && !r.starts_with('/') && !r.starts_with('#') && r.contains('.');
            if (relative || bare) && !r.contains('$') && !r.contains('{') {
                out.push(r.split(['?', '#']).next().unwrap_or(r).to_string());
            }
        }
    }
    out
}

/// `r` relative to the file `from` (both inside the package).
fn resolve(from: &str, r: &str) -> String {
    let mut parts: Vec<&str> = from.split('/').collect();
    parts.pop();
    for c in r.split('/') {
        match c {
            "." | "" => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    parts.join("/")
}

fn write_zip(dir: &Path, files: &[String], out: &Path) -> Result {
    let tmp = out.with_extension("zip.part");
    let file = fs::File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mut zip = ZipWriter::new(file);
    let options = SimpleFileOptions::default()
        .compression_method(CompressionMethod::Deflated)
        .last_modified_time(DateTime::default())
        .unix_permissions(0o644);
    for f in files {
        let bytes = fs::read(dir.join(f)).map_err(|e| format!("dist/{f}: {e}"))?;
        zip.start_file(f.as_str(), options).map_err(|e| format!("zip {f}: {e}"))?;
        zip.write_all(&bytes).map_err(|e| format!("zip {f}: {e}"))?;
    }
    zip.finish().map_err(|e| format!("{}: {e}", tmp.display()))?;
    fs::rename(&tmp, out).map_err(|e| format!("{} -> {}: {e}", tmp.display(), out.display()))
}

/// The files in a zip: name -> contents (sorted by name).
pub fn read_zip(path: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let file = fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut zip = ZipArchive::new(file).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut contents = BTreeMap::new();
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| format!("{}: entry {i}: {e}", path.display()))?;
        if entry.is_dir() {
            continue;
        }
        let name = entry.name().map_err(|e| format!("{}: entry {i}: {e}", path.display()))?.to_string();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(|e| format!("{}: {name}: {e}", path.display()))?;
        contents.insert(name, bytes);
    }
    Ok(contents)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn repo_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
    }

    /// What `build` puts into dist/ from the repository (manifest, icons, extension/), with the
    /// generated files (bindings, ORT, tokenizer) as placeholders.
    fn package_from_sources() -> HashMap<String, Vec<u8>> {
        let root = repo_root();
        let mut files = HashMap::new();
        files.insert("manifest.json".to_string(), fs::read(root.join("manifest.json")).unwrap());
        for (dir, prefix) in [("icons", "icons/"), ("extension", "")] {
            for f in package_files(&root.join(dir)).unwrap() {
                files.insert(format!("{prefix}{f}"), fs::read(root.join(dir).join(&f)).unwrap());
            }
        }
        for f in LOADED_BY_NAME {
            files.entry(f.to_string()).or_insert_with(|| b"generated".to_vec());
        }
        files
    }

    fn check(files: &HashMap<String, Vec<u8>>) -> Vec<String> {
        let mut names: Vec<String> = files.keys().cloned().collect();
        names.sort();
        check_package(&names, &|p: &str| files.get(p).cloned().ok_or_else(|| format!("{p} missing"))).unwrap()
    }

    #[test]
    fn the_repository_makes_a_complete_package() {
        assert_eq!(check(&package_from_sources()), Vec::<String>::new());
    }

    fn firefox_manifest() -> serde_json::Value {
        let chrome = serde_json::from_slice(&fs::read(repo_root().join("manifest.json")).unwrap()).unwrap();
        Browser::Firefox.manifest(&chrome).unwrap()
    }

    #[test]
    fn the_firefox_manifest_runs_the_same_background_as_an_event_page_with_the_studio_as_its_sidebar() {
        let m = firefox_manifest();
        assert_eq!(m["background"], serde_json::json!({ "scripts": ["sw.js"], "type": "module" }));
        assert_eq!(m["sidebar_action"]["default_panel"], "studio.html");
        assert!(m.get("side_panel").is_none() && m.get("minimum_chrome_version").is_none());
        let permissions: Vec<&str> =
            m["permissions"].as_array().unwrap().iter().filter_map(|p| p.as_str()).collect();
        assert!(
            !permissions.contains(&"offscreen") && !permissions.contains(&"sidePanel"),
            "{permissions:?}"
        );
        assert!(permissions.contains(&"storage") && permissions.contains(&"contextMenus"), "{permissions:?}");
        let gecko = &m["browser_specific_settings"]["gecko"];
        assert_eq!(gecko["id"], FIREFOX_ID);
        assert_eq!(gecko["data_collection_permissions"]["required"], serde_json::json!(["none"]));
        // The offscreen document is a frame of the background page: framed by the extension's own
        // pages only, and nothing else of the policy loosened.
        let chrome_csp = serde_json::from_slice::<serde_json::Value>(
            &fs::read(repo_root().join("manifest.json")).unwrap(),
        )
        .unwrap()["content_security_policy"]["extension_pages"]
            .as_str()
            .unwrap()
            .replace("frame-ancestors 'none'", "frame-ancestors 'self'");
        assert_eq!(m["content_security_policy"]["extension_pages"], chrome_csp.as_str());
        assert!(chrome_csp.contains("frame-ancestors 'self'"), "{chrome_csp}");
    }

    #[test]
    fn the_firefox_package_is_complete_with_its_own_manifest() {
        let mut files = package_from_sources();
        files.insert("manifest.json".into(), serde_json::to_vec(&firefox_manifest()).unwrap());
        assert_eq!(check(&files), Vec::<String>::new());
        files.remove("sw.js");
        assert_eq!(check(&files), vec!["sw.js is missing (named by manifest.json)".to_string()]);
    }

    #[test]
    fn the_chrome_manifest_is_the_repository_s() {
        let chrome: serde_json::Value =
            serde_json::from_slice(&fs::read(repo_root().join("manifest.json")).unwrap()).unwrap();
        assert_eq!(Browser::Chrome.manifest(&chrome).unwrap(), chrome);
        assert_eq!(Browser::parse("firefox").unwrap(), Browser::Firefox);
        assert!(Browser::parse("safari").unwrap_err().contains("chrome, firefox"));
    }

    #[test]
    fn the_manifest_names_four_icon_sizes_that_exist() {
        let files = package_from_sources();
        for size in ICON_SIZES {
            let icon = format!("icons/icon{size}.png");
            let png = files.get(&icon).unwrap_or_else(|| panic!("{icon} missing"));
            // PNG signature, then IHDR: width and height are big-endian u32 at bytes 16 and 20.
            assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{icon}");
            let w = u32::from_be_bytes(png[16..20].try_into().unwrap());
            let h = u32::from_be_bytes(png[20..24].try_into().unwrap());
            assert_eq!((w, h), (size, size), "{icon}");
        }
    }

    #[test]
    fn missing_files_test_files_and_icons_are_reported() {
        let mut files = package_from_sources();
        files.remove("icons/icon32.png");
        files.remove("pkg/imagine_web_bg.wasm");
        files.remove("style.css");
        files.insert("tests/e2e/pages/popup.test.mjs".into(), b"test".to_vec());
        let problems = check(&files);
        assert!(
            problems.contains(&"tests/e2e/pages/popup.test.mjs is a test file".to_string()),
            "{problems:?}"
        );
        assert!(problems
            .iter()
            .any(|p| p.starts_with("icons/icon32.png is missing (named by manifest.json")));
        assert!(problems.iter().any(|p| p.starts_with("pkg/imagine_web_bg.wasm is missing")));
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("style.css is missing (named by ") && p.contains("popup.html")),
            "{problems:?}"
        );
        assert_eq!(problems.len(), 4, "{problems:?}");

        let mut files = package_from_sources();
        files.remove("manifest.json");
        assert_eq!(check(&files), vec!["manifest.json is missing".to_string()]);
    }

    #[test]
    fn a_manifest_without_the_32_px_icon_is_refused() {
        let mut files = package_from_sources();
        let m = String::from_utf8(files["manifest.json"].clone()).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&m).unwrap();
        v["icons"].as_object_mut().unwrap().remove("32");
        files.insert("manifest.json".into(), serde_json::to_vec(&v).unwrap());
        assert_eq!(check(&files), vec!["manifest.json icons has no 32 px icon".to_string()]);
    }

    #[test]
    fn references_are_found_and_resolved() {
        let js = "import init from './pkg/a.js';\nconst u = new URL('./pkg/b.wasm', import.meta.url);\n\
                  const x = import(\"../c.mjs\");";
        assert_eq!(references(js), vec!["./pkg/a.js", "../c.mjs", "./pkg/b.wasm"]);
        let html = "<link href=\"style.css\"><script src=\"popup.js?v=1\"></script><a href=\"https://x.y/\">";
        assert_eq!(references(html), vec!["popup.js", "style.css"]);
        assert_eq!(resolve("popup.html", "./pkg/a.js"), "pkg/a.js");
        assert_eq!(resolve("pkg/x.js", "../ort/y.mjs"), "ort/y.mjs");
    }

    #[test]
    fn a_zip_round_trips_sorted_with_fixed_dates() {
        let dir = std::env::temp_dir().join(format!("imagine-dist-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("src/sub")).unwrap();
        fs::write(dir.join("src/b.txt"), b"bbb").unwrap();
        fs::write(dir.join("src/sub/a.txt"), b"a").unwrap();
        let files = package_files(&dir.join("src")).unwrap();
        assert_eq!(files, vec!["b.txt", "sub/a.txt"]);
        write_zip(&dir.join("src"), &files, &dir.join("one.zip")).unwrap();
        write_zip(&dir.join("src"), &files, &dir.join("two.zip")).unwrap();
        let contents = read_zip(&dir.join("one.zip")).unwrap();
        assert_eq!(contents.keys().collect::<Vec<_>>(), files.iter().collect::<Vec<_>>());
        assert_eq!(contents["sub/a.txt"], b"a");
        assert_eq!(fs::read(dir.join("one.zip")).unwrap(), fs::read(dir.join("two.zip")).unwrap());
        fs::remove_dir_all(&dir).unwrap();
    }
}
