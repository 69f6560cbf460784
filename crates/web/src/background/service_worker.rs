//! The service worker: owns the message API, jobs, the context menu and the offscreen document.
//!
//! It holds no state in memory that matters: Chrome stops it whenever it is idle. Job states live in
//! `chrome.storage.session`; the download in progress (what was asked, where it is) in
//! `chrome.storage.local`, so it resumes after the browser restarts; the pack in OPFS; the work itself in
//! the offscreen document, which outlives the service worker. A download that should be running but is
//! not (the offscreen document was closed, the browser restarted) is resumed on the next request, on
//! browser start-up, or by a 30-second alarm while a download is active.

use std::rc::Rc;
use std::sync::Arc;

use futures_util::lock::{Mutex, OwnedMutexGuard};
use imagine_core::api::{
    DownloadProgress, DownloadState, Event, GenerateRequest, GenerateResult, InstallRequest, JobState,
    KeepLoadedRequest, PackPlan, PackSource, PackStatus, Reply, Request, Residency, Sender, Stage,
};
use imagine_core::gallery;
use imagine_core::hub::HubError;
use imagine_core::message::{ErrorText, Localize};
use imagine_core::{Backend, ParamError};
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{future_to_promise, spawn_local, JsFuture};

use crate::background::gpu_memory;
use crate::background::notify;
use crate::background::records::{self, set_job, Download};
use crate::platform::chrome;
use crate::platform::gallery_store::{self, GalleryStoreError};
use crate::platform::gpu;
use crate::platform::hub_client::{self, FetchError};
use crate::platform::i18n;
use crate::platform::js::{from_js, get, random_u64, settled, to_js, JsError, LogError, Obj};
use crate::platform::messaging::{self, send};
use crate::platform::opfs::{self, OpfsError};
use crate::platform::protocol::{
    self, OffscreenCommand, OffscreenReply, ProtocolError, StudioFocus, OFFSCREEN_TARGET,
};
use crate::platform::settings;
use crate::platform::side_panel;
use crate::platform::storage;

/// Why a request of the message API was refused or failed (the `error` of [`Reply::Error`]), or why a
/// job's image could not be kept.
#[derive(Debug, Error)]
pub enum ServiceWorkerError {
    /// A message from another extension, a content script or a web page.
    #[error("Imagine answers only its own pages")]
    Foreign,
    /// A page sent an [`Event`], which only the offscreen document reports.
    #[error("events are reported by Imagine itself, not sent to it")]
    EventSent,
    /// Not a [`Request`] (serde says why: `unknown field ...`).
    #[error("not a request of the Imagine message API: {0}")]
    NotARequest(ProtocolError),
    /// A pack source that cannot be used.
    #[error(transparent)]
    Source(#[from] HubError),
    /// An `installPack` backend that is not a backend's name; the name given.
    #[error("backend {0:?} is not allowed: use \"webgpu\" or \"wasm\"")]
    Backend(String),
    /// `generate` parameters out of range (size, steps, count, ...).
    #[error(transparent)]
    Params(#[from] ParamError),
    /// `what`: "pause", "resume".
    #[error("there is no download to {0}")]
    NoDownload(&'static str),
    /// `deletePack` while the verified download is taking the installed pack's place.
    #[error("a new model pack is being installed right now: delete it once it is installed")]
    Installing,
    /// `generate` with no pack installed.
    #[error(
        "The model is not installed yet: download it in the studio, the popup or the settings, then make images"
    )]
    NoPack,
    /// Asking the Hub for a pack's plan (`packPlan`).
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// Reading or writing the pack state or a pack in OPFS.
    #[error(transparent)]
    Opfs(#[from] OpfsError),
    /// `chrome.offscreen.createDocument` failed (not because the document exists already).
    #[error("could not open the offscreen document: {0}")]
    OffscreenNotOpened(JsError),
    /// The offscreen document refused a command (its own typed error, as text: it crossed
    /// `sendMessage`).
    #[error("{0}")]
    Refused(ErrorText),
    /// The offscreen document's answer was not an [`OffscreenReply`] (it closed, or nobody answered).
    #[error("the offscreen document did not answer")]
    NoAnswer,
    /// A `chrome.*` call failed.
    #[error(transparent)]
    Js(#[from] JsError),
    /// A result whose PNG is not base64.
    #[error(transparent)]
    Image(#[from] base64::DecodeError),
    /// Reading, writing or exporting the gallery.
    #[error(transparent)]
    Gallery(#[from] GalleryStoreError),
    /// A finished job whose image is gone from the gallery.
    #[error("the image of this job is no longer kept ({0})")]
    NotKept(GalleryStoreError),
    /// A private job's image that the offscreen document no longer holds (it closed or crashed).
    #[error(
        "the image is no longer kept: an image made from text selected in a private window is kept in \
         memory only, and the page that held it closed"
    )]
    PrivateGone,
    /// An image that could not be written to the gallery.
    #[error(
        "the image was made but could not be kept ({error}); free some disk space and generate it again \
         with seed {seed}"
    )]
    Unkept {
        /// Why it could not be written.
        error: ErrorText,
        /// The image's seed, as text (a u64 does not fit a JS number), to make it again.
        seed: String,
    },
    /// A job's state that `storage.session` did not take.
    #[error("the job's outcome could not be recorded: {0}")]
    NotRecorded(JsError),
    /// `installPack` for another source while a download runs; `running` names it.
    #[error(
        "a download of {running} is running: wait for it, or pause or cancel it, before installing \
         another pack"
    )]
    OtherDownload {
        /// The running download's source: `repo@revision from endpoint`.
        running: String,
    },
    /// `deletePack` while a job runs on the pack.
    #[error("an image is being made: delete the model pack once it is done, or cancel it first")]
    JobRunning,
    /// The offscreen document running or queueing a job closed or crashed before the job ended.
    #[error(
        "the image was not finished: the page that makes images closed (the browser may have run out of \
         memory); make it again"
    )]
    JobLost,
    /// A download that failed because the network was down, as it is shown while it waits to be tried
    /// again.
    #[error("{0} (tried again by itself every 30 seconds until the Hub answers)")]
    Offline(ErrorText),
    /// A `gpuMemory` size that is not allowed.
    #[error(transparent)]
    GpuMemory(#[from] imagine_core::gpu_memory::SettingError),
    /// The GPU could not be probed.
    #[error(transparent)]
    Gpu(#[from] gpu::GpuError),
}

/// The context-menu item on selected text.
pub const MENU_ID: &str = "imagine-selection";
/// The alarm that checks on an active download.
pub const DOWNLOAD_ALARM: &str = "imagine-download";
/// The alarm that checks, while jobs run, that their offscreen document still has them.
const JOBS_ALARM: &str = "imagine-jobs";

/// `chrome.runtime.onMessage`: answers requests, records events. Resolves to the reply, or to
/// `undefined` for messages that are not requests.
#[wasm_bindgen(js_name = serviceWorkerMessage)]
pub fn service_worker_message(message: JsValue, sender: JsValue) -> js_sys::Promise {
    future_to_promise(async move {
        if get(&message, "target").as_string().as_deref() == Some(OFFSCREEN_TARGET) {
            return Ok(JsValue::UNDEFINED);
        }
        let reply = match messaging::sender(&sender) {
            Sender::Foreign => Err(ServiceWorkerError::Foreign),
            // Events are what the offscreen document reports; nobody else's are recorded.
            Sender::Offscreen => {
                if let Ok(event) = from_js::<Event>(&message) {
                    record(event.clone()).await;
                    notify::after_event(&event).await;
                }
                return Ok(JsValue::UNDEFINED);
            }
            Sender::Page | Sender::ServiceWorker => request_reply(&message).await,
        };
        // The one place a request's error becomes text.
        let reply = reply.unwrap_or_else(|error| Reply::error(&error));
        Ok(to_js(&reply))
    })
}

async fn request_reply(message: &JsValue) -> Result<Reply, ServiceWorkerError> {
    // Broadcast events reach every context; the ones pages send are not requests and get no reply.
    if from_js::<Event>(message).is_ok() {
        return Err(ServiceWorkerError::EventSent);
    }
    handle(from_js::<Request>(message).map_err(ServiceWorkerError::NotARequest)?).await
}

/// `chrome.windows.onRemoved`: when no private (incognito) window is left, what private windows made is
/// forgotten ([`forget_private`]).
#[wasm_bindgen(js_name = serviceWorkerWindowRemoved)]
pub fn service_worker_window_removed() -> js_sys::Promise {
    future_to_promise(async {
        if !private_window_open().await {
            forget_private().await;
        }
        Ok(JsValue::UNDEFINED)
    })
}

/// Whether a private (incognito) window is open. The extension sees them only where the user allowed it
/// in private windows, which is also the only way it gets text selected there. If Chrome cannot say,
/// none is taken to be open: forgetting is the side to err on.
async fn private_window_open() -> bool {
    let windows = match chrome::windows_get_all(&Obj::new().build()) {
        Ok(promise) => JsFuture::from(promise).await.map_err(JsError::from),
        Err(e) => Err(JsError::from(e)),
    };
    match windows {
        Ok(windows) => {
            js_sys::Array::from(&windows).iter().any(|w| get(&w, "incognito").as_bool() == Some(true))
        }
        Err(e) => {
            web_sys::console::error_1(&format!("imagine: the windows could not be listed: {e}").into());
            false
        }
    }
}

/// The last private window closed: every private job still queued or running is cancelled, the
/// offscreen document forgets the private images it holds (the only copies: they are never written to
/// disk), and the records of private jobs and a studio focus on one are removed, so that no page opened
/// later shows them or their prompts. A page still showing one keeps what it shows.
async fn forget_private() {
    if let Ok(true) = offscreen_exists().await {
        send_command(&OffscreenCommand::ForgetPrivate).await.log_error("forgetting the private images");
    }
    let _guard = JOB_LOCK.with(Arc::clone).lock_owned().await;
    let mut kept = Vec::new();
    for job in records::JOBS.get().await.unwrap_or_default() {
        match records::job(&job).get().await {
            Some(state) if state.is_private() => records::job(&job).remove_or_log().await,
            _ => kept.push(job),
        }
    }
    records::JOBS.set_or_log(&kept).await;
    if storage::STUDIO_FOCUS.get().await.is_some_and(|focus| focus.private) {
        storage::STUDIO_FOCUS.remove_or_log().await;
    }
}

/// `chrome.runtime.onInstalled`: (re)creates the context menu.
#[wasm_bindgen(js_name = serviceWorkerInstalled)]
pub fn service_worker_installed() -> js_sys::Promise {
    future_to_promise(async {
        settled(chrome::context_menus_remove_all()).await.log_error("removing the context menu");
        let item = Obj::new()
            .set("id", MENU_ID)
            .set("title", i18n::t("menuImagineSelection"))
            .set("contexts", js_sys::Array::of1(&"selection".into()))
            .build();
        chrome::context_menus_create(&item)?;
        side_panel::apply_toolbar(side_panel::toolbar_choice().await).await;
        // After an update: files of an earlier storage layout, or of nothing, are removed.
        let _guard = lock_download().await;
        let keep_download = records::DOWNLOAD.get().await.is_some();
        if let Err(e) = opfs::remove_stray(keep_download).await {
            web_sys::console::error_1(&e.to_string().into());
        }
        Ok(JsValue::UNDEFINED)
    })
}

/// `chrome.runtime.onStartup` and `chrome.alarms.onAlarm`: resumes a download that should be running.
#[wasm_bindgen(js_name = serviceWorkerWake)]
pub fn service_worker_wake() -> js_sys::Promise {
    future_to_promise(async {
        resume_if_stalled().await;
        retry_offline_download().await;
        fail_lost_jobs().await;
        Ok(JsValue::UNDEFINED)
    })
}

/// `chrome.runtime.onStartup`: the toolbar button's choice again, then what [`service_worker_wake`]
/// does.
#[wasm_bindgen(js_name = serviceWorkerStartup)]
pub fn service_worker_startup() -> js_sys::Promise {
    future_to_promise(async {
        side_panel::apply_toolbar(side_panel::toolbar_choice().await).await;
        resume_if_stalled().await;
        retry_offline_download().await;
        Ok(JsValue::UNDEFINED)
    })
}

/// `chrome.contextMenus.onClicked`: generates from the selection and shows it in the studio, or in the
/// result page when the side panel did not open (`panel`: the shim's `sidePanel.open()`, resolved to
/// whether it opened). Text selected in a private window (`incognito`) makes a private job unless the
/// user chose to keep those.
#[wasm_bindgen(js_name = serviceWorkerMenuClick)]
pub fn service_worker_menu_click(info: JsValue, panel: js_sys::Promise, incognito: bool) -> js_sys::Promise {
    future_to_promise(async move {
        if get(&info, "menuItemId").as_string().as_deref() != Some(MENU_ID) {
            return Ok(JsValue::UNDEFINED);
        }
        let prompt = get(&info, "selectionText").as_string().unwrap_or_default();
        let opened = JsFuture::from(panel).await.ok().and_then(|v| v.as_bool()).unwrap_or(false);
        // The settings the user chose as defaults (options page), like every page that makes images.
        let mut request = settings::defaults().await.request(prompt.clone());
        request.private = incognito && !settings::keep_private().await;
        let private = request.private;
        let started = start_job(request).await;
        // The prompt stays out of the URL (it would land in the browser's history): the page asks
        // for the job, which carries it.
        let (focus, page) = match started {
            Ok((job, _)) => {
                let page = format!("result.html?job={job}");
                (StudioFocus { job: Some(job), prompt, private, ..Default::default() }, page)
            }
            Err(error) => {
                let message = error.message();
                let page = format!(
                    "result.html?error={}&message={}",
                    String::from(js_sys::encode_uri_component(&error.to_string())),
                    String::from(js_sys::encode_uri_component(
                        &serde_json::to_string(&message).unwrap_or_default()
                    ))
                );
                let focus = StudioFocus {
                    prompt,
                    private,
                    error: Some(error.to_string()),
                    message: Some(message),
                    ..Default::default()
                };
                (focus, page)
            }
        };
        side_panel::show(focus, opened, &page).await;
        Ok(JsValue::UNDEFINED)
    })
}

/// `chrome.commands.onCommand` (`open-studio`): the studio, in a tab when the side panel did not open.
#[wasm_bindgen(js_name = serviceWorkerCommand)]
pub fn service_worker_command(command: String, panel: js_sys::Promise) -> js_sys::Promise {
    future_to_promise(async move {
        let opened = JsFuture::from(panel).await.ok().and_then(|v| v.as_bool()).unwrap_or(false);
        if command == "open-studio" && !opened {
            let url = chrome::runtime_get_url("studio.html");
            JsFuture::from(chrome::tabs_create(&Obj::new().set("url", url).build())?).await?;
        }
        Ok(JsValue::UNDEFINED)
    })
}

/// Answers `request`; what it changed that no other event tells reaches every open page.
async fn handle(request: Request) -> Result<Reply, ServiceWorkerError> {
    let announcement = request.announcement();
    let reply = answer(request).await?;
    if let Some(event) = announcement {
        // Not awaited: the page that asked gets its reply first.
        spawn_local(async move { messaging::broadcast(&event).await });
    }
    Ok(reply)
}

async fn answer(request: Request) -> Result<Reply, ServiceWorkerError> {
    Ok(match request {
        Request::InstallPack(request) => {
            install(request).await?;
            Reply::InstallStarted
        }
        Request::PlanPack(source) => Reply::PackPlan(plan(source).await?),
        Request::PausePack {} => {
            pause().await?;
            Reply::Done
        }
        Request::ResumePack {} => match records::DOWNLOAD.get().await {
            Some(download) if !download.state.is_active() => {
                install(download.request).await?;
                Reply::InstallStarted
            }
            Some(_) => Reply::InstallStarted,
            None => return Err(ServiceWorkerError::NoDownload("resume")),
        },
        Request::CancelPack {} => {
            cancel_download().await?;
            Reply::Done
        }
        Request::DeletePack {} => {
            delete_pack().await?;
            Reply::Done
        }
        Request::PackStatus {} => Reply::PackStatus(pack_status().await),
        Request::Generate(request) => {
            let (job, seed) = start_job(request).await?;
            Reply::JobStarted { job, seed }
        }
        Request::Cancel { job } => {
            command(&OffscreenCommand::CancelJob { job: job.clone() }).await?;
            Reply::Cancelled { job }
        }
        Request::Job { job } => {
            fail_lost_jobs().await;
            Reply::Job(job_state(&job).await)
        }
        Request::GalleryList(request) => Reply::Gallery(gallery_store::list(request).await?),
        Request::GalleryImage { id } => {
            let (item, png) = gallery_store::image(&id).await?;
            Reply::GalleryImage { item, png }
        }
        Request::GalleryDelete { id } => {
            gallery_store::delete(&id).await?;
            forget_deleted_focus().await;
            Reply::Done
        }
        Request::GalleryClear {} => {
            gallery_store::clear().await?;
            forget_deleted_focus().await;
            Reply::Done
        }
        Request::GalleryExport {} => {
            let (file, bytes, images) = gallery_store::export().await?;
            Reply::GalleryExport { file, bytes, images }
        }
        Request::GalleryLimit(request) => Reply::GalleryLimit(gallery_store::set_limit(request).await?),
        Request::KeepLoaded(request) => Reply::KeepLoaded(keep_loaded(request).await?),
        Request::GpuMemory(request) => Reply::GpuMemory(gpu_memory::status(request).await?),
    })
}

/// Starts (or joins, or resumes) a download. The source is checked here so a bad one is refused at once.
async fn install(request: InstallRequest) -> Result<(), ServiceWorkerError> {
    let request = InstallRequest::new(request.source().validate()?, request.backend);
    if let Some(backend) = &request.backend {
        if Backend::from_name(backend).is_none() {
            return Err(ServiceWorkerError::Backend(backend.clone()));
        }
    }
    let _guard = lock_download().await;
    let current = records::DOWNLOAD.get().await;
    // A request for the running download joins it; one for another pack would silently replace it.
    if let Some(running) = current.as_ref().filter(|d| d.state.is_active()) {
        let source = running.request.source();
        if source != request.source() {
            let running = format!("{}@{}", source.repo, source.revision);
            return Err(ServiceWorkerError::OtherDownload { running });
        }
    }
    // Resuming the same download keeps showing what is already done until the worker reports.
    let progress = current
        .filter(|d| d.request.source() == request.source())
        .and_then(|d| d.progress)
        .map(|p| DownloadProgress { state: DownloadState::Checking, error: None, message: None, ..p });
    let download = Download {
        request: request.clone(),
        state: DownloadState::Checking,
        progress,
        error: None,
        message: None,
        retry_offline: false,
    };
    records::DOWNLOAD.set_or_log(&download).await;
    set_alarm(DOWNLOAD_ALARM).await;
    command(&OffscreenCommand::InstallPack { request }).await?;
    Ok(())
}

/// Starts the 30-second alarm `name` (again: a running one restarts its period).
async fn set_alarm(name: &str) {
    let info = Obj::new().set("periodInMinutes", 0.5).build();
    settled(chrome::alarms_create(name, &info)).await.log_error(&format!("starting the alarm {name}"));
}

async fn plan(source: PackSource) -> Result<PackPlan, ServiceWorkerError> {
    let source = source.validate()?;
    let (mut plan, graphs) = hub_client::plan(&source, None, &Default::default()).await?;
    // On an adapter without shader-f16 the float16 graphs will run converted to float32: say what that
    // costs (or why it cannot be done). Without WebGPU there is nothing to say here: the install says so.
    if let Ok(adapter) = gpu::adapter_info().await {
        if !adapter.has_f16 && hub_client::device_needs(&graphs)?.0 {
            let plans = hub_client::conversion_plans(&graphs, &plan, adapter.limits)?;
            plan.conversion = Some(hub_client::conversion_cost(&graphs, &plan, &plans));
        }
    }
    Ok(plan)
}

async fn pause() -> Result<(), ServiceWorkerError> {
    let _guard = lock_download().await;
    let Some(mut download) = records::DOWNLOAD.get().await else {
        return Err(ServiceWorkerError::NoDownload("pause"));
    };
    download.state = DownloadState::Paused;
    records::DOWNLOAD.set_or_log(&download).await;
    clear_alarm(DOWNLOAD_ALARM).await;
    if let Ok(true) = offscreen_exists().await {
        command(&OffscreenCommand::PausePack).await?;
    }
    Ok(())
}

async fn cancel_download() -> Result<(), ServiceWorkerError> {
    let _guard = lock_download().await;
    records::DOWNLOAD.remove_or_log().await;
    clear_alarm(DOWNLOAD_ALARM).await;
    // The offscreen document stops the worker before removing the files it has open.
    match offscreen_exists().await {
        Ok(true) => {
            command(&OffscreenCommand::CancelPack).await?;
        }
        _ => opfs::clear_slot(opfs::pack_state().await?.staging).await?,
    }
    Ok(())
}

/// Deletes the installed pack; a download in progress is kept. Refused while a new pack is being put in
/// place, which would race with it.
async fn delete_pack() -> Result<(), ServiceWorkerError> {
    fail_lost_jobs().await;
    // Held until the pack is gone, so that no job starts on it meanwhile.
    let _jobs = JOB_LOCK.with(Arc::clone).lock_owned().await;
    // A running job reads the pack's files: refused rather than failing it with a read error.
    if !running_jobs().await.is_empty() {
        return Err(ServiceWorkerError::JobRunning);
    }
    let _guard = lock_download().await;
    let download = records::DOWNLOAD.get().await;
    if download.as_ref().is_some_and(|d| d.state == DownloadState::Installing) {
        return Err(ServiceWorkerError::Installing);
    }
    // A store of the pack's re-blocked forms holds its files open and would write its record back:
    // ended first, and none starts for it again.
    let installed = opfs::pack_state().await.ok().and_then(|s| s.installed).map(|p| p.commit);
    if let (Some(commit), Ok(true)) = (installed, offscreen_exists().await) {
        command(&OffscreenCommand::StopStore { commit }).await?;
    }
    // One writer of the state at a time (a store that got to its write holds the same lock). An
    // unreadable state is replaced: deleting is how the user starts over.
    let lock = opfs::lock_pack_state().await;
    let state = opfs::pack_state().await.unwrap_or_default();
    opfs::write_pack_state(&state.deleted()).await?;
    drop(lock);
    // The pack's cached prompt embeddings go with it.
    opfs::embeddings::clear().await?;
    opfs::remove_stray(download.is_some()).await?;
    forget_unused_host_permissions().await;
    Ok(())
}

/// Gives back the host permissions of custom sources that neither the installed pack nor a download
/// uses any more.
async fn forget_unused_host_permissions() {
    let installed = opfs::installed_pack().await.map(|(record, _)| record.source);
    let downloading = records::DOWNLOAD.get().await.map(|d| d.request.source());
    settings::forget_unused_host_permissions(
        &[installed, downloading].into_iter().flatten().collect::<Vec<_>>(),
    )
    .await;
}

async fn clear_alarm(name: &str) {
    settled(chrome::alarms_clear(name)).await.log_error(&format!("clearing the alarm {name}"));
}

/// Restarts an active download whose worker is gone; the worker resumes from what it saved. Holds the
/// download lock throughout: the offscreen document keeps an ending download registered until the
/// service worker recorded how it ended, so what is read here cannot be stale.
async fn resume_if_stalled() {
    let _guard = lock_download().await;
    let Some(download) = records::DOWNLOAD.get().await else {
        clear_alarm(DOWNLOAD_ALARM).await;
        return;
    };
    if !download.state.is_active() {
        return;
    }
    let running = match offscreen_exists().await {
        Ok(true) => command(&OffscreenCommand::InstallStatus).await.unwrap_or(false),
        _ => false,
    };
    if !running {
        command(&OffscreenCommand::InstallPack { request: download.request })
            .await
            .log_error("resuming the download");
    }
}

/// Starts again a download that failed because the network was down (a browser started offline, say).
async fn retry_offline_download() {
    let request = {
        let _guard = lock_download().await;
        match records::DOWNLOAD.get().await {
            Some(d) if d.state == DownloadState::Failed && d.retry_offline => d.request,
            _ => return,
        }
    };
    if let Err(e) = install(request).await {
        web_sys::console::error_1(&format!("imagine: the download could not be tried again: {e}").into());
    }
}

async fn pack_status() -> PackStatus {
    resume_if_stalled().await;
    let download = records::DOWNLOAD.get().await;
    let record = opfs::installed_pack().await.map(|(record, _)| record);
    PackStatus {
        installed: record.is_some(),
        bytes: record.as_ref().map_or(0, |r| r.bytes),
        converted_bytes: record.as_ref().and_then(|r| r.conversion.as_ref()).map(|c| c.bytes),
        block32_bytes: record.as_ref().and_then(|r| r.block32.as_ref()).map(|b| b.bytes()).filter(|&b| b > 0),
        commit: record.as_ref().map(|r| r.commit.clone()),
        source: record.map(|r| r.source),
        storage: opfs::storage_use().await.unwrap_or_default(),
        download: download.map(|d| {
            let progress = d.progress.unwrap_or_else(|| DownloadProgress {
                state: d.state,
                source: d.request.source(),
                commit: None,
                total_bytes: 0,
                done_bytes: 0,
                files: Vec::new(),
                bytes_per_second: 0.0,
                seconds_left: None,
                error: None,
                message: None,
            });
            let moving = d.state.is_active();
            DownloadProgress {
                state: d.state,
                error: d.error,
                message: d.message,
                bytes_per_second: if moving { progress.bytes_per_second } else { 0.0 },
                seconds_left: if moving { progress.seconds_left } else { None },
                ..progress
            }
        }),
    }
}

/// Starts a job: its id and seed.
async fn start_job(request: GenerateRequest) -> Result<(String, String), ServiceWorkerError> {
    let params = request.validate(random_u64())?;
    if opfs::installed_pack().await.is_none() {
        return Err(ServiceWorkerError::NoPack);
    }
    fail_lost_jobs().await;
    let job = format!("{:016x}", random_u64());
    let running = JobState::Running {
        progress: None,
        prompt: params.prompt.clone(),
        results: Vec::new(),
        private: params.private,
    };
    let seed = params.seed.to_string();
    let keep_loaded_seconds = settings::keep_loaded_seconds().await;
    let gpu_budget = gpu_memory::job_budget(params.backend).await;
    // Recorded as running and handed over under the job lock, so that no check finds it running and
    // not yet in the offscreen document's hands.
    let _guard = JOB_LOCK.with(Arc::clone).lock_owned().await;
    set_job(&job, &running).await;
    set_alarm(JOBS_ALARM).await;
    match command(&OffscreenCommand::RunJob { job: job.clone(), params, keep_loaded_seconds, gpu_budget })
        .await
    {
        Ok(_) => Ok((job, seed)),
        Err(error) => {
            set_job(&job, &JobState::failed(&error)).await;
            Err(error)
        }
    }
}

/// Fails the jobs recorded as running that the offscreen document does not have: it closed or crashed
/// with them (renderer out of memory, `chrome.offscreen.closeDocument`), so they would never end. Runs
/// on the jobs alarm (every 30 s while a job runs), before a job starts and when a page asks for one.
/// The jobs recorded as running (the caller holds the job lock).
async fn running_jobs() -> Vec<String> {
    let mut running = Vec::new();
    for job in records::JOBS.get().await.unwrap_or_default() {
        if matches!(records::job(&job).get().await, Some(JobState::Running { .. })) {
            running.push(job);
        }
    }
    running
}

async fn fail_lost_jobs() {
    let lost = {
        let _guard = JOB_LOCK.with(Arc::clone).lock_owned().await;
        let mut running = running_jobs().await;
        if running.is_empty() {
            clear_alarm(JOBS_ALARM).await;
            return;
        }
        let given = match offscreen_exists().await {
            Ok(true) => match send_command(&OffscreenCommand::InstallStatus).await {
                Ok(answer) => answer.jobs,
                // Still loading, or busy: it may have them; the next check will tell.
                Err(_) => return,
            },
            Ok(false) => Vec::new(),
            Err(_) => return,
        };
        running.retain(|job| !given.contains(job));
        running
    };
    for job in lost {
        let event = Event::failed(job, &ServiceWorkerError::JobLost);
        record(event.clone()).await;
        // The pages follow jobs by their events; the offscreen document that would have sent it is gone.
        messaging::broadcast(&event).await;
    }
}

/// Sends a command to the offscreen document, creating it first if needed; whether a download worker
/// runs after it.
async fn command(command: &OffscreenCommand) -> Result<bool, ServiceWorkerError> {
    ensure_offscreen().await?;
    Ok(send_command(command).await?.installing)
}

/// What the offscreen document answers to a command it carried out.
struct Answer {
    /// A download worker runs.
    installing: bool,
    /// The stages loaded.
    loaded: Vec<Stage>,
    /// The jobs it was given, ended ones included.
    jobs: Vec<String>,
}

/// Sends a command to the open offscreen document.
async fn send_command(command: &OffscreenCommand) -> Result<Answer, ServiceWorkerError> {
    let reply = send(&protocol::to_offscreen(command)).await?;
    match from_js::<OffscreenReply>(&reply) {
        Ok(OffscreenReply::Done { installing, loaded, jobs }) => Ok(Answer { installing, loaded, jobs }),
        Ok(OffscreenReply::Refused(error)) => Err(ServiceWorkerError::Refused(error)),
        Ok(OffscreenReply::PrivateImage { .. }) | Err(_) => Err(ServiceWorkerError::NoAnswer),
    }
}

/// `keepLoaded`: saves the seconds if given and tells the offscreen document (if open: without it,
/// nothing is loaded); the setting and what is loaded now.
async fn keep_loaded(request: KeepLoadedRequest) -> Result<Residency, ServiceWorkerError> {
    let seconds = match request.seconds {
        Some(value) => {
            let seconds = imagine_core::keep_loaded_seconds(value)?;
            storage::KEEP_LOADED.set(&seconds).await?;
            Some(seconds)
        }
        None => None,
    };
    let loaded = if offscreen_exists().await? {
        send_command(&OffscreenCommand::KeepLoaded { seconds }).await?.loaded
    } else {
        Vec::new()
    };
    let residency = Residency { seconds: settings::keep_loaded_seconds().await, loaded };
    if seconds.is_some() {
        let event = Event::Residency(residency.clone());
        spawn_local(async move { messaging::broadcast(&event).await });
    }
    Ok(residency)
}

/// The stages loaded in the offscreen document now (none when it is closed).
pub(crate) async fn loaded_stages() -> Vec<Stage> {
    match offscreen_exists().await {
        Ok(true) => send_command(&OffscreenCommand::KeepLoaded { seconds: None })
            .await
            .map(|a| a.loaded)
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Tells the offscreen document to keep stages loaded `seconds` (0 unloads them now), or, with
/// `None`, as long as the user's setting says.
pub(crate) async fn set_keep_loaded(seconds: Option<u32>) -> Result<(), ServiceWorkerError> {
    let seconds = match seconds {
        Some(seconds) => seconds,
        None => settings::keep_loaded_seconds().await,
    };
    if offscreen_exists().await? {
        send_command(&OffscreenCommand::KeepLoaded { seconds: Some(seconds) }).await?;
    }
    Ok(())
}

async fn offscreen_exists() -> Result<bool, JsError> {
    let filter = Obj::new().set("contextTypes", js_sys::Array::of1(&"OFFSCREEN_DOCUMENT".into())).build();
    let contexts = JsFuture::from(chrome::runtime_get_contexts(&filter)?).await?;
    Ok(js_sys::Array::from(&contexts).length() > 0)
}

async fn ensure_offscreen() -> Result<(), ServiceWorkerError> {
    // A document that is still loading is listed already but cannot take messages yet: one creation at
    // a time, and everyone waits for it to finish loading.
    let lock = OFFSCREEN_LOCK.with(Rc::clone);
    let _guard = lock.lock().await;
    if offscreen_exists().await? {
        return Ok(());
    }
    let parameters = Obj::new()
        .set("url", "offscreen.html")
        .set("reasons", js_sys::Array::of1(&"WORKERS".into()))
        .set("justification", "Runs the image model in dedicated workers (WebGPU) and stores the model pack.")
        .build();
    match JsFuture::from(chrome::offscreen_create_document(&parameters).map_err(JsError::from)?).await {
        Ok(_) => Ok(()),
        Err(e) => match JsError::from(e) {
            // Another request created it meanwhile.
            e if e.message.contains("single offscreen document") => Ok(()),
            e => Err(ServiceWorkerError::OffscreenNotOpened(e)),
        },
    }
}

/// Keeps the latest state of jobs and installs, from the events the offscreen document broadcasts.
async fn record(event: Event) {
    if let Some(text) = event.badge() {
        settled(chrome::action_set_badge_text(&Obj::new().set("text", text).build()))
            .await
            .log_error("setting the badge");
    }
    // Each job event reads the job's state and writes it back; one at a time, so that no result of a
    // batch is lost to the progress event that follows it.
    let _guard = match &event {
        Event::Progress { .. } | Event::Result(_) | Event::Failed { .. } | Event::Cancelled { .. } => {
            Some(JOB_LOCK.with(Arc::clone).lock_owned().await)
        }
        _ => None,
    };
    match event {
        Event::Progress { job, progress } => {
            let (prompt, results, private) = match records::job(&job).get().await {
                Some(JobState::Running { prompt, results, private, .. }) => (prompt, results, private),
                _ => Default::default(),
            };
            set_job(&job, &JobState::Running { progress: Some(progress), prompt, results, private }).await
        }
        Event::Result(mut result) => {
            // The trace is for the caller that asked for it, not worth keeping; the image is kept in
            // OPFS, since a large PNG does not fit `storage.session`.
            result.trace = None;
            let job = result.job.clone();
            let png = std::mem::take(&mut result.png);
            let previous = records::job(&job).get().await;
            // A private job forgotten as the last private window closed: nothing of it is recorded.
            if result.private && previous.is_none() {
                return;
            }
            let mut results = previous.as_ref().map(|state| state.results().to_vec()).unwrap_or_default();
            // The PNG first, then the job's state (which reads it), then the gallery's index: a page
            // asking for the job is answered as soon as the image is on disk.
            let kept = keep_image(&result, &png).await;
            let state = match &kept {
                Err(e) => {
                    let error =
                        ServiceWorkerError::Unkept { error: ErrorText::of(e), seed: result.seed.clone() };
                    JobState::Failed { error: error.to_string(), message: Some(error.message()), results }
                }
                // The last image of the batch ends the job.
                Ok(_) if result.index + 1 >= result.count => {
                    results.push(result.clone());
                    JobState::Done { result: result.clone(), results }
                }
                Ok(_) => {
                    let (progress, prompt) = match previous {
                        Some(JobState::Running { progress, prompt, .. }) => (progress, prompt),
                        _ => (None, result.prompt.clone()),
                    };
                    results.push(result.clone());
                    JobState::Running { progress, prompt, results, private: result.private }
                }
            };
            set_job(&job, &state).await;
            if let (Ok(bytes), false) = (kept, result.private) {
                let commit = opfs::installed_pack().await.map(|(record, _)| record.commit);
                if let Err(e) = gallery_store::add(&result, bytes, commit).await {
                    web_sys::console::error_1(&format!("imagine: the gallery index: {e}").into());
                }
            }
        }
        // A job whose last image is recorded is done, even if a cancel reached it before its worker ended.
        Event::Failed { job, error, message } => {
            if let Some(results) = finished_images(&job).await {
                set_job(&job, &JobState::Failed { error, message, results }).await
            }
        }
        Event::Cancelled { job } => {
            if let Some(results) = finished_images(&job).await {
                set_job(&job, &JobState::Cancelled { results }).await
            }
        }
        Event::PackProgress(progress) => {
            update_download(|d| {
                // The worker moves a running download on (checking, downloading, installing); pausing
                // and failing are recorded by whoever saw them.
                if d.state.is_active() && progress.state.is_active() {
                    d.state = progress.state;
                }
                d.progress = Some(progress);
            })
            .await
        }
        Event::PackInstalled { .. } => {
            let _guard = lock_download().await;
            records::DOWNLOAD.remove_or_log().await;
            clear_alarm(DOWNLOAD_ALARM).await;
            forget_unused_host_permissions().await;
        }
        Event::PackFailed { error, message, offline } => {
            update_download(|d| {
                d.state = DownloadState::Failed;
                d.retry_offline = offline;
                let mut shown = ErrorText { error, message };
                if offline {
                    shown = ErrorText::of(&ServiceWorkerError::Offline(shown));
                }
                d.error = Some(shown.error);
                d.message = shown.message;
            })
            .await;
            // Offline, the alarm tries the download again (set here too: a download resumed at start-up
            // did not go through `install`, and alarms need not outlive the browser).
            if offline {
                set_alarm(DOWNLOAD_ALARM).await;
            } else {
                clear_alarm(DOWNLOAD_ALARM).await;
            }
        }
        // For the pages: nothing the service worker keeps.
        Event::PackChanged {} | Event::Residency(_) | Event::GalleryDeleted { .. } => {}
    }
}

thread_local! {
    /// Serialises everything that reads and then writes the stored download, or acts on what it read:
    /// requests, events and the watchdog interleave while storage answers.
    static DOWNLOAD_LOCK: Arc<Mutex<()>> = Arc::new(Mutex::new(()));
    /// Serialises opening the offscreen document.
    static OFFSCREEN_LOCK: Rc<Mutex<()>> = Rc::new(Mutex::new(()));
    /// Serialises the updates of job states from events.
    static JOB_LOCK: Arc<Mutex<()>> = Arc::new(Mutex::new(()));
}

async fn lock_download() -> OwnedMutexGuard<()> {
    DOWNLOAD_LOCK.with(Arc::clone).lock_owned().await
}

/// Changes the stored download, if there is one (events of a cancelled download change nothing).
async fn update_download(change: impl FnOnce(&mut Download)) {
    let _guard = lock_download().await;
    if let Some(mut download) = records::DOWNLOAD.get().await {
        // A paused download's worker may still report once; that does not resume it.
        if download.state != DownloadState::Paused {
            change(&mut download);
        } else {
            let mut copy = download.clone();
            change(&mut copy);
            download.progress = copy.progress;
        }
        records::DOWNLOAD.set_or_log(&download).await;
    }
}

/// The studio's focus goes once every image of its finished job was deleted from the gallery: a
/// studio opened later starts empty, not with an error about an image the user deleted.
async fn forget_deleted_focus() {
    let Some(job) = storage::STUDIO_FOCUS.get().await.and_then(|focus| focus.job) else { return };
    let done = matches!(records::job(&job).get().await, Some(JobState::Done { .. }));
    if done && job_state(&job).await == JobState::Unknown {
        storage::STUDIO_FOCUS.remove_or_log().await;
    }
}

/// The images of a batch recorded so far (without their PNGs); `None` when the job is done already.
async fn finished_images(job: &str) -> Option<Vec<GenerateResult>> {
    match records::job(job).get().await {
        Some(JobState::Done { .. }) => None,
        state => Some(state.map(|state| state.results().to_vec()).unwrap_or_default()),
    }
}

/// A job's state; its images are read back from OPFS.
async fn job_state(job: &str) -> JobState {
    let Some(mut state) = records::job(job).get().await else { return JobState::Unknown };
    // A state recorded before batches existed has its one image in `result` only.
    if let JobState::Done { result, results } = &mut state {
        if results.is_empty() {
            results.push(result.clone());
        }
    }
    let results = match &mut state {
        JobState::Running { results, .. }
        | JobState::Done { results, .. }
        | JobState::Failed { results, .. }
        | JobState::Cancelled { results } => results,
        JobState::Unknown => return state,
    };
    let mut kept = Vec::with_capacity(results.len());
    for mut result in std::mem::take(results) {
        match kept_image(job, &result).await {
            Ok(png) => {
                result.png = png;
                kept.push(result);
            }
            // Deleted from the gallery since: the job shows the images left.
            Err(ServiceWorkerError::NotKept(GalleryStoreError::Gallery(
                gallery::GalleryError::NotFound(_),
            ))) => {}
            Err(e) => return JobState::failed(&e),
        }
    }
    let none_left = kept.is_empty();
    *results = kept;
    if none_left && matches!(state, JobState::Done { .. }) {
        return JobState::Unknown;
    }
    if let JobState::Done { result, results } = &mut state {
        if let Some(last) = results.last() {
            *result = last.clone();
        }
    }
    state
}

/// Keeps `result`'s image (`png`, base64, as the result event carries it) in the gallery, which is where
/// the job's images are read back from: one copy of the bytes. A private one is not written anywhere:
/// the offscreen document that made it holds it in memory ([`kept_image`]). Returns the PNG's size.
async fn keep_image(result: &GenerateResult, png: &str) -> Result<u64, ServiceWorkerError> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD.decode(png)?;
    if !result.private {
        gallery_store::write_png(&gallery::image_id(&result.job, result.index), &bytes).await?;
    }
    Ok(bytes.len() as u64)
}

/// The PNG (base64) of a job's image: from the gallery, or a private one from the offscreen document's
/// memory (never opened for it: a closed document holds nothing).
async fn kept_image(job: &str, result: &GenerateResult) -> Result<String, ServiceWorkerError> {
    use base64::Engine;
    let id = gallery::image_id(job, result.index);
    if !result.private {
        let png = gallery_store::png(&id).await.map_err(ServiceWorkerError::NotKept)?;
        return Ok(base64::engine::general_purpose::STANDARD.encode(png));
    }
    if !offscreen_exists().await.unwrap_or(false) {
        return Err(ServiceWorkerError::PrivateGone);
    }
    let reply = send(&protocol::to_offscreen(&OffscreenCommand::PrivateImage { id })).await?;
    match from_js::<OffscreenReply>(&reply) {
        Ok(OffscreenReply::PrivateImage { png: Some(png) }) => Ok(png),
        Ok(OffscreenReply::PrivateImage { png: None }) => Err(ServiceWorkerError::PrivateGone),
        Ok(OffscreenReply::Refused(error)) => Err(ServiceWorkerError::Refused(error)),
        _ => Err(ServiceWorkerError::NoAnswer),
    }
}
