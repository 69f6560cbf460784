//! What the offscreen document remembers of the jobs it ended, and the images of private jobs.
//!
//! The service worker fails a job it has recorded as running that the document does not name (that
//! document closed or crashed with it), so the document names every job it has queued or running, and
//! the latest [`KEPT_ENDED_JOBS`] it ended: an ended job's last event may still be on its way to the
//! service worker. The same limit bounds the private images: a private job's PNGs are kept here, in
//! memory only, never on disk, while the job is among those, and all of them are forgotten at once when
//! the last private window closes (or with this document).

use std::collections::{HashMap, VecDeque};

use imagine_core::gallery;

use crate::platform::protocol::KEPT_ENDED_JOBS;

/// The jobs ended and the private images held.
#[derive(Debug, Default)]
pub struct JobBook {
    /// The latest [`KEPT_ENDED_JOBS`] jobs ended, oldest first.
    ended: VecDeque<String>,
    /// The PNGs (base64) of private jobs' images, by image id ([`gallery::image_id`]).
    private_images: HashMap<String, String>,
}

impl JobBook {
    /// Job `job` ended (its last event was sent): the oldest ended job past the limit is no longer
    /// named, and its private images are forgotten.
    pub fn ended(&mut self, job: &str) {
        if self.ended.iter().any(|j| j == job) {
            return;
        }
        self.ended.push_back(job.to_owned());
        while self.ended.len() > KEPT_ENDED_JOBS {
            if let Some(old) = self.ended.pop_front() {
                self.private_images.retain(|id, _| gallery::batch_of(id) != old);
            }
        }
    }

    /// The jobs ended that are still named, oldest first.
    pub fn ended_jobs(&self) -> impl Iterator<Item = &String> {
        self.ended.iter()
    }

    /// Holds image `index` of private job `job` (its PNG in base64) for the pages that ask for it later.
    pub fn keep_private(&mut self, job: &str, index: u32, png: &str) {
        self.private_images.insert(gallery::image_id(job, index), png.to_owned());
    }

    /// The PNG (base64) of the private image `id`, if it is held.
    pub fn private_image(&self, id: &str) -> Option<&String> {
        self.private_images.get(id)
    }

    /// Forgets every private image.
    pub fn forget_private(&mut self) {
        self.private_images.clear();
        self.private_images.shrink_to_fit();
    }

    /// Private images held.
    pub fn private_count(&self) -> usize {
        self.private_images.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_ended_jobs_are_named_and_older_private_images_forgotten() {
        let mut book = JobBook::default();
        book.keep_private("a", 0, "png a");
        book.keep_private("a", 1, "png a-1");
        book.keep_private("b", 0, "png b");
        book.ended("a");
        book.ended("a");
        assert_eq!(book.ended_jobs().collect::<Vec<_>>(), ["a"]);
        for i in 0..KEPT_ENDED_JOBS - 1 {
            book.ended(&format!("j{i}"));
        }
        assert_eq!(book.private_image("a-1").map(String::as_str), Some("png a-1"));
        // One more ended job: "a" is the oldest past the limit; "b", not ended, keeps its image.
        book.ended("last");
        assert_eq!(book.ended_jobs().count(), KEPT_ENDED_JOBS);
        assert!(book.ended_jobs().all(|j| j != "a"));
        assert_eq!((book.private_image("a"), book.private_image("a-1")), (None, None));
        assert_eq!(book.private_image("b").map(String::as_str), Some("png b"));
        book.forget_private();
        assert_eq!(book.private_count(), 0);
    }
}
