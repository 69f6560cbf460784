//! Validation of a `generate` request into the parameters of one run.
//!
//! The service worker validates before it starts a job, so a bad request is refused at once with a
//! sentence that names the field, the value and what is allowed, instead of failing minutes later in
//! a stage worker. Everything downstream takes [`GenerateParams`], which cannot hold a bad value.
//!
//! The prompt is taken as it is: the empty prompt is valid (upstream encodes `""` fine) and a long
//! prompt is truncated to 512 tokens by the prompt encoder, which reports it.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::api::{GenerateRequest, Seed};
use crate::image::ImageParams;
use crate::message::{arg, quoted, Arg, Localize, Message};
use crate::pack::Graph;
use crate::schedule::Schedule;

/// Smallest width or height, in pixels.
pub const MIN_SIZE: u32 = 256;
/// Largest width or height, in pixels.
pub const MAX_SIZE: u32 = 1536;
/// Width and height must be multiples of this (VAE factor 8 times the 2x2 patch).
pub const SIZE_MULTIPLE: u32 = 16;
/// Largest step count.
pub const MAX_STEPS: u32 = 50;
/// Width and height when the request gives none.
pub const DEFAULT_SIZE: u32 = 512;
/// Step count when the request gives none (the distilled model's fixed 4).
pub const DEFAULT_STEPS: u32 = 4;
/// Largest seed that a JSON number carries exactly (2^53); larger seeds come as strings.
pub const MAX_JSON_NUMBER_SEED: u64 = 1 << 53;
/// Most images one `generate` request makes (seeds in a row, each graph loaded once for all).
pub const MAX_COUNT: u32 = 8;
/// The longest the model may stay loaded after the last image (`keepLoaded`), in seconds.
pub const MAX_KEEP_LOADED_SECONDS: u32 = 3600;
/// The longest prompt, in characters. Only its first 512 tokens are used (about 2,000 characters of
/// English); the cap keeps a paste accident from being tokenized and stored whole.
pub const MAX_PROMPT_CHARS: usize = 20_000;
/// The most chunks of tokens a request may ask the transformer's chains in (`GenerateRequest::token_chunks`,
/// a benchmark's switch: clamped to 1..=64, as ONNX Runtime splits the tokens however many there are).
pub const MAX_TOKEN_CHUNKS: u32 = 64;
/// The most pieces the transformer may be streamed in (`GenerateRequest::transformer_pieces`): each
/// piece's weights are read again on every step, and beyond this a piece is a block or two.
pub const MAX_TRANSFORMER_PIECES: u32 = 8;

/// The highest `MatMulNBits` `accuracy_level` (ONNX Runtime's: 4 computes with int8 activations).
pub const MAX_ACCURACY_LEVEL: u8 = 4;
/// How long it stays loaded unless the user chose otherwise: a few minutes, for the next prompt.
pub const DEFAULT_KEEP_LOADED_SECONDS: u32 = 300;
/// Above this many pixels ORT keeps every GPU buffer between runs (`GenerateParams::keep_buffers`).
/// The transformer's attention scores are then over ORT's 160 MiB cache cap even in float16 (at
/// 1024x1024 about 1 GB, allocated afresh on every step otherwise): keeping them made a cold 1024x1024
/// image 1.11-1.37x faster in float16 and 1.28-1.68x in the float32 conversion on an H200, for about
/// 9 % more GPU memory. At 512x512 it made no difference beyond the noise (BENCHMARKS.md).
pub const KEEP_BUFFERS_ABOVE_PIXELS: u32 = 512 * 512;

/// The ONNX Runtime Web execution provider that runs the graphs. Serialized by its API name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Backend {
    /// WebGPU; the default.
    #[default]
    #[serde(rename = "webgpu")]
    WebGpu,
    /// The CPU (wasm) backend. Only ever used when asked for.
    #[serde(rename = "wasm")]
    Wasm,
}

impl Backend {
    /// Every backend, in the order the API lists them.
    pub const ALL: [Backend; 2] = [Backend::WebGpu, Backend::Wasm];

    /// The backend called `name` in the message API (`webgpu`, `wasm`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The name used in the message API (and by ONNX Runtime Web's `executionProviders`).
    pub fn name(self) -> &'static str {
        match self {
            Backend::WebGpu => "webgpu",
            Backend::Wasm => "wasm",
        }
    }
}

/// The validated parameters of one generation, as the service worker hands them to the workers. The seed
/// is serialized as a decimal string, so the whole u64 survives JavaScript's numbers. Not built on
/// [`ImageParams`]: its schedule is a checked [`Schedule`], and it refuses unknown fields, which
/// `#[serde(flatten)]` cannot; [`GenerateParams::image`] gives one image's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GenerateParams {
    /// The user's prompt, unchanged.
    pub prompt: String,
    /// Image width in pixels: a multiple of 16 in `256..=1536`.
    pub width: u32,
    /// Image height in pixels: a multiple of 16 in `256..=1536`.
    pub height: u32,
    /// Denoising steps, `1..=50`.
    pub steps: u32,
    /// The noise seed.
    #[serde(with = "decimal")]
    pub seed: u64,
    /// How sigmas are spaced.
    pub schedule: Schedule,
    /// Whether to return the token ids, sigmas and initial noise.
    pub trace: bool,
    /// Where the graphs run.
    pub backend: Backend,
    /// Images to make, `1..=8`: seeds `seed`, `seed + 1`, ... (wrapping), one prompt encoding, one
    /// load of each graph.
    #[serde(default = "one")]
    pub count: u32,
    /// Every stage loads at once (`false`: each when the stage before it is done).
    #[serde(default = "yes")]
    pub load_ahead: bool,
    /// Every stage loaded afresh with ONNX Runtime's profiling on (a benchmark's switch).
    #[serde(default)]
    pub profile: bool,
    /// The `accuracy_level` set on every `MatMulNBits` on WebGPU (a benchmark's switch; `None`: the
    /// pack's).
    #[serde(default)]
    pub accuracy_level: Option<u8>,
    /// ORT keeps every released GPU buffer for the next run (`GenerateRequest::keep_buffers`; by
    /// default above [`KEEP_BUFFERS_ABOVE_PIXELS`]).
    #[serde(default)]
    pub keep_buffers: bool,
    /// The transformer's attention fused into `MultiHeadAttention` on WebGPU (a benchmark's switch,
    /// `GenerateRequest::fuse_attention`).
    #[serde(default)]
    pub fuse_attention: bool,
    /// The transformer's wide projections computed per part on WebGPU, so that their whole output never
    /// exists (`GenerateRequest::projections_per_part`, or the memory plan's).
    #[serde(default)]
    pub projections_per_part: bool,
    /// The transformer's token-wise chains computed in this many chunks of tokens on WebGPU
    /// (`GenerateRequest::token_chunks`, or the memory plan's; 1: whole).
    #[serde(default = "one")]
    pub token_chunks: u32,
    /// The transformer streamed on WebGPU in this many pieces of its weights, one on the GPU at a time
    /// (`GenerateRequest::transformer_pieces`, or the memory plan's; 1: whole).
    #[serde(default = "one")]
    pub transformer_pieces: u32,
    /// Nothing of the job is kept on disk (`GenerateRequest::private`).
    #[serde(default)]
    pub private: bool,
    /// The transformer's attention is computed in this many chunks of queries on WebGPU, to hold less
    /// GPU memory (set by the memory plan, `crate::gpu_memory`; 1: whole).
    #[serde(default = "one")]
    pub attention_chunks: u32,
    /// The decoder runs on WebGPU as a chain of pieces of at most this many bytes each
    /// (`GenerateRequest::decoder_piece_bytes`, or the memory plan's; `None`: whole).
    #[serde(default)]
    pub decoder_piece_bytes: Option<u64>,
    /// A `Gemm` (and with `matmuls_in_parts` a `MatMulNBits`) whose weights weigh more than this many
    /// bytes is computed on WebGPU in parts of their rows (`GenerateRequest::weight_part_bytes`; by
    /// default `weight_parts::MAX_PART_BYTES`); what a streamed transformer's pieces pass each other
    /// goes to and from the GPU in chunks of at most this many bytes too.
    #[serde(default = "max_weight_part_bytes")]
    pub weight_part_bytes: u64,
    /// A `MatMulNBits` too (set per try where stages load one at a time, as small budgets have them:
    /// there the renderer's memory counts, and where stages load at once each part's `Concat` would
    /// cost speed for nothing).
    #[serde(default)]
    pub matmuls_in_parts: bool,
}

fn one() -> u32 {
    1
}

fn max_weight_part_bytes() -> u64 {
    crate::graph::weight_parts::MAX_PART_BYTES
}

fn yes() -> bool {
    true
}

/// A u64 as a decimal string (`#[serde(with = "crate::params::decimal")]`).
pub(crate) mod decimal {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        String::deserialize(deserializer)?.parse().map_err(serde::de::Error::custom)
    }
}

impl GenerateParams {
    /// Latent grid `(h, w)` = `(height/16, width/16)`: one image token per cell.
    pub fn latent_size(&self) -> (u32, u32) {
        (self.height / SIZE_MULTIPLE, self.width / SIZE_MULTIPLE)
    }

    /// Image tokens N = (H/16)·(W/16).
    pub fn image_tokens(&self) -> u32 {
        let (h, w) = self.latent_size();
        h * w
    }

    /// The `steps + 1` sigmas of this run.
    pub fn sigmas(&self) -> Vec<f32> {
        self.schedule.sigmas(self.image_tokens(), self.steps)
    }

    /// The seed of image `index` of the batch: `seed + index`, wrapping past `u64::MAX`.
    pub fn seed_of(&self, index: u32) -> u64 {
        self.seed.wrapping_add(u64::from(index))
    }

    /// The parameters of image `index` of the batch, as its PNG, its result and the gallery record them.
    pub fn image(&self, index: u32) -> ImageParams {
        ImageParams {
            prompt: self.prompt.clone(),
            seed: self.seed_of(index),
            width: self.width,
            height: self.height,
            steps: self.steps,
            schedule: self.schedule.name().to_owned(),
        }
    }

    /// Whether `graph`'s session keeps every GPU buffer ([`GenerateParams::keep_buffers`]). Never the
    /// text encoder's: its buffers do not grow with the image, and its loaded session then serves a job
    /// of any size.
    pub fn keeps_buffers(&self, graph: Graph) -> bool {
        self.keep_buffers && graph != Graph::TextEncoder
    }

    /// Whether `graph`'s attention is fused ([`GenerateParams::fuse_attention`]): the transformer's
    /// only. The decoder's one attention (a single head over every latent pixel) makes ONNX Runtime's
    /// `MultiHeadAttention` overflow a tensor size at 1024x1024.
    pub fn fuses_attention(&self, graph: Graph) -> bool {
        self.fuse_attention && graph == Graph::Transformer
    }

    /// Whether `graph`'s wide projections are computed per part
    /// ([`GenerateParams::projections_per_part`]): the transformer's only.
    pub fn parts_projections(&self, graph: Graph) -> bool {
        self.projections_per_part && graph == Graph::Transformer
    }

    /// In how many chunks of tokens `graph`'s token-wise chains are computed
    /// ([`GenerateParams::token_chunks`]): the transformer's only.
    pub fn token_chunks(&self, graph: Graph) -> u32 {
        if graph == Graph::Transformer {
            self.token_chunks.max(1)
        } else {
            1
        }
    }

    /// In how many pieces of its weights `graph` is streamed ([`GenerateParams::transformer_pieces`]):
    /// the transformer's on WebGPU only.
    pub fn transformer_pieces(&self, graph: Graph) -> u32 {
        if graph == Graph::Transformer && self.backend == Backend::WebGpu {
            self.transformer_pieces.max(1)
        } else {
            1
        }
    }

    /// What `graph`'s session is made with besides its graph and backend: a stage loaded with other
    /// options is not reused for these parameters.
    pub fn session_options(&self, graph: Graph) -> SessionOptions {
        SessionOptions {
            keep_buffers: self.keeps_buffers(graph),
            accuracy_level: self.accuracy_level,
            fuse_attention: self.fuses_attention(graph),
            projections_per_part: self.parts_projections(graph),
            token_chunks: self.token_chunks(graph),
            attention_chunks: self.attention_chunks(graph),
            decoder_piece_bytes: self.decoder_piece_bytes(graph),
            transformer_pieces: self.transformer_pieces(graph),
            weight_part_bytes: self.weight_part_bytes,
            matmuls_in_parts: self.matmuls_in_parts,
        }
    }

    /// The most bytes a piece of `graph` may count when it runs as a chain
    /// ([`GenerateParams::decoder_piece_bytes`]): the decoder's on WebGPU only.
    pub fn decoder_piece_bytes(&self, graph: Graph) -> Option<u64> {
        self.decoder_piece_bytes.filter(|_| graph == Graph::Decoder && self.backend == Backend::WebGpu)
    }

    /// In how many chunks of queries `graph`'s attention is computed ([`GenerateParams::attention_chunks`]):
    /// the transformer's only (the decoder's one attention is its own matter), and not where it is
    /// fused.
    pub fn attention_chunks(&self, graph: Graph) -> u32 {
        if graph == Graph::Transformer && !self.fuses_attention(graph) {
            self.attention_chunks.max(1)
        } else {
            1
        }
    }
}

/// The options a stage's session is created with ([`GenerateParams::session_options`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOptions {
    /// ORT keeps every GPU buffer between runs.
    pub keep_buffers: bool,
    /// The `MatMulNBits` accuracy level set on the graph, if any.
    pub accuracy_level: Option<u8>,
    /// The attention fused into `MultiHeadAttention`.
    pub fuse_attention: bool,
    /// The wide projections computed per part.
    pub projections_per_part: bool,
    /// The token-wise chains computed in this many chunks of tokens.
    pub token_chunks: u32,
    /// The attention computed in this many chunks of queries.
    pub attention_chunks: u32,
    /// The graph run as a chain of pieces of at most this many bytes.
    pub decoder_piece_bytes: Option<u64>,
    /// The graph streamed in this many pieces of its weights.
    pub transformer_pieces: u32,
    /// Its heavy weights computed in parts of at most this many bytes.
    pub weight_part_bytes: u64,
    /// Its `MatMulNBits` too.
    pub matmuls_in_parts: bool,
}

/// Why a `generate` request was refused. The message names the field, the value and what is allowed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ParamError {
    /// Width or height out of range or not a multiple of 16.
    #[error(
        "{field} {value} is not allowed: {field} must be a multiple of {SIZE_MULTIPLE} from {MIN_SIZE} to {MAX_SIZE}"
    )]
    Size {
        /// `width` or `height`.
        field: &'static str,
        /// The value asked for.
        value: i64,
    },
    /// Steps out of range.
    #[error("steps {value} is not allowed: steps must be an integer from 1 to {MAX_STEPS}")]
    Steps {
        /// The value asked for.
        value: i64,
    },
    /// A seed that is not a u64 in an allowed form.
    #[error(
        "seed {} is not allowed: seed must be a whole number from 0 to 2^53 (9007199254740992) as a JSON number, or a decimal string from 0 to {max}",
        written_seed(.value, .text),
        max = u64::MAX
    )]
    Seed {
        /// The value asked for: a number as written, or the string.
        value: String,
        /// Whether it came as a string (then quoted when shown).
        text: bool,
    },
    /// An unknown schedule name.
    #[error("schedule {value:?} is not known: schedule must be one of \"empirical\" (the default) or \"linear-shift\"")]
    Schedule {
        /// The name asked for.
        value: String,
    },
    /// An image count out of range.
    #[error("count {value} is not allowed: count must be an integer from 1 to {MAX_COUNT}")]
    Count {
        /// The value asked for.
        value: i64,
    },
    /// An unknown backend name.
    #[error("backend {value:?} is not known: backend must be \"webgpu\" (the default) or \"wasm\"")]
    Backend {
        /// The name asked for.
        value: String,
    },
    /// A prompt longer than [`MAX_PROMPT_CHARS`].
    #[error(
        "the prompt is {length} characters long: at most {MAX_PROMPT_CHARS} are allowed (only the first 512 tokens, about 2000 characters of English, are used)"
    )]
    Prompt {
        /// Its length in characters.
        length: usize,
    },
    /// A `MatMulNBits` accuracy level out of range.
    #[error("accuracyLevel {value} is not allowed: it must be an integer from 0 to {MAX_ACCURACY_LEVEL}")]
    AccuracyLevel {
        /// The value asked for.
        value: i64,
    },
    /// `keepLoaded` seconds out of range.
    #[error(
        "keepLoaded seconds {value} is not allowed: seconds must be an integer from 0 (unload after each image) to {MAX_KEEP_LOADED_SECONDS}"
    )]
    KeepLoaded {
        /// The value asked for.
        value: i64,
    },
}

/// A seed as the error about it writes it: a string quoted, a number as it is.
fn written_seed(value: &str, text: &bool) -> String {
    if *text {
        format!("{value:?}")
    } else {
        value.to_owned()
    }
}

/// Checks `keepLoaded` seconds.
pub fn keep_loaded_seconds(value: i64) -> Result<u32, ParamError> {
    u32::try_from(value)
        .ok()
        .filter(|s| *s <= MAX_KEEP_LOADED_SECONDS)
        .ok_or(ParamError::KeepLoaded { value })
}

impl Localize for ParamError {
    fn message(&self) -> Message {
        match self {
            ParamError::Size { field, value } => {
                // The field's name in the reader's language: the API's own name is English.
                let name = if *field == "height" {
                    Message::new("paramHeight", [])
                } else {
                    Message::new("paramWidth", [])
                };
                Message::new(
                    "errParamSize",
                    [Arg::Message(name), arg(value), arg(SIZE_MULTIPLE), arg(MIN_SIZE), arg(MAX_SIZE)],
                )
            }
            ParamError::Steps { value } => Message::new("errParamSteps", [arg(value), arg(MAX_STEPS)]),
            ParamError::Seed { value, text } => {
                let value = if *text { quoted(value) } else { arg(value) };
                Message::new("errParamSeed", [value, arg(u64::MAX)])
            }
            ParamError::Schedule { value } => Message::new("errParamSchedule", [quoted(value)]),
            ParamError::Count { value } => Message::new("errParamCount", [arg(value), arg(MAX_COUNT)]),
            ParamError::Backend { value } => Message::new("errParamBackend", [quoted(value)]),
            ParamError::Prompt { length } => {
                Message::new("errParamPrompt", [arg(length), arg(MAX_PROMPT_CHARS)])
            }
            ParamError::AccuracyLevel { value } => {
                Message::new("errParamAccuracyLevel", [arg(value), arg(MAX_ACCURACY_LEVEL)])
            }
            ParamError::KeepLoaded { value } => {
                Message::new("errParamKeepLoaded", [arg(value), arg(MAX_KEEP_LOADED_SECONDS)])
            }
        }
    }
}

impl GenerateRequest {
    /// Checks every field and fills in defaults. `random_seed` is used only when the request has no
    /// seed; the caller draws it (the core has no OS randomness).
    pub fn validate(self, random_seed: u64) -> Result<GenerateParams, ParamError> {
        let length = self.prompt.chars().count();
        if length > MAX_PROMPT_CHARS {
            return Err(ParamError::Prompt { length });
        }
        let width = size("width", self.width)?;
        let height = size("height", self.height)?;
        let steps = steps(self.steps)?;
        let seed = match &self.seed {
            None => random_seed,
            Some(s) => parse_seed(s)?,
        };
        let schedule = schedule(self.schedule.as_deref())?;
        let backend = backend(self.backend.as_deref())?;
        let count = count(self.count)?;
        let accuracy_level = accuracy_level(self.accuracy_level)?;
        Ok(GenerateParams {
            prompt: self.prompt,
            width,
            height,
            steps,
            seed,
            schedule,
            trace: self.trace,
            backend,
            count,
            load_ahead: self.load_ahead.unwrap_or(true),
            profile: self.profile,
            accuracy_level,
            keep_buffers: self.keep_buffers.unwrap_or(width * height > KEEP_BUFFERS_ABOVE_PIXELS),
            fuse_attention: self.fuse_attention.unwrap_or(false),
            projections_per_part: self.projections_per_part.unwrap_or(false),
            token_chunks: self.token_chunks.unwrap_or(1).clamp(1, MAX_TOKEN_CHUNKS),
            transformer_pieces: self.transformer_pieces.unwrap_or(1).clamp(1, MAX_TRANSFORMER_PIECES),
            private: self.private,
            attention_chunks: 1,
            decoder_piece_bytes: self.decoder_piece_bytes,
            weight_part_bytes: self.weight_part_bytes.map_or_else(max_weight_part_bytes, |b| b.max(1024)),
            matmuls_in_parts: false,
        })
    }
}

/// The number of steps asked for, [`DEFAULT_STEPS`] where none is.
fn steps(value: Option<i64>) -> Result<u32, ParamError> {
    let Some(v) = value else { return Ok(DEFAULT_STEPS) };
    match u32::try_from(v) {
        Ok(s) if (1..=MAX_STEPS).contains(&s) => Ok(s),
        _ => Err(ParamError::Steps { value: v }),
    }
}

/// The schedule named, the default where none is.
fn schedule(name: Option<&str>) -> Result<Schedule, ParamError> {
    match name {
        None => Ok(Schedule::default()),
        Some(name) => {
            Schedule::from_name(name).ok_or_else(|| ParamError::Schedule { value: name.to_owned() })
        }
    }
}

/// The backend named, the default where none is.
fn backend(name: Option<&str>) -> Result<Backend, ParamError> {
    match name {
        None => Ok(Backend::default()),
        Some(name) => Backend::from_name(name).ok_or_else(|| ParamError::Backend { value: name.to_owned() }),
    }
}

/// The number of images asked for, one where none is.
fn count(value: Option<i64>) -> Result<u32, ParamError> {
    let Some(v) = value else { return Ok(1) };
    match u32::try_from(v) {
        Ok(c) if (1..=MAX_COUNT).contains(&c) => Ok(c),
        _ => Err(ParamError::Count { value: v }),
    }
}

/// The accuracy level asked for, if any.
fn accuracy_level(value: Option<i64>) -> Result<Option<u8>, ParamError> {
    let Some(v) = value else { return Ok(None) };
    match u8::try_from(v) {
        Ok(level) if level <= MAX_ACCURACY_LEVEL => Ok(Some(level)),
        _ => Err(ParamError::AccuracyLevel { value: v }),
    }
}

fn size(field: &'static str, value: Option<i64>) -> Result<u32, ParamError> {
    let Some(v) = value else { return Ok(DEFAULT_SIZE) };
    match u32::try_from(v) {
        Ok(s) if (MIN_SIZE..=MAX_SIZE).contains(&s) && s % SIZE_MULTIPLE == 0 => Ok(s),
        _ => Err(ParamError::Size { field, value: v }),
    }
}

/// The allowed width or height nearest to `value`, for a form to offer instead of one that is not
/// allowed: the multiples of [`SIZE_MULTIPLE`] just below and just above it, or the end of the range it
/// is past; ascending. Empty when `value` is allowed.
pub fn nearest_sizes(value: i64) -> Vec<u32> {
    if size("", Some(value)).is_ok() {
        return Vec::new();
    }
    let multiple = i64::from(SIZE_MULTIPLE);
    let (min, max) = (i64::from(MIN_SIZE), i64::from(MAX_SIZE));
    let below = value.div_euclid(multiple) * multiple;
    let mut sizes: Vec<u32> = [below, below.saturating_add(multiple)]
        .into_iter()
        .map(|v| v.clamp(min, max))
        .filter_map(|v| u32::try_from(v).ok())
        .collect();
    sizes.dedup();
    sizes
}

/// A JSON number must be a whole number in `0..=2^53` (beyond that JSON numbers lose digits); a
/// string must be plain decimal digits of a u64 (no sign, no spaces).
fn parse_seed(seed: &Seed) -> Result<u64, ParamError> {
    match seed {
        Seed::Number(n) => {
            let ok = n.is_finite() && n.fract() == 0.0 && (0.0..=MAX_JSON_NUMBER_SEED as f64).contains(n);
            // `-0.0` passes the range check and becomes 0, which is harmless.
            if ok {
                Ok(*n as u64)
            } else {
                Err(ParamError::Seed { value: n.to_string(), text: false })
            }
        }
        Seed::Text(s) => {
            let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            digits
                .then(|| s.parse::<u64>().ok())
                .flatten()
                .ok_or_else(|| ParamError::Seed { value: s.clone(), text: true })
        }
    }
}

#[cfg(test)]
mod tests;
