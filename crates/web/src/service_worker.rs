//! The service worker: owns the message API, jobs, the context menu and the offscreen document.
//!
//! It holds no state in memory that matters: Chrome stops it whenever it is idle. Job states and install
//! progress live in `chrome.storage.session`, the pack in OPFS, and the work itself in the offscreen
//! document, which outlives the service worker.

use imagine_core::api::{Event, GenerateRequest, JobState, PackProgress, PackStatus, Reply, Request};
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{future_to_promise, JsFuture};

use crate::chrome;
use crate::js::{error_text, from_js, get, random_u64, to_js, Obj};
use crate::messaging::{send, OFFSCREEN_TARGET};
use crate::opfs;
use crate::stage_worker::JobSpec;

/// The context-menu item on selected text.
pub const MENU_ID: &str = "imagine-selection";
/// Jobs whose state is kept (results included) for pages that open late.
const KEPT_JOBS: usize = 8;
const JOBS_KEY: &str = "jobs";
const INSTALL_KEY: &str = "install";

/// What the service worker remembers about pack installs.
#[derive(Debug, Default, Serialize, Deserialize)]
struct InstallState {
    installing: Option<PackProgress>,
    error: Option<String>,
}

/// `chrome.runtime.onMessage`: answers requests, records events. Resolves to the reply, or to
/// `undefined` for messages that are not requests.
#[wasm_bindgen(js_name = serviceWorkerMessage)]
pub fn service_worker_message(message: JsValue) -> js_sys::Promise {
    future_to_promise(async move {
        if get(&message, "target").as_string().as_deref() == Some(OFFSCREEN_TARGET) {
            return Ok(JsValue::UNDEFINED);
        }
        if let Ok(event) = from_js::<Event>(&message) {
            record(event).await;
            return Ok(JsValue::UNDEFINED);
        }
        let reply = match from_js::<Request>(&message) {
            Ok(request) => handle(request).await,
            Err(e) => Reply::Error { error: format!("not a request of the Imagine message API: {e}") },
        };
        Ok(to_js(&reply))
    })
}

/// `chrome.runtime.onInstalled`: (re)creates the context menu.
#[wasm_bindgen(js_name = serviceWorkerInstalled)]
pub fn service_worker_installed() -> js_sys::Promise {
    future_to_promise(async {
        if let Ok(promise) = chrome::context_menus_remove_all() {
            let _ = JsFuture::from(promise).await;
        }
        let item = Obj::new()
            .set("id", MENU_ID)
            .set("title", "Imagine \u{201c}%s\u{201d}")
            .set("contexts", js_sys::Array::of1(&"selection".into()))
            .build();
        chrome::context_menus_create(&item)?;
        Ok(JsValue::UNDEFINED)
    })
}

/// `chrome.contextMenus.onClicked`: generates from the selection and opens the result page.
#[wasm_bindgen(js_name = serviceWorkerMenuClick)]
pub fn service_worker_menu_click(info: JsValue) -> js_sys::Promise {
    future_to_promise(async move {
        if get(&info, "menuItemId").as_string().as_deref() != Some(MENU_ID) {
            return Ok(JsValue::UNDEFINED);
        }
        let prompt = get(&info, "selectionText").as_string().unwrap_or_default();
        let shown = String::from(js_sys::encode_uri_component(&prompt));
        let page = match start_job(GenerateRequest { prompt, ..Default::default() }).await {
            Reply::JobStarted { job, .. } => format!("result.html?job={job}&prompt={shown}"),
            Reply::Error { error } => {
                format!("result.html?error={}", String::from(js_sys::encode_uri_component(&error)))
            }
            _ => "result.html".to_owned(),
        };
        let url = chrome::runtime_get_url(&page);
        JsFuture::from(chrome::tabs_create(&Obj::new().set("url", url).build())?).await?;
        Ok(JsValue::UNDEFINED)
    })
}

async fn handle(request: Request) -> Reply {
    match request {
        Request::InstallPack { base_url } => install(base_url).await,
        Request::PackStatus => Reply::PackStatus(pack_status().await),
        Request::Generate(request) => start_job(request).await,
        Request::Cancel { job } => {
            match command(Obj::new().set("command", "cancelJob").set("job", job.as_str())).await {
                Ok(()) => Reply::Cancelled { job },
                Err(error) => Reply::Error { error },
            }
        }
        Request::Job { job } => Reply::Job(job_state(&job).await),
    }
}

async fn install(base_url: String) -> Reply {
    if !(base_url.starts_with("https://") || base_url.starts_with("http://")) {
        return Reply::Error {
            error: format!("baseUrl must be an http:// or https:// URL, got {base_url:?}"),
        };
    }
    let state = InstallState { installing: Some(PackProgress::default()), error: None };
    save(INSTALL_KEY, &state).await;
    match command(Obj::new().set("command", "installPack").set("baseUrl", base_url)).await {
        Ok(()) => Reply::InstallStarted,
        Err(error) => Reply::Error { error },
    }
}

async fn pack_status() -> PackStatus {
    let install: InstallState = load(INSTALL_KEY).await.unwrap_or_default();
    let record = opfs::pack_record().await;
    PackStatus {
        installed: record.is_some(),
        bytes: record.as_ref().map_or(0, |r| r.bytes),
        source: record.map(|r| r.source),
        installing: install.installing,
        error: install.error,
    }
}

async fn start_job(request: GenerateRequest) -> Reply {
    let params = match request.validate(random_u64()) {
        Ok(params) => params,
        Err(e) => return Reply::Error { error: e.to_string() },
    };
    if opfs::pack_record().await.is_none() {
        return Reply::Error {
            error: "no model pack is installed yet: install one (installPack) before generating".into(),
        };
    }
    let job = format!("{:016x}", random_u64());
    let spec = JobSpec {
        prompt: params.prompt,
        width: params.width,
        height: params.height,
        steps: params.steps,
        seed: params.seed.to_string(),
        schedule: params.schedule.name().to_owned(),
        trace: params.trace,
        backend: params.backend.name().to_owned(),
    };
    set_job(&job, &JobState::Running { progress: None }).await;
    let seed = spec.seed.clone();
    let message = Obj::new().set("command", "runJob").set("job", job.as_str()).set("spec", to_js(&spec));
    match command(message).await {
        Ok(()) => Reply::JobStarted { job, seed },
        Err(error) => {
            set_job(&job, &JobState::Failed { error: error.clone() }).await;
            Reply::Error { error }
        }
    }
}

/// Sends an internal command to the offscreen document, creating it first if needed.
async fn command(message: Obj) -> Result<(), String> {
    ensure_offscreen().await?;
    send(&message.set("target", OFFSCREEN_TARGET).build()).await.map(|_| ())
}

async fn ensure_offscreen() -> Result<(), String> {
    let filter = Obj::new().set("contextTypes", js_sys::Array::of1(&"OFFSCREEN_DOCUMENT".into())).build();
    let contexts = JsFuture::from(chrome::runtime_get_contexts(&filter).map_err(|e| error_text(&e))?)
        .await
        .map_err(|e| error_text(&e))?;
    if js_sys::Array::from(&contexts).length() > 0 {
        return Ok(());
    }
    let parameters = Obj::new()
        .set("url", "offscreen.html")
        .set("reasons", js_sys::Array::of1(&"WORKERS".into()))
        .set("justification", "Runs the image model in dedicated workers (WebGPU) and stores the model pack.")
        .build();
    match JsFuture::from(chrome::offscreen_create_document(&parameters).map_err(|e| error_text(&e))?).await {
        Ok(_) => Ok(()),
        // Another request created it meanwhile.
        Err(e) if error_text(&e).contains("single offscreen document") => Ok(()),
        Err(e) => Err(format!("could not open the offscreen document: {}", error_text(&e))),
    }
}

/// Keeps the latest state of jobs and installs, from the events the offscreen document broadcasts.
async fn record(event: Event) {
    match event {
        Event::Progress { job, progress } => {
            set_job(&job, &JobState::Running { progress: Some(progress) }).await
        }
        Event::Result(mut result) => {
            // The trace is for the caller that asked for it, not worth keeping.
            result.trace = None;
            let job = result.job.clone();
            set_job(&job, &JobState::Done { result }).await;
        }
        Event::Failed { job, error } => set_job(&job, &JobState::Failed { error }).await,
        Event::Cancelled { job } => set_job(&job, &JobState::Cancelled).await,
        Event::PackProgress(progress) => {
            save(INSTALL_KEY, &InstallState { installing: Some(progress), error: None }).await
        }
        Event::PackInstalled { .. } => save(INSTALL_KEY, &InstallState::default()).await,
        Event::PackFailed { error } => {
            save(INSTALL_KEY, &InstallState { installing: None, error: Some(error) }).await
        }
    }
}

async fn job_state(job: &str) -> JobState {
    load(&job_key(job)).await.unwrap_or(JobState::Unknown)
}

fn job_key(job: &str) -> String {
    format!("job:{job}")
}

async fn set_job(job: &str, state: &JobState) {
    let key = job_key(job);
    save(&key, state).await;
    let mut jobs: Vec<String> = load(JOBS_KEY).await.unwrap_or_default();
    if !jobs.iter().any(|j| j == job) {
        jobs.push(job.to_owned());
        while jobs.len() > KEPT_JOBS {
            let old = jobs.remove(0);
            if let Ok(promise) = chrome::session_remove(&job_key(&old).into()) {
                let _ = JsFuture::from(promise).await;
            }
        }
        save(JOBS_KEY, &jobs).await;
    }
}

async fn save<T: Serialize>(key: &str, value: &T) {
    let items = Obj::new().set(key, to_js(value)).build();
    if let Ok(promise) = chrome::session_set(&items) {
        if let Err(e) = JsFuture::from(promise).await {
            web_sys::console::error_1(&e);
        }
    }
}

async fn load<T: for<'de> Deserialize<'de>>(key: &str) -> Option<T> {
    let items = JsFuture::from(chrome::session_get(&key.into()).ok()?).await.ok()?;
    let value = get(&items, key);
    if value.is_undefined() {
        return None;
    }
    from_js(&value).ok()
}
