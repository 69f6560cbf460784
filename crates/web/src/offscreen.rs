//! The offscreen document: runs jobs stage by stage, one dedicated worker per stage, and pack installs.
//!
//! It takes internal commands from the service worker (`{ target: "offscreen", command, ... }`) and
//! broadcasts public [`Event`]s. Jobs run one at a time, in order. A stage's worker is terminated as
//! soon as the stage ends (or the job is cancelled), which is what frees its GPU memory and wasm heap.

use std::cell::RefCell;
use std::collections::VecDeque;

use futures_channel::mpsc;
use futures_util::StreamExt;
use imagine_core::api::{
    DownloadProgress, DownloadState, Event, GenerateResult, InstallRequest, Progress, Stage, Timings, Trace,
};
use js_sys::{Array, Uint8Array};
use serde::Deserialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::spawn_local;
use web_sys::{MessageChannel, MessageEvent, Worker, WorkerOptions, WorkerType};

use crate::js::{from_js, get, get_f64, get_string, now_ms, Obj};
use crate::messaging::broadcast;
use crate::stage_worker::{EncoderOutput, JobSpec, StageTiming, TransformerOutput};

/// A command from the service worker.
#[derive(Debug, Deserialize)]
#[serde(tag = "command", rename_all = "camelCase")]
enum Command {
    RunJob { job: String, spec: JobSpec },
    CancelJob { job: String },
    InstallPack { request: InstallRequest },
    PausePack,
    CancelPack,
    InstallStatus,
}

/// The worker of the stage that is running now, so that a cancel can terminate it.
struct Current {
    job: String,
    worker: Worker,
    inbox: mpsc::UnboundedSender<JsValue>,
}

/// The workers of the running pack download: the download worker and its hash worker.
struct Install {
    worker: Worker,
    hasher: Worker,
    inbox: mpsc::UnboundedSender<JsValue>,
    last: Option<DownloadProgress>,
    /// The worker ended and its outcome is being broadcast. The install stays registered until the
    /// service worker has recorded the outcome, so it never restarts an install that just failed.
    ended: bool,
    /// An install asked for while the previous one was ending; it starts right after.
    next: Option<InstallRequest>,
}

impl Install {
    fn terminate(&self) {
        self.worker.terminate();
        self.hasher.terminate();
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<(String, JobSpec)>,
    running: Option<String>,
    /// The running job was cancelled.
    cancel_running: bool,
    current: Option<Current>,
    install: Option<Install>,
    /// A verified pack waits to replace the installed one: no new job starts until it has (or the
    /// install stopped).
    swap_pending: bool,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Entry point of `offscreen.js`; it forwards every message whose `target` is `offscreen` here and
/// replies with what this resolves to.
#[wasm_bindgen(js_name = offscreenCommand)]
pub fn offscreen_command(message: JsValue, sender: JsValue) -> js_sys::Promise {
    wasm_bindgen_futures::future_to_promise(async move {
        if crate::messaging::sender(&sender) != imagine_core::api::Sender::ServiceWorker {
            return Err("offscreen: commands are taken from the service worker only".into());
        }
        match from_js::<Command>(&message) {
            Ok(Command::RunJob { job, spec }) => {
                let start_now = STATE.with_borrow_mut(|state| {
                    state.queue.push_back((job, spec));
                    // The first job of an idle queue starts the loop; until the loop has popped it, a
                    // job queued right after must not start a second one.
                    state.running.is_none() && state.queue.len() == 1
                });
                if start_now {
                    spawn_local(run_queue());
                }
            }
            Ok(Command::CancelJob { job }) => cancel(&job),
            Ok(Command::InstallPack { request }) => start_install(request)?,
            Ok(Command::PausePack) => {
                if let Some(progress) = stop_install() {
                    let progress = DownloadProgress {
                        state: DownloadState::Paused,
                        bytes_per_second: 0.0,
                        seconds_left: None,
                        ..progress
                    };
                    // Not awaited: the service worker answers events only after the request that
                    // paused has its reply.
                    spawn_local(async move { broadcast(&Event::PackProgress(progress)).await });
                }
            }
            Ok(Command::CancelPack) => {
                stop_install();
                remove_staging().await?;
            }
            Ok(Command::InstallStatus) => {}
            Err(e) => return Err(format!("offscreen: bad command: {e}").into()),
        }
        let installing = STATE.with_borrow(|state| state.install.is_some());
        Ok(Obj::new().set("ok", true).set("installing", installing).build())
    })
}

async fn run_queue() {
    loop {
        let next = STATE.with_borrow_mut(|state| {
            let next = if state.swap_pending { None } else { state.queue.pop_front() };
            state.running = next.as_ref().map(|(job, _)| job.clone());
            state.cancel_running = false;
            next
        });
        let Some((job, spec)) = next else { return };
        let event = match run_job(&job, &spec).await {
            Ok(result) => Event::Result(result),
            Err(StageFailure::Cancelled) => Event::Cancelled { job },
            Err(StageFailure::Error(error)) => Event::Failed { job, error },
        };
        broadcast(&event).await;
    }
}

fn cancel(job: &str) {
    let queued = STATE.with_borrow_mut(|state| {
        let before = state.queue.len();
        state.queue.retain(|(queued, _)| queued != job);
        if state.running.as_deref() == Some(job) {
            // Between two stages there is no worker to stop: the next stage sees this and does not start.
            state.cancel_running = true;
        }
        if let Some(current) = state.current.take_if(|current| current.job == job) {
            current.worker.terminate();
            let _ = current.inbox.unbounded_send(Obj::new().set("kind", "cancelled").build());
        }
        state.queue.len() != before
    });
    if queued {
        let job = job.to_owned();
        spawn_local(async move { broadcast(&Event::Cancelled { job }).await });
    }
}

enum StageFailure {
    Cancelled,
    Error(String),
}

impl From<String> for StageFailure {
    fn from(error: String) -> Self {
        StageFailure::Error(error)
    }
}

async fn progress(job: &str, stage: Stage, step: u32, steps: u32) {
    broadcast(&Event::Progress { job: job.to_owned(), progress: Progress { stage, step, steps } }).await;
}

async fn run_job(job: &str, spec: &JobSpec) -> Result<GenerateResult, StageFailure> {
    let started = now_ms();
    let params = crate::js::to_js(spec);

    progress(job, Stage::TextEncoder, 1, 1).await;
    let (output, embeddings) = run_stage(job, "textEncoder", &params, None).await?;
    let encoded: EncoderOutput = from_js(&output)?;

    progress(job, Stage::Transformer, 0, spec.steps).await;
    let (output, latents) = run_stage(job, "transformer", &params, embeddings).await?;
    let denoised: TransformerOutput = from_js(&output)?;

    progress(job, Stage::Decoder, 1, 1).await;
    let (output, png) = run_stage(job, "decoder", &params, latents).await?;
    let decoded: StageTiming = from_js(&output)?;
    let png = png.ok_or_else(|| "the decoder returned no image".to_string())?;

    let stages = [encoded.timing, denoised.timing, decoded];
    let timings = Timings {
        session_create_ms: stages.iter().map(|t| t.session_create_ms).sum(),
        run_ms: stages.iter().map(|t| t.run_ms).sum(),
        total_ms: now_ms() - started,
    };
    let trace = spec.trace.then(|| Trace {
        input_ids: encoded.input_ids,
        attention_mask: encoded.attention_mask,
        sigmas: denoised.sigmas,
        noise: denoised.noise.unwrap_or_default(),
    });
    use base64::Engine;
    Ok(GenerateResult {
        job: job.to_owned(),
        png: base64::engine::general_purpose::STANDARD.encode(Uint8Array::new(&png).to_vec()),
        prompt: spec.prompt.clone(),
        seed: spec.seed.clone(),
        width: spec.width,
        height: spec.height,
        steps: spec.steps,
        schedule: spec.schedule.clone(),
        token_count: encoded.token_count,
        truncated: encoded.truncated,
        trace,
        timings: Some(timings),
    })
}

/// Spawns a stage worker for `task`, relays its progress, and terminates it when the stage ends.
async fn run_stage(
    job: &str,
    task: &str,
    params: &JsValue,
    data: Option<JsValue>,
) -> Result<(JsValue, Option<JsValue>), StageFailure> {
    if STATE.with_borrow(|state| state.cancel_running) {
        return Err(StageFailure::Cancelled);
    }
    let (worker, mut inbox, sender) = spawn_worker()?;
    STATE.with_borrow_mut(|state| {
        state.current = Some(Current { job: job.to_owned(), worker: worker.clone(), inbox: sender });
    });
    let message = Obj::new().set("task", task).set("params", params.clone());
    let posted = match &data {
        Some(data) => {
            worker.post_message_with_transfer(&message.set("data", data.clone()).build(), &Array::of1(data))
        }
        None => worker.post_message(&message.build()),
    };
    let outcome = match posted {
        Ok(()) => relay(job, &mut inbox).await,
        Err(e) => Err(StageFailure::Error(crate::js::error_text(&e))),
    };
    worker.terminate();
    STATE.with_borrow_mut(|state| {
        state.current.take_if(|current| current.job == job);
    });
    outcome
}

async fn relay(
    job: &str,
    inbox: &mut mpsc::UnboundedReceiver<JsValue>,
) -> Result<(JsValue, Option<JsValue>), StageFailure> {
    while let Some(message) = inbox.next().await {
        match get_string(&message, "kind").as_deref() {
            Some("progress") => {
                let step = get_f64(&message, "step").unwrap_or(0.0) as u32;
                let steps = get_f64(&message, "steps").unwrap_or(0.0) as u32;
                progress(job, Stage::Transformer, step, steps).await;
            }
            Some("done") => {
                let data = get(&message, "data");
                return Ok((get(&message, "output"), (!data.is_undefined()).then_some(data)));
            }
            Some("cancelled") => return Err(StageFailure::Cancelled),
            _ => {
                let error =
                    get_string(&message, "message").unwrap_or_else(|| "the stage worker failed".into());
                return Err(StageFailure::Error(error));
            }
        }
    }
    Err(StageFailure::Error("the stage worker stopped unexpectedly".into()))
}

type Spawned = (Worker, mpsc::UnboundedReceiver<JsValue>, mpsc::UnboundedSender<JsValue>);

fn new_worker(script: &str) -> Result<Worker, String> {
    let options = WorkerOptions::new();
    options.set_type(WorkerType::Module);
    Worker::new_with_options(script, &options).map_err(|e| crate::js::error_text(&e))
}

fn spawn_worker() -> Result<Spawned, String> {
    let worker = new_worker("stage-worker.js")?;
    let (sender, inbox) = mpsc::unbounded();
    let on_message = {
        let sender = sender.clone();
        Closure::<dyn FnMut(MessageEvent)>::new(move |event: MessageEvent| {
            let _ = sender.unbounded_send(event.data());
        })
    };
    let on_error = {
        let sender = sender.clone();
        Closure::<dyn FnMut(web_sys::ErrorEvent)>::new(move |event: web_sys::ErrorEvent| {
            let message = format!("the stage worker crashed: {}", event.message());
            let _ = sender.unbounded_send(Obj::new().set("kind", "error").set("message", message).build());
        })
    };
    worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    worker.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    // The closures must live as long as the worker; a worker lives for one stage.
    on_message.forget();
    on_error.forget();
    Ok((worker, inbox, sender))
}

/// Starts the download worker, unless one is running: a second request joins the first.
fn start_install(request: InstallRequest) -> Result<(), String> {
    let busy = STATE.with_borrow_mut(|state| match &mut state.install {
        Some(install) if install.ended => {
            install.next = Some(request.clone());
            true
        }
        Some(_) => true,
        None => false,
    });
    if busy {
        return Ok(());
    }
    let (worker, inbox, sender) = spawn_worker()?;
    let hasher = new_worker("hash-worker.js")?;
    let channel = MessageChannel::new().map_err(|e| crate::js::error_text(&e))?;
    let (download_end, hash_end) = (channel.port1(), channel.port2());
    hasher
        .post_message_with_transfer(
            &Obj::new().set("op", "port").set("port", hash_end.clone()).build(),
            &Array::of1(&hash_end),
        )
        .map_err(|e| crate::js::error_text(&e))?;
    let task = Obj::new()
        .set("task", "installPack")
        .set("params", crate::js::to_js(&request))
        .set("data", download_end.clone())
        .build();
    worker
        .post_message_with_transfer(&task, &Array::of1(&download_end))
        .map_err(|e| crate::js::error_text(&e))?;
    let install = Install { worker, hasher, inbox: sender, last: None, ended: false, next: None };
    STATE.with_borrow_mut(|state| state.install = Some(install));
    spawn_local(relay_install(inbox));
    Ok(())
}

/// Terminates the download worker (what it saved is kept) and returns its last progress.
fn stop_install() -> Option<DownloadProgress> {
    let install = STATE.with_borrow_mut(|state| state.install.take())?;
    install.terminate();
    let _ = install.inbox.unbounded_send(Obj::new().set("kind", "stopped").build());
    install.last
}

/// Removes a download's partial files. The terminated worker's file locks go away shortly after it.
async fn remove_staging() -> Result<(), String> {
    let staging = crate::opfs::pack_state().await?.staging;
    let mut attempt = 0;
    loop {
        match crate::opfs::clear_slot(staging).await {
            Ok(()) => return Ok(()),
            Err(_) if attempt < 20 => {
                attempt += 1;
                crate::js::sleep_ms(100).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// The install ended: jobs that waited for its pack swap start.
fn end_swap() {
    let resume = STATE.with_borrow_mut(|state| {
        std::mem::take(&mut state.swap_pending) && state.running.is_none() && !state.queue.is_empty()
    });
    if resume {
        spawn_local(run_queue());
    }
}

async fn relay_install(mut inbox: mpsc::UnboundedReceiver<JsValue>) {
    let event = loop {
        let Some(message) = inbox.next().await else { return };
        match get_string(&message, "kind").as_deref() {
            Some("packProgress") => {
                if let Ok(progress) = from_js::<DownloadProgress>(&get(&message, "progress")) {
                    STATE.with_borrow_mut(|state| {
                        if let Some(install) = &mut state.install {
                            install.last = Some(progress.clone());
                        }
                    });
                    broadcast(&Event::PackProgress(progress)).await;
                }
            }
            Some("swapReady") => {
                STATE.with_borrow_mut(|state| state.swap_pending = true);
                // The job that is running finishes on the installed pack.
                while STATE.with_borrow(|state| state.running.is_some()) {
                    crate::js::sleep_ms(100).await;
                }
                let worker = STATE.with_borrow(|state| state.install.as_ref().map(|i| i.worker.clone()));
                if let Some(worker) = worker {
                    let _ = worker.post_message(&Obj::new().set("op", "swap").build());
                }
            }
            Some("done") => {
                let output = get(&message, "output");
                let bytes = get_f64(&output, "bytes").unwrap_or(0.0) as u64;
                let commit = get_string(&output, "commit").unwrap_or_default();
                break Event::PackInstalled { bytes, commit };
            }
            // Paused or cancelled: whoever stopped it reports.
            Some("stopped") => {
                end_swap();
                return;
            }
            _ => {
                let error = get_string(&message, "message").unwrap_or_else(|| "the download failed".into());
                break Event::PackFailed { error };
            }
        }
    };
    STATE.with_borrow_mut(|state| {
        if let Some(install) = &mut state.install {
            install.terminate();
            install.ended = true;
        }
    });
    end_swap();
    broadcast(&event).await;
    let next = STATE.with_borrow_mut(|state| state.install.take().and_then(|install| install.next));
    if let Some(request) = next {
        if let Err(error) = start_install(request) {
            broadcast(&Event::PackFailed { error }).await;
        }
    }
}
