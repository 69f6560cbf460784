//! What the service worker keeps in `chrome.storage` across its restarts: each job's state, for pages
//! that open late, and the list of the jobs kept; the download the user asked for, until it is
//! installed or cancelled. The keys the pages share are in `platform::storage`.

use imagine_core::api::{DownloadProgress, DownloadState, InstallRequest, JobState};
use imagine_core::message::Message;
use serde::{Deserialize, Serialize};

use crate::background::service_worker::ServiceWorkerError;
use crate::platform::protocol::KEPT_ENDED_JOBS;
use crate::platform::storage::Key;

/// The jobs whose state is kept, oldest first (`storage.session`): every job queued or running, and the
/// latest [`KEPT_ENDED_JOBS`] ended ones (results included) for pages that open late.
pub const JOBS: Key<Vec<String>> = Key::session("jobs");
/// The download the user asked for (`storage.local`).
pub const DOWNLOAD: Key<Download> = Key::local("download");

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
    let jobs = JOBS.get().await.unwrap_or_default();
    if !jobs.iter().any(|j| j == id) {
        let mut listed = Vec::with_capacity(jobs.len() + 1);
        for j in jobs {
            let ended = job(&j).get().await.is_none_or(|state| state.has_ended());
            listed.push((j, ended));
        }
        listed.push((id.to_owned(), !matches!(state, JobState::Running { .. })));
        let (kept, dropped) = kept_jobs(listed);
        for old in dropped {
            // Its images stay in the gallery.
            job(&old).remove_or_log().await;
        }
        JOBS.set_or_log(&kept).await;
    }
}

/// Of `jobs` (oldest first, each with whether it has ended), the ones kept and the ones dropped: every
/// job that has not ended, and the latest [`KEPT_ENDED_JOBS`] ended ones.
pub fn kept_jobs(jobs: Vec<(String, bool)>) -> (Vec<String>, Vec<String>) {
    let mut ended_to_drop = jobs.iter().filter(|(_, ended)| *ended).count().saturating_sub(KEPT_ENDED_JOBS);
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    for (job, ended) in jobs {
        if ended && ended_to_drop > 0 {
            ended_to_drop -= 1;
            dropped.push(job);
        } else {
            kept.push(job);
        }
    }
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_that_have_not_ended_are_never_dropped_and_the_latest_ended_are_kept() {
        let list = |spec: &[(&str, bool)]| spec.iter().map(|(j, e)| (j.to_string(), *e)).collect::<Vec<_>>();
        // Ten queued or running jobs: all kept.
        let queued: Vec<(String, bool)> = (0..10).map(|i| (format!("q{i}"), false)).collect();
        let (kept, dropped) = kept_jobs(queued.clone());
        assert_eq!((kept.len(), dropped.len()), (10, 0));
        // Ended jobs beyond the limit go, oldest first, wherever they are among running ones.
        let mut mixed = list(&[("e0", true), ("r0", false), ("e1", true)]);
        mixed.extend((2..=KEPT_ENDED_JOBS + 1).map(|i| (format!("e{i}"), true)));
        mixed.extend(queued);
        let (kept, dropped) = kept_jobs(mixed);
        assert_eq!(dropped, ["e0", "e1"]);
        assert_eq!(kept.len(), 1 + KEPT_ENDED_JOBS + 10);
        assert_eq!(kept[0], "r0");
        assert_eq!(kept_jobs(list(&[("a", true), ("b", false)])).1, Vec::<String>::new());
    }
}
