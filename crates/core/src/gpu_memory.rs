//! GPU memory: the budget a job must stay within, what each stage needs, and the plan that follows.
//!
//! WebGPU tells no one how much memory a GPU has free. The budget is either the user's (options page:
//! a size in GB) or found by a probe that allocates buffers until the GPU refuses ([`Probe`]); where
//! neither is known the plan is the fastest one, and a job that fails for room is made again one
//! stage at a time (the offscreen document's fallback).
//!
//! A stage's need is its weights plus what ONNX Runtime allocates while it runs. ORT's WebGPU backend
//! reuses a released buffer only after its next flush, and only up to 160 MiB
//! ([`ORT_LARGEST_CACHED_BUFFER`]), so a run's peak is close to the sum of its large intermediates:
//! the transformer's grows with the attention scores (quadratic in tokens), the decoder's with the
//! pixels and its one attention over every latent pixel. The coefficients are fitted to the whole
//! GPU's use measured on an H200 ([`Coefficients`]), each stage alone; they overestimate a little
//! (the idle GPU's own use is inside them), which is the side to err on.

use serde::{Deserialize, Serialize};

use crate::api::Stage;
use crate::graph::attention::{chunks_for, ORT_LARGEST_CACHED_BUFFER};
use crate::message::{number, Localize, Message};
use crate::pack::Graph;
use crate::params::MAX_TRANSFORMER_PIECES;

/// A gigabyte, as the pages say sizes (decimal).
pub const GB: u64 = 1_000_000_000;

/// Bytes as GB with one decimal ("6.5"), as every page and message says a GPU memory size.
pub fn gigabytes(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / GB as f64)
}

/// What share of the memory the probe found the plan may use: the browser and other pages draw on the
/// same GPU.
pub const AUTO_SHARE_PERCENT: u64 = 90;

/// The probe stops here: a GPU with this much free runs every size with stages loaded together (a
/// job that still finds no room falls back to one stage at a time), and where the GPU shares the
/// computer's memory (integrated GPUs, Macs) or a driver spills into it, holding more would only
/// push the computer into swapping.
pub const PROBE_CAP_BYTES: u64 = 24 * GB;

/// The smallest and largest budget the options page accepts, in GB.
pub const MIN_SETTING_GB: f64 = 1.0;
/// See [`MIN_SETTING_GB`].
pub const MAX_SETTING_GB: f64 = 512.0;

const STAGES: [Stage; 3] = [Stage::TextEncoder, Stage::Transformer, Stage::Decoder];

/// The transformer's attention heads (FLUX.2 klein 4B) and its padded text tokens.
const TRANSFORMER_HEADS: u64 = 24;
const TEXT_TOKENS: u64 = 512;

/// The user's choice on the options page.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "camelCase")]
pub enum GpuMemorySetting {
    /// What the probe found for this GPU.
    #[default]
    Auto,
    /// A size the user set, in bytes.
    Set {
        /// The budget, in bytes.
        bytes: u64,
    },
}

impl GpuMemorySetting {
    /// The setting for `gigabytes` typed on the options page, or why it is not allowed.
    pub fn gigabytes(gigabytes: f64) -> Result<GpuMemorySetting, SettingError> {
        if !(MIN_SETTING_GB..=MAX_SETTING_GB).contains(&gigabytes) {
            return Err(SettingError { gigabytes });
        }
        // Tenths of a GB: what the field shows is what is kept.
        let tenths = (gigabytes * 10.0).round() as u64;
        Ok(GpuMemorySetting::Set { bytes: tenths * GB / 10 })
    }
}

impl GpuMemorySetting {
    /// The setting if its size is allowed (a request may carry any number).
    pub fn checked(self) -> Result<GpuMemorySetting, SettingError> {
        match self {
            GpuMemorySetting::Auto => Ok(self),
            GpuMemorySetting::Set { bytes } => GpuMemorySetting::gigabytes(bytes as f64 / GB as f64),
        }
    }
}

impl Localize for SettingError {
    fn message(&self) -> Message {
        Message::new(
            "errGpuMemorySetting",
            [number(self.gigabytes), number(MIN_SETTING_GB), number(MAX_SETTING_GB)],
        )
    }
}

/// A GPU memory size the options page does not accept.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("{gigabytes} GB of GPU memory is not allowed: give a size from {MIN_SETTING_GB} to {MAX_SETTING_GB} GB, or Auto")]
pub struct SettingError {
    /// What was typed.
    pub gigabytes: f64,
}

/// What the probe found on one adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    /// The adapter it ran on (vendor, architecture, description), so that another GPU is probed anew.
    pub adapter: String,
    /// What it found.
    pub found: ProbeFound,
}

/// The outcome of a probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ProbeFound {
    /// The GPU refused an allocation after `bytes` were held.
    Refused {
        /// Bytes held when it refused.
        bytes: u64,
    },
    /// [`PROBE_CAP_BYTES`] were held and the probe stopped: more than any plan needs.
    Plenty {
        /// Bytes held.
        bytes: u64,
    },
    /// The browser does not tell: a software renderer (its "GPU memory" is the computer's, which the
    /// probe must not fill), or no WebGPU.
    Unknown,
}

impl Probe {
    /// The budget the probe allows: a share of what it could hold; `None` where there is no limit to
    /// plan for.
    pub fn budget(&self) -> Option<u64> {
        match self.found {
            ProbeFound::Refused { bytes } => Some(bytes / 100 * AUTO_SHARE_PERCENT),
            ProbeFound::Plenty { .. } | ProbeFound::Unknown => None,
        }
    }
}

/// The budget a job plans for: the user's size, else the probe's; `None`: no known limit.
pub fn budget(setting: GpuMemorySetting, probe: Option<&Probe>) -> Option<u64> {
    match setting {
        GpuMemorySetting::Set { bytes } => Some(bytes),
        GpuMemorySetting::Auto => probe.and_then(Probe::budget),
    }
}

/// How the graphs compute on this GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Precision {
    /// Float16 activations, as published (`shader-f16`).
    Float16,
    /// The float32 conversion (no `shader-f16`), or the wasm backend.
    Float32,
}

impl Precision {
    fn bytes(self) -> u64 {
        match self {
            Precision::Float16 => 2,
            Precision::Float32 => 4,
        }
    }
}

/// Bytes of each stage's weights: its graph and data files as downloaded (not the float32 forms, whose
/// extra is in the coefficients).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageWeights {
    /// The text encoder's bytes.
    pub text_encoder: u64,
    /// The transformer's bytes.
    pub transformer: u64,
    /// The decoder's bytes.
    pub decoder: u64,
}

impl StageWeights {
    /// The published pack's (BENCHMARKS.md: 2.20, 4.14 and 0.20 GB).
    pub const PUBLISHED: StageWeights =
        StageWeights { text_encoder: 2_200_000_000, transformer: 4_140_000_000, decoder: 200_000_000 };

    /// Each stage's share of a pack's `files` (name, bytes): the files named after its graph, without
    /// the forms the extension derives from them (`*.f32-*`, `*.b32.*`).
    pub fn of_files<'a>(files: impl IntoIterator<Item = (&'a str, u64)>) -> StageWeights {
        let mut weights = StageWeights { text_encoder: 0, transformer: 0, decoder: 0 };
        for (name, bytes) in files {
            if name.contains(".f32-") || name.contains(".b32.") {
                continue;
            }
            for graph in Graph::ALL {
                if name.starts_with(graph.stem()) {
                    *weights.of_mut(graph) += bytes;
                }
            }
        }
        weights
    }

    fn of(&self, stage: Stage) -> u64 {
        match stage {
            Stage::TextEncoder => self.text_encoder,
            Stage::Transformer => self.transformer,
            Stage::Decoder => self.decoder,
        }
    }

    fn of_mut(&mut self, graph: Graph) -> &mut u64 {
        match graph {
            Graph::TextEncoder => &mut self.text_encoder,
            Graph::Transformer => &mut self.transformer,
            Graph::Decoder => &mut self.decoder,
        }
    }
}

/// A stage's need beyond its weights: `fixed + per_pixel·pixels + per_score·scores`, where `scores` is
/// the bytes of one attention's scores at this size; for the transformer also `score_pile` and
/// `per_wide·wide`, `wide` the bytes of its widest per-layer tensor. ORT caches released buffers up to
/// 160 MiB and reuses them; larger ones are made afresh and freed only once the GPU has caught up, so
/// they pile up: the transformer's pile and wide terms count only while their tensor is over the
/// cache's limit (the attention in chunks brings the scores under it). The scores' pile measured about
/// the same, 4.4-4.7 GB, for 1.02 GB of scores (float16, 1024x1024) and 0.23 GB (float32, 512x512).
/// With the scores in chunks under the limit, what the cache holds grows with them instead
/// (`per_score`).
#[derive(Debug, Clone, Copy)]
struct Coefficients {
    fixed: i64,
    per_pixel: f64,
    per_score: f64,
    score_pile: i64,
    per_wide: f64,
}

/// Fitted to the H200's whole-GPU use, each stage alone, Chromium, ORT's buffer cache at its default
/// (BENCHMARKS.md, "GPU memory"): with the GPU to itself, text encoder 2.04 GB (float16) and 2.39 GB
/// (float32); transformer 5.85 and 11.22 GB at 512x512 and 1024x1024 (float16), 11.42 GB at 512x512
/// (float32); decoder 3.90 and 17.94 GB at 512x512 and 1024x1024. With the GPU held to 7.8 GB free:
/// the float32 transformer at 512x512 in 2 chunks ran within 6.74 GB; at 1024x1024 in 13 chunks it did
/// not fit; the float16 one at 1024x1024 in 7 chunks did. The transformer's `per_score`, with its
/// projections per part: float32 6.39, 7.07 and 7.76 GB at 512x512, 768x1024 and 1024x1024 (the last
/// with its chains in chunks of tokens), float16 5.8, 6.4 and 6.7 GB (BENCHMARKS.md, "GPU memory"). The
/// text encoder's embedding table stays on disk, so its float16 need is its weights.
fn coefficients(stage: Stage, precision: Precision) -> Coefficients {
    use Precision::*;
    let none = Coefficients { fixed: 0, per_pixel: 0.0, per_score: 0.0, score_pile: 0, per_wide: 0.0 };
    let transformer = Coefficients { per_score: 0.85, score_pile: 4_700_000_000, per_wide: 4.0, ..none };
    match (stage, precision) {
        (Stage::TextEncoder, Float16) => none,
        (Stage::TextEncoder, Float32) => Coefficients { fixed: 190_000_000, ..none },
        (Stage::Transformer, Float16) => Coefficients { fixed: 1_710_000_000, ..transformer },
        (Stage::Transformer, Float32) => Coefficients { fixed: 1_900_000_000, ..transformer },
        // The decoder is float32 in the pack, whatever the GPU.
        (Stage::Decoder, _) => Coefficients { per_pixel: 13_200.0, per_score: 3.6, ..none },
    }
}

/// The width of the transformer's widest per-layer tensor: a single-stream block's fused projection
/// (query, key and value, 3 x 3072, and the gated MLP's two halves, 2 x 9216).
const TRANSFORMER_WIDEST: u64 = 27_648;

/// With the projections computed per part, the widths of a single-stream block's widest tensors: the
/// second projection's input (the attention's output and the MLP's, 3072 + 9216) and the gated MLP's
/// four of 9216 (its two halves, the activation, the product). Each that is larger than ORT's cache
/// limit counts once ([`PER_PART_WIDE`]): on the H200 held to 7.8 GB free, float32 768x1024 (only the
/// first above the limit) ran within 7.1 GB and 1024x1024 (all five above it) ran out; in 2 chunks of
/// tokens (all five under the limit) it ran within 7.8 GB on an H100.
const TRANSFORMER_WIDTHS_PER_PART: [u64; 5] = [12_288, 9_216, 9_216, 9_216, 9_216];

/// How many times a per-part tensor above ORT's cache limit counts: once (the whole projection's
/// tensor, 2.25 times wider, counts `per_wide` times).
const PER_PART_WIDE: f64 = 1.0;

/// What ORT's simple cache (`keepBuffers`: every buffer kept between runs) adds to a stage's working
/// memory: measured +9 % (float16) and +17 % (float32) of the whole GPU at 1024x1024, most of it the
/// working part.
const KEEP_BUFFERS_FACTOR: f64 = 1.4;

/// `bytes` when ORT allocates a buffer of that size afresh each time (above its cache's largest), else 0.
fn uncached(bytes: u64) -> u64 {
    if bytes > ORT_LARGEST_CACHED_BUFFER {
        bytes
    } else {
        0
    }
}

/// The levers that change a stage's need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Levers {
    /// ORT keeps every GPU buffer between runs.
    pub keep_buffers: bool,
    /// The transformer's attention is computed in this many chunks of queries (1: whole).
    pub attention_chunks: u32,
    /// The transformer's wide projections are computed per part (`graph::projections`).
    #[serde(default)]
    pub projections_per_part: bool,
    /// With the projections per part, the transformer's token-wise chains are computed in this many
    /// chunks of tokens (`graph::rows`; 1: whole).
    #[serde(default = "one")]
    pub token_chunks: u32,
    /// The decoder runs as a chain of pieces of at most this many bytes each
    /// (`graph::split`; `None`: whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder_piece_bytes: Option<u64>,
    /// The transformer is streamed in this many pieces of its weights, one on the GPU at a time
    /// (`graph::split::by_weights`; 1: whole).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub transformer_pieces: u32,
}

impl Levers {
    /// Nothing changed: the graphs as exported, ORT's default cache.
    pub const NONE: Levers = Levers {
        keep_buffers: false,
        attention_chunks: 1,
        projections_per_part: false,
        token_chunks: 1,
        decoder_piece_bytes: None,
        transformer_pieces: 1,
    };
}

/// The least a split decoder holds per pixel of the image: its last up-block's single nodes hold
/// full-size float32 tensors of 128 and 256 channels. On the H200 held to 7.8 GB free, the whole job
/// at 1024x1024 ran within 7.4 GB with the decoder in 77 pieces computing in NCHW; in NHWC (each
/// piece's activations transposed in and out) it had not run, in pieces of 0.3 GB (counted) either.
const DECODER_SPLIT_FLOOR_PER_PIXEL: f64 = 6_000.0;

/// What a piece of the decoder holds beyond its count (`graph::split`'s bytes): the inputs ORT
/// copies in, the outputs handed on between pieces, what its cache keeps. On the H200 held to 7.8 GB
/// free, at 768x1024, pieces counted at up to 3.4 GB ran out of memory and pieces of 1.7 GB ran:
/// pieces are cut to a quarter of the room.
const DECODER_PIECE_OVERRUN: f64 = 4.0;

/// The smallest piece the decoder is cut into: below it a chain would be mostly session creation.
const MIN_DECODER_PIECE_BYTES: u64 = 256 << 20;

/// One image's size and how it computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// How the graphs compute.
    pub precision: Precision,
}

impl Job {
    fn pixels(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }

    /// The transformer's tokens: one per 16x16 pixels, and the padded prompt.
    fn tokens(&self) -> u64 {
        self.pixels() / 256 + TEXT_TOKENS
    }

    /// Bytes of one transformer attention's scores, all heads.
    fn transformer_scores(&self) -> u64 {
        TRANSFORMER_HEADS * self.tokens() * self.tokens() * self.precision.bytes()
    }

    /// Bytes of the transformer's per-layer tensors above ORT's cache limit, weighed by how they pile:
    /// the widest ([`TRANSFORMER_WIDEST`]) `per_wide` times, or with the projections per part each of
    /// [`TRANSFORMER_WIDTHS_PER_PART`] once, in `token_chunks` chunks of tokens.
    fn transformer_uncached(&self, levers: Levers, per_wide: f64) -> f64 {
        let bytes = |width: u64| self.tokens() * width * self.precision.bytes();
        if levers.projections_per_part {
            let chunks = u64::from(levers.token_chunks.max(1));
            let parts: u64 =
                TRANSFORMER_WIDTHS_PER_PART.iter().map(|&w| uncached(bytes(w).div_ceil(chunks))).sum();
            PER_PART_WIDE * parts as f64
        } else {
            per_wide * uncached(bytes(TRANSFORMER_WIDEST)) as f64
        }
    }

    /// The fewest chunks of tokens that bring the gated MLP's tensors (9216 columns) under ORT's
    /// largest cached buffer, and with them the second projection's input: with that one alone above
    /// it, float32 768x1024 ran in 8 GB.
    fn token_chunks(&self) -> u32 {
        let mlp = self.tokens() * TRANSFORMER_WIDTHS_PER_PART[1] * self.precision.bytes();
        let chunks = mlp.div_ceil(ORT_LARGEST_CACHED_BUFFER);
        if chunks > 1 {
            // The second projection's input under the limit too.
            let input = self.tokens() * TRANSFORMER_WIDTHS_PER_PART[0] * self.precision.bytes();
            u32::try_from(input.div_ceil(ORT_LARGEST_CACHED_BUFFER)).unwrap_or(u32::MAX)
        } else {
            1
        }
    }

    /// Bytes of the decoder's attention scores: one head over every pixel of its 8x8-smaller input,
    /// float32.
    fn decoder_scores(&self) -> u64 {
        let latent = self.pixels() / 64;
        latent * latent * 4
    }
}

/// Bytes `stage` needs on the GPU for `job` with `levers`: its weights and its working memory.
pub fn stage_need(stage: Stage, weights: &StageWeights, job: &Job, levers: Levers) -> u64 {
    let c = coefficients(stage, job.precision);
    let (scores, pile, wide) = match stage {
        Stage::TextEncoder => (0, 0, 0.0),
        Stage::Transformer => {
            let chunk = job.transformer_scores().div_ceil(u64::from(levers.attention_chunks.max(1)));
            let wide = job.transformer_uncached(levers, c.per_wide);
            // Piled scores, or scores in cached chunks: not both.
            if uncached(chunk) > 0 {
                (0, c.score_pile, wide)
            } else {
                (job.transformer_scores(), 0, wide)
            }
        }
        Stage::Decoder => (job.decoder_scores(), 0, 0.0),
    };
    let mut working =
        c.fixed as f64 + c.per_pixel * job.pixels() as f64 + c.per_score * scores as f64 + pile as f64 + wide;
    let piece = if stage == Stage::Decoder { levers.decoder_piece_bytes } else { None };
    if let Some(piece) = piece {
        let floor = DECODER_SPLIT_FLOOR_PER_PIXEL * job.pixels() as f64;
        working = working.min((DECODER_PIECE_OVERRUN * piece as f64).max(floor));
    }
    // A chain of pieces keeps no buffers (`imagine_ort::Chain`).
    if levers.keep_buffers && stage != Stage::TextEncoder && piece.is_none() {
        working *= KEEP_BUFFERS_FACTOR;
    }
    let weights = match stage {
        Stage::Transformer if levers.transformer_pieces > 1 => {
            // Streamed: a piece's share of the weights on the GPU, and of what loading them holds.
            let share = weights.transformer.div_ceil(u64::from(levers.transformer_pieces));
            working -= PER_WEIGHT_BYTE * (weights.transformer - share) as f64;
            share
        }
        _ => weights.of(stage),
    };
    weights + working.max(0.0) as u64
}

/// What a session holds beside each byte of its weights (part of the transformer's `fixed`): streamed
/// in pieces, the transformer held 3.57 and 2.40 GB in 2 and 4 pieces (float32 512x512) and 2.56 GB in 3
/// (float16), against 6.1 and 5.8 GB whole (the GPU's use while it ran, H100s held to 6 and 4 GB free).
const PER_WEIGHT_BYTE: f64 = 0.2;

/// The fewest query chunks that bring one attention's scores under ORT's largest cached buffer, for
/// `job`'s transformer.
pub fn attention_chunks(job: &Job) -> u32 {
    chunks_for(TRANSFORMER_HEADS, job.tokens(), job.precision.bytes(), ORT_LARGEST_CACHED_BUFFER)
}

/// `levers` with the transformer's projections per part, and its token-wise chains in as many chunks of
/// tokens as keep their tensors under ORT's cache limit, where that needs less.
fn leaner_projections(weights: &StageWeights, job: &Job, levers: Levers) -> Levers {
    let parted = Levers { projections_per_part: true, token_chunks: job.token_chunks(), ..levers };
    let need = |l| stage_need(Stage::Transformer, weights, job, l);
    let whole = Levers { projections_per_part: false, ..levers };
    if need(parted) < need(whole) {
        parted
    } else {
        levers
    }
}

/// How a job uses the GPU's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryPlan {
    /// Every stage loads when the job starts (else each when the one before it is done).
    pub ahead: bool,
    /// The stages stay loaded after the job.
    pub keep: bool,
    /// The levers of each stage's session.
    pub levers: Levers,
    /// The most the plan should hold at once, in bytes.
    pub peak: u64,
    /// Whether `peak` is within the budget (always, with no budget).
    pub fits: bool,
}

/// What the job would like, before the budget has its say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    /// Load every stage at once (the default; benchmarks may ask otherwise).
    pub ahead: bool,
    /// Keep the stages loaded after the job (the user's `keepLoaded`).
    pub keep: bool,
    /// ORT keeps every buffer (by default above 512x512).
    pub keep_buffers: bool,
}

/// The fastest plan for `job` within `budget` (`None`: no known limit), from what it would like down
/// to one stage at a time with nothing kept, no buffers kept, the attention chunked and the decoder
/// split, then the transformer streamed in 2 to [`MAX_TRANSFORMER_PIECES`] pieces of its weights.
/// Where nothing fits, the smallest plan with `fits: false`: the pages warn before, and the job tries
/// anyway.
pub fn plan(budget: Option<u64>, weights: &StageWeights, job: &Job, wanted: Wanted) -> MemoryPlan {
    let all = |levers| -> u64 { STAGES.iter().map(|&s| stage_need(s, weights, job, levers)).sum() };
    let largest =
        |levers| -> u64 { STAGES.iter().map(|&s| stage_need(s, weights, job, levers)).max().unwrap_or(0) };
    let levers = Levers { keep_buffers: wanted.keep_buffers, ..Levers::NONE };
    let Some(budget) = budget else {
        let peak = if wanted.ahead || wanted.keep { all(levers) } else { largest(levers) };
        return MemoryPlan { ahead: wanted.ahead, keep: wanted.keep, levers, peak, fits: true };
    };
    let lean_levers = Levers::NONE;
    let chunked =
        leaner_projections(weights, job, Levers { attention_chunks: attention_chunks(job), ..Levers::NONE });
    // The decoder alone on the GPU may use what its weights leave of the budget.
    let piece = ((budget.saturating_sub(weights.decoder) as f64 / DECODER_PIECE_OVERRUN) as u64)
        .max(MIN_DECODER_PIECE_BYTES);
    let split = Levers { decoder_piece_bytes: Some(piece), ..chunked };
    let together = wanted.ahead || wanted.keep;
    let leanest = (false, split, largest(split));
    // The transformer streamed a piece of its weights at a time: the last resort, as every piece is
    // read again on every step.
    let streamed = (2..=MAX_TRANSFORMER_PIECES).map(|pieces| {
        let levers = Levers { transformer_pieces: pieces, ..split };
        (false, levers, largest(levers))
    });
    let candidates = [
        (together, levers, all(levers)),
        (together, lean_levers, all(lean_levers)),
        (false, levers, largest(levers)),
        (false, lean_levers, largest(lean_levers)),
        (false, chunked, largest(chunked)),
        leanest,
    ];
    let plan_of = |(together, levers, peak): (bool, Levers, u64)| MemoryPlan {
        ahead: together && wanted.ahead,
        keep: together && wanted.keep,
        levers,
        peak,
        fits: peak <= budget,
    };
    let candidates = candidates.into_iter().chain(streamed.clone()).map(plan_of);
    candidates.clone().find(|p| p.fits).unwrap_or_else(|| {
        // Nothing fits: the leanest, streamed only where that needs a tenth less (the transformer
        // the largest stage, and its weights the larger part of it).
        let leanest = plan_of(leanest);
        streamed
            .map(plan_of)
            .filter(|p| p.peak < leanest.peak / 10 * 9)
            .min_by_key(|p| p.peak)
            .unwrap_or(leanest)
    })
}

/// How a size fits the budget, as the pages say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeFit {
    /// Within the budget.
    Fits,
    /// Within the budget with the transformer streamed in pieces: slower.
    Streamed,
    /// Over the budget even at its leanest.
    TooBig,
}

impl MemoryPlan {
    /// How this plan's size fits its budget.
    pub fn size_fit(&self) -> SizeFit {
        match (self.fits, self.levers.transformer_pieces > 1) {
            (false, _) => SizeFit::TooBig,
            (true, true) => SizeFit::Streamed,
            (true, false) => SizeFit::Fits,
        }
    }
}

/// What a job taught about this GPU: a plan needing `failed_peak` bytes failed on `adapter` with the pack
/// `pack`, where one stage at a time then worked. Later plans for them stay below it, so that no job
/// pays for that failure again (or for a stall, where running out of memory shows as one), until the
/// budget is set or measured again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Learned {
    /// The adapter it failed on.
    pub adapter: String,
    /// The pack's commit.
    pub pack: String,
    /// The estimated peak of the plan that failed.
    pub failed_peak: u64,
}

impl Learned {
    /// `budget` lowered below the plan that failed, where it is about this adapter and pack.
    pub fn cap(&self, budget: Option<u64>, adapter: &str, pack: &str) -> Option<u64> {
        if self.adapter != adapter || self.pack != pack {
            return budget;
        }
        let below = self.failed_peak.saturating_sub(1);
        Some(budget.map_or(below, |b| b.min(below)))
    }
}

/// Whether a stage's failure is the GPU running out of memory, by what WebGPU and ONNX Runtime say of
/// it (seen on an H200 held to a few GB free): an allocation the GPU refused leaves an invalid buffer
/// that the next command using it trips over, or ORT's download from it fails.
pub fn is_out_of_memory(failure: &str) -> bool {
    const SIGNS: [&str; 5] = [
        "out of memory",
        "outofmemory",
        "is invalid due to a previous error",
        "failed to allocate",
        "buffermanager::download",
    ];
    let failure = failure.to_ascii_lowercase();
    SIGNS.iter().any(|sign| failure.contains(sign))
}

/// What a plan knows of this device and pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryFacts {
    /// Each stage's weights.
    pub weights: StageWeights,
    /// How the graphs compute on this GPU.
    pub precision: Precision,
}

impl MemoryFacts {
    /// [`plan`] for an image of `width` x `height`.
    pub fn plan(&self, budget: Option<u64>, width: u32, height: u32, wanted: Wanted) -> MemoryPlan {
        plan(budget, &self.weights, &Job { width, height, precision: self.precision }, wanted)
    }

    /// The plan to make a `width` x `height` image again after the GPU ran out of memory under `failed`,
    /// within `budget` (what is free now, where a probe could tell): one stage at a time, nothing kept
    /// (buffers only where the new plan keeps them), the attention in at least as many chunks, the
    /// decoder in pieces of at most half the failed plan's (or of its whole need). `None` where that changes nothing: no retry then.
    pub fn after_out_of_memory(
        &self,
        budget: Option<u64>,
        width: u32,
        height: u32,
        failed: &MemoryPlan,
    ) -> Option<MemoryPlan> {
        let job = Job { width, height, precision: self.precision };
        let lean = Wanted { ahead: false, keep: false, keep_buffers: false };
        let replanned = plan(budget, &self.weights, &job, lean);
        let whole = stage_need(Stage::Decoder, &self.weights, &job, Levers::NONE) - self.weights.decoder;
        let halved = (failed.levers.decoder_piece_bytes.unwrap_or(whole) / 2).max(MIN_DECODER_PIECE_BYTES);
        let leaner = leaner_projections(&self.weights, &job, Levers::NONE);
        let levers = Levers {
            keep_buffers: replanned.levers.keep_buffers,
            attention_chunks: failed.levers.attention_chunks.max(replanned.levers.attention_chunks),
            projections_per_part: leaner.projections_per_part,
            token_chunks: leaner.token_chunks,
            decoder_piece_bytes: Some(replanned.levers.decoder_piece_bytes.map_or(halved, |p| p.min(halved))),
            // Streamed already: in pieces half as large.
            transformer_pieces: match failed.levers.transformer_pieces {
                1 => replanned.levers.transformer_pieces,
                pieces => (pieces * 2).min(MAX_TRANSFORMER_PIECES),
            },
        };
        let peak = STAGES.iter().map(|&s| stage_need(s, &self.weights, &job, levers)).max().unwrap_or(0);
        let retry =
            MemoryPlan { ahead: false, keep: false, levers, peak, fits: budget.is_none_or(|b| peak <= b) };
        ((retry.ahead, retry.keep, retry.levers) != (failed.ahead, failed.keep, failed.levers))
            .then_some(retry)
    }

    /// The plan of a default job of this size (stages loaded at once and kept, buffers kept above
    /// 512x512, as the budget allows): what the pages say of a size.
    pub fn default_plan(&self, budget: Option<u64>, width: u32, height: u32) -> MemoryPlan {
        let keep_buffers = width * height > crate::params::KEEP_BUFFERS_ABOVE_PIXELS;
        self.plan(budget, width, height, Wanted { ahead: true, keep: true, keep_buffers })
    }

    /// The largest square image whose leanest plan fits `budget`, if any.
    pub fn largest_square(&self, budget: u64) -> Option<u32> {
        use crate::params::{MAX_SIZE, MIN_SIZE, SIZE_MULTIPLE};
        (MIN_SIZE..=MAX_SIZE)
            .rev()
            .step_by(SIZE_MULTIPLE as usize)
            .find(|&side| self.default_plan(Some(budget), side, side).fits)
    }
}

#[cfg(test)]
mod tests;

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}
