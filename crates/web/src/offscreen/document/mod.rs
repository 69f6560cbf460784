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
    Stage,
};
use imagine_core::embedding_cache::{self, EncoderForm};
use imagine_core::gpu_memory::{
    gigabytes, is_out_of_memory, Learned, Levers, MemoryFacts, MemoryPlan, Wanted,
};
use imagine_core::message::{arg, cause, number, Arg, ErrorText, Localize, Message};
use imagine_core::params::SessionOptions;
use imagine_core::params::DEFAULT_KEEP_LOADED_SECONDS;
use imagine_core::prompt::MAX_TOKENS;
use imagine_core::stages::{QuietTimes, EMBED_WIDTH, MIN_TEST_STALL_LIMIT_MS};
use imagine_core::{Backend, EncodedPrompt, GenerateParams, PromptEncoder, PromptError};
use js_sys::Float32Array;
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::spawn_local;
use web_sys::{MessageChannel, MessageEvent, Worker, WorkerOptions, WorkerType};

use crate::offscreen::hasher::WORKER_LIMIT_FILE;
use crate::offscreen::jobs::JobBook;
use crate::platform::js::{from_js, now_ms, to_js, JsError, LogError};
use crate::platform::messaging::broadcast;
use crate::platform::opfs::OpfsError;
use crate::platform::prompt_encoder::EncoderLoadError;
use crate::platform::protocol::{
    self, DownloadCommand, DownloadReport, HashSetup, OffscreenCommand, OffscreenReply, ProtocolError,
    StageOutput, StageReport, StageTask, StageTiming, TransformerOutput, KEEP_ALIVE_TARGET,
};

mod embeddings;
mod error;
mod install;
mod made;
mod memory;
mod residency;
mod stage_run;

use embeddings::*;
pub use error::OffscreenError;
use install::*;
use made::Made;
use memory::*;
use residency::*;
use stage_run::*;

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
    /// re-blocked while loading ([`store_reblocked`]), while it runs. A pack swap or a deletion ends it.
    store: Option<(Worker, mpsc::UnboundedSender<Incoming>)>,
    /// Stores that failed in a row, and when the last one did: the next waits ([`store_backoff_ms`]).
    store_failures: u32,
    store_failed_at_ms: f64,
    /// The pack (commit) being deleted: no store starts for it.
    no_store_for: Option<String>,
    /// The stored forms (`<commit>:<file>`) whose checksums a stage checked in this document's life.
    checked_forms: HashSet<String>,
    /// The running try loads one stage at a time: the stage workers it starts hand ORT its wasm as
    /// bytes ([`StageRun::start`]).
    one_at_a_time: bool,
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
            one_at_a_time: false,
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

/// How often a framed offscreen document tells the background it is still working: well within
/// Firefox's 30 s.
const KEEP_ALIVE_MS: u64 = 10_000;

thread_local! {
    static KEEPING_ALIVE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// In Firefox the offscreen document is a frame of the background page, which is unloaded when idle:
/// while a job, a download, a store, stages kept loaded or private images are here, the background is
/// sent a message every [`KEEP_ALIVE_MS`] (an event for it, so it stays). In Chrome the offscreen
/// document lives on its own: nothing is sent.
fn keep_background_alive() {
    let framed = web_sys::window().and_then(|w| w.frame_element().ok().flatten()).is_some();
    if !framed || KEEPING_ALIVE.with(|k| k.replace(true)) {
        return;
    }
    spawn_local(async {
        loop {
            crate::platform::js::sleep_ms(KEEP_ALIVE_MS).await;
            let busy = STATE.with_borrow(|s| {
                s.running.is_some()
                    || !s.queue.is_empty()
                    || s.install.is_some()
                    || s.store.is_some()
                    || !s.resident.is_empty()
                    || s.book.private_count() > 0
            });
            if busy {
                let message = crate::platform::js::Obj::new().set("target", KEEP_ALIVE_TARGET).build();
                let _ = crate::platform::messaging::send(&message).await;
            }
        }
    });
}

/// Carries out a command; its own reply, for the commands that have one (else `Done`).
async fn command(message: JsValue, sender: JsValue) -> Result<Option<OffscreenReply>, OffscreenError> {
    if crate::platform::messaging::sender(&sender) != Sender::ServiceWorker {
        return Err(OffscreenError::NotFromServiceWorker);
    }
    keep_background_alive();
    match from_js::<OffscreenCommand>(&message).map_err(OffscreenError::BadCommand)? {
        OffscreenCommand::RunJob { job, params, keep_loaded_seconds, gpu_budget } => {
            queue_job(Queued { job, params, gpu_budget }, keep_loaded_seconds)
        }
        OffscreenCommand::CancelJob { job } => cancel(&job),
        OffscreenCommand::KeepLoaded { seconds: Some(seconds) } => keep_loaded(seconds),
        OffscreenCommand::KeepLoaded { seconds: None } => {}
        OffscreenCommand::InstallPack { request } => start_install(request)?,
        OffscreenCommand::PausePack => pause_install(),
        OffscreenCommand::CancelPack => {
            stop_install();
            remove_staging().await?;
        }
        OffscreenCommand::StopStore { commit } => stop_store_for_deletion(commit),
        OffscreenCommand::InstallStatus => {}
        OffscreenCommand::PrivateImage { id } => {
            let png = STATE.with_borrow(|state| state.book.private_image(&id).cloned());
            return Ok(Some(OffscreenReply::PrivateImage { png }));
        }
        OffscreenCommand::ForgetPrivate => forget_private(),
    }
    Ok(None)
}

/// Queues a job, and starts the queue's loop where it is idle.
fn queue_job(queued: Queued, keep_loaded_seconds: u32) {
    let start_now = STATE.with_borrow_mut(|state| {
        state.keep_loaded_seconds = keep_loaded_seconds;
        state.queue.push_back(queued);
        // The first job of an idle queue starts the loop; until the loop has popped it, a job
        // queued right after must not start a second one.
        state.running.is_none() && state.queue.len() == 1
    });
    if start_now {
        spawn_local(run_queue());
    }
}

/// The service worker's `keepLoaded` changed to `seconds`.
fn keep_loaded(seconds: u32) {
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

/// Pauses the running install, and tells the pages where it stopped.
fn pause_install() {
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

/// The pack `commit` is being deleted: no store of its forms runs or starts, and its stages kept loaded
/// are ended.
fn stop_store_for_deletion(commit: String) {
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
    let (keep, other_pack) = begin_job(&pack);
    let (memory, facts, gpu_budget) =
        memory_plan(params, pack.as_deref(), gpu_budget, keep && !params.profile).await;
    // A profile is of stages loaded afresh, which are not kept; stages kept loaded hold memory a plan
    // without residency has no room for.
    if other_pack || params.profile || !memory.keep {
        unload();
    }
    let params = &with_levers(params, &memory);
    let plan = Plan { memory, budget: gpu_budget };
    let had_resident = STATE.with_borrow(|state| !state.resident.is_empty());
    let mut tries = Tries { job, pack: pack.as_deref(), sent: 0, tried: plan };
    let outcome = tries.run(params, plan).await;
    let outcome = tries.again_lean(params, had_resident, outcome).await;
    let outcome = tries.again_within_free(params, &facts, outcome).await;
    tries.said_for_room(&facts, outcome)
}

/// Marks a job's start (the unload timer of the idle period before it is void) with the pack `pack`;
/// whether stages are kept loaded after jobs, and whether the resident ones are of another pack.
fn begin_job(pack: &Option<String>) -> (bool, bool) {
    STATE.with_borrow_mut(|state| {
        state.idle_epoch += 1;
        state.release_running = false;
        let other_pack = state.resident_pack != *pack;
        state.resident_pack = pack.clone();
        (state.keep_loaded_seconds > 0, other_pack)
    })
}

/// `params` with the levers of the memory plan `memory`; a decoder piece size or projections per part
/// the job asks for win.
fn with_levers(params: &GenerateParams, memory: &MemoryPlan) -> GenerateParams {
    GenerateParams {
        keep_buffers: memory.levers.keep_buffers,
        attention_chunks: memory.levers.attention_chunks,
        projections_per_part: params.projections_per_part || memory.levers.projections_per_part,
        token_chunks: params.token_chunks.max(memory.levers.token_chunks),
        decoder_piece_bytes: params.decoder_piece_bytes.or(memory.levers.decoder_piece_bytes),
        transformer_pieces: params.transformer_pieces.max(memory.levers.transformer_pieces),
        ..params.clone()
    }
}

/// The tries of one job: each later one is made only while no image was sent, and goes by the plan
/// the one before it tried.
struct Tries<'a> {
    job: &'a str,
    pack: Option<&'a str>,
    /// The images broadcast.
    sent: u32,
    /// The plan of the latest try.
    tried: Plan,
}

impl Tries<'_> {
    async fn run(&mut self, params: &GenerateParams, plan: Plan) -> Result<(), StageFailure> {
        self.tried = plan;
        let one_at_a_time = !plan.memory.ahead;
        STATE.with_borrow_mut(|state| state.one_at_a_time = one_at_a_time);
        // One stage at a time is a small budget's plan, where the renderer's memory counts.
        let params = &GenerateParams { matmuls_in_parts: one_at_a_time, ..params.clone() };
        run_stages(self.job, params, self.pack, plan, &mut self.sent).await
    }

    /// A failure of a plan that loads ahead, keeps something or found stages resident is made again
    /// with one stage loaded at a time. A stage that hung is ended and tried once more with a fresh
    /// worker, whatever the plan.
    async fn again_lean(
        &mut self,
        params: &GenerateParams,
        had_resident: bool,
        outcome: Result<(), StageFailure>,
    ) -> Result<(), StageFailure> {
        let plan = self.tried;
        let error = match outcome {
            Err(StageFailure::Error(error))
                if self.sent == 0
                    && (plan.memory.ahead
                        || plan.memory.keep
                        || plan.memory.levers.keep_buffers
                        || had_resident
                        || matches!(error, OffscreenError::Stalled { .. })) =>
            {
                error
            }
            outcome => return outcome,
        };
        warn(&format!("imagine: {error}; making the image again with one stage loaded at a time"));
        unload();
        let lean = plan.lean();
        let params = &GenerateParams { keep_buffers: lean.memory.levers.keep_buffers, ..params.clone() };
        let outcome = self.run(params, lean).await;
        // Lean worked where the fuller plan failed: later jobs stay below that plan.
        if let (Ok(()), Some(pack), true) = (&outcome, self.pack, lean != plan) {
            learn(pack, plan.memory.peak).await;
        }
        outcome
    }

    /// The GPU ran out where the plan said it would fit (other programs took memory meanwhile, or a
    /// stage held more than its count): made once more within what is free now, smaller.
    async fn again_within_free(
        &mut self,
        params: &GenerateParams,
        facts: &MemoryFacts,
        outcome: Result<(), StageFailure>,
    ) -> Result<(), StageFailure> {
        let error = match outcome {
            Err(StageFailure::Error(error)) if self.sent == 0 && is_out_of_memory(&error.to_string()) => {
                error
            }
            outcome => return outcome,
        };
        unload();
        if let Some(pack) = self.pack {
            learn(pack, self.tried.memory.peak).await;
        }
        let budget = free_now(self.tried.budget).await;
        let Some(memory) = facts.after_out_of_memory(budget, params.width, params.height, &self.tried.memory)
        else {
            return Err(StageFailure::Error(error));
        };
        warn(&format!("imagine: {error}; making the image again within {budget:?} bytes"));
        let params = &GenerateParams {
            keep_buffers: false,
            attention_chunks: memory.levers.attention_chunks,
            projections_per_part: params.projections_per_part || memory.levers.projections_per_part,
            token_chunks: params.token_chunks.max(memory.levers.token_chunks),
            decoder_piece_bytes: memory.levers.decoder_piece_bytes,
            transformer_pieces: params.transformer_pieces.max(memory.levers.transformer_pieces),
            ..params.clone()
        };
        self.run(params, Plan { memory, budget }).await
    }

    /// A failure for room says so: the likely cause, and what would fit.
    fn said_for_room(
        &self,
        facts: &MemoryFacts,
        outcome: Result<(), StageFailure>,
    ) -> Result<(), StageFailure> {
        let tried = self.tried;
        match outcome {
            Err(StageFailure::Error(cause))
                if self.sent == 0 && (!tried.memory.fits || is_out_of_memory(&cause.to_string())) =>
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
}

/// [`run_job`]'s work on the pack `pack`; `sent` counts the images broadcast. The three stages in
/// order, each started early where the plan loads them ahead; what an image's result holds is `made`.
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

    let prompt_embeds = if params.trace { traced_embeddings(&prompt, &embeddings) } else { String::new() };
    progress(job, Stage::Transformer, 0, images, 0, params.steps).await;
    let mut transformer = StageRun::given(transformer, job, &transformer_task, embeddings)?;
    let (StageOutput::Transformer(denoised), latents) = transformer.done(images).await? else {
        return Err(unexpected(Stage::Transformer));
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
    let made = Made { job, params, prompt: &prompt, prompt_embeds: &prompt_embeds, started, plan };
    let decoded = send_decoded(&mut decoder, &made, &encoder_timing, &denoised, sent).await?;
    reblocked_at_load.extend(decoded);
    decoder.end(plan.memory.keep);
    if let (Some(commit), false) = (pack, reblocked_at_load.is_empty()) {
        store_reblocked(commit, reblocked_at_load);
    }
    Ok(())
}

/// Broadcasts each image `decoder` decodes, as it comes, until the decoder is done; `sent` counts
/// them. The decoder's graph, where it re-blocked it while loading.
async fn send_decoded(
    decoder: &mut StageRun,
    made: &Made<'_>,
    encoder_timing: &StageTiming,
    denoised: &TransformerOutput,
    sent: &mut u32,
) -> Result<Option<String>, StageFailure> {
    let (job, images) = (made.job, made.params.count);
    let mut reblocked_at_load = None;
    loop {
        match decoder.next(images).await? {
            Reported::Image { index, timing, png } => {
                *sent += 1;
                if index == 0 && timing.reblocked_at_load {
                    reblocked_at_load = Some(timing.graph_file.clone());
                }
                if index == 0 {
                    note_checked(&timing);
                }
                send_result(made.result(index, encoder_timing, denoised, timing, &png)).await;
                if index + 1 < images {
                    progress(job, Stage::Decoder, index + 1, images, 1, 1).await;
                }
            }
            Reported::Done(StageOutput::Decoder { .. }, _) => return Ok(reblocked_at_load),
            Reported::Done(..) => return Err(unexpected(Stage::Decoder)),
        }
    }
}

/// The trace's prompt embeddings (base64): the real tokens' rows of what the transformer is given.
fn traced_embeddings(prompt: &EncodedPrompt, embeddings: &JsValue) -> String {
    let real = prompt.attention_mask.iter().filter(|&&m| m != 0).count() as u32;
    let values = Float32Array::new(embeddings).subarray(0, real * EMBED_WIDTH as u32).to_vec();
    crate::offscreen::stage_worker::base64_f32(&values)
}

/// Tells every page of an image. A private one is also held in this document's memory for the pages
/// that ask later (nothing of it goes to disk), unless its job was cancelled meanwhile: the last
/// private window may have closed.
async fn send_result(result: GenerateResult) {
    if result.private {
        STATE.with_borrow_mut(|state| {
            if !state.cancel_running {
                state.book.keep_private(&result.job, result.index, &result.png);
            }
        });
    }
    broadcast(&Event::Result(result)).await;
}

fn warn(text: &str) {
    web_sys::console::warn_1(&text.into());
}

/// `stage`'s worker handed on another stage's output.
fn unexpected(stage: Stage) -> StageFailure {
    StageFailure::Error(OffscreenError::WrongOutput(stage))
}
