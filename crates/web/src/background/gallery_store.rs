//! The gallery in OPFS, for the service worker: each finished image is kept as `gallery/<job>.png`
//! and listed in `gallery/index.json` (written whole). The model (order, search, limits, export, the
//! rebuild of a lost index) is [`imagine_core::gallery`]; this module only moves it to and from OPFS.
//!
//! Only the service worker changes the gallery, one change at a time ([`lock`]); pages may read the
//! PNG files directly (same origin) to show thumbnails without copying them through messages.

use std::sync::Arc;

use base64::Engine;
use futures_util::lock::{Mutex, OwnedMutexGuard};
use imagine_core::api::{GalleryLimitRequest, GalleryListRequest, GalleryPage, GenerateResult};
use imagine_core::gallery::{
    self, ExportZip, FoundImage, GalleryError, GalleryIndex, GalleryItem, GalleryLimit, ListQuery,
    EXPORT_DIR, EXPORT_FILE, GALLERY_DIR, INDEX_FILE, PNG_HEAD_BYTES,
};
use imagine_core::message::{Localize, Message};
use thiserror::Error;
use wasm_bindgen_futures::JsFuture;
use web_sys::FileSystemDirectoryHandle;

use crate::platform::chrome;
use crate::platform::js::{get, Obj};
use crate::platform::opfs::{self, OpfsError};

/// Why a gallery request failed.
#[derive(Debug, Error)]
pub enum GalleryStoreError {
    /// A request the gallery refuses (a bad id, a value out of range), or an index it cannot read.
    #[error(transparent)]
    Gallery(#[from] GalleryError),
    /// Reading or writing the images, the index or the export in OPFS.
    #[error(transparent)]
    Opfs(#[from] OpfsError),
}

type Result<T> = std::result::Result<T, GalleryStoreError>;

thread_local! {
    static LOCK: Arc<Mutex<()>> = Arc::new(Mutex::new(()));
}

/// Serialises every read-modify-write of the index (events and requests interleave while OPFS answers).
async fn lock() -> OwnedMutexGuard<()> {
    LOCK.with(Arc::clone).lock_owned().await
}

async fn gallery_dir() -> Result<FileSystemDirectoryHandle> {
    Ok(opfs::dir(GALLERY_DIR, true).await?)
}

/// The index; a missing or unreadable one is rebuilt from the PNGs (and written back).
async fn load(dir: &FileSystemDirectoryHandle) -> Result<GalleryIndex> {
    let problem = match opfs::read(dir, INDEX_FILE).await {
        Ok(bytes) => match GalleryIndex::parse(&bytes) {
            Ok(index) => return Ok(index),
            Err(e) => e.to_string(),
        },
        Err(OpfsError::Failed { source, .. }) if source.is("NotFoundError") => String::new(),
        Err(e) => return Err(e.into()),
    };
    let mut found = Vec::new();
    for name in opfs::names(dir).await? {
        if name == INDEX_FILE || gallery::id_of_file(&name).is_none() {
            continue;
        }
        // Only the start of each PNG, where its text chunks are, and one at a time.
        let file = opfs::file(dir, &name).await?;
        let head = opfs::read_start(&file, &name, PNG_HEAD_BYTES).await?;
        let size = file.size() as u64;
        found.push(FoundImage::read(name, &head, size, file.last_modified()));
    }
    if found.is_empty() && problem.is_empty() {
        return Ok(GalleryIndex { version: GalleryIndex::VERSION, ..Default::default() });
    }
    let (index, skipped) = GalleryIndex::rebuild(found, GalleryLimit::default());
    let why = if problem.is_empty() { "missing".to_owned() } else { problem };
    let mut report =
        format!("imagine: the gallery index was {why}; rebuilt from {} images", index.items.len());
    for s in &skipped {
        report.push_str(&format!("; skipped {}: {}", s.file, s.reason));
    }
    web_sys::console::warn_1(&report.into());
    save(dir, &index).await?;
    Ok(index)
}

async fn save(dir: &FileSystemDirectoryHandle, index: &GalleryIndex) -> Result<()> {
    Ok(opfs::write_whole(dir, INDEX_FILE, &index.to_bytes()).await?)
}

/// Applies the limit (sparing what pages show), saves the index, then removes the dropped PNGs.
async fn evict_and_save(dir: &FileSystemDirectoryHandle, index: &mut GalleryIndex) -> Result<()> {
    let dropped = index.evict(&viewed().await);
    save(dir, index).await?;
    for item in dropped {
        opfs::remove(dir, &gallery::image_file(&item.id)).await?;
    }
    Ok(())
}

/// The ids the extension's open pages show (their URLs' `view=` / `job=`).
async fn viewed() -> Vec<String> {
    let types = js_sys::Array::of3(&"TAB".into(), &"POPUP".into(), &"SIDE_PANEL".into());
    let filter = Obj::new().set("contextTypes", types).build();
    let Ok(promise) = chrome::runtime_get_contexts(&filter) else { return Vec::new() };
    let Ok(contexts) = JsFuture::from(promise).await else { return Vec::new() };
    let urls: Vec<String> =
        js_sys::Array::from(&contexts).iter().filter_map(|c| get(&c, "documentUrl").as_string()).collect();
    gallery::viewed_ids(urls.iter().map(String::as_str))
}

/// Writes a job's PNG (step one of keeping it; [`add`] lists it). Until then a rebuild of the index
/// would pick it up too.
pub async fn write_png(job: &str, png: &[u8]) -> Result<()> {
    let id = gallery::validate_id(job)?;
    Ok(opfs::write_whole(&gallery_dir().await?, &gallery::image_file(id), png).await?)
}

/// Lists a job's PNG (written by [`write_png`], `bytes` long) as the newest item, then applies the
/// limit.
pub async fn add(result: &GenerateResult, bytes: u64, pack_commit: Option<String>) -> Result<()> {
    let _guard = lock().await;
    let dir = gallery_dir().await?;
    let id = gallery::image_id(&result.job, result.index);
    let id = gallery::validate_id(&id)?;
    // Cleared meanwhile ("delete all" between the two steps): nothing to list.
    if opfs::file(&dir, &gallery::image_file(id)).await.is_err() {
        return Ok(());
    }
    let mut index = load(&dir).await?;
    index.add(GalleryItem {
        id: id.to_owned(),
        image: result.image.clone(),
        created: js_sys::Date::now(),
        bytes,
        timings: result.timings.clone(),
        pack_commit,
    });
    evict_and_save(&dir, &mut index).await
}

/// A kept image's PNG.
pub async fn png(id: &str) -> Result<Vec<u8>> {
    let id = gallery::validate_id(id)?;
    match opfs::read(&gallery_dir().await?, &gallery::image_file(id)).await {
        Err(OpfsError::Failed { source, .. }) if source.is("NotFoundError") => {
            Err(GalleryError::NotFound(id.to_owned()).into())
        }
        other => Ok(other?),
    }
}

/// `galleryList`.
pub async fn list(request: GalleryListRequest) -> Result<GalleryPage> {
    let query = ListQuery::new(request.query, request.offset, request.limit)?;
    let _guard = lock().await;
    let index = load(&gallery_dir().await?).await?;
    let (items, total) = index.list(&query);
    Ok(GalleryPage {
        items,
        total,
        count: index.items.len() as u32,
        bytes_used: index.bytes_used(),
        limit: index.limit,
    })
}

/// `galleryImage`: the item and its PNG in base64.
pub async fn image(id: &str) -> Result<(GalleryItem, String)> {
    let item = {
        let _guard = lock().await;
        load(&gallery_dir().await?).await?.get(gallery::validate_id(id)?)?.clone()
    };
    let png = png(id).await?;
    Ok((item, base64::engine::general_purpose::STANDARD.encode(png)))
}

/// `galleryDelete`: the entry first, then the file.
pub async fn delete(id: &str) -> Result<()> {
    let id = gallery::validate_id(id)?;
    let _guard = lock().await;
    let dir = gallery_dir().await?;
    let mut index = load(&dir).await?;
    index.remove(id).ok_or_else(|| GalleryError::NotFound(id.to_owned()))?;
    save(&dir, &index).await?;
    Ok(opfs::remove(&dir, &gallery::image_file(id)).await?)
}

/// `galleryClear`: an empty index first (keeping the limit), then every file but the index, and the
/// last export.
pub async fn clear() -> Result<()> {
    let _guard = lock().await;
    let dir = gallery_dir().await?;
    let limit = load(&dir).await.map(|i| i.limit).unwrap_or_default();
    save(&dir, &GalleryIndex { version: GalleryIndex::VERSION, limit, items: Vec::new() }).await?;
    for name in opfs::names(&dir).await? {
        if name != INDEX_FILE {
            opfs::remove(&dir, &name).await?;
        }
    }
    Ok(opfs::remove(&opfs::root().await?, EXPORT_DIR).await?)
}

/// `galleryExport`: writes the zip a PNG at a time (only one is in memory), replacing the last export
/// once it is whole; its OPFS path, size and image count.
pub async fn export() -> Result<(String, u64, u32)> {
    let _guard = lock().await;
    let dir = gallery_dir().await?;
    let index = load(&dir).await?;
    let file = opfs::WholeFileWriter::create(&opfs::dir(EXPORT_DIR, true).await?, EXPORT_FILE).await?;
    match write_export(&dir, &index, &file).await {
        Ok(bytes) => {
            file.close().await?;
            Ok((format!("{EXPORT_DIR}/{EXPORT_FILE}"), bytes, index.items.len() as u32))
        }
        Err(e) => {
            file.abort().await;
            Err(e)
        }
    }
}

/// Appends the export zip of `index`'s images to `file`; the bytes written.
async fn write_export(
    dir: &FileSystemDirectoryHandle,
    index: &GalleryIndex,
    file: &opfs::WholeFileWriter,
) -> Result<u64> {
    let mut zip = ExportZip::new();
    let mut bytes = 0;
    for item in &index.items {
        let piece = zip.add(item, &opfs::read(dir, &gallery::image_file(&item.id)).await?)?;
        file.append(&piece).await?;
        bytes += piece.len() as u64;
    }
    let last = zip.finish()?;
    file.append(&last).await?;
    Ok(bytes + last.len() as u64)
}

/// `galleryLimit`: sets the caps and applies them now.
pub async fn set_limit(request: GalleryLimitRequest) -> Result<GalleryLimit> {
    let _guard = lock().await;
    let dir = gallery_dir().await?;
    let mut index = load(&dir).await?;
    index.limit = index.limit.with(request.max_items, request.max_bytes)?;
    evict_and_save(&dir, &mut index).await?;
    Ok(index.limit)
}

impl Localize for GalleryStoreError {
    fn message(&self) -> Message {
        match self {
            GalleryStoreError::Gallery(e) => e.message(),
            GalleryStoreError::Opfs(e) => e.message(),
        }
    }
}
