//! The offscreen document: opened when needed, sent commands, asked what is loaded.

use super::*;

/// Sends a command to the offscreen document, creating it first if needed; whether a download worker
/// runs after it.
pub(super) async fn command(command: &OffscreenCommand) -> Result<bool, ServiceWorkerError> {
    ensure_offscreen().await?;
    Ok(send_command(command).await?.installing)
}

/// What the offscreen document answers to a command it carried out.
pub(super) struct Answer {
    /// A download worker runs.
    pub(super) installing: bool,
    /// The stages loaded.
    pub(super) loaded: Vec<Stage>,
    /// The jobs it was given, ended ones included.
    pub(super) jobs: Vec<String>,
}

/// Sends a command to the open offscreen document.
pub(super) async fn send_command(command: &OffscreenCommand) -> Result<Answer, ServiceWorkerError> {
    let reply = send(&protocol::to_offscreen(command)).await?;
    match from_js::<OffscreenReply>(&reply) {
        Ok(OffscreenReply::Done { installing, loaded, jobs }) => Ok(Answer { installing, loaded, jobs }),
        Ok(OffscreenReply::Refused(error)) => Err(ServiceWorkerError::Refused(error)),
        Ok(OffscreenReply::PrivateImage { .. }) | Err(_) => Err(ServiceWorkerError::NoAnswer),
    }
}

/// `keepLoaded`: saves the seconds if given and tells the offscreen document (if open: without it,
/// nothing is loaded); the setting and what is loaded now.
pub(super) async fn keep_loaded(request: KeepLoadedRequest) -> Result<Residency, ServiceWorkerError> {
    let seconds = match request.seconds {
        Some(value) => {
            let seconds = imagine_core::keep_loaded_seconds(value)?;
            storage::KEEP_LOADED.set(&seconds).await?;
            Some(seconds)
        }
        None => None,
    };
    let loaded = if offscreen_exists().await? {
        send_command(&OffscreenCommand::KeepLoaded { seconds }).await?.loaded
    } else {
        Vec::new()
    };
    let residency = Residency { seconds: settings::keep_loaded_seconds().await, loaded };
    if seconds.is_some() {
        let event = Event::Residency(residency.clone());
        spawn_local(async move { messaging::broadcast(&event).await });
    }
    Ok(residency)
}

/// The stages loaded in the offscreen document now (none when it is closed).
pub(crate) async fn loaded_stages() -> Vec<Stage> {
    match offscreen_exists().await {
        Ok(true) => send_command(&OffscreenCommand::KeepLoaded { seconds: None })
            .await
            .map(|a| a.loaded)
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Tells the offscreen document to keep stages loaded `seconds` (0 unloads them now), or, with
/// `None`, as long as the user's setting says.
pub(crate) async fn set_keep_loaded(seconds: Option<u32>) -> Result<(), ServiceWorkerError> {
    let seconds = match seconds {
        Some(seconds) => seconds,
        None => settings::keep_loaded_seconds().await,
    };
    if offscreen_exists().await? {
        send_command(&OffscreenCommand::KeepLoaded { seconds: Some(seconds) }).await?;
    }
    Ok(())
}

pub(super) async fn offscreen_exists() -> Result<bool, JsError> {
    crate::platform::offscreen::exists().await
}

pub(super) async fn ensure_offscreen() -> Result<(), ServiceWorkerError> {
    // A document that is still loading is listed already but cannot take messages yet: one creation at
    // a time, and everyone waits for it to finish loading.
    let lock = OFFSCREEN_LOCK.with(Rc::clone);
    let _guard = lock.lock().await;
    if offscreen_exists().await? {
        return Ok(());
    }
    crate::platform::offscreen::open().await.map_err(ServiceWorkerError::OffscreenNotOpened)
}
