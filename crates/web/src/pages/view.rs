//! The pages' view layer: elements by id, text and visibility, the "Delete model" confirmation, lists
//! of definitions, a job's progress as the studio and the result page show it (the stage list, the
//! bar, the time so far and left, a one-second timer), and what the popup and the result page both
//! show for a job (progress, the image, errors). Text from the prompt or a page is only ever set as
//! text, never parsed as HTML.

use imagine_core::api::{Event, GenerateResult, JobState, Progress, Stage};
use imagine_core::message::Message;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{spawn_local, JsFuture};
use web_sys::{Document, HtmlAnchorElement, HtmlElement, HtmlImageElement};

use crate::platform::i18n::{self, TimeUnit};
use crate::platform::js::{LogError, Obj};

/// DOM writes whose failure would leave the page quietly wrong: each is logged with what it did
/// rather than dropped.
pub mod dom {
    use web_sys::{Element, HtmlElement, Node};

    use crate::platform::js::LogError;

    /// Sets the attribute `name` of `element`.
    pub fn set_attr(element: &Element, name: &str, value: &str) {
        element.set_attribute(name, value).log_error(&format!("setting {name}"));
    }

    /// Removes the attribute `name` of `element`.
    pub fn remove_attr(element: &Element, name: &str) {
        element.remove_attribute(name).log_error(&format!("removing {name}"));
    }

    /// Appends `child` to `parent`.
    pub fn append(parent: &Node, child: &Node) {
        parent.append_child(child).log_error("adding an element");
    }

    /// Moves the focus to `element`.
    pub fn focus(element: &HtmlElement) {
        element.focus().log_error("moving the focus");
    }
}

/// The page's document (`globalThis.document`, which every page has; workers never come here).
pub fn document() -> Document {
    crate::platform::js::get(&js_sys::global(), "document").unchecked_into()
}

/// The element with `id`, which the page's HTML must have.
pub fn element<T: JsCast>(id: &str) -> T {
    document().get_element_by_id(id).unwrap_or_else(|| panic!("the page has no #{id}")).unchecked_into()
}

/// The `<input>` with `id`.
pub fn input(id: &str) -> web_sys::HtmlInputElement {
    element(id)
}

/// Sets an element's text (as text).
pub fn set_text(id: &str, text: &str) {
    element::<HtmlElement>(id).set_text_content(Some(text));
}

/// Shows or hides an element.
pub fn set_visible(id: &str, visible: bool) {
    element::<HtmlElement>(id).set_hidden(!visible);
}

/// A copy of the element the `<template>` `#id` holds: rows a page repeats are drawn from its markup,
/// the code filling in their text and attributes only.
pub fn from_template(id: &str) -> web_sys::Element {
    let template: web_sys::HtmlTemplateElement = element(id);
    let first = template.content().first_element_child();
    let copy = first.and_then(|e| e.clone_node_with_deep(true).ok());
    copy.unwrap_or_else(|| panic!("#{id} holds no element")).unchecked_into()
}

/// The element matching `selector` inside `parent`, which the page's markup must have.
pub fn child<T: JsCast>(parent: &web_sys::Element, selector: &str) -> T {
    let found = parent.query_selector(selector).ok().flatten();
    found.unwrap_or_else(|| panic!("no {selector} in its template")).unchecked_into()
}

/// Calls `action` on every `event` at the element `id`, for the page's life: each page wires its
/// controls once, when it starts.
pub fn on(id: &str, event: &str, action: impl Fn(web_sys::Event) + 'static) {
    let closure = Closure::<dyn Fn(web_sys::Event)>::new(action);
    let listener = closure.as_ref().unchecked_ref();
    element::<HtmlElement>(id)
        .add_event_listener_with_callback(event, listener)
        .log_error(&format!("#{id}: no {event} listener"));
    closure.forget();
}

/// Ctrl+Enter (Cmd+Enter on a Mac) in the field `field` clicks `button`, as in chat and image apps;
/// Enter alone still makes a new line.
pub fn ctrl_enter_clicks(field: &'static str, button: &'static str) {
    on(field, "keydown", move |event| {
        let Some(key) = event.dyn_ref::<web_sys::KeyboardEvent>() else { return };
        if key.key() == "Enter" && (key.ctrl_key() || key.meta_key()) && !key.is_composing() {
            event.prevent_default();
            element::<HtmlElement>(button).click();
        }
    });
}

/// Calls `action` with the element matching `selector` that a click in `#container_id` landed on or
/// inside: one listener for a grid however often it is drawn anew, its items told apart by their
/// attributes.
pub fn on_item_click(
    container_id: &str,
    selector: &'static str,
    action: impl Fn(web_sys::Element) + 'static,
) {
    on(container_id, "click", move |event| {
        let target = event.target().and_then(|t| t.dyn_into::<web_sys::Element>().ok());
        if let Some(item) = target.and_then(|t| t.closest(selector).ok().flatten()) {
            action(item);
        }
    });
}

/// Shows a PNG (`png`, base64) in the `<img>` `#image_id`, `alt` as its text, and points the link
/// `#save_id` at it, saved as `imagine-<seed>.png`.
pub fn show_png(image_id: &str, save_id: &str, png: &str, alt: &str, seed: u64) {
    let url = format!("data:image/png;base64,{png}");
    let image: HtmlImageElement = element(image_id);
    image.set_src(&url);
    image.set_alt(alt);
    let save: HtmlAnchorElement = element(save_id);
    save.set_href(&url);
    save.set_download(&format!("imagine-{seed}.png"));
}

/// Wires the page's "Delete model" button (`#delete-pack`) to its confirmation (`#delete-confirm`, a
/// `<dialog>`): deleting means downloading the pack again, so it is asked first, with the safe choice
/// focused; `delete` runs on "Delete".
pub fn confirm_delete_model(delete: impl Fn() + 'static) {
    let dialog = || element::<web_sys::HtmlDialogElement>("delete-confirm");
    on("delete-pack", "click", move |_| {
        dialog().show_modal().log_error("opening the Delete model question");
        dom::focus(&element::<HtmlElement>("delete-confirm-no"));
    });
    on("delete-confirm-no", "click", move |_| dialog().close());
    on("delete-confirm-yes", "click", move |_| {
        dialog().close();
        delete();
    });
}

/// What the confirmation of [`confirm_delete_model`] says for the installed pack: its name, and that
/// making images again means downloading its size again (the published pack's 6.5 GB, or whatever the
/// installed one holds), in the units the pages show sizes in.
pub fn set_delete_model_question(status: &imagine_core::api::PackStatus) {
    let repo = status.source.as_ref().map(|s| s.repo.as_str()).unwrap_or_default();
    let size = i18n::bytes(status.bytes);
    set_text("delete-confirm-text", &i18n::t_args("deleteModelQuestion", &[repo, &size]));
}

/// Appends a `<dt>name</dt><dd>value</dd>` pair to `list` for each row, as text.
pub fn fill_definitions(list: &web_sys::Element, rows: Vec<(String, String)>) {
    let document = document();
    for (name, value) in rows {
        let (Ok(dt), Ok(dd)) = (document.create_element("dt"), document.create_element("dd")) else {
            continue;
        };
        dt.set_text_content(Some(&name));
        dd.set_text_content(Some(&value));
        dom::append(list, &dt);
        dom::append(list, &dd);
    }
}

/// A schedule's name (the API's, as a result keeps it) in the page's language.
pub fn schedule_name(name: &str) -> String {
    match name {
        "empirical" => i18n::t("scheduleNameEmpirical"),
        "linear-shift" => i18n::t("scheduleNameLinearShift"),
        other => other.to_owned(),
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

/// "12 s" of a job's time so far.
pub fn describe_elapsed(ms: f64) -> String {
    i18n::duration((ms / 1000.0).floor(), TimeUnit::Seconds, 0)
}

/// "about 12 s left", "about 3 min left", "about 1.5 h left": a job's or a download's estimate.
pub fn describe_time_left(seconds: f64) -> String {
    let left = match seconds.round().max(1.0) as u64 {
        s if s < 90 => i18n::duration(s as f64, TimeUnit::Seconds, 0),
        s if s < 90 * 60 => i18n::duration(((s + 30) / 60) as f64, TimeUnit::Minutes, 0),
        s => i18n::duration(s as f64 / 3600.0, TimeUnit::Hours, 1),
    };
    i18n::t_args("timeLeft", &[&left])
}

/// The ids of the stage list's items, in the order a job goes through them.
const STAGE_IDS: [&str; 3] = ["stage-encode", "stage-steps", "stage-decode"];

/// Fills the stage list `#stages` of a job's progress (the studio's, the result page's): one item per
/// stage, its name in the page's language, marked by [`show_stages`].
pub fn build_stages() {
    let list = element::<HtmlElement>("stages");
    list.set_text_content(None);
    let names = [i18n::t("studioStageEncode"), i18n::t("studioStageSteps"), i18n::t("studioStageDecode")];
    let document = document();
    for (id, name) in STAGE_IDS.iter().zip(names) {
        let Ok(item) = document.create_element("li") else { continue };
        item.set_id(id);
        item.set_text_content(Some(&name));
        dom::append(&list, &item);
    }
}

/// Calls `tick` every second for the page's life: a running job's time so far.
pub fn every_second(tick: impl Fn() + 'static) {
    let timer = Closure::<dyn Fn()>::new(tick);
    if let Some(window) = web_sys::window() {
        window
            .set_interval_with_callback_and_timeout_and_arguments_0(timer.as_ref().unchecked_ref(), 1000)
            .log_error("starting the progress timer");
    }
    timer.forget();
}

/// Fills `#progress-bar` to `fraction` (0 to 1) of the job.
pub fn show_fraction(fraction: f64) {
    dom::set_attr(&element::<HtmlElement>("progress-bar"), "value", &format!("{fraction:.3}"));
}

/// Marks the stage list ([`build_stages`]): done, current (`aria-current="step"`), to come.
pub fn show_stages(progress: Option<&Progress>) {
    let current = progress.map_or(0, |p| match p.stage {
        Stage::TextEncoder => 0,
        Stage::Transformer => 1,
        Stage::Decoder => 2,
    });
    for (i, id) in STAGE_IDS.iter().enumerate() {
        let item = element::<HtmlElement>(id);
        let state = if progress.is_none() || i > current {
            "todo"
        } else if i == current {
            "now"
        } else {
            "done"
        };
        item.set_class_name(state);
        if state == "now" {
            dom::set_attr(&item, "aria-current", "step");
        } else {
            dom::remove_attr(&item, "aria-current");
        }
    }
}

/// Shows an error in `#id` (hidden for `None`): the sentence a person reads first and, where the
/// error's own text is technical (a URL, what the browser said), that text behind "Details".
pub fn show_error_in(id: &str, error: Option<(&str, Option<&Message>)>) {
    let target = element::<HtmlElement>(id);
    target.set_text_content(None);
    target.set_hidden(error.is_none());
    let Some((error, message)) = error else { return };
    let full = i18n::error_text(error, message);
    let Some(plain) = message.and_then(i18n::plain_key) else {
        return target.set_text_content(Some(&full));
    };
    let document = document();
    target.append_with_str_1(&i18n::t(plain)).log_error("showing an error");
    let (Ok(details), Ok(summary), Ok(text)) = (
        document.create_element("details"),
        document.create_element("summary"),
        document.create_element("div"),
    ) else {
        return;
    };
    summary.set_text_content(Some(&i18n::t("detailsLabel")));
    text.set_text_content(Some(&full));
    dom::append(&details, &summary);
    dom::append(&details, &text);
    dom::append(&target, &details);
}

/// Renders one job into the shared element ids: `#progress`, `#error`, `#image`, `#meta`, `#save-png`.
pub struct JobView {
    /// The id of the job shown.
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
                self.show_failure(error, message.as_ref());
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
                self.show_failure(error, message.as_ref());
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

    /// Shows the job's error (as [`show_error_in`] does) in place of the progress.
    pub fn show_failure(&self, error: &str, message: Option<&Message>) {
        set_text("progress", "");
        show_error_in("error", Some((error, message)));
    }

    /// Shows `error` in place of the progress.
    pub fn show_error(&self, error: &str) {
        set_text("progress", "");
        set_text("error", error);
        set_visible("error", true);
    }

    fn show_result(&self, result: &GenerateResult) {
        show_png("image", "save-png", &result.png, &result.image.prompt, result.image.seed);
        set_visible("image", true);
        set_visible("save-png", true);
        set_text("progress", &i18n::t("progressDone"));
        let mut meta = i18n::t_args(
            "viewMeta",
            &[
                &result.image.width.to_string(),
                &result.image.height.to_string(),
                &i18n::count_steps(result.image.steps),
                &schedule_name(&result.image.schedule),
                &result.image.seed.to_string(),
            ],
        );
        if result.truncated {
            meta.push_str(&i18n::t_args("viewTruncated", &[&result.token_count.to_string()]));
        }
        set_text("meta", &meta);
    }
}

/// Copies `result`'s PNG to the clipboard and says so in `#action-status` (the studio, the result
/// page). The blob is made at once, within the click, as Chrome wants.
pub fn copy_png(result: &GenerateResult) {
    use base64::Engine;
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(&result.png) else { return };
    let status = |key: &str| set_text("action-status", &i18n::t(key));
    let copied = (|| -> Result<js_sys::Promise, JsValue> {
        let parts = js_sys::Array::of1(&js_sys::Uint8Array::from(bytes.as_slice()));
        let options = web_sys::BlobPropertyBag::new();
        options.set_type("image/png");
        let blob = web_sys::Blob::new_with_u8_array_sequence_and_options(&parts, &options)?;
        let record = Obj::new().set("image/png", blob).build();
        let item = web_sys::ClipboardItem::new_with_record_from_str_to_blob_promise(record.unchecked_ref())?;
        let window = web_sys::window().ok_or(JsValue::NULL)?;
        Ok(window.navigator().clipboard().write(&js_sys::Array::of1(&item)))
    })();
    spawn_local(async move {
        match copied {
            Ok(promise) => match JsFuture::from(promise).await {
                Ok(_) => status("studioCopied"),
                Err(e) => {
                    web_sys::console::warn_1(&e);
                    status("studioCopyFailed")
                }
            },
            Err(_) => status("studioCopyFailed"),
        }
    });
}
