//! The Imagine pipeline without the web.
//!
//! Everything here is plain Rust that builds for `wasm32-unknown-unknown` and is tested natively; the
//! browser crates call it from their workers. One generation goes through these stages, in order:
//!
//! 1. **Parameters** ([`params`]): a `generate` request ([`api::GenerateRequest`]) is validated into
//!    [`GenerateParams`]: size, steps, seed, schedule, backend. The service worker does this before
//!    it accepts a job.
//! 2. **Prompt** ([`prompt`]): [`PromptEncoder`] wraps the prompt in the Qwen3 chat template and
//!    tokenizes it to 512 ids plus an attention mask, the text encoder graph's inputs.
//! 3. **Schedule** ([`schedule`]): [`Schedule::sigmas`] gives the `steps + 1` noise levels.
//! 4. **Latents** ([`latents`]): position ids for text and image tokens, the initial noise from the
//!    seed, and the Euler step `x += (sigma_next - sigma) * v` after each transformer call.
//! 5. **Decoder input** ([`latents`] again): the final tokens unpacked to `[128, h, w]`, or
//!    unpatchified to `[32, 2h, 2w]`, whichever the decoder graph asks for.
//! 6. **Image** ([`image`]): the decoder's sample to RGBA8, then a PNG carrying the parameters.
//!
//! [`stages`] runs these in order around the three graphs: [`encode_prompt`] (text encoder),
//! [`denoise`] (the transformer, one call per step) and [`decode`] (VAE decoder), each checking the
//! graph's declared inputs and outputs first. They reach a graph only through the [`Session`] trait
//! ([`session`]), which the web crate implements on ONNX Runtime Web and the tests with a fake.
//!
//! Beside the pipeline: [`pack`] is the contract with the model pack (graph file names, shard
//! manifests, external-data locations), [`hub`] plans, verifies and resumes the pack's download from a
//! Hugging Face Hub (URLs, Hub JSON, resumable SHA-256, the download record), and [`api`] holds the
//! message API types, [`gallery`] the images kept on this machine (index, search, limits, export),
//! [`device_verdict`] what the pages say will happen on this device, and [`storage`] the layout of packs in
//! OPFS and how a new pack replaces the installed one. [`embedding_cache`] keys, bounds and checks the cached
//! prompt embeddings that let a repeated prompt skip the text encoder. [`graph::rewrite`] turns a
//! float16-activation graph into a float32 one for WebGPU adapters without `shader-f16`, with a plan to
//! convert its weights piece by piece; [`graph::split`] cuts the VAE decoder into a chain of smaller graphs
//! whose activations fit GPU memory. Two edits of a graph's protobuf in memory, made by the stage worker
//! before it creates a session: [`graph::tables`] takes embedding tables out of the graph, and
//! [`graph::reblock`] re-blocks `MatMulNBits` to the block size of ONNX Runtime Web's fast WebGPU kernel.
//!
//! Numerics follow the upstream diffusers pipeline (ARCHITECTURE.md, "Numerics";
//! `tests/reference/reference.py` recomputes it independently); each module says where and why it
//! departs from it.

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

pub use image::{encode_png, read_png_meta, to_rgba8, ImageError, PngMeta};
pub use latents::{
    euler_step, from_f16, image_ids, initial_noise, text_ids, to_f16, unpack_tokens, unpatchify, LengthError,
};
pub use pack::{external_data_locations, parse_manifest, validate_relative_path, Graph, PackError};
pub use params::{keep_loaded_seconds, Backend, GenerateParams, ParamError};
pub use prompt::{EncodedPrompt, PromptEncoder, PromptError};
pub use schedule::Schedule;
pub use session::{DType, Dim, FloatType, Session, SessionError, Tensor, TensorData, TensorInfo};
pub use stages::{decode, denoise, encode_image, encode_prompt, DenoiseParams, Denoised, StageError};
