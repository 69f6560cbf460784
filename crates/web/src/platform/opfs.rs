//! The extension's storage in OPFS (origin private file system). The layout of the packs and the rule
//! that keeps an installed pack usable through interruptions are in [`imagine_core::storage`].

use imagine_core::api::StorageUse;
pub use imagine_core::storage::{PackRecord, PackState, Slot};
use imagine_core::storage::{PACKS_DIR, STATE_FILE};
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    FileSystemDirectoryHandle, FileSystemFileHandle, FileSystemGetDirectoryOptions, FileSystemGetFileOptions,
    FileSystemReadWriteOptions, FileSystemRemoveOptions, FileSystemSyncAccessHandle,
    FileSystemWritableFileStream, StorageManager,
};

use crate::platform::js::{get, JsError, LogError};

/// What an OPFS operation was doing when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Getting the OPFS root, or a file or directory handle in it.
    Open,
    /// Opening a synchronous access handle (which locks the file for this worker).
    OpenForWriting,
    /// Reading a file's bytes, or the entries of a directory.
    Read,
    /// Asking a synchronous access handle for the file's length.
    ReadSize,
    /// Writing: through a synchronous access handle or a writable stream.
    Write,
    /// Cutting a file to a length.
    Truncate,
    /// Making a synchronous access handle's writes durable.
    Flush,
    /// Removing a file or a directory.
    Remove,
    /// `navigator.storage.estimate()`: the origin's usage and quota.
    Estimate,
}

impl Op {
    /// The operation on `name`, as the messages say it.
    fn on(self, name: &str) -> String {
        match self {
            Op::Open => format!("opening {name}"),
            Op::OpenForWriting => format!("opening {name} for writing"),
            Op::Read => format!("reading {name}"),
            Op::ReadSize => format!("reading the size of {name}"),
            Op::Write => format!("writing {name}"),
            Op::Truncate => format!("truncating {name}"),
            Op::Flush => format!("flushing {name}"),
            Op::Remove => format!("removing {name}"),
            Op::Estimate => format!("estimating {name}"),
        }
    }
}

/// A failed OPFS operation: what it was doing, on which file or directory (directories end in `/`).
#[derive(Debug, Error)]
pub enum OpfsError {
    /// The browser refused the operation.
    #[error("{}: {source}", .op.on(.name))]
    Failed {
        /// What was being done.
        op: Op,
        /// The file or directory it was done on.
        name: String,
        /// The browser's error.
        source: JsError,
    },
    /// The origin's storage quota is used up (a `QuotaExceededError`, or a short write, which is how
    /// running out of quota shows on some platforms).
    #[error("{}: {detail}", .op.on(.name))]
    QuotaExceeded {
        /// What was being done (a write, mostly).
        op: Op,
        /// The file it was done on.
        name: String,
        /// The browser's message, or how short the write was.
        detail: String,
    },
    /// A record that could not be encoded as JSON to be written (none of ours fails to; nothing is
    /// written then).
    #[error("encoding {name} as JSON: {source}")]
    Encode {
        /// The file it was to be written to.
        name: String,
        /// serde's error.
        source: serde_json::Error,
    },
    /// `packs/state.json` is not a pack state.
    #[error("{PACKS_DIR}/{STATE_FILE} is unreadable ({0}): delete the model and install it again")]
    UnreadableState(serde_json::Error),
    /// The file stayed open in another worker for [`STILL_OPEN_WAIT_MS`] (only one may hold it open).
    #[error("{}: it stayed open in another worker for {seconds} s ({source})", .op.on(.name))]
    StillOpen {
        /// What was being done: opening for writing, or removing.
        op: Op,
        /// The file another worker holds open.
        name: String,
        /// How long it was waited for, in seconds.
        seconds: u64,
        /// The browser's last `NoModificationAllowedError`.
        source: JsError,
    },
}

/// How long opening a file for writing, or removing it, waits for another worker to let go of it. A
/// worker that was just terminated (a download paused and resumed at once) closes its files only as it
/// ends, which takes a moment, longer while it was in the middle of a long synchronous step.
pub const STILL_OPEN_WAIT_MS: u64 = 10_000;

impl OpfsError {
    /// `op` on `name` failed with the JS error `e`.
    pub(crate) fn js(op: Op, name: impl Into<String>, e: impl Into<JsError>) -> OpfsError {
        let (name, source) = (name.into(), e.into());
        if source.is("QuotaExceededError") {
            OpfsError::QuotaExceeded { op, name, detail: source.message }
        } else {
            OpfsError::Failed { op, name, source }
        }
    }
}

/// The outcome of an OPFS operation.
pub type OpfsResult<T> = Result<T, OpfsError>;

/// `value` as JSON, to be written to `name`.
pub fn json_bytes<T: serde::Serialize>(value: &T, name: &str) -> OpfsResult<Vec<u8>> {
    serde_json::to_vec(value).map_err(|source| OpfsError::Encode { name: name.to_owned(), source })
}

async fn await_js(promise: js_sys::Promise, op: Op, name: &str) -> OpfsResult<JsValue> {
    JsFuture::from(promise).await.map_err(|e| OpfsError::js(op, name, e))
}

/// The OPFS root of the extension's origin (works in every context).
pub async fn root() -> OpfsResult<FileSystemDirectoryHandle> {
    let storage: StorageManager = get(&get(&js_sys::global(), "navigator"), "storage").unchecked_into();
    Ok(await_js(storage.get_directory(), Op::Open, "storage").await?.unchecked_into())
}

/// A subdirectory of the root, created if `create`.
pub async fn dir(name: &str, create: bool) -> OpfsResult<FileSystemDirectoryHandle> {
    let options = FileSystemGetDirectoryOptions::new();
    options.set_create(create);
    let root = root().await?;
    Ok(await_js(root.get_directory_handle_with_options(name, &options), Op::Open, &format!("{name}/"))
        .await?
        .unchecked_into())
}

/// A file handle in `dir`, created if `create`.
pub async fn file_handle(
    dir: &FileSystemDirectoryHandle,
    name: &str,
    create: bool,
) -> OpfsResult<FileSystemFileHandle> {
    let options = FileSystemGetFileOptions::new();
    options.set_create(create);
    Ok(await_js(dir.get_file_handle_with_options(name, &options), Op::Open, name).await?.unchecked_into())
}

/// The file as a disk-backed `File` (reading it does not load it into memory).
pub async fn file(dir: &FileSystemDirectoryHandle, name: &str) -> OpfsResult<web_sys::File> {
    let handle = file_handle(dir, name, false).await?;
    Ok(await_js(handle.get_file(), Op::Read, name).await?.unchecked_into())
}

/// The whole file's bytes (for small files: graphs, manifests, records).
pub async fn read(dir: &FileSystemDirectoryHandle, name: &str) -> OpfsResult<Vec<u8>> {
    let file = file(dir, name).await?;
    read_blob(&file, name).await
}

/// The first `bytes` of `file` (fewer when it is shorter), named `name` in errors; only those are read.
pub async fn read_start(file: &web_sys::File, name: &str, bytes: u64) -> OpfsResult<Vec<u8>> {
    let start =
        file.slice_with_f64_and_f64(0.0, bytes as f64).map_err(|e| OpfsError::js(Op::Read, name, e))?;
    read_blob(&start, name).await
}

async fn read_blob(blob: &web_sys::Blob, name: &str) -> OpfsResult<Vec<u8>> {
    let buffer = await_js(blob.array_buffer(), Op::Read, name).await?;
    Ok(js_sys::Uint8Array::new(&buffer).to_vec())
}

/// Removes `name` (recursively for directories); absent is fine. A file another worker still has open
/// is waited for (see [`STILL_OPEN_WAIT_MS`]).
pub async fn remove(dir: &FileSystemDirectoryHandle, name: &str) -> OpfsResult<()> {
    let options = FileSystemRemoveOptions::new();
    options.set_recursive(true);
    match once_not_open_elsewhere(Op::Remove, name, || dir.remove_entry_with_options(name, &options)).await {
        Ok(_) => Ok(()),
        Err(OpfsError::Failed { source, .. }) if source.is("NotFoundError") => Ok(()),
        Err(e) => Err(e),
    }
}

/// The names of the entries of `dir`.
pub async fn names(dir: &FileSystemDirectoryHandle) -> OpfsResult<Vec<String>> {
    let iterator = dir.keys();
    let mut names = Vec::new();
    loop {
        let next = iterator.next().map_err(|e| OpfsError::js(Op::Read, "a directory", e))?;
        let step = await_js(next, Op::Read, "a directory").await?;
        if get(&step, "done").as_bool().unwrap_or(true) {
            return Ok(names);
        }
        if let Some(name) = get(&step, "value").as_string() {
            names.push(name);
        }
    }
}

fn is_not_found(e: &JsValue) -> bool {
    get(e, "name").as_string().as_deref() == Some("NotFoundError")
}

/// Awaits the promise `attempt` makes, made again while it fails because the file is open in another
/// worker (Chromium's `NoModificationAllowedError`), a little later each time, for at most
/// [`STILL_OPEN_WAIT_MS`] in all; then that failure is [`OpfsError::StillOpen`].
async fn once_not_open_elsewhere(
    op: Op,
    name: &str,
    mut attempt: impl FnMut() -> js_sys::Promise,
) -> OpfsResult<JsValue> {
    let started = crate::platform::js::now_ms();
    let mut pause_ms = 25;
    loop {
        match JsFuture::from(attempt()).await {
            Err(e) if is_open_elsewhere(&e) => {
                if crate::platform::js::now_ms() - started >= STILL_OPEN_WAIT_MS as f64 {
                    let seconds = STILL_OPEN_WAIT_MS / 1000;
                    return Err(OpfsError::StillOpen {
                        op,
                        name: name.to_owned(),
                        seconds,
                        source: e.into(),
                    });
                }
                crate::platform::js::sleep_ms(pause_ms).await;
                pause_ms = (pause_ms * 2).min(500);
            }
            outcome => return outcome.map_err(|e| OpfsError::js(op, name, e)),
        }
    }
}

fn is_open_elsewhere(e: &JsValue) -> bool {
    get(e, "name").as_string().as_deref() == Some("NoModificationAllowedError")
}

/// The pack state (`packs/state.json`), or the empty state when there is none yet.
pub async fn pack_state() -> OpfsResult<PackState> {
    let root = root().await?;
    let options = FileSystemGetDirectoryOptions::new();
    let packs = match JsFuture::from(root.get_directory_handle_with_options(PACKS_DIR, &options)).await {
        Ok(dir) => dir.unchecked_into::<FileSystemDirectoryHandle>(),
        Err(e) if is_not_found(&e) => return Ok(PackState::default()),
        Err(e) => return Err(OpfsError::js(Op::Open, format!("{PACKS_DIR}/"), e)),
    };
    let file = match JsFuture::from(packs.get_file_handle(STATE_FILE)).await {
        Ok(handle) => handle.unchecked_into::<FileSystemFileHandle>(),
        Err(e) if is_not_found(&e) => return Ok(PackState::default()),
        Err(e) => return Err(OpfsError::js(Op::Open, format!("{PACKS_DIR}/{STATE_FILE}"), e)),
    };
    let file: web_sys::File = await_js(file.get_file(), Op::Read, "the pack state").await?.unchecked_into();
    let buffer = await_js(file.array_buffer(), Op::Read, "the pack state").await?;
    serde_json::from_slice(&js_sys::Uint8Array::new(&buffer).to_vec()).map_err(OpfsError::UnreadableState)
}

/// The Web Lock every read-modify-write of `packs/state.json` holds: the swap of an install and the
/// store of the re-blocked forms (download workers), the deletion (service worker). Each context that
/// writes the state is another JS context of the same origin, so this is their one writer at a time;
/// a context that ends (a worker terminated) lets go of it.
const PACK_STATE_LOCK: &str = "imagine-pack-state";

/// Held while the pack state is read, changed and written ([`lock_pack_state`]); dropping it lets go.
#[must_use = "the lock is let go when this is dropped"]
pub struct PackStateLock {
    release: Option<js_sys::Function>,
}

impl Drop for PackStateLock {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.call0(&JsValue::UNDEFINED);
        }
    }
}

/// Waits until this context alone may write the pack state, then holds that until the guard is
/// dropped. Where the browser has no Web Locks (never in the Chrome the manifest allows), it holds
/// nothing.
pub async fn lock_pack_state() -> PackStateLock {
    let locks = get(&get(&js_sys::global(), "navigator"), "locks");
    let request = get(&locks, "request");
    let Some(request) = request.dyn_ref::<js_sys::Function>() else {
        return PackStateLock { release: None };
    };
    let (granted, grant) = futures_channel::oneshot::channel::<js_sys::Function>();
    let mut granted = Some(granted);
    // The lock is held until the promise this callback returns settles: its `resolve` is the release.
    let callback = Closure::once_into_js(move |_lock: JsValue| -> js_sys::Promise {
        js_sys::Promise::new(&mut |resolve, _reject| {
            if let Some(granted) = granted.take() {
                let _ = granted.send(resolve);
            }
        })
    });
    if let Err(e) = request.call2(&locks, &PACK_STATE_LOCK.into(), &callback) {
        web_sys::console::error_1(&e);
        return PackStateLock { release: None };
    }
    PackStateLock { release: grant.await.ok() }
}

/// Replaces `packs/state.json` whole (see [`write_whole`]), so an interruption leaves either the old
/// state or the new one.
pub async fn write_pack_state(state: &PackState) -> OpfsResult<()> {
    let text = json_bytes(state, &format!("{PACKS_DIR}/{STATE_FILE}"))?;
    write_whole(&dir(PACKS_DIR, true).await?, STATE_FILE, &text).await
}

/// Writes `name` in `dir` whole, from any context: a writable stream writes to a swap file that takes
/// the file's place on `close()`, so readers see the old contents or the new, never a mix.
pub async fn write_whole(dir: &FileSystemDirectoryHandle, name: &str, bytes: &[u8]) -> OpfsResult<()> {
    let file = WholeFileWriter::create(dir, name).await?;
    if let Err(e) = file.append(bytes).await {
        file.abort().await;
        return Err(e);
    }
    file.close().await
}

/// A file written in pieces, from any context, that takes the place of `name` whole when closed (as
/// [`write_whole`]): only the piece being written is in memory.
pub struct WholeFileWriter {
    stream: FileSystemWritableFileStream,
    name: String,
}

impl WholeFileWriter {
    /// Starts writing `name` in `dir` (created if absent); the old contents stay until [`Self::close`].
    pub async fn create(dir: &FileSystemDirectoryHandle, name: &str) -> OpfsResult<WholeFileWriter> {
        let handle = file_handle(dir, name, true).await?;
        let stream = await_js(handle.create_writable(), Op::Write, name).await?.unchecked_into();
        Ok(WholeFileWriter { stream, name: name.to_owned() })
    }

    /// Appends `bytes`.
    pub async fn append(&self, bytes: &[u8]) -> OpfsResult<()> {
        let written = self
            .stream
            .write_with_u8_array(bytes)
            .map_err(|e| OpfsError::js(Op::Write, self.name.as_str(), e))?;
        await_js(written, Op::Write, &self.name).await.map(drop)
    }

    /// Appends the bytes of `buffer` (an `ArrayBuffer`), which stay out of wasm memory.
    pub async fn append_buffer(&self, buffer: &js_sys::ArrayBuffer) -> OpfsResult<()> {
        let written = self
            .stream
            .write_with_buffer_source(buffer)
            .map_err(|e| OpfsError::js(Op::Write, self.name.as_str(), e))?;
        await_js(written, Op::Write, &self.name).await.map(drop)
    }

    /// Leaves the file as it was: nothing appended takes its place (also after a failed append).
    pub async fn abort(self) {
        JsFuture::from(self.stream.abort())
            .await
            .warn_on_error(&format!("aborting the write of {}", self.name));
    }

    /// Puts what was appended in the file's place.
    pub async fn close(self) -> OpfsResult<()> {
        await_js(self.stream.close(), Op::Write, &self.name).await.map(drop)
    }
}

/// The directory of `slot`, created if `create`.
pub async fn slot_dir(slot: Slot, create: bool) -> OpfsResult<FileSystemDirectoryHandle> {
    let packs = dir(PACKS_DIR, create).await?;
    let options = FileSystemGetDirectoryOptions::new();
    options.set_create(create);
    let name = slot.dir_name();
    Ok(await_js(
        packs.get_directory_handle_with_options(name, &options),
        Op::Open,
        &format!("{PACKS_DIR}/{name}/"),
    )
    .await?
    .unchecked_into())
}

/// Empties `slot`: the download record first, so that an interrupted removal never leaves a record that
/// describes files no longer there, then everything else.
pub async fn clear_slot(slot: Slot) -> OpfsResult<()> {
    let Ok(files) = slot_dir(slot, false).await else { return Ok(()) };
    for name in imagine_core::storage::DOWNLOAD_RECORD_SLOTS {
        remove(&files, name).await?;
    }
    remove(&dir(PACKS_DIR, false).await?, slot.dir_name()).await
}

/// The installed pack's record and directory, or `None` when no pack is installed.
pub async fn installed_pack() -> Option<(PackRecord, FileSystemDirectoryHandle)> {
    let state = pack_state().await.ok()?;
    let slot = state.installed_slot()?;
    Some((state.installed?, slot_dir(slot, false).await.ok()?))
}

/// Removes what belongs to no pack: the slot that neither holds the installed pack nor stages a download,
/// the staging slot too unless a download is kept (`keep_staging`), and the layout of earlier versions.
pub async fn remove_stray(keep_staging: bool) -> OpfsResult<()> {
    let root = root().await?;
    for legacy in imagine_core::storage::LEGACY_DIRS {
        remove(&root, legacy).await?;
    }
    let state = pack_state().await?;
    if let Some(unused) = state.unused_slot() {
        clear_slot(unused).await?;
    }
    if !keep_staging {
        clear_slot(state.staging).await?;
    }
    Ok(())
}

/// The cache of prompt embeddings in `cache/embeddings/`: what is kept, for how long and how entries
/// are checked is `imagine_core::embedding_cache`; this moves the bytes. Used by the offscreen document
/// only (one job at a time, so the index is never written twice at once); the service worker clears it.
pub mod embeddings {
    use imagine_core::embedding_cache::{
        check_entry_header, entry_bytes, entry_file, entry_header, Entry, EntryError, Index, Loaded,
        CACHE_DIR, EMBEDDINGS_DIR, HEADER_BYTES, INDEX_FILE, MAX_BYTES,
    };
    use js_sys::{ArrayBuffer, Uint8Array};
    use wasm_bindgen::JsCast;
    use wasm_bindgen_futures::JsFuture;
    use web_sys::{FileSystemDirectoryHandle, FileSystemGetDirectoryOptions};

    use super::{
        await_js, file, is_not_found, read_blob, remove, root, write_whole, Op, OpfsError, OpfsResult,
        WholeFileWriter,
    };
    use crate::platform::js::sha256;

    async fn directory() -> OpfsResult<FileSystemDirectoryHandle> {
        let options = FileSystemGetDirectoryOptions::new();
        options.set_create(true);
        let cache = await_js(
            root().await?.get_directory_handle_with_options(CACHE_DIR, &options),
            Op::Open,
            &format!("{CACHE_DIR}/"),
        )
        .await?
        .unchecked_into::<FileSystemDirectoryHandle>();
        Ok(await_js(
            cache.get_directory_handle_with_options(EMBEDDINGS_DIR, &options),
            Op::Open,
            &format!("{CACHE_DIR}/{EMBEDDINGS_DIR}/"),
        )
        .await?
        .unchecked_into())
    }

    /// The file `name`, or `None` when it does not exist.
    async fn file_if_there(dir: &FileSystemDirectoryHandle, name: &str) -> OpfsResult<Option<web_sys::File>> {
        match JsFuture::from(dir.get_file_handle(name)).await {
            Ok(_) => Ok(Some(file(dir, name).await?)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(OpfsError::js(Op::Open, name, e)),
        }
    }

    /// The values of an entry file (its bytes in `bytes`) if it holds exactly `values` of them and they
    /// hash to what its header says, as float32 (the entry's little-endian bytes, as every platform a
    /// browser runs on has them); why not otherwise. The bytes stay out of wasm memory.
    async fn checked_values(bytes: &ArrayBuffer, values: usize) -> Result<ArrayBuffer, String> {
        let length = bytes.byte_length() as usize;
        let start = Uint8Array::new_with_byte_offset_and_length(bytes, 0, length.min(HEADER_BYTES) as u32);
        let digest = check_entry_header(&start.to_vec(), length, values).map_err(|e| e.to_string())?;
        let payload = bytes.slice(HEADER_BYTES as u32);
        if sha256(&payload).await.map_err(|e| e.to_string())? != digest {
            return Err(EntryError::Damaged.to_string());
        }
        Ok(payload)
    }

    /// The cache's index for the pack at `commit`; an index of another pack (or unreadable) is removed
    /// with every entry, and the cache starts empty.
    async fn load(commit: &str) -> OpfsResult<(Index, FileSystemDirectoryHandle)> {
        let dir = directory().await?;
        let index = match file_if_there(&dir, INDEX_FILE).await? {
            Some(file) => Some(read_blob(&file, INDEX_FILE).await?),
            None => None,
        };
        match Index::load(index.as_deref(), commit) {
            Loaded::Current(index) => Ok((index, dir)),
            Loaded::Reset(index) => {
                clear().await?;
                Ok((index, directory().await?))
            }
        }
    }

    /// The cached embeddings `key` (`values` float32 values, in an `ArrayBuffer`) of the pack at
    /// `commit`, marked as just used (unless `record_use` is false: a private job's use leaves no trace);
    /// `None` when there are none or their file is missing, short or damaged (then the entry is dropped).
    pub async fn read_entry(
        commit: &str,
        key: &str,
        values: usize,
        record_use: bool,
    ) -> OpfsResult<Option<ArrayBuffer>> {
        let (mut index, dir) = load(commit).await?;
        if index.touch(key).is_none() {
            return Ok(None);
        }
        let name = entry_file(key);
        let checked = match file_if_there(&dir, &name).await {
            Ok(Some(file)) => match await_js(file.array_buffer(), Op::Read, &name).await {
                Ok(bytes) => checked_values(&bytes.unchecked_into(), values).await,
                Err(e) => Err(e.to_string()),
            },
            Ok(None) => Err("its file is missing".to_owned()),
            Err(e) => Err(e.to_string()),
        };
        let found = match checked {
            // Unrecorded (a private job's use), the index stays as it was on disk.
            Ok(values) if !record_use => return Ok(Some(values)),
            Ok(values) => Some(values),
            Err(why) => {
                web_sys::console::warn_1(&format!("imagine: cached embeddings {key} not used: {why}").into());
                index.remove(key);
                remove(&dir, &name).await?;
                None
            }
        };
        write_whole(&dir, INDEX_FILE, &index.to_bytes()).await?;
        Ok(found)
    }

    /// Keeps `values` (float32 values in an `ArrayBuffer`, left as they are) as the embeddings `key` of
    /// the pack at `commit`, dropping the least recently used entries past the cap. Removals and the
    /// index come before the entry's file, so no file is ever outside the index.
    pub async fn write_entry(
        commit: &str,
        key: &str,
        values: &ArrayBuffer,
        token_count: u32,
        truncated: bool,
    ) -> OpfsResult<()> {
        let name = entry_file(key);
        let count = values.byte_length() as usize / 4;
        // Hashed before anything changes on disk: a failure here leaves the cache as it was.
        let digest = sha256(values).await.map_err(|e| OpfsError::js(Op::Write, name.as_str(), e))?;
        let (mut index, dir) = load(commit).await?;
        let entry =
            Entry { key: key.to_owned(), bytes: entry_bytes(count), token_count, truncated, last_used: 0 };
        let dropped = index.insert(entry, MAX_BYTES);
        for old in &dropped {
            remove(&dir, &entry_file(old)).await?;
        }
        write_whole(&dir, INDEX_FILE, &index.to_bytes()).await?;
        if !dropped.iter().any(|old| old == key) {
            let file = WholeFileWriter::create(&dir, &name).await?;
            let written = match file.append(&entry_header(count, &digest)).await {
                Ok(()) => file.append_buffer(values).await,
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                file.abort().await;
                return Err(e);
            }
            file.close().await?;
        }
        Ok(())
    }

    /// Removes the whole cache (the pack it was computed with is gone or replaced).
    pub async fn clear() -> OpfsResult<()> {
        remove(&root().await?, CACHE_DIR).await
    }
}

/// What a job taught about this GPU's memory (`imagine_core::gpu_memory::Learned`): written by the
/// offscreen document, removed by the service worker when the budget is set or measured again.
pub mod learned {
    use imagine_core::gpu_memory::Learned;

    use super::{json_bytes, read, remove, root, write_whole, OpfsResult};

    const FILE: &str = "gpu-learned.json";

    /// The lesson kept, if any.
    pub async fn get() -> Option<Learned> {
        serde_json::from_slice(&read(&root().await.ok()?, FILE).await.ok()?).ok()
    }

    /// Keeps `learned` in place of any earlier lesson.
    pub async fn set(learned: &Learned) -> OpfsResult<()> {
        write_whole(&root().await?, FILE, &json_bytes(learned, FILE)?).await
    }

    /// Forgets it.
    pub async fn forget() -> OpfsResult<()> {
        remove(&root().await?, FILE).await
    }
}

/// How long each stage went without reporting, kept across restarts (the stall limits scale with it).
pub mod quiet {
    use imagine_core::stages::QuietTimes;

    use super::{json_bytes, read, root, write_whole, OpfsResult};

    const FILE: &str = "stage-quiet.json";

    /// What was kept; nothing where none was, or it cannot be read.
    pub async fn get() -> QuietTimes {
        let Ok(root) = root().await else { return QuietTimes::default() };
        read(&root, FILE).await.ok().and_then(|bytes| serde_json::from_slice(&bytes).ok()).unwrap_or_default()
    }

    /// Keeps `times` in place of what was kept.
    pub async fn set(times: &QuietTimes) -> OpfsResult<()> {
        write_whole(&root().await?, FILE, &json_bytes(times, FILE)?).await
    }
}

/// The file that arms a [`failpoint`].
const FAILPOINT_FILE: &str = "failpoint";

/// A test hook for the steps that must survive the browser stopping anywhere: when the OPFS root holds a
/// file `failpoint` whose text is `name`, the file is removed and the caller waits for ever, so a test
/// can stop the browser exactly here. Only the extension can write its OPFS; otherwise this costs one
/// failed lookup.
pub async fn failpoint(name: &str) {
    if failpoint_reached(name).await {
        web_sys::console::log_1(&format!("imagine: failpoint {name} reached, holding").into());
        futures_util::future::pending::<()>().await;
    }
}

/// Whether the failpoint `name` is armed, disarming it: for a test that makes one step fail once.
pub async fn failpoint_reached(name: &str) -> bool {
    let Ok(root) = root().await else { return false };
    if read(&root, FAILPOINT_FILE).await.ok().as_deref() != Some(name.as_bytes()) {
        return false;
    }
    remove(&root, FAILPOINT_FILE).await.log_error(&format!("disarming the failpoint {name}"));
    true
}

/// A number a test wrote into the OPFS root's file `name` to shorten a wait (a stall limit, an idle
/// timeout), like [`failpoint`]; `None` when there is none, which costs one failed lookup.
pub async fn test_setting_u64(name: &str) -> Option<u64> {
    let root = root().await.ok()?;
    let text = read(&root, name).await.ok()?;
    std::str::from_utf8(&text).ok()?.trim().parse().ok()
}

/// Bytes the extension's origin uses and may use.
pub async fn storage_use() -> OpfsResult<StorageUse> {
    let storage: StorageManager = get(&get(&js_sys::global(), "navigator"), "storage").unchecked_into();
    let estimate = storage.estimate().map_err(|e| OpfsError::js(Op::Estimate, "storage", e))?;
    let estimate = await_js(estimate, Op::Estimate, "storage").await?;
    let number = |key| crate::platform::js::get_f64(&estimate, key).unwrap_or(0.0) as u64;
    Ok(StorageUse { usage_bytes: number("usage"), quota_bytes: number("quota") })
}

/// A file opened for synchronous reading and writing (dedicated workers only). Dropping it closes it,
/// which releases its exclusive lock.
pub struct SyncFile {
    handle: FileSystemSyncAccessHandle,
    name: String,
}

impl SyncFile {
    /// Opens (creating) `name` in `dir`, keeping its contents. Only one worker may have a file open: one
    /// that still has it (see [`STILL_OPEN_WAIT_MS`]) is waited for.
    pub async fn open(dir: &FileSystemDirectoryHandle, name: &str) -> OpfsResult<SyncFile> {
        let file = file_handle(dir, name, true).await?;
        let handle: FileSystemSyncAccessHandle =
            once_not_open_elsewhere(Op::OpenForWriting, name, || file.create_sync_access_handle())
                .await?
                .unchecked_into();
        Ok(SyncFile { handle, name: name.to_owned() })
    }

    /// Opens (creating) `name` in `dir`, truncated to zero bytes.
    pub async fn create(dir: &FileSystemDirectoryHandle, name: &str) -> OpfsResult<SyncFile> {
        let sync = Self::open(dir, name).await?;
        sync.truncate(0)?;
        Ok(sync)
    }

    /// Cuts the file to `length` bytes.
    pub fn truncate(&self, length: u64) -> OpfsResult<()> {
        self.handle.truncate_with_f64(length as f64).map_err(|e| self.error(Op::Truncate, e))
    }

    /// Writes all of `bytes` (small: records, graphs, manifests) at `offset`.
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> OpfsResult<()> {
        self.write_js_at(&js_sys::Uint8Array::from(bytes), offset)
    }

    /// Writes all of a JS array at `offset` (the downloaded blocks: no copy into wasm memory).
    pub fn write_js_at(&self, bytes: &js_sys::Uint8Array, offset: u64) -> OpfsResult<()> {
        let options = FileSystemReadWriteOptions::new();
        options.set_at(offset as f64);
        let written = self
            .handle
            .write_with_js_u8_array_and_options(bytes, &options)
            .map_err(|e| self.error(Op::Write, e))?;
        if written as u32 != bytes.length() {
            // A short write is how running out of quota shows on some platforms.
            return Err(OpfsError::QuotaExceeded {
                op: Op::Write,
                name: self.name.clone(),
                detail: format!("only {written} of {} bytes were written", bytes.length()),
            });
        }
        Ok(())
    }

    /// The file's length.
    pub fn size(&self) -> OpfsResult<u64> {
        Ok(self.handle.get_size().map_err(|e| self.error(Op::ReadSize, e))? as u64)
    }

    /// Reads into all of `buffer` from `offset`; the number of bytes read (fewer at the end of the file).
    pub fn read_at(&self, buffer: &mut [u8], offset: u64) -> OpfsResult<usize> {
        let options = FileSystemReadWriteOptions::new();
        options.set_at(offset as f64);
        let read = self
            .handle
            .read_with_u8_array_and_options(buffer, &options)
            .map_err(|e| self.error(Op::Read, e))?;
        Ok(read as usize)
    }

    /// Makes what was written durable.
    pub fn flush(&self) -> OpfsResult<()> {
        self.handle.flush().map_err(|e| self.error(Op::Flush, e))
    }

    fn error(&self, op: Op, e: JsValue) -> OpfsError {
        OpfsError::js(op, self.name.as_str(), e)
    }

    /// Flushes and closes the file.
    pub fn close(self) -> OpfsResult<()> {
        self.flush()
    }
}

impl Drop for SyncFile {
    fn drop(&mut self) {
        // Closing an already closed handle is harmless.
        self.handle.close();
    }
}
