//! The result page the context menu opens: the prompt (as text), progress and the image of one job.

use std::cell::RefCell;

use imagine_core::api::{Event, JobState, Reply, Request};
use imagine_core::message::Message;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::spawn_local;

use crate::pages::view::{set_text, JobView};
use crate::platform::i18n;
use crate::platform::js::from_js;
use crate::platform::messaging::request;

thread_local! {
    static VIEW: RefCell<Option<JobView>> = const { RefCell::new(None) };
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
    spawn_local(async move {
        if let Reply::Job(state) = request(&Request::Job { job }).await {
            match &state {
                JobState::Running { prompt, .. } => set_text("prompt-text", prompt),
                JobState::Done { result, .. } => set_text("prompt-text", &result.prompt),
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
            }
        });
    }
    VIEW.with_borrow(|view| view.as_ref().map(|v| v.apply(&event)));
}
