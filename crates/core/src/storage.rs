//! Where the extension keeps packs in OPFS, and the rule that keeps an installed pack usable through any
//! interruption.
//!
//! ```text
//! packs/state.json   which slot holds the installed pack (with its record) and which stages downloads
//! packs/a/, packs/b/ the two slots: one holds the installed pack, the other a download in progress
//! gallery/           every finished image, `<job>.png` (`<job>-<i>.png` for image i > 0 of a
//!                    batch), and its index (see `crate::gallery`); a job's
//!                    state (in `chrome.storage.session`, whose 10 MiB would not hold a large PNG)
//!                    points there
//! cache/embeddings/  the prompt embeddings of recent prompts (`crate::embedding_cache`)
//! ```
//!
//! A new pack is downloaded and verified in the staging slot while the installed one stays where it is.
//! Installing it is one write of `state.json` ([`PackState::swapped`]), which the browser replaces whole;
//! only then is the previous pack's slot emptied, to stage the next download. Whatever stops the browser,
//! `state.json` names either the old pack or the new one, both complete, and repeating any step is
//! harmless.

use serde::{Deserialize, Serialize};

use crate::api::{PackFile, PackPlan, PackSource};
use crate::graph::pack_conversion::{converted_graph_name, ConversionRecord, CONVERSION_STATE_FILE};
use crate::graph::reblock::{ReblockedGraph, ReblockedRecord, COMPUTED_DATA};
use crate::pack::Graph;

/// The directory of both slots and the state file.
pub const PACKS_DIR: &str = "packs";
/// The state file in [`PACKS_DIR`].
pub const STATE_FILE: &str = "state.json";
/// What earlier versions kept at the OPFS root (`pack/`, `pack-staging/`, job images in `results/`,
/// now in the gallery, the images of private jobs in `private/`, now in memory only). Nothing reads
/// them; they are removed wherever stray files are cleaned up.
pub const LEGACY_DIRS: [&str; 4] = ["pack", "pack-staging", "results", "private"];
/// The two slots of the download record, in the staging slot (see the web crate's `download.rs`).
pub const DOWNLOAD_RECORD_SLOTS: [&str; 2] = ["download-a.json", "download-b.json"];

/// File names a pack may not use: they would overwrite our own bookkeeping in the slot.
pub fn is_reserved_name(path: &str) -> bool {
    reserved_name(path).is_some()
}

/// Why a pack may not use the file name `path`, if it may not: the download's own records, and the
/// files Imagine writes beside an installed pack, the graphs re-blocked to 32 (`<stem>.b32.onnx`,
/// `<stem>.b32.data` of each graph and of its float32 conversion, and the name under which a stage
/// hands ORT the values it computes while loading), which would overwrite the pack's file after it
/// was verified, and later remove it.
pub fn reserved_name(path: &str) -> Option<&'static str> {
    if DOWNLOAD_RECORD_SLOTS.contains(&path) || path == STATE_FILE || path == CONVERSION_STATE_FILE {
        return Some("the name is reserved for the download's own records");
    }
    let stored_form = Graph::ALL
        .iter()
        .flat_map(|&graph| [graph.file_name(), converted_graph_name(graph)])
        .flat_map(|graph| {
            let (onnx, data) = ReblockedGraph::names(&graph);
            [onnx, data]
        })
        .any(|name| name == path);
    (stored_form || path == COMPUTED_DATA)
        .then_some("the name is reserved for the graphs Imagine re-blocks to 32 and keeps beside the pack")
}

/// One of the two pack directories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Slot {
    /// `packs/a/`
    A,
    /// `packs/b/`
    B,
}

impl Slot {
    /// The other slot.
    pub fn other(self) -> Slot {
        match self {
            Slot::A => Slot::B,
            Slot::B => Slot::A,
        }
    }

    /// Its directory's name inside [`PACKS_DIR`].
    pub fn dir_name(self) -> &'static str {
        match self {
            Slot::A => "a",
            Slot::B => "b",
        }
    }
}

/// What is installed: written in the same write that makes it the installed pack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackRecord {
    /// Where the pack came from.
    pub source: PackSource,
    /// The commit every file was downloaded at.
    pub commit: String,
    /// Every file, as listed at that commit.
    pub files: Vec<PackFile>,
    /// Their total size.
    pub bytes: u64,
    /// The float32 graphs made for an adapter without `shader-f16`, if any (in the same slot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversion: Option<ConversionRecord>,
    /// The graphs re-blocked for WebGPU and stored with the pack, if it was installed for WebGPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block32: Option<ReblockedRecord>,
}

impl PackRecord {
    /// The record of `files` from `source` at `commit`.
    pub fn new(source: PackSource, commit: String, files: Vec<PackFile>) -> PackRecord {
        let bytes = files.iter().map(|f| f.size).sum();
        PackRecord { source, commit, files, bytes, conversion: None, block32: None }
    }

    /// Whether this pack is what `plan` would download: then there is nothing to download.
    pub fn matches(&self, plan: &PackPlan) -> bool {
        self.source == plan.source && self.commit == plan.commit && self.files == plan.files
    }
}

/// The contents of `packs/state.json`. The installed pack, if any, is always in the slot that does not
/// stage, so the two can never be the same directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PackState {
    /// The slot downloads are staged in.
    pub staging: Slot,
    /// The pack in the other slot, if one is installed.
    pub installed: Option<PackRecord>,
}

impl Default for PackState {
    fn default() -> Self {
        PackState { staging: Slot::A, installed: None }
    }
}

impl PackState {
    /// The slot of the installed pack.
    pub fn installed_slot(&self) -> Option<Slot> {
        self.installed.as_ref().map(|_| self.staging.other())
    }

    /// The slot that holds neither the installed pack nor a download: what is in it can be removed.
    pub fn unused_slot(&self) -> Option<Slot> {
        self.installed.is_none().then(|| self.staging.other())
    }

    /// The state once the staging slot's verified pack is installed: the previous pack's slot stages the
    /// next download (and is emptied once this state is written).
    pub fn swapped(&self, record: PackRecord) -> PackState {
        PackState { staging: self.staging.other(), installed: Some(record) }
    }

    /// The state once the installed pack is deleted; a download in progress stays where it is.
    pub fn deleted(&self) -> PackState {
        PackState { staging: self.staging, installed: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(commit: &str) -> PackRecord {
        let source = PackSource {
            endpoint: "https://huggingface.co".into(),
            repo: "o/r".into(),
            revision: "main".into(),
        };
        let files = vec![PackFile { path: "x.onnx".into(), size: 3, sha256: None, git_oid: None }];
        PackRecord { source, commit: commit.into(), files, bytes: 3, conversion: None, block32: None }
    }

    #[test]
    fn a_swap_installs_the_staging_slot_and_stages_in_the_other() {
        let start = PackState::default();
        assert_eq!(start.installed_slot(), None);
        assert_eq!(start.unused_slot(), Some(Slot::B));
        let first = start.swapped(record("1"));
        assert_eq!(first.installed_slot(), Some(Slot::A));
        assert_eq!(first.staging, Slot::B);
        assert_eq!(first.unused_slot(), None);
        let second = first.swapped(record("2"));
        assert_eq!(second.installed_slot(), Some(Slot::B));
        assert_eq!(second.staging, Slot::A);
        assert_eq!(second.installed.as_ref().map(|r| r.commit.as_str()), Some("2"));
    }

    #[test]
    fn deleting_keeps_the_staging_slot() {
        let state = PackState::default().swapped(record("1"));
        let deleted = state.deleted();
        assert_eq!(deleted.staging, state.staging);
        assert_eq!(deleted.installed_slot(), None);
        assert_eq!(deleted.unused_slot(), Some(Slot::A));
    }

    #[test]
    fn the_state_file_round_trips_and_refuses_unknown_fields() {
        let state = PackState::default().swapped(record("1"));
        let text = serde_json::to_string(&state).unwrap();
        assert_eq!(serde_json::from_str::<PackState>(&text).unwrap(), state);
        assert!(serde_json::from_str::<PackState>(r#"{"staging":"a","installed":null,"x":1}"#).is_err());
        assert!(serde_json::from_str::<PackState>(r#"{"staging":"c","installed":null}"#).is_err());
    }

    #[test]
    fn bookkeeping_names_are_reserved() {
        for name in ["download-a.json", "download-b.json", "state.json"] {
            assert!(is_reserved_name(name), "{name}");
        }
        assert!(!is_reserved_name("transformer_q8.onnx"));
    }

    #[test]
    fn the_re_blocked_forms_names_are_reserved() {
        for name in [
            "transformer_q8.b32.onnx",
            "transformer_q8.b32.data",
            "text_encoder_q4.b32.onnx",
            "vae_decoder.b32.data",
            "transformer_q8.f32.b32.onnx",
            "text_encoder_q4.f32.b32.data",
            "imagine-block32.data",
        ] {
            assert_eq!(
                reserved_name(name),
                Some("the name is reserved for the graphs Imagine re-blocks to 32 and keeps beside the pack"),
                "{name}"
            );
        }
        for name in ["transformer_q8-00000.data", "transformer_q8.f32.onnx", "other.b32.onnx", "x.b32.data"] {
            assert_eq!(reserved_name(name), None, "{name}");
        }
    }
}
