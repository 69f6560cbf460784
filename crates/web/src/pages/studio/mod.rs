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
//! Here: the page, its events and generating. The token count is [`tokens`]; the run's progress
//! [`progress`] (the estimate itself is `imagine_core::estimate`); the results (the image, the
//! batch's grid) [`results`]; the form kept between visits [`form_settings`]; opening the studio from
//! the service worker, the popup and the gallery is `platform::side_panel`.

mod form_settings;
mod progress;
mod results;
mod tokens;

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
    self, child, copy_png, describe, document, dom, element, from_template, input, on, on_item_click,
    set_text, set_visible,
};
use crate::pages::{gpu_fit, setup};
use crate::platform::i18n;
use crate::platform::js::{from_js, get, now_ms, random_u64, sleep_ms, LogError};
use crate::platform::messaging::request;
use crate::platform::protocol::{StudioFocus, ToolbarOpens};
use crate::platform::settings::{self, take_reuse, Reuse};
use crate::platform::side_panel::{apply_toolbar, toolbar_choice};
use crate::platform::storage;
use form_settings::*;
use progress::*;
use results::Results;
use tokens::*;

/// Images made by "4 variations".
const VARIATIONS: i64 = 4;
/// The prompt is counted this long after the last key press.
const COUNT_DELAY_MS: i32 = 150;
/// How long a gallery image's settings stay stored once an open studio filled them in, for a studio
/// that is just opening (the side panel takes a second or two).
const REUSE_LEFT_MS: u64 = 10_000;

/// The size presets: (message key, width, height). Every value is a multiple of 16 in 256..=1536.
pub const PRESETS: [(&str, u32, u32); 4] = [
    ("studioSquare", 512, 512),
    ("studioSquareLarge", 1024, 1024),
    ("studioPortrait", 768, 1024),
    ("studioLandscape", 1024, 768),
];

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
    view::build_stages();
    fill_presets();
    restore_settings();
    on("form", "submit", |event| {
        event.prevent_default();
        spawn_local(generate(GenerateForm::Form));
    });
    on("cancel", "click", |_| spawn_local(cancel()));
    on("install", "click", |_| install_clicked());
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
    on("toolbar-opens", "change", |_| toolbar_opens_changed());
    seed_mode_changed();
    view::every_second(tick);
    spawn_local(start());
}

/// The setup's Install: the source saved on the options page. A host other than the Hub's is asked for
/// here too, within the click as Chrome requires. The download does not wait on the answer (a mirror
/// that allows any origin needs none; one that does not fails saying it could not be reached).
fn install_clicked() {
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
}

/// Keeps what the toolbar button opens, and makes it so.
fn toolbar_opens_changed() {
    let choice = match element::<HtmlSelectElement>("toolbar-opens").value().as_str() {
        "popup" => ToolbarOpens::Popup,
        _ => ToolbarOpens::Studio,
    };
    spawn_local(async move {
        storage::TOOLBAR.set_or_log(&choice).await;
        apply_toolbar(choice).await;
    });
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
    let source = storage::SOURCE.get().await.unwrap_or_default();
    SAVED_SOURCE.set(Some(source.clone()));
    if let Some((status, verdict)) = setup::read_state(&source).await {
        setup::show_status(&status, &verdict);
    }
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
    input("seed").set_value(&reuse.seed.to_string());
    seed_mode_changed();
    custom_size_edited();
    prompt_edited();
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
        dom::append(&list, &chip);
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

/// A request for images like `result`, with a new seed (none given): private when it is.
fn request_like(result: &GenerateResult) -> GenerateRequest {
    GenerateRequest { seed: None, private: result.private, ..result.image.request() }
}

async fn generate(from: GenerateForm) {
    if setup::generate_held() {
        return;
    }
    let again = matches!(from, GenerateForm::Again);
    let typed = matches!(from, GenerateForm::Form);
    let Some(wanted) = wanted_request(from) else { return };
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
                follow_started(job, &params, count, prompt, private).await;
            }
            Reply::Error { error, message } => view::show_error_in("error", Some((&error, message.as_ref()))),
            other => show_error(&format!("unexpected reply {other:?}")),
        },
    }
}

/// What `from` asks for: the form's request (its settings saved unless private), or the selected
/// image's again or its variations; none without a selected image.
fn wanted_request(from: GenerateForm) -> Option<GenerateRequest> {
    Some(match from {
        GenerateForm::Form => {
            let wanted = form_request();
            // A private image's settings (its seed, say) are not written to this machine's disk.
            if !wanted.private {
                save_settings();
            }
            wanted
        }
        GenerateForm::Again => request_like(&selected_result()?),
        GenerateForm::Variations => {
            let result = selected_result()?;
            let next = result.image.seed.wrapping_add(1);
            GenerateRequest {
                seed: Some(Seed::Text(next.to_string())),
                count: Some(VARIATIONS),
                ..request_like(&result)
            }
        }
    })
}

/// Shows the started `job` as it runs, and makes it what the studio follows when it opens again.
async fn follow_started(
    job: String,
    params: &imagine_core::params::GenerateParams,
    count: u32,
    prompt: String,
    private: bool,
) {
    let size = (params.width, params.height);
    let run = Run::new(job.clone(), count, params.steps, size, Some(now_ms()));
    begin_run(Run { private, ..run });
    let focus = StudioFocus { job: Some(job), prompt, private, ..Default::default() };
    storage::STUDIO_FOCUS.set_or_log(&focus).await;
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
                element::<HtmlTextAreaElement>("prompt").set_value(&result.image.prompt);
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
    let seed = result.image.seed.to_string();
    input("seed").set_value(&seed);
    set_text("action-status", &i18n::t_args("studioSeedReused", &[&seed]));
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
