//! The pages' view layer: elements by id, text and visibility, the "Delete model" confirmation, lists
//! of definitions, and what the popup and the result page both show for a job (progress, the image,
//! errors). Text from the prompt or a page is only ever set as text, never parsed as HTML.

use imagine_core::api::{Event, GenerateResult, JobState, Progress, Stage};
use wasm_bindgen::prelude::*;
use web_sys::{Document, HtmlElement, HtmlImageElement};

use crate::platform::i18n;

/// The page's document.
pub fn document() -> Document {
    web_sys::window().and_then(|w| w.document()).expect("pages have a document")
}

/// The element with `id`, which the page's HTML must have.
pub fn element<T: JsCast>(id: &str) -> T {
    document().get_element_by_id(id).unwrap_or_else(|| panic!("the page has no #{id}")).unchecked_into()
}

/// Sets an element's text (as text).
pub fn set_text(id: &str, text: &str) {
    element::<HtmlElement>(id).set_text_content(Some(text));
}

/// Shows or hides an element.
pub fn set_visible(id: &str, visible: bool) {
    element::<HtmlElement>(id).set_hidden(!visible);
}

/// Wires the page's "Delete model" button (`#delete-pack`) to its confirmation (`#delete-confirm`, a
/// `<dialog>`): deleting means downloading the pack again, so it is asked first, with the safe choice
/// focused; `delete` runs on "Delete".
pub fn confirm_delete_model(delete: impl Fn() + 'static) {
    let dialog = || element::<web_sys::HtmlDialogElement>("delete-confirm");
    let on = |id: &str, f: Box<dyn Fn()>| {
        let closure = Closure::<dyn Fn()>::new(f);
        element::<HtmlElement>(id).set_onclick(Some(closure.as_ref().unchecked_ref()));
        closure.forget();
    };
    on(
        "delete-pack",
        Box::new(move || {
            let _ = dialog().show_modal();
            let _ = element::<HtmlElement>("delete-confirm-no").focus();
        }),
    );
    on("delete-confirm-no", Box::new(move || dialog().close()));
    on(
        "delete-confirm-yes",
        Box::new(move || {
            dialog().close();
            delete();
        }),
    );
}

/// What the confirmation of [`confirm_delete_model`] says, for an installed pack of `bytes`.
pub fn set_delete_model_question(bytes: u64) {
    let size = imagine_core::hub::format_bytes(bytes);
    set_text("delete-confirm-text", &i18n::t_args("deleteModelQuestion", &[&size]));
}

/// A human description of a progress report.
/// Appends a `<dt>name</dt><dd>value</dd>` pair to `list` for each row, as text.
pub fn fill_definitions(list: &web_sys::Element, rows: Vec<(String, String)>) {
    let document = document();
    for (name, value) in rows {
        let (Ok(dt), Ok(dd)) = (document.create_element("dt"), document.create_element("dd")) else {
            continue;
        };
        dt.set_text_content(Some(&name));
        dd.set_text_content(Some(&value));
        let _ = list.append_child(&dt);
        let _ = list.append_child(&dd);
    }
}

/// What a progress report says: the stage, or the step of how many.
pub fn describe(progress: &Progress) -> String {
    match progress.stage {
        Stage::TextEncoder => i18n::t("progressEncoding"),
        Stage::Transformer if progress.step == 0 => i18n::t("progressLoadingModel"),
        Stage::Transformer => {
            i18n::t_args("progressStep", &[&progress.step.to_string(), &progress.steps.to_string()])
        }
        Stage::Decoder => i18n::t("progressDecoding"),
    }
}

/// Renders one job into the shared element ids: `#progress`, `#error`, `#image`, `#meta`, `#save-png`.
pub struct JobView {
    pub job: String,
}

impl JobView {
    /// Applies an event; returns true when it ended the job.
    pub fn apply(&self, event: &Event) -> bool {
        match event {
            Event::Progress { job, progress } if *job == self.job => {
                set_text("progress", &describe(progress));
                false
            }
            Event::Result(result) if result.job == self.job => {
                self.show_result(result);
                true
            }
            Event::Failed { job, error, message } if *job == self.job => {
                self.show_error(&i18n::error_text(error, message.as_ref()));
                true
            }
            Event::Cancelled { job } if *job == self.job => {
                set_text("progress", &i18n::t("progressCancelled"));
                true
            }
            _ => false,
        }
    }

    /// Shows a stored job state (for pages opened after the job started); true when the job has ended.
    pub fn show_state(&self, state: &JobState) -> bool {
        match state {
            JobState::Running { progress, .. } => {
                set_text("progress", &progress.as_ref().map_or_else(|| i18n::t("starting"), describe));
                false
            }
            JobState::Done { result, .. } => {
                self.show_result(result);
                true
            }
            JobState::Failed { error, message, .. } => {
                self.show_error(&i18n::error_text(error, message.as_ref()));
                true
            }
            JobState::Cancelled { .. } => {
                set_text("progress", &i18n::t("progressCancelled"));
                true
            }
            JobState::Unknown => {
                self.show_error(&i18n::t("jobGone"));
                true
            }
        }
    }

    pub fn show_error(&self, error: &str) {
        set_text("progress", "");
        set_text("error", error);
        set_visible("error", true);
    }

    fn show_result(&self, result: &GenerateResult) {
        let url = format!("data:image/png;base64,{}", result.png);
        let image: HtmlImageElement = element("image");
        image.set_src(&url);
        image.set_alt(&result.prompt);
        set_visible("image", true);
        let download: web_sys::HtmlAnchorElement = element("save-png");
        download.set_href(&url);
        download.set_download(&format!("imagine-{}.png", result.seed));
        set_visible("save-png", true);
        set_text("progress", &i18n::t("progressDone"));
        let mut meta = i18n::t_args(
            "viewMeta",
            &[
                &result.width.to_string(),
                &result.height.to_string(),
                &result.steps.to_string(),
                &result.schedule,
                &result.seed,
            ],
        );
        if result.truncated {
            meta.push_str(&i18n::t_args("viewTruncated", &[&result.token_count.to_string()]));
        }
        set_text("meta", &meta);
    }
}
