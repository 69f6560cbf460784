//! The graphs re-blocked to 32 (`imagine_core::graph::reblock`) stored beside the pack, for WebGPU:
//! made in the download worker, in the staging slot, after the download (and the float32 conversion)
//! and before the pack is installed; and, for graphs a stage had to re-block while loading, later,
//! into the installed pack ([`store_reblocked`]).
//!
//! * Verified: the stored form is a pure function of the verified files it is made from, so after it is
//!   written it is computed again and compared with what reads back, byte for byte. A file that
//!   differs is made again once, then the install stops.
//! * Not resumed: it takes seconds, so an install interrupted here makes it again from the start.
//! * Installed with the pack: the `ReblockedRecord` goes into the pack record in the one `state.json`
//!   write that installs the pack; the files live in the slot and go with it.

use super::*;
use crate::platform::js::LogError;
use crate::platform::opfs::{self, OpfsError, SyncFile};
use imagine_core::graph::reblock::{self, DataRange, PieceDigest, ReblockedGraph, ReblockedRecord};
use imagine_core::pack;
use js_sys::Uint8Array;
use std::cell::Cell;
use std::collections::HashMap;
use wasm_bindgen::JsValue;
use wasm_bindgen_futures::JsFuture;
use web_sys::FileSystemDirectoryHandle;

/// Stores the re-blocked forms of `graphs` with the installed pack `commit` and adds them to its record,
/// for graphs a stage had to re-block while loading: a pack installed by an older version, one
/// converted for an adapter that has since gained `shader-f16`, or a stored form the stage found
/// damaged (its record entry is dropped first, then it is made again). Jobs may run meanwhile: the new
/// files are read by no one until the record names them. Too little space is refused before anything
/// is written, and what a failure leaves half-written is removed. The record is changed in one write of
/// the state, holding the state's lock ([`opfs::lock_pack_state`]), and only while `commit` is still
/// installed: a pack swapped or deleted meanwhile is never brought back.
pub(super) async fn store_reblocked(commit: &str, graphs: &[String]) -> Result<(), DownloadError> {
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
        needed += reblock::stored_bytes(graph, &model).map_err(ConvertError::from)?;
        // What a damaged form or an interrupted store left is not counted as used.
        remove_form(&dir, graph).await;
    }
    let usage = opfs::storage_use().await?;
    hub::check_space(needed, usage.usage_bytes, usage.quota_bytes)?;
    let stored = store(&dir, &todo).await?;
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
            remove_form(&dir, graph).await;
        }
    }
    Ok(())
}

/// Changes the record of stored forms of the installed pack `commit` in one write of the state, holding
/// the state's lock; `false` (and nothing written) when that pack is not installed any more.
pub(super) async fn change_block32(
    commit: &str,
    change: impl FnOnce(&mut ReblockedRecord),
) -> Result<bool, DownloadError> {
    let _lock = opfs::lock_pack_state().await;
    let state = opfs::pack_state().await?;
    let Some(mut installed) = state.installed.clone().filter(|p| p.commit == commit) else {
        return Ok(false);
    };
    change(installed.block32.get_or_insert_with(ReblockedRecord::default));
    opfs::write_pack_state(&opfs::PackState { installed: Some(installed), ..state }).await?;
    Ok(true)
}

/// Each graph of the pack as a WebGPU stage will load it (its float32 conversion where `plans` has
/// one), by file name.
pub(super) fn webgpu_graphs(graphs: &[GraphFiles], plans: Option<&[GraphPlan]>) -> Vec<(String, Vec<u8>)> {
    graphs
        .iter()
        .map(|g| match plans.and_then(|plans| plans.iter().find(|p| p.graph == g.graph)) {
            Some(plan) => (converted_graph_name(plan.graph), plan.rewrite.graph.clone()),
            None => (g.graph.file_name(), g.onnx.clone()),
        })
        .collect()
}

/// Stores the re-blocked form of each of `graphs` (file names in `dir`: the graphs a WebGPU stage will
/// load) that has a node to re-block; the record to install with the pack.
pub async fn store(
    dir: &FileSystemDirectoryHandle,
    graphs: &[String],
) -> Result<ReblockedRecord, ConvertError> {
    let mut record = ReblockedRecord::default();
    for graph in graphs {
        let model = opfs::read(dir, graph).await?;
        let read = read_sources(dir, graph, &model).await?;
        let stored = match store_graph(dir, graph, &model, &read).await {
            Ok(stored) => stored,
            Err(error) => {
                // Nothing half-written stays behind (a full disk, say): the files are named by no
                // record yet, and would only take space.
                remove_form(dir, graph).await;
                return Err(error);
            }
        };
        match stored {
            Some(stored) => record.graphs.push(stored),
            None => record.unchanged.push(graph.clone()),
        }
    }
    Ok(record)
}

/// Removes the stored files of `graph`'s form, if any (a failure to is logged: they are only space).
pub async fn remove_form(dir: &FileSystemDirectoryHandle, graph: &str) {
    let (onnx, data) = ReblockedGraph::names(graph);
    for file in [onnx, data] {
        opfs::remove(dir, &file).await.warn_on_error(&format!("removing {file}"));
    }
}

/// The stored scales and zero points `model` (the graph `graph`) re-blocks, by range. Read through
/// `File` slices, which take no lock: a stage worker may be loading the same files (the installed pack).
async fn read_sources(
    dir: &FileSystemDirectoryHandle,
    graph: &str,
    model: &[u8],
) -> Result<HashMap<DataRange, Vec<u8>>, ConvertError> {
    let broken = |source| ConvertError::Graph { graph: graph.to_owned(), source };
    // Only the files the graph's external data names, checked to stay inside the slot.
    let files: HashMap<String, String> = pack::external_data_locations(model)
        .map_err(broken)?
        .into_iter()
        .map(|f| (f.location, f.file))
        .collect();
    let mut opened: HashMap<&str, web_sys::File> = HashMap::new();
    let mut read = HashMap::new();
    for range in reblock::sources_to_read(model)? {
        // A location the graph does not list as external data is left to the edit's nodes.
        let Some(file) = files.get(&range.location) else { continue };
        if !opened.contains_key(file.as_str()) {
            opened.insert(file, opfs::file(dir, file).await?);
        }
        let failed = |e: JsValue| OpfsError::js(opfs::Op::Read, file, e);
        let end = range.offset + range.length;
        let slice =
            opened[file.as_str()].slice_with_f64_and_f64(range.offset as f64, end as f64).map_err(failed)?;
        let bytes = Uint8Array::new(&JsFuture::from(slice.array_buffer()).await.map_err(failed)?).to_vec();
        if bytes.len() as u64 != range.length {
            return Err(ConvertError::ShortSource {
                file: file.clone(),
                end,
                tensor: format!("{graph} (MatMulNBits scales or zero points)"),
            });
        }
        read.insert(range, bytes);
    }
    Ok(read)
}

/// Writes `graph`'s re-blocked form and checks it; `None` when it has no node to re-block.
async fn store_graph(
    dir: &FileSystemDirectoryHandle,
    graph: &str,
    model: &[u8],
    read: &HashMap<DataRange, Vec<u8>>,
) -> Result<Option<ReblockedGraph>, ConvertError> {
    let (onnx, data) = ReblockedGraph::names(graph);
    for _ in 0..2 {
        let data_file = SyncFile::create(dir, &data).await?;
        let mut failed: Option<OpfsError> = None;
        let mut written = 0;
        // Its checksum goes into the record, so that a stage can check the file before it loads it.
        let mut digest = PieceDigest::new();
        let reblocked = reblock::to_block_32_computed(model, read, &data, &mut |chunk| {
            // After a failed write (the disk full, say) nothing more is written.
            if failed.is_none() {
                if let Err(e) = data_file.write_at(chunk, written) {
                    failed = Some(e);
                }
            }
            digest.update(chunk);
            written += chunk.len() as u64;
        })?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        if reblocked.changed == 0 {
            drop(data_file);
            opfs::remove(dir, &data).await?;
            return Ok(None);
        }
        data_file.flush()?;
        let graph_file = SyncFile::create(dir, &onnx).await?;
        graph_file.write_at(&reblocked.graph, 0)?;
        graph_file.flush()?;
        if reads_back(&graph_file, &reblocked.graph)? && data_reads_back(&data_file, model, read, &data)? {
            let stored =
                ReblockedGraph::new(graph, &reblocked.graph, reblocked.data_length, &digest.finalize());
            opfs::failpoint("block32:graph-done").await;
            return Ok(Some(stored));
        }
    }
    Err(ConvertError::Corrupt(onnx))
}

/// Whether `file` holds exactly `bytes`.
fn reads_back(file: &SyncFile, bytes: &[u8]) -> Result<bool, OpfsError> {
    let mut back = vec![0; bytes.len()];
    Ok(file.size()? == bytes.len() as u64 && file.read_at(&mut back, 0)? == bytes.len() && back == bytes)
}

/// Whether `file` holds exactly the computed data of `model`'s re-blocked form, computed again.
fn data_reads_back(
    file: &SyncFile,
    model: &[u8],
    read: &HashMap<DataRange, Vec<u8>>,
    location: &str,
) -> Result<bool, ConvertError> {
    let failed: Cell<Option<OpfsError>> = Cell::new(None);
    let mut same = true;
    let mut offset = 0;
    let mut back = Vec::new();
    let again = reblock::to_block_32_computed(model, read, location, &mut |chunk| {
        back.resize(chunk.len(), 0);
        match file.read_at(&mut back, offset) {
            Ok(n) => same &= n == chunk.len() && back == chunk,
            Err(e) => failed.set(Some(e)),
        }
        offset += chunk.len() as u64;
    })?;
    if let Some(e) = failed.take() {
        return Err(e.into());
    }
    Ok(same && file.size()? == again.data_length)
}
