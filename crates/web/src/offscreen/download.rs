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

use imagine_core::api::{DownloadProgress, DownloadState, InstallRequest, PackSource};
use imagine_core::f32_rewrite::pack_conversion::{
    converted_graph_name, ConversionRecord, GraphPlan, CONVERSION_STATE_FILE,
};
use imagine_core::hub::{self, DownloadRecord, GraphFiles, HashCheckpoint, HubError, RateMeter};
use imagine_core::matmul_blocks::{self, Block32Graph, Block32Record};
use imagine_core::message::ErrorText;
use js_sys::{ArrayBuffer, Uint8Array};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{spawn_local, JsFuture};
use web_sys::{
    DedicatedWorkerGlobalScope, FileSystemDirectoryHandle, MessageEvent, ReadableStreamByobReader,
    ReadableStreamDefaultReader,
};

use crate::offscreen::block32;
use crate::offscreen::convert::{self, ConvertError, ConvertProgress};
use crate::offscreen::hasher::{HashError, HashWorker, HASH_SILENCE_MS, WORKER_LIMIT_FILE};
use crate::platform::gpu::{self, GpuError};
use crate::platform::hub_client::{self, check_status, FetchError, KeptFiles};
use crate::platform::js::{get, now_ms, random_u64, sleep_ms, JsError, LogError};
use crate::platform::opfs::{self, OpfsError, PackRecord, Slot, SyncFile};
use crate::platform::protocol::{self, DownloadCommand, DownloadReport, ProtocolError};

/// Bytes between two checkpoints (flush, then the hash state asked for and saved in the record).
pub const CHECKPOINT_BYTES: u64 = 4 << 20;
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
                Ok((DownloadCommand::StoreBlock32 { commit, graphs }, _)) => spawn_local(async move {
                    match store_block32(&commit, &graphs).await {
                        Ok(()) => send(&DownloadReport::Block32Stored),
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
    // Everything about the device is checked before the first byte is written: an adapter without
    // shader-f16 gets the float16 graphs rewritten to float32 (refused here, naming the node, when the
    // rewrite cannot do it).
    let mut conversion = None;
    let webgpu = request.backend.as_deref() != Some("wasm");
    if webgpu {
        let adapter = gpu::adapter_info().await?;
        let (needs_f16, largest) = hub_client::device_needs(&graphs)?;
        gpu::check_limits(adapter.limits, largest)?;
        if needs_f16 && !adapter.has_f16 {
            conversion =
                Some((hub_client::conversion_plans(&graphs, &plan, adapter.limits)?, adapter.limits));
        }
    }
    // The graphs WebGPU stages will load, re-blocked and stored once the files they read are there.
    let block32_graphs = if webgpu {
        webgpu_graphs(&graphs, conversion.as_ref().map(|(plans, _)| plans.as_slice()))
    } else {
        Vec::new()
    };
    // An installed pack converted for other limits (or not converted) is not what this adapter runs.
    let converted_as_needed = |installed: &PackRecord| match &conversion {
        None => true,
        Some((_, limits)) => installed.conversion.as_ref().is_some_and(|c| c.limits == *limits),
    };
    if let Some(installed) = opfs::pack_state()
        .await?
        .installed
        .filter(|installed| installed.matches(&plan) && converted_as_needed(installed))
    {
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
    let converted_bytes = match &conversion {
        Some((plans, limits)) => {
            let cost = hub_client::conversion_cost(&graphs, &plan, plans).extra_disk_bytes;
            // What an earlier attempt converted is on disk, so in the usage, already.
            let written = match opfs::slot_dir(staging, false).await {
                Ok(dir) => convert::written_bytes(&dir, &record.commit, plans, *limits).await,
                Err(_) => 0,
            };
            cost.saturating_sub(written)
        }
        None => 0,
    };
    let mut block32_bytes = 0;
    for (name, model) in &block32_graphs {
        block32_bytes += matmul_blocks::stored_bytes(name, model).map_err(ConvertError::from)?;
    }
    if let Ok(dir) = opfs::slot_dir(staging, false).await {
        // What an interrupted attempt stored is made again: removed before the space check counts it.
        for (name, _) in &block32_graphs {
            let (onnx, data) = Block32Graph::names(name);
            for file in [onnx, data] {
                opfs::remove(&dir, &file).await?;
            }
        }
    }
    let usage = opfs::storage_use().await?;
    hub::check_space(
        record.remaining_bytes() + converted_bytes + block32_bytes,
        usage.usage_bytes,
        usage.quota_bytes,
    )?;
    let dir = opfs::slot_dir(staging, true).await?;
    // The graphs and manifests were fetched and verified while planning; store them now.
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
            let sync = SyncFile::create(&dir, &file.file.path).await?;
            sync.write_at(bytes, 0)?;
            sync.close()?;
            file.done = file.file.size;
            file.verified = true;
        }
    }
    report.state = DownloadState::Downloading;
    let silence_ms = opfs::test_setting_u64(WORKER_LIMIT_FILE).await.unwrap_or(HASH_SILENCE_MS);
    let hasher = HashWorker::connect(hash_port, WRITE_BYTES as u32, silence_ms);
    let mut download = Download { dir, source, record, store, report, hasher };
    download.save().await?;
    download.report.record(&download.record);
    for index in 0..download.record.files.len() {
        if !download.record.files[index].verified {
            download.file(index).await?;
        }
    }
    // Closes the record files, which the swap removes.
    download.store.slots = None;
    let converted = match &conversion {
        Some((plans, limits)) => {
            let (source, commit) = (download.record.source.clone(), download.record.commit.clone());
            let reporter = &mut download.report;
            let record = convert::convert(&download.dir, &commit, plans, *limits, |p| {
                reporter.converting(&source, &commit, p)
            })
            .await?;
            Some(record)
        }
        None => None,
    };
    download.report.state = DownloadState::Installing;
    download.report.record(&download.record);
    let block32 = if webgpu {
        let names: Vec<String> = block32_graphs.into_iter().map(|(name, _)| name).collect();
        Some(block32::store(&download.dir, &names).await?)
    } else {
        None
    };
    // A generation may be reading the installed pack: the offscreen document lets the new one replace
    // it only once no job runs, and holds the next jobs until it has.
    let (allow, allowed) = oneshot::channel();
    SWAP_ALLOWED.with_borrow_mut(|slot| *slot = Some(allow));
    send(&DownloadReport::SwapReady);
    allowed.await.map_err(|_| DownloadError::Internal("the pack swap was never allowed"))?;
    swap(staging, &download.record, converted, block32).await
}

/// Stores the re-blocked forms of `graphs` with the installed pack `commit` and adds them to its record,
/// for graphs a stage had to re-block while loading: a pack installed by an older version, one
/// converted for an adapter that has since gained `shader-f16`, or a stored form the stage found
/// damaged (its record entry is dropped first, then it is made again). Jobs may run meanwhile: the new
/// files are read by no one until the record names them. Too little space is refused before anything
/// is written, and what a failure leaves half-written is removed. The record is changed in one write of
/// the state, holding the state's lock ([`opfs::lock_pack_state`]), and only while `commit` is still
/// installed: a pack swapped or deleted meanwhile is never brought back.
async fn store_block32(commit: &str, graphs: &[String]) -> Result<(), DownloadError> {
    let Some((installed, dir)) = opfs::installed_pack().await.filter(|(p, _)| p.commit == commit) else {
        return Ok(());
    };
    let have = installed.block32.unwrap_or_default();
    let todo: Vec<String> = graphs.iter().filter(|g| !have.unchanged.contains(g)).cloned().collect();
    if todo.is_empty() {
        return Ok(());
    }
    // A graph the record names that a stage re-blocked all the same was found damaged: the record stops
    // naming it before its files are written again.
    if todo.iter().any(|g| have.graph(g).is_some())
        && !change_block32(commit, |record| record.graphs.retain(|g| !todo.contains(&g.graph))).await?
    {
        return Ok(());
    }
    let mut needed = 0;
    for graph in &todo {
        let model = opfs::read(&dir, graph).await?;
        needed += matmul_blocks::stored_bytes(graph, &model).map_err(ConvertError::from)?;
        // What a damaged form or an interrupted store left is not counted as used.
        block32::remove_form(&dir, graph).await;
    }
    let usage = opfs::storage_use().await?;
    hub::check_space(needed, usage.usage_bytes, usage.quota_bytes)?;
    let stored = block32::store(&dir, &todo).await?;
    let recorded = change_block32(commit, |record| {
        record.graphs.retain(|g| stored.graph(&g.graph).is_none());
        record.graphs.extend(stored.graphs.iter().cloned());
        record.unchanged.retain(|g| !stored.unchanged.contains(g));
        record.unchanged.extend(stored.unchanged.iter().cloned());
    })
    .await?;
    if !recorded {
        // Another pack was installed meanwhile: its files are not these.
        for graph in &todo {
            block32::remove_form(&dir, graph).await;
        }
    }
    Ok(())
}

/// Changes the record of stored forms of the installed pack `commit` in one write of the state, holding
/// the state's lock; `false` (and nothing written) when that pack is not installed any more.
async fn change_block32(
    commit: &str,
    change: impl FnOnce(&mut Block32Record),
) -> Result<bool, DownloadError> {
    let _lock = opfs::lock_pack_state().await;
    let state = opfs::pack_state().await?;
    let Some(mut installed) = state.installed.clone().filter(|p| p.commit == commit) else {
        return Ok(false);
    };
    change(installed.block32.get_or_insert_with(Block32Record::default));
    opfs::write_pack_state(&opfs::PackState { installed: Some(installed), ..state }).await?;
    Ok(true)
}

/// Each graph of the pack as a WebGPU stage will load it (its float32 conversion where `plans` has
/// one), by file name.
fn webgpu_graphs(graphs: &[GraphFiles], plans: Option<&[GraphPlan]>) -> Vec<(String, Vec<u8>)> {
    graphs
        .iter()
        .map(|g| match plans.and_then(|plans| plans.iter().find(|p| p.graph == g.graph)) {
            Some(plan) => (converted_graph_name(plan.graph), plan.rewrite.graph.clone()),
            None => (g.graph.file_name(), g.onnx.clone()),
        })
        .collect()
}

thread_local! {
    /// Answered when the offscreen document allows the swap ([`DownloadCommand::Swap`]).
    static SWAP_ALLOWED: RefCell<Option<oneshot::Sender<()>>> = const { RefCell::new(None) };
}

/// No job runs: the verified pack may replace the installed one.
fn allow_swap() {
    if let Some(allow) = SWAP_ALLOWED.with_borrow_mut(Option::take) {
        let _ = allow.send(());
    }
}

/// A download under way: where its files go, its record, and its progress reports.
struct Download {
    dir: FileSystemDirectoryHandle,
    source: PackSource,
    record: DownloadRecord,
    store: RecordStore,
    report: Reporter,
    hasher: HashWorker,
}

impl Download {
    async fn save(&mut self) -> Result<(), DownloadError> {
        Ok(self.store.save(&self.dir, &self.record).await?)
    }

    /// Streams file `index`, resuming from its recorded prefix, until it is verified.
    async fn file(&mut self, index: usize) -> Result<(), DownloadError> {
        let planned = self.record.files[index].file.clone();
        let url = hub::resolve_url(&self.source, &self.record.commit, &planned.path);
        let mut mismatches = 0;
        let mut failures = 0;
        loop {
            let file = SyncFile::open(&self.dir, &planned.path).await?;
            // Bytes past the last checkpoint are never trusted: the file is cut back to it. A file shorter
            // than its checkpoint lost bytes the record counts, so it starts over.
            let mut checkpoint = self.record.files[index].resume().checkpoint().filter(|c| c.offset > 0);
            let on_disk = file.size()?;
            if checkpoint.as_ref().is_some_and(|c| c.offset > on_disk) {
                self.record.files[index].restart();
                self.save().await?;
                checkpoint = None;
            }
            let start = checkpoint.as_ref().map_or(0, |c| c.offset);
            let saved_before = saved_offset(&self.record.files[index]);
            self.hasher.reset(checkpoint.as_ref()).await?;
            self.record.files[index].done = start;
            file.truncate(start)?;
            match self.stream(&file, &url, start, index).await {
                Ok(()) => {}
                Err(error) if !error.is_transient() => return Err(error),
                Err(error) => {
                    // Progress is a checkpoint saved further on: a server that always cuts the response
                    // before the next checkpoint makes none, however many bytes it sends.
                    let progressed = saved_offset(&self.record.files[index]) > saved_before;
                    failures = if progressed { 1 } else { failures + 1 };
                    if failures >= hub::MAX_ATTEMPTS_WITHOUT_PROGRESS {
                        return Err(DownloadError::GaveUp { last: Box::new(error), attempts: failures });
                    }
                    drop(file);
                    sleep_ms(hub::backoff_ms(failures - 1, random_unit())).await;
                    continue;
                }
            }
            let mut digest = self.hasher.finish().await?;
            if self.record.files[index].restarted {
                let mut hasher = hub::ResumableSha256::new();
                read_on_disk(&file, planned.size, |bytes| hasher.update(bytes))?;
                digest = hasher.finalize();
            }
            let mut verified = hub::verify_sha256(&planned, &digest);
            if planned.sha256.is_none() {
                // A file stored in git (no LFS SHA-256) is checked by its git blob id, read back from disk.
                let mut hasher = hub::GitBlobHasher::new(planned.size);
                read_on_disk(&file, planned.size, |bytes| hasher.update(bytes))?;
                verified = hub::verify_git_oid(&planned, &hasher.finalize());
            }
            if let Err(mismatch) = verified {
                // A corrupt file is downloaded again once, from the start. The record says so before the
                // file is cut.
                mismatches += 1;
                self.record.files[index].restart();
                self.save().await?;
                file.truncate(0)?;
                drop(file);
                if mismatches > 1 {
                    return Err(DownloadError::Corrupt(mismatch));
                }
                continue;
            }
            let entry = &mut self.record.files[index];
            entry.verified = true;
            entry.done = planned.size;
            entry.hash = None;
            file.close()?;
            self.save().await?;
            self.report.record(&self.record);
            return Ok(());
        }
    }

    /// One request: appends the response to `file` from `start`, saving the record every checkpoint.
    /// A 200 where a range was asked for restarts the file.
    async fn stream(
        &mut self,
        file: &SyncFile,
        url: &str,
        start: u64,
        index: usize,
    ) -> Result<(), DownloadError> {
        let (path, size) = (self.record.files[index].file.path.clone(), self.record.files[index].file.size);
        if start == size {
            // Every byte was saved before an interruption; only the verification is left.
            return Ok(());
        }
        let (response, mut watch) = hub_client::fetch(url, (start > 0).then_some(start)).await?;
        check_status(&response, url)?;
        check_length(&response, url, &path, size)?;
        let mut offset = start;
        if start > 0 {
            let range = response.headers().get("content-range").ok().flatten();
            if response.status() == 206 && !range.as_deref().is_some_and(|r| hub::range_matches(r, start)) {
                return Err(DownloadError::RangeMismatch { url: url.to_owned(), start });
            }
            if response.status() != 206 {
                // The whole file again: the record says so before the file is cut, so it never describes
                // bytes the file does not hold.
                offset = 0;
                self.record.files[index].restart();
                self.save().await?;
                self.hasher.reset(None).await?;
                file.truncate(0)?;
            }
        }
        let mut ends_early = range_ends_early(&response, size);
        let body = response.body().ok_or_else(|| DownloadError::NoBody { url: url.to_owned() })?;
        let mut reader = BodyReader::new(body);
        let mut asked_at = offset;
        let result = loop {
            let buffer = self.hasher.buffer().await?;
            let (buffer, length, more) = match reader.fill(buffer, &watch).await {
                Ok(block) => block,
                Err(e) => {
                    break Err(match watch.stall(url) {
                        Some(stalled) => stalled.into(),
                        None => DownloadError::Interrupted { path: path.clone(), source: e.into() },
                    })
                }
            };
            if length > 0 {
                if offset + u64::from(length) > size {
                    break Err(DownloadError::TooLong { url: url.to_owned(), path: path.clone(), size });
                }
                let block = Uint8Array::new_with_byte_offset_and_length(&buffer, 0, length);
                if let Err(e) = file.write_js_at(&block, offset) {
                    break Err(e.into());
                }
                self.hasher.hash(buffer, length)?;
                offset += u64::from(length);
                self.record.files[index].done = offset;
            } else {
                self.hasher.give_back(buffer);
            }
            // A checkpoint is asked for once the bytes it will cover are flushed; the download goes on
            // while the hash worker catches up, and the record is saved when the answer comes.
            if offset - asked_at >= CHECKPOINT_BYTES && !self.hasher.checkpoint_asked() {
                if let Err(e) = file.flush() {
                    break Err(e.into());
                }
                self.hasher.ask_checkpoint()?;
                asked_at = offset;
            }
            if let Some(checkpoint) = self.hasher.take_checkpoint()? {
                if let Err(e) = self.save_checkpoint(index, checkpoint).await {
                    break Err(e);
                }
            }
            self.report.maybe(&self.record);
            if !more {
                if offset == size {
                    break Ok(());
                }
                // A 206 of part of the range asked for came whole: the rest is asked for from there.
                if ends_early == Some(offset) {
                    match continue_from(url, &path, size, offset).await {
                        Ok((next_reader, next_watch, next_end)) => {
                            (reader, watch, ends_early) = (next_reader, next_watch, next_end);
                            continue;
                        }
                        Err(e) => break Err(e),
                    }
                }
                // Any other body that ends cleanly is the server's whole answer: asking again gets the same.
                break Err(DownloadError::TooShort { url: url.to_owned(), path: path.clone(), offset, size });
            }
        };
        if result.is_err() {
            reader.cancel();
            // The checkpoint asked for before the failure covers bytes already on disk: keep them if
            // it can be saved (the failure is what gets reported either way).
            if self.hasher.checkpoint_asked() {
                if let Ok(checkpoint) = self.hasher.wait_checkpoint().await {
                    self.save_checkpoint(index, checkpoint)
                        .await
                        .warn_on_error("saving the checkpoint before the failure");
                }
            }
        }
        result
    }

    /// Saves the record with file `index` done up to `checkpoint`.
    async fn save_checkpoint(
        &mut self,
        index: usize,
        checkpoint: HashCheckpoint,
    ) -> Result<(), DownloadError> {
        let entry = &mut self.record.files[index];
        let done = entry.done;
        entry.save(checkpoint);
        let saved = self.save().await;
        self.record.files[index].done = done;
        saved
    }
}

/// The next request of a file whose last response was a 206 that stopped at `offset`, before its end:
/// the body from `offset` on, its watch, and where its own range stops early. Only a 206 from `offset`
/// is taken; anything else fails (transiently), and the file goes on from its last checkpoint.
async fn continue_from(
    url: &str,
    path: &str,
    size: u64,
    offset: u64,
) -> Result<(BodyReader, hub_client::IdleWatch, Option<u64>), DownloadError> {
    let (response, watch) = hub_client::fetch(url, Some(offset)).await?;
    check_status(&response, url)?;
    check_length(&response, url, path, size)?;
    let range = response.headers().get("content-range").ok().flatten();
    if response.status() != 206 || !range.as_deref().is_some_and(|r| hub::range_matches(r, offset)) {
        watch.abort();
        return Err(DownloadError::RangeMismatch { url: url.to_owned(), start: offset });
    }
    let ends_early = range_ends_early(&response, size);
    let body = response.body().ok_or_else(|| DownloadError::NoBody { url: url.to_owned() })?;
    Ok((BodyReader::new(body), watch, ends_early))
}

/// Where a 206 response's range stops, when that is before the end of the file (see
/// [`hub::range_ends_early`]).
fn range_ends_early(response: &web_sys::Response, size: u64) -> Option<u64> {
    if response.status() != 206 {
        return None;
    }
    let range = response.headers().get("content-range").ok().flatten()?;
    hub::range_ends_early(&range, size)
}

/// The offset of the last checkpoint saved for a file.
fn saved_offset(entry: &hub::FileRecord) -> u64 {
    entry.hash.as_ref().map_or(0, |c| c.offset)
}

/// Refuses a response whose headers announce another length for the file than the listing's `size`
/// (the total of a `Content-Range`, or the `Content-Length` of a whole, unencoded body): retrying does
/// not change what a server stores.
fn check_length(response: &web_sys::Response, url: &str, path: &str, size: u64) -> Result<(), DownloadError> {
    let headers = response.headers();
    let header = |name: &str| headers.get(name).ok().flatten();
    let announced = match (response.status(), header("content-range"), header("content-encoding")) {
        (206, Some(range), _) => hub::parse_content_range(&range).ok().and_then(|(_, _, total)| total),
        (200, _, None) => header("content-length").and_then(|n| n.trim().parse::<u64>().ok()),
        _ => None,
    };
    match announced {
        Some(total) if total != size => {
            Err(DownloadError::OtherLength { url: url.to_owned(), path: path.to_owned(), total, size })
        }
        _ => Ok(()),
    }
}

/// Feeds the first `size` bytes of `file`, as they are on disk, to `consume`, a block at a time.
fn read_on_disk(file: &SyncFile, size: u64, mut consume: impl FnMut(&[u8])) -> Result<(), OpfsError> {
    let mut buffer = vec![0; WRITE_BYTES];
    let mut offset = 0;
    while offset < size {
        let want = (size - offset).min(WRITE_BYTES as u64) as usize;
        let read = file.read_at(&mut buffer[..want], offset)?;
        if read == 0 {
            break;
        }
        consume(&buffer[..read]);
        offset += read as u64;
    }
    Ok(())
}

/// Reads a response body into the buffers it is given, a block at a time. Where the body is a byte
/// stream (Chromium's fetch bodies are) the bytes land in the buffer itself ("bring your own buffer"),
/// so a multi-GB download allocates nothing per chunk and copies nothing in this worker.
enum BodyReader {
    Byob(ReadableStreamByobReader),
    Chunks { reader: ReadableStreamDefaultReader, carry: Option<Uint8Array> },
}

impl BodyReader {
    fn new(body: web_sys::ReadableStream) -> Self {
        match ReadableStreamByobReader::new(&body) {
            Ok(reader) => BodyReader::Byob(reader),
            Err(_) => BodyReader::Chunks { reader: body.get_reader().unchecked_into(), carry: None },
        }
    }

    /// Fills `buffer` with the next bytes: `(buffer, bytes in it, whether more follow)`. The buffer
    /// comes back as a new object (reading transfers it), full unless the body ended. Each read that
    /// brings something tells `watch`, which ends the request when none does for the idle timeout.
    async fn fill(
        &mut self,
        mut buffer: ArrayBuffer,
        watch: &hub_client::IdleWatch,
    ) -> Result<(ArrayBuffer, u32, bool), JsValue> {
        // Only the wait for the server counts as silence, not the time spent writing and hashing.
        watch.touch();
        let capacity = buffer.byte_length();
        let mut filled = 0u32;
        match self {
            BodyReader::Byob(reader) => loop {
                let view = Uint8Array::new_with_byte_offset_and_length(&buffer, filled, capacity - filled);
                let result = JsFuture::from(reader.read_with_array_buffer_view(&view)).await?;
                watch.touch();
                if let Some(value) = get(&result, "value").dyn_ref::<Uint8Array>() {
                    buffer = value.buffer();
                    filled += value.length();
                }
                if get(&result, "done").as_bool().unwrap_or(true) {
                    return Ok((buffer, filled, false));
                }
                if filled == capacity {
                    return Ok((buffer, filled, true));
                }
            },
            BodyReader::Chunks { reader, carry } => {
                let target = Uint8Array::new(&buffer);
                while filled < capacity {
                    let chunk = match carry.take() {
                        Some(chunk) => chunk,
                        None => {
                            let result = JsFuture::from(reader.read()).await?;
                            watch.touch();
                            if get(&result, "done").as_bool().unwrap_or(true) {
                                return Ok((buffer, filled, false));
                            }
                            get(&result, "value").unchecked_into()
                        }
                    };
                    let take = chunk.length().min(capacity - filled);
                    target.set(&chunk.subarray(0, take), filled);
                    filled += take;
                    if take < chunk.length() {
                        *carry = Some(chunk.subarray(take, chunk.length()));
                    }
                }
                Ok((buffer, filled, true))
            }
        }
    }

    fn cancel(&self) {
        let _ = match self {
            BodyReader::Byob(reader) => reader.cancel(),
            BodyReader::Chunks { reader, .. } => reader.cancel(),
        };
    }
}

/// The download record in OPFS, saved alternately to two slots.
struct RecordStore {
    record: Option<DownloadRecord>,
    sequence: u64,
    slots: Option<[SyncFile; 2]>,
}

impl RecordStore {
    async fn load(staging: Slot) -> RecordStore {
        let mut best: Option<StoredRecord> = None;
        if let Ok(dir) = opfs::slot_dir(staging, false).await {
            for slot in RECORD_SLOTS {
                let stored = opfs::read(&dir, slot)
                    .await
                    .ok()
                    .and_then(|b| serde_json::from_slice::<StoredRecord>(&b).ok());
                if let Some(stored) = stored {
                    if best.as_ref().is_none_or(|b| stored.sequence > b.sequence) {
                        best = Some(stored);
                    }
                }
            }
        }
        let sequence = best.as_ref().map_or(0, |b| b.sequence);
        RecordStore { record: best.map(|b| b.record), sequence, slots: None }
    }

    /// The graphs and manifests an earlier attempt already verified.
    async fn kept_small_files(&self, staging: Slot) -> KeptFiles {
        let mut kept = KeptFiles::default();
        let (Some(record), Ok(dir)) = (&self.record, opfs::slot_dir(staging, false).await) else {
            return kept;
        };
        kept.commit = record.commit.clone();
        for file in record.files.iter().filter(|f| f.verified && f.file.size < CHECKPOINT_BYTES) {
            if let Ok(bytes) = opfs::read(&dir, &file.file.path).await {
                kept.files.insert(file.file.path.clone(), bytes);
            }
        }
        kept
    }

    async fn save(
        &mut self,
        dir: &FileSystemDirectoryHandle,
        record: &DownloadRecord,
    ) -> Result<(), OpfsError> {
        self.sequence += 1;
        let stored = StoredRecord { sequence: self.sequence, record: record.clone() };
        let slot = (self.sequence % 2) as usize;
        let bytes = opfs::json_bytes(&stored, RECORD_SLOTS[slot])?;
        let slots = match &mut self.slots {
            Some(slots) => slots,
            // Kept open for the whole download: a save is then three synchronous calls.
            none => {
                let [a, b] = RECORD_SLOTS;
                none.insert([SyncFile::open(dir, a).await?, SyncFile::open(dir, b).await?])
            }
        };
        let file = &slots[slot];
        file.truncate(0)?;
        file.write_at(&bytes, 0)?;
        file.flush()
    }
}

/// Installs the verified pack of the `staging` slot in one write of the pack state, then empties the
/// previous pack's slot for the next download (see [`imagine_core::storage`]). Every step may be
/// interrupted and repeated: until the state is written the old pack is installed and this download
/// resumes to here; after it, the new pack is installed and a resumed download finds it so.
async fn swap(
    staging: Slot,
    record: &DownloadRecord,
    conversion: Option<ConversionRecord>,
    block32: Option<Block32Record>,
) -> Result<PackRecord, DownloadError> {
    let files = record.files.iter().map(|f| f.file.clone()).collect();
    let mut installed = PackRecord::new(record.source.clone(), record.commit.clone(), files);
    installed.conversion = conversion;
    installed.block32 = block32;
    opfs::failpoint("swap:before-state").await;
    // One writer of the pack state at a time: a store of re-blocked forms or a deletion that read the
    // state before this write could otherwise write back what it read.
    let lock = opfs::lock_pack_state().await;
    let state = opfs::pack_state().await?;
    if state.staging != staging {
        return Err(DownloadError::StorageChanged);
    }
    let swapped = state.swapped(installed.clone());
    opfs::write_pack_state(&swapped).await?;
    drop(lock);
    opfs::failpoint("swap:after-state").await;
    opfs::clear_slot(swapped.staging).await?;
    let dir = opfs::slot_dir(staging, false).await?;
    for name in RECORD_SLOTS.into_iter().chain([CONVERSION_STATE_FILE]) {
        opfs::remove(&dir, name).await?;
    }
    Ok(installed)
}

/// Posts progress to the offscreen document, at most every [`REPORT_EVERY_MS`].
struct Reporter {
    state: DownloadState,
    rate: RateMeter,
    last_ms: f64,
}

impl Reporter {
    fn new() -> Self {
        Reporter { state: DownloadState::Checking, rate: RateMeter::new(), last_ms: f64::NEG_INFINITY }
    }

    fn post(progress: DownloadProgress) {
        send(&DownloadReport::Progress { progress });
    }

    /// Reports now.
    fn record(&mut self, record: &DownloadRecord) {
        self.last_ms = now_ms();
        self.rate.push(self.last_ms, record.done_bytes());
        Self::post(record.to_progress(self.state, &self.rate, None));
    }

    /// Reports the conversion's progress, at most every [`REPORT_EVERY_MS`] until it is done.
    fn converting(&mut self, source: &PackSource, commit: &str, p: &ConvertProgress) {
        let first = self.state != DownloadState::Converting;
        self.state = DownloadState::Converting;
        if !first && now_ms() - self.last_ms < REPORT_EVERY_MS && p.done_bytes < p.total_bytes {
            return;
        }
        self.last_ms = now_ms();
        Self::post(DownloadProgress {
            state: DownloadState::Converting,
            source: source.clone(),
            commit: Some(commit.to_owned()),
            total_bytes: p.total_bytes,
            done_bytes: p.done_bytes,
            files: p.files.clone(),
            bytes_per_second: 0.0,
            seconds_left: None,
            error: None,
            message: None,
        });
    }

    /// Reports if the last report is old enough.
    fn maybe(&mut self, record: &DownloadRecord) {
        if now_ms() - self.last_ms >= REPORT_EVERY_MS {
            self.record(record);
        }
    }
}

fn random_unit() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
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
