//! Installing a pack from a base URL that serves the pack's files under their Hub names (a dedicated
//! worker of the offscreen document, because only workers can write OPFS files synchronously).
//!
//! Which files make the pack follows from the pack itself: the three graphs, each graph's
//! `<stem>.manifest.json` when there is one, and every external-data file a graph or manifest names.
//! Everything is written to `pack-staging/` first; the installed pack is replaced only once every file
//! arrived, and its record is written last.

use imagine_core::pack::{self, Graph};
use js_sys::{Reflect, Uint8Array};
use serde::Deserialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{FileSystemDirectoryHandle, ReadableStreamDefaultReader, Response};

use crate::js::{error_text, from_js, get, Obj};
use crate::opfs::{self, PackFile, PackRecord, SyncFile, PACK_DIR, PACK_RECORD};
use crate::stage_worker::post;

const STAGING_DIR: &str = "pack-staging";
/// Report progress at most once per this many bytes.
const PROGRESS_EVERY: u64 = 4 << 20;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InstallParams {
    base_url: String,
}

/// Installs the pack under `params.baseUrl`; replies with the pack record.
pub async fn install(params: &JsValue) -> Result<(JsValue, Option<JsValue>), String> {
    let InstallParams { mut base_url } = from_js(params)?;
    if !base_url.ends_with('/') {
        base_url.push('/');
    }
    opfs::remove(&opfs::root().await?, STAGING_DIR).await?;
    let staging = opfs::dir(STAGING_DIR, true).await?;
    let mut files = Vec::new();
    for graph in Graph::ALL {
        let graph_name = graph.file_name();
        let graph_bytes = fetch_small(&base_url, &graph_name).await?.ok_or_else(|| {
            format!("{base_url}{graph_name} was not found (HTTP 404): is this the base URL of a FLUX.2 klein pack?")
        })?;
        let mut data_files =
            pack::external_data_locations(&graph_bytes).map_err(|e| format!("{graph_name}: {e}"))?;
        write_small(&staging, &graph_name, &graph_bytes, &mut files).await?;
        let manifest_name = graph.manifest_name();
        if let Some(manifest) = fetch_small(&base_url, &manifest_name).await? {
            for shard in pack::parse_manifest(&manifest).map_err(|e| format!("{manifest_name}: {e}"))? {
                if !data_files.contains(&shard) {
                    data_files.push(shard);
                }
            }
            write_small(&staging, &manifest_name, &manifest, &mut files).await?;
        }
        for name in data_files {
            pack::validate_relative_path(&name).map_err(|e| format!("{graph_name}: {e}"))?;
            let bytes = download(&base_url, &name, &staging).await?;
            files.push(PackFile { path: name, bytes });
        }
    }
    let record = PackRecord { source: base_url, bytes: files.iter().map(|f| f.bytes).sum(), files };
    replace_pack(&staging, &record).await?;
    Ok((crate::js::to_js(&record), None))
}

/// Fetches a small file; `None` on 404.
async fn fetch_small(base_url: &str, name: &str) -> Result<Option<Vec<u8>>, String> {
    let response = fetch(base_url, name).await?;
    if response.status() == 404 {
        return Ok(None);
    }
    check_status(&response, base_url, name)?;
    let buffer = JsFuture::from(response.array_buffer().map_err(|e| error_text(&e))?)
        .await
        .map_err(|e| format!("downloading {name}: {}", error_text(&e)))?;
    Ok(Some(Uint8Array::new(&buffer).to_vec()))
}

async fn fetch(base_url: &str, name: &str) -> Result<Response, String> {
    let scope: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
    let url = format!("{base_url}{name}");
    let response = JsFuture::from(scope.fetch_with_str(&url))
        .await
        .map_err(|e| format!("downloading {url} failed: {}", error_text(&e)))?;
    Ok(response.unchecked_into())
}

fn check_status(response: &Response, base_url: &str, name: &str) -> Result<(), String> {
    if response.ok() {
        Ok(())
    } else {
        Err(format!("downloading {base_url}{name} failed: HTTP {}", response.status()))
    }
}

async fn write_small(
    dir: &FileSystemDirectoryHandle,
    name: &str,
    bytes: &[u8],
    files: &mut Vec<PackFile>,
) -> Result<(), String> {
    let file = SyncFile::create(dir, name).await?;
    file.write_at(&Uint8Array::from(bytes), 0.0)?;
    file.close()?;
    files.push(PackFile { path: name.to_owned(), bytes: bytes.len() as u64 });
    Ok(())
}

/// Streams one file into OPFS, reporting progress.
async fn download(base_url: &str, name: &str, dir: &FileSystemDirectoryHandle) -> Result<u64, String> {
    let response = fetch(base_url, name).await?;
    check_status(&response, base_url, name)?;
    let total = response
        .headers()
        .get("content-length")
        .ok()
        .flatten()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let body = response.body().ok_or_else(|| format!("downloading {name}: the response has no body"))?;
    let reader: ReadableStreamDefaultReader = body.get_reader().unchecked_into();
    let file = SyncFile::create(dir, name).await?;
    let mut done = 0u64;
    let mut reported = 0u64;
    report(name, 0, total);
    loop {
        let chunk = JsFuture::from(reader.read())
            .await
            .map_err(|e| format!("downloading {name} was interrupted: {}", error_text(&e)))?;
        if get(&chunk, "done").as_bool().unwrap_or(true) {
            break;
        }
        let bytes: Uint8Array = get(&chunk, "value").unchecked_into();
        file.write_at(&bytes, done as f64)?;
        done += u64::from(bytes.length());
        if done - reported >= PROGRESS_EVERY {
            report(name, done, total);
            reported = done;
        }
    }
    file.close()?;
    if total != 0 && done != total {
        return Err(format!("downloading {name}: got {done} of {total} bytes"));
    }
    report(name, done, total.max(done));
    Ok(done)
}

fn report(file: &str, done: u64, total: u64) {
    post(
        &Obj::new()
            .set("kind", "packProgress")
            .set("file", file)
            .set("doneBytes", done as f64)
            .set("totalBytes", total as f64)
            .build(),
        None,
    );
}

/// Swaps the staged files in as the installed pack, record last.
async fn replace_pack(staging: &FileSystemDirectoryHandle, record: &PackRecord) -> Result<(), String> {
    let root = opfs::root().await?;
    opfs::remove(&root, PACK_DIR).await?;
    let pack_dir = opfs::dir(PACK_DIR, true).await?;
    for file in &record.files {
        let handle = opfs::file_handle(staging, &file.path, false).await?;
        // `FileSystemHandle.move` (OPFS) renames without copying the bytes.
        let mover: js_sys::Function =
            Reflect::get(&handle, &"move".into()).map_err(|e| error_text(&e))?.unchecked_into();
        let promise = mover.call1(&handle, &pack_dir).map_err(|e| error_text(&e))?;
        JsFuture::from(js_sys::Promise::from(promise))
            .await
            .map_err(|e| format!("moving {} into place: {}", file.path, error_text(&e)))?;
    }
    let text = serde_json::to_vec(record).map_err(|e| e.to_string())?;
    let mut written = Vec::new();
    write_small(&pack_dir, PACK_RECORD, &text, &mut written).await?;
    opfs::remove(&root, STAGING_DIR).await
}
