//! Pack installs and the stored re-blocked forms: the download and hash workers, relayed to the
//! pages; restarted from their checkpoint when a worker dies.

use super::*;
use imagine_core::storage::PackRecord;

/// Starts the download worker, unless one is running: a second request joins the first.
pub(super) fn start_install(request: InstallRequest) -> Result<(), OffscreenError> {
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
pub(super) fn spawn_install_workers(
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
pub(super) const MAX_INSTALL_RESTARTS: u32 = 3;

/// Starts the running install again with fresh workers (a worker it needs died); it goes on from its
/// checkpoint. `false` when it was started again too often already.
pub(super) fn restart_install() -> Result<bool, OffscreenError> {
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
pub(super) fn checked_forms() -> Vec<String> {
    STATE.with_borrow(|state| state.checked_forms.iter().cloned().collect())
}

/// Keeps the stored form a stage checked the checksums of (`StageTiming::checked_form`).
pub(super) fn note_checked(timing: &StageTiming) {
    if let Some(form) = &timing.checked_form {
        STATE.with_borrow_mut(|state| state.checked_forms.insert(form.clone()));
    }
}

/// Has a download worker of its own store the re-blocked forms of `graphs`, which a stage of the job
/// just done re-blocked while loading, with the installed pack `commit` (`download::store_reblocked`), so
/// that the next loads read them: once, in the background, unless one is already at it, a download
/// runs (whose new pack gets its own at install), the pack is being deleted, or the last store failed
/// too recently ([`store_backoff_ms`]: a disk without room is not written to after every job). A
/// failure costs nothing but the speed-up: logged. The store is given [`STORE_LIMIT_MS`]; a worker
/// that has not reported by then is ended, and what it half-wrote removed.
pub(super) fn store_reblocked(commit: &str, graphs: Vec<String>) {
    if !STATE.with_borrow(|state| store_may_start(state, commit)) {
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
            let start = store_may_start(state, &commit);
            if start {
                state.store = Some((worker.clone(), sender.clone()));
            }
            start
        });
        if !start {
            worker.terminate();
            return;
        }
        let command = DownloadCommand::StoreReblocked { commit: commit.clone(), graphs: graphs.clone() };
        let outcome = run_store_reblocked(&worker, inbox, &sender, &command, limit_ms).await;
        end_store(&worker, outcome, &commit, &graphs).await;
    });
}

/// No store runs, no download, and the pack `commit` is not being deleted.
fn store_may_start(state: &State, commit: &str) -> bool {
    state.store.is_none() && state.install.is_none() && state.no_store_for.as_deref() != Some(commit)
}

/// The store on `worker` ended with `outcome`: its worker is ended, and a failure counted (for the
/// wait before the next), logged and, where the worker was ended mid-way, cleaned up after.
async fn end_store(worker: &Worker, outcome: Result<(), StoreFailed>, commit: &str, graphs: &[String]) {
    // Ended by a swap or a deletion meanwhile ([`stop_store`]): not a failure of the store.
    let ours = STATE.with_borrow_mut(|state| {
        let ours = state.store.as_ref().is_some_and(|(w, _)| w == worker);
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
            remove_unrecorded_forms(commit, graphs).await;
        }
    }
}

/// How long a store of the re-blocked forms may run before its worker is ended (the published pack's
/// take seconds).
pub(super) const STORE_LIMIT_MS: u64 = 10 * 60 * 1000;

/// The OPFS file in which a test sets the wait after a failed store, in milliseconds.
pub(super) const STORE_RETRY_FILE: &str = "block32-retry-ms";

/// How long after the `failures`-th failed store in a row the next may start: 10 minutes, doubling
/// up to 8 hours (a disk that stays full is tried a few times a day, and in each new browser session).
pub(super) async fn store_backoff_ms(failures: u32) -> u64 {
    if let Some(ms) = crate::platform::opfs::test_setting_u64(STORE_RETRY_FILE).await {
        return ms;
    }
    ((10 * 60 * 1000u64) << failures.saturating_sub(1).min(6)).min(8 * 60 * 60 * 1000)
}

/// Why a store of the re-blocked forms failed; `ended`: its worker was ended here, mid-way.
pub(super) struct StoreFailed {
    text: String,
    ended: bool,
}

impl std::fmt::Display for StoreFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// [`store_reblocked`]'s worker, from its start to its one report, within `limit_ms`.
pub(super) async fn run_store_reblocked(
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
            Ok((DownloadReport::ReblockedStored, _)) => Ok(()),
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
pub(super) async fn remove_unrecorded_forms(commit: &str, graphs: &[String]) {
    let Some((installed, dir)) =
        crate::platform::opfs::installed_pack().await.filter(|(p, _)| p.commit == commit)
    else {
        return;
    };
    let record = installed.block32.unwrap_or_default();
    for graph in graphs.iter().filter(|g| record.graph(g).is_none()) {
        crate::offscreen::download::remove_form(&dir, graph).await;
    }
}

/// Ends the store of re-blocked forms, if one runs: for a pack swap (the forms are of the pack being
/// replaced) or a deletion. Its files are let go of as its worker ends; its state write, if it got
/// there, held the state's lock and named the pack it was for, so nothing of it outlives that pack.
pub(super) fn stop_store() {
    if let Some((worker, inbox)) = STATE.with_borrow_mut(|state| state.store.take()) {
        worker.terminate();
        let _ = inbox.unbounded_send(Incoming::Stopped);
    }
}

/// Terminates the download worker (what it saved is kept) and returns its last progress.
pub(super) fn stop_install() -> Option<DownloadProgress> {
    let install = STATE.with_borrow_mut(|state| state.install.take())?;
    install.terminate();
    let _ = install.inbox.unbounded_send(Incoming::Stopped);
    install.last
}

/// Removes a download's partial files. The terminated worker's file locks go away shortly after it.
pub(super) async fn remove_staging() -> Result<(), OpfsError> {
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
pub(super) fn end_swap() {
    let resume = STATE.with_borrow_mut(|state| {
        std::mem::take(&mut state.swap_pending) && state.running.is_none() && !state.queue.is_empty()
    });
    if resume {
        spawn_local(run_queue());
    }
}

/// The event of an install that failed here (not in its worker, which says whether it was offline).
pub(super) fn pack_failed(error: OffscreenError) -> Event {
    Event::pack_failed(&error, false)
}

/// Relays the reports of the running install's download worker to the pages until it ends; then the
/// install asked for meanwhile starts.
pub(super) async fn relay_install(mut inbox: mpsc::UnboundedReceiver<Incoming>) {
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
            Ok(DownloadReport::Progress { progress }) => relay_progress(progress).await,
            Ok(DownloadReport::SwapReady) => swap_when_idle().await,
            Ok(DownloadReport::Installed { pack }) => break installed(pack).await,
            Ok(DownloadReport::Failed { error, offline, restart }) => {
                if restart && restarted_after(&error) {
                    return;
                }
                break Event::pack_failed(&OffscreenError::Reported(error), offline);
            }
            Ok(DownloadReport::ReblockedStored) => {}
            Err(error) => break pack_failed(error.into()),
        }
    };
    end_install(event).await;
}

/// Keeps the install's latest progress (what a pause reports) and tells the pages.
async fn relay_progress(progress: DownloadProgress) {
    STATE.with_borrow_mut(|state| {
        if let Some(install) = &mut state.install {
            install.last = Some(progress.clone());
        }
    });
    broadcast(&Event::PackProgress(progress)).await;
}

/// The new pack is verified: no job starts until it is swapped in, which the download worker is told
/// to do once the running job is done.
async fn swap_when_idle() {
    STATE.with_borrow_mut(|state| state.swap_pending = true);
    // The job that is running finishes on the installed pack. A store of that pack's
    // re-blocked forms is ended: they would be of the pack being replaced.
    while STATE.with_borrow(|state| state.running.is_some()) {
        crate::platform::js::sleep_ms(100).await;
    }
    stop_store();
    let worker = STATE.with_borrow(|state| state.install.as_ref().map(|i| i.worker.clone()));
    if let Some(worker) = worker {
        protocol::post(&worker, &DownloadCommand::Swap, None).log_error("asking the download worker to swap");
    }
}

/// The event of the pack `pack` installed, once what was kept for the one before is let go of.
async fn installed(pack: PackRecord) -> Event {
    // A pack deleted before may be this one again: its forms may be stored.
    STATE.with_borrow_mut(|state| state.no_store_for = None);
    // Embeddings of the previous pack would never be used again.
    if let Err(e) = crate::platform::opfs::embeddings::clear().await {
        warn(&format!("imagine: the embedding cache could not be cleared: {e}"));
    }
    Event::PackInstalled { bytes: pack.bytes, commit: pack.commit }
}

/// A worker the install needs died with `error`: whether the install goes on with fresh workers.
fn restarted_after(error: &ErrorText) -> bool {
    warn(&format!("imagine: {}; the download goes on with fresh workers", error.error));
    match restart_install() {
        Ok(restarted) => restarted,
        Err(e) => {
            warn(&format!("imagine: the download could not be started again: {e}"));
            false
        }
    }
}

/// The install ended with `event`: its workers are ended, jobs waiting for its swap start, the pages
/// are told, and an install asked for meanwhile starts.
async fn end_install(event: Event) {
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
