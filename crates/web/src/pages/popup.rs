//! The toolbar popup: install the pack, type a prompt, watch progress, cancel, see the image.

use std::cell::RefCell;

use imagine_core::api::{Event, GenerateRequest, Reply, Request, Seed};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::spawn_local;
use web_sys::{HtmlButtonElement, HtmlInputElement, HtmlSelectElement, HtmlTextAreaElement};

use crate::pages::form_check::{self, Problem};
use crate::pages::view::{self, element, on, set_text, set_visible, JobView};
use crate::pages::{gpu_fit, setup};
use crate::platform::i18n;
use crate::platform::js::{from_js, LogError};
use crate::platform::messaging::request;
use crate::platform::settings;
use crate::platform::storage::{self, PageKey};

/// The job shown by the popup survives closing and reopening it.
const JOB: PageKey<String> = PageKey::new("imagine.popup.job");

thread_local! {
    static VIEW: RefCell<Option<JobView>> = const { RefCell::new(None) };
}

/// Entry point of `popup.js`.
#[wasm_bindgen(js_name = popupMain)]
pub fn popup_main() {
    i18n::localize_page();
    on("generate", "click", |_| spawn_local(generate()));
    crate::pages::view::ctrl_enter_clicks("prompt", "generate");
    on("cancel", "click", |_| spawn_local(cancel()));
    form_check::wire();
    on("install", "click", |_| install_clicked());
    // The Hub is contacted only when the user asks: for the size, or for the download.
    on("check-size", "click", |_| spawn_local(show_plan()));
    setup::wire_download_controls(|| spawn_local(refresh_pack()));
    view::confirm_delete_model(|| {
        spawn_local(async {
            if let Reply::Error { error, message } = request(&Request::DeletePack {}).await {
                set_text("pack-status", &i18n::error_text(&error, message.as_ref()));
            }
            refresh_pack().await;
        })
    });
    // The click is the gesture `sidePanel.open()` needs; the popup closes once the studio is open.
    on("open-studio", "click", |_| {
        crate::platform::side_panel::open_from_click(|| {
            if let Some(window) = web_sys::window() {
                window.close().log_error("closing the popup");
            }
        })
    });
    for field in ["width", "height"] {
        on(field, "input", |_| gpu_fit::show());
    }
    spawn_local(async {
        fill_form().await;
        gpu_fit::load().await;
        gpu_fit::show();
        refresh_pack().await;
        if let Some(job) = JOB.get() {
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
        Event::PackProgress(progress) => setup::show_download(Some(progress)),
        Event::PackInstalled { .. } | Event::PackFailed { .. } | Event::PackChanged {} => {
            spawn_local(refresh_pack())
        }
        _ => {
            let ended = VIEW.with_borrow(|view| view.as_ref().is_some_and(|v| v.apply(&event)));
            if ended {
                set_running(false);
            }
        }
    }
}

fn show_job(job: String) {
    set_visible("error", false);
    set_visible("image", false);
    set_visible("save-png", false);
    set_text("meta", "");
    VIEW.with_borrow_mut(|view| *view = Some(JobView { job }));
}

fn set_running(running: bool) {
    element::<HtmlButtonElement>("generate").set_disabled(running);
    set_visible("cancel", running);
}

async fn refresh_pack() {
    let Some((status, verdict)) = setup::read_state(&setup::source_from_form()).await else { return };
    let text = if status.installed {
        i18n::t_args("popupModelInstalled", &[&i18n::bytes(status.bytes)])
    } else if status.download.is_some() {
        i18n::t("popupDownloadingModel")
    } else {
        i18n::t("popupNotInstalled")
    };
    set_text("pack-status", &text);
    set_text(
        "storage-used",
        &i18n::t_args(
            "storageUsed",
            &[&i18n::bytes(status.storage.usage_bytes), &i18n::bytes(status.storage.quota_bytes)],
        ),
    );
    set_visible("delete-pack", status.installed);
    view::set_delete_model_question(&status);
    setup::show_status(&status, &verdict);
}

/// Shows the size of the download before anything is written; the verdict then says this plan's sizes.
async fn show_plan() {
    set_text("pack-size", &i18n::t("popupCheckingSize"));
    let source = setup::source_from_form();
    let text = match request(&Request::PlanPack(source.clone())).await {
        Reply::PackPlan(plan) => {
            setup::remember_plan(&plan).await;
            setup::show_verdict(&source).await;
            i18n::t_args("popupPlan", &[&i18n::bytes(plan.total_bytes), &plan.files.len().to_string()])
        }
        Reply::Error { error, message } => {
            i18n::t_args("popupCheckFailed", &[&i18n::error_text(&error, message.as_ref())])
        }
        _ => String::new(),
    };
    set_text("pack-size", &text);
}

/// The Install button. Hosts other than the Hub need a permission, which must be asked for
/// synchronously within the click.
fn install_clicked() {
    let source = setup::source_from_form();
    let permission = settings::request_host_permission(&source);
    spawn_local(async move {
        settings::host_permission_answered(permission).await;
        setup::install(source).await;
        refresh_pack().await;
    });
}

/// Starts the form from the defaults and source saved on the options page, or from a gallery image's
/// settings when the gallery asked to reuse them.
async fn fill_form() {
    let defaults = settings::defaults().await;
    let set = |id: &str, value: &str| element::<HtmlInputElement>(id).set_value(value);
    set("width", &defaults.width.to_string());
    set("height", &defaults.height.to_string());
    set("steps", &defaults.steps.to_string());
    element::<HtmlSelectElement>("schedule").set_value(&defaults.schedule);
    if let Some(source) = storage::SOURCE.get().await {
        set("hub-endpoint", &source.endpoint);
        set("hub-repo", &source.repo);
        set("hub-revision", &source.revision);
    }
    if let Some(reuse) = settings::take_reuse().await {
        element::<HtmlTextAreaElement>("prompt").set_value(&reuse.prompt);
        set("width", &reuse.width.to_string());
        set("height", &reuse.height.to_string());
        set("steps", &reuse.steps.to_string());
        set("seed", &reuse.seed.to_string());
        element::<HtmlSelectElement>("schedule").set_value(&reuse.schedule);
    }
}

fn number(id: &str) -> Option<i64> {
    element::<HtmlInputElement>(id).value().trim().parse().ok()
}

async fn generate() {
    if setup::generate_held() {
        return;
    }
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
    form_check::clear();
    // What a control shows stops here; anything else the service worker refuses, saying why.
    if let Err(problem @ (Problem::EmptyPrompt | Problem::Field { .. })) = form_check::check(&generate) {
        form_check::show(&problem);
        return;
    }
    match request(&Request::Generate(generate)).await {
        Reply::JobStarted { job, .. } => {
            JOB.set(&job);
            show_job(job);
            set_text("progress", &i18n::t("starting"));
            set_running(true);
        }
        Reply::Error { error, message } => {
            set_text("error", &i18n::error_text(&error, message.as_ref()));
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
