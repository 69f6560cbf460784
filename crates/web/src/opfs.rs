//! The extension's storage in OPFS (origin private file system).
//!
//! ```text
//! pack/            the installed pack: graphs, manifests and external-data files under their Hub names
//! pack/pack.json   the pack record, written last: a pack without it is not installed
//! ```

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

/// What is installed: written after every file is in place.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackRecord {
    /// The base URL the pack was installed from.
    pub source: String,
    pub files: Vec<PackFile>,
    pub bytes: u64,
}

/// One file of an installed pack.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PackFile {
    pub path: String,
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

/// A file opened for synchronous writing (dedicated workers only).
pub struct SyncFile {
    handle: FileSystemSyncAccessHandle,
    name: String,
}

impl SyncFile {
    /// Opens (creating) `name` in `dir`, truncated to zero bytes.
    pub async fn create(dir: &FileSystemDirectoryHandle, name: &str) -> OpfsResult<SyncFile> {
        let file = file_handle(dir, name, true).await?;
        let handle: FileSystemSyncAccessHandle =
            await_js(file.create_sync_access_handle(), &format!("opening {name} for writing"))
                .await?
                .unchecked_into();
        let sync = SyncFile { handle, name: name.to_owned() };
        sync.handle.truncate_with_f64(0.0).map_err(|e| sync.error("truncating", &e))?;
        Ok(sync)
    }

    /// Writes all of `bytes` at `offset`.
    pub fn write_at(&self, bytes: &js_sys::Uint8Array, offset: f64) -> OpfsResult<()> {
        let options = FileSystemReadWriteOptions::new();
        options.set_at(offset);
        let written = self
            .handle
            .write_with_js_u8_array_and_options(bytes, &options)
            .map_err(|e| self.error("writing", &e))?;
        if written as u32 != bytes.length() {
            return Err(format!(
                "writing {}: only {written} of {} bytes were written",
                self.name,
                bytes.length()
            ));
        }
        Ok(())
    }

    fn error(&self, what: &str, e: &JsValue) -> String {
        format!("{what} {}: {}", self.name, error_text(e))
    }

    /// Flushes and closes the file.
    pub fn close(self) -> OpfsResult<()> {
        self.handle.flush().map_err(|e| self.error("flushing", &e))?;
        self.handle.close();
        Ok(())
    }
}
