//! What the popup and the result page both show for a job: progress, the image, errors.
//! Text from the prompt or a page is only ever set as text, never parsed as HTML.

use imagine_core::api::{Event, GenerateResult, JobState, Progress, Stage};
use wasm_bindgen::prelude::*;
use web_sys::{Document, HtmlElement, HtmlImageElement};

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

/// A human description of a progress report.
pub fn describe(progress: &Progress) -> String {
    match progress.stage {
        Stage::TextEncoder => "Encoding the prompt\u{2026}".to_owned(),
        Stage::Transformer if progress.step == 0 => "Loading the image model\u{2026}".to_owned(),
        Stage::Transformer => format!("Step {} of {}", progress.step, progress.steps),
        Stage::Decoder => "Decoding the image\u{2026}".to_owned(),
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
            Event::Failed { job, error } if *job == self.job => {
                self.show_error(error);
                true
            }
            Event::Cancelled { job } if *job == self.job => {
                set_text("progress", "Cancelled.");
                true
            }
            _ => false,
        }
    }

    /// Shows a stored job state (for pages opened after the job started); true when the job has ended.
    pub fn show_state(&self, state: &JobState) -> bool {
        match state {
            JobState::Running { progress, .. } => {
                set_text("progress", &progress.as_ref().map_or("Starting\u{2026}".to_owned(), describe));
                false
            }
            JobState::Done { result, .. } => {
                self.show_result(result);
                true
            }
            JobState::Failed { error, .. } => {
                self.show_error(error);
                true
            }
            JobState::Cancelled { .. } => {
                set_text("progress", "Cancelled.");
                true
            }
            JobState::Unknown => {
                self.show_error("This image is no longer available.");
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
        set_text("progress", "Done.");
        let mut meta = format!(
            "{}\u{00d7}{}, {} steps, {}, seed {}",
            result.width, result.height, result.steps, result.schedule, result.seed
        );
        if result.truncated {
            meta.push_str(&format!(
                ". The prompt was longer than the model reads: only its first {} tokens were used.",
                result.token_count
            ));
        }
        set_text("meta", &meta);
    }
}
