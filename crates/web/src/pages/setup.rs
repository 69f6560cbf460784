//! The model's setup, shared by the studio, the popup and the options page: what the model is, its
//! size and what this device will do with it (`imagine_core::device_verdict`, one answer for every
//! page), a primary "Download" button while nothing is installed, then the download's progress in
//! place (bar, rate, time left, pause, resume, cancel, files) and Generate held back, with its reason,
//! until the model is installed.
//!
//! The pages hold the same markup under the same ids (`#setup`, `#device-verdict`, `#download`, ...);
//! an id a page leaves out is skipped (the options page has no `#setup`).

use std::cell::{Cell, RefCell};

use imagine_core::api::{DownloadProgress, DownloadState, PackPlan, PackSource, PackStatus, Reply, Request};
use imagine_core::device_verdict::{PackFigures, Verdict};
use wasm_bindgen::JsCast;
use web_sys::HtmlElement;

use crate::pages::view::{self, document, dom, fill_definitions, set_text, set_visible};
use crate::platform::gpu::{self, DeviceReport};
use crate::platform::i18n::{self, t, t_args};
use crate::platform::messaging::request;
use crate::platform::storage;

thread_local! {
    /// This page's adapter report, asked once (`Err`: why there is none).
    static DEVICE: RefCell<Option<Result<DeviceReport, String>>> = const { RefCell::new(None) };
    /// How many times this page started to read the model's state ([`read_state`]).
    static READS: Cell<u64> = const { Cell::new(0) };
}

fn has(id: &str) -> bool {
    document().get_element_by_id(id).is_some()
}

/// The adapter report, asked for once per page.
pub async fn device() -> Result<DeviceReport, String> {
    if let Some(known) = DEVICE.with_borrow(Clone::clone) {
        return known;
    }
    let report = gpu::device_report().await.map_err(|e| e.to_string());
    DEVICE.with_borrow_mut(|d| *d = Some(report.clone()));
    report
}

/// The pack's status and the verdict on `source`, for a page to show; `None` once a later read started.
/// A page reads as it opens and on every event of the model, and each read waits on the service
/// worker: only the latest is shown, so that an older one answered later cannot put back a state
/// that has passed (a failed download shown as still checking).
pub async fn read_state(source: &PackSource) -> Option<(PackStatus, Verdict)> {
    let read = READS.with(|reads| {
        reads.set(reads.get() + 1);
        reads.get()
    });
    let status = pack_status().await;
    let verdict = verdict(&status, source).await;
    (READS.with(Cell::get) == read).then_some((status, verdict))
}

/// The verdict for this device and the pack from `source`: with the installed pack's sizes when it
/// came from there, else those of the plan made for it (kept for the browser session by whichever page
/// asked), else the published pack's.
async fn verdict(status: &PackStatus, source: &PackSource) -> Verdict {
    let figures = match storage::PLAN.get().await {
        _ if status.installed && status.source.as_ref() == Some(source) => {
            PackFigures::installed(status.bytes, status.converted_bytes)
        }
        Some(plan) if plan.source == *source => PackFigures::from_plan(&plan),
        _ => PackFigures::published(),
    };
    let facts = device().await.ok().map(|report| report.facts());
    Verdict::new(facts.as_ref(), figures)
}

/// `packStatus`, without a download that has just ended: the pages hear `packInstalled` as the service
/// worker does, and may ask before it has removed the download's record, which then reports the
/// installed commit as still being put in place.
pub async fn pack_status() -> PackStatus {
    let mut status = match request(&Request::PackStatus {}).await {
        Reply::PackStatus(status) => status,
        _ => PackStatus::default(),
    };
    let ended = status.download.as_ref().is_some_and(|d| {
        d.state == DownloadState::Installing
            && status.installed
            && d.commit.is_some()
            && d.commit == status.commit
    });
    if ended {
        status.download = None;
    }
    status
}

/// Keeps `plan` for every page's verdict.
pub async fn remember_plan(plan: &PackPlan) {
    storage::PLAN.set_or_log(plan).await;
}

/// Shows the verdict for `source` (`#setup-intro`, `#device-verdict`, `#device-warning`).
pub async fn show_verdict(source: &PackSource) {
    render_verdict(&verdict(&pack_status().await, source).await);
}

/// Shows `verdict` (`#setup-intro`, `#device-verdict`, `#device-warning`).
pub fn render_verdict(verdict: &Verdict) {
    let say = |m| i18n::message(&m).unwrap_or_default();
    if has("setup-intro") {
        set_text("setup-intro", &say(verdict.download()));
    }
    set_text("device-verdict", &say(verdict.summary()));
    let warning = verdict.warning().map(say);
    set_text("device-warning", warning.as_deref().unwrap_or_default());
    set_visible("device-warning", warning.is_some());
}

/// The adapter's raw facts in readable units, for the "Details" disclosure: adapter, how it was found,
/// `shader-f16`, the buffer limits; or why there is no adapter.
pub async fn device_details() -> Vec<(String, String)> {
    let mut rows = Vec::new();
    match device().await {
        Ok(report) => {
            let adapter = [report.vendor.as_str(), report.architecture.as_str()]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" / ");
            rows.push((t("optionsAdapter"), if adapter.is_empty() { t("optionsUnknown") } else { adapter }));
            if !report.description.is_empty() {
                rows.push((t("optionsAdapterDescription"), report.description.clone()));
            }
            let preference = match report.power_preference.as_str() {
                "high-performance" => t("optionsPowerHigh"),
                "low-power" => t("optionsPowerLow"),
                _ => t("optionsPowerDefault"),
            };
            rows.push((t("optionsPowerPreference"), preference));
            let f16 = if report.shader_f16 { t("optionsYes") } else { t("optionsNo") };
            rows.push(("shader-f16".into(), f16));
            rows.push(("maxBufferSize".into(), i18n::bytes(report.max_buffer_size)));
            rows.push((
                "maxStorageBufferBindingSize".into(),
                i18n::bytes(report.max_storage_buffer_binding_size),
            ));
            // The flag that brings 16-bit floats is for NVIDIA on Linux only: said where it can help.
            if !report.shader_f16 && report.vendor.to_lowercase().contains("nvidia") {
                rows.push((t("deviceHint"), t("verdictNvidiaHint")));
            }
        }
        Err(error) => rows.push((t("optionsAdapter"), error)),
    }
    rows
}

/// Fills `#device-report` (a `<dl>` inside a closed `<details>`) with [`device_details`] and `extra`.
pub async fn show_device_details(extra: Vec<(String, String)>) {
    let mut rows = device_details().await;
    rows.extend(extra);
    let list = view::element::<HtmlElement>("device-report");
    list.set_text_content(None);
    fill_definitions(&list, rows);
}

/// The setup state of the studio and the popup for `status` and `verdict` ([`read_state`]): shown
/// while nothing is installed or a download runs (its intro and Download button only while nothing
/// is installed nor downloading); Generate held back, with the reason tied to it, until a model is
/// installed and this device can run it.
pub fn show_status(status: &PackStatus, verdict: &Verdict) {
    render_verdict(verdict);
    let installing = status.download.is_some();
    set_visible("setup", !status.installed || installing);
    set_visible("setup-intro-block", !status.installed);
    set_visible("install-form", !status.installed && !installing && verdict.can_run());
    show_download(status.download.as_ref());
    let reason = if !verdict.can_run() {
        Some(t("setupCannotRun"))
    } else if !status.installed {
        Some(t("setupGenerateReason"))
    } else {
        None
    };
    hold_generate(reason.as_deref());
}

/// Holds Generate back, saying why in `#generate-reason` (tied to it by `aria-describedby`; the
/// button stays focusable, so the reason is found by keyboard too), or lets it go (`None`).
pub fn hold_generate(reason: Option<&str>) {
    let button = view::element::<HtmlElement>("generate");
    match reason {
        Some(reason) => {
            set_text("generate-reason", reason);
            dom::set_attr(&button, "aria-disabled", "true");
            dom::set_attr(&button, "aria-describedby", "generate-reason");
        }
        None => {
            dom::remove_attr(&button, "aria-disabled");
            dom::remove_attr(&button, "aria-describedby");
        }
    }
    set_visible("generate-reason", reason.is_some());
}

/// Whether Generate is held back ([`hold_generate`]); a click then points at the Download button.
pub fn generate_held() -> bool {
    let held =
        view::element::<HtmlElement>("generate").get_attribute("aria-disabled").as_deref() == Some("true");
    if held {
        if let Some(install) = document().get_element_by_id("install") {
            let install: HtmlElement = install.unchecked_into();
            if !install.hidden() && install.offset_parent().is_some() {
                dom::focus(&install);
            }
        }
    }
    held
}

/// Starts downloading the pack from `source`; an error is shown in `#setup-error`.
pub async fn install(source: PackSource) {
    set_visible("setup-error", false);
    let install = imagine_core::api::InstallRequest::new(source, None);
    if let Reply::Error { error, message } = request(&Request::InstallPack(install)).await {
        view::show_error_in("setup-error", Some((&error, message.as_ref())));
    }
}

/// Wires Pause, Resume and Cancel of `#download`; `after` runs once the service worker answered.
pub fn wire_download_controls(after: impl Fn() + Clone + 'static) {
    for (id, action) in [
        ("pause", Request::PausePack {}),
        ("resume", Request::ResumePack {}),
        ("cancel-download", Request::CancelPack {}),
    ] {
        let after = after.clone();
        view::on(id, "click", move |_| {
            let (action, after) = (action.clone(), after.clone());
            wasm_bindgen_futures::spawn_local(async move {
                if let Reply::Error { error, message } = request(&action).await {
                    set_text("download-error", &i18n::error_text(&error, message.as_ref()));
                    set_visible("download-error", true);
                }
                after();
            });
        });
    }
}

/// The download in place: a bar (`role=progressbar` with `aria-valuenow`), done and total, rate, time
/// left, the controls that apply, the files; hidden when there is none.
pub fn show_download(progress: Option<&DownloadProgress>) {
    set_visible("download", progress.is_some());
    let Some(p) = progress else { return };
    // A download started on another page: the setup shows it in place of its Download button.
    if has("setup") {
        set_visible("setup", true);
        set_visible("install-form", false);
    }
    let running = p.state.is_active();
    // While the new pack is put in place there is nothing left to pause.
    set_visible("pause", running && p.state != DownloadState::Installing);
    set_visible("resume", !running);
    let percent = p.done_bytes.saturating_mul(100).checked_div(p.total_bytes).unwrap_or(0).min(100);
    let done = describe_download(p);
    set_text("download-done", &done);
    let bar = view::element::<HtmlElement>("download-bar");
    dom::set_attr(&bar, "aria-valuenow", &percent.to_string());
    dom::set_attr(&bar, "aria-valuetext", &done);
    if let Ok(Some(fill)) = bar.query_selector(".fill") {
        dom::set_attr(&fill, "style", &format!("width: {percent}%"));
    }
    let rate = if running && p.bytes_per_second > 0.0 {
        format!("{}/s", i18n::bytes(p.bytes_per_second as u64))
    } else {
        String::new()
    };
    set_text("download-rate", &rate);
    set_text(
        "download-eta",
        &p.seconds_left.filter(|_| running).map(view::describe_time_left).unwrap_or_default(),
    );
    view::show_error_in("download-error", p.error.as_deref().map(|error| (error, p.message.as_ref())));
    let list = view::element::<HtmlElement>("download-files");
    list.set_text_content(None);
    for file in &p.files {
        let Ok(item) = document().create_element("li") else { continue };
        let mark = if file.verified { " \u{2713}" } else { "" };
        let text = t_args(
            "popupDownloadDone",
            &[&file.path, &i18n::bytes(file.done_bytes), &i18n::bytes(file.size)],
        );
        item.set_text_content(Some(&format!("{text}{mark}")));
        dom::append(&list, &item);
    }
}

/// "Downloading: 8.2 MB of 68.4 MB (12 %)", or only the state while no size is known yet.
pub fn describe_download(p: &DownloadProgress) -> String {
    let state = t(match p.state {
        DownloadState::Checking => "popupStateChecking",
        DownloadState::Downloading => "popupStateDownloading",
        DownloadState::Converting => "popupStateConverting",
        DownloadState::Installing => "popupStateInstalling",
        DownloadState::Paused => "popupStatePaused",
        DownloadState::Failed => "popupStateStopped",
    });
    if p.total_bytes == 0 {
        return state;
    }
    let percent = (p.done_bytes.saturating_mul(100) / p.total_bytes).min(100);
    t_args(
        "downloadDone",
        &[&state, &i18n::bytes(p.done_bytes), &i18n::bytes(p.total_bytes), &percent.to_string()],
    )
}

/// The source in a page's `hub-endpoint`, `hub-repo` and `hub-revision` fields (popup, options page);
/// an empty field means the published pack's value.
pub fn source_from_form() -> PackSource {
    let value = |id: &str| view::element::<web_sys::HtmlInputElement>(id).value().trim().to_owned();
    let defaults = PackSource::default();
    let or_default = |v: String, d: String| if v.is_empty() { d } else { v };
    PackSource {
        endpoint: or_default(value("hub-endpoint"), defaults.endpoint),
        repo: or_default(value("hub-repo"), defaults.repo),
        revision: or_default(value("hub-revision"), defaults.revision),
    }
}
