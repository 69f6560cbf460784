//! Storing the re-blocked (block 32) forms of graphs beside the installed pack, for WebGPU.

use super::*;

/// Stores the re-blocked forms of `graphs` with the installed pack `commit` and adds them to its record,
/// for graphs a stage had to re-block while loading: a pack installed by an older version, one
/// converted for an adapter that has since gained `shader-f16`, or a stored form the stage found
/// damaged (its record entry is dropped first, then it is made again). Jobs may run meanwhile: the new
/// files are read by no one until the record names them. Too little space is refused before anything
/// is written, and what a failure leaves half-written is removed. The record is changed in one write of
/// the state, holding the state's lock ([`opfs::lock_pack_state`]), and only while `commit` is still
/// installed: a pack swapped or deleted meanwhile is never brought back.
pub(super) async fn store_block32(commit: &str, graphs: &[String]) -> Result<(), DownloadError> {
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
pub(super) async fn change_block32(
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
pub(super) fn webgpu_graphs(graphs: &[GraphFiles], plans: Option<&[GraphPlan]>) -> Vec<(String, Vec<u8>)> {
    graphs
        .iter()
        .map(|g| match plans.and_then(|plans| plans.iter().find(|p| p.graph == g.graph)) {
            Some(plan) => (converted_graph_name(plan.graph), plan.rewrite.graph.clone()),
            None => (g.graph.file_name(), g.onnx.clone()),
        })
        .collect()
}
