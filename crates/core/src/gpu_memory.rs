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
/// they pile up: the transformer's two terms count only while their tensor is over the cache's limit
/// (the attention in chunks brings the scores under it). The scores' pile measured about the same,
/// 4.4-4.7 GB, for 1.02 GB of scores (float16, 1024x1024) and 0.23 GB (float32, 512x512).
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
/// not fit; the float16 one at 1024x1024 in 7 chunks did. The text encoder's embedding table stays on
/// disk, so its float16 need is its weights.
fn coefficients(stage: Stage, precision: Precision) -> Coefficients {
    use Precision::*;
    let none = Coefficients { fixed: 0, per_pixel: 0.0, per_score: 0.0, score_pile: 0, per_wide: 0.0 };
    let transformer = Coefficients { score_pile: 4_700_000_000, per_wide: 4.0, ..none };
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

/// What ORT's simple cache (`keepBuffers`: every buffer kept between runs) adds to a stage's working
/// memory: measured +9 % (float16) and +17 % (float32) of the whole GPU at 1024x1024, most of it the
/// working part.
const KEEP_BUFFERS_FACTOR: f64 = 1.4;

/// The levers that change a stage's need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Levers {
    /// ORT keeps every GPU buffer between runs.
    pub keep_buffers: bool,
    /// The transformer's attention is computed in this many chunks of queries (1: whole).
    pub attention_chunks: u32,
    /// The decoder runs as a chain of pieces of at most this many bytes each
    /// (`graph::split`; `None`: whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder_piece_bytes: Option<u64>,
}

impl Levers {
    /// Nothing changed: the graphs as exported, ORT's default cache.
    pub const NONE: Levers = Levers { keep_buffers: false, attention_chunks: 1, decoder_piece_bytes: None };
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

    /// Bytes of the transformer's widest per-layer tensor ([`TRANSFORMER_WIDEST`]).
    fn transformer_wide(&self) -> u64 {
        self.tokens() * TRANSFORMER_WIDEST * self.precision.bytes()
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
    let uncached = |bytes: u64| if bytes > ORT_LARGEST_CACHED_BUFFER { bytes } else { 0 };
    let (scores, pile, wide) = match stage {
        Stage::TextEncoder => (0, 0, 0),
        Stage::Transformer => {
            let chunk = job.transformer_scores().div_ceil(u64::from(levers.attention_chunks.max(1)));
            (0, if uncached(chunk) > 0 { c.score_pile } else { 0 }, uncached(job.transformer_wide()))
        }
        Stage::Decoder => (job.decoder_scores(), 0, 0),
    };
    // With every buffer kept and the scores chunked under the cache's limit, the widest tensor is the
    // one left over the limit: it is reused from layer to layer rather than piling up.
    let chunked_and_kept = levers.keep_buffers && levers.attention_chunks > 1;
    let per_wide = if chunked_and_kept { 1.0 } else { c.per_wide };
    let mut working = c.fixed as f64
        + c.per_pixel * job.pixels() as f64
        + c.per_score * scores as f64
        + pile as f64
        + per_wide * wide as f64;
    let split = stage == Stage::Decoder && levers.decoder_piece_bytes.is_some();
    if let (true, Some(piece)) = (split, levers.decoder_piece_bytes) {
        let floor = DECODER_SPLIT_FLOOR_PER_PIXEL * job.pixels() as f64;
        working = working.min((DECODER_PIECE_OVERRUN * piece as f64).max(floor));
    }
    // A chain of pieces keeps no buffers (`imagine_ort::Chain`).
    if levers.keep_buffers && stage != Stage::TextEncoder && !split && !chunked_and_kept {
        working *= KEEP_BUFFERS_FACTOR;
    }
    weights.of(stage) + working.max(0.0) as u64
}

/// The fewest query chunks that bring one attention's scores under ORT's largest cached buffer, for
/// `job`'s transformer.
pub fn attention_chunks(job: &Job) -> u32 {
    chunks_for(TRANSFORMER_HEADS, job.tokens(), job.precision.bytes(), ORT_LARGEST_CACHED_BUFFER)
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
/// split. Where even that
/// does not fit, that plan with `fits: false`: the pages warn before, and the job tries anyway.
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
    let chunked = Levers { attention_chunks: attention_chunks(job), ..Levers::NONE };
    // The decoder alone on the GPU may use what its weights leave of the budget.
    let piece = ((budget.saturating_sub(weights.decoder) as f64 / DECODER_PIECE_OVERRUN) as u64)
        .max(MIN_DECODER_PIECE_BYTES);
    let chunked_kept = Levers { keep_buffers: true, ..chunked };
    let split = Levers { decoder_piece_bytes: Some(piece), ..chunked };
    let split_kept = Levers { keep_buffers: true, ..split };
    let together = wanted.ahead || wanted.keep;
    let candidates = [
        (together, levers, all(levers)),
        (together, lean_levers, all(lean_levers)),
        (false, levers, largest(levers)),
        (false, lean_levers, largest(lean_levers)),
        (false, chunked, largest(chunked)),
        (false, chunked_kept, largest(chunked_kept)),
        (false, split, largest(split)),
        (false, split_kept, largest(split_kept)),
    ];
    let plan_of = |(together, levers, peak): (bool, Levers, u64)| MemoryPlan {
        ahead: together && wanted.ahead,
        keep: together && wanted.keep,
        levers,
        peak,
        fits: peak <= budget,
    };
    candidates.into_iter().map(plan_of).find(|p| p.fits).unwrap_or_else(|| plan_of(candidates[7]))
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
    /// (buffers only where the new plan keeps them), the attention in at least as many chunks, the decoder in pieces of at most half the failed
    /// plan's (or of its whole need). `None` where that changes nothing: no retry then.
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
        let levers = Levers {
            keep_buffers: replanned.levers.keep_buffers,
            attention_chunks: failed.levers.attention_chunks.max(replanned.levers.attention_chunks),
            decoder_piece_bytes: Some(replanned.levers.decoder_piece_bytes.map_or(halved, |p| p.min(halved))),
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
mod tests {
    use super::*;

    const W: StageWeights = StageWeights::PUBLISHED;

    fn job(side: u32, precision: Precision) -> Job {
        Job { width: side, height: side, precision }
    }

    fn gb(bytes: u64) -> f64 {
        bytes as f64 / GB as f64
    }

    #[test]
    fn needs_match_the_measured_figures_within_a_tenth() {
        use Precision::*;
        let cases = [
            (Stage::TextEncoder, 512, Float16, 2.04),
            (Stage::TextEncoder, 512, Float32, 2.39),
            (Stage::Transformer, 512, Float16, 5.85),
            (Stage::Transformer, 1024, Float16, 11.22),
            (Stage::Transformer, 512, Float32, 11.42),
            (Stage::Decoder, 512, Float16, 3.90),
            (Stage::Decoder, 1024, Float16, 17.94),
        ];
        for (stage, side, precision, measured) in cases {
            let need = gb(stage_need(stage, &W, &job(side, precision), Levers::NONE));
            // The text encoder's float16 need is its weights, 0.16 GB above what was measured.
            let tolerance = if stage == Stage::TextEncoder { 0.2 } else { 0.1 };
            assert!(
                (need - measured).abs() <= measured * tolerance,
                "{stage:?} {side} {precision:?}: {need} vs {measured}"
            );
        }
    }

    #[test]
    fn chunks_bring_scores_under_the_cache_limit() {
        let big = job(1024, Precision::Float16);
        let chunks = attention_chunks(&big);
        assert_eq!(chunks, 7, "1.02 GB of scores in chunks of at most 160 MiB");
        assert!(big.transformer_scores().div_ceil(u64::from(chunks)) <= ORT_LARGEST_CACHED_BUFFER);
        assert!(big.transformer_scores().div_ceil(u64::from(chunks - 1)) > ORT_LARGEST_CACHED_BUFFER);
        assert_eq!(attention_chunks(&job(512, Precision::Float16)), 1, "113 MB fits already");
        let chunked =
            stage_need(Stage::Transformer, &W, &big, Levers { attention_chunks: chunks, ..Levers::NONE });
        assert!(chunked < 7 * GB, "{}", gb(chunked));
    }

    #[test]
    fn needs_match_what_ran_on_a_gpu_held_to_8_gb() {
        use Precision::*;
        let chunked = |j: &Job| Levers { attention_chunks: attention_chunks(j), ..Levers::NONE };
        // The H200 held to 7.8 GB free: the float32 transformer ran at 512x512 within 6.74 GB, the
        // float16 one ran at 1024x1024 and the float32 one did not.
        let small32 = job(512, Float32);
        let need = gb(stage_need(Stage::Transformer, &W, &small32, chunked(&small32)));
        assert!((need - 6.74).abs() <= 0.674, "{need}");
        let big16 = job(1024, Float16);
        assert!(stage_need(Stage::Transformer, &W, &big16, chunked(&big16)) <= 7_000_000_000);
        let big32 = job(1024, Float32);
        assert!(stage_need(Stage::Transformer, &W, &big32, chunked(&big32)) > 7_800_000_000);
        // The float32 one at 768x1024 in 8 chunks ran out with ORT's default cache (its widest tensor
        // piling up): the plan then keeps the buffers.
        let tall32 = Job { width: 768, height: 1024, precision: Float32 };
        assert!(stage_need(Stage::Transformer, &W, &tall32, chunked(&tall32)) > 7_000_000_000);
        let kept = |j: &Job| Levers { keep_buffers: true, ..chunked(j) };
        assert!(stage_need(Stage::Transformer, &W, &tall32, kept(&tall32)) <= 7_000_000_000);
        // The decoder in pieces of a quarter of the room, computing in NCHW, ran at 768x1024 and at
        // 1024x1024 within a budget of 7.0 GB.
        let facts = MemoryFacts { weights: W, precision: Float16 };
        for (width, height) in [(768, 1024), (1024, 1024)] {
            let p = facts.default_plan(Some(7_000_000_000), width, height);
            assert!(p.fits && p.levers.decoder_piece_bytes.is_some(), "{width}x{height}: {p:?}");
        }
        assert!(plan(Some(8 * GB), &W, &small32, WANTED).fits);
    }

    const WANTED: Wanted = Wanted { ahead: true, keep: true, keep_buffers: true };

    #[test]
    fn no_budget_is_the_fastest_plan() {
        let p = plan(None, &W, &job(1024, Precision::Float16), WANTED);
        assert!(p.ahead && p.keep && p.levers.keep_buffers && p.fits);
        assert_eq!(p.levers.attention_chunks, 1);
    }

    #[test]
    fn a_budget_steps_down_to_one_stage_at_a_time() {
        let small = job(512, Precision::Float16);
        let wanted = Wanted { keep_buffers: false, ..WANTED };
        let roomy = plan(Some(24 * GB), &W, &small, wanted);
        assert!(roomy.ahead && roomy.keep && roomy.fits, "{roomy:?}");
        let eight = plan(Some(8 * GB), &W, &small, wanted);
        assert!(!eight.ahead && !eight.keep && eight.fits, "{eight:?}");
        assert!(eight.peak <= 8 * GB);
        let six = plan(Some(6 * GB), &W, &small, wanted);
        assert!(six.fits && six.peak <= 6 * GB, "{six:?}");
        let four = plan(Some(4 * GB), &W, &small, wanted);
        assert!(!four.fits && !four.ahead && !four.keep, "{four:?}");
    }

    #[test]
    fn keep_buffers_goes_before_loading_ahead() {
        let big = job(1024, Precision::Float16);
        let all_kept: u64 = STAGES
            .iter()
            .map(|&s| stage_need(s, &W, &big, Levers { keep_buffers: true, ..Levers::NONE }))
            .sum();
        let all_default: u64 = STAGES.iter().map(|&s| stage_need(s, &W, &big, Levers::NONE)).sum();
        let p = plan(Some((all_kept + all_default) / 2), &W, &big, WANTED);
        assert!(p.ahead && p.keep && !p.levers.keep_buffers && p.fits, "{p:?}");
    }

    #[test]
    fn the_attention_is_chunked_and_the_decoder_split_only_where_the_budget_needs_it() {
        let tall = Job { width: 768, height: 1024, precision: Precision::Float16 };
        let roomy = plan(Some(20 * GB), &W, &tall, WANTED);
        assert_eq!((roomy.levers.attention_chunks, roomy.levers.decoder_piece_bytes), (1, None));
        // Whole, the decoder needs 13.6 GB at 768x1024: with 8 GB the attention is chunked and the
        // decoder split into pieces of a quarter of what its weights leave of the budget.
        assert!(stage_need(Stage::Decoder, &W, &tall, Levers::NONE) > 8 * GB);
        let p = plan(Some(8 * GB), &W, &tall, WANTED);
        assert!(p.fits && !p.ahead && !p.keep && !p.levers.keep_buffers, "{p:?}");
        assert_eq!(p.levers.attention_chunks, 4);
        assert_eq!(p.levers.decoder_piece_bytes, Some((8 * GB - W.decoder) / 4));
        assert!(p.peak <= 8 * GB, "{}", gb(p.peak));
        // Every preset size fits 8 GB on both paths; with 4 GB nothing does, and that plan says so.
        for precision in [Precision::Float16, Precision::Float32] {
            for (w, h) in [(512, 512), (768, 1024), (1024, 768), (1024, 1024)] {
                let p = plan(Some(8 * GB), &W, &Job { width: w, height: h, precision }, WANTED);
                assert!(p.fits && p.peak <= 8 * GB, "{precision:?} {w}x{h}: {p:?}");
            }
        }
        let four = plan(Some(4 * GB), &W, &tall, WANTED);
        assert!(!four.fits && four.levers.decoder_piece_bytes.is_some(), "{four:?}");
    }

    #[test]
    fn a_split_decoder_needs_at_least_its_largest_nodes() {
        let big = job(1024, Precision::Float16);
        let tiny_pieces = Levers { decoder_piece_bytes: Some(1), ..Levers::NONE };
        let need = stage_need(Stage::Decoder, &W, &big, tiny_pieces);
        assert!((6.2..6.6).contains(&gb(need)), "{}", gb(need));
        // Pieces larger than the whole decode change nothing.
        let huge = Levers { decoder_piece_bytes: Some(100 * GB), ..Levers::NONE };
        assert_eq!(
            stage_need(Stage::Decoder, &W, &big, huge),
            stage_need(Stage::Decoder, &W, &big, Levers::NONE)
        );
    }

    #[test]
    fn after_running_out_the_plan_is_smaller_until_nothing_is_left_to_cut() {
        let facts = MemoryFacts { weights: W, precision: Precision::Float16 };
        let failed = facts.default_plan(Some(7 * GB), 1024, 768);
        let retry = facts.after_out_of_memory(Some(7 * GB), 1024, 768, &failed).unwrap();
        assert!(!retry.ahead && !retry.keep && !retry.levers.keep_buffers);
        assert!(retry.levers.attention_chunks >= failed.levers.attention_chunks);
        assert!(retry.levers.decoder_piece_bytes.unwrap() <= failed.levers.decoder_piece_bytes.unwrap() / 2);
        // Ballast grown meanwhile: the probe now finds less, and the plan follows it.
        let squeezed = facts.after_out_of_memory(Some(3 * GB), 1024, 768, &failed).unwrap();
        assert!(!squeezed.fits, "{squeezed:?}");
        // Each failure halves the pieces, down to the smallest: then there is nothing left to try.
        let mut plan = failed;
        let mut retries = 0;
        while let Some(next) = facts.after_out_of_memory(Some(7 * GB), 1024, 768, &plan) {
            plan = next;
            retries += 1;
            assert!(retries < 10, "{plan:?}");
        }
        assert_eq!(plan.levers.decoder_piece_bytes, Some(MIN_DECODER_PIECE_BYTES));
        // A whole decoder that failed is split at half its need.
        let roomy = facts.default_plan(None, 512, 512);
        let split = facts.after_out_of_memory(None, 512, 512, &roomy).unwrap();
        let whole = stage_need(Stage::Decoder, &W, &job(512, Precision::Float16), Levers::NONE) - W.decoder;
        assert_eq!(split.levers.decoder_piece_bytes, Some(whole / 2));
    }

    #[test]
    fn out_of_memory_is_told_from_other_failures() {
        // As ORT reported them on the H200 with the rest of its memory held.
        let seen = [
            "running vae_decoder.onnx failed: failed to call OrtRun(). ERROR_CODE: 1, ERROR_MESSAGE: WebGPU \
             validation failed. [Invalid Buffer (unlabeled)] is invalid due to a previous error.\n - While \
             encoding [CommandEncoder (unlabeled)].CopyBufferToBuffer(...)",
            "running transformer_q8.onnx failed: failed to call OrtRun(). ERROR_CODE: 1, ERROR_MESSAGE: \
             /onnxruntime/core/providers/webgpu/buffer_manager.cc:643 void \
             onnxruntime::webgpu::BufferManager::Download(WGPUBuffer, void *, size_t)",
            "GPUOutOfMemoryError: Out of memory",
        ];
        for failure in seen {
            assert!(is_out_of_memory(failure), "{failure}");
        }
        for other in ["the transformer made no progress for 300 s and was stopped", "reading x: HTTP 404"] {
            assert!(!is_out_of_memory(other), "{other}");
        }
    }

    #[test]
    fn the_largest_square_that_fits() {
        let facts = MemoryFacts { weights: W, precision: Precision::Float16 };
        let side = facts.largest_square(8 * GB).unwrap();
        assert!(facts.default_plan(Some(8 * GB), side, side).fits);
        assert!(!facts.default_plan(Some(8 * GB), side + 16, side + 16).fits);
        assert_eq!(side % 16, 0);
        assert_eq!(facts.largest_square(GB), None);
    }

    #[test]
    fn a_failed_plan_caps_later_budgets_on_its_adapter_and_pack() {
        let learned = Learned { adapter: "gpu".into(), pack: "c1".into(), failed_peak: 10 * GB };
        assert_eq!(learned.cap(None, "gpu", "c1"), Some(10 * GB - 1));
        assert_eq!(learned.cap(Some(6 * GB), "gpu", "c1"), Some(6 * GB));
        assert_eq!(learned.cap(Some(16 * GB), "gpu", "c1"), Some(10 * GB - 1));
        assert_eq!(learned.cap(None, "other gpu", "c1"), None);
        assert_eq!(learned.cap(Some(16 * GB), "gpu", "c2"), Some(16 * GB));
        // Below the failed plan, the same job is made one stage at a time.
        let facts = MemoryFacts { weights: W, precision: Precision::Float16 };
        let wanted = Wanted { ahead: true, keep: true, keep_buffers: false };
        let fast = facts.plan(None, 512, 512, wanted);
        let learned = Learned { failed_peak: fast.peak, ..learned };
        let again = facts.plan(learned.cap(None, "gpu", "c1"), 512, 512, wanted);
        assert!(!again.ahead && !again.keep && again.fits, "{again:?}");
    }

    #[test]
    fn budgets_from_the_setting_or_the_probe() {
        let probe = |found| Probe { adapter: "a".into(), found };
        let refused = probe(ProbeFound::Refused { bytes: 10 * GB });
        assert_eq!(budget(GpuMemorySetting::Auto, Some(&refused)), Some(9 * GB));
        assert_eq!(budget(GpuMemorySetting::Set { bytes: 6 * GB }, Some(&refused)), Some(6 * GB));
        assert_eq!(
            budget(GpuMemorySetting::Auto, Some(&probe(ProbeFound::Plenty { bytes: PROBE_CAP_BYTES }))),
            None
        );
        assert_eq!(budget(GpuMemorySetting::Auto, Some(&probe(ProbeFound::Unknown))), None);
        assert_eq!(budget(GpuMemorySetting::Auto, None), None);
    }

    #[test]
    fn settings_in_tenths_of_a_gigabyte() {
        assert_eq!(GpuMemorySetting::gigabytes(8.0), Ok(GpuMemorySetting::Set { bytes: 8 * GB }));
        assert_eq!(GpuMemorySetting::gigabytes(6.25), Ok(GpuMemorySetting::Set { bytes: 6_300_000_000 }));
        assert!(GpuMemorySetting::gigabytes(0.5).is_err());
        assert!(GpuMemorySetting::gigabytes(f64::NAN).is_err());
        assert!(GpuMemorySetting::gigabytes(1000.0).is_err());
        let json = serde_json::to_string(&GpuMemorySetting::Set { bytes: 8 * GB }).unwrap();
        assert_eq!(json, r#"{"mode":"set","bytes":8000000000}"#);
    }

    #[test]
    fn weights_of_a_packs_files() {
        let files = [
            ("text_encoder_q4.onnx", 10),
            ("text_encoder_q4-00000.data", 100),
            ("text_encoder_q4.b32.data", 7),
            ("transformer_q8-00000.data", 200),
            ("transformer_q8.f32-00000.data", 300),
            ("vae_decoder.onnx.data", 30),
            ("tokenizer.json", 5),
        ];
        assert_eq!(
            StageWeights::of_files(files),
            StageWeights { text_encoder: 110, transformer: 200, decoder: 30 }
        );
    }
}
