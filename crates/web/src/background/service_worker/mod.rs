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
use imagine_core::message::{arg, cause, quoted, ErrorText, Localize, Message};
use imagine_core::{Backend, ParamError};
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{future_to_promise, spawn_local, JsFuture};

use crate::background::gallery_store::{self, GalleryStoreError};
use crate::background::gpu_memory;
use crate::background::notify;
use crate::background::records::{self, set_job, Download};
use crate::platform::chrome;
use crate::platform::gpu;
use crate::platform::hub_client::{self, FetchError};
use crate::platform::i18n;
use crate::platform::js::{from_js, get, random_u64, settled, to_js, JsError, LogError, Obj};
use crate::platform::messaging::{self, send};
use crate::platform::opfs::{self, OpfsError};
use crate::platform::protocol::{
    self, OffscreenCommand, OffscreenReply, ProtocolError, StudioFocus, KEEP_ALIVE_TARGET, OFFSCREEN_TARGET,
};
use crate::platform::settings;
use crate::platform::side_panel;
use crate::platform::storage;

mod download;
mod jobs;
mod offscreen;

use download::*;
use jobs::*;
use offscreen::*;
pub(crate) use offscreen::{loaded_stages, set_keep_loaded};

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

crate::platform::js::loggable_by_display!(ServiceWorkerError);

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
        if let Some(OFFSCREEN_TARGET | KEEP_ALIVE_TARGET) = get(&message, "target").as_string().as_deref() {
            return Ok(JsValue::UNDEFINED);
        }
        let reply = match messaging::sender(&sender) {
            Sender::Foreign => Err(ServiceWorkerError::Foreign),
            // Events are what the offscreen document reports; nobody else's are recorded.
            Sender::Offscreen => {
                if let Ok(event) = from_js::<Event>(&message) {
                    record(event.clone()).await;
                    if let Some(announcement) = event.announcement() {
                        spawn_local(async move { messaging::broadcast(&announcement).await });
                    }
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

/// The reply to `request`, once what it asks is done.
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
        Request::ResumePack {} => resume().await?,
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

/// Resumes the stored download where it is not under way; one under way goes on as it is.
async fn resume() -> Result<Reply, ServiceWorkerError> {
    match records::DOWNLOAD.get().await {
        Some(download) if !download.state.is_active() => {
            install(download.request).await?;
            Ok(Reply::InstallStarted)
        }
        Some(_) => Ok(Reply::InstallStarted),
        None => Err(ServiceWorkerError::NoDownload("resume")),
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

impl Localize for ServiceWorkerError {
    fn message(&self) -> Message {
        match self {
            ServiceWorkerError::Foreign => Message::new("errSwForeign", []),
            ServiceWorkerError::EventSent => Message::new("errSwEventSent", []),
            ServiceWorkerError::NotARequest(e) => Message::new("errSwNotARequest", [arg(e)]),
            ServiceWorkerError::Source(e) => e.message(),
            ServiceWorkerError::Backend(name) => Message::new("errSwBackend", [quoted(name)]),
            ServiceWorkerError::Params(e) => e.message(),
            ServiceWorkerError::NoDownload("pause") => Message::new("errSwNoDownloadToPause", []),
            ServiceWorkerError::NoDownload("resume") => Message::new("errSwNoDownloadToResume", []),
            ServiceWorkerError::NoDownload(_) => Message::text(self),
            ServiceWorkerError::Installing => Message::new("errSwInstalling", []),
            ServiceWorkerError::NoPack => Message::new("errSwNoPack", []),
            ServiceWorkerError::Fetch(e) => e.message(),
            ServiceWorkerError::Opfs(e) => e.message(),
            ServiceWorkerError::OffscreenNotOpened(e) => Message::new("errSwOffscreenNotOpened", [arg(e)]),
            ServiceWorkerError::Refused(e) => e.message(),
            ServiceWorkerError::NoAnswer => Message::new("errSwNoAnswer", []),
            ServiceWorkerError::Js(e) => e.message(),
            ServiceWorkerError::Image(_) => Message::text(self),
            ServiceWorkerError::Gallery(e) => e.message(),
            ServiceWorkerError::NotKept(e) => Message::new("errSwNotKept", [cause(e)]),
            ServiceWorkerError::PrivateGone => Message::new("errSwPrivateGone", []),
            ServiceWorkerError::Unkept { error, seed } => {
                Message::new("errSwUnkept", [cause(error), arg(seed)])
            }
            ServiceWorkerError::NotRecorded(e) => Message::new("errSwNotRecorded", [arg(e)]),
            ServiceWorkerError::JobLost => Message::new("errSwJobLost", []),
            ServiceWorkerError::Offline(e) => Message::new("errSwOffline", [cause(e)]),
            ServiceWorkerError::OtherDownload { running } => {
                Message::new("errSwOtherDownload", [arg(running)])
            }
            ServiceWorkerError::JobRunning => Message::new("errSwJobRunning", []),
            ServiceWorkerError::GpuMemory(e) => e.message(),
            ServiceWorkerError::Gpu(e) => e.message(),
        }
    }
}
