//! The messages about the model's pack: where it is downloaded from, what it holds, how far its
//! download is.

use serde::{Deserialize, Serialize};

use crate::message::Message;

/// `installPack`: the source (each field defaults to [`PackSource::default`]'s), and the backend the
/// pack is meant for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct InstallRequest {
    pub endpoint: String,
    pub repo: String,
    pub revision: String,
    /// `webgpu` (default): the device is checked before anything is downloaded (WebGPU adapter,
    /// `shader-f16` for float16 graphs, buffer size). `wasm`: the pack will run on the CPU backend,
    /// so the GPU checks are skipped.
    pub backend: Option<String>,
}

impl Default for InstallRequest {
    fn default() -> Self {
        InstallRequest::new(PackSource::default(), None)
    }
}

impl InstallRequest {
    /// An install of `source` for `backend`.
    pub fn new(source: PackSource, backend: Option<String>) -> Self {
        let PackSource { endpoint, repo, revision } = source;
        InstallRequest { endpoint, repo, revision, backend }
    }

    /// Where the pack comes from.
    pub fn source(&self) -> PackSource {
        PackSource {
            endpoint: self.endpoint.clone(),
            repo: self.repo.clone(),
            revision: self.revision.clone(),
        }
    }
}

/// Where a pack comes from: a model repo on a Hugging Face Hub (or a mirror with the same API).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct PackSource {
    /// The Hub's base URL.
    pub endpoint: String,
    /// `owner/name`.
    pub repo: String,
    /// A branch, tag or commit; resolved to a commit before anything is downloaded.
    pub revision: String,
}

impl Default for PackSource {
    fn default() -> Self {
        PackSource {
            endpoint: "https://huggingface.co".into(),
            repo: "cgb/flux2-klein-4b-onnx-webgpu".into(),
            revision: "main".into(),
        }
    }
}

/// One file of a pack, as the Hub lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackFile {
    pub path: String,
    pub size: u64,
    /// Lowercase hex SHA-256 (LFS files).
    pub sha256: Option<String>,
    /// The git blob id (lowercase hex SHA-1; files stored in git).
    pub git_oid: Option<String>,
}

/// What an install downloads: every file at one commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackPlan {
    pub source: PackSource,
    /// The commit the revision resolved to.
    pub commit: String,
    pub files: Vec<PackFile>,
    pub total_bytes: u64,
    /// What running this pack in float32 costs on this GPU, which lacks `shader-f16`; absent when the
    /// pack runs as it is (or no WebGPU adapter could be asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversion: Option<ConversionCost>,
}

/// The cost of converting a float16 pack to float32 for an adapter without `shader-f16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConversionCost {
    /// Bytes the converted graphs and tensors add on disk, beside the pack.
    pub extra_disk_bytes: u64,
    /// Weights of the largest stage on the GPU in float32 (one stage runs at a time; activations come
    /// on top).
    pub gpu_bytes: u64,
}

/// Bytes used and available to the extension (`navigator.storage.estimate`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageUse {
    pub usage_bytes: u64,
    pub quota_bytes: u64,
}

/// `packStatus`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackStatus {
    pub installed: bool,
    /// Where the installed pack came from.
    pub source: Option<PackSource>,
    /// The commit of the installed pack.
    pub commit: Option<String>,
    /// Bytes of the installed pack.
    pub bytes: u64,
    /// Bytes its float32 conversion added on disk, when it was converted (an adapter without
    /// `shader-f16`).
    #[serde(default)]
    pub converted_bytes: Option<u64>,
    /// Bytes of the graphs re-blocked to 32 stored beside it for WebGPU (`<stem>.b32.onnx`,
    /// `<stem>.b32.data`), when it has any. Its JSON name is the one the message API has always had.
    #[serde(default, rename = "block32Bytes")]
    pub reblocked_bytes: Option<u64>,
    pub storage: StorageUse,
    /// A download that is running, paused or failed (resumable), if any.
    pub download: Option<DownloadProgress>,
}

/// Where a download is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DownloadState {
    /// Resolving the revision, listing files, checking storage and the device.
    Checking,
    Downloading,
    /// Every file is verified; the float16 graphs are being converted to float32 for this GPU, which
    /// lacks `shader-f16` (`doneBytes` of `totalBytes` written).
    Converting,
    /// Every file is verified (and converted where needed); the pack replaces the installed one as soon as no image is being made.
    Installing,
    Paused,
    /// Stopped by an error; `resumePack` continues from what was kept.
    Failed,
}

impl DownloadState {
    /// Whether the download's worker is at work (not paused, not stopped by an error).
    pub fn is_active(self) -> bool {
        matches!(
            self,
            DownloadState::Checking
                | DownloadState::Downloading
                | DownloadState::Converting
                | DownloadState::Installing
        )
    }
}

/// Progress of one file of a download.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileProgress {
    pub path: String,
    pub size: u64,
    pub done_bytes: u64,
    /// Size and hash checked.
    pub verified: bool,
}

/// Progress of a pack download (`packStatus.download` and the `packProgress` event).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownloadProgress {
    pub state: DownloadState,
    pub source: PackSource,
    pub commit: Option<String>,
    pub total_bytes: u64,
    pub done_bytes: u64,
    pub files: Vec<FileProgress>,
    /// Recent download rate.
    pub bytes_per_second: f64,
    /// At the recent rate; `None` before there is one.
    pub seconds_left: Option<f64>,
    /// Why the download failed (state `failed`).
    pub error: Option<String>,
    /// The same, as a `_locales` message for the page's language.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
}
