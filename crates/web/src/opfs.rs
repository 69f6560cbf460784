//! The extension's storage in OPFS (origin private file system).
//!
//! ```text
//! pack/            the installed pack: graphs, manifests and external-data files under their Hub names
//! pack/pack.json   the pack record, written last: a pack without it is not installed
//! pack-staging/    a download in progress: its files and its download record (see `download.rs`)
//! ```

use imagine_core::api::{PackFile, PackSource, StorageUse};
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    FileSystemDirectoryHandle, FileSystemFileHandle, FileSystemGetDirectoryOptions, FileSystemGetFileOptions,
    FileSystemReadWriteOptions, FileSystemRemoveOptions, FileSystemSyncAccessHandle, StorageManager,
};

use crate::js::{error_text, get};

/// The directory of the installed pack.
pub const PACK_DIR: &str = "pack";
/// The pack record's file name inside [`PACK_DIR`].
pub const PACK_RECORD: &str = "pack.json";
/// The directory of a download in progress.
pub const STAGING_DIR: &str = "pack-staging";

/// What is installed: written after every file is in place and verified.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackRecord {
    pub source: PackSource,
    pub commit: String,
    pub files: Vec<PackFile>,
    pub bytes: u64,
}

/// A failed OPFS operation, as text for the user.
pub type OpfsResult<T> = Result<T, String>;

async fn await_js(promise: js_sys::Promise, what: &str) -> OpfsResult<JsValue> {
    JsFuture::from(promise).await.map_err(|e| format!("{what}: {}", error_text(&e)))
}

/// The OPFS root of the extension's origin (works in every context).
pub async fn root() -> OpfsResult<FileSystemDirectoryHandle> {
    let storage: StorageManager = get(&get(&js_sys::global(), "navigator"), "storage").unchecked_into();
    Ok(await_js(storage.get_directory(), "opening storage").await?.unchecked_into())
}

/// A subdirectory of the root, created if `create`.
pub async fn dir(name: &str, create: bool) -> OpfsResult<FileSystemDirectoryHandle> {
    let options = FileSystemGetDirectoryOptions::new();
    options.set_create(create);
    let root = root().await?;
    Ok(await_js(root.get_directory_handle_with_options(name, &options), &format!("opening {name}/"))
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
    Ok(await_js(dir.get_file_handle_with_options(name, &options), &format!("opening {name}"))
        .await?
        .unchecked_into())
}

/// The file as a disk-backed `File` (reading it does not load it into memory).
pub async fn file(dir: &FileSystemDirectoryHandle, name: &str) -> OpfsResult<web_sys::File> {
    let handle = file_handle(dir, name, false).await?;
    Ok(await_js(handle.get_file(), &format!("reading {name}")).await?.unchecked_into())
}

/// The whole file's bytes (for small files: graphs, manifests, records).
pub async fn read(dir: &FileSystemDirectoryHandle, name: &str) -> OpfsResult<Vec<u8>> {
    let file = file(dir, name).await?;
    let buffer = await_js(file.array_buffer(), &format!("reading {name}")).await?;
    Ok(js_sys::Uint8Array::new(&buffer).to_vec())
}

/// Removes `name` (recursively for directories); absent is fine.
pub async fn remove(dir: &FileSystemDirectoryHandle, name: &str) -> OpfsResult<()> {
    let options = FileSystemRemoveOptions::new();
    options.set_recursive(true);
    match JsFuture::from(dir.remove_entry_with_options(name, &options)).await {
        Ok(_) => Ok(()),
        Err(e) if get(&e, "name").as_string().as_deref() == Some("NotFoundError") => Ok(()),
        Err(e) => Err(format!("removing {name}: {}", error_text(&e))),
    }
}

/// The installed pack's record, or `None` when no pack is installed.
pub async fn pack_record() -> Option<PackRecord> {
    let dir = dir(PACK_DIR, false).await.ok()?;
    let bytes = read(&dir, PACK_RECORD).await.ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Bytes the extension's origin uses and may use.
pub async fn storage_use() -> OpfsResult<StorageUse> {
    let storage: StorageManager = get(&get(&js_sys::global(), "navigator"), "storage").unchecked_into();
    let estimate = await_js(storage.estimate().map_err(|e| error_text(&e))?, "estimating storage").await?;
    let number = |key| crate::js::get_f64(&estimate, key).unwrap_or(0.0) as u64;
    Ok(StorageUse { usage_bytes: number("usage"), quota_bytes: number("quota") })
}

/// Why a synchronous file operation failed.
#[derive(Debug)]
pub enum SyncError {
    /// The origin's storage quota is used up.
    QuotaExceeded(String),
    Other(String),
}

impl From<SyncError> for String {
    fn from(error: SyncError) -> String {
        match error {
            SyncError::QuotaExceeded(message) | SyncError::Other(message) => message,
        }
    }
}

/// A file opened for synchronous reading and writing (dedicated workers only). Dropping it closes it,
/// which releases its exclusive lock.
pub struct SyncFile {
    handle: FileSystemSyncAccessHandle,
    name: String,
}

impl SyncFile {
    /// Opens (creating) `name` in `dir`, keeping its contents.
    pub async fn open(dir: &FileSystemDirectoryHandle, name: &str) -> OpfsResult<SyncFile> {
        let file = file_handle(dir, name, true).await?;
        let handle: FileSystemSyncAccessHandle =
            await_js(file.create_sync_access_handle(), &format!("opening {name} for writing"))
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
    pub fn truncate(&self, length: u64) -> Result<(), SyncError> {
        self.handle.truncate_with_f64(length as f64).map_err(|e| self.error("truncating", &e))
    }

    /// Writes all of `bytes` (small: records, graphs, manifests) at `offset`.
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> Result<(), SyncError> {
        self.write_js_at(&js_sys::Uint8Array::from(bytes), offset)
    }

    /// Writes all of a JS array at `offset` (the downloaded blocks: no copy into wasm memory).
    pub fn write_js_at(&self, bytes: &js_sys::Uint8Array, offset: u64) -> Result<(), SyncError> {
        let options = FileSystemReadWriteOptions::new();
        options.set_at(offset as f64);
        let written = self
            .handle
            .write_with_js_u8_array_and_options(bytes, &options)
            .map_err(|e| self.error("writing", &e))?;
        if written as u32 != bytes.length() {
            // A short write is how running out of quota shows on some platforms.
            return Err(SyncError::QuotaExceeded(format!(
                "writing {}: only {written} of {} bytes were written",
                self.name,
                bytes.length()
            )));
        }
        Ok(())
    }

    /// Makes what was written durable.
    pub fn flush(&self) -> Result<(), SyncError> {
        self.handle.flush().map_err(|e| self.error("flushing", &e))
    }

    fn error(&self, what: &str, e: &JsValue) -> SyncError {
        let message = format!("{what} {}: {}", self.name, error_text(e));
        if get(e, "name").as_string().as_deref() == Some("QuotaExceededError") {
            SyncError::QuotaExceeded(message)
        } else {
            SyncError::Other(message)
        }
    }

    /// Flushes and closes the file.
    pub fn close(self) -> Result<(), SyncError> {
        self.flush()
    }
}

impl Drop for SyncFile {
    fn drop(&mut self) {
        // Closing an already closed handle is harmless.
        self.handle.close();
    }
}
