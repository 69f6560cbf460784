//! The worker of one stage (`StageRun`): started or taken from the residents, fed, watched for
//! stalls, and terminated when dropped.

use super::*;

/// What a stage worker reported that its caller acts on (progress is relayed on the way).
pub(super) enum Reported {
    /// The decoder finished image `index`: its PNG.
    Image { index: u32, timing: StageTiming, png: JsValue },
    /// The stage is done: its output, and the buffer it hands on if any.
    Done(StageOutput, Option<JsValue>),
}

/// The worker of one stage: of a job, or resident (in `State::resident`); dropping it terminates the
/// worker.
pub(super) struct StageRun {
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
    pub(super) fn start(
        job: &str,
        task: &StageTask,
        data: Option<&JsValue>,
    ) -> Result<StageRun, StageFailure> {
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
                let (worker, inbox, sender) = spawn_worker(stage_worker_script())?;
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
    pub(super) fn resident(
        stage: Stage,
        backend: Backend,
        options: Option<SessionOptions>,
    ) -> Option<StageRun> {
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
    pub(super) fn end(self, keep: bool) {
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
    pub(super) fn given(
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
    pub(super) async fn done(&mut self, images: u32) -> Result<(StageOutput, Option<JsValue>), StageFailure> {
        match self.next(images).await? {
            Reported::Done(output, data) => Ok((output, data)),
            Reported::Image { .. } => Err(unexpected(self.stage)),
        }
    }

    /// Relays the worker's progress until it reports an image or the end; a worker quiet for longer
    /// than its stage may be ([`QuietTimes::stall_limit_ms`]) is a failure.
    pub(super) async fn next(&mut self, images: u32) -> Result<Reported, StageFailure> {
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
    pub(super) async fn stall_limit_ms(&self) -> f64 {
        let set = crate::platform::opfs::test_setting_u64(STALL_LIMIT_FILE).await;
        if let Some(ms) = set.filter(|&ms| ms >= MIN_TEST_STALL_LIMIT_MS) {
            return ms as f64;
        }
        quiet_times().await.stall_limit_ms(self.stage, self.backend, self.pixels)
    }
}

/// The stages' quiet times: as kept in this document, else as kept in OPFS.
pub(super) async fn quiet_times() -> QuietTimes {
    if let Some(times) = STATE.with_borrow(|state| state.quiet_times.clone()) {
        return times;
    }
    let times = crate::platform::opfs::quiet::get().await;
    STATE.with_borrow_mut(|state| state.quiet_times.get_or_insert(times).clone())
}

/// The OPFS file with which a test shortens every stage's stall limit, in milliseconds.
pub(super) const STALL_LIMIT_FILE: &str = "stall-limit-ms";

impl Drop for StageRun {
    fn drop(&mut self) {
        self.worker.terminate();
        STATE.with_borrow_mut(|state| state.current.retain(|current| current.id != self.id));
        announce_residency();
    }
}

/// The stage worker's script, as the running try loads its stages. Stages loaded at once (a large GPU)
/// let ORT compile its wasm from its URL: Chromium's code cache then gives every later worker ORT's
/// optimized code (a stage's session made in about 0.6x the time). One stage at a time (a budget)
/// hands ORT the bytes: from that cache V8 optimized ORT's static constructors once more (958 kB,
/// run once), holding 0.25-0.8 GB of the renderer for seconds (BENCHMARKS.md, "How a stage worker's
/// ORT gets its wasm").
fn stage_worker_script() -> &'static str {
    if STATE.with_borrow(|state| state.one_at_a_time) {
        "stage-worker.js?ort-wasm=bytes"
    } else {
        "stage-worker.js"
    }
}

pub(super) type Spawned = (Worker, mpsc::UnboundedReceiver<Incoming>, mpsc::UnboundedSender<Incoming>);

pub(super) fn new_worker(script: &str) -> Result<Worker, JsError> {
    let options = WorkerOptions::new();
    options.set_type(WorkerType::Module);
    Ok(Worker::new_with_options(script, &options)?)
}

/// Starts the worker `script`, whose messages and crash arrive in the returned inbox.
pub(super) fn spawn_worker(script: &str) -> Result<Spawned, JsError> {
    let worker = new_worker(script)?;
    let (inbox, sender) = watch_worker(&worker, script);
    Ok((worker, inbox, sender))
}

/// The inbox of `worker` (started from `script`): its messages and its crash.
pub(super) fn watch_worker(
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
