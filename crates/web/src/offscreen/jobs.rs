//! What the offscreen document remembers of the jobs it ended.
//!
//! The service worker fails a job it has recorded as running that the document does not name (that
//! document closed or crashed with it), so the document names every job it has queued or running, and
//! the latest [`KEPT_ENDED_JOBS`] it ended: an ended job's last event may still be on its way to the
//! service worker.

use std::collections::VecDeque;

use crate::platform::protocol::KEPT_ENDED_JOBS;

/// The jobs ended.
#[derive(Debug, Default)]
pub struct JobBook {
    /// The latest [`KEPT_ENDED_JOBS`] jobs ended, oldest first.
    ended: VecDeque<String>,
}

impl JobBook {
    /// Job `job` ended (its last event was sent): the oldest ended job past the limit is no longer
    /// named.
    pub fn ended(&mut self, job: &str) {
        if self.ended.iter().any(|j| j == job) {
            return;
        }
        self.ended.push_back(job.to_owned());
        while self.ended.len() > KEPT_ENDED_JOBS {
            self.ended.pop_front();
        }
    }

    /// The jobs ended that are still named, oldest first.
    pub fn ended_jobs(&self) -> impl Iterator<Item = &String> {
        self.ended.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_ended_jobs_are_named() {
        let mut book = JobBook::default();
        book.ended("a");
        book.ended("a");
        assert_eq!(book.ended_jobs().collect::<Vec<_>>(), ["a"]);
        for i in 0..KEPT_ENDED_JOBS {
            book.ended(&format!("j{i}"));
        }
        assert_eq!(book.ended_jobs().count(), KEPT_ENDED_JOBS);
        assert!(book.ended_jobs().all(|j| j != "a"));
    }
}
