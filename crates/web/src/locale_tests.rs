//! The locale files against each other, against every key the code and pages use, and against
//! every error of the crate: each error's message in every locale says what its English text says,
//! and what a page shows of it outside "Details" holds no address and no browser's own words.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use imagine_core::message::{Arg, Localize, Message};

use crate::platform::i18n::{plain_key, sentence};

/// What a page shows of every sample error outside "Details": no URL, no browser's own words.
#[test]
fn no_error_shows_a_url_or_a_browser_error_outside_details() {
    let english = messages("en");
    let lookup = |key: &str| english.get(key).cloned();
    let mut raw_shown = Vec::new();
    for error in sample_errors() {
        let message = error.message();
        let shown = match plain_key(&message) {
            Some(key) => english[key].clone(),
            None => message.render(&lookup).unwrap(),
        };
        // An address ("https://huggingface.co/..."), not a rule about one ("starts with https://").
        let address = shown.match_indices("://").any(|(at, _)| {
            shown[at + 3..].chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '[')
        });
        if address || ["Failed to fetch", "TypeError"].iter().any(|raw| shown.contains(raw)) {
            raw_shown.push(format!("{}: {shown}", message.key));
        }
    }
    assert!(raw_shown.is_empty(), "{raw_shown:#?}");
}

/// The words of the pages themselves (every message but the errors', which the test above
/// checks as shown): no address to visit but the browser's own settings, no term of the message
/// API. What only "Details" shows is exempt.
#[test]
fn no_page_text_shows_an_address_or_an_api_term() {
    const API_TERMS: [&str; 12] = [
        "installPack",
        "packStatus",
        "galleryList",
        "galleryLimit",
        "keepLoaded",
        "gpuMemory",
        "maxItems",
        "maxBytes",
        "packProgress",
        "shader-f16",
        "keepBuffers",
        "fuseAttention",
    ];
    const BEHIND_DETAILS: [&str; 1] = ["verdictNvidiaHint"];
    let mut found = Vec::new();
    for lang in ["en", "de"] {
        for (key, text) in messages(lang) {
            if key.starts_with("err") || BEHIND_DETAILS.contains(&key.as_str()) {
                continue;
            }
            let address = text.replace("chrome://", "").contains("://");
            if address || API_TERMS.iter().any(|term| text.contains(term)) {
                found.push(format!("{lang} {key}: {text}"));
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}

/// A value the core quotes is quoted as the page's language quotes: „a b“ in German. No German error
/// text has a straight quote left, in its own words or around a value.
#[test]
fn german_quotes_a_quoted_value_with_german_quote_marks() {
    use imagine_core::hub::{HubError, SourceRule};
    let german = messages("de");
    let lookup = |key: &str| german.get(key).cloned();
    let repo = HubError::Source { field: "repo", value: "a b".into(), reason: SourceRule::NotOwnerName };
    assert_eq!(
        sentence(&repo.message().render(&lookup).unwrap()),
        "Repo \u{201e}a b\u{201c} ist nicht erlaubt: es muss die Form Besitzer/Name haben."
    );
    let english = messages("en");
    let straight: Vec<String> = sample_errors()
        .iter()
        .map(|error| error.message())
        .filter(|message| !message.keys().contains(&imagine_core::message::TEXT_KEY))
        .filter_map(|message| message.render(&lookup))
        .filter(|text| text.contains(['"', '\'']))
        .collect();
    assert!(straight.is_empty(), "{straight:#?}");
    assert_eq!(english["quotedValue"], "\"$1\"", "English quotes as `Display` does");
}

#[test]
fn an_error_is_shown_as_a_sentence() {
    assert_eq!(
        sentence("repo \"a b\" is not allowed: use owner/name"),
        "Repo \"a b\" is not allowed: use owner/name."
    );
    assert_eq!(sentence("über 5 GB."), "Über 5 GB.");
    assert_eq!(sentence("Waiting\u{2026}"), "Waiting\u{2026}");
    assert_eq!(sentence("  "), "");
}

fn extension_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../extension")
}

fn keys(lang: &str) -> BTreeSet<String> {
    let path = extension_dir().join("_locales").join(lang).join("messages.json");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let value: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let object = value.as_object().expect("messages.json is an object");
    for (key, entry) in object {
        assert!(entry.get("message").and_then(|m| m.as_str()).is_some(), "{lang}: {key} has no message");
    }
    object.keys().cloned().collect()
}

fn locales() -> Vec<String> {
    let mut langs: Vec<String> = fs::read_dir(extension_dir().join("_locales"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    langs.sort();
    langs
}

/// Every quoted string after `marker` up to the next quote; the marker must not follow a name
/// character, so that a call of `t` matches and one of `set` does not.
fn quoted_after(text: &str, marker: &str) -> Vec<String> {
    text.match_indices(marker)
        .filter(|(i, _)| !text[..*i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '.'))
        .filter_map(|(i, _)| text[i + marker.len()..].split('"').next().map(str::to_owned))
        .collect()
}

/// Every file below `dir`, in its sub-folders too.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let (mut files, mut dirs) = (Vec::new(), vec![dir.to_path_buf()]);
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}

fn used_keys() -> BTreeSet<(String, String)> {
    let mut used = BTreeSet::new();
    for entry in fs::read_dir(extension_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "html") {
            let text = fs::read_to_string(&path).unwrap();
            for marker in
                ["data-i18n=\"", "data-i18n-placeholder=\"", "data-i18n-title=\"", "data-i18n-aria-label=\""]
            {
                for key in quoted_after(&text, marker) {
                    used.insert((path.display().to_string(), key));
                }
            }
        }
    }
    for path in files_under(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")) {
        let text = fs::read_to_string(&path).unwrap();
        for marker in ["t(\"", "t_args(\"", "Message::new(\""] {
            for key in quoted_after(&text, marker) {
                used.insert((path.display().to_string(), key));
            }
        }
    }
    // The keys of the core's error messages.
    for path in files_under(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/src")) {
        if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("message.rs") {
            let text = fs::read_to_string(&path).unwrap();
            for key in quoted_after(&text, "Message::new(\"") {
                used.insert((path.display().to_string(), key));
            }
        }
    }
    let manifest =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifest.json")).unwrap();
    for key in quoted_after(&manifest, "__MSG_") {
        used.insert(("manifest.json".into(), key.trim_end_matches("__").to_owned()));
    }
    used
}

#[test]
fn at_least_two_locales_with_the_same_keys() {
    let langs = locales();
    assert!(langs.len() >= 2 && langs.contains(&"en".to_owned()), "locales: {langs:?}");
    let english = keys("en");
    for lang in &langs {
        let other = keys(lang);
        let missing: Vec<_> = english.difference(&other).collect();
        let extra: Vec<_> = other.difference(&english).collect();
        assert!(missing.is_empty() && extra.is_empty(), "{lang}: missing {missing:?}, not in en {extra:?}");
    }
}

#[test]
fn every_key_used_is_in_english() {
    let english = keys("en");
    let unknown: Vec<_> = used_keys().into_iter().filter(|(_, key)| !english.contains(key)).collect();
    assert!(unknown.is_empty(), "keys used but not in _locales/en/messages.json: {unknown:?}");
}

#[test]
fn a_firefox_wording_is_of_a_message_there_is() {
    let english = keys("en");
    let orphans: Vec<_> = english
        .iter()
        .filter_map(|key| key.strip_suffix("Firefox"))
        .filter(|base| !english.contains(*base))
        .collect();
    assert!(orphans.is_empty(), "`<key>Firefox` without `<key>`: {orphans:?}");
    assert!(english.contains("verdictNoWebGpuFirefox"), "Firefox says how to get WebGPU there");
}

/// Each message of `lang`, by key.
fn messages(lang: &str) -> BTreeMap<String, String> {
    let path = extension_dir().join("_locales").join(lang).join("messages.json");
    let value: serde_json::Value = serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap();
    let object = value.as_object().unwrap();
    object.iter().map(|(key, entry)| (key.clone(), entry["message"].as_str().unwrap().to_owned())).collect()
}

/// One error of every variant that has a message of its own (and a few that nest them), with
/// sample values.
fn sample_errors() -> Vec<Box<dyn Localize>> {
    use imagine_core::api::Stage;
    use imagine_core::gallery::GalleryError;
    use imagine_core::graph::pack_conversion::PackConversionError;
    use imagine_core::hub::{HubError, SourceRule};
    use imagine_core::message::ErrorText;
    use imagine_core::{Graph, PackError, ParamError, PromptError, SessionError, StageError};

    use crate::background::gallery_store::GalleryStoreError;
    use crate::background::service_worker::ServiceWorkerError;
    use crate::offscreen::convert::ConvertError;
    use crate::offscreen::document::OffscreenError;
    use crate::offscreen::download::DownloadError;
    use crate::offscreen::hasher::HashError;
    use crate::offscreen::stage_worker::StageWorkerError;
    use crate::platform::gpu::GpuError;
    use crate::platform::hub_client::FetchError;
    use crate::platform::js::JsError;
    use crate::platform::opfs::{Op, OpfsError};
    use crate::platform::prompt_encoder::EncoderLoadError;

    let js = || JsError { name: Some("TypeError".into()), message: "Failed to fetch".into() };
    let json_error = || serde_json::from_str::<u8>("x").unwrap_err();
    let url = || "https://huggingface.co/r/resolve/c/transformer.onnx_data".to_owned();
    let path = || "transformer.onnx_data".to_owned();
    let hub_size = || HubError::Size { path: path(), expected: 10, actual: 9 };
    let opfs = |op| OpfsError::Failed { op, name: "packs/a/x.bin".into(), source: js() };
    let quota = || OpfsError::QuotaExceeded { op: Op::Write, name: "packs/b/".into(), detail: "full".into() };
    let pack_error = || PackError::Path { path: "../x".into(), reason: "it leaves the pack" };
    let mut errors: Vec<Box<dyn Localize>> = vec![
        Box::new(ParamError::Size { field: "width", value: 100 }),
        Box::new(ParamError::Size { field: "height", value: 2000 }),
        Box::new(ParamError::Steps { value: 99 }),
        Box::new(ParamError::Seed { value: "-1".into(), text: false }),
        Box::new(ParamError::Seed { value: "abc".into(), text: true }),
        Box::new(ParamError::Schedule { value: "cosine".into() }),
        Box::new(ParamError::Count { value: 9 }),
        Box::new(ParamError::Backend { value: "cuda".into() }),
        Box::new(ParamError::KeepLoaded { value: 3601 }),
        Box::new(ParamError::AccuracyLevel { value: 5 }),
        Box::new(ParamError::Prompt { length: 20001 }),
        Box::new(GalleryError::BadId("a/b".into())),
        Box::new(GalleryError::NotFound("abc".into())),
        Box::new(GalleryError::OutOfRange { field: "maxItems", value: 0, min: 1, max: 10_000 }),
        Box::new(GalleryError::Corrupt("EOF".into())),
        Box::new(GalleryError::Export("zip".into())),
        Box::new(HubError::Source { field: "repo", value: "a b".into(), reason: SourceRule::NotOwnerName }),
        Box::new(HubError::Response { what: "revision", reason: "no sha".into() }),
        Box::new(HubError::Entry { path: "/etc".into(), reason: "absolute".into() }),
        Box::new(HubError::MissingGraph {
            repo: "a/b".into(),
            file: "decoder.onnx".into(),
            commit: "c0".into(),
        }),
        Box::new(HubError::MissingFile {
            repo: "a/b".into(),
            file: path(),
            needed_by: "transformer.onnx".into(),
            commit: "c0".into(),
        }),
        Box::new(HubError::Unverifiable { file: path() }),
        Box::new(HubError::GraphBytes { file: "decoder.onnx".into(), reason: "not fetched" }),
        Box::new(HubError::PackFile { file: "m.json".into(), error: PackError::Manifest(json_error()) }),
        Box::new(HubError::Pack(pack_error())),
        Box::new(hub_size()),
        Box::new(HubError::Hash {
            path: path(),
            algorithm: "SHA-256",
            expected: "aa".into(),
            actual: "bb".into(),
        }),
        Box::new(HubError::Checkpoint { offset: 4096, reason: "short" }),
        Box::new(HubError::ContentRange { header: "bytes x".into(), reason: "no range" }),
        Box::new(HubError::Space { needed: 6_500_000_000, free: 1_000_000, quota: 10_000_000_000 }),
        Box::new(HubError::TooLargeToRead { file: "decoder.onnx".into(), size: 10 << 30, cap: 64 << 20 }),
        Box::new(HubError::SubFolder { file: "sub/x.data".into(), needed_by: "m.json".into() }),
        Box::new(HubError::Redirect { url: url(), to: "http://cdn.example/x".into() }),
        Box::new(StageError::Run { graph: Graph::Transformer, error: SessionError("out of memory".into()) }),
        Box::new(GpuError::NoWebGpu),
        Box::new(GpuError::Adapter(js())),
        Box::new(GpuError::NoAdapter),
        Box::new(GpuError::NoF16 { what: "transformer.onnx".into() }),
        Box::new(GpuError::Limit { limit: "maxBufferSize", largest_tensor: 10, available: 5 }),
        Box::new(OpfsError::UnreadableState(json_error())),
        Box::new(OpfsError::StillOpen {
            op: Op::OpenForWriting,
            name: "download-a.json".into(),
            seconds: 10,
            source: JsError { name: Some("NoModificationAllowedError".into()), message: "in use".into() },
        }),
        Box::new(FetchError::Unreachable { url: url(), source: js() }),
        Box::new(FetchError::NotFound { url: url() }),
        Box::new(FetchError::Http { url: url(), status: 503 }),
        Box::new(FetchError::Interrupted { url: url(), source: js() }),
        Box::new(FetchError::TooLarge { url: url(), cap: 16 }),
        Box::new(FetchError::TooManyPages { repo: "a/b".into(), pages: 100 }),
        Box::new(FetchError::Stalled { url: url(), seconds: 30 }),
        Box::new(FetchError::ListingTooLarge { repo: "a/b".into(), cap: 16 << 20 }),
        Box::new(FetchError::GaveUp {
            last: Box::new(FetchError::Stalled { url: url(), seconds: 30 }),
            attempts: 6,
        }),
        Box::new(FetchError::Hub(hub_size())),
        Box::new(FetchError::Graph { graph: "decoder.onnx".into(), source: pack_error() }),
        Box::new(FetchError::Conversion(PackConversionError::Collision("x.f32.onnx".into()))),
        Box::new(FetchError::Js(js())),
        Box::new(DownloadError::NoSpace(quota())),
        Box::new(DownloadError::RangeMismatch { url: url(), start: 7 }),
        Box::new(DownloadError::NoBody { url: url() }),
        Box::new(DownloadError::Interrupted { path: path(), source: js() }),
        Box::new(DownloadError::TooLong { url: url(), path: path(), size: 10 }),
        Box::new(DownloadError::TooShort { url: url(), path: path(), offset: 5, size: 10 }),
        Box::new(DownloadError::OtherLength { url: url(), path: path(), total: 12, size: 10 }),
        Box::new(DownloadError::GaveUp {
            last: Box::new(DownloadError::Fetch(FetchError::Unreachable { url: url(), source: js() })),
            attempts: 6,
        }),
        Box::new(DownloadError::Corrupt(hub_size())),
        Box::new(DownloadError::StorageChanged),
        Box::new(DownloadError::Internal("no port")),
        Box::new(HashError::Stopped),
        Box::new(HashError::Silent { seconds: 60 }),
        Box::new(HashError::NoBuffer),
        Box::new(HashError::Reported(ErrorText::of(&HashError::Stopped))),
        Box::new(ConvertError::Corrupt("x.f32-00000.data".into())),
        Box::new(ConvertError::ShortSource { file: path(), end: 99, tensor: "w".into() }),
        Box::new(GalleryStoreError::Opfs(quota())),
        Box::new(ServiceWorkerError::Foreign),
        Box::new(ServiceWorkerError::EventSent),
        Box::new(ServiceWorkerError::NotARequest(json_error().into())),
        Box::new(ServiceWorkerError::Backend("cuda".into())),
        Box::new(ServiceWorkerError::NoDownload("pause")),
        Box::new(ServiceWorkerError::NoDownload("resume")),
        Box::new(ServiceWorkerError::Installing),
        Box::new(ServiceWorkerError::NoPack),
        Box::new(ServiceWorkerError::OffscreenNotOpened(js())),
        Box::new(ServiceWorkerError::Refused(ErrorText::of(&ServiceWorkerError::NoPack))),
        Box::new(ServiceWorkerError::NoAnswer),
        Box::new(ServiceWorkerError::NotKept(GalleryStoreError::Gallery(GalleryError::NotFound("j".into())))),
        Box::new(ServiceWorkerError::PrivateGone),
        Box::new(ServiceWorkerError::Unkept { error: ErrorText::of(&quota()), seed: "42".into() }),
        Box::new(ServiceWorkerError::NotRecorded(js())),
        Box::new(ServiceWorkerError::JobLost),
        Box::new(ServiceWorkerError::Offline(ErrorText::of(&FetchError::GaveUp {
            last: Box::new(FetchError::Unreachable { url: url(), source: js() }),
            attempts: 6,
        }))),
        Box::new(ServiceWorkerError::OtherDownload { running: "a/b@main".into() }),
        Box::new(ServiceWorkerError::JobRunning),
        Box::new(StageWorkerError::NoPack),
        Box::new(StageWorkerError::Graph { graph: "decoder.onnx".into(), source: pack_error() }),
        Box::new(StageWorkerError::ExternalData {
            graph: "transformer.onnx".into(),
            file: path(),
            source: Box::new(opfs(Op::Open)),
        }),
        Box::new(StageWorkerError::Load {
            graph: "decoder.onnx".into(),
            source: imagine_ort::OrtError::Ort("no adapter".into()),
        }),
        Box::new(OffscreenError::Crashed { script: "stage-worker.js".into(), message: "oom".into() }),
        Box::new(OffscreenError::StageStopped),
        Box::new(OffscreenError::Stalled { stage: Stage::TextEncoder, seconds: 600 }),
        Box::new(OffscreenError::from(EncoderLoadError::Fetch {
            path: "tokenizer/tokenizer.json.gz",
            source: js(),
        })),
        Box::new(OffscreenError::from(EncoderLoadError::Status {
            path: "tokenizer/tokenizer.json.gz",
            status: 404,
        })),
        Box::new(OffscreenError::from(EncoderLoadError::Tokenizer(PromptError::Tokenizer("bad".into())))),
        Box::new(OffscreenError::Prompt(PromptError::Tokenize("bad".into()))),
        Box::new(OffscreenError::NoOutput),
        Box::new(OffscreenError::NoRoom {
            need: 11_420_000_000,
            budget: 7_200_000_000,
            largest_square: Some(768),
            cause: Box::new(OffscreenError::StageStopped),
        }),
        Box::new(OffscreenError::NoRoom {
            need: 5_800_000_000,
            budget: 3_600_000_000,
            largest_square: None,
            cause: Box::new(OffscreenError::StageStopped),
        }),
        Box::new(OffscreenError::OutOfMemory {
            budget: Some(7_000_000_000),
            largest_square: Some(768),
            cause: Box::new(OffscreenError::StageStopped),
        }),
        Box::new(OffscreenError::OutOfMemory {
            budget: None,
            largest_square: None,
            cause: Box::new(OffscreenError::StageStopped),
        }),
        Box::new(imagine_core::gpu_memory::SettingError { gigabytes: 0.5 }),
    ];
    for op in [
        Op::Open,
        Op::OpenForWriting,
        Op::Read,
        Op::ReadSize,
        Op::Write,
        Op::Truncate,
        Op::Flush,
        Op::Remove,
        Op::Estimate,
    ] {
        errors.push(Box::new(opfs(op)));
    }
    for rule in SourceRule::ALL {
        errors.push(Box::new(HubError::Source { field: "revision", value: "x".into(), reason: rule }));
    }
    errors
}

/// Every key of `message` (nested ones too) is in `table`, and its text uses no `$n` beyond the
/// arguments given.
fn assert_arguments_fit(lang: &str, table: &BTreeMap<String, String>, message: &Message) {
    let Some(text) = table.get(&message.key) else { panic!("{lang} has no {}", message.key) };
    let highest = (1..=9).filter(|i| text.contains(&format!("${i}"))).max().unwrap_or(0);
    assert!(
        highest <= message.args.len(),
        "{lang} {}: ${highest} but {} arguments",
        message.key,
        message.args.len()
    );
    for a in &message.args {
        if let Arg::Message(m) = a {
            assert_arguments_fit(lang, table, m);
        }
    }
}

/// The strongest check that the English `error` and the localized message cannot drift apart:
/// every sample's message, rendered with `_locales/en`, is its `Display`; every key it uses is in
/// every locale; and every `err*` key is produced by some sample (so none is left untested).
#[test]
fn every_error_message_says_what_its_english_text_says_in_every_locale() {
    let english = messages("en");
    let lookup = |key: &str| english.get(key).cloned();
    let mut produced = BTreeSet::new();
    for error in sample_errors() {
        let message = error.message();
        assert_eq!(message.render(&lookup), Some(error.to_string()), "{message:?}");
        for lang in locales() {
            let table = messages(&lang);
            assert_arguments_fit(&lang, &table, &message);
        }
        produced.extend(message.keys().into_iter().map(str::to_owned));
    }
    let untested: Vec<_> =
        english.keys().filter(|k| k.starts_with("err") && !produced.contains(*k)).collect();
    assert!(untested.is_empty(), "error keys no sample produces: {untested:?}");
}

#[test]
fn the_test_finds_keys_in_pages_code_and_manifest() {
    let used: BTreeSet<String> = used_keys().into_iter().map(|(_, key)| key).collect();
    assert!(used.contains("extName") && used.contains("extDescription"), "{used:?}");
    assert!(used.contains("errParamSteps") && used.contains("errFetchHttp"), "{used:?}");
}
