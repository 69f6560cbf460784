//! The toolbar popup: install the pack, type a prompt, watch progress, cancel, see the image.

use std::cell::RefCell;

use imagine_core::api::{Event, GenerateRequest, PackStatus, Reply, Request, Seed};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::spawn_local;
use web_sys::{HtmlButtonElement, HtmlInputElement, HtmlSelectElement, HtmlTextAreaElement};

use crate::js::{from_js, to_js};
use crate::messaging::send;
use crate::view::{element, set_text, set_visible, JobView};

/// The published pack, resolved at `main`.
pub const DEFAULT_PACK_URL: &str = "https://huggingface.co/cgb/flux2-klein-4b-onnx-webgpu/resolve/main/";
/// The job shown by the popup survives closing and reopening it.
const JOB_KEY: &str = "imagine.popup.job";

thread_local! {
    static VIEW: RefCell<Option<JobView>> = const { RefCell::new(None) };
}

/// Sends a request of the message API and returns the reply.
pub async fn request(request: &Request) -> Reply {
    match send(&to_js(request)).await.and_then(|reply| from_js(&reply)) {
        Ok(reply) => reply,
        Err(error) => Reply::Error { error },
    }
}

/// Entry point of `popup.js`.
#[wasm_bindgen(js_name = popupMain)]
pub fn popup_main() {
    element::<HtmlInputElement>("pack-url").set_value(DEFAULT_PACK_URL);
    on_click("generate", || spawn_local(generate()));
    on_click("cancel", || spawn_local(cancel()));
    on_click("install", || spawn_local(install()));
    spawn_local(async {
        refresh_pack().await;
        if let Some(job) = storage().and_then(|s| s.get_item(JOB_KEY).ok().flatten()) {
            show_job(job.clone());
            if let Reply::Job(state) = request(&Request::Job { job }).await {
                let ended = VIEW.with_borrow(|view| view.as_ref().is_some_and(|v| v.show_state(&state)));
                set_running(!ended);
            }
        }
    });
}

/// `chrome.runtime.onMessage` in the popup: events only.
#[wasm_bindgen(js_name = popupEvent)]
pub fn popup_event(message: JsValue) {
    let Ok(event) = from_js::<Event>(&message) else { return };
    match &event {
        Event::PackProgress(p) => set_text(
            "pack-status",
            &format!("Downloading {}: {} of {} MB", p.file, p.done_bytes >> 20, p.total_bytes >> 20),
        ),
        Event::PackInstalled { .. } | Event::PackFailed { .. } => spawn_local(refresh_pack()),
        _ => {
            let ended = VIEW.with_borrow(|view| view.as_ref().is_some_and(|v| v.apply(&event)));
            if ended {
                set_running(false);
            }
        }
    }
}

fn on_click(id: &str, action: impl Fn() + 'static) {
    let closure = Closure::<dyn Fn()>::new(action);
    element::<HtmlButtonElement>(id).set_onclick(Some(closure.as_ref().unchecked_ref()));
    closure.forget();
}

fn storage() -> Option<web_sys::Storage> {
    web_sys::window()?.local_storage().ok().flatten()
}

fn show_job(job: String) {
    set_visible("error", false);
    set_visible("image", false);
    set_visible("download", false);
    set_text("meta", "");
    VIEW.with_borrow_mut(|view| *view = Some(JobView { job }));
}

fn set_running(running: bool) {
    element::<HtmlButtonElement>("generate").set_disabled(running);
    set_visible("cancel", running);
}

async fn refresh_pack() {
    let status = match request(&Request::PackStatus).await {
        Reply::PackStatus(status) => status,
        _ => PackStatus::default(),
    };
    let text = if status.installed {
        format!("Model installed ({:.1} GB), works offline.", status.bytes as f64 / 1e9)
    } else if let Some(p) = &status.installing {
        format!("Downloading {}\u{2026}", p.file)
    } else if let Some(error) = &status.error {
        format!("Install failed: {error}")
    } else {
        "The model is not installed yet.".to_owned()
    };
    set_text("pack-status", &text);
    set_visible("install-form", !status.installed && status.installing.is_none());
}

async fn install() {
    let base_url = element::<HtmlInputElement>("pack-url").value();
    match request(&Request::InstallPack { base_url }).await {
        Reply::Error { error } => set_text("pack-status", &error),
        _ => {
            set_text("pack-status", "Starting the download\u{2026}");
            set_visible("install-form", false);
        }
    }
}

fn number(id: &str) -> Option<i64> {
    element::<HtmlInputElement>(id).value().trim().parse().ok()
}

async fn generate() {
    let seed = element::<HtmlInputElement>("seed").value();
    let seed = seed.trim();
    let generate = GenerateRequest {
        prompt: element::<HtmlTextAreaElement>("prompt").value(),
        width: number("width"),
        height: number("height"),
        steps: number("steps"),
        seed: (!seed.is_empty()).then(|| Seed::Text(seed.to_owned())),
        schedule: Some(element::<HtmlSelectElement>("schedule").value()),
        ..Default::default()
    };
    set_visible("error", false);
    match request(&Request::Generate(generate)).await {
        Reply::JobStarted { job, .. } => {
            if let Some(storage) = storage() {
                let _ = storage.set_item(JOB_KEY, &job);
            }
            show_job(job);
            set_text("progress", "Starting\u{2026}");
            set_running(true);
        }
        Reply::Error { error } => {
            set_text("error", &error);
            set_visible("error", true);
        }
        other => web_sys::console::warn_1(&format!("unexpected reply {other:?}").into()),
    }
}

async fn cancel() {
    let job = VIEW.with_borrow(|view| view.as_ref().map(|v| v.job.clone()));
    if let Some(job) = job {
        request(&Request::Cancel { job }).await;
    }
}
