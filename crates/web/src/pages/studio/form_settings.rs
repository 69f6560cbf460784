//! The form's settings, kept from one visit to the next in `localStorage`, and the options page's
//! defaults when they were saved later.

use super::*;
use crate::platform::storage::PageKey;

/// The form's settings, kept from one visit to the next.
const FORM: PageKey<FormSettings> = PageKey::new("imagine.studio.settings");

/// The form's settings as last used (the prompt is not kept).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct FormSettings {
    width: String,
    height: String,
    steps: String,
    seed_fixed: bool,
    seed: String,
    schedule: String,
    /// When they were saved (milliseconds since the epoch), against the options page's defaults.
    saved_at_ms: f64,
}

pub(super) fn save_settings() {
    let settings = FormSettings {
        saved_at_ms: js_sys::Date::now(),
        width: input("width").value(),
        height: input("height").value(),
        steps: input("steps").value(),
        seed_fixed: input("seed-fixed").checked(),
        seed: input("seed").value(),
        schedule: element::<HtmlSelectElement>("schedule").value(),
    };
    FORM.set(&settings);
}

/// The form's settings kept from the last visit, if any.
pub(super) fn kept_settings() -> Option<FormSettings> {
    FORM.get()
}

pub(super) fn restore_settings() {
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

/// The options page's defaults, where they were saved after this form's own settings: size, steps and
/// schedule start from them, as the popup's do.
pub(super) async fn apply_newer_defaults() {
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
