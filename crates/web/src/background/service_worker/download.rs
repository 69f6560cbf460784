//! The model's download as the service worker keeps it: started, joined, paused, resumed, cancelled,
//! restarted by the alarm; the pack deleted; `packStatus`.

use super::*;

/// Starts (or joins, or resumes) a download. The source is checked here so a bad one is refused at once.
pub(super) async fn install(request: InstallRequest) -> Result<(), ServiceWorkerError> {
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
pub(super) async fn set_alarm(name: &str) {
    let info = Obj::new().set("periodInMinutes", 0.5).build();
    settled(chrome::alarms_create(name, &info)).await.log_error(&format!("starting the alarm {name}"));
}

pub(super) async fn plan(source: PackSource) -> Result<PackPlan, ServiceWorkerError> {
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

pub(super) async fn pause() -> Result<(), ServiceWorkerError> {
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

pub(super) async fn cancel_download() -> Result<(), ServiceWorkerError> {
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
pub(super) async fn delete_pack() -> Result<(), ServiceWorkerError> {
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
pub(super) async fn forget_unused_host_permissions() {
    let installed = opfs::installed_pack().await.map(|(record, _)| record.source);
    let downloading = records::DOWNLOAD.get().await.map(|d| d.request.source());
    settings::forget_unused_host_permissions(
        &[installed, downloading].into_iter().flatten().collect::<Vec<_>>(),
    )
    .await;
}

pub(super) async fn clear_alarm(name: &str) {
    settled(chrome::alarms_clear(name)).await.log_error(&format!("clearing the alarm {name}"));
}

/// Restarts an active download whose worker is gone; the worker resumes from what it saved. Holds the
/// download lock throughout: the offscreen document keeps an ending download registered until the
/// service worker recorded how it ended, so what is read here cannot be stale.
pub(super) async fn resume_if_stalled() {
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
pub(super) async fn retry_offline_download() {
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

pub(super) async fn pack_status() -> PackStatus {
    resume_if_stalled().await;
    let download = records::DOWNLOAD.get().await;
    let record = opfs::installed_pack().await.map(|(record, _)| record);
    PackStatus {
        installed: record.is_some(),
        bytes: record.as_ref().map_or(0, |r| r.bytes),
        converted_bytes: record.as_ref().and_then(|r| r.conversion.as_ref()).map(|c| c.bytes),
        reblocked_bytes: record
            .as_ref()
            .and_then(|r| r.block32.as_ref())
            .map(|b| b.bytes())
            .filter(|&b| b > 0),
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

pub(super) async fn lock_download() -> OwnedMutexGuard<()> {
    DOWNLOAD_LOCK.with(Arc::clone).lock_owned().await
}

/// Changes the stored download, if there is one (events of a cancelled download change nothing).
pub(super) async fn update_download(change: impl FnOnce(&mut Download)) {
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
