//! A whole pack converted for one adapter without `shader-f16`: which graphs, which files, what it
//! costs, and the record kept with the installed pack.
//!
//! The web side (the download worker) runs [`plan_pack`] on the pack's graphs before it downloads
//! anything, so a graph the rewrite refuses stops the install before a weight is fetched, and the
//! quota check and the popup's notice know the extra disk ([`ConversionCost`]). Once every file is
//! verified it writes what the plans say into the staging slot and records a [`ConversionRecord`] in
//! the pack record, in the same `state.json` write that installs the pack.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{rewrite, EmbeddingLookup, Limits, LookupPolicy, NewFile, Options, Piece, Rewrite, RewriteError};
use crate::api::ConversionCost;
use crate::message::{Localize, Message};
use crate::pack::{declares_float16, Graph, PackError};

/// Which tables leave the graph when the extension converts a pack: every table read only by
/// Gathers of a graph input (the text encoder's embedding). Looking its rows up outside the graph
/// costs a few kB of reads per prompt and saves the whole table's float32 copy on disk and on the
/// GPU (1.56 GB for Qwen3's table, which does not fit SwiftShader's 1 GiB buffers anyway); it also
/// means every converted pack, the tiny ones in the tests included, goes through the same lookup.
pub const PACK_LOOKUP: LookupPolicy = LookupPolicy::Always;

/// The bookkeeping file of a conversion in progress, in the staging slot.
pub const CONVERSION_STATE_FILE: &str = "conversion.json";

/// Float16 bytes converted at once (8 MiB of float32 written): what the conversion holds in memory,
/// in the extension's download worker and in the native `convert_pack` example alike.
pub const PIECE_SOURCE_BYTES: u64 = 4 << 20;

/// The converted graph's file name: `<stem>.f32.onnx`.
pub fn converted_graph_name(graph: Graph) -> String {
    format!("{}.f32.onnx", graph.stem())
}

/// The rewrite of one graph of the pack.
#[derive(Debug, Clone)]
pub struct GraphPlan {
    /// Which graph.
    pub graph: Graph,
    /// Its float32 graph and conversion plan.
    pub rewrite: Rewrite,
}

impl GraphPlan {
    /// Each new external-data file with its pieces of at most `max_source_bytes` float16 bytes, in
    /// the order they are written (increasing target offsets, so a resumed file skips the pieces
    /// below its saved length). The converted graph itself ([`converted_graph_name`]) comes after.
    pub fn file_pieces(&self, max_source_bytes: u64) -> Vec<(&NewFile, Vec<Piece>)> {
        let mut pieces = self.rewrite.plan.pieces(max_source_bytes);
        self.rewrite
            .plan
            .new_files
            .iter()
            .map(|new| {
                let (mine, rest) = pieces.drain(..).partition(|p: &Piece| p.target.file == new.name);
                pieces = rest;
                (new, mine)
            })
            .collect()
    }
}

/// Why a pack cannot be converted.
#[derive(Debug, thiserror::Error)]
pub enum PackConversionError {
    /// A graph the rewrite refuses (it names the node and operator).
    #[error("{graph}: {source}")]
    Rewrite {
        /// The graph's file name.
        graph: String,
        /// Why.
        source: RewriteError,
    },
    /// A graph that is not a readable ONNX model.
    #[error("{graph}: {source}")]
    Graph {
        /// The graph's file name.
        graph: String,
        /// Why.
        source: PackError,
    },
    /// A file the conversion would write that the pack already has.
    #[error("the pack has a file {0:?}, which the float32 conversion writes: rename it in the pack")]
    Collision(String),
}

/// Rewrites every graph of `graphs` that declares float16, for an adapter with `limits`. Graphs that
/// do not declare float16 are left out (they run as they are). `listed` is every file of the pack:
/// a new file may not overwrite one of them.
pub fn plan_pack(
    graphs: &[(Graph, &[u8])],
    limits: Limits,
    listed: &[&str],
) -> Result<Vec<GraphPlan>, PackConversionError> {
    let mut plans = Vec::new();
    for &(graph, bytes) in graphs {
        let name = graph.file_name();
        if !declares_float16(bytes)
            .map_err(|source| PackConversionError::Graph { graph: name.clone(), source })?
        {
            continue;
        }
        let options = Options { lookup: PACK_LOOKUP, ..Options::new(graph.stem(), limits) };
        let rewrite = rewrite(bytes, &options)
            .map_err(|source| PackConversionError::Rewrite { graph: name, source })?;
        let new_names = std::iter::once(converted_graph_name(graph))
            .chain(rewrite.plan.new_files.iter().map(|f| f.name.clone()));
        for new in new_names {
            if listed.contains(&new.as_str()) || crate::storage::is_reserved_name(&new) {
                return Err(PackConversionError::Collision(new));
            }
        }
        plans.push(GraphPlan { graph, rewrite });
    }
    Ok(plans)
}

/// What converting costs: the new files and graphs on disk, and the weights the largest stage holds
/// on the GPU in float32. `file_sizes` gives the size of each file of the pack.
pub fn cost(
    plans: &[GraphPlan],
    graphs: &[(Graph, &[u8])],
    file_sizes: &HashMap<&str, u64>,
) -> ConversionCost {
    let mut extra_disk_bytes = 0;
    let mut gpu_bytes = 0u64;
    for plan in plans {
        let p = &plan.rewrite.plan;
        extra_disk_bytes += p.extra_disk_bytes + plan.rewrite.graph.len() as u64;
        // The stage's weights: what it loads (new and original files it still references), less the
        // float16 bytes of converted tensors still lying in those original files (not loaded as such:
        // ORT reads only the ranges its tensors name), plus what stays inside the graph.
        let loaded: u64 =
            p.graph_files.iter().map(|f| file_sizes.get(f.as_str()).copied().unwrap_or(0)).sum();
        let loaded =
            loaded + p.new_files.iter().map(|f| f.size).sum::<u64>() + plan.rewrite.graph.len() as u64;
        gpu_bytes = gpu_bytes.max(loaded.saturating_sub(p.stale_bytes));
    }
    // Graphs that are not converted run as they are.
    for (graph, bytes) in graphs {
        if plans.iter().any(|p| p.graph == *graph) {
            continue;
        }
        let data: u64 = crate::pack::external_data_locations(bytes)
            .map(|files| files.iter().map(|f| file_sizes.get(f.file.as_str()).copied().unwrap_or(0)).sum())
            .unwrap_or(0);
        gpu_bytes = gpu_bytes.max(data + bytes.len() as u64);
    }
    ConversionCost { extra_disk_bytes, gpu_bytes }
}

/// One converted graph in the installed pack's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConvertedGraph {
    /// The original graph's file name (`text_encoder_q4.onnx`).
    pub graph: String,
    /// The float32 graph's file name (`text_encoder_q4.f32.onnx`), in the same slot.
    pub onnx: String,
    /// Tables the stage looks up itself and feeds as float32 inputs.
    pub lookups: Vec<EmbeddingLookup>,
}

/// How the installed pack was converted: for which adapter limits, and into which graphs. Absent
/// when the pack was installed for an adapter with `shader-f16` or for the wasm backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConversionRecord {
    /// The adapter limits the tensors were placed for. An adapter with other limits needs another
    /// conversion; one with `shader-f16` uses the original graphs.
    pub limits: Limits,
    /// The converted graphs.
    pub graphs: Vec<ConvertedGraph>,
    /// Bytes the conversion wrote (graphs and tensors).
    pub bytes: u64,
}

impl ConversionRecord {
    /// The record of `plans` converted for `limits`.
    pub fn new(plans: &[GraphPlan], limits: Limits) -> ConversionRecord {
        let graphs = plans
            .iter()
            .map(|p| ConvertedGraph {
                graph: p.graph.file_name(),
                onnx: converted_graph_name(p.graph),
                lookups: p.rewrite.plan.lookups.clone(),
            })
            .collect();
        let bytes = plans
            .iter()
            .map(|p| {
                p.rewrite.plan.new_files.iter().map(|f| f.size).sum::<u64>() + p.rewrite.graph.len() as u64
            })
            .sum();
        ConversionRecord { limits, graphs, bytes }
    }

    /// The converted form of `graph`, if it was converted.
    pub fn graph(&self, graph: Graph) -> Option<&ConvertedGraph> {
        let name = graph.file_name();
        self.graphs.iter().find(|g| g.graph == name)
    }
}

/// The progress of a conversion, saved in [`CONVERSION_STATE_FILE`] in the staging slot: for each new
/// file, how many of its bytes are written and flushed. Everything is checked again before the pack is
/// installed ([`crate::graph`] conversion is a pure function of the verified source bytes), so a
/// state that is lost or torn only costs redoing the work.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConversionState {
    /// The commit of the pack being converted.
    pub commit: String,
    /// The limits it is converted for.
    pub limits: Option<Limits>,
    /// Flushed bytes of each new file, by name.
    pub written: HashMap<String, u64>,
    /// Files whose every byte was read back and checked.
    pub verified: Vec<String>,
}

impl ConversionState {
    /// Whether this state belongs to converting `commit` for `limits`; otherwise it starts over.
    pub fn is_for(&self, commit: &str, limits: Limits) -> bool {
        self.commit == commit && self.limits == Some(limits)
    }
}

/// The pack contract's details are not translated: the text is shown as it is.
impl Localize for PackConversionError {
    fn message(&self) -> Message {
        Message::text(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(pack: &str, graph: Graph) -> Vec<u8> {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/packs").join(pack);
        std::fs::read(dir.join(graph.file_name())).unwrap()
    }

    #[test]
    fn the_f16_fixture_converts_its_float16_graphs() {
        let bytes: Vec<(Graph, Vec<u8>)> = Graph::ALL.iter().map(|&g| (g, fixture("f16", g))).collect();
        let graphs: Vec<(Graph, &[u8])> = bytes.iter().map(|(g, b)| (*g, b.as_slice())).collect();
        let plans = plan_pack(&graphs, Limits::UNLIMITED, &[]).unwrap();
        let converted: Vec<Graph> = plans.iter().map(|p| p.graph).collect();
        assert!(converted.contains(&Graph::TextEncoder) && converted.contains(&Graph::Transformer));
        let encoder = plans.iter().find(|p| p.graph == Graph::TextEncoder).unwrap();
        // Its table is float32 (nothing to look up outside); `tests.rs` covers the lookups.
        assert!(encoder.rewrite.plan.lookups.is_empty(), "{:?}", encoder.rewrite.plan.lookups);
        let record = ConversionRecord::new(&plans, Limits::UNLIMITED);
        assert_eq!(record.graph(Graph::TextEncoder).unwrap().onnx, "text_encoder_q4.f32.onnx");
        let text = serde_json::to_string(&record).unwrap();
        assert_eq!(serde_json::from_str::<ConversionRecord>(&text).unwrap(), record);
        let sizes = HashMap::new();
        let cost = cost(&plans, &graphs, &sizes);
        assert!(cost.extra_disk_bytes >= record.bytes, "{cost:?} {record:?}");
    }

    #[test]
    fn the_f32_fixture_needs_no_conversion() {
        let bytes: Vec<(Graph, Vec<u8>)> = Graph::ALL.iter().map(|&g| (g, fixture("f32", g))).collect();
        let graphs: Vec<(Graph, &[u8])> = bytes.iter().map(|(g, b)| (*g, b.as_slice())).collect();
        assert!(plan_pack(&graphs, Limits::UNLIMITED, &[]).unwrap().is_empty());
    }

    #[test]
    fn a_pack_file_named_like_a_converted_file_is_refused() {
        let bytes = fixture("f16", Graph::TextEncoder);
        let err =
            plan_pack(&[(Graph::TextEncoder, &bytes)], Limits::UNLIMITED, &["text_encoder_q4.f32.onnx"])
                .unwrap_err();
        assert!(err.to_string().contains("text_encoder_q4.f32.onnx"), "{err}");
    }
}
