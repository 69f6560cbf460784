//! The result page the context menu opens: the prompt (as text), the studio's progress (the stages, a
//! bar, the time so far) with Cancel, and the image of one job, with its parameters and actions:
//! copy, save, and the studio at this job for the rest.

use std::cell::{Cell, RefCell};

use imagine_core::api::{Event, GenerateResult, JobState, Progress, Reply, Request};
use imagine_core::estimate::stage_fraction;
use imagine_core::message::Message;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::spawn_local;
use web_sys::HtmlAnchorElement;

use crate::pages::view::{self, copy_png, element, on, set_text, set_visible, JobView};
use crate::platform::i18n;
use crate::platform::js::{from_js, now_ms};
use crate::platform::messaging::request;

thread_local! {
    static VIEW: RefCell<Option<JobView>> = const { RefCell::new(None) };
    /// The finished image, for "Copy".
    static RESULT: RefCell<Option<GenerateResult>> = const { RefCell::new(None) };
    /// When this page first saw the job running (milliseconds since the epoch), for the time so far.
    static SINCE: Cell<Option<f64>> = const { Cell::new(None) };
}

/// The job's progress: its stage marked in the list, the bar, the time so far.
fn show_progress(progress: Option<&Progress>) {
    view::show_stages(progress);
    view::show_fraction(stage_fraction(progress));
    if SINCE.get().is_none() {
        SINCE.set(Some(now_ms()));
    }
    tick();
}

/// Every second while the job runs: the time so far.
fn tick() {
    if let Some(since) = SINCE.get() {
        set_text("timing", &view::describe_elapsed(now_ms() - since));
    }
}

/// The job ended (done, failed or cancelled): its progress and Cancel go.
fn ended() {
    SINCE.set(None);
    set_visible("run", false);
}

/// The finished image's actions, as the studio has them: copy, save (shown by [`JobView`]), and the
/// studio itself at this job for the rest (again with a new seed, variations, the seed reused).
fn show_actions(result: &GenerateResult) {
    RESULT.with_borrow_mut(|kept| *kept = Some(result.clone()));
    let studio = element::<HtmlAnchorElement>("open-studio");
    studio.set_href(&format!("studio.html?job={}", js_sys::encode_uri_component(&result.job)));
    set_visible("open-studio", true);
    set_visible("copy", true);
}

/// Entry point of `result.js`.
#[wasm_bindgen(js_name = resultPageMain)]
pub fn result_page_main() {
    i18n::localize_page();
    view::build_stages();
    let search = web_sys::window().and_then(|w| w.location().search().ok()).unwrap_or_default();
    let params = web_sys::UrlSearchParams::new_with_str(&search).ok();
    let param = |name: &str| params.as_ref().and_then(|p| p.get(name));
    if let Some(error) = param("error") {
        let message = param("message").and_then(|m| serde_json::from_str::<Message>(&m).ok());
        JobView { job: String::new() }.show_failure(&error, message.as_ref());
        return ended();
    }
    let Some(job) = param("job") else {
        JobView { job: String::new() }.show_error(&i18n::t("resultNoJob"));
        return ended();
    };
    VIEW.with_borrow_mut(|view| *view = Some(JobView { job: job.clone() }));
    on("copy", "click", |_| {
        if let Some(result) = RESULT.with_borrow(Clone::clone) {
            copy_png(&result);
        }
    });
    let cancelled = job.clone();
    on("cancel", "click", move |_| {
        let job = cancelled.clone();
        spawn_local(async move {
            if let Reply::Error { error, message } = request(&Request::Cancel { job }).await {
                set_text("action-status", &i18n::error_text(&error, message.as_ref()));
            }
        });
    });
    view::every_second(tick);
    spawn_local(async move {
        if let Reply::Job(state) = request(&Request::Job { job }).await {
            match &state {
                JobState::Running { prompt, progress, .. } => {
                    set_text("prompt-text", prompt);
                    show_progress(progress.as_ref());
                }
                JobState::Done { result, .. } => {
                    set_text("prompt-text", &result.image.prompt);
                    show_actions(result);
                }
                _ => {}
            }
            if VIEW.with_borrow(|view| view.as_ref().is_some_and(|v| v.show_state(&state))) {
                ended();
            }
        }
    });
}

/// `chrome.runtime.onMessage` in the result page: events only.
#[wasm_bindgen(js_name = resultPageEvent)]
pub fn result_page_event(message: JsValue) {
    let Ok(event) = from_js::<Event>(&message) else { return };
    if let Event::Result(result) = &event {
        VIEW.with_borrow(|view| {
            if view.as_ref().is_some_and(|v| v.job == result.job) {
                set_text("prompt-text", &result.image.prompt);
                show_actions(result);
            }
        });
    }
    let ours = VIEW.with_borrow(|view| view.as_ref().map(|v| v.job.clone()));
    if let Event::Progress { job, progress } = &event {
        if Some(job) == ours.as_ref() {
            show_progress(Some(progress));
        }
    }
    if VIEW.with_borrow(|view| view.as_ref().is_some_and(|v| v.apply(&event))) {
        ended();
    }
}
