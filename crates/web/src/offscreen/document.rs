//! The offscreen document: runs jobs stage by stage, one dedicated worker per stage, and pack installs.
//!
//! It takes [`OffscreenCommand`]s from the service worker and broadcasts public [`Event`]s. Jobs run one
//! at a time, in order. Every stage a job needs starts loading in its worker at once. A stage's worker
//! stays loaded after the job (resident) for the `keepLoaded` seconds after the last job, so the next
//! image skips loading; then it is terminated, which is what frees its GPU memory and wasm heap. With
//! `keepLoaded` 0 each worker is terminated as soon as its stage ends (or the job is cancelled).

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};
use std::pin::pin;
use std::rc::Rc;

use futures_channel::mpsc;
use futures_util::future::Either;
use futures_util::StreamExt;
use imagine_core::api::{
    DownloadProgress, DownloadState, Event, GenerateResult, InstallRequest, Progress, Residency, Sender,
    Stage, StageTimings, Timings, Trace,
};
use imagine_core::embedding_cache::{self, EncoderForm};
use imagine_core::gpu_memory::{
    gigabytes, is_out_of_memory, Learned, Levers, MemoryFacts, MemoryPlan, Wanted,
};
use imagine_core::message::ErrorText;
use imagine_core::params::SessionOptions;
use imagine_core::params::DEFAULT_KEEP_LOADED_SECONDS;
use imagine_core::prompt::MAX_TOKENS;
use imagine_core::stages::{QuietTimes, EMBED_WIDTH, MIN_TEST_STALL_LIMIT_MS};
use imagine_core::{Backend, EncodedPrompt, GenerateParams, PromptEncoder, PromptError};
use js_sys::{Float32Array, Uint8Array};
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{spawn_local, JsFuture};
use web_sys::{MessageChannel, MessageEvent, Worker, WorkerOptions, WorkerType};

use crate::offscreen::hasher::WORKER_LIMIT_FILE;
use crate::offscreen::jobs::JobBook;
use crate::platform::js::{from_js, now_ms, to_js, JsError, LogError};
use crate::platform::messaging::broadcast;
use crate::platform::opfs::OpfsError;
use crate::platform::protocol::{
    self, DownloadCommand, DownloadReport, HashSetup, OffscreenCommand, OffscreenReply, ProtocolError,
    StageOutput, StageReport, StageTask, StageTiming,
};

/// Why a command, a job or an install failed in the offscreen document.
#[derive(Debug, Error)]
pub enum OffscreenError {
    /// A command came from another sender than the service worker (a page); it is refused.
    #[error("offscreen: commands are taken from the service worker only")]
    NotFromServiceWorker,
    /// A message for this document that is not an [`OffscreenCommand`].
    #[error("offscreen: bad command: {0}")]
    BadCommand(ProtocolError),
    /// A worker could not be started or linked.
    #[error(transparent)]
    Js(#[from] JsError),
    /// A message to or from a worker.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// Reading or writing the pack's files or the embedding cache in OPFS.
    #[error(transparent)]
    Opfs(#[from] OpfsError),
    /// What a worker reported (its own typed error, as text: it crossed `postMessage`).
    #[error("{0}")]
    Reported(ErrorText),
    /// A worker threw an error it did not catch (its `error` event).
    #[error("{script} crashed: {message}")]
    Crashed {
        /// The worker's script (`stage-worker.js`, `download-worker.js`, ...).
        script: String,
        /// The error event's message.
        message: String,
    },
    /// The stage worker's inbox closed without a report: it is gone.
    #[error("the stage worker stopped unexpectedly")]
    StageStopped,
    /// A stage reported nothing for longer than it may ([`QuietTimes::stall_limit_ms`]); its worker was ended.
    #[error("the {} made no progress for {seconds} s and was stopped", stage_name(*.stage))]
    Stalled {
        /// The stage that went quiet.
        stage: Stage,
        /// Its stall limit, in seconds.
        seconds: u64,
    },
    /// A stage worker's `Done` carried another stage's output (a bug); the stage it was asked for.
    #[error("internal: the {0} worker handed on another stage's output")]
    WrongOutput(&'static str),
    /// A stage handed on no buffer where the next one needs it (a bug).
    #[error("internal: a stage handed on nothing")]
    NoOutput,
    /// A file shipped with the extension (the tokenizer) could not be read.
    #[error("reading {path}: {source}")]
    Asset {
        /// Its path in the extension.
        path: &'static str,
        /// `fetch`'s or the body's error.
        source: JsError,
    },
    /// A file shipped with the extension answered with an error status (missing from the build).
    #[error("reading {path}: HTTP {status}")]
    AssetStatus {
        /// Its path in the extension.
        path: &'static str,
        /// The HTTP status.
        status: u16,
    },
    /// The shipped tokenizer files could not be loaded into a [`PromptEncoder`].
    #[error("loading the tokenizer failed: {0}")]
    Tokenizer(PromptError),
    /// The prompt could not be tokenized.
    #[error("encoding the prompt failed: {0}")]
    Prompt(PromptError),
    /// A job the memory plan had no room for failed: it says so, with what would fit.
    #[error(
        "This image needs about {} GB of GPU memory and Imagine may use {} GB on this GPU, so it failed \
         ({cause}). {}",
        gigabytes(*need), gigabytes(*budget), fits_text(*largest_square)
    )]
    NoRoom {
        /// What the leanest plan needs, in bytes.
        need: u64,
        /// The budget, in bytes.
        budget: u64,
        /// The largest square size that fits, if any.
        largest_square: Option<u32>,
        /// How it failed.
        cause: Box<OffscreenError>,
    },
    /// The GPU ran out of memory where the plan said the job would fit, and once more after it was
    /// made again smaller: it says so, with what would fit.
    #[error("{}", out_of_memory_text(*budget, *largest_square, cause))]
    OutOfMemory {
        /// The budget it was last tried within, in bytes, where known.
        budget: Option<u64>,
        /// The largest square size that fits, if any.
        largest_square: Option<u32>,
        /// How it failed.
        cause: Box<OffscreenError>,
    },
}

fn out_of_memory_text(budget: Option<u64>, largest_square: Option<u32>, cause: &OffscreenError) -> String {
    match budget {
        Some(budget) => format!(
            "The GPU ran out of memory making this image, also when made again with less: Imagine may use {} \
             GB on this GPU now ({cause}). {}",
            gigabytes(budget),
            fits_text(largest_square)
        ),
        None => format!(
            "The GPU ran out of memory making this image, also when made again with less ({cause}). Try a \
             smaller size, or close programs that use the GPU."
        ),
    }
}

fn fits_text(largest_square: Option<u32>) -> String {
    match largest_square {
        Some(side) => format!("Sizes up to {side}×{side} fit."),
        None => "No size fits: give Imagine more GPU memory on the options page, or close programs that use \
                 the GPU."
            .into(),
    }
}

/// What reaches the offscreen document about a worker: what it posted, or what happened to it.
enum Incoming {
    Posted(JsValue),
    Crashed(OffscreenError),
    /// Terminated here (a cancel, a pause).
    Stopped,
}

/// A live stage worker: of the running job (so that a cancel can terminate it), or resident.
struct Current {
    /// The job it works for; empty while it is resident.
    job: String,
    /// Which `StageRun` it belongs to.
    id: u64,
    stage: Stage,
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
    /// What it installs (to start it again with fresh workers when one died).
    request: InstallRequest,
    /// How often it was started again so.
    restarts: u32,
}

impl Install {
    fn terminate(&self) {
        self.worker.terminate();
        self.hasher.terminate();
    }
}

/// A job waiting its turn.
struct Queued {
    job: String,
    params: GenerateParams,
    /// The GPU memory it may use (`None`: no known limit).
    gpu_budget: Option<u64>,
}

struct State {
    queue: VecDeque<Queued>,
    running: Option<String>,
    /// The running job is private.
    running_private: bool,
    /// The latest jobs ended, and the images of private jobs (the service worker fails a running job
    /// that its offscreen document does not name: that document closed or crashed with it).
    book: JobBook,
    /// The running job was cancelled.
    cancel_running: bool,
    current: Vec<Current>,
    /// The id of the next `StageRun`.
    next_run: u64,
    /// Idle stage workers whose sessions stay loaded for the next job.
    resident: Vec<StageRun>,
    /// The pack (commit) the resident workers loaded.
    resident_pack: Option<String>,
    /// The stages the pages were last told are loaded ([`announce_residency`]).
    announced_loaded: Vec<Stage>,
    /// How long stages stay loaded after the last job (the service worker's `keepLoaded`).
    keep_loaded_seconds: u32,
    /// `keepLoaded` was 0 at some moment of the running job: its stages end with it even if the
    /// setting rose again before they did (0 means "unload now", not "at the end if still 0").
    release_running: bool,
    /// Counts idle periods: a job starting or the setting changing voids the unload timer of the last.
    idle_epoch: u64,
    /// The longest each stage went without reporting anything in jobs that finished (what its stall
    /// limit scales with), read from OPFS when first needed.
    quiet_times: Option<QuietTimes>,
    install: Option<Install>,
    /// A verified pack waits to replace the installed one: no new job starts until it has (or the
    /// install stopped).
    swap_pending: bool,
    /// The download worker that stores, with the installed pack, the forms of graphs a stage
    /// re-blocked while loading ([`store_block32`]), while it runs. A pack swap or a deletion ends it.
    store: Option<(Worker, mpsc::UnboundedSender<Incoming>)>,
    /// Stores that failed in a row, and when the last one did: the next waits ([`store_backoff_ms`]).
    store_failures: u32,
    store_failed_at_ms: f64,
    /// The pack (commit) being deleted: no store starts for it.
    no_store_for: Option<String>,
    /// The stored forms (`<commit>:<file>`) whose checksums a stage checked in this document's life.
    checked_forms: HashSet<String>,
}

impl Default for State {
    fn default() -> Self {
        State {
            queue: VecDeque::new(),
            running: None,
            cancel_running: false,
            current: Vec::new(),
            next_run: 0,
            resident: Vec::new(),
            resident_pack: None,
            announced_loaded: Vec::new(),
            keep_loaded_seconds: DEFAULT_KEEP_LOADED_SECONDS,
            release_running: false,
            idle_epoch: 0,
            install: None,
            running_private: false,
            book: JobBook::default(),
            quiet_times: None,
            swap_pending: false,
            store: None,
            store_failures: 0,
            store_failed_at_ms: 0.0,
            no_store_for: None,
            checked_forms: HashSet::new(),
        }
    }
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
            Ok(Some(reply)) => reply,
            Ok(None) => STATE.with_borrow(|state| OffscreenReply::Done {
                installing: state.install.is_some(),
                loaded: loaded_stages(state),
                jobs: known_jobs(state),
            }),
            Err(error) => OffscreenReply::Refused(ErrorText::of(&error)),
        };
        Ok(to_js(&reply))
    })
}

/// The jobs this document names: the latest it ended, the running one and the queued ones, oldest
/// first. None it has not ended is ever left out.
fn known_jobs(state: &State) -> Vec<String> {
    let running = state.running.iter();
    let queued = state.queue.iter().map(|queued| &queued.job);
    state.book.ended_jobs().chain(running).chain(queued).cloned().collect()
}

/// Carries out a command; its own reply, for the commands that have one (else `Done`).
async fn command(message: JsValue, sender: JsValue) -> Result<Option<OffscreenReply>, OffscreenError> {
    if crate::platform::messaging::sender(&sender) != Sender::ServiceWorker {
        return Err(OffscreenError::NotFromServiceWorker);
    }
    match from_js::<OffscreenCommand>(&message).map_err(OffscreenError::BadCommand)? {
        OffscreenCommand::RunJob { job, params, keep_loaded_seconds, gpu_budget } => {
            let start_now = STATE.with_borrow_mut(|state| {
                state.keep_loaded_seconds = keep_loaded_seconds;
                state.queue.push_back(Queued { job, params, gpu_budget });
                // The first job of an idle queue starts the loop; until the loop has popped it, a job
                // queued right after must not start a second one.
                state.running.is_none() && state.queue.len() == 1
            });
            if start_now {
                spawn_local(run_queue());
            }
        }
        OffscreenCommand::CancelJob { job } => cancel(&job),
        OffscreenCommand::KeepLoaded { seconds: Some(seconds) } => {
            let running = STATE.with_borrow_mut(|state| {
                state.keep_loaded_seconds = seconds;
                state.release_running |= seconds == 0;
                state.running.is_some()
            });
            if !running {
                unload_later();
            } else if seconds == 0 {
                // The stages a running job is done with are idle already: ended now, not at its end.
                unload();
            }
        }
        OffscreenCommand::KeepLoaded { seconds: None } => {}
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
        OffscreenCommand::StopStore { commit } => {
            // The stages kept loaded from the pack being deleted would only hold GPU memory.
            let resident_of_it = STATE.with_borrow_mut(|state| {
                let of_it = state.resident_pack.as_ref() == Some(&commit);
                state.no_store_for = Some(commit);
                of_it
            });
            if resident_of_it {
                unload();
            }
            stop_store();
        }
        OffscreenCommand::InstallStatus => {}
        OffscreenCommand::PrivateImage { id } => {
            let png = STATE.with_borrow(|state| state.book.private_image(&id).cloned());
            return Ok(Some(OffscreenReply::PrivateImage { png }));
        }
        OffscreenCommand::ForgetPrivate => forget_private(),
    }
    Ok(None)
}

/// The last private window closed: the private jobs queued or running are cancelled, and every
/// private image held is forgotten.
fn forget_private() {
    let jobs: Vec<String> = STATE.with_borrow_mut(|state| {
        state.book.forget_private();
        let running = state.running.clone().filter(|_| state.running_private);
        let queued =
            state.queue.iter().filter(|queued| queued.params.private).map(|queued| queued.job.clone());
        running.into_iter().chain(queued).collect()
    });
    for job in jobs {
        cancel(&job);
    }
}

async fn run_queue() {
    loop {
        let next = STATE.with_borrow_mut(|state| {
            let next = if state.swap_pending { None } else { state.queue.pop_front() };
            state.running = next.as_ref().map(|queued| queued.job.clone());
            state.running_private = next.as_ref().is_some_and(|queued| queued.params.private);
            state.cancel_running = false;
            next
        });
        let Some(Queued { job, params, gpu_budget }) = next else {
            unload_later();
            return;
        };
        // A finished job has broadcast its results already.
        let event = match run_job(&job, &params, gpu_budget).await {
            Ok(()) => None,
            Err(StageFailure::Cancelled) => Some(Event::Cancelled { job: job.clone() }),
            Err(StageFailure::Error(error)) => Some(Event::failed(job.clone(), &error)),
        };
        if let Some(event) = event {
            broadcast(&event).await;
        }
        STATE.with_borrow_mut(|state| {
            state.running = None;
            state.book.ended(&job);
        });
    }
}

fn cancel(job: &str) {
    let queued = STATE.with_borrow_mut(|state| {
        let before = state.queue.len();
        state.queue.retain(|queued| queued.job != job);
        if state.running.as_deref() == Some(job) {
            // Between two stages there is no worker to stop: the next stage sees this and does not start.
            state.cancel_running = true;
        }
        for current in state.current.extract_if(.., |current| !current.job.is_empty() && current.job == job) {
            current.worker.terminate();
            let _ = current.inbox.unbounded_send(Incoming::Stopped);
        }
        state.queue.len() != before
    });
    if queued {
        let job = job.to_owned();
        spawn_local(async move {
            broadcast(&Event::Cancelled { job: job.clone() }).await;
            STATE.with_borrow_mut(|state| state.book.ended(&job));
        });
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
/// broadcast for each image as soon as it is decoded. Every stage the job needs starts loading at once,
/// in its own worker, or is resident already. A job that fails so before its first image (a GPU without
/// room for every stage, say) is made again with nothing resident and one stage loaded at a time:
/// loading ahead and residency never cost an image.
async fn run_job(job: &str, params: &GenerateParams, gpu_budget: Option<u64>) -> Result<(), StageFailure> {
    let pack = crate::platform::opfs::installed_pack().await.map(|(record, _)| record.commit);
    let (keep, other_pack) = STATE.with_borrow_mut(|state| {
        state.idle_epoch += 1;
        state.release_running = false;
        let other_pack = state.resident_pack != pack;
        state.resident_pack = pack.clone();
        (state.keep_loaded_seconds > 0, other_pack)
    });
    let (memory, facts, gpu_budget) =
        memory_plan(params, pack.as_deref(), gpu_budget, keep && !params.profile).await;
    // A profile is of stages loaded afresh, which are not kept; stages kept loaded hold memory a plan
    // without residency has no room for.
    if other_pack || params.profile || !memory.keep {
        unload();
    }
    let params = &GenerateParams {
        keep_buffers: memory.levers.keep_buffers,
        attention_chunks: memory.levers.attention_chunks,
        decoder_piece_bytes: params.decoder_piece_bytes.or(memory.levers.decoder_piece_bytes),
        ..params.clone()
    };
    let plan = Plan { memory, budget: gpu_budget };
    let had_resident = STATE.with_borrow(|state| !state.resident.is_empty());
    let mut sent = 0;
    let mut tried = plan;
    let outcome = match run_stages(job, params, pack.as_deref(), plan, &mut sent).await {
        // A stage that hung is ended and tried once more with a fresh worker, whatever the plan.
        Err(StageFailure::Error(error))
            if sent == 0
                && (plan.memory.ahead
                    || plan.memory.keep
                    || plan.memory.levers.keep_buffers
                    || had_resident
                    || matches!(error, OffscreenError::Stalled { .. })) =>
        {
            warn(&format!("imagine: {error}; making the image again with one stage loaded at a time"));
            unload();
            let lean = plan.lean();
            tried = lean;
            let params = &GenerateParams { keep_buffers: lean.memory.levers.keep_buffers, ..params.clone() };
            let outcome = run_stages(job, params, pack.as_deref(), lean, &mut sent).await;
            // Lean worked where the fuller plan failed: later jobs stay below that plan.
            if let (Ok(()), Some(pack), true) = (&outcome, &pack, lean != plan) {
                learn(pack, plan.memory.peak).await;
            }
            outcome
        }
        outcome => outcome,
    };
    let outcome = match outcome {
        // The GPU ran out where the plan said it would fit (other programs took memory meanwhile, or a
        // stage held more than its count): made once more within what is free now, smaller.
        Err(StageFailure::Error(error)) if sent == 0 && is_out_of_memory(&error.to_string()) => {
            unload();
            if let Some(pack) = &pack {
                learn(pack, tried.memory.peak).await;
            }
            let budget = free_now(tried.budget).await;
            match facts.after_out_of_memory(budget, params.width, params.height, &tried.memory) {
                Some(memory) => {
                    warn(&format!("imagine: {error}; making the image again within {budget:?} bytes"));
                    tried = Plan { memory, budget };
                    let params = &GenerateParams {
                        keep_buffers: false,
                        attention_chunks: memory.levers.attention_chunks,
                        decoder_piece_bytes: memory.levers.decoder_piece_bytes,
                        ..params.clone()
                    };
                    run_stages(job, params, pack.as_deref(), tried, &mut sent).await
                }
                None => Err(StageFailure::Error(error)),
            }
        }
        outcome => outcome,
    };
    match outcome {
        // A failure for room says so: the likely cause, and what would fit.
        Err(StageFailure::Error(cause))
            if sent == 0 && (!tried.memory.fits || is_out_of_memory(&cause.to_string())) =>
        {
            let need = tried.memory.peak;
            let largest_square = tried.budget.and_then(|budget| facts.largest_square(budget));
            Err(StageFailure::Error(match tried.budget {
                Some(budget) if need > budget => {
                    OffscreenError::NoRoom { need, budget, largest_square, cause: Box::new(cause) }
                }
                budget => OffscreenError::OutOfMemory { budget, largest_square, cause: Box::new(cause) },
            }))
        }
        outcome => outcome,
    }
}

/// The budget after the GPU ran out of memory: `budget`, lowered to what a probe finds free now (every
/// stage unloaded) where the browser tells.
async fn free_now(budget: Option<u64>) -> Option<u64> {
    let found = match crate::platform::gpu::device_report().await {
        Ok(report) => crate::platform::gpu::probe_memory(&report, None).await.ok().and_then(|p| p.budget()),
        Err(_) => None,
    };
    match (budget, found) {
        (Some(budget), Some(found)) => Some(budget.min(found)),
        (budget, found) => budget.or(found),
    }
}

/// Keeps that a plan needing `failed_peak` bytes failed on this GPU with the pack `pack`.
async fn learn(pack: &str, failed_peak: u64) {
    let Ok(report) = crate::platform::gpu::device_report().await else { return };
    let learned = Learned { adapter: report.adapter_id(), pack: pack.to_owned(), failed_peak };
    crate::platform::opfs::learned::set(&learned).await.log_error("keeping what the failed plan taught");
}

/// The memory plan of `params` within `gpu_budget` (lowered below a plan that failed here before), what
/// it was made from, and the budget it was made for.
async fn memory_plan(
    params: &GenerateParams,
    pack: Option<&str>,
    gpu_budget: Option<u64>,
    keep: bool,
) -> (MemoryPlan, MemoryFacts, Option<u64>) {
    let gpu_budget = match (crate::platform::opfs::learned::get().await, pack) {
        (Some(learned), Some(pack)) => match crate::platform::gpu::device_report().await {
            Ok(report) => learned.cap(gpu_budget, &report.adapter_id(), pack),
            Err(_) => gpu_budget,
        },
        _ => gpu_budget,
    };
    let facts = crate::platform::gpu::memory_facts().await;
    let wanted = Wanted { ahead: params.load_ahead, keep, keep_buffers: params.keep_buffers };
    let budget = if params.backend == Backend::WebGpu { gpu_budget } else { None };
    (facts.plan(budget, params.width, params.height, wanted), facts, budget)
}

/// How a job loads its stages: its memory plan (`ahead`: every stage starts loading when the job
/// starts, else each when the one before it is done; `keep`: stages stay loaded after the job), and the
/// budget it was made for (both reported with each image's timings).
#[derive(Clone, Copy, PartialEq)]
struct Plan {
    memory: MemoryPlan,
    budget: Option<u64>,
}

impl Plan {
    /// One stage loaded at a time, nothing kept, no buffers kept: the least memory.
    fn lean(self) -> Plan {
        let levers = Levers { keep_buffers: false, ..self.memory.levers };
        Plan { memory: MemoryPlan { ahead: false, keep: false, levers, ..self.memory }, ..self }
    }
}

/// [`run_job`]'s work on the pack `pack`; `sent` counts the images broadcast.
async fn run_stages(
    job: &str,
    params: &GenerateParams,
    pack: Option<&str>,
    plan: Plan,
    sent: &mut u32,
) -> Result<(), StageFailure> {
    let started = now_ms();
    let images = params.count;

    progress(job, Stage::TextEncoder, 0, images, 1, 1).await;
    let prompt = tokenize(&params.prompt).await?;
    let transformer_task =
        StageTask::Transformer { params: params.clone(), keep: plan.memory.keep, checked: checked_forms() };
    let decoder_task =
        StageTask::Decoder { params: params.clone(), keep: plan.memory.keep, checked: checked_forms() };
    let early = |task: &StageTask| -> Result<Option<StageRun>, StageFailure> {
        Ok(if plan.memory.ahead { Some(StageRun::start(job, task, None)?) } else { None })
    };
    let transformer = early(&transformer_task)?;
    let decoder = early(&decoder_task)?;
    let (embeddings, encoder_timing) =
        prompt_embeddings(job, params, &prompt, pack, plan.memory.keep).await?;

    // The trace's prompt embeddings: the real tokens' rows of what the transformer is given.
    let prompt_embeds = if params.trace {
        let real = prompt.attention_mask.iter().filter(|&&m| m != 0).count() as u32;
        let values = Float32Array::new(&embeddings).subarray(0, real * EMBED_WIDTH as u32).to_vec();
        crate::offscreen::stage_worker::base64_f32(&values)
    } else {
        String::new()
    };
    progress(job, Stage::Transformer, 0, images, 0, params.steps).await;
    let mut transformer = StageRun::given(transformer, job, &transformer_task, embeddings)?;
    let (StageOutput::Transformer(denoised), latents) = transformer.done(images).await? else {
        return Err(unexpected("transformer"));
    };
    transformer.end(plan.memory.keep);
    note_checked(&encoder_timing);
    note_checked(&denoised.timing);

    progress(job, Stage::Decoder, 0, images, 1, 1).await;
    let latents = latents.ok_or(OffscreenError::NoOutput)?;
    let mut decoder = StageRun::given(decoder, job, &decoder_task, latents)?;
    // Graphs a stage re-blocked while loading: stored with the pack once this job is done.
    let mut reblocked_at_load: Vec<String> = [&encoder_timing, &denoised.timing]
        .into_iter()
        .filter(|t| t.reblocked_at_load)
        .map(|t| t.graph_file.clone())
        .collect();
    loop {
        match decoder.next(images).await? {
            Reported::Image { index, timing, png } => {
                *sent += 1;
                if index == 0 && timing.reblocked_at_load {
                    reblocked_at_load.push(timing.graph_file.clone());
                }
                if index == 0 {
                    note_checked(&timing);
                }
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
                        graph_file: t.graph_file,
                        fused_attention: t.fused_attention,
                        chunked_attention: t.chunked_attention,
                        pieces: t.pieces,
                        stored_form_check_ms: t.stored_form_check_ms,
                        worker_created_at_ms: t.worker_created_at_ms,
                        task_at_ms: t.task_at_ms,
                        started_at_ms: t.started_at_ms,
                        finished_at_ms: t.finished_at_ms,
                        session_create_ms: t.session_create_ms,
                        resident: t.resident,
                        run_ms: t.run_ms,
                        runs_ms: t.runs_ms,
                        profile: t.profile,
                    })
                    .collect(),
                    memory: Some(plan.memory),
                    budget: plan.budget,
                };
                let trace = params.trace.then(|| Trace {
                    input_ids: prompt.input_ids.clone(),
                    attention_mask: prompt.attention_mask.clone(),
                    sigmas: denoised.sigmas.clone(),
                    noise: denoised.noise.get(index as usize).cloned().unwrap_or_default(),
                    first_velocity: denoised.first_velocity.get(index as usize).cloned().unwrap_or_default(),
                    img_ids: denoised.img_ids.clone(),
                    txt_ids: denoised.txt_ids.clone(),
                    prompt_embeds: prompt_embeds.clone(),
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
                    private: params.private,
                };
                // A private image is held in this document's memory for the pages that ask later;
                // nothing of it goes to disk.
                // (Not once cancelled: the last private window may have closed meanwhile.)
                if result.private {
                    STATE.with_borrow_mut(|state| {
                        if !state.cancel_running {
                            state.book.keep_private(job, index, &result.png);
                        }
                    });
                }
                broadcast(&Event::Result(result)).await;
                if index + 1 < images {
                    progress(job, Stage::Decoder, index + 1, images, 1, 1).await;
                }
            }
            Reported::Done(StageOutput::Decoder { .. }, _) => {
                decoder.end(plan.memory.keep);
                if let (Some(commit), false) = (pack, reblocked_at_load.is_empty()) {
                    store_block32(commit, reblocked_at_load);
                }
                return Ok(());
            }
            Reported::Done(..) => return Err(unexpected("decoder")),
        }
    }
}

/// The stages loaded (or loading) now, in pipeline order.
fn loaded_stages(state: &State) -> Vec<Stage> {
    [Stage::TextEncoder, Stage::Transformer, Stage::Decoder]
        .into_iter()
        .filter(|stage| state.current.iter().any(|current| current.stage == *stage))
        .collect()
}

/// Tells every page which stages are loaded now, if that changed since it was last told. Called as
/// workers start and end; the check runs once the current task is done, so a burst is told once.
fn announce_residency() {
    spawn_local(async {
        let residency = STATE.with_borrow_mut(|state| {
            let loaded = loaded_stages(state);
            (state.announced_loaded != loaded).then(|| {
                state.announced_loaded = loaded.clone();
                Residency { seconds: state.keep_loaded_seconds, loaded }
            })
        });
        if let Some(residency) = residency {
            broadcast(&Event::Residency(residency)).await;
        }
    });
}

/// Starts the idle period: the resident stages are unloaded once it has lasted `keepLoaded` seconds
/// (at once for 0), unless a job starts first.
fn unload_later() {
    let (epoch, seconds) = STATE.with_borrow_mut(|state| {
        state.idle_epoch += 1;
        (state.idle_epoch, state.keep_loaded_seconds)
    });
    let expired = move || {
        if STATE.with_borrow(|state| state.idle_epoch == epoch && state.running.is_none()) {
            unload();
        }
    };
    if seconds == 0 {
        expired();
    } else {
        spawn_local(async move {
            crate::platform::js::sleep_ms(u64::from(seconds) * 1000).await;
            expired();
        });
    }
}

/// Terminates the resident workers, which frees their sessions' memory.
fn unload() {
    let resident = STATE.with_borrow_mut(|state| std::mem::take(&mut state.resident));
    // Dropped outside the borrow: dropping a `StageRun` updates the state.
    drop(resident);
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
    commit: Option<&str>,
    keep: bool,
) -> Result<(JsValue, StageTiming), StageFailure> {
    // Embeddings of a graph edited for a benchmark (`accuracyLevel`) are not the pack's, and a profile
    // is of every stage.
    let commit = commit.filter(|_| params.accuracy_level.is_none() && !params.profile);
    let key = match commit {
        Some(commit) => {
            Some(embedding_cache::key(commit, params.backend, encoder_form(params.backend).await, prompt))
        }
        None => None,
    };
    let values = MAX_TOKENS * EMBED_WIDTH;
    if let (Some(commit), Some(key)) = (commit, &key) {
        // A private job uses a cached prompt without marking it as used: nothing of it goes to disk.
        match crate::platform::opfs::embeddings::read_entry(commit, key, values, !params.private).await {
            Ok(Some(embeddings)) => {
                let buffer = Float32Array::from(embeddings.as_slice()).buffer().into();
                return Ok((buffer, StageTiming::default()));
            }
            Ok(None) => {}
            Err(e) => warn(&format!("imagine: the embedding cache could not be read: {e}")),
        }
    }
    let task = StageTask::TextEncoder {
        params: params.clone(),
        prompt: prompt.clone(),
        keep,
        checked: checked_forms(),
    };
    let mut encoder = StageRun::start(job, &task, None)?;
    let (StageOutput::TextEncoder(encoded), embeddings) = encoder.done(params.count).await? else {
        return Err(unexpected("text encoder"));
    };
    encoder.end(keep);
    let embeddings = embeddings.ok_or(OffscreenError::NoOutput)?;
    // A private job leaves nothing on disk, its prompt's embeddings included.
    if let (Some(commit), Some(key), false) = (commit, &key, params.private) {
        // Copied before the buffer is transferred to the transformer.
        let copy = Float32Array::new(&embeddings).to_vec();
        let (count, truncated) = (prompt.token_count as u32, prompt.truncated);
        if let Err(e) =
            crate::platform::opfs::embeddings::write_entry(commit, key, &copy, count, truncated).await
        {
            warn(&format!("imagine: the prompt embeddings could not be cached: {e}"));
        }
    }
    Ok((embeddings, encoded.timing))
}

/// The form of the text encoder the stage worker runs (as `stage_worker::choose_graph` picks it): the
/// install's float32 conversion on WebGPU without `shader-f16`, when the pack has one.
async fn encoder_form(backend: Backend) -> EncoderForm {
    if backend != Backend::WebGpu {
        return EncoderForm::Pack;
    }
    let converted =
        crate::platform::opfs::installed_pack().await.is_some_and(|(record, _)| record.conversion.is_some());
    if !converted {
        return EncoderForm::Pack;
    }
    match crate::platform::gpu::adapter_info().await {
        Ok(adapter) if !adapter.has_f16 => EncoderForm::Float32Conversion,
        _ => EncoderForm::Pack,
    }
}

fn warn(text: &str) {
    web_sys::console::warn_1(&text.into());
}

fn unexpected(stage: &'static str) -> StageFailure {
    StageFailure::Error(OffscreenError::WrongOutput(stage))
}

/// What a stage worker reported that its caller acts on (progress is relayed on the way).
enum Reported {
    /// The decoder finished image `index`: its PNG.
    Image { index: u32, timing: StageTiming, png: JsValue },
    /// The stage is done: its output, and the buffer it hands on if any.
    Done(StageOutput, Option<JsValue>),
}

/// The worker of one stage: of a job, or resident (in `State::resident`); dropping it terminates the
/// worker.
struct StageRun {
    id: u64,
    stage: Stage,
    backend: Backend,
    worker: Worker,
    inbox: mpsc::UnboundedReceiver<Incoming>,
    job: String,
    /// The longest this worker went without reporting anything while a job waited on it.
    quiet_ms: f64,
    /// The pixels of the image its task works on.
    pixels: u64,
    /// What its session was made with: a task asking for others gets a fresh worker, as ORT's
    /// `release()` does not give all of a session's GPU memory back.
    options: Option<SessionOptions>,
}

impl StageRun {
    /// Hands `task` and `data` (transferred) to the resident worker of its stage, or to a new one;
    /// without `data` the worker loads its session (if it has none) and waits for its input
    /// ([`StageRun::given`]).
    fn start(job: &str, task: &StageTask, data: Option<&JsValue>) -> Result<StageRun, StageFailure> {
        if STATE.with_borrow(|state| state.cancel_running) {
            return Err(StageFailure::Cancelled);
        }
        let (stage, backend) = task.stage().ok_or(OffscreenError::NoOutput)?;
        let options = task.session_options();
        let run = match StageRun::resident(stage, backend, options) {
            Some(mut run) => {
                run.job = job.to_owned();
                run.pixels = task.pixels();
                STATE.with_borrow_mut(|state| {
                    if let Some(current) = state.current.iter_mut().find(|current| current.id == run.id) {
                        current.job = job.to_owned();
                    }
                });
                run
            }
            None => {
                let (worker, inbox, sender) = spawn_worker("stage-worker.js")?;
                let id = STATE.with_borrow_mut(|state| {
                    let id = state.next_run;
                    state.next_run += 1;
                    let current =
                        Current { job: job.to_owned(), id, stage, worker: worker.clone(), inbox: sender };
                    state.current.push(current);
                    id
                });
                announce_residency();
                let (job, pixels) = (job.to_owned(), task.pixels());
                StageRun { id, stage, backend, worker, inbox, job, quiet_ms: 0.0, pixels, options }
            }
        };
        protocol::post(&run.worker, task, data)?;
        Ok(run)
    }

    /// The resident worker of `stage` on `backend`, taken out of the residents, if its session was
    /// made with `options`. One made with other options, or that reported anything while idle (it
    /// crashed, say), is ended instead.
    fn resident(stage: Stage, backend: Backend, options: Option<SessionOptions>) -> Option<StageRun> {
        let mut run = STATE.with_borrow_mut(|state| {
            let index = state.resident.iter().position(|run| run.stage == stage && run.backend == backend)?;
            Some(state.resident.swap_remove(index))
        })?;
        match run.inbox.try_next() {
            Err(_) if run.options == options => Some(run),
            _ => None,
        }
    }

    /// The job is done with this stage: the worker stays resident if the job keeps its stages and the
    /// setting still does, and is terminated otherwise.
    fn end(self, keep: bool) {
        if !(keep && STATE.with_borrow(|state| state.keep_loaded_seconds > 0 && !state.release_running)) {
            return;
        }
        STATE.with_borrow_mut(|state| {
            if let Some(current) = state.current.iter_mut().find(|current| current.id == self.id) {
                current.job.clear();
            }
            state.resident.push(self);
        })
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

    /// Relays the worker's progress until it reports an image or the end; a worker quiet for longer
    /// than its stage may be ([`QuietTimes::stall_limit_ms`]) is a failure.
    async fn next(&mut self, images: u32) -> Result<Reported, StageFailure> {
        let limit_ms = self.stall_limit_ms().await;
        loop {
            let waiting_since = now_ms();
            let quiet = crate::platform::js::sleep_ms(limit_ms as u64);
            let incoming = match futures_util::future::select(self.inbox.next(), pin!(quiet)).await {
                Either::Left((Some(incoming), _)) => incoming,
                Either::Left((None, _)) => return Err(OffscreenError::StageStopped.into()),
                Either::Right(_) => {
                    let seconds = (limit_ms / 1000.0).round() as u64;
                    return Err(OffscreenError::Stalled { stage: self.stage, seconds }.into());
                }
            };
            self.quiet_ms = self.quiet_ms.max(now_ms() - waiting_since);
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
                (StageReport::Done { output }, data) => {
                    let mut times = quiet_times().await;
                    if times.note(self.stage, self.backend, self.pixels, self.quiet_ms) {
                        crate::platform::opfs::quiet::set(&times)
                            .await
                            .log_error("keeping the stages' quiet times");
                        STATE.with_borrow_mut(|state| state.quiet_times = Some(times));
                    }
                    return Ok(Reported::Done(output, data));
                }
                (StageReport::Error(error), _) => return Err(OffscreenError::Reported(error).into()),
            }
        }
    }

    /// How long this stage may go quiet now: scaled to the work and to the longest it went quiet
    /// before, unless a test set it (the OPFS file `stall-limit-ms`; less than
    /// [`MIN_TEST_STALL_LIMIT_MS`], 0 included, is refused).
    async fn stall_limit_ms(&self) -> f64 {
        let set = crate::platform::opfs::test_setting_u64(STALL_LIMIT_FILE).await;
        if let Some(ms) = set.filter(|&ms| ms >= MIN_TEST_STALL_LIMIT_MS) {
            return ms as f64;
        }
        quiet_times().await.stall_limit_ms(self.stage, self.backend, self.pixels)
    }
}

/// The stages' quiet times: as kept in this document, else as kept in OPFS.
async fn quiet_times() -> QuietTimes {
    if let Some(times) = STATE.with_borrow(|state| state.quiet_times.clone()) {
        return times;
    }
    let times = crate::platform::opfs::quiet::get().await;
    STATE.with_borrow_mut(|state| state.quiet_times.get_or_insert(times).clone())
}

/// The OPFS file with which a test shortens every stage's stall limit, in milliseconds.
const STALL_LIMIT_FILE: &str = "stall-limit-ms";

/// The stage as messages name it (the `_locales` keys `stage*` say the same).
pub fn stage_name(stage: Stage) -> &'static str {
    match stage {
        Stage::TextEncoder => "text encoder",
        Stage::Transformer => "transformer",
        Stage::Decoder => "decoder",
    }
}

impl Drop for StageRun {
    fn drop(&mut self) {
        self.worker.terminate();
        STATE.with_borrow_mut(|state| state.current.retain(|current| current.id != self.id));
        announce_residency();
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
    let (inbox, sender) = watch_worker(&worker, script);
    Ok((worker, inbox, sender))
}

/// The inbox of `worker` (started from `script`): its messages and its crash.
fn watch_worker(
    worker: &Worker,
    script: &str,
) -> (mpsc::UnboundedReceiver<Incoming>, mpsc::UnboundedSender<Incoming>) {
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
    (inbox, sender)
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
    // The installed pack is about to be replaced: a store of its forms is of no use any more.
    stop_store();
    let (worker, hasher, inbox, sender) = spawn_install_workers(&request)?;
    let install =
        Install { worker, hasher, inbox: sender, last: None, ended: false, next: None, request, restarts: 0 };
    STATE.with_borrow_mut(|state| state.install = Some(install));
    spawn_local(relay_install(inbox));
    Ok(())
}

/// A download worker and its hash worker, linked, with `request` posted.
fn spawn_install_workers(
    request: &InstallRequest,
) -> Result<
    (Worker, Worker, mpsc::UnboundedReceiver<Incoming>, mpsc::UnboundedSender<Incoming>),
    OffscreenError,
> {
    let (worker, inbox, sender) = spawn_worker("download-worker.js")?;
    let hasher = new_worker("hash-worker.js")?;
    let channel = MessageChannel::new().map_err(JsError::from)?;
    let (download_end, hash_end) = (channel.port1(), channel.port2());
    protocol::post(&hasher, &HashSetup::Port, Some(&hash_end))?;
    protocol::post(&worker, &DownloadCommand::Install { request: request.clone() }, Some(&download_end))?;
    Ok((worker, hasher, inbox, sender))
}

/// How often an install is started again with fresh workers because one died ([`restart_install`]).
const MAX_INSTALL_RESTARTS: u32 = 3;

/// Starts the running install again with fresh workers (a worker it needs died); it goes on from its
/// checkpoint. `false` when it was started again too often already.
fn restart_install() -> Result<bool, OffscreenError> {
    let request = STATE.with_borrow(|state| {
        state.install.as_ref().filter(|i| i.restarts < MAX_INSTALL_RESTARTS).map(|i| i.request.clone())
    });
    let Some(request) = request else { return Ok(false) };
    let (worker, hasher, inbox, sender) = spawn_install_workers(&request)?;
    let replaced = STATE.with_borrow_mut(|state| {
        let install = state.install.as_mut()?;
        install.terminate();
        install.worker = worker.clone();
        install.hasher = hasher.clone();
        install.inbox = sender;
        install.restarts += 1;
        Some(())
    });
    if replaced.is_none() {
        worker.terminate();
        hasher.terminate();
        return Ok(false);
    }
    spawn_local(relay_install(inbox));
    Ok(true)
}

/// The stored forms whose checksums were checked in this document's life, for the next stage tasks.
fn checked_forms() -> Vec<String> {
    STATE.with_borrow(|state| state.checked_forms.iter().cloned().collect())
}

/// Keeps the stored form a stage checked the checksums of (`StageTiming::checked_form`).
fn note_checked(timing: &StageTiming) {
    if let Some(form) = &timing.checked_form {
        STATE.with_borrow_mut(|state| state.checked_forms.insert(form.clone()));
    }
}

/// Has a download worker of its own store the re-blocked forms of `graphs`, which a stage of the job
/// just done re-blocked while loading, with the installed pack `commit` (`download::store_block32`), so
/// that the next loads read them: once, in the background, unless one is already at it, a download
/// runs (whose new pack gets its own at install), the pack is being deleted, or the last store failed
/// too recently ([`store_backoff_ms`]: a disk without room is not written to after every job). A
/// failure costs nothing but the speed-up: logged. The store is given [`STORE_LIMIT_MS`]; a worker
/// that has not reported by then is ended, and what it half-wrote removed.
fn store_block32(commit: &str, graphs: Vec<String>) {
    let start = STATE.with_borrow(|state| {
        state.store.is_none() && state.install.is_none() && state.no_store_for.as_deref() != Some(commit)
    });
    if !start {
        return;
    }
    let commit = commit.to_owned();
    spawn_local(async move {
        let (failures, failed_at) =
            STATE.with_borrow(|state| (state.store_failures, state.store_failed_at_ms));
        if failures > 0 && now_ms() - failed_at < store_backoff_ms(failures).await as f64 {
            return;
        }
        let limit_ms =
            crate::platform::opfs::test_setting_u64(WORKER_LIMIT_FILE).await.unwrap_or(STORE_LIMIT_MS);
        let worker = match new_worker("download-worker.js") {
            Ok(worker) => worker,
            Err(e) => return warn(&format!("imagine: the graphs re-blocked to 32 could not be stored: {e}")),
        };
        let (inbox, sender) = watch_worker(&worker, "download-worker.js");
        // Checked again now that nothing is awaited before the store is registered.
        let start = STATE.with_borrow_mut(|state| {
            let start = state.store.is_none()
                && state.install.is_none()
                && state.no_store_for.as_deref() != Some(commit.as_str());
            if start {
                state.store = Some((worker.clone(), sender.clone()));
            }
            start
        });
        if !start {
            worker.terminate();
            return;
        }
        let command = DownloadCommand::StoreBlock32 { commit: commit.clone(), graphs: graphs.clone() };
        let outcome = run_store_block32(&worker, inbox, &sender, &command, limit_ms).await;
        // Ended by a swap or a deletion meanwhile ([`stop_store`]): not a failure of the store.
        let ours = STATE.with_borrow_mut(|state| {
            let ours = state.store.as_ref().is_some_and(|(w, _)| w == &worker);
            if ours {
                state.store = None;
            }
            ours
        });
        worker.terminate();
        if !ours {
            return;
        }
        STATE.with_borrow_mut(|state| match &outcome {
            Ok(()) => state.store_failures = 0,
            Err(_) => {
                state.store_failures += 1;
                state.store_failed_at_ms = now_ms();
            }
        });
        if let Err(e) = outcome {
            warn(&format!("imagine: storing the graphs re-blocked to 32 with the pack failed: {e}"));
            if e.ended {
                remove_unrecorded_forms(&commit, &graphs).await;
            }
        }
    });
}

/// How long a store of the re-blocked forms may run before its worker is ended (the published pack's
/// take seconds).
const STORE_LIMIT_MS: u64 = 10 * 60 * 1000;

/// The OPFS file in which a test sets the wait after a failed store, in milliseconds.
const STORE_RETRY_FILE: &str = "block32-retry-ms";

/// How long after the `failures`-th failed store in a row the next may start: 10 minutes, doubling
/// up to 8 hours (a disk that stays full is tried a few times a day, and in each new browser session).
async fn store_backoff_ms(failures: u32) -> u64 {
    if let Some(ms) = crate::platform::opfs::test_setting_u64(STORE_RETRY_FILE).await {
        return ms;
    }
    ((10 * 60 * 1000u64) << failures.saturating_sub(1).min(6)).min(8 * 60 * 60 * 1000)
}

/// Why a store of the re-blocked forms failed; `ended`: its worker was ended here, mid-way.
struct StoreFailed {
    text: String,
    ended: bool,
}

impl std::fmt::Display for StoreFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// [`store_block32`]'s worker, from its start to its one report, within `limit_ms`.
async fn run_store_block32(
    worker: &Worker,
    mut inbox: mpsc::UnboundedReceiver<Incoming>,
    sender: &mpsc::UnboundedSender<Incoming>,
    command: &DownloadCommand,
    limit_ms: u64,
) -> Result<(), StoreFailed> {
    let failed = |text: String| StoreFailed { text, ended: false };
    protocol::post(worker, command, None).map_err(|e| failed(e.to_string()))?;
    let report =
        match futures_util::future::select(inbox.next(), pin!(crate::platform::js::sleep_ms(limit_ms))).await
        {
            Either::Left((report, _)) => report,
            Either::Right(_) => {
                worker.terminate();
                let _ = sender.unbounded_send(Incoming::Stopped);
                return Err(StoreFailed {
                    text: format!("it reported nothing for {} s, so it was stopped", limit_ms.div_ceil(1000)),
                    ended: true,
                });
            }
        };
    match report {
        Some(Incoming::Posted(posted)) => match protocol::read::<DownloadReport>(&posted) {
            Ok((DownloadReport::Block32Stored, _)) => Ok(()),
            Ok((DownloadReport::Failed { error, .. }, _)) => Err(failed(error.error)),
            Ok(_) => Err(failed("an unexpected report".to_owned())),
            Err(e) => Err(failed(e.to_string())),
        },
        Some(Incoming::Crashed(e)) => Err(StoreFailed { text: e.to_string(), ended: true }),
        _ => Err(StoreFailed { text: "the worker ended without a report".to_owned(), ended: true }),
    }
}

/// Removes what an ended store left of the forms of `graphs` in the installed pack `commit`: the files
/// its record does not name (the worker's files are let go of as it ends, which `opfs::remove` waits for).
async fn remove_unrecorded_forms(commit: &str, graphs: &[String]) {
    let Some((installed, dir)) =
        crate::platform::opfs::installed_pack().await.filter(|(p, _)| p.commit == commit)
    else {
        return;
    };
    let record = installed.block32.unwrap_or_default();
    for graph in graphs.iter().filter(|g| record.graph(g).is_none()) {
        crate::offscreen::block32::remove_form(&dir, graph).await;
    }
}

/// Ends the store of re-blocked forms, if one runs: for a pack swap (the forms are of the pack being
/// replaced) or a deletion. Its files are let go of as its worker ends; its state write, if it got
/// there, held the state's lock and named the pack it was for, so nothing of it outlives that pack.
fn stop_store() {
    if let Some((worker, inbox)) = STATE.with_borrow_mut(|state| state.store.take()) {
        worker.terminate();
        let _ = inbox.unbounded_send(Incoming::Stopped);
    }
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
    let staging = crate::platform::opfs::pack_state().await?.staging;
    let mut attempt = 0;
    loop {
        match crate::platform::opfs::clear_slot(staging).await {
            Ok(()) => return Ok(()),
            Err(_) if attempt < 20 => {
                attempt += 1;
                crate::platform::js::sleep_ms(100).await;
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

/// The event of an install that failed here (not in its worker, which says whether it was offline).
fn pack_failed(error: OffscreenError) -> Event {
    Event::pack_failed(&error, false)
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
                // The job that is running finishes on the installed pack. A store of that pack's
                // re-blocked forms is ended: they would be of the pack being replaced.
                while STATE.with_borrow(|state| state.running.is_some()) {
                    crate::platform::js::sleep_ms(100).await;
                }
                stop_store();
                let worker = STATE.with_borrow(|state| state.install.as_ref().map(|i| i.worker.clone()));
                if let Some(worker) = worker {
                    protocol::post(&worker, &DownloadCommand::Swap, None)
                        .log_error("asking the download worker to swap");
                }
            }
            Ok(DownloadReport::Installed { pack }) => {
                // A pack deleted before may be this one again: its forms may be stored.
                STATE.with_borrow_mut(|state| state.no_store_for = None);
                // Embeddings of the previous pack would never be used again.
                if let Err(e) = crate::platform::opfs::embeddings::clear().await {
                    warn(&format!("imagine: the embedding cache could not be cleared: {e}"));
                }
                break Event::PackInstalled { bytes: pack.bytes, commit: pack.commit };
            }
            Ok(DownloadReport::Failed { error, offline, restart }) => {
                if restart {
                    warn(&format!("imagine: {}; the download goes on with fresh workers", error.error));
                    match restart_install() {
                        Ok(true) => return,
                        Ok(false) => {}
                        Err(e) => warn(&format!("imagine: the download could not be started again: {e}")),
                    }
                }
                break Event::pack_failed(&OffscreenError::Reported(error), offline);
            }
            Ok(DownloadReport::Block32Stored) => {}
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
