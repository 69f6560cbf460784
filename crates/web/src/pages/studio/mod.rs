//! The studio (`studio.html`): the side panel, or a tab. Prompt with a live token count against the
//! 512-token cap (the core's own tokenizer and chat template, loaded once, when first needed), size
//! presets, steps, seed, schedule; progress as a bar by stage with the elapsed time and an estimate from
//! earlier runs on this machine; the image with copy, save, "again with a new seed", "4 variations"
//! and "reuse this seed"; a gallery image's prompt and settings when the gallery reuses them.
//!
//! What the studio makes from a private job's image (text selected in a private window) is private
//! too: "again" and "4 variations" of it, and the form once it holds its prompt or its seed (the
//! "Private" box, ticked then, says so; the user may untick it). A private run stores nothing on this
//! machine: neither the form's settings nor its timings.
//!
//! The estimate itself is `imagine_core::estimate`; the results (the image, the batch's grid)
//! are [`results`]; opening the studio from the service worker, the popup and the gallery is
//! `platform::side_panel`.

mod results;

use std::cell::RefCell;

use imagine_core::api::{
    Event, GenerateRequest, GenerateResult, JobState, Progress, Reply, Request, Seed, Stage,
};
use imagine_core::estimate::{remember, size_key, stage_fraction, StageTimes, TimingStore};
use imagine_core::prompt::{PromptEncoder, MAX_TOKENS};
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{spawn_local, JsFuture};
use web_sys::{HtmlButtonElement, HtmlElement, HtmlInputElement, HtmlSelectElement, HtmlTextAreaElement};

use crate::pages::form_check::{self, Problem};
use crate::pages::view::{
    self, child, copy_png, describe, document, element, from_template, on, on_item_click, set_text,
    set_visible,
};
use crate::pages::{gpu_fit, setup};
use crate::platform::i18n;
use crate::platform::js::{from_js, get, now_ms, random_u64, sleep_ms, LogError};
use crate::platform::messaging::request;
use crate::platform::protocol::{StudioFocus, ToolbarOpens};
use crate::platform::settings::{self, take_reuse, Reuse};
use crate::platform::side_panel::{apply_toolbar, toolbar_choice};
use crate::platform::storage;
use results::Results;

/// Images made by "4 variations".
const VARIATIONS: i64 = 4;
/// The prompt is counted this long after the last key press.
const COUNT_DELAY_MS: i32 = 150;
/// How long a gallery image's settings stay stored once an open studio filled them in, for a studio
/// that is just opening (the side panel takes a second or two).
const REUSE_LEFT_MS: u64 = 10_000;
/// `localStorage` key of the form's settings, kept from one visit to the next.
const SETTINGS_KEY: &str = "imagine.studio.settings";

/// The form's settings as last used (the prompt is not kept).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct FormSettings {
    width: String,
    height: String,
    steps: String,
    seed_fixed: bool,
    seed: String,
    schedule: String,
    /// When they were saved (milliseconds since the epoch), against the options page's defaults.
    saved_at_ms: f64,
}

fn save_settings() {
    let settings = FormSettings {
        saved_at_ms: js_sys::Date::now(),
        width: input("width").value(),
        height: input("height").value(),
        steps: input("steps").value(),
        seed_fixed: input("seed-fixed").checked(),
        seed: input("seed").value(),
        schedule: element::<HtmlSelectElement>("schedule").value(),
    };
    if let (Some(storage), Ok(text)) = (local_storage(), serde_json::to_string(&settings)) {
        storage.set_item(SETTINGS_KEY, &text).warn_on_error("saving the form");
    }
}

/// The form's settings kept from the last visit, if any.
fn kept_settings() -> Option<FormSettings> {
    let text = local_storage()?.get_item(SETTINGS_KEY).ok().flatten()?;
    serde_json::from_str(&text).ok()
}

fn restore_settings() {
    let Some(settings) = kept_settings() else { return };
    for (id, value) in [("width", &settings.width), ("height", &settings.height), ("steps", &settings.steps)]
    {
        if !value.is_empty() {
            input(id).set_value(value);
        }
    }
    input("seed-fixed").set_checked(settings.seed_fixed);
    if settings.seed_fixed {
        input("seed").set_value(&settings.seed);
    }
    if !settings.schedule.is_empty() {
        element::<HtmlSelectElement>("schedule").set_value(&settings.schedule);
    }
    custom_size_edited();
}

fn local_storage() -> Option<web_sys::Storage> {
    web_sys::window()?.local_storage().ok().flatten()
}

// ---------------------------------------------------------------------------------------------
// Pure parts: sizes, token counts, estimates

/// The size presets: (message key, width, height). Every value is a multiple of 16 in 256..=1536.
pub const PRESETS: [(&str, u32, u32); 4] = [
    ("studioSquare", 512, 512),
    ("studioSquareLarge", 1024, 1024),
    ("studioPortrait", 768, 1024),
    ("studioLandscape", 1024, 768),
];

/// What the token counter says: the count, and whether the end of the prompt would be cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCount {
    /// Tokens of the templated prompt, before truncation.
    pub tokens: usize,
    /// More than [`MAX_TOKENS`]: the end of the prompt will be cut.
    pub over: bool,
    /// At 90 % of the cap or more.
    pub near: bool,
}

impl TokenCount {
    /// The counter's state for `tokens` tokens.
    pub fn new(tokens: usize) -> Self {
        TokenCount { tokens, over: tokens > MAX_TOKENS, near: tokens * 10 >= MAX_TOKENS * 9 }
    }
}

/// "about 12 s left" and the like.
fn describe_left(ms: f64) -> String {
    let s = (ms / 1000.0).round() as u64;
    if s < 90 {
        i18n::t_args("studioSecondsLeft", &[&s.max(1).to_string()])
    } else {
        i18n::t_args("studioMinutesLeft", &[&((s + 30) / 60).to_string()])
    }
}

// ---------------------------------------------------------------------------------------------
// The page

/// The prompt encoder: loaded once, when first needed.
enum Encoder {
    NotLoaded,
    Loading,
    Ready(Box<PromptEncoder>),
    Failed,
}

/// The job on screen.
struct Run {
    job: String,
    count: u32,
    steps: u32,
    width: u32,
    height: u32,
    /// When the request was sent (`performance.now()`); `None` when the page opened on a running job
    /// (its timings are then not recorded).
    started: Option<f64>,
    /// When the page began following it.
    followed: f64,
    /// A private job: its timings are not kept.
    private: bool,
    progress: Option<Progress>,
    /// The image the progress is about (0-based).
    image: u32,
    /// When the last progress report came.
    progress_at: f64,
    /// Marks for this run's per-stage timings: first transformer report, step 1, decoder report.
    transformer_at: Option<f64>,
    step1_at: Option<f64>,
    decoder_at: Option<f64>,
    /// The furthest the bar has been: it never goes back, although the estimate behind it can grow
    /// (a stage that overran its estimate, then the next stage's estimate taken whole).
    shown: f64,
    ended: bool,
}

impl Run {
    /// A run of `job` followed from now; `started`: when its request was sent, if from this page.
    fn new(job: String, count: u32, steps: u32, (width, height): (u32, u32), started: Option<f64>) -> Run {
        let now = now_ms();
        Run {
            job,
            count,
            steps,
            width,
            height,
            started,
            followed: now,
            private: false,
            progress: None,
            image: 0,
            progress_at: now,
            transformer_at: None,
            step1_at: None,
            decoder_at: None,
            shown: 0.0,
            ended: false,
        }
    }
}

struct Studio {
    encoder: Encoder,
    /// Bumped on every edit of the prompt: a count is shown only if no later edit came.
    edit: u64,
    run: Option<Run>,
    results: Results,
    timings: TimingStore,
    /// Whether [`start`] is done: a gallery image's settings that come before are kept in `reuse` and
    /// filled in there, after the job it shows, so that they are not overwritten by it.
    started: bool,
    /// A gallery image's settings offered before [`start`] was done.
    reuse: Option<Reuse>,
}

thread_local! {
    /// The pack source saved on the options page, as last read: Download asks for its host
    /// permission within the click, before anything can be awaited.
    static SAVED_SOURCE: RefCell<Option<imagine_core::api::PackSource>> = const { RefCell::new(None) };
    static STUDIO: RefCell<Studio> = const { RefCell::new(Studio {
        encoder: Encoder::NotLoaded,
        edit: 0,
        run: None,
        results: Results::new(),
        timings: TimingStore::new(),
        started: false,
        reuse: None,
    }) };
}

fn with<R>(f: impl FnOnce(&mut Studio) -> R) -> R {
    STUDIO.with_borrow_mut(f)
}

/// Entry point of `studio.js`.
#[wasm_bindgen(js_name = studioMain)]
pub fn studio_main() {
    i18n::localize_page();
    fill_presets();
    restore_settings();
    on("form", "submit", |event| {
        event.prevent_default();
        spawn_local(generate(GenerateForm::Form));
    });
    on("cancel", "click", |_| spawn_local(cancel()));
    on("install", "click", |_| {
        // The source saved on the options page: a host other than the Hub's is asked for here too,
        // within the click as Chrome requires. The download does not wait on the answer (a mirror
        // that allows any origin needs none; one that does not fails saying it could not be reached).
        let source = SAVED_SOURCE.with_borrow(Clone::clone);
        if let Some(permission) = source.as_ref().and_then(settings::request_host_permission) {
            spawn_local(settings::host_permission_answered(Some(permission)));
        }
        spawn_local(async move {
            let source = match source {
                Some(source) => source,
                None => storage::SOURCE.get().await.unwrap_or_default(),
            };
            setup::install(source).await;
            refresh_setup().await;
        })
    });
    setup::wire_download_controls(|| spawn_local(refresh_setup()));
    form_check::wire();
    crate::pages::view::ctrl_enter_clicks("prompt", "generate");
    on("prompt", "input", |_| prompt_edited());
    on("prompt", "focus", |_| spawn_local(ensure_encoder()));
    on("seed-fixed", "change", |_| seed_mode_changed());
    on("width", "input", |_| custom_size_edited());
    on("height", "input", |_| custom_size_edited());
    spawn_local(async {
        gpu_fit::load().await;
        gpu_fit::show();
    });
    on("copy", "click", |_| {
        if let Some(result) = selected_result() {
            copy_png(&result);
        }
    });
    on_item_click("grid", ".thumb[data-index]", |thumb| {
        let Some(index) = results::thumbnail_index(&thumb) else { return };
        with(|s| s.results.select(index));
        show_results();
        results::focus_thumbnail(index);
    });
    on("again", "click", |_| spawn_local(generate(GenerateForm::Again)));
    on("variations", "click", |_| spawn_local(generate(GenerateForm::Variations)));
    on("reuse-seed", "click", |_| reuse_seed());
    on("toolbar-opens", "change", |_| {
        let choice = match element::<HtmlSelectElement>("toolbar-opens").value().as_str() {
            "popup" => ToolbarOpens::Popup,
            _ => ToolbarOpens::Studio,
        };
        spawn_local(async move {
            storage::TOOLBAR.set_or_log(&choice).await;
            apply_toolbar(choice).await;
        });
    });
    seed_mode_changed();
    let timer = Closure::<dyn Fn()>::new(tick);
    if let Some(window) = web_sys::window() {
        let _ = window
            .set_interval_with_callback_and_timeout_and_arguments_0(timer.as_ref().unchecked_ref(), 1000);
    }
    timer.forget();
    spawn_local(start());
}

/// The options page's defaults, where they were saved after this form's own settings: size, steps and
/// schedule start from them, as the popup's do.
async fn apply_newer_defaults() {
    let Some(defaults) = storage::DEFAULTS.get().await else { return };
    if defaults.saved_at_ms <= kept_settings().map_or(0.0, |s| s.saved_at_ms) {
        return;
    }
    input("width").set_value(&defaults.width.to_string());
    input("height").set_value(&defaults.height.to_string());
    input("steps").set_value(&defaults.steps.to_string());
    element::<HtmlSelectElement>("schedule").set_value(&defaults.schedule);
    custom_size_edited();
}

async fn start() {
    apply_newer_defaults().await;
    let choice = toolbar_choice().await;
    element::<HtmlSelectElement>("toolbar-opens").set_value(if choice == ToolbarOpens::Popup {
        "popup"
    } else {
        "studio"
    });
    show_shortcut().await;
    let timings = storage::STUDIO_TIMINGS.get().await.unwrap_or_default();
    with(|s| s.timings = timings);
    refresh_setup().await;
    // A tab opened on a job (`?job=`) shows it; otherwise whatever the service worker asked for last.
    let search = web_sys::window().and_then(|w| w.location().search().ok()).unwrap_or_default();
    let job = web_sys::UrlSearchParams::new_with_str(&search).ok().and_then(|p| p.get("job"));
    match job {
        Some(job) => follow(StudioFocus { job: Some(job), ..Default::default() }).await,
        None => {
            if let Some(focus) = storage::STUDIO_FOCUS.get().await {
                follow(focus).await;
            }
        }
    }
    // The gallery asked to reuse an image's settings, in the studio (when the toolbar button opens
    // the popup, they are the popup's): offered while this page started, or stored before.
    let offered = with(|s| {
        s.started = true;
        s.reuse.take()
    });
    if choice == ToolbarOpens::Studio {
        let stored = take_reuse().await;
        if let Some(reuse) = offered.or(stored) {
            fill_from(&reuse);
        }
    }
}

/// The guided setup while the model is not installed (or a download runs), and Generate held back
/// until it is.
async fn refresh_setup() {
    let status = setup::pack_status().await;
    let source = storage::SOURCE.get().await.unwrap_or_default();
    SAVED_SOURCE.set(Some(source.clone()));
    setup::show_status(&status, &source).await;
}

/// `chrome.runtime.onMessage` in the studio: events only.
#[wasm_bindgen(js_name = studioEvent)]
pub fn studio_event(message: JsValue) {
    let Ok(event) = from_js::<Event>(&message) else { return };
    let ours = |job: &str| with(|s| s.run.as_ref().is_some_and(|r| r.job == job && !r.ended));
    match event {
        Event::Progress { job, progress } if ours(&job) => on_progress(progress),
        Event::Result(result) if ours(&result.job) => on_result(result),
        Event::Failed { job, error, message } if ours(&job) => {
            end_run(false);
            view::show_error_in("error", Some((&error, message.as_ref())));
        }
        Event::Cancelled { job } if ours(&job) => {
            end_run(false);
            set_text("progress", &i18n::t("progressCancelled"));
        }
        Event::PackProgress(progress) => setup::show_download(Some(&progress)),
        Event::PackInstalled { .. } | Event::PackFailed { .. } | Event::PackChanged {} => {
            spawn_local(refresh_setup())
        }
        Event::GalleryDeleted { ids, all } => forget_deleted(&ids, all),
        _ => {}
    }
}

/// Images were deleted from the gallery (on another page, say): those on screen go; with none left
/// the result card goes too, and whatever it said about them.
fn forget_deleted(ids: &[String], all: bool) {
    let left = with(|s| s.results.forget(ids, all));
    if left {
        show_results();
    } else if with(|s| s.run.as_ref().is_none_or(|r| r.ended)) {
        set_visible("result", false);
        set_visible("error", false);
        set_text("progress", "");
    }
}

/// `chrome.storage.onChanged` in the studio: the service worker asks it to show a job; the gallery
/// leaves an image's settings to reuse.
#[wasm_bindgen(js_name = studioStorageChanged)]
pub fn studio_storage_changed(changes: JsValue, area: String) {
    if area != "session" {
        return;
    }
    let reuse = get(&get(&changes, storage::REUSE.name()), "newValue");
    if let Ok(reuse) = from_js::<Reuse>(&reuse) {
        spawn_local(reuse_offered(reuse));
    }
    let change = get(&changes, storage::STUDIO_FOCUS.name());
    if change.is_undefined() {
        return;
    }
    let Ok(focus) = from_js::<StudioFocus>(&get(&change, "newValue")) else { return };
    let same = with(|s| s.run.as_ref().is_some_and(|r| Some(&r.job) == focus.job.as_ref()));
    if !same {
        spawn_local(follow(focus));
    }
}

/// A gallery image's settings, stored while this studio is open: every open studio fills them in (a
/// side panel and a tab alike), unless they are the popup's; one still starting does so at the end of
/// [`start`].
///
/// A studio that starts removes them; an open one only after [`REUSE_LEFT_MS`], since the gallery's
/// click may be opening another studio (the side panel, while this one is a tab), which must still
/// find them.
async fn reuse_offered(reuse: Reuse) {
    if toolbar_choice().await != ToolbarOpens::Studio {
        return;
    }
    let started = with(|s| {
        if !s.started {
            s.reuse = Some(reuse.clone());
        }
        s.started
    });
    if !started {
        return;
    }
    fill_from(&reuse);
    sleep_ms(REUSE_LEFT_MS).await;
    // Unless they are now the popup's, or newer ones came meanwhile.
    if toolbar_choice().await == ToolbarOpens::Studio && storage::REUSE.get().await.as_ref() == Some(&reuse) {
        storage::REUSE.remove_or_log().await;
    }
}

/// Fills the form with a gallery image's prompt and settings, its seed fixed.
fn fill_from(reuse: &Reuse) {
    element::<HtmlTextAreaElement>("prompt").set_value(&reuse.prompt);
    set_form_private(false);
    input("width").set_value(&reuse.width.to_string());
    input("height").set_value(&reuse.height.to_string());
    input("steps").set_value(&reuse.steps.to_string());
    element::<HtmlSelectElement>("schedule").set_value(&reuse.schedule);
    input("seed-fixed").set_checked(true);
    input("seed").set_value(&reuse.seed);
    seed_mode_changed();
    custom_size_edited();
    prompt_edited();
}

fn input(id: &str) -> HtmlInputElement {
    element(id)
}

/// Builds the preset radio buttons (label and pixel size, as text) from `#preset-template`; one
/// listener on the list hears them all.
fn fill_presets() {
    let list = element::<HtmlElement>("presets");
    let add = |value: String, label: String, size: Option<String>, checked: bool| {
        let chip = from_template("preset-template");
        let radio: HtmlInputElement = child(&chip, "input");
        radio.set_value(&value);
        radio.set_checked(checked);
        child::<HtmlElement>(&chip, ".name").set_text_content(Some(&label));
        let px = child::<HtmlElement>(&chip, ".px");
        match size {
            Some(size) => px.set_text_content(Some(&size)),
            None => px.remove(),
        }
        let _ = list.append_child(&chip);
    };
    for (i, (key, w, h)) in PRESETS.iter().enumerate() {
        add(format!("{w}x{h}"), i18n::t(key), Some(format!("{w}\u{00d7}{h}")), i == 0);
    }
    add("custom".into(), i18n::t("studioCustom"), None, false);
    on("presets", "change", |_| preset_chosen());
}

fn preset_chosen() {
    let Ok(Some(checked)) = document().query_selector("input[name=size]:checked") else { return };
    let value = checked.unchecked_into::<HtmlInputElement>().value();
    if let Some((w, h)) = value.split_once('x') {
        input("width").set_value(w);
        input("height").set_value(h);
    }
    gpu_fit::show();
}

/// Typing a size selects "custom", or the preset it matches.
fn custom_size_edited() {
    let size = format!("{}x{}", input("width").value().trim(), input("height").value().trim());
    let Ok(radios) = document().query_selector_all("input[name=size]") else { return };
    let mut matched = false;
    for i in 0..radios.length() {
        let Some(radio) = radios.item(i).map(|n| n.unchecked_into::<HtmlInputElement>()) else { continue };
        let hit = radio.value() == size;
        matched |= hit;
        radio.set_checked(hit || (radio.value() == "custom" && !matched && i + 1 == radios.length()));
    }
    gpu_fit::show();
}

fn seed_mode_changed() {
    let fixed = input("seed-fixed").checked();
    let seed = input("seed");
    seed.set_disabled(!fixed);
    if fixed && seed.value().trim().is_empty() {
        seed.set_value(&(random_u64() >> 11).to_string());
    }
    // A seed shown greyed out reads as if it would be used: without a fixed seed the field says "random".
    if !fixed {
        seed.set_value("");
    }
}

// --- tokens

fn prompt_edited() {
    let edit = with(|s| {
        s.edit += 1;
        s.edit
    });
    let closure = Closure::once_into_js(move || spawn_local(count_tokens(edit)));
    if let Some(window) = web_sys::window() {
        let _ = window
            .set_timeout_with_callback_and_timeout_and_arguments_0(closure.unchecked_ref(), COUNT_DELAY_MS);
    }
}

/// Loads the tokenizer and the chat template from the extension (once).
async fn ensure_encoder() {
    let load = with(|s| {
        let idle = matches!(s.encoder, Encoder::NotLoaded);
        if idle {
            s.encoder = Encoder::Loading;
        }
        idle
    });
    if !load {
        return;
    }
    set_text("token-count", &i18n::t("studioTokensLoading"));
    let encoder = async {
        let tokenizer = fetch_bytes("tokenizer/tokenizer.json").await?;
        let config = fetch_bytes("tokenizer/tokenizer_config.json").await?;
        PromptEncoder::new(&tokenizer, &config).map_err(|e| e.to_string())
    }
    .await;
    match encoder {
        Ok(encoder) => with(|s| s.encoder = Encoder::Ready(Box::new(encoder))),
        Err(error) => {
            web_sys::console::error_1(&error.into());
            with(|s| s.encoder = Encoder::Failed);
            set_text("token-count", &i18n::t("studioTokensUnavailable"));
            return;
        }
    }
    let edit = with(|s| s.edit);
    count_tokens(edit).await;
}

async fn fetch_bytes(path: &str) -> Result<Vec<u8>, String> {
    let window = web_sys::window().ok_or("no window")?;
    let response = JsFuture::from(window.fetch_with_str(path)).await.map_err(|e| format!("{path}: {e:?}"))?;
    let response: web_sys::Response = response.unchecked_into();
    if !response.ok() {
        return Err(format!("{path}: HTTP {}", response.status()));
    }
    let buffer = JsFuture::from(response.array_buffer().map_err(|e| format!("{e:?}"))?)
        .await
        .map_err(|e| format!("{path}: {e:?}"))?;
    Ok(js_sys::Uint8Array::new(&buffer).to_vec())
}

async fn count_tokens(edit: u64) {
    if with(|s| s.edit != edit) {
        return;
    }
    if with(|s| matches!(s.encoder, Encoder::NotLoaded)) {
        // It counts the latest prompt once loaded.
        spawn_local(ensure_encoder());
        return;
    }
    let prompt = element::<HtmlTextAreaElement>("prompt").value();
    let count = with(|s| match &s.encoder {
        Encoder::Ready(encoder) => encoder.count_tokens(&prompt).ok().map(TokenCount::new),
        _ => None,
    });
    let Some(count) = count else { return };
    set_text(
        "token-count",
        &i18n::t_args("studioTokens", &[&count.tokens.to_string(), &MAX_TOKENS.to_string()]),
    );
    let counter = element::<HtmlElement>("token-count");
    counter.set_class_name(if count.over {
        "count over"
    } else if count.near {
        "count near"
    } else {
        "count"
    });
    set_visible("token-warning", count.over);
    if count.over {
        set_text(
            "token-warning",
            &i18n::t_args(
                "studioTokensOver",
                &[&MAX_TOKENS.to_string(), &(count.tokens - MAX_TOKENS).to_string()],
            ),
        );
    }
}

// --- generating

enum GenerateForm {
    /// The form's settings.
    Form,
    /// The shown image's settings with a new random seed.
    Again,
    /// The shown image's settings, four images from the next seed on.
    Variations,
}

fn form_request() -> GenerateRequest {
    let number = |id: &str| input(id).value().trim().parse::<i64>().ok();
    let seed = input("seed").value().trim().to_owned();
    GenerateRequest {
        prompt: element::<HtmlTextAreaElement>("prompt").value(),
        width: number("width"),
        height: number("height"),
        steps: number("steps"),
        seed: (input("seed-fixed").checked() && !seed.is_empty()).then_some(Seed::Text(seed)),
        schedule: Some(element::<HtmlSelectElement>("schedule").value()),
        private: input("private").checked(),
        ..Default::default()
    }
}

/// Whether the form holds what a private job made (its prompt, its seed): then the "Private" box is
/// shown, ticked, and what Generate makes is private. `false`: the form was filled from elsewhere (a
/// gallery image, a job that is not private), and the box goes.
fn set_form_private(private: bool) {
    input("private").set_checked(private);
    set_visible("private-row", private);
}

fn selected_result() -> Option<GenerateResult> {
    with(|s| s.results.selected().cloned())
}

/// A request for images like `result`: private when it is.
fn request_like(result: &GenerateResult) -> GenerateRequest {
    GenerateRequest {
        prompt: result.prompt.clone(),
        width: Some(i64::from(result.width)),
        height: Some(i64::from(result.height)),
        steps: Some(i64::from(result.steps)),
        schedule: Some(result.schedule.clone()),
        private: result.private,
        ..Default::default()
    }
}

async fn generate(from: GenerateForm) {
    if setup::generate_held() {
        return;
    }
    let again = matches!(from, GenerateForm::Again);
    let typed = matches!(from, GenerateForm::Form);
    let wanted = match from {
        GenerateForm::Form => {
            let wanted = form_request();
            // A private image's settings (its seed, say) are not written to this machine's disk.
            if !wanted.private {
                save_settings();
            }
            wanted
        }
        GenerateForm::Again => match selected_result() {
            Some(result) => request_like(&result),
            None => return,
        },
        GenerateForm::Variations => match selected_result() {
            Some(result) => {
                let next = result.seed.parse::<u64>().unwrap_or(0).wrapping_add(1);
                GenerateRequest {
                    seed: Some(Seed::Text(next.to_string())),
                    count: Some(VARIATIONS),
                    ..request_like(&result)
                }
            }
            None => return,
        },
    };
    // What the last action said (copied, seed reused) is not about this one.
    set_visible("error", false);
    set_text("action-status", "");
    form_check::clear();
    let count = wanted.count.unwrap_or(1).clamp(1, 8) as u32;
    let prompt = wanted.prompt.clone();
    let private = wanted.private;
    // What the user typed is checked at its controls; a shown image's settings were allowed already.
    let checked =
        if typed { form_check::check(&wanted) } else { wanted.clone().validate(0).map_err(Problem::Other) };
    match checked {
        Err(problem) => {
            if let Some(text) = form_check::show(&problem) {
                show_error(&text);
            }
        }
        Ok(params) => match request(&Request::Generate(wanted)).await {
            Reply::JobStarted { job, seed } => {
                if again && input("seed-fixed").checked() {
                    // The service worker picked it: kept in the fixed seed's field (with no fixed
                    // seed the field stays empty, "random", and the result says the seed).
                    input("seed").set_value(&seed);
                }
                let size = (params.width, params.height);
                let run = Run::new(job.clone(), count, params.steps, size, Some(now_ms()));
                begin_run(Run { private, ..run });
                let focus = StudioFocus { job: Some(job), prompt, private, ..Default::default() };
                storage::STUDIO_FOCUS.set_or_log(&focus).await;
            }
            Reply::Error { error, message } => view::show_error_in("error", Some((&error, message.as_ref()))),
            other => show_error(&format!("unexpected reply {other:?}")),
        },
    }
}

/// Shows a job the service worker (context menu, notification) or an earlier visit asked for.
async fn follow(focus: StudioFocus) {
    if !focus.prompt.is_empty() {
        element::<HtmlTextAreaElement>("prompt").set_value(&focus.prompt);
        set_form_private(focus.private);
        prompt_edited();
    }
    if let Some(error) = &focus.error {
        view::show_error_in("error", Some((error, focus.message.as_ref())));
        return;
    }
    let Some(job) = focus.job else { return };
    let reply = request(&Request::Job { job: job.clone() }).await;
    let Reply::Job(state) = &reply else { return };
    let earlier = state.results().to_vec();
    let private = state.is_private();
    match state {
        JobState::Running { progress, prompt, .. } => {
            if !prompt.is_empty() {
                element::<HtmlTextAreaElement>("prompt").set_value(prompt);
                set_form_private(private);
                prompt_edited();
            }
            // Opened on a running job: its size comes with its first image.
            let steps = progress.as_ref().map_or(0, |p| p.steps);
            begin_run(Run { progress: progress.clone(), private, ..Run::new(job, 1, steps, (0, 0), None) });
            for result in earlier {
                on_result(result);
            }
            if let Some(progress) = progress.clone() {
                on_progress(progress);
            }
        }
        JobState::Done { result, .. } => {
            let results = if earlier.is_empty() { vec![result.clone()] } else { earlier };
            if element::<HtmlTextAreaElement>("prompt").value().is_empty() {
                element::<HtmlTextAreaElement>("prompt").set_value(&result.prompt);
                set_form_private(private);
                prompt_edited();
            }
            with(|s| {
                s.run = None;
                s.results.finished(results);
            });
            show_results();
        }
        JobState::Failed { error, message, .. } => {
            view::show_error_in("error", Some((error, message.as_ref())))
        }
        JobState::Unknown => show_error(&i18n::t("jobGone")),
        JobState::Cancelled { .. } => set_text("progress", &i18n::t("progressCancelled")),
    }
}

fn begin_run(run: Run) {
    let count = run.count as usize;
    with(|s| {
        s.run = Some(run);
        s.results.start(count);
    });
    set_running(true);
    set_visible("run", true);
    // The last image stays on screen, with its actions, until this run's first one arrives.
    set_text("progress", &i18n::t("starting"));
    view::show_stages(None);
    render_progress();
}

fn set_running(running: bool) {
    element::<HtmlButtonElement>("generate").set_disabled(running);
    set_visible("cancel", running);
    for id in ["again", "variations"] {
        element::<HtmlButtonElement>(id).set_disabled(running);
    }
}

async fn cancel() {
    let job = with(|s| s.run.as_ref().filter(|r| !r.ended).map(|r| r.job.clone()));
    if let Some(job) = job {
        request(&Request::Cancel { job }).await;
    }
}

fn on_progress(progress: Progress) {
    let now = now_ms();
    with(|s| {
        let Some(run) = s.run.as_mut() else { return };
        if progress.images > run.count {
            run.count = progress.images;
            s.results.grow(progress.images as usize);
        }
        run.image = progress.image;
        run.steps = progress.steps.max(run.steps);
        if run.image == 0 {
            if progress.stage == Stage::Transformer && run.transformer_at.is_none() {
                run.transformer_at = Some(now);
            }
            if progress.stage == Stage::Transformer && progress.step == 1 && run.step1_at.is_none() {
                run.step1_at = Some(now);
            }
            if progress.stage == Stage::Decoder && run.decoder_at.is_none() {
                run.decoder_at = Some(now);
            }
        }
        run.progress = Some(progress.clone());
        run.progress_at = now;
    });
    view::show_stages(Some(&progress));
    let (image, count) = with(|s| s.run.as_ref().map_or((0, 1), |r| (r.image, r.count)));
    let mut text = describe(&progress);
    if count > 1 {
        text = i18n::t_args("studioImageOf", &[&(image + 1).to_string(), &count.to_string(), &text]);
    }
    set_text("progress", &text);
    render_progress();
}

fn on_result(result: GenerateResult) {
    let ended = with(|s| s.run.is_none() || s.results.arrive(result));
    show_results();
    if ended {
        record_timings();
        end_run(true);
        spawn_local(scroll_to_result());
    }
}

/// Brings the finished result into view: a side panel is short, the form alone can fill it, and the
/// image would come below it unseen. The whole result when it fits (its actions at the bottom), else
/// its top, the image first; measured once the image is decoded, which is what gives it its height.
async fn scroll_to_result() {
    let image = element::<web_sys::HtmlImageElement>("image");
    // A selected grid image that cannot be decoded still leaves the rest worth showing.
    let _ = JsFuture::from(image.decode()).await;
    let result = element::<HtmlElement>("result");
    let room = web_sys::window().and_then(|w| w.inner_height().ok()?.as_f64()).unwrap_or(0.0);
    result.scroll_into_view_with_bool(result.get_bounding_client_rect().height() > room);
}

fn end_run(done: bool) {
    with(|s| {
        if let Some(run) = s.run.as_mut() {
            run.ended = true;
        }
    });
    set_running(false);
    // Whatever ended it, there is no time left to count down.
    set_text("timing", "");
    if done {
        set_text("progress", &i18n::t("progressDone"));
        element::<HtmlElement>("progress-bar").set_attribute("value", "1").ok();
        set_visible("run", false);
    }
}

fn record_timings() {
    let sample = with(|s| {
        let run = s.run.as_ref()?;
        let started = run.started?;
        // A private run leaves nothing on this machine, not even how long it took.
        if run.count != 1 || run.private {
            return None;
        }
        let (transformer, step1, decoder) = (run.transformer_at?, run.step1_at?, run.decoder_at?);
        let steps = f64::from(run.steps.max(1));
        let times = StageTimes {
            encode_ms: transformer - started,
            load_ms: 0.0_f64.max(step1 - transformer - (decoder - step1) / steps),
            step_ms: (decoder - step1) / (steps - 1.0).max(1.0),
            decode_ms: now_ms() - decoder,
        };
        remember(&mut s.timings, size_key(run.width, run.height), times);
        Some(s.timings.clone())
    });
    if let Some(timings) = sample {
        spawn_local(async move { storage::STUDIO_TIMINGS.set_or_log(&timings).await });
    }
}

/// Every second while a job runs: the bar, the elapsed time and the estimate.
fn tick() {
    if with(|s| s.run.as_ref().is_some_and(|r| !r.ended)) {
        render_progress();
    }
}

fn render_progress() {
    let now = now_ms();
    let view = with(|s| {
        let run = s.run.as_mut().filter(|r| !r.ended)?;
        let history = StageTimes::mean(s.timings.get(&size_key(run.width, run.height)).map_or(&[], |v| v));
        let elapsed = now - run.started.unwrap_or(run.followed);
        let in_stage = now - if run.progress.is_some() { run.progress_at } else { run.followed };
        let images_left = run.count.saturating_sub(run.image + 1);
        let left = history.map(|h| {
            h.left_ms(run.progress.as_ref(), in_stage, run.steps)
                + f64::from(images_left) * (h.image_ms(run.steps) - h.encode_ms)
        });
        let own = match left {
            Some(left) if elapsed + left > 0.0 => elapsed / (elapsed + left),
            _ => stage_fraction(run.progress.as_ref()),
        };
        let fraction = (f64::from(run.image) + own.min(1.0)) / f64::from(run.count.max(1));
        run.shown = run.shown.max(fraction.min(1.0));
        Some((run.shown, elapsed, left))
    });
    let Some((fraction, elapsed, left)) = view else { return };
    let bar = element::<HtmlElement>("progress-bar");
    let _ = bar.set_attribute("value", &format!("{fraction:.3}"));
    let mut timing = view::describe_elapsed(elapsed);
    if let Some(left) = left {
        timing.push_str(" \u{00b7} ");
        timing.push_str(&describe_left(left));
    }
    set_text("timing", &timing);
}

// --- results

fn show_error(error: &str) {
    set_text("error", error);
    set_visible("error", true);
}

/// The selected image large, the batch as a grid when it has more than one.
fn show_results() {
    // Drawn outside the borrow: the DOM may call back into the page.
    with(|s| s.results.clone()).show();
}

fn reuse_seed() {
    let Some(result) = selected_result() else { return };
    if result.private {
        set_form_private(true);
    }
    input("seed-fixed").set_checked(true);
    seed_mode_changed();
    input("seed").set_value(&result.seed);
    set_text("action-status", &i18n::t_args("studioSeedReused", &[&result.seed]));
}

async fn show_shortcut() {
    let Some(commands) = get_commands().await else { return };
    let shortcut = commands
        .iter()
        .find(|c| get(c, "name").as_string().as_deref() == Some("open-studio"))
        .and_then(|c| get(&c, "shortcut").as_string())
        .filter(|s| !s.is_empty());
    let text = match shortcut {
        Some(keys) => i18n::t_args("studioShortcut", &[&keys]),
        None => i18n::t("studioNoShortcut"),
    };
    set_text("shortcut", &text);
}

async fn get_commands() -> Option<js_sys::Array> {
    let commands = get(&get(&js_sys::global(), "chrome"), "commands");
    let get_all: js_sys::Function = get(&commands, "getAll").dyn_into().ok()?;
    let promise: js_sys::Promise = get_all.call0(&commands).ok()?.dyn_into().ok()?;
    JsFuture::from(promise).await.ok()?.dyn_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_allowed_sizes() {
        for (_, w, h) in PRESETS {
            for v in [w, h] {
                assert!(v % 16 == 0 && (256..=1536).contains(&v), "{v}");
            }
        }
    }

    #[test]
    fn the_token_count_warns_near_and_over_the_cap() {
        assert_eq!(TokenCount::new(14), TokenCount { tokens: 14, over: false, near: false });
        assert!(TokenCount::new(470).near && !TokenCount::new(470).over);
        assert!(!TokenCount::new(512).over && TokenCount::new(513).over);
    }
}
