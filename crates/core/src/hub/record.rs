//! Download record: where a pack download stands, persisted so that it resumes.

use serde::{Deserialize, Serialize};

use super::{HashCheckpoint, RateMeter, ResumableSha256};
use crate::api::{DownloadProgress, DownloadState, FileProgress, PackFile, PackPlan, PackSource};

/// Where the download of one file stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileRecord {
    /// The file, as planned.
    pub file: PackFile,
    /// Bytes of the file written so far (what progress shows). A resume trusts only those up to
    /// `hash`'s offset ([`resume`](Self::resume)); [`save`](Self::save) sets both together.
    pub done: u64,
    /// The hash state at `done` (streamed files); `None` before the first checkpoint and for files
    /// checked whole with [`verify_small`](super::verify_small).
    pub hash: Option<HashCheckpoint>,
    /// Size and hash checked; the file is complete.
    pub verified: bool,
    /// The file was started over after some of it had been recorded (a server ignored a range, or the
    /// file on disk was shorter than its checkpoint): before it counts as verified, what is on disk is
    /// hashed again, so no record can vouch for bytes the file does not hold.
    #[serde(default)]
    pub restarted: bool,
}

impl FileRecord {
    /// Starts the file over from byte 0, remembering that it was ([`restarted`](Self::restarted)).
    pub fn restart(&mut self) {
        self.done = 0;
        self.hash = None;
        self.restarted = true;
    }

    /// Records a checkpoint of the file's hasher ([`ResumableSha256::aligned_checkpoint`], taken after
    /// the bytes it has seen are flushed to disk): `done` becomes the checkpoint's offset.
    pub fn save(&mut self, checkpoint: HashCheckpoint) {
        self.done = checkpoint.offset;
        self.hash = Some(checkpoint);
    }

    /// The hasher to continue this file with. Its [`offset`](ResumableSha256::offset) is where
    /// to truncate the staged file and request `Range: bytes=<offset>-` from: the saved
    /// checkpoint's, or 0 when there is none or it does not fit the record (then the file starts
    /// over). Bytes past the checkpoint are re-downloaded, never trusted unhashed.
    pub fn resume(&self) -> ResumableSha256 {
        self.hash
            .as_ref()
            .filter(|c| c.offset <= self.done && c.offset <= self.file.size)
            .and_then(|c| ResumableSha256::from_checkpoint(c).ok())
            .unwrap_or_default()
    }
}

/// The state of a pack download, persisted by the worker (as JSON in OPFS, next to the staged
/// files) after each checkpoint, so a download resumes after the browser closes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownloadRecord {
    /// Where the pack comes from.
    pub source: PackSource,
    /// The commit every file is downloaded at.
    pub commit: String,
    /// One per planned file, in plan order.
    pub files: Vec<FileRecord>,
}

impl DownloadRecord {
    /// A fresh record: nothing downloaded.
    pub fn new(plan: &PackPlan) -> Self {
        DownloadRecord {
            source: plan.source.clone(),
            commit: plan.commit.clone(),
            files: plan
                .files
                .iter()
                .map(|f| FileRecord {
                    file: f.clone(),
                    done: 0,
                    hash: None,
                    verified: false,
                    restarted: false,
                })
                .collect(),
        }
    }

    /// Whether this record belongs to `plan`: same source, commit and files (names, sizes and
    /// hashes, in order). If not, the staged files must be discarded and a new record started, so a
    /// pack is never a mix of two revisions.
    pub fn matches(&self, plan: &PackPlan) -> bool {
        self.source == plan.source
            && self.commit == plan.commit
            && self.files.len() == plan.files.len()
            && self.files.iter().zip(&plan.files).all(|(r, f)| r.file == *f)
    }

    /// Bytes downloaded and hashed (a verified file counts whole).
    pub fn done_bytes(&self) -> u64 {
        self.files.iter().map(|r| if r.verified { r.file.size } else { r.done.min(r.file.size) }).sum()
    }

    /// Bytes of the whole pack.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|r| r.file.size).sum()
    }

    /// Bytes still to download (what [`check_space`](super::check_space) needs free).
    pub fn remaining_bytes(&self) -> u64 {
        self.total_bytes() - self.done_bytes()
    }

    /// Whether every file is verified.
    pub fn complete(&self) -> bool {
        self.files.iter().all(|r| r.verified)
    }

    /// The progress to report. The rate and time left come from `rate` only while `state` is
    /// `Downloading`; a paused or failed download reports no rate.
    pub fn to_progress(
        &self,
        state: DownloadState,
        rate: &RateMeter,
        error: Option<String>,
    ) -> DownloadProgress {
        let downloading = state == DownloadState::Downloading;
        let remaining = self.remaining_bytes();
        DownloadProgress {
            state,
            source: self.source.clone(),
            commit: Some(self.commit.clone()),
            total_bytes: self.total_bytes(),
            done_bytes: self.done_bytes(),
            files: self
                .files
                .iter()
                .map(|r| FileProgress {
                    path: r.file.path.clone(),
                    size: r.file.size,
                    done_bytes: if r.verified { r.file.size } else { r.done.min(r.file.size) },
                    verified: r.verified,
                })
                .collect(),
            bytes_per_second: if downloading { rate.bytes_per_second() } else { 0.0 },
            seconds_left: if downloading { rate.seconds_left(remaining) } else { None },
            error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(sizes: &[u64]) -> PackPlan {
        let files: Vec<PackFile> = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| PackFile {
                path: format!("f{i}"),
                size,
                sha256: Some("0".repeat(64)),
                git_oid: None,
            })
            .collect();
        PackPlan {
            source: PackSource::default(),
            commit: "a".repeat(40),
            total_bytes: sizes.iter().sum(),
            files,
            conversion: None,
        }
    }

    #[test]
    fn download_record() {
        let plan = plan_of(&[100, 1000, 50]);
        let mut r = DownloadRecord::new(&plan);
        assert!(r.matches(&plan));
        assert_eq!((r.done_bytes(), r.total_bytes(), r.remaining_bytes()), (0, 1150, 1150));
        r.files[0].done = 100;
        r.files[0].verified = true;
        let mut h = ResumableSha256::new();
        h.update(&[7; 300]);
        r.files[1].save(h.aligned_checkpoint());
        assert_eq!(r.files[1].done, 256);
        assert_eq!(r.files[1].resume().offset(), 256);
        assert_eq!(r.done_bytes(), 356);
        assert!(!r.complete());

        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(r#""gitOid":null"#) && json.contains(r#""verified":true"#), "{json}");
        let back: DownloadRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);

        let mut rate = RateMeter::new();
        rate.push(0.0, 0);
        rate.push(1000.0, 356);
        let p = r.to_progress(DownloadState::Downloading, &rate, None);
        assert_eq!((p.done_bytes, p.total_bytes, p.commit.as_deref()), (356, 1150, Some(&*"a".repeat(40))));
        assert_eq!(
            p.files[1],
            FileProgress { path: "f1".into(), size: 1000, done_bytes: 256, verified: false }
        );
        assert_eq!(p.bytes_per_second, 356.0);
        assert_eq!(p.seconds_left, Some(794.0 / 356.0));
        let p = r.to_progress(DownloadState::Failed, &rate, Some("boom".into()));
        assert_eq!((p.bytes_per_second, p.seconds_left, p.error.as_deref()), (0.0, None, Some("boom")));

        // Another commit, source or file list: the staged files belong to something else.
        let mut other = plan.clone();
        other.commit = "b".repeat(40);
        assert!(!r.matches(&other));
        let mut other = plan.clone();
        other.files[2].size = 51;
        assert!(!r.matches(&other));
        let mut other = plan.clone();
        other.source.revision = "v2".into();
        assert!(!r.matches(&other));
        assert!(!r.matches(&plan_of(&[100, 1000])));
    }

    #[test]
    fn resume_falls_back_to_zero_on_inconsistent_record() {
        let plan = plan_of(&[1000]);
        let mut r = DownloadRecord::new(&plan);
        assert_eq!(r.files[0].resume().offset(), 0);
        r.files[0].hash = Some(HashCheckpoint { offset: 512, state: [1; 8] });
        r.files[0].done = 100; // checkpoint past what is durable
        assert_eq!(r.files[0].resume().offset(), 0);
        r.files[0].done = 600; // bytes past the checkpoint are re-downloaded
        assert_eq!(r.files[0].resume().offset(), 512);
        r.files[0].hash = Some(HashCheckpoint { offset: 500, state: [1; 8] });
        assert_eq!(r.files[0].resume().offset(), 0);
    }
}
