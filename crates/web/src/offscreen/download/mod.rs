//! Installing the pack from a Hub: a dedicated worker of the offscreen document (only workers can write
//! OPFS files synchronously) that streams each file into the staging slot (`packs/a/` or `packs/b/`, see
//! `imagine_core::storage`), hashing it as it goes.
//!
//! Losing nothing to interruptions rests on one rule: the download record says a prefix of a file is done
//! only after that prefix is flushed to disk and hashed. Every [`CHECKPOINT_BYTES`] the worker flushes the
//! file and asks the hash worker for its state after the bytes written so far; it reads on meanwhile and
//! saves the record when the answer comes (the hash worker is at most [`crate::offscreen::hasher::MAX_LENT`] blocks
//! behind). The worker can therefore be terminated at any instant (pause, cancel, the offscreen document
//! closing, the browser quitting): the next attempt truncates each file to its recorded prefix (a file
//! shorter than that starts over), restores
//! the hash state and asks for the rest with a `Range` request, re-fetching at most a checkpoint interval
//! plus that lag (6 MiB).
//!
//! The record is written alternately to two files with a sequence number, so a write cut short by
//! termination leaves the previous record intact. The pack replaces the installed one only when every
//! file is verified, in one write of `packs/state.json` ([`swap`]).

use std::cell::RefCell;
use std::collections::HashMap;

use futures_channel::oneshot;

use imagine_core::api::{DownloadProgress, DownloadState, InstallRequest, PackPlan, PackSource};
use imagine_core::graph::pack_conversion::{
    converted_graph_name, ConversionRecord, GraphPlan, CONVERSION_STATE_FILE,
};
use imagine_core::graph::reblock::{self, ReblockedGraph, ReblockedRecord};
use imagine_core::graph::Limits;
use imagine_core::hub::{self, DownloadRecord, GraphFiles, HashCheckpoint, HubError, RateMeter};
use imagine_core::message::{arg, cause, ErrorText, Localize, Message};
use js_sys::{ArrayBuffer, Uint8Array};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{spawn_local, JsFuture};
use web_sys::{
    DedicatedWorkerGlobalScope, FileSystemDirectoryHandle, MessageEvent, ReadableStreamByobReader,
    ReadableStreamDefaultReader,
};

use crate::offscreen::convert::{self, ConvertError, ConvertProgress};
use crate::offscreen::hasher::{HashError, HashWorker, HASH_SILENCE_MS, WORKER_LIMIT_FILE};
use crate::platform::gpu::{self, GpuError};
use crate::platform::hub_client::{self, check_status, FetchError, KeptFiles};
use crate::platform::js::{get, now_ms, random_u64, sleep_ms, JsError, LogError};
use crate::platform::opfs::{self, OpfsError, PackRecord, Slot, SyncFile};
use crate::platform::protocol::{self, DownloadCommand, DownloadReport, ProtocolError};

/// Bytes between two checkpoints (flush, then the hash state asked for and saved in the record).
pub const CHECKPOINT_BYTES: u64 = 4 << 20;
mod record;
mod stored_forms;
pub(crate) use stored_forms::remove_form;
mod transfer;

use record::*;
use stored_forms::*;
use transfer::*;

/// Bytes read, written and hashed at once (a multiple of the SHA-256 block, so checkpoints fall on
/// block boundaries).
const WRITE_BYTES: usize = 1 << 20;
/// The two slots of the download record.
const RECORD_SLOTS: [&str; 2] = imagine_core::storage::DOWNLOAD_RECORD_SLOTS;
/// Progress reports are posted at most this often.
const REPORT_EVERY_MS: f64 = 250.0;

/// Why a download stopped. [`DownloadError::is_transient`] says whether the same request again may
/// get further; the download worker retries those itself.
#[derive(Debug, Error)]
pub enum DownloadError {
    /// A bad source, too little space, a file that does not verify.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// Asking the Hub for the revision, the listing or a small file (the plan's requests).
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// An OPFS operation failed (running out of storage is [`DownloadError::NoSpace`]).
    #[error(transparent)]
    Opfs(OpfsError),
    /// The storage quota ran out; the error is [`OpfsError::QuotaExceeded`].
    #[error(
        "not enough storage to continue the download ({0}). What is downloaded is kept: free space on the \
         disk, then resume."
    )]
    NoSpace(OpfsError),
    /// The hash worker failed, or the link to it broke.
    #[error(transparent)]
    Hash(#[from] HashError),
    /// No WebGPU adapter to check the pack against, or a tensor too large for it.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// Converting the float16 graphs to float32 for this GPU failed.
    #[error(transparent)]
    Convert(#[from] ConvertError),
    /// A message from the offscreen document that is not a [`DownloadCommand`], or one that could not
    /// be posted.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// A resumed request answered from another offset (transient).
    #[error("{url} answered a range that does not start at {start}")]
    RangeMismatch {
        /// The file's URL.
        url: String,
        /// The byte the request asked to start from.
        start: u64,
    },
    /// A response without a body (transient).
    #[error("{url} sent no body")]
    NoBody {
        /// The file's URL.
        url: String,
    },
    /// The body of a pack file stopped coming (transient).
    #[error("downloading {path} was interrupted: {source}")]
    Interrupted {
        /// The file's path in the pack.
        path: String,
        /// The failed read's error.
        source: JsError,
    },
    /// The server's file is longer than the listing says.
    #[error(
        "{url} sent more than the {size} bytes the Hub lists for {path}: the server's copy differs from the \
         listing, so the download stopped"
    )]
    TooLong {
        /// The file's URL.
        url: String,
        /// The file's path in the pack.
        path: String,
        /// The size the listing gives, in bytes.
        size: u64,
    },
    /// The server's file is shorter than the listing says.
    #[error(
        "{url} ended {path} after {offset} of the {size} bytes the Hub lists: the server's copy differs from \
         the listing, so the download stopped"
    )]
    TooShort {
        /// The file's URL.
        url: String,
        /// The file's path in the pack.
        path: String,
        /// Where the body ended, in bytes from the file's start.
        offset: u64,
        /// The size the listing gives, in bytes.
        size: u64,
    },
    /// The response's headers announce another length than the listing's.
    #[error(
        "{url} serves {path} as {total} bytes, the Hub lists {size}: the server's copy differs from the \
         listing, so the download stopped"
    )]
    OtherLength {
        /// The file's URL.
        url: String,
        /// The file's path in the pack.
        path: String,
        /// The length the response's headers announce, in bytes.
        total: u64,
        /// The size the listing gives, in bytes.
        size: u64,
    },
    /// Transient failures in a row that saved nothing new; `last` is the last of them.
    #[error(
        "{last}; gave up after {attempts} attempts in a row that saved nothing new (resume to try again)"
    )]
    GaveUp {
        /// The last attempt's failure.
        last: Box<DownloadError>,
        /// How many attempts in a row saved nothing new.
        attempts: u32,
    },
    /// A file downloaded twice that does not match the listing either time.
    #[error("{0}; it failed verification twice, so the download stopped")]
    Corrupt(HubError),
    /// The pack state names another staging slot than the one downloaded into (another context
    /// installed or deleted a pack meanwhile); nothing is swapped.
    #[error("the model storage changed during the download: resume to download again")]
    StorageChanged,
    /// A step of the protocol with the offscreen document that did not happen.
    #[error("internal: {0}")]
    Internal(&'static str),
}

crate::platform::js::loggable_by_display!(DownloadError);

impl From<OpfsError> for DownloadError {
    /// Running out of storage says what to do about it.
    fn from(error: OpfsError) -> Self {
        match error {
            OpfsError::QuotaExceeded { .. } => DownloadError::NoSpace(error),
            error => DownloadError::Opfs(error),
        }
    }
}

impl DownloadError {
    /// Worth retrying after a pause: the network, a 5xx, a 429, a cut or odd response.
    fn is_transient(&self) -> bool {
        match self {
            DownloadError::Fetch(e) => e.is_transient(),
            DownloadError::RangeMismatch { .. }
            | DownloadError::NoBody { .. }
            | DownloadError::Interrupted { .. } => true,
            _ => false,
        }
    }

    /// The hash worker died or hangs: the offscreen document starts the install again, with fresh
    /// workers, from its checkpoint.
    fn lost_worker(&self) -> bool {
        matches!(self, DownloadError::Hash(HashError::Silent { .. } | HashError::Stopped))
    }

    /// The Hub never answered (no connection at all, every attempt): the network is down, so the
    /// service worker tries the download again later by itself.
    fn is_offline(&self) -> bool {
        match self {
            DownloadError::Fetch(FetchError::Unreachable { .. }) => true,
            DownloadError::Fetch(FetchError::GaveUp { last, .. }) => {
                matches!(**last, FetchError::Unreachable { .. })
            }
            DownloadError::GaveUp { last, .. } => last.is_offline(),
            _ => false,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct StoredRecord {
    sequence: u64,
    record: DownloadRecord,
}

/// Entry point of `download-worker.js`: takes [`DownloadCommand`]s, reports [`DownloadReport`]s.
#[wasm_bindgen(js_name = downloadWorkerMain)]
pub fn download_worker_main() {
    let on_message =
        Closure::<dyn FnMut(MessageEvent)>::new(move |event: MessageEvent| {
            match protocol::read::<DownloadCommand>(&event.data()) {
                Ok((DownloadCommand::Install { request }, Some(hash_port))) => spawn_local(async move {
                    match install(request, hash_port.unchecked_into()).await {
                        Ok(pack) => send(&DownloadReport::Installed { pack }),
                        Err(error) => fail(error),
                    }
                }),
                Ok((DownloadCommand::Swap, _)) => allow_swap(),
                Ok((DownloadCommand::StoreReblocked { commit, graphs }, _)) => spawn_local(async move {
                    match store_reblocked(&commit, &graphs).await {
                        Ok(()) => send(&DownloadReport::ReblockedStored),
                        Err(error) => fail(error),
                    }
                }),
                Ok((DownloadCommand::Install { .. }, None)) => {
                    fail(DownloadError::Internal("no port to the hash worker"))
                }
                Err(error) => fail(error.into()),
            }
        });
    let scope: DedicatedWorkerGlobalScope = js_sys::global().unchecked_into();
    scope.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    // The worker lives exactly as long as this handler.
    on_message.forget();
}

/// Reports to the offscreen document.
fn send(report: &DownloadReport) {
    let scope: DedicatedWorkerGlobalScope = js_sys::global().unchecked_into();
    if let Err(e) = protocol::post(&scope, report, None) {
        web_sys::console::error_1(&e.to_string().into());
    }
}

/// Reports why the download stopped: the one place its error becomes text.
fn fail(error: DownloadError) {
    send(&DownloadReport::Failed {
        error: ErrorText::of(&error),
        offline: error.is_offline(),
        restart: error.lost_worker(),
    });
}

/// Runs (or resumes) an install; the installed pack's record. `hash_port` links to the hash worker.
/// Its steps in the order they must happen; each of more than a few lines is a function of its own.
async fn install(
    request: InstallRequest,
    hash_port: web_sys::MessagePort,
) -> Result<PackRecord, DownloadError> {
    let source = request.source().validate()?;
    let mut report = Reporter::new();

    let staging = opfs::pack_state().await?.staging;
    let mut store = RecordStore::load(staging).await;
    let verified_small_files = store.kept_small_files(staging).await;
    // What was fetched (a verified pack waiting for its swap, say) is never discarded because the
    // revision moved meanwhile: the download goes on at its commit.
    let pinned =
        store.record.as_ref().filter(|r| r.source == source && r.done_bytes() > 0).map(|r| r.commit.clone());
    let (plan, graphs) = hub_client::plan(&source, pinned.as_deref(), &verified_small_files).await?;
    let webgpu = request.backend.as_deref() != Some("wasm");
    let conversion = if webgpu { conversion_for_this_gpu(&graphs, &plan).await? } else { None };
    // The graphs WebGPU stages will load, re-blocked and stored once the files they read are there.
    let reblocked_graphs = if webgpu {
        webgpu_graphs(&graphs, conversion.as_ref().map(|(plans, _)| plans.as_slice()))
    } else {
        Vec::new()
    };
    if let Some(installed) = installed_already(&plan, &conversion).await? {
        // This very pack is installed (a swap was interrupted after the state was written, or the same
        // commit was asked for again): nothing to download, and what is staged is not needed.
        drop(store);
        opfs::clear_slot(staging).await?;
        return Ok(installed);
    }
    let resumable = store.record.take().filter(|record| record.matches(&plan));
    let fresh = resumable.as_ref().is_none_or(|record| record.done_bytes() == 0);
    let mut record = resumable.unwrap_or_else(|| DownloadRecord::new(&plan));
    report.record(&record);

    if fresh {
        // A pack is never a mix of two revisions: nothing of another commit is kept. Removed before the
        // space check, which would otherwise count what the extension itself frees.
        opfs::clear_slot(staging).await?;
        store.sequence = 0;
    }
    let made_here =
        bytes_made_after_download(staging, &record, &graphs, &plan, &conversion, &reblocked_graphs).await?;
    check_room(record.remaining_bytes() + made_here).await?;
    let dir = opfs::slot_dir(staging, true).await?;
    store_fetched_graphs(&dir, &mut record, &graphs).await?;
    report.state = DownloadState::Downloading;
    let silence_ms = opfs::test_setting_u64(WORKER_LIMIT_FILE).await.unwrap_or(HASH_SILENCE_MS);
    let hasher = HashWorker::connect(hash_port, WRITE_BYTES as u32, silence_ms);
    let mut download = Download { dir, source, record, store, report, hasher };
    download.save().await?;
    download.report.record(&download.record);
    download.files().await?;
    // Closes the record files, which the swap removes.
    download.store.slots = None;
    let reblocked_graphs = webgpu.then(|| reblocked_graphs.into_iter().map(|(name, _)| name).collect());
    download.finish(staging, conversion, reblocked_graphs).await
}

/// The installed pack, where it is `plan`'s, converted as `conversion` asks (an installed pack
/// converted for other limits, or not converted, is not what this adapter runs).
async fn installed_already(
    plan: &PackPlan,
    conversion: &Option<(Vec<GraphPlan>, Limits)>,
) -> Result<Option<PackRecord>, DownloadError> {
    let converted_as_needed = |installed: &PackRecord| match conversion {
        None => true,
        Some((_, limits)) => installed.conversion.as_ref().is_some_and(|c| c.limits == *limits),
    };
    Ok(opfs::pack_state()
        .await?
        .installed
        .filter(|installed| installed.matches(plan) && converted_as_needed(installed)))
}

/// Refuses a download for which the disk has no room for the `bytes` still to write: what it has
/// left, and what is made from it after it (conversion, re-blocked forms).
async fn check_room(bytes: u64) -> Result<(), DownloadError> {
    let usage = opfs::storage_use().await?;
    hub::check_space(bytes, usage.usage_bytes, usage.quota_bytes)?;
    Ok(())
}

impl Download {
    /// Downloads every file not verified yet, in the listing's order.
    async fn files(&mut self) -> Result<(), DownloadError> {
        for index in 0..self.record.files.len() {
            if !self.record.files[index].verified {
                self.file(index).await?;
            }
        }
        Ok(())
    }

    /// After the last file is verified: the float32 conversion where `conversion` asks for it, the
    /// re-blocked forms of `reblocked_graphs` (WebGPU only) stored, then the swap, once no job runs.
    async fn finish(
        mut self,
        staging: Slot,
        conversion: Option<(Vec<GraphPlan>, Limits)>,
        reblocked_graphs: Option<Vec<String>>,
    ) -> Result<PackRecord, DownloadError> {
        let converted = match &conversion {
            Some((plans, limits)) => {
                let (source, commit) = (self.record.source.clone(), self.record.commit.clone());
                let reporter = &mut self.report;
                let record = convert::convert(&self.dir, &commit, plans, *limits, |p| {
                    reporter.converting(&source, &commit, p)
                })
                .await?;
                Some(record)
            }
            None => None,
        };
        self.report.state = DownloadState::Installing;
        self.report.record(&self.record);
        let block32 = match reblocked_graphs {
            Some(names) => Some(stored_forms::store(&self.dir, &names).await?),
            None => None,
        };
        // A generation may be reading the installed pack: the offscreen document lets the new one
        // replace it only once no job runs, and holds the next jobs until it has.
        let (allow, allowed) = oneshot::channel();
        SWAP_ALLOWED.with_borrow_mut(|slot| *slot = Some(allow));
        send(&DownloadReport::SwapReady);
        allowed.await.map_err(|_| DownloadError::Internal("the pack swap was never allowed"))?;
        swap(staging, &self.record, converted, block32).await
    }
}

/// What the float16 graphs become on this GPU, checked before the first byte is written: for an
/// adapter without shader-f16, the plans of their rewrite to float32 and the limits they are for
/// (refused here, naming the node, when the rewrite cannot do it); `None` where they run as they are.
async fn conversion_for_this_gpu(
    graphs: &[GraphFiles],
    plan: &PackPlan,
) -> Result<Option<(Vec<GraphPlan>, Limits)>, DownloadError> {
    let adapter = gpu::adapter_info().await?;
    let (needs_f16, largest) = hub_client::device_needs(graphs)?;
    gpu::check_limits(adapter.limits, largest)?;
    Ok(if needs_f16 && !adapter.has_f16 {
        Some((hub_client::conversion_plans(graphs, plan, adapter.limits)?, adapter.limits))
    } else {
        None
    })
}

/// The bytes the install writes beyond the downloaded files: what the float32 conversion adds (less
/// what an earlier attempt converted, which the usage counts already) and the stored re-blocked forms
/// (what an interrupted attempt stored is removed, to be made again, before the space check counts it).
async fn bytes_made_after_download(
    staging: Slot,
    record: &DownloadRecord,
    graphs: &[GraphFiles],
    plan: &PackPlan,
    conversion: &Option<(Vec<GraphPlan>, Limits)>,
    reblocked_graphs: &[(String, Vec<u8>)],
) -> Result<u64, DownloadError> {
    let converted_bytes = match conversion {
        Some((plans, limits)) => {
            let cost = hub_client::conversion_cost(graphs, plan, plans).extra_disk_bytes;
            let written = match opfs::slot_dir(staging, false).await {
                Ok(dir) => convert::written_bytes(&dir, &record.commit, plans, *limits).await,
                Err(_) => 0,
            };
            cost.saturating_sub(written)
        }
        None => 0,
    };
    let mut reblocked_bytes = 0;
    for (name, model) in reblocked_graphs {
        reblocked_bytes += reblock::stored_bytes(name, model).map_err(ConvertError::from)?;
    }
    if let Ok(dir) = opfs::slot_dir(staging, false).await {
        for (name, _) in reblocked_graphs {
            let (onnx, data) = ReblockedGraph::names(name);
            for file in [onnx, data] {
                opfs::remove(&dir, &file).await?;
            }
        }
    }
    Ok(converted_bytes + reblocked_bytes)
}

/// Stores the graphs and manifests, fetched and verified while planning, that `record` still lacks.
async fn store_fetched_graphs(
    dir: &web_sys::FileSystemDirectoryHandle,
    record: &mut DownloadRecord,
    graphs: &[GraphFiles],
) -> Result<(), DownloadError> {
    let small: HashMap<String, &[u8]> = graphs
        .iter()
        .flat_map(|g| {
            let onnx = (g.graph.file_name(), g.onnx.as_slice());
            let manifest = g.manifest.as_deref().map(|m| (g.graph.manifest_name(), m));
            std::iter::once(onnx).chain(manifest)
        })
        .collect();
    for file in record.files.iter_mut().filter(|f| !f.verified) {
        if let Some(bytes) = small.get(&file.file.path) {
            let sync = SyncFile::create(dir, &file.file.path).await?;
            sync.write_at(bytes, 0)?;
            sync.close()?;
            file.done = file.file.size;
            file.verified = true;
        }
    }
    Ok(())
}

impl Localize for DownloadError {
    fn message(&self) -> Message {
        match self {
            DownloadError::Hub(e) => e.message(),
            DownloadError::Fetch(e) => e.message(),
            DownloadError::Opfs(e) => e.message(),
            DownloadError::NoSpace(e) => Message::new("errDownloadNoSpace", [cause(e)]),
            DownloadError::Hash(e) => e.message(),
            DownloadError::Gpu(e) => e.message(),
            DownloadError::Convert(e) => e.message(),
            DownloadError::Protocol(e) => e.message(),
            DownloadError::RangeMismatch { url, start } => {
                Message::new("errDownloadRangeMismatch", [arg(url), arg(start)])
            }
            DownloadError::NoBody { url } => Message::new("errDownloadNoBody", [arg(url)]),
            DownloadError::Interrupted { path, source } => {
                Message::new("errInterrupted", [arg(path), arg(source)])
            }
            DownloadError::TooLong { url, path, size } => {
                Message::new("errDownloadTooLong", [arg(url), arg(size), arg(path)])
            }
            DownloadError::TooShort { url, path, offset, size } => {
                Message::new("errDownloadTooShort", [arg(url), arg(path), arg(offset), arg(size)])
            }
            DownloadError::OtherLength { url, path, total, size } => {
                Message::new("errDownloadOtherLength", [arg(url), arg(path), arg(total), arg(size)])
            }
            DownloadError::GaveUp { last, attempts } => {
                Message::new("errDownloadGaveUp", [cause(last.as_ref()), arg(attempts)])
            }
            DownloadError::Corrupt(e) => Message::new("errDownloadCorrupt", [cause(e)]),
            DownloadError::StorageChanged => Message::new("errDownloadStorageChanged", []),
            DownloadError::Internal(_) => Message::text(self),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::opfs::Op;

    fn js(message: &str) -> JsError {
        JsError { name: None, message: message.into() }
    }

    #[test]
    fn running_out_of_storage_says_what_to_do() {
        let short = OpfsError::QuotaExceeded {
            op: Op::Write,
            name: "shard.bin".into(),
            detail: "only 3 of 5 bytes were written".into(),
        };
        assert_eq!(
            DownloadError::from(short).to_string(),
            "not enough storage to continue the download (writing shard.bin: only 3 of 5 bytes were written). \
             What is downloaded is kept: free space on the disk, then resume."
        );
        let other = OpfsError::Failed { op: Op::Flush, name: "shard.bin".into(), source: js("gone") };
        assert_eq!(DownloadError::from(other).to_string(), "flushing shard.bin: gone");
    }

    #[test]
    fn retrying_is_for_the_network_and_the_server() {
        let http = |status| DownloadError::Fetch(FetchError::Http { url: "u".into(), status });
        assert!(http(503).is_transient());
        assert!(http(429).is_transient());
        assert!(!http(403).is_transient());
        assert!(!DownloadError::Fetch(FetchError::NotFound { url: "u".into() }).is_transient());
        assert!(DownloadError::NoBody { url: "u".into() }.is_transient());
        let longer = DownloadError::TooLong { url: "u".into(), path: "p".into(), size: 1 };
        assert!(!longer.is_transient());
    }

    #[test]
    fn giving_up_names_the_last_failure() {
        let last = DownloadError::Interrupted { path: "x/shard.bin".into(), source: js("network error") };
        let gave_up = DownloadError::GaveUp { last: Box::new(last), attempts: 6 };
        assert_eq!(
            gave_up.to_string(),
            "downloading x/shard.bin was interrupted: network error; gave up after 6 attempts in a row that \
             saved nothing new (resume to try again)"
        );
        assert!(!gave_up.is_transient());
    }

    #[test]
    fn another_length_names_both() {
        let error =
            DownloadError::OtherLength { url: "u".into(), path: "shard.bin".into(), total: 12, size: 10 };
        assert_eq!(
            error.to_string(),
            "u serves shard.bin as 12 bytes, the Hub lists 10: the server's copy differs from the listing, so \
             the download stopped"
        );
    }
}
