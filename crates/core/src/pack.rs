//! The pack contract: which graphs a pack holds, and which files each one needs.
//!
//! A pack (`cgb/flux2-klein-4b-onnx-webgpu`) holds three ONNX graphs. A graph's weights may live in
//! external-data files: sharded ones are listed in `<stem>.manifest.json`, and every graph records
//! the file names it needs in its initializers (`TensorProto.external_data`, key `location`). The
//! pack's card does not say which graph has which files, so the extension derives it from the pack
//! itself with [`parse_manifest`] and [`external_data_locations`], never from a hard-coded list.
//!
//! [`external_data_locations`] walks the protobuf wire format directly (varints and length-delimited
//! fields; a protobuf crate and ONNX's schema would be far more code for three field numbers).
//!
//! Names from a pack become OPFS paths, so every one passes [`validate_relative_path`].

use crate::message::{Localize, Message};
use crate::onnx::fields::{
    DATA_LOCATION_EXTERNAL, ENTRY_KEY, ENTRY_VALUE, FLOAT16, GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT,
    MODEL_GRAPH, TENSOR_DATA_LOCATION, TENSOR_EXTERNAL_DATA, TENSOR_TYPE_ELEM_TYPE, TYPE_TENSOR,
    VALUE_INFO_TYPE,
};
use crate::onnx::wire::{self, Value, WireError};
use serde::Deserialize;
use thiserror::Error;

/// One of the pack's three graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Graph {
    /// Qwen3 text encoder, int4 weights.
    TextEncoder,
    /// FLUX.2 klein transformer, int8 weights.
    Transformer,
    /// VAE decoder, float32.
    Decoder,
}

impl Graph {
    /// All graphs, in pipeline order.
    pub const ALL: [Graph; 3] = [Graph::TextEncoder, Graph::Transformer, Graph::Decoder];

    /// The file stem in the pack.
    pub fn stem(self) -> &'static str {
        match self {
            Graph::TextEncoder => "text_encoder_q4",
            Graph::Transformer => "transformer_q8",
            Graph::Decoder => "vae_decoder",
        }
    }

    /// `<stem>.onnx`.
    pub fn file_name(self) -> String {
        format!("{}.onnx", self.stem())
    }

    /// `<stem>.manifest.json`, present when the graph's weights are sharded.
    pub fn manifest_name(self) -> String {
        format!("{}.manifest.json", self.stem())
    }
}

/// A pack file that breaks the contract.
#[derive(Debug, Error)]
pub enum PackError {
    /// A manifest that is not `{ "shards": [{ "path": ... }, ...] }`.
    #[error("the manifest is not of the form {{\"shards\": [{{\"path\": \"...\"}}, ...]}}: {0}")]
    Manifest(#[from] serde_json::Error),
    /// An ONNX file that is not a well-formed protobuf.
    #[error("the ONNX graph is not a valid protobuf: {what}: {detail}")]
    Protobuf {
        /// The message being read.
        what: &'static str,
        /// What was wrong, and where.
        detail: String,
    },
    /// A file name that cannot be used as a relative path inside the pack.
    #[error("{path:?} is not allowed as a file name in the pack: {reason}")]
    Path {
        /// The name as written in the pack.
        path: String,
        /// Why it was refused.
        reason: &'static str,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    shards: Vec<Shard>,
}

#[derive(Deserialize)]
struct Shard {
    path: String,
}

/// The shard file names of a `<stem>.manifest.json`, in order, each once. Each passes
/// [`validate_relative_path`] and is returned normalized.
pub fn parse_manifest(bytes: &[u8]) -> Result<Vec<String>, PackError> {
    let manifest: Manifest = serde_json::from_slice(bytes)?;
    let mut seen = std::collections::HashSet::new();
    let mut shards = Vec::new();
    for shard in &manifest.shards {
        let path = validate_relative_path(&shard.path)?;
        if seen.insert(path) {
            shards.push(path.to_owned());
        }
    }
    Ok(shards)
}

/// Checks a file name from the pack and returns it without leading `./`. Refuses the empty name,
/// absolute paths, `..` and empty components, backslashes and NUL.
pub fn validate_relative_path(path: &str) -> Result<&str, PackError> {
    let refuse = |reason| Err(PackError::Path { path: path.to_owned(), reason });
    if path.contains('\0') {
        return refuse("it contains NUL");
    }
    if path.contains('\\') {
        return refuse("it contains a backslash");
    }
    if path.starts_with('/') {
        return refuse("it is absolute");
    }
    let mut rest = path;
    while let Some(stripped) = rest.strip_prefix("./") {
        rest = stripped;
    }
    if rest.is_empty() {
        return refuse("it is empty");
    }
    for component in rest.split('/') {
        match component {
            ".." => return refuse("it has a `..` component"),
            "" | "." => return refuse("it has an empty or `.` component"),
            _ => {}
        }
    }
    Ok(rest)
}

/// One external-data file a graph's initializers name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalFile {
    /// The `location` exactly as the graph records it: what ONNX Runtime Web matches
    /// `externalData[].path` against.
    pub location: String,
    /// The file it names in the pack ([`validate_relative_path`]: `./w.data` is `w.data`). The planner
    /// downloads it under this name and the stage workers open it by this name.
    pub file: String,
}

/// The external-data files the initializers of an ONNX model name, unique by location, in first-seen
/// order. Each location is checked with [`validate_relative_path`]. A model with all its weights inside
/// gives an empty list. Linear in the size of the model.
pub fn external_data_locations(onnx_bytes: &[u8]) -> Result<Vec<ExternalFile>, PackError> {
    let mut files: Vec<ExternalFile> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for graph in wire::bytes_fields(onnx_bytes, MODEL_GRAPH, "ModelProto")? {
        for tensor in wire::bytes_fields(graph, GRAPH_INITIALIZER, "GraphProto")? {
            if let Some(location) = tensor_location(tensor)? {
                let file = validate_relative_path(location)?;
                if seen.insert(location) {
                    files.push(ExternalFile { location: location.to_owned(), file: file.to_owned() });
                }
            }
        }
    }
    Ok(files)
}

/// Whether any declared input or output of the model's graph is float16. Read from the graph itself,
/// before a session exists, because loading a float16 graph on a WebGPU device without `shader-f16`
/// fails or, on some backends, silently computes zeros.
pub fn declares_float16(onnx_bytes: &[u8]) -> Result<bool, PackError> {
    for graph in wire::bytes_fields(onnx_bytes, MODEL_GRAPH, "ModelProto")? {
        let inputs = wire::bytes_fields(graph, GRAPH_INPUT, "GraphProto")?;
        for value in inputs.into_iter().chain(wire::bytes_fields(graph, GRAPH_OUTPUT, "GraphProto")?) {
            for ty in wire::bytes_fields(value, VALUE_INFO_TYPE, "ValueInfoProto")? {
                for tensor in wire::bytes_fields(ty, TYPE_TENSOR, "TypeProto")? {
                    for field in wire::parse(tensor, "TypeProto.Tensor")? {
                        if field.number == TENSOR_TYPE_ELEM_TYPE && field.value == Value::Varint(FLOAT16) {
                            return Ok(true);
                        }
                    }
                }
            }
        }
    }
    Ok(false)
}

/// The size in bytes of the largest initializer stored as external data (its `length` entry): each one
/// must fit in a single GPU buffer, so this is checked against the adapter's limits before a download.
pub fn largest_external_tensor(onnx_bytes: &[u8]) -> Result<u64, PackError> {
    let mut largest = 0;
    for graph in wire::bytes_fields(onnx_bytes, MODEL_GRAPH, "ModelProto")? {
        for tensor in wire::bytes_fields(graph, GRAPH_INITIALIZER, "GraphProto")? {
            for entry in wire::bytes_fields(tensor, TENSOR_EXTERNAL_DATA, "TensorProto")? {
                let (key, value) = string_entry(entry)?;
                if key == b"length" {
                    let length = std::str::from_utf8(value).ok().and_then(|v| v.parse::<u64>().ok()).ok_or(
                        PackError::Protobuf {
                            what: "StringStringEntryProto",
                            detail: "an external-data length that is not a number".into(),
                        },
                    )?;
                    largest = largest.max(length);
                }
            }
        }
    }
    Ok(largest)
}

/// The `location` of a TensorProto whose `data_location` is EXTERNAL.
fn tensor_location(tensor: &[u8]) -> Result<Option<&str>, PackError> {
    let (mut external, mut location) = (false, None);
    for field in wire::parse(tensor, "TensorProto")? {
        match (field.number, field.value) {
            (TENSOR_DATA_LOCATION, Value::Varint(v)) => external = v == DATA_LOCATION_EXTERNAL,
            (TENSOR_EXTERNAL_DATA, Value::Bytes(entry)) => {
                let (key, value) = string_entry(entry)?;
                if key == b"location" {
                    let s = std::str::from_utf8(value).map_err(|_| PackError::Protobuf {
                        what: "StringStringEntryProto",
                        detail: "a location that is not UTF-8".into(),
                    })?;
                    location = Some(s);
                }
            }
            _ => {}
        }
    }
    Ok(location.filter(|_| external))
}

/// The key and value of a StringStringEntryProto (an external-data entry); absent ones are empty.
fn string_entry(entry: &[u8]) -> Result<(&[u8], &[u8]), PackError> {
    let (mut key, mut value): (&[u8], &[u8]) = (&[], &[]);
    for field in wire::parse(entry, "StringStringEntryProto")? {
        match (field.number, field.value) {
            (ENTRY_KEY, Value::Bytes(b)) => key = b,
            (ENTRY_VALUE, Value::Bytes(b)) => value = b,
            _ => {}
        }
    }
    Ok((key, value))
}

impl From<WireError> for PackError {
    fn from(e: WireError) -> Self {
        PackError::Protobuf { what: e.what, detail: e.detail }
    }
}

/// The pack contract's details are not translated: the text is shown as it is.
impl Localize for PackError {
    fn message(&self) -> Message {
        Message::text(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The locations, as the graph records them.
    fn locations(bytes: &[u8]) -> Result<Vec<String>, PackError> {
        Ok(external_data_locations(bytes)?.into_iter().map(|f| f.location).collect())
    }

    // A minimal protobuf writer for building test models by hand.
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    fn bytes_field(number: u64, payload: &[u8], out: &mut Vec<u8>) {
        varint(number << 3 | 2, out);
        varint(payload.len() as u64, out);
        out.extend_from_slice(payload);
    }
    fn varint_field(number: u64, v: u64, out: &mut Vec<u8>) {
        varint(number << 3, out);
        varint(v, out);
    }
    fn entry(key: &str, value: &str) -> Vec<u8> {
        let mut e = Vec::new();
        bytes_field(1, key.as_bytes(), &mut e);
        bytes_field(2, value.as_bytes(), &mut e);
        e
    }
    /// A TensorProto named `name`; external in `location` when given.
    fn tensor(name: &str, location: Option<&str>, location_first: bool) -> Vec<u8> {
        let mut t = Vec::new();
        varint_field(1, 4, &mut t); // dims
        varint_field(2, 1, &mut t); // data_type FLOAT
        bytes_field(8, name.as_bytes(), &mut t);
        t.extend_from_slice(&[0x25, 0, 0, 0x80, 0x3f]); // field 4 (float_data), fixed32 1.0
        if let Some(loc) = location {
            if !location_first {
                varint_field(14, 1, &mut t);
            }
            bytes_field(13, &entry("location", loc), &mut t);
            bytes_field(13, &entry("offset", "0"), &mut t);
            bytes_field(13, &entry("length", "16"), &mut t);
            if location_first {
                varint_field(14, 1, &mut t);
            }
        }
        t
    }
    fn model(tensors: &[Vec<u8>]) -> Vec<u8> {
        let mut g = Vec::new();
        bytes_field(1, b"node", &mut g); // a NodeProto-ish field to skip
        bytes_field(2, b"graph", &mut g); // name
        for t in tensors {
            bytes_field(5, t, &mut g);
        }
        let mut m = Vec::new();
        varint_field(1, 8, &mut m); // ir_version
        bytes_field(2, b"imagine-test", &mut m); // producer_name
        bytes_field(7, &g, &mut m);
        m.extend_from_slice(&[0x09, 1, 2, 3, 4, 5, 6, 7, 8]); // field 1, fixed64, skipped
        m
    }

    #[test]
    fn graph_names() {
        assert_eq!(Graph::Transformer.file_name(), "transformer_q8.onnx");
        assert_eq!(Graph::TextEncoder.manifest_name(), "text_encoder_q4.manifest.json");
        assert_eq!(Graph::Decoder.stem(), "vae_decoder");
        assert_eq!(Graph::ALL.len(), 3);
    }

    #[test]
    fn manifest() {
        let m = br#"{ "shards": [{ "path": "transformer_q8-00000.data" }, { "path": "./transformer_q8-00001.data" }] }"#;
        assert_eq!(
            parse_manifest(m).unwrap(),
            vec!["transformer_q8-00000.data", "transformer_q8-00001.data"]
        );
        assert_eq!(parse_manifest(br#"{"shards":[]}"#).unwrap(), Vec::<String>::new());
        assert!(matches!(parse_manifest(br#"{"shards":[{"size":1}]}"#), Err(PackError::Manifest(_))));
        assert!(matches!(parse_manifest(b"[]"), Err(PackError::Manifest(_))));
        assert!(matches!(parse_manifest(br#"{"shards":[{"path":"../x"}]}"#), Err(PackError::Path { .. })));
    }

    #[test]
    fn relative_paths() {
        assert_eq!(validate_relative_path("a.data").unwrap(), "a.data");
        assert_eq!(validate_relative_path("./a.data").unwrap(), "a.data");
        assert_eq!(validate_relative_path("dir/a.data").unwrap(), "dir/a.data");
        assert_eq!(validate_relative_path("..a").unwrap(), "..a");
        for bad in ["", "./", "/a", "../a", "a/../b", "a/..", "a\\b", "a\0b", "a//b", "a/./b", "a/"] {
            assert!(validate_relative_path(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            validate_relative_path("../x").unwrap_err().to_string(),
            r#""../x" is not allowed as a file name in the pack: it has a `..` component"#
        );
    }

    #[test]
    fn locations_unique_in_first_seen_order() {
        let m = model(&[
            tensor("a", Some("w-00001.data"), false),
            tensor("inline", None, false),
            tensor("b", Some("w-00000.data"), true),
            tensor("c", Some("w-00001.data"), false),
        ]);
        assert_eq!(locations(&m).unwrap(), vec!["w-00001.data", "w-00000.data"]);
        assert_eq!(locations(&model(&[tensor("x", None, false)])).unwrap(), Vec::<String>::new());
        assert_eq!(locations(&[]).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn location_without_external_flag_is_ignored() {
        let mut t = tensor("a", None, false);
        bytes_field(13, &entry("location", "ignored.data"), &mut t);
        assert_eq!(locations(&model(&[t])).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn malformed_protobuf_is_an_error() {
        let m = model(&[tensor("a", Some("w.data"), false)]);
        for cut in [1, m.len() / 2, m.len() - 3] {
            // Each cut leaves a field (a varint, a length, a fixed64) running past the end.
            let r = locations(&m[..cut]);
            assert!(matches!(r, Err(PackError::Protobuf { .. })), "cut {cut}: {r:?}");
        }
        assert!(matches!(locations(&[0x3a, 0x05, 1]), Err(PackError::Protobuf { .. })));
        assert!(matches!(locations(&[0x0b]), Err(PackError::Protobuf { .. }))); // group
        assert!(matches!(locations(&[0x80; 11]), Err(PackError::Protobuf { .. })));
        assert!(matches!(locations(&[0x38, 0x01]), Err(PackError::Protobuf { .. })));
    }

    #[test]
    fn a_dot_slash_location_names_the_plain_file() {
        let m = model(&[tensor("a", Some("./w.data"), false), tensor("b", Some("w.data"), true)]);
        let files = external_data_locations(&m).unwrap();
        assert_eq!(
            files,
            [
                ExternalFile { location: "./w.data".into(), file: "w.data".into() },
                ExternalFile { location: "w.data".into(), file: "w.data".into() },
            ]
        );
    }

    #[test]
    fn unsafe_location_is_refused() {
        let m = model(&[tensor("a", Some("../../etc/passwd"), false)]);
        assert!(matches!(locations(&m), Err(PackError::Path { .. })));
    }

    /// A model written by Python `onnx` (`tests/data/make_external_data.py`): two external-data
    /// tensors in two files, plus an inline one.
    #[test]
    fn real_onnx_file() {
        let bytes = include_bytes!("../tests/data/external_data.onnx");
        assert_eq!(locations(bytes).unwrap(), vec!["weights_a.data", "weights_b.data"]);
    }
}
