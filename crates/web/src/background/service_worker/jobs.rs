//! Jobs as the service worker keeps them: started, recorded from the offscreen document's events,
//! failed when their document is gone, read back with their images from the gallery.

use super::*;

/// Starts a job: its id and seed.
pub(super) async fn start_job(request: GenerateRequest) -> Result<(String, String), ServiceWorkerError> {
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
pub(super) async fn running_jobs() -> Vec<String> {
    let mut running = Vec::new();
    for job in records::JOBS.get().await.unwrap_or_default() {
        if matches!(records::job(&job).get().await, Some(JobState::Running { .. })) {
            running.push(job);
        }
    }
    running
}

pub(super) async fn fail_lost_jobs() {
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

/// Keeps the latest state of jobs and installs, from the events the offscreen document broadcasts.
pub(super) async fn record(event: Event) {
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
        Event::Result(result) => record_result(result).await,
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
        Event::PackFailed { error, message, offline } => record_pack_failure(error, message, offline).await,
        // For the pages: nothing the service worker keeps.
        Event::PackChanged {} | Event::Residency(_) | Event::GalleryDeleted { .. } => {}
    }
}

/// An image of a job: its PNG kept, the job's state brought up to it, the image added to the gallery
/// (unless private).
async fn record_result(mut result: GenerateResult) {
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
                ServiceWorkerError::Unkept { error: ErrorText::of(e), seed: result.image.seed.to_string() };
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
                _ => (None, result.image.prompt.clone()),
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

/// A download that stopped with an error; offline, the alarm tries it again.
async fn record_pack_failure(error: String, message: Option<Message>, offline: bool) {
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

/// The studio's focus goes once every image of its finished job was deleted from the gallery: a
/// studio opened later starts empty, not with an error about an image the user deleted.
pub(super) async fn forget_deleted_focus() {
    let Some(job) = storage::STUDIO_FOCUS.get().await.and_then(|focus| focus.job) else { return };
    let done = matches!(records::job(&job).get().await, Some(JobState::Done { .. }));
    if done && job_state(&job).await == JobState::Unknown {
        storage::STUDIO_FOCUS.remove_or_log().await;
    }
}

/// The images of a batch recorded so far (without their PNGs); `None` when the job is done already.
pub(super) async fn finished_images(job: &str) -> Option<Vec<GenerateResult>> {
    match records::job(job).get().await {
        Some(JobState::Done { .. }) => None,
        state => Some(state.map(|state| state.results().to_vec()).unwrap_or_default()),
    }
}

/// A job's state; its images are read back from OPFS.
pub(super) async fn job_state(job: &str) -> JobState {
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
pub(super) async fn keep_image(result: &GenerateResult, png: &str) -> Result<u64, ServiceWorkerError> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD.decode(png)?;
    if !result.private {
        gallery_store::write_png(&gallery::image_id(&result.job, result.index), &bytes).await?;
    }
    Ok(bytes.len() as u64)
}

/// The PNG (base64) of a job's image: from the gallery, or a private one from the offscreen document's
/// memory (never opened for it: a closed document holds nothing).
pub(super) async fn kept_image(job: &str, result: &GenerateResult) -> Result<String, ServiceWorkerError> {
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
