//! The ONNX protobuf, read and written without a generated schema, by every part of the core that
//! looks into a graph (`pack` and `graph`): the wire format
//! ([`wire`]: fields with their raw bytes, so that a message is written back with every other field
//! copied byte for byte) and the field numbers of `onnx.proto` ([`fields`]).

pub(crate) mod fields;
pub(crate) mod wire;
