//! The Imagine pipeline without the web: plain Rust that builds for `wasm32-unknown-unknown` and is
//! tested natively; the browser crates call it from their workers.
//!
//! One generation: [`params`] validates the request, [`prompt`] encodes it (Qwen3 chat template, 512
//! ids and a mask), [`schedule`] gives the sigmas, [`latents`] the noise, position ids and Euler step,
//! and [`image`] the pixels and PNG. [`stages`] runs them around the three graphs ([`encode_prompt`],
//! [`denoise`], [`decode`]) through the [`Session`] trait. Beside it: [`pack`] and [`hub`] (the model
//! pack and its download), [`storage`], [`graph`] (the graph edits), [`gpu_memory`], [`api`] (the
//! message API). Numerics follow the upstream diffusers pipeline (ARCHITECTURE.md, "Numerics").

// The workspace denies `missing_docs` (Cargo.toml). `unwrap_used` is denied here rather than there
// because xtask's tests unwrap; a panic would kill the wasm worker that runs this code.
#![deny(clippy::unwrap_used)]
// Tests may unwrap: a failing unwrap is a failing test, with the value in its message.
#![cfg_attr(test, allow(clippy::unwrap_used))]

// The message API is documented in README.md and on its types; its messages are built and
// serialized one at a time, so the size of their largest variant does not matter.
#[allow(missing_docs, clippy::large_enum_variant)]
pub mod api;
pub mod device_verdict;
pub mod embedding_cache;
pub mod estimate;
pub mod gpu_memory;
pub mod graph;
// Its item fields are the message API's (README documents them).
#[allow(missing_docs)]
pub mod gallery;
pub mod hub;
pub mod image;
pub mod latents;
pub mod message;
mod onnx;
pub mod ort_profile;
pub mod pack;
pub mod params;
pub mod prompt;
pub mod schedule;
pub mod session;
pub mod stages;
pub mod storage;

pub use image::{encode_png, read_png_meta, to_rgba8, ImageError, ImageParams};
pub use latents::{
    euler_step, from_f16, image_ids, initial_noise, text_ids, to_f16, unpack_tokens, unpatchify, LengthError,
};
pub use pack::{external_data_locations, parse_manifest, validate_relative_path, Graph, PackError};
pub use params::{keep_loaded_seconds, Backend, GenerateParams, ParamError};
pub use prompt::{EncodedPrompt, PromptEncoder, PromptError};
pub use schedule::Schedule;
pub use session::{DType, Dim, FloatType, Session, SessionError, Tensor, TensorData, TensorInfo};
pub use stages::{decode, denoise, encode_image, encode_prompt, DenoiseParams, Denoised, StageError};
