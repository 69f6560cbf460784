//! The options page: defaults for new images, the gallery's limits, the model (source, download with
//! its progress, storage, delete) and what will happen on this device before anything is downloaded
//! (the verdict the popup and the studio say too, `pages/setup.rs`; behind "Details" the WebGPU
//! adapter, `shader-f16`, buffer limits, storage quota).

use imagine_core::api::{
    DownloadState, Event, GalleryLimitRequest, GalleryListRequest, GenerateRequest, GpuMemoryRequest,
    InstallRequest, KeepLoadedRequest, PackSource, Reply, Request, Residency,
};
use imagine_core::gallery::{MAX_BYTES_RANGE, MAX_ITEMS_RANGE};
use imagine_core::gpu_memory::{
    GpuMemorySetting, ProbeFound, SettingError, SizeFit, GB, MAX_SETTING_GB, MIN_SETTING_GB,
};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::spawn_local;
use web_sys::{HtmlElement, HtmlInputElement, HtmlSelectElement};

use crate::pages::form_check::{self, Problem};
use crate::pages::view::{self, dom, element, input, on, set_text, set_visible};
use crate::pages::{gpu_fit, setup};
use crate::platform::i18n::{self, t, t_args};
use crate::platform::js::from_js;
use crate::platform::messaging::request;
use crate::platform::opfs;
use crate::platform::settings::{self, Defaults};
use crate::platform::storage;

/// The gallery's byte limit is typed in decimal MB, the unit every size on the pages is shown in.
const MB: i64 = 1_000_000;

/// Entry point of `options.js`.
#[wasm_bindgen(js_name = optionsPageMain)]
pub fn options_page_main() {
    i18n::localize_page();
    wire_settings();
    wire_model();
    spawn_local(show_saved());
}

/// Wires the settings' controls: defaults for new images, the gallery's limits, how long stages stay
/// loaded, private images, GPU memory.
fn wire_settings() {
    on("save-defaults", "click", |_| spawn_local(save_defaults()));
    on("save-limit", "click", |_| spawn_local(save_limit()));
    for field in ["max-items", "max-megabytes", "default-width", "default-height", "default-steps"] {
        form_check::clear_on_input(field);
    }
    form_check::wire_fixes("default-");
    on("keep-loaded", "change", |_| {
        let seconds = element::<HtmlSelectElement>("keep-loaded").value().parse().ok();
        spawn_local(keep_loaded(seconds));
    });
    on("keep-private", "change", |_| {
        let keep = element::<HtmlInputElement>("keep-private").checked();
        spawn_local(async move {
            if let Err(e) = storage::KEEP_PRIVATE.set(&keep).await {
                set_text("limit-status", &e.to_string());
            }
        });
    });
    on("gpu-memory-mode", "change", |_| {
        set_visible("gpu-memory-size", element::<HtmlSelectElement>("gpu-memory-mode").value() == "set")
    });
    on("save-gpu-memory", "click", |_| spawn_local(save_gpu_memory()));
    on("measure-gpu-memory", "click", |_| {
        set_text("gpu-memory-status", &t("gpuMemoryMeasuring"));
        spawn_local(gpu_memory(GpuMemoryRequest { measure: true, ..Default::default() }))
    });
    form_check::clear_on_input("gpu-memory-gb");
}

/// Wires the model's controls: its source, download and deletion.
fn wire_model() {
    on("save-source", "click", |_| source_clicked(false));
    for field in ["hub-endpoint", "hub-repo", "hub-revision"] {
        on(field, "input", |_| spawn_local(refresh_model()));
    }
    setup::wire_download_controls(|| spawn_local(refresh_model()));
    on("install", "click", |_| source_clicked(true));
    view::confirm_delete_model(|| {
        spawn_local(async {
            if let Reply::Error { error, message } = request(&Request::DeletePack {}).await {
                view::show_error_in("model-error", Some((&error, message.as_ref())));
            }
            refresh_model().await;
        })
    });
}

/// Shows what is saved and what the model and the GPU are now.
async fn show_saved() {
    element::<HtmlInputElement>("keep-private").set_checked(settings::keep_private().await);
    let defaults = settings::defaults().await;
    input("default-width").set_value(&defaults.width.to_string());
    input("default-height").set_value(&defaults.height.to_string());
    input("default-steps").set_value(&defaults.steps.to_string());
    element::<HtmlSelectElement>("default-schedule").set_value(&defaults.schedule);
    if let Some(source) = storage::SOURCE.get().await {
        input("hub-endpoint").set_value(&source.endpoint);
        input("hub-repo").set_value(&source.repo);
        input("hub-revision").set_value(&source.revision);
        // A source of one's own is no secret to the one who set it: shown, not folded away.
        if source != PackSource::default() {
            dom::set_attr(&element::<HtmlElement>("source-advanced"), "open", "");
        }
    }
    let list = GalleryListRequest { limit: Some(1), ..Default::default() };
    if let Reply::Gallery(page) = request(&Request::GalleryList(list)).await {
        input("max-items").set_value(&page.limit.max_items.to_string());
        input("max-megabytes").set_value(&(page.limit.max_bytes / MB as u64).to_string());
    }
    refresh_model().await;
    keep_loaded(None).await;
    device_report().await;
    gpu_memory(GpuMemoryRequest::default()).await;
}

/// Saves the GPU memory setting: Auto, or the size typed (checked at its field first).
async fn save_gpu_memory() {
    let setting = if element::<HtmlSelectElement>("gpu-memory-mode").value() == "auto" {
        GpuMemorySetting::Auto
    } else {
        let typed = input("gpu-memory-gb").value().trim().replace(',', ".");
        match typed
            .parse::<f64>()
            .map_err(|_| SettingError { gigabytes: f64::NAN })
            .and_then(GpuMemorySetting::gigabytes)
        {
            Ok(setting) => setting,
            Err(_) => {
                let range = [MIN_SETTING_GB, MAX_SETTING_GB].map(|gb| i18n::number(&gb.to_string()));
                form_check::mark("gpu-memory-gb", &t_args("gpuMemoryFieldInvalid", &[&range[0], &range[1]]));
                return;
            }
        }
    };
    gpu_memory(GpuMemoryRequest { setting: Some(setting), ..Default::default() }).await;
}

/// `gpuMemory` with `request`; shows the setting, what it comes to, and which sizes fit.
async fn gpu_memory(request_: GpuMemoryRequest) {
    let status = match request(&Request::GpuMemory(request_)).await {
        Reply::GpuMemory(status) => status,
        Reply::Error { error, message } => {
            set_text("gpu-memory-status", &i18n::error_text(&error, message.as_ref()));
            return;
        }
        other => return set_text("gpu-memory-status", &format!("{other:?}")),
    };
    let gb = gpu_fit::gigabytes;
    let set = matches!(status.setting, GpuMemorySetting::Set { .. });
    element::<HtmlSelectElement>("gpu-memory-mode").set_value(if set { "set" } else { "auto" });
    set_visible("gpu-memory-size", set);
    let text = match (status.setting, status.probe.as_ref().map(|p| &p.found)) {
        (GpuMemorySetting::Set { bytes }, _) => {
            input("gpu-memory-gb").set_value(&format!("{}", bytes as f64 / GB as f64));
            t_args("gpuMemoryStatusSet", &[&gb(bytes)])
        }
        (GpuMemorySetting::Auto, Some(ProbeFound::Refused { bytes })) => {
            t_args("gpuMemoryStatusFound", &[&gb(*bytes), &gb(status.budget.unwrap_or_default())])
        }
        (GpuMemorySetting::Auto, Some(ProbeFound::Plenty { bytes })) => {
            t_args("gpuMemoryStatusPlenty", &[&gb(*bytes)])
        }
        (GpuMemorySetting::Auto, Some(ProbeFound::Unknown)) => t("gpuMemoryStatusUnknown"),
        (GpuMemorySetting::Auto, None) => t("gpuMemoryStatusNotYet"),
    };
    set_text("gpu-memory-status", &text);
    let list = element::<HtmlElement>("gpu-memory-fits");
    list.set_text_content(None);
    let Some(budget) = status.budget else { return };
    for (_, width, height) in crate::pages::studio::PRESETS {
        let plan = status.facts.default_plan(Some(budget), width, height);
        let size = format!("{width}\u{00d7}{height}");
        let key = match plan.size_fit() {
            SizeFit::Fits => "gpuMemorySizeFits",
            SizeFit::Streamed => "gpuMemorySizeSlower",
            SizeFit::TooBig => "gpuMemorySizeTooBig",
        };
        let Ok(item) = view::document().create_element("li") else { return };
        item.set_text_content(Some(&t_args(key, &[&size, &gb(plan.peak)])));
        dom::append(&list, &item);
    }
}

/// `keepLoaded`: sets `seconds` if given; shows the setting and what is loaded now.
async fn keep_loaded(seconds: Option<i64>) {
    match request(&Request::KeepLoaded(KeepLoadedRequest { seconds })).await {
        Reply::KeepLoaded(residency) => show_residency(&residency),
        Reply::Error { error, message } => {
            set_text("keep-loaded-status", &i18n::error_text(&error, message.as_ref()))
        }
        other => set_text("keep-loaded-status", &format!("{other:?}")),
    }
}

/// The keep-loaded setting and the stages loaded now.
fn show_residency(residency: &Residency) {
    show_keep_loaded(residency.seconds);
    let names: Vec<String> = residency.loaded.iter().map(|stage| t(stage.message_key())).collect();
    let text =
        if names.is_empty() { t("keepLoadedNothing") } else { t_args("keepLoadedNow", &[&names.join(", ")]) };
    set_text("keep-loaded-status", &text);
}

/// Selects `seconds` in the keep-loaded menu, adding a choice for a value set through the API.
fn show_keep_loaded(seconds: u32) {
    let select = element::<HtmlSelectElement>("keep-loaded");
    let value = seconds.to_string();
    select.set_value(&value);
    if select.value() != value {
        let text = t_args("keepLoadedSeconds", &[&value]);
        if let Ok(option) = web_sys::HtmlOptionElement::new_with_text_and_value(&text, &value) {
            dom::append(&select, &option);
            select.set_value(&value);
        }
    }
}

/// `chrome.runtime.onMessage` on the options page: the model's state follows downloads and deletions
/// made anywhere, the residency follows the stages.
#[wasm_bindgen(js_name = optionsPageEvent)]
pub fn options_page_event(message: JsValue) {
    match from_js::<Event>(&message) {
        Ok(Event::PackProgress(progress)) => {
            // The first report of a download started elsewhere also changes the buttons.
            let first = element::<HtmlElement>("download").hidden();
            setup::show_download(Some(&progress));
            // No "Download" while one runs ([`refresh_model`]), also before the page's first refresh.
            set_visible("install", false);
            if element::<HtmlElement>("delete-pack").hidden() {
                set_text("model-status", &setup::describe_download(&progress));
            }
            if first || progress.state != DownloadState::Downloading {
                spawn_local(refresh_model());
            }
        }
        Ok(Event::PackInstalled { .. } | Event::PackFailed { .. } | Event::PackChanged {}) => {
            spawn_local(refresh_model())
        }
        Ok(Event::Residency(residency)) => show_residency(&residency),
        _ => {}
    }
}

fn number(id: &str) -> Option<i64> {
    input(id).value().trim().parse().ok()
}

async fn save_defaults() {
    set_text("defaults-status", "");
    let (width, height, steps) = (number("default-width"), number("default-height"), number("default-steps"));
    // Every field not allowed is marked at once, each at its control; the focus ends on the first.
    let problems: Vec<Problem> = [
        ("width", GenerateRequest { width, ..Default::default() }),
        ("height", GenerateRequest { height, ..Default::default() }),
        ("steps", GenerateRequest { steps, ..Default::default() }),
    ]
    .into_iter()
    .filter_map(|(field, request)| request.validate(0).err().map(|error| Problem::Field { field, error }))
    .collect();
    if !problems.is_empty() {
        for problem in problems.iter().rev() {
            form_check::show_at(problem, "default-");
        }
        return;
    }
    let schedule = element::<HtmlSelectElement>("default-schedule").value();
    let text = match Defaults::validate(width, height, steps, schedule) {
        Ok(defaults) => {
            match storage::DEFAULTS.set(&Defaults { saved_at_ms: js_sys::Date::now(), ..defaults }).await {
                Ok(()) => t("optionsSaved"),
                Err(e) => e.to_string(),
            }
        }
        Err(e) => i18n::error(&e),
    };
    set_text("defaults-status", &text);
}

async fn save_limit() {
    // An earlier "Saved" is not about this try.
    set_text("limit-status", "");
    // Megabytes may have decimals ("0.5", "0,5"): checked as typed, not cut to a whole number.
    let megabytes = input("max-megabytes").value().trim().replace(',', ".").parse::<f64>().ok();
    let limit = GalleryLimitRequest {
        max_items: number("max-items"),
        max_bytes: megabytes.map(|mb| (mb * MB as f64).round() as i64),
    };
    // Checked here, in the fields' own units, rather than as the service worker names the values.
    let (items_min, items_max) = MAX_ITEMS_RANGE;
    if limit.max_items.is_some_and(|n| n < i64::from(items_min) || n > i64::from(items_max)) {
        let range = [items_min.to_string(), items_max.to_string()];
        return form_check::mark("max-items", &t_args("fieldLimitItems", &[&range[0], &range[1]]));
    }
    let (bytes_min, bytes_max) = MAX_BYTES_RANGE;
    let (mb_min, mb_max) = (bytes_min as i64 / MB, bytes_max as i64 / MB);
    if megabytes.is_some_and(|mb| mb < mb_min as f64 || mb > mb_max as f64) {
        let range = [mb_min.to_string(), mb_max.to_string()];
        return form_check::mark("max-megabytes", &t_args("fieldLimitMegabytes", &[&range[0], &range[1]]));
    }
    let text = match request(&Request::GalleryLimit(limit)).await {
        Reply::GalleryLimit(limit) => t_args(
            "optionsLimitSaved",
            &[&i18n::count_images(limit.max_items), &i18n::bytes(limit.max_bytes)],
        ),
        Reply::Error { error, message } => i18n::error_text(&error, message.as_ref()),
        other => format!("{other:?}"),
    };
    set_text("limit-status", &text);
}

/// Save source / Download: the host permission is asked for within the click, then the source is
/// checked, saved, and (`install`) downloaded.
fn source_clicked(install: bool) {
    let source = match setup::source_from_form().validate() {
        Ok(source) => source,
        Err(e) => return show_model_error(Some(&i18n::error(&e))),
    };
    let permission = settings::request_host_permission(&source);
    spawn_local(async move {
        settings::host_permission_answered(permission).await;
        if let Err(e) = storage::SOURCE.set(&source).await {
            return show_model_error(Some(&e.to_string()));
        }
        show_model_error(None);
        if install {
            if let Reply::Error { error, message } =
                request(&Request::InstallPack(InstallRequest::new(source, None))).await
            {
                view::show_error_in("model-error", Some((&error, message.as_ref())));
            }
        }
        refresh_model().await;
        if !install {
            // After the refresh, which rewrites the status: the confirmation stays until the next one.
            let status = element::<HtmlElement>("model-status").text_content().unwrap_or_default();
            set_text("model-status", &format!("{} {status}", t("optionsSourceSaved")));
        }
    });
}

fn show_model_error(error: Option<&str>) {
    set_text("model-error", error.unwrap_or_default());
    set_visible("model-error", error.is_some());
}

async fn refresh_model() {
    // The verdict is about the source in the form, with that source's plan if one was asked for.
    let Some((status, verdict)) = setup::read_state(&setup::source_from_form()).await else { return };
    let text = if status.installed {
        let repo = status.source.as_ref().map(|s| s.repo.as_str()).unwrap_or_default();
        t_args("optionsModelInstalled", &[repo, &i18n::bytes(status.bytes)])
    } else if let Some(download) = &status.download {
        setup::describe_download(download)
    } else {
        t("optionsModelNone")
    };
    set_text("model-status", &text);
    set_text(
        "storage-status",
        &t_args(
            "storageUsed",
            &[&i18n::bytes(status.storage.usage_bytes), &i18n::bytes(status.storage.quota_bytes)],
        ),
    );
    set_visible("delete-pack", status.installed);
    // "Download" next to "Delete" only for another source than the installed pack's, and not while
    // a download runs (its progress is shown instead).
    let installed_here = status.installed && status.source.as_ref() == Some(&setup::source_from_form());
    set_visible("install", !installed_here && status.download.is_none());
    setup::show_download(status.download.as_ref());
    view::set_delete_model_question(&status);
    setup::render_verdict(&verdict);
}

/// Behind "Details" under the verdict ([`refresh_model`]): the adapter, `shader-f16`, the buffer
/// limits and the storage quota.
async fn device_report() {
    let mut extra = Vec::new();
    if let Ok(storage) = opfs::storage_use().await {
        extra.push((
            t("optionsQuota"),
            t_args("storageUsed", &[&i18n::bytes(storage.usage_bytes), &i18n::bytes(storage.quota_bytes)]),
        ));
    }
    setup::show_device_details(extra).await;
}
