//! The result page the context menu opens: the prompt (as text), progress and the image of one job,
//! with its parameters and actions: copy, save, and the studio at this job for the rest.

use std::cell::RefCell;

use imagine_core::api::{Event, GenerateResult, JobState, Reply, Request};
use imagine_core::message::Message;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::spawn_local;
use web_sys::HtmlAnchorElement;

use crate::pages::view::{copy_png, element, on, set_text, set_visible, JobView};
use crate::platform::i18n;
use crate::platform::js::from_js;
use crate::platform::messaging::request;

thread_local! {
    static VIEW: RefCell<Option<JobView>> = const { RefCell::new(None) };
    /// The finished image, for "Copy".
    static RESULT: RefCell<Option<GenerateResult>> = const { RefCell::new(None) };
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
    let search = web_sys::window().and_then(|w| w.location().search().ok()).unwrap_or_default();
    let params = web_sys::UrlSearchParams::new_with_str(&search).ok();
    let param = |name: &str| params.as_ref().and_then(|p| p.get(name));
    if let Some(error) = param("error") {
        let message = param("message").and_then(|m| serde_json::from_str::<Message>(&m).ok());
        JobView { job: String::new() }.show_error(&i18n::error_text(&error, message.as_ref()));
        return;
    }
    let Some(job) = param("job") else {
        JobView { job: String::new() }.show_error(&i18n::t("resultNoJob"));
        return;
    };
    VIEW.with_borrow_mut(|view| *view = Some(JobView { job: job.clone() }));
    on("copy", "click", |_| {
        if let Some(result) = RESULT.with_borrow(Clone::clone) {
            copy_png(&result);
        }
    });
    spawn_local(async move {
        if let Reply::Job(state) = request(&Request::Job { job }).await {
            match &state {
                JobState::Running { prompt, .. } => set_text("prompt-text", prompt),
                JobState::Done { result, .. } => {
                    set_text("prompt-text", &result.prompt);
                    show_actions(result);
                }
                _ => {}
            }
            VIEW.with_borrow(|view| view.as_ref().map(|v| v.show_state(&state)));
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
                set_text("prompt-text", &result.prompt);
                show_actions(result);
            }
        });
    }
    VIEW.with_borrow(|view| view.as_ref().map(|v| v.apply(&event)));
}
