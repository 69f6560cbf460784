//! Checking the studio's and the popup's generate form before a request is sent: an empty prompt, a
//! prompt too long, a size, a number of steps or a seed that is not allowed is shown at its control
//! (`aria-invalid`, a message tied to it by `aria-describedby`, focus moved to it), in the page's
//! language, and no job is started. A size or a number of steps that is not allowed comes with
//! buttons that put the nearest allowed values in its place. Any other problem (a page's own setting
//! such as the schedule) is the page's general error, as the service worker would say it.
//!
//! Each checked control `#id` has a message element `#id-error` (hidden while the control is valid)
//! holding a `.message` and a `.fixes` element, and names `id-error` in its `aria-describedby`. The
//! options page's defaults are the same controls under a prefix (`#default-width`, ...).

use imagine_core::api::GenerateRequest;
#[cfg(test)]
use imagine_core::api::Seed;
use imagine_core::params::{
    nearest_sizes, GenerateParams, ParamError, MAX_SIZE, MAX_STEPS, MIN_SIZE, SIZE_MULTIPLE,
};
use wasm_bindgen::JsCast;
use web_sys::{HtmlElement, HtmlInputElement};

use crate::pages::view::{child, document, dom, element, on, on_item_click};
use crate::platform::i18n;
use crate::platform::js::LogError;

/// The controls checked, by id: the same in the studio and the popup.
pub const FIELDS: [&str; 5] = ["prompt", "width", "height", "steps", "seed"];

/// Why the form cannot be sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Problem {
    /// The prompt is empty or only white space: there is nothing to make an image of.
    EmptyPrompt,
    /// The value of the control `field` (one of [`FIELDS`]) is not allowed.
    Field {
        /// The control's id.
        field: &'static str,
        /// What the core's validation said.
        error: ParamError,
    },
    /// Anything else: the page's general error (a page's own setting such as the schedule).
    Other(ParamError),
}

/// Checks the request a form made: the prompt must say something, and every field must be allowed.
pub fn check(request: &GenerateRequest) -> Result<GenerateParams, Problem> {
    if request.prompt.trim().is_empty() {
        return Err(Problem::EmptyPrompt);
    }
    request.clone().validate(0).map_err(|error| {
        let field = match &error {
            ParamError::Size { field, .. } => *field,
            ParamError::Prompt { .. } => "prompt",
            ParamError::Steps { .. } => "steps",
            ParamError::Seed { .. } => "seed",
            _ => return Problem::Other(error),
        };
        Problem::Field { field, error }
    })
}

/// The controls whose message offers values to put in their place.
const FIXED_FIELDS: [&str; 3] = ["width", "height", "steps"];

/// Wires the fix buttons (one listener per message) and clears a control's mark once it is edited.
pub fn wire() {
    for field in FIELDS {
        clear_on_input(field);
    }
    wire_fixes("");
}

/// Wires the fix buttons of the controls named `prefix` + one of width, height, steps.
pub fn wire_fixes(prefix: &'static str) {
    for field in FIXED_FIELDS {
        let field = format!("{prefix}{field}");
        let id = format!("{field}-error");
        on_item_click(&id, "button[data-value]", move |button| {
            let Some(value) = button.get_attribute("data-value") else { return };
            let control = element::<HtmlInputElement>(&field);
            control.set_value(&value);
            // The page hears it as typed (the studio's presets follow the size).
            if let Ok(event) = web_sys::Event::new("input") {
                control.dispatch_event(&event).log_error("applying a fix");
            }
            dom::focus(&control);
        });
    }
}

/// Clears the mark of the control `field` once it is edited.
pub fn clear_on_input(field: &'static str) {
    on(field, "input", move |_| clear_field(field));
}

/// Removes every mark of an earlier check.
pub fn clear() {
    for field in FIELDS {
        clear_field(field);
    }
}

fn clear_field(field: &str) {
    dom::remove_attr(&element::<HtmlElement>(field), "aria-invalid");
    element::<HtmlElement>(&format!("{field}-error")).set_hidden(true);
}

/// Shows `problem` at its control and moves the focus there; `Some(text)` for a problem no control
/// shows, for the page's general error.
pub fn show(problem: &Problem) -> Option<String> {
    show_at(problem, "")
}

/// [`show`], for controls named `prefix` + the field.
pub fn show_at(problem: &Problem, prefix: &str) -> Option<String> {
    let (field, error) = match problem {
        Problem::EmptyPrompt => ("prompt", None),
        Problem::Field { field, error } => (*field, Some(error)),
        Problem::Other(error) => return Some(i18n::error(error)),
    };
    let field = format!("{prefix}{field}");
    let text = match error {
        None => i18n::t("fieldPromptEmpty"),
        Some(ParamError::Size { value, .. }) => i18n::t_args(
            "fieldSizeInvalid",
            &[&value.to_string(), &SIZE_MULTIPLE.to_string(), &MIN_SIZE.to_string(), &MAX_SIZE.to_string()],
        ),
        Some(ParamError::Seed { value, .. }) => i18n::t_args("fieldSeedInvalid", &[value]),
        Some(ParamError::Steps { value }) => {
            i18n::t_args("fieldStepsInvalid", &[&value.to_string(), &MAX_STEPS.to_string()])
        }
        Some(other) => i18n::error(other),
    };
    // The allowed values nearest to the one typed, each on a button that puts it in its place.
    let (values, nearest) = match error {
        Some(ParamError::Size { value, .. }) => {
            let sizes: Vec<String> = nearest_sizes(*value).iter().map(u32::to_string).collect();
            let nearest = match sizes.as_slice() {
                [one] => Some(i18n::t_args("fieldSizeNearest1", &[one])),
                [low, high] => Some(i18n::t_args("fieldSizeNearest2", &[low, high])),
                _ => None,
            };
            (sizes, nearest)
        }
        Some(ParamError::Steps { value }) => (vec![nearest_steps(*value).to_string()], None),
        _ => (Vec::new(), None),
    };
    let message = element::<HtmlElement>(&format!("{field}-error"));
    child::<HtmlElement>(&message, ".message").set_text_content(Some(&text));
    let fixes = child::<HtmlElement>(&message, ".fixes");
    fixes.set_text_content(None);
    if let Some(nearest) = nearest {
        append(&fixes, "span", &nearest, None);
    }
    for value in &values {
        append(&fixes, "button", &i18n::t_args("fieldUseSize", &[value]), Some(value));
    }
    reveal(&field, &message);
    None
}

/// The allowed number of steps nearest to `value`.
pub fn nearest_steps(value: i64) -> u32 {
    value.clamp(1, i64::from(MAX_STEPS)) as u32
}

/// Shows `text` at the control `field` (whose message element is `#field-error`, as above), marks it
/// and moves the focus there: for a page's own checks (the options page's limits; the page wires
/// [`clear_on_input`] for it).
pub fn mark(field: &str, text: &str) {
    let message = element::<HtmlElement>(&format!("{field}-error"));
    child::<HtmlElement>(&message, ".message").set_text_content(Some(text));
    child::<HtmlElement>(&message, ".fixes").set_text_content(None);
    reveal(field, &message);
}

/// Shows `message` and marks `field` invalid, with the focus on it.
fn reveal(field: &str, message: &HtmlElement) {
    message.set_hidden(false);
    let control = element::<HtmlElement>(field);
    dom::set_attr(&control, "aria-invalid", "true");
    // The popup keeps its options folded: the control must be visible to take the focus.
    if let Some(details) = control.closest("details").ok().flatten() {
        dom::set_attr(&details, "open", "");
    }
    dom::focus(&control);
}

/// Appends a `tag` with `text` to `parent`; a button carries `value` as `data-value`.
fn append(parent: &HtmlElement, tag: &str, text: &str, value: Option<&str>) {
    let Ok(node) = document().create_element(tag) else { return };
    node.set_text_content(Some(text));
    if let Some(value) = value {
        dom::set_attr(&node, "type", "button");
        dom::set_attr(&node, "data-value", value);
    }
    if let Some(node) = node.dyn_ref::<HtmlElement>() {
        dom::append(parent, node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(prompt: &str, width: i64) -> GenerateRequest {
        GenerateRequest { prompt: prompt.into(), width: Some(width), ..Default::default() }
    }

    #[test]
    fn an_empty_prompt_or_a_bad_field_is_found_at_its_control() {
        assert_eq!(check(&form("", 512)), Err(Problem::EmptyPrompt));
        assert_eq!(check(&form(" \n\t", 500)), Err(Problem::EmptyPrompt));
        assert_eq!(
            check(&form("a cat", 500)),
            Err(Problem::Field { field: "width", error: ParamError::Size { field: "width", value: 500 } })
        );
        let steps = GenerateRequest { steps: Some(0), ..form("a cat", 512) };
        assert!(matches!(check(&steps), Err(Problem::Field { field: "steps", .. })));
        let seed = GenerateRequest { seed: Some(Seed::Text("x".into())), ..form("a cat", 512) };
        assert!(matches!(check(&seed), Err(Problem::Field { field: "seed", .. })));
        let schedule = GenerateRequest { schedule: Some("x".into()), ..form("a cat", 512) };
        assert!(matches!(check(&schedule), Err(Problem::Other(_))));
        assert_eq!(check(&form("a cat", 496)).map(|p| p.width), Ok(496));
    }

    #[test]
    fn steps_out_of_range_are_offered_the_nearest_allowed() {
        assert_eq!(nearest_steps(99), MAX_STEPS);
        assert_eq!(nearest_steps(0), 1);
        assert_eq!(nearest_steps(-5), 1);
        assert_eq!(nearest_steps(12), 12);
    }
}
