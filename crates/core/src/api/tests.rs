use super::*;

#[test]
fn gallery_requests_parse_and_refuse_unknown_fields() {
    let list: Request = serde_json::from_str(r#"{"type":"galleryList","query":"fox","limit":10}"#).unwrap();
    let want = GalleryListRequest { query: Some("fox".into()), offset: None, limit: Some(10) };
    assert_eq!(list, Request::GalleryList(want));
    let clear: Request = serde_json::from_str(r#"{"type":"galleryClear"}"#).unwrap();
    assert_eq!(clear, Request::GalleryClear {});
    let e = serde_json::from_str::<Request>(r#"{"type":"galleryLimit","maxItem":3}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field `maxItem`"), "{e}");
    let e = serde_json::from_str::<Request>(r#"{"type":"galleryDelete","id":"a","all":true}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field `all`"), "{e}");
}

#[test]
fn a_job_state_says_whether_it_ended_and_whether_it_is_private() {
    let running =
        |private| JobState::Running { progress: None, prompt: "a".into(), results: vec![], private };
    assert!(!running(false).has_ended() && !running(true).has_ended());
    assert!(JobState::Unknown.has_ended() && JobState::Cancelled { results: vec![] }.has_ended());
    assert!(running(true).is_private() && !running(false).is_private());
    // Stored by an older version: no flag on the running state, the results carry it.
    let old: JobState = serde_json::from_str(r#"{"status":"running","progress":null,"prompt":"a"}"#).unwrap();
    assert_eq!(old, running(false));
    assert_eq!(serde_json::to_value(running(false)).unwrap().get("private"), None);
    let result: GenerateResult = serde_json::from_value(serde_json::json!({
        "job": "j", "png": "", "prompt": "a", "seed": "1", "width": 256, "height": 256, "steps": 1,
        "schedule": "flux2", "tokenCount": 3, "truncated": false, "trace": null, "timings": null,
        "private": true,
    }))
    .unwrap();
    let done = JobState::Done { result: result.clone(), results: vec![result] };
    assert!(done.is_private() && done.has_ended());
}

#[test]
fn the_conversion_cost_is_camel_case() {
    let cost = ConversionCost { extra_disk_bytes: 1_234_567_890, gpu_bytes: 3_950_000_001 };
    let json = serde_json::to_value(cost).unwrap();
    assert_eq!(json, serde_json::json!({"extraDiskBytes": 1_234_567_890u64, "gpuBytes": 3_950_000_001u64}));
    assert_eq!(serde_json::to_value(DownloadState::Converting).unwrap(), "converting");
    assert!(DownloadState::Converting.is_active());
}

#[test]
fn the_badge_shows_the_step_or_the_percentage_and_clears_at_the_end() {
    let progress = |stage, step| Event::Progress {
        job: "j".into(),
        progress: Progress { stage, step, steps: 4, image: 0, images: 1 },
    };
    assert_eq!(progress(Stage::Transformer, 2).badge().as_deref(), Some("2/4"));
    assert_eq!(progress(Stage::Decoder, 1).badge().as_deref(), Some("\u{2026}"));
    assert_eq!(Event::Cancelled { job: "j".into() }.badge().as_deref(), Some(""));
    assert_eq!(Event::PackInstalled { bytes: 1, commit: "c".into() }.badge().as_deref(), Some(""));
}

#[test]
fn the_end_of_a_download_is_announced_once_recorded() {
    let failed = Event::PackFailed { error: "e".into(), message: None, offline: false };
    assert_eq!(failed.announcement(), Some(Event::PackChanged {}));
    let installed = Event::PackInstalled { bytes: 1, commit: "c".into() };
    assert_eq!(installed.announcement(), Some(Event::PackChanged {}));
    // The pages follow a job by its events alone; nor is an announcement announced again.
    assert_eq!(Event::Cancelled { job: "j".into() }.announcement(), None);
    assert_eq!(Event::PackChanged {}.announcement(), None);
}

#[test]
fn senders_are_told_apart_by_extension_and_url() {
    let own = "abcdefghijklmnopabcdefghijklmnop";
    let origin = format!("chrome-extension://{own}/");
    let url = |path: &str| format!("{origin}{path}");
    let classify = |id, url: Option<&str>| Sender::classify(own, &origin, id, url);
    assert_eq!(classify(Some(own), Some(&url("sw.js"))), Sender::ServiceWorker);
    assert_eq!(classify(Some(own), Some(&url("offscreen.html"))), Sender::Offscreen);
    assert_eq!(classify(Some(own), Some(&url("popup.html"))), Sender::Page);
    assert_eq!(classify(Some(own), Some(&url("result.html?job=1"))), Sender::Page);
    // A content script of this extension reports the web page's URL; another extension its own id.
    assert_eq!(classify(Some(own), Some("https://example.com/")), Sender::Foreign);
    assert_eq!(classify(Some("zzzz"), Some(&url("sw.js"))), Sender::Foreign);
    assert_eq!(classify(None, Some(&url("sw.js"))), Sender::Foreign);
    assert_eq!(classify(Some(own), None), Sender::Foreign);
    let lookalike = format!("chrome-extension://{own}x/sw.js");
    assert_eq!(classify(Some(own), Some(&lookalike)), Sender::Foreign);
}

#[test]
fn firefox_senders_are_told_apart_by_the_origin_firefox_gives_the_extension() {
    // Firefox's origin is a UUID of the installation, not the extension's id; its background is a page.
    let (own, origin) = ("imagine@example.org", "moz-extension://0b5c7e0e-1b7a-4b53-9f57-0f7b2c1d9e4a/");
    let url = |path: &str| format!("{origin}{path}");
    let classify = |id, url: &str| Sender::classify(own, origin, id, Some(url));
    assert_eq!(classify(Some(own), &url("_generated_background_page.html")), Sender::ServiceWorker);
    assert_eq!(classify(Some(own), &url("offscreen.html")), Sender::Offscreen);
    assert_eq!(classify(Some(own), &url("studio.html")), Sender::Page);
    assert_eq!(classify(Some(own), "moz-extension://another-uuid/offscreen.html"), Sender::Foreign);
    assert_eq!(classify(Some("other@example.org"), &url("offscreen.html")), Sender::Foreign);
    // An origin without its slash would let a longer one pass.
    assert_eq!(
        Sender::classify(own, origin.trim_end_matches('/'), Some(own), Some(&url("offscreen.html"))),
        Sender::Foreign
    );
}

#[test]
fn requests_use_camel_case_tags_and_defaults() {
    let r: Request = serde_json::from_str(r#"{"type":"generate","prompt":"a cat"}"#).unwrap();
    assert_eq!(r, Request::Generate(GenerateRequest { prompt: "a cat".into(), ..Default::default() }));
    let r: Request = serde_json::from_str(r#"{"type":"installPack","repo":"a/b"}"#).unwrap();
    let source = PackSource { repo: "a/b".into(), ..PackSource::default() };
    assert_eq!(r, Request::InstallPack(InstallRequest::new(source, None)));
    let r: Request =
        serde_json::from_str(r#"{"type":"generate","prompt":"p","seed":"18446744073709551615"}"#).unwrap();
    let Request::Generate(g) = r else { panic!() };
    assert_eq!(g.seed, Some(Seed::Text("18446744073709551615".into())));
}

#[test]
fn unknown_fields_are_refused_and_named() {
    for (text, field) in [
        (r#"{"type":"generate","prompt":"a cat","widht":512}"#, "widht"),
        (r#"{"type":"installPack","repo":"a/b","revsion":"v1"}"#, "revsion"),
        (r#"{"type":"planPack","endpont":"https://x"}"#, "endpont"),
        (r#"{"type":"job","job":"j","extra":1}"#, "extra"),
        (r#"{"type":"pausePack","now":true}"#, "now"),
    ] {
        let e = serde_json::from_str::<Request>(text).unwrap_err().to_string();
        assert!(e.contains(&format!("unknown field `{field}`")), "{text}: {e}");
    }
}

#[test]
fn events_serialize_with_type_tag() {
    let e = Event::Progress {
        job: "j1".into(),
        progress: Progress { stage: Stage::Transformer, step: 2, steps: 4, image: 1, images: 4 },
    };
    assert_eq!(
        serde_json::to_string(&e).unwrap(),
        r#"{"type":"progress","job":"j1","progress":{"stage":"transformer","step":2,"steps":4,"image":1,"images":4}}"#
    );
}
