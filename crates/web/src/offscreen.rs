//! The offscreen document: runs jobs stage by stage, one dedicated worker per stage, and pack installs.
//!
//! It takes [`OffscreenCommand`]s from the service worker and broadcasts public [`Event`]s. Jobs run one at a time, in order. A stage's worker is terminated as
//! soon as the stage ends (or the job is cancelled), which is what frees its GPU memory and wasm heap.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use futures_channel::mpsc;
use futures_util::StreamExt;
use imagine_core::api::{
    DownloadProgress, DownloadState, Event, GenerateResult, InstallRequest, Progress, Sender, Stage,
    StageTimings, Timings, Trace,
};
use imagine_core::embedding_cache;
use imagine_core::message::ErrorText;
use imagine_core::prompt::MAX_TOKENS;
use imagine_core::stages::EMBED_WIDTH;
use imagine_core::{EncodedPrompt, GenerateParams, PromptEncoder, PromptError};
use js_sys::{Float32Array, Uint8Array};
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{spawn_local, JsFuture};
use web_sys::{MessageChannel, MessageEvent, Worker, WorkerOptions, WorkerType};

use crate::js::{from_js, now_ms, to_js, JsError};
use crate::messaging::broadcast;
use crate::opfs::OpfsError;
use crate::protocol::{
    self, DownloadCommand, DownloadReport, HashSetup, OffscreenCommand, OffscreenReply, ProtocolError,
    StageOutput, StageReport, StageTask, StageTiming,
};

/// Why a command, a job or an install failed in the offscreen document.
#[derive(Debug, Error)]
pub enum OffscreenError {
    #[error("offscreen: commands are taken from the service worker only")]
    NotFromServiceWorker,
    #[error("offscreen: bad command: {0}")]
    BadCommand(ProtocolError),
    /// A worker could not be started or linked.
    #[error(transparent)]
    Js(#[from] JsError),
    /// A message to or from a worker.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error(transparent)]
    Opfs(#[from] OpfsError),
    /// What a worker reported (its own typed error, as text: it crossed `postMessage`).
    #[error("{0}")]
    Reported(ErrorText),
    #[error("{script} crashed: {message}")]
    Crashed { script: String, message: String },
    #[error("the stage worker stopped unexpectedly")]
    StageStopped,
    #[error("internal: the {0} worker handed on another stage's output")]
    WrongOutput(&'static str),
    #[error("internal: a stage handed on nothing")]
    NoOutput,
    /// A file shipped with the extension (the tokenizer) could not be read.
    #[error("reading {path}: {source}")]
    Asset { path: &'static str, source: JsError },
    #[error("reading {path}: HTTP {status}")]
    AssetStatus { path: &'static str, status: u16 },
    #[error("loading the tokenizer failed: {0}")]
    Tokenizer(PromptError),
    #[error("encoding the prompt failed: {0}")]
    Prompt(PromptError),
}

/// What reaches the offscreen document about a worker: what it posted, or what happened to it.
enum Incoming {
    Posted(JsValue),
    Crashed(OffscreenError),
    /// Terminated here (a cancel, a pause).
    Stopped,
}

/// A stage worker of the running job (the stage that runs, and the next one while it loads), so that a
/// cancel can terminate it.
struct Current {
    job: String,
    /// Which `StageRun` it belongs to.
    id: u64,
    worker: Worker,
    inbox: mpsc::UnboundedSender<Incoming>,
}

/// The workers of the running pack download: the download worker and its hash worker.
struct Install {
    worker: Worker,
    hasher: Worker,
    inbox: mpsc::UnboundedSender<Incoming>,
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
    queue: VecDeque<(String, GenerateParams)>,
    running: Option<String>,
    /// The running job was cancelled.
    cancel_running: bool,
    current: Vec<Current>,
    /// The id of the next `StageRun`.
    next_run: u64,
    install: Option<Install>,
    /// A verified pack waits to replace the installed one: no new job starts until it has (or the
    /// install stopped).
    swap_pending: bool,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Entry point of `offscreen.js`; it forwards every message whose `target` is `offscreen` here and
/// replies with the [`OffscreenReply`] this resolves to.
#[wasm_bindgen(js_name = offscreenCommand)]
pub fn offscreen_command(message: JsValue, sender: JsValue) -> js_sys::Promise {
    wasm_bindgen_futures::future_to_promise(async move {
        let reply = match command(message, sender).await {
            Ok(()) => OffscreenReply::Done { installing: STATE.with_borrow(|state| state.install.is_some()) },
            Err(error) => OffscreenReply::Refused(ErrorText::of(&error)),
        };
        Ok(to_js(&reply))
    })
}

async fn command(message: JsValue, sender: JsValue) -> Result<(), OffscreenError> {
    if crate::messaging::sender(&sender) != Sender::ServiceWorker {
        return Err(OffscreenError::NotFromServiceWorker);
    }
    match from_js::<OffscreenCommand>(&message).map_err(OffscreenError::BadCommand)? {
        OffscreenCommand::RunJob { job, params } => {
            let start_now = STATE.with_borrow_mut(|state| {
                state.queue.push_back((job, params));
                // The first job of an idle queue starts the loop; until the loop has popped it, a job
                // queued right after must not start a second one.
                state.running.is_none() && state.queue.len() == 1
            });
            if start_now {
                spawn_local(run_queue());
            }
        }
        OffscreenCommand::CancelJob { job } => cancel(&job),
        OffscreenCommand::InstallPack { request } => start_install(request)?,
        OffscreenCommand::PausePack => {
            if let Some(progress) = stop_install() {
                let progress = DownloadProgress {
                    state: DownloadState::Paused,
                    bytes_per_second: 0.0,
                    seconds_left: None,
                    ..progress
                };
                // Not awaited: the service worker answers events only after the request that paused
                // has its reply.
                spawn_local(async move { broadcast(&Event::PackProgress(progress)).await });
            }
        }
        OffscreenCommand::CancelPack => {
            stop_install();
            remove_staging().await?;
        }
        OffscreenCommand::InstallStatus => {}
    }
    Ok(())
}

async fn run_queue() {
    loop {
        let next = STATE.with_borrow_mut(|state| {
            let next = if state.swap_pending { None } else { state.queue.pop_front() };
            state.running = next.as_ref().map(|(job, _)| job.clone());
            state.cancel_running = false;
            next
        });
        let Some((job, params)) = next else { return };
        // A finished job has broadcast its results already.
        let event = match run_job(&job, &params).await {
            Ok(()) => continue,
            Err(StageFailure::Cancelled) => Event::Cancelled { job },
            Err(StageFailure::Error(error)) => Event::failed(job, &error),
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
        for current in state.current.extract_if(.., |current| current.job == job) {
            current.worker.terminate();
            let _ = current.inbox.unbounded_send(Incoming::Stopped);
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
    Error(OffscreenError),
}

impl From<OffscreenError> for StageFailure {
    fn from(error: OffscreenError) -> Self {
        StageFailure::Error(error)
    }
}

impl From<ProtocolError> for StageFailure {
    fn from(error: ProtocolError) -> Self {
        StageFailure::Error(error.into())
    }
}

impl From<JsError> for StageFailure {
    fn from(error: JsError) -> Self {
        StageFailure::Error(error.into())
    }
}

async fn progress(job: &str, stage: Stage, image: u32, images: u32, step: u32, steps: u32) {
    let progress = Progress { stage, step, steps, image, images };
    broadcast(&Event::Progress { job: job.to_owned(), progress }).await;
}

/// Runs a job: its `count` images, each graph loaded once for all of them; a `result` event is
/// broadcast for each image as soon as it is decoded. Each stage's worker starts while the stage before
/// it runs, so that its session is created meanwhile (at most two stages loaded at once). A job that
/// fails so before its first image (a GPU without room for two stages, say) is made again one stage at
/// a time: loading ahead never costs an image.
async fn run_job(job: &str, params: &GenerateParams) -> Result<(), StageFailure> {
    let mut sent = 0;
    match run_stages(job, params, Ahead::NextStage, &mut sent).await {
        Err(StageFailure::Error(error)) if sent == 0 => {
            warn(&format!("imagine: {error}; making the image again with one stage loaded at a time"));
            run_stages(job, params, Ahead::Nothing, &mut sent).await
        }
        outcome => outcome,
    }
}

/// Whether the next stage's worker starts while the current stage runs.
#[derive(Clone, Copy, PartialEq)]
enum Ahead {
    NextStage,
    Nothing,
}

/// [`run_job`]'s work; `sent` counts the images broadcast.
async fn run_stages(
    job: &str,
    params: &GenerateParams,
    ahead: Ahead,
    sent: &mut u32,
) -> Result<(), StageFailure> {
    let started = now_ms();
    let images = params.count;

    progress(job, Stage::TextEncoder, 0, images, 1, 1).await;
    let prompt = tokenize(&params.prompt).await?;
    let transformer_task = StageTask::Transformer { params: params.clone() };
    let early = |task: &StageTask| -> Result<Option<StageRun>, StageFailure> {
        Ok(if ahead == Ahead::NextStage { Some(StageRun::start(job, task, None)?) } else { None })
    };
    let transformer = early(&transformer_task)?;
    let (embeddings, encoder_timing) = prompt_embeddings(job, params, &prompt).await?;

    progress(job, Stage::Transformer, 0, images, 0, params.steps).await;
    let mut transformer = StageRun::given(transformer, job, &transformer_task, embeddings)?;
    let decoder_task = StageTask::Decoder { params: params.clone() };
    let decoder = early(&decoder_task)?;
    let (StageOutput::Transformer(denoised), latents) = transformer.done(images).await? else {
        return Err(unexpected("transformer"));
    };
    drop(transformer);

    progress(job, Stage::Decoder, 0, images, 1, 1).await;
    let latents = latents.ok_or(OffscreenError::NoOutput)?;
    let mut decoder = StageRun::given(decoder, job, &decoder_task, latents)?;
    loop {
        match decoder.next(images).await? {
            Reported::Image { index, timing, png } => {
                *sent += 1;
                let timings = Timings {
                    session_create_ms: encoder_timing.session_create_ms
                        + denoised.timing.session_create_ms
                        + timing.session_create_ms,
                    run_ms: encoder_timing.run_ms
                        + denoised.image_run_ms.get(index as usize).copied().unwrap_or_default()
                        + timing.run_ms,
                    total_ms: now_ms() - started,
                    stages: [
                        (Stage::TextEncoder, encoder_timing.clone()),
                        (Stage::Transformer, denoised.timing.clone()),
                        (Stage::Decoder, timing),
                    ]
                    .into_iter()
                    .map(|(stage, t)| StageTimings {
                        stage,
                        worker_created_at_ms: t.worker_created_at_ms,
                        task_at_ms: t.task_at_ms,
                        started_at_ms: t.started_at_ms,
                        finished_at_ms: t.finished_at_ms,
                        session_create_ms: t.session_create_ms,
                        run_ms: t.run_ms,
                        runs_ms: t.runs_ms,
                    })
                    .collect(),
                };
                let trace = params.trace.then(|| Trace {
                    input_ids: prompt.input_ids.clone(),
                    attention_mask: prompt.attention_mask.clone(),
                    sigmas: denoised.sigmas.clone(),
                    noise: denoised.noise.get(index as usize).cloned().unwrap_or_default(),
                });
                use base64::Engine;
                let result = GenerateResult {
                    job: job.to_owned(),
                    png: base64::engine::general_purpose::STANDARD.encode(Uint8Array::new(&png).to_vec()),
                    prompt: params.prompt.clone(),
                    seed: params.seed_of(index).to_string(),
                    width: params.width,
                    height: params.height,
                    steps: params.steps,
                    schedule: params.schedule.name().to_owned(),
                    token_count: prompt.token_count as u32,
                    truncated: prompt.truncated,
                    trace,
                    timings: Some(timings),
                    index,
                    count: images,
                };
                broadcast(&Event::Result(result)).await;
                if index + 1 < images {
                    progress(job, Stage::Decoder, index + 1, images, 1, 1).await;
                }
            }
            Reported::Done(StageOutput::Decoder { .. }, _) => return Ok(()),
            Reported::Done(..) => return Err(unexpected("decoder")),
        }
    }
}

thread_local! {
    /// The prompt encoder, loaded on the first job of this document (loading takes far longer than
    /// encoding).
    static PROMPT_ENCODER: RefCell<Option<Rc<PromptEncoder>>> = const { RefCell::new(None) };
}

/// The prompt's tokens, as the text encoder takes them; they also key the embedding cache.
async fn tokenize(prompt: &str) -> Result<EncodedPrompt, OffscreenError> {
    let encoder = match PROMPT_ENCODER.with_borrow(Clone::clone) {
        Some(encoder) => encoder,
        None => {
            let tokenizer = fetch_bytes("tokenizer/tokenizer.json").await?;
            let config = fetch_bytes("tokenizer/tokenizer_config.json").await?;
            let encoder =
                Rc::new(PromptEncoder::new(&tokenizer, &config).map_err(OffscreenError::Tokenizer)?);
            PROMPT_ENCODER.set(Some(encoder.clone()));
            encoder
        }
    };
    encoder.encode(prompt).map_err(OffscreenError::Prompt)
}

/// A file shipped with the extension.
async fn fetch_bytes(path: &'static str) -> Result<Vec<u8>, OffscreenError> {
    let failed = |e: JsValue| OffscreenError::Asset { path, source: e.into() };
    let window = web_sys::window().ok_or_else(|| failed(JsValue::from_str("no window")))?;
    let response = JsFuture::from(window.fetch_with_str(path)).await.map_err(failed)?;
    let response: web_sys::Response = response.unchecked_into();
    if !response.ok() {
        return Err(OffscreenError::AssetStatus { path, status: response.status() });
    }
    let buffer = JsFuture::from(response.array_buffer().map_err(failed)?).await.map_err(failed)?;
    Ok(Uint8Array::new(&buffer).to_vec())
}

/// The prompt's embeddings (an `ArrayBuffer` of float32) and the text encoder's timing: from the cache
/// when this pack has encoded these tokens before (no text-encoder worker at all), otherwise from the
/// text-encoder worker, and then kept. The cache failing never fails the job: it is only a shortcut.
async fn prompt_embeddings(
    job: &str,
    params: &GenerateParams,
    prompt: &EncodedPrompt,
) -> Result<(JsValue, StageTiming), StageFailure> {
    let commit = crate::opfs::installed_pack().await.map(|(record, _)| record.commit);
    let key = commit.as_ref().map(|commit| embedding_cache::key(commit, params.backend, prompt));
    let values = MAX_TOKENS * EMBED_WIDTH;
    if let (Some(commit), Some(key)) = (&commit, &key) {
        match crate::opfs::embeddings::read_entry(commit, key, values).await {
            Ok(Some(embeddings)) => {
                let buffer = Float32Array::from(embeddings.as_slice()).buffer().into();
                return Ok((buffer, StageTiming::default()));
            }
            Ok(None) => {}
            Err(e) => warn(&format!("imagine: the embedding cache could not be read: {e}")),
        }
    }
    let task = StageTask::TextEncoder { params: params.clone(), prompt: prompt.clone() };
    let (StageOutput::TextEncoder(encoded), embeddings) = run_stage(job, params.count, &task).await? else {
        return Err(unexpected("text encoder"));
    };
    let embeddings = embeddings.ok_or(OffscreenError::NoOutput)?;
    if let (Some(commit), Some(key)) = (&commit, &key) {
        // Copied before the buffer is transferred to the transformer.
        let copy = Float32Array::new(&embeddings).to_vec();
        let (count, truncated) = (prompt.token_count as u32, prompt.truncated);
        if let Err(e) = crate::opfs::embeddings::write_entry(commit, key, &copy, count, truncated).await {
            warn(&format!("imagine: the prompt embeddings could not be cached: {e}"));
        }
    }
    Ok((embeddings, encoded.timing))
}

fn warn(text: &str) {
    web_sys::console::warn_1(&text.into());
}

fn unexpected(stage: &'static str) -> StageFailure {
    StageFailure::Error(OffscreenError::WrongOutput(stage))
}

/// Runs a stage that reports no images to its end: its output and the buffer it hands on.
async fn run_stage(
    job: &str,
    images: u32,
    task: &StageTask,
) -> Result<(StageOutput, Option<JsValue>), StageFailure> {
    StageRun::start(job, task, None)?.done(images).await
}

/// What a stage worker reported that its caller acts on (progress is relayed on the way).
enum Reported {
    /// The decoder finished image `index`: its PNG.
    Image { index: u32, timing: StageTiming, png: JsValue },
    /// The stage is done: its output, and the buffer it hands on if any.
    Done(StageOutput, Option<JsValue>),
}

/// The worker of one stage of a job; dropping it terminates the worker.
struct StageRun {
    id: u64,
    worker: Worker,
    inbox: mpsc::UnboundedReceiver<Incoming>,
    job: String,
}

impl StageRun {
    /// Spawns a stage worker for `task` and hands it `data` (transferred); without `data` the worker
    /// creates its session and waits for its input ([`StageRun::given`]).
    fn start(job: &str, task: &StageTask, data: Option<&JsValue>) -> Result<StageRun, StageFailure> {
        if STATE.with_borrow(|state| state.cancel_running) {
            return Err(StageFailure::Cancelled);
        }
        let (worker, inbox, sender) = spawn_worker("stage-worker.js")?;
        let id = STATE.with_borrow_mut(|state| {
            let id = state.next_run;
            state.next_run += 1;
            state.current.push(Current { job: job.to_owned(), id, worker: worker.clone(), inbox: sender });
            id
        });
        let run = StageRun { id, worker, inbox, job: job.to_owned() };
        protocol::post(&run.worker, task, data)?;
        Ok(run)
    }

    /// `early`, started before without its input, given `data` now; else a worker started for `task`
    /// with it.
    fn given(
        early: Option<StageRun>,
        job: &str,
        task: &StageTask,
        data: JsValue,
    ) -> Result<StageRun, StageFailure> {
        match early {
            Some(run) => {
                protocol::post(&run.worker, &StageTask::Input, Some(&data))?;
                Ok(run)
            }
            None => StageRun::start(job, task, Some(&data)),
        }
    }

    /// Relays the worker's progress until the stage is done: its output and the buffer it hands on.
    async fn done(&mut self, images: u32) -> Result<(StageOutput, Option<JsValue>), StageFailure> {
        match self.next(images).await? {
            Reported::Done(output, data) => Ok((output, data)),
            Reported::Image { .. } => Err(unexpected("a stage other than the decoder")),
        }
    }

    /// Relays the worker's progress until it reports an image or the end.
    async fn next(&mut self, images: u32) -> Result<Reported, StageFailure> {
        while let Some(incoming) = self.inbox.next().await {
            let posted = match incoming {
                Incoming::Posted(posted) => posted,
                Incoming::Crashed(error) => return Err(StageFailure::Error(error)),
                Incoming::Stopped => return Err(StageFailure::Cancelled),
            };
            match protocol::read::<StageReport>(&posted)? {
                (StageReport::Progress { image, step, steps }, _) => {
                    progress(&self.job, Stage::Transformer, image, images, step, steps).await
                }
                (StageReport::Image { index, timing }, Some(png)) => {
                    return Ok(Reported::Image { index, timing, png })
                }
                (StageReport::Image { .. }, None) => return Err(OffscreenError::NoOutput.into()),
                // For benchmarks, which read it from the worker's messages; the pipeline needs nothing.
                (StageReport::SessionCreated { .. }, _) => {}
                (StageReport::Done { output }, data) => return Ok(Reported::Done(output, data)),
                (StageReport::Error(error), _) => return Err(OffscreenError::Reported(error).into()),
            }
        }
        Err(OffscreenError::StageStopped.into())
    }
}

impl Drop for StageRun {
    fn drop(&mut self) {
        self.worker.terminate();
        STATE.with_borrow_mut(|state| state.current.retain(|current| current.id != self.id));
    }
}

type Spawned = (Worker, mpsc::UnboundedReceiver<Incoming>, mpsc::UnboundedSender<Incoming>);

fn new_worker(script: &str) -> Result<Worker, JsError> {
    let options = WorkerOptions::new();
    options.set_type(WorkerType::Module);
    Ok(Worker::new_with_options(script, &options)?)
}

/// Starts the worker `script`, whose messages and crash arrive in the returned inbox.
fn spawn_worker(script: &str) -> Result<Spawned, JsError> {
    let worker = new_worker(script)?;
    let (sender, inbox) = mpsc::unbounded();
    let on_message = {
        let sender = sender.clone();
        Closure::<dyn FnMut(MessageEvent)>::new(move |event: MessageEvent| {
            let _ = sender.unbounded_send(Incoming::Posted(event.data()));
        })
    };
    let on_error = {
        let sender = sender.clone();
        let script = script.to_owned();
        Closure::<dyn FnMut(web_sys::ErrorEvent)>::new(move |event: web_sys::ErrorEvent| {
            let crashed = OffscreenError::Crashed { script: script.clone(), message: event.message() };
            let _ = sender.unbounded_send(Incoming::Crashed(crashed));
        })
    };
    worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    worker.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    // The closures must live as long as the worker; a worker lives for one stage or one download.
    on_message.forget();
    on_error.forget();
    Ok((worker, inbox, sender))
}

/// Starts the download worker, unless one is running: a second request joins the first.
fn start_install(request: InstallRequest) -> Result<(), OffscreenError> {
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
    let (worker, inbox, sender) = spawn_worker("download-worker.js")?;
    let hasher = new_worker("hash-worker.js")?;
    let channel = MessageChannel::new().map_err(JsError::from)?;
    let (download_end, hash_end) = (channel.port1(), channel.port2());
    protocol::post(&hasher, &HashSetup::Port, Some(&hash_end))?;
    protocol::post(&worker, &DownloadCommand::Install { request }, Some(&download_end))?;
    let install = Install { worker, hasher, inbox: sender, last: None, ended: false, next: None };
    STATE.with_borrow_mut(|state| state.install = Some(install));
    spawn_local(relay_install(inbox));
    Ok(())
}

/// Terminates the download worker (what it saved is kept) and returns its last progress.
fn stop_install() -> Option<DownloadProgress> {
    let install = STATE.with_borrow_mut(|state| state.install.take())?;
    install.terminate();
    let _ = install.inbox.unbounded_send(Incoming::Stopped);
    install.last
}

/// Removes a download's partial files. The terminated worker's file locks go away shortly after it.
async fn remove_staging() -> Result<(), OpfsError> {
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

/// The event of a failed install: the one place its error becomes text.
fn pack_failed(error: OffscreenError) -> Event {
    Event::pack_failed(&error)
}

async fn relay_install(mut inbox: mpsc::UnboundedReceiver<Incoming>) {
    let event = loop {
        let posted = match inbox.next().await {
            None => return,
            Some(Incoming::Posted(posted)) => posted,
            Some(Incoming::Crashed(error)) => break pack_failed(error),
            // Paused or cancelled: whoever stopped it reports.
            Some(Incoming::Stopped) => {
                end_swap();
                return;
            }
        };
        match protocol::read::<DownloadReport>(&posted).map(|(report, _)| report) {
            Ok(DownloadReport::Progress { progress }) => {
                STATE.with_borrow_mut(|state| {
                    if let Some(install) = &mut state.install {
                        install.last = Some(progress.clone());
                    }
                });
                broadcast(&Event::PackProgress(progress)).await;
            }
            Ok(DownloadReport::SwapReady) => {
                STATE.with_borrow_mut(|state| state.swap_pending = true);
                // The job that is running finishes on the installed pack.
                while STATE.with_borrow(|state| state.running.is_some()) {
                    crate::js::sleep_ms(100).await;
                }
                let worker = STATE.with_borrow(|state| state.install.as_ref().map(|i| i.worker.clone()));
                if let Some(worker) = worker {
                    let _ = protocol::post(&worker, &DownloadCommand::Swap, None);
                }
            }
            Ok(DownloadReport::Installed { pack }) => {
                // Embeddings of the previous pack would never be used again.
                if let Err(e) = crate::opfs::embeddings::clear().await {
                    warn(&format!("imagine: the embedding cache could not be cleared: {e}"));
                }
                break Event::PackInstalled { bytes: pack.bytes, commit: pack.commit };
            }
            Ok(DownloadReport::Error(error)) => break pack_failed(OffscreenError::Reported(error)),
            Err(error) => break pack_failed(error.into()),
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
            broadcast(&pack_failed(error)).await;
        }
    }
}
