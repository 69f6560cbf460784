//! What the service worker keeps in `chrome.storage` across its restarts: each job's state, for pages
//! that open late, and the list of the jobs kept; the download the user asked for, until it is
//! installed or cancelled; and whether this browser session has started. The keys the pages share are
//! in `platform::storage`.

use imagine_core::api::{DownloadProgress, DownloadState, InstallRequest, JobState};
use imagine_core::message::Message;
use serde::{Deserialize, Serialize};

use crate::background::service_worker::ServiceWorkerError;
use crate::platform::storage::Key;

/// Jobs whose state is kept (results included) for pages that open late.
pub const KEPT_JOBS: usize = 8;
/// The jobs whose state is kept, oldest first (`storage.session`).
pub const JOBS: Key<Vec<String>> = Key::session("jobs");
/// The download the user asked for (`storage.local`).
pub const DOWNLOAD: Key<Download> = Key::local("download");
/// Set once this browser session's service worker has started (`storage.session`).
pub const SESSION_STARTED: Key<bool> = Key::session("session");

/// Job `id`'s state (`storage.session`).
pub fn job(id: &str) -> Key<JobState> {
    Key::session_named(format!("job:{id}"))
}

/// The download the user asked for, as long as it is not installed or cancelled.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Download {
    /// What was asked for: the pack's source and the backend it is for.
    pub request: InstallRequest,
    /// Where the download is: checking, downloading, paused, failed, ...
    pub state: DownloadState,
    /// The latest progress the download worker reported; `None` before its first report.
    pub progress: Option<DownloadProgress>,
    /// Why it stopped, when it failed.
    pub error: Option<String>,
    /// `error` as a `_locales` message (absent in a download stored by an older version).
    #[serde(default)]
    pub message: Option<Message>,
    /// It failed because the network was down: each download alarm (and a browser start) tries it again
    /// until it works, is cancelled or is resumed by hand.
    #[serde(default)]
    pub retry_offline: bool,
}

/// Records a job's state. Every job ends in a state the pages can show: if the state cannot be written
/// (`storage.session` is full), a short failure is written in its place.
pub async fn set_job(id: &str, state: &JobState) {
    let key = job(id);
    if let Err(e) = key.set(state).await {
        let error = ServiceWorkerError::NotRecorded(e.clone());
        if !matches!(state, JobState::Running { .. }) && key.set(&JobState::failed(&error)).await.is_err() {
            web_sys::console::error_1(&format!("imagine: job {id}: {e}").into());
        }
    }
    let mut jobs = JOBS.get().await.unwrap_or_default();
    if !jobs.iter().any(|j| j == id) {
        jobs.push(id.to_owned());
        while jobs.len() > KEPT_JOBS {
            // Its images stay in the gallery.
            job(&jobs.remove(0)).remove_or_log().await;
        }
        JOBS.set_or_log(&jobs).await;
    }
}
