//! The offscreen document and the dedicated workers it starts: a stage worker per pipeline stage (text
//! encoder, transformer, VAE decoder) on ONNX Runtime, and the download worker (with its hash worker and
//! the float32 conversion and the block-32 form) that fills the pack's OPFS folder.

pub mod convert;
pub mod document;
pub mod download;
pub mod hasher;
pub mod jobs;
pub mod stage_worker;
