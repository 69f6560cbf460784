//! Which image sizes fit this GPU's memory, for the studio and the popup: the size presets that will
//! not fit, or fit only with the model loaded in pieces (slower), are marked, and a warning under the
//! size says so before an image that will not fit is started (what it needs, what Imagine may use, and
//! the largest size that fits). The figures are the service worker's
//! (`gpuMemory`); the arithmetic is `imagine_core::gpu_memory`'s, as the offscreen document plans it.

use std::cell::RefCell;

use imagine_core::api::{GpuMemoryRequest, GpuMemoryStatus, Reply, Request};
use imagine_core::gpu_memory::SizeFit;
use wasm_bindgen::JsCast;
use web_sys::{HtmlElement, HtmlInputElement};

use crate::pages::view::{document, element, set_text, set_visible};
use crate::platform::i18n::{self, t, t_args};
use crate::platform::messaging::request;

thread_local! {
    static STATUS: RefCell<Option<GpuMemoryStatus>> = const { RefCell::new(None) };
}

/// Asks the service worker for the budget and the pack's figures (which may probe the GPU, once).
pub async fn load() {
    if let Reply::GpuMemory(status) = request(&Request::GpuMemory(GpuMemoryRequest::default())).await {
        STATUS.set(Some(status));
    }
}

/// Bytes as "6.5" (the page's decimal separator), for "$1 GB".
pub fn gigabytes(bytes: u64) -> String {
    i18n::number(&imagine_core::gpu_memory::gigabytes(bytes))
}

/// What to say of an image of `width` x `height` that will not fit; `None` when it fits, or nothing
/// is known of the budget.
pub fn warning(width: u32, height: u32) -> Option<String> {
    STATUS.with_borrow(|status| {
        let status = status.as_ref()?;
        let budget = status.budget?;
        let plan = status.facts.default_plan(Some(budget), width, height);
        if plan.fits {
            return None;
        }
        let fits = match status.facts.largest_square(budget) {
            Some(side) => t_args("gpuFitsUpTo", &[&side.to_string()]),
            None => t("gpuFitsNone"),
        };
        Some(t_args("gpuSizeWontFit", &[&gigabytes(plan.peak), &gigabytes(budget), &fits]))
    })
}

/// The mark beside a size preset: too big, slower (the model loaded in pieces), or none.
fn preset_mark(width: u32, height: u32) -> String {
    STATUS.with_borrow(|status| {
        let Some((status, budget)) = status.as_ref().and_then(|s| Some((s, s.budget?))) else {
            return String::new();
        };
        match status.facts.default_plan(Some(budget), width, height).size_fit() {
            SizeFit::Fits => String::new(),
            SizeFit::Streamed => t("gpuPresetSlower"),
            SizeFit::TooBig => t("gpuPresetTooBig"),
        }
    })
}

/// Shows [`warning`] for the size in the fields `width` and `height` in `#size-fit`, and marks the
/// size presets (`input[name=size]` valued `WxH`, with a `.fit` beside): [`preset_mark`].
pub fn show() {
    let size = |id| element::<HtmlInputElement>(id).value().trim().parse::<u32>().ok();
    let text = match (size("width"), size("height")) {
        (Some(w), Some(h)) => warning(w, h),
        _ => None,
    };
    set_text("size-fit", text.as_deref().unwrap_or(""));
    set_visible("size-fit", text.is_some());
    let Ok(radios) = document().query_selector_all("input[name=size]") else { return };
    for i in 0..radios.length() {
        let Some(radio) = radios.item(i).and_then(|n| n.dyn_into::<HtmlInputElement>().ok()) else {
            continue;
        };
        let text = radio
            .value()
            .split_once('x')
            .and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
            .map_or(String::new(), |(w, h)| preset_mark(w, h));
        let mark = radio.parent_element().and_then(|chip| chip.query_selector(".fit").ok().flatten());
        if let Some(mark) = mark.and_then(|m| m.dyn_into::<HtmlElement>().ok()) {
            mark.set_text_content(Some(&text));
        }
    }
}
