//! Planning: which files of the listing an install downloads, derived from the graphs and manifests.

use std::collections::{HashMap, HashSet};

use super::{verify_small, HubError};
use crate::api::{PackFile, PackPlan, PackSource};
use crate::pack::{external_data_locations, parse_manifest, Graph, PackError};
use crate::storage::reserved_name;

/// The already-downloaded small files of one graph, from which [`plan`] reads the data files it
/// needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphFiles {
    /// Which graph.
    pub graph: Graph,
    /// `<stem>.onnx`.
    pub onnx: Vec<u8>,
    /// `<stem>.manifest.json`, exactly when the listing has one.
    pub manifest: Option<Vec<u8>>,
}

/// The largest graph (`<stem>.onnx`) accepted from a listing. Graphs are read whole into memory to plan
/// (in the service worker too), and the published pack's keep their weights outside, in a few MB each.
pub const MAX_GRAPH_BYTES: u64 = 64 << 20;

/// The largest `<stem>.manifest.json` accepted from a listing: a list of shard names, about 100 bytes
/// a shard.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// The listing entries of each graph in pipeline order: `(graph, <stem>.onnx, <stem>.manifest.json
/// if listed)`. These are what the worker downloads (and checks with [`verify_small`]) before
/// [`plan`]. Every graph must be listed, at most [`MAX_GRAPH_BYTES`] (a manifest at most
/// [`MAX_MANIFEST_BYTES`]), so nothing is fetched into memory that no pack needs. `source` and `commit`
/// only name the repo in the error.
pub fn graph_files(
    source: &PackSource,
    commit: &str,
    listing: &[PackFile],
) -> Result<Vec<(Graph, PackFile, Option<PackFile>)>, HubError> {
    let find = |name: &str| listing.iter().find(|f| f.path == name).cloned();
    Graph::ALL
        .iter()
        .map(|&graph| {
            let onnx = find(&graph.file_name()).ok_or_else(|| HubError::MissingGraph {
                repo: source.repo.clone(),
                file: graph.file_name(),
                commit: commit.to_owned(),
            })?;
            let manifest = find(&graph.manifest_name());
            let within = |file: &PackFile, cap: u64| {
                if file.size > cap {
                    return Err(HubError::TooLargeToRead { file: file.path.clone(), size: file.size, cap });
                }
                Ok(())
            };
            within(&onnx, MAX_GRAPH_BYTES)?;
            if let Some(manifest) = &manifest {
                within(manifest, MAX_MANIFEST_BYTES)?;
            }
            Ok((graph, onnx, manifest))
        })
        .collect()
}

/// What an install downloads: for each graph in pipeline order, its `<stem>.onnx`, its
/// `<stem>.manifest.json` if listed, then every data file its manifest lists and its initializers
/// name ([`external_data_locations`]), manifest order first, each file once. Files of the repo the
/// graphs do not need (README, samples, other variants) are left out. Every needed file must be in
/// `listing` with a SHA-256 or a git blob id to verify it by, and none may take a name the download's
/// own records use. The graph and manifest bytes in `graphs` are checked against the listing
/// ([`verify_small`]) so the plan never derives from other bytes than the commit's.
pub fn plan(
    source: &PackSource,
    commit: &str,
    listing: &[PackFile],
    graphs: &[GraphFiles],
) -> Result<PackPlan, HubError> {
    // Indexed once: a listing or a manifest can be long, and planning stays linear in their size.
    let by_path: HashMap<&str, &PackFile> = listing.iter().map(|f| (f.path.as_str(), f)).collect();
    let mut planned = PlannedFiles::default();
    for (graph, onnx_entry, manifest_entry) in graph_files(source, commit, listing)? {
        let given = graphs.iter().find(|g| g.graph == graph).ok_or_else(|| HubError::GraphBytes {
            file: graph.file_name(),
            reason: "its bytes were not given",
        })?;
        let needed = data_files_named(graph, &onnx_entry, manifest_entry.as_ref(), given)?;
        planned.push(onnx_entry)?;
        if let Some(entry) = manifest_entry {
            planned.push(entry)?;
        }
        for (name, needed_by) in needed {
            planned.push(listed_data_file(&by_path, source, commit, name, needed_by)?)?;
        }
    }
    let files = planned.files;
    let total_bytes = files.iter().map(|f| f.size).sum();
    Ok(PackPlan { source: source.clone(), commit: commit.to_owned(), files, total_bytes, conversion: None })
}

/// The files a plan downloads so far, in order, each once.
#[derive(Default)]
struct PlannedFiles {
    files: Vec<PackFile>,
    paths: HashSet<String>,
}

impl PlannedFiles {
    /// Plans `file` unless it is already; one that takes a name the download's own records use, or has
    /// nothing to verify it by, is refused.
    fn push(&mut self, file: PackFile) -> Result<(), HubError> {
        if let Some(reason) = reserved_name(&file.path) {
            return Err(HubError::PackFile {
                file: file.path.clone(),
                error: PackError::Path { path: file.path, reason },
            });
        }
        if file.sha256.is_none() && file.git_oid.is_none() {
            return Err(HubError::Unverifiable { file: file.path });
        }
        if self.paths.insert(file.path.clone()) {
            self.files.push(file);
        }
        Ok(())
    }
}

/// The data files `graph` needs, each with the file that names it: its manifest's shards, then its
/// initializers' external data. Its bytes `given` are checked against the listing first; a manifest
/// listed without bytes, or given without being listed, is refused.
fn data_files_named(
    graph: Graph,
    onnx_entry: &PackFile,
    manifest_entry: Option<&PackFile>,
    given: &GraphFiles,
) -> Result<Vec<(String, String)>, HubError> {
    verify_small(onnx_entry, &given.onnx)?;
    let pack_err = |file: &str| {
        let file = file.to_owned();
        move |error| HubError::PackFile { file, error }
    };
    let mut needed: Vec<(String, String)> = Vec::new();
    match (manifest_entry, &given.manifest) {
        (Some(entry), Some(bytes)) => {
            verify_small(entry, bytes)?;
            for shard in parse_manifest(bytes).map_err(pack_err(&entry.path))? {
                needed.push((shard, entry.path.clone()));
            }
        }
        (Some(entry), None) => {
            return Err(HubError::GraphBytes {
                file: entry.path.clone(),
                reason: "the listing has this manifest, but its bytes were not given",
            });
        }
        (None, Some(_)) => {
            return Err(HubError::GraphBytes {
                file: graph.manifest_name(),
                reason: "manifest bytes were given, but the listing has no such file",
            });
        }
        (None, None) => {}
    }
    for external in external_data_locations(&given.onnx).map_err(pack_err(&onnx_entry.path))? {
        needed.push((external.file, onnx_entry.path.clone()));
    }
    Ok(needed)
}

/// The listing's entry of the data file `name`, which `needed_by` names. The pack is stored flat in its
/// OPFS slot, and the stage workers open its files by name: a file in a sub-folder is refused.
fn listed_data_file(
    by_path: &HashMap<&str, &PackFile>,
    source: &PackSource,
    commit: &str,
    name: String,
    needed_by: String,
) -> Result<PackFile, HubError> {
    if name.contains('/') {
        return Err(HubError::SubFolder { file: name, needed_by });
    }
    let entry = by_path.get(name.as_str()).ok_or_else(|| HubError::MissingFile {
        repo: source.repo.clone(),
        file: name.clone(),
        needed_by,
        commit: commit.to_owned(),
    })?;
    Ok((*entry).clone())
}
