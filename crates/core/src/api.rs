//! The one message API. The popup, the result page, the context menu and the tests all speak it to the
//! service worker through `chrome.runtime.sendMessage`; events are broadcast the same way to every
//! extension page. README.md documents it for people; this module is the source of truth.
//!
//! Every message is a JSON object with a `type` field. Field names are camelCase.

use serde::{Deserialize, Serialize};

use crate::gallery::{GalleryItem, GalleryLimit};
use crate::gpu_memory::{GpuMemorySetting, MemoryFacts, MemoryPlan, Probe};
use crate::image::ImageParams;
use crate::message::{Localize, Message};

mod pack;
pub use pack::*;

/// A request to the service worker. Each one gets exactly one [`Reply`]. A field the request does not
/// have (a misspelt `widht`) is an error, not silently dropped (which is why the requests without
/// fields are empty struct variants: serde checks no fields of a unit variant).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase", deny_unknown_fields)]
pub enum Request {
    /// Download and install the pack from a Hugging Face Hub repo (resumable, verified). Joins an
    /// install already running. Missing fields take the defaults of [`PackSource`].
    InstallPack(InstallRequest),
    /// Resolve the revision and list what an install would download, without writing anything.
    PlanPack(PackSource),
    /// Pause the running download, keeping what is downloaded.
    PausePack {},
    /// Resume a paused or failed download.
    ResumePack {},
    /// Stop the download and remove its partial files.
    CancelPack {},
    /// Remove the installed pack and free its storage.
    DeletePack {},
    /// Whether a pack is installed, the storage it uses, and any download in progress.
    PackStatus {},
    /// Start a generation. Missing fields take their defaults.
    Generate(GenerateRequest),
    /// Cancel a running job.
    Cancel { job: String },
    /// The state of one job: running (with its last progress), done (with its result) or failed.
    Job { job: String },
    /// The gallery's images matching a prompt search, newest first, one page of them.
    GalleryList(GalleryListRequest),
    /// One gallery image: its PNG and parameters.
    GalleryImage { id: String },
    /// Removes one gallery image.
    GalleryDelete { id: String },
    /// Removes every gallery image.
    GalleryClear {},
    /// Writes a zip of every gallery image and their parameters to OPFS `exports/gallery.zip`.
    GalleryExport {},
    /// Sets the gallery's caps (a missing field keeps its value) and applies them at once.
    GalleryLimit(GalleryLimitRequest),
    /// How long the model stays loaded after the last image (`seconds`, 0 to 3600; 0 unloads it after
    /// each image), set when given, and which stages are loaded now.
    KeepLoaded(KeepLoadedRequest),
    /// The GPU memory a job may use, set when `setting` is given; `measure` probes this GPU again.
    GpuMemory(GpuMemoryRequest),
}

/// `gpuMemory`: the setting to make, whether to probe the GPU again, and (tests) a cap that lets the
/// probe run on a software renderer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct GpuMemoryRequest {
    /// `{"mode": "auto"}` (what the probe found) or `{"mode": "set", "bytes": N}` (1 to 512 GB).
    pub setting: Option<GpuMemorySetting>,
    /// Probe the GPU again (the stages kept loaded are unloaded first, so that they are not counted).
    pub measure: bool,
    /// For tests: the probe runs on a software renderer too, holding at most this many bytes.
    pub probe_cap_bytes: Option<u64>,
}

/// `gpuMemory`'s reply: what the plan of a job uses now, and what a page needs to say which sizes fit
/// (`imagine_core::gpu_memory::plan` on each size).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuMemoryStatus {
    pub setting: GpuMemorySetting,
    /// The last probe of this GPU, if any.
    pub probe: Option<Probe>,
    /// The budget in force, in bytes; absent: no known limit.
    pub budget: Option<u64>,
    /// Each stage's weights (the installed pack's, else the published pack's) and how the graphs
    /// compute on this GPU.
    #[serde(flatten)]
    pub facts: MemoryFacts,
}

/// `keepLoaded`: the seconds to set, or nothing to only read them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct KeepLoadedRequest {
    pub seconds: Option<i64>,
}

/// `keepLoaded`'s reply: the setting in force and the stages whose sessions are loaded now (kept from
/// the last image, or loading for the running one).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Residency {
    pub seconds: u32,
    pub loaded: Vec<Stage>,
}

/// `galleryList`: a case-insensitive substring of the prompt, and a page.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct GalleryListRequest {
    pub query: Option<String>,
    /// Items to skip (default 0).
    pub offset: Option<i64>,
    /// Items to return: 1 to 500 (default 60).
    pub limit: Option<i64>,
}

/// `galleryLimit`: the caps, each optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct GalleryLimitRequest {
    /// 1 to 10000 images.
    pub max_items: Option<i64>,
    /// 1 MiB to 64 GiB.
    pub max_bytes: Option<i64>,
}

/// `galleryList`'s reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GalleryPage {
    /// Newest first.
    pub items: Vec<GalleryItem>,
    /// Items matching the query (all of them, not only this page).
    pub total: u32,
    /// Items in the gallery.
    pub count: u32,
    /// Bytes of all the gallery's PNGs.
    pub bytes_used: u64,
    pub limit: GalleryLimit,
}

/// `generate`: what the caller asked for, before validation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct GenerateRequest {
    pub prompt: String,
    pub width: Option<i64>,
    pub height: Option<i64>,
    pub steps: Option<i64>,
    /// A u64, as a JSON number (exact up to 2^53) or a decimal string (any u64).
    pub seed: Option<Seed>,
    pub schedule: Option<String>,
    /// Also return the token ids, sigmas and initial noise, for verification.
    pub trace: bool,
    /// `webgpu` (default) or `wasm`. The wasm backend is never chosen silently.
    pub backend: Option<String>,
    /// Images to make, 1 to 8 (default 1), with seeds `seed`, `seed + 1`, ...: one `result` event each.
    pub count: Option<i64>,
    /// For benchmarks: `false` loads one stage at a time, each when the stage before it is done
    /// (default `true`: every stage the job needs loads at once).
    pub load_ahead: Option<bool>,
    /// For benchmarks: every stage is loaded afresh with ONNX Runtime's profiling on, and each
    /// result's timings carry its profile (`StageTimings::profile`). Nothing stays loaded after it.
    pub profile: bool,
    /// For benchmarks: the `accuracy_level` of every `MatMulNBits` on WebGPU, 0 to 4 (4: int8
    /// activations, faster and less exact); as the pack has it when absent. The prompt-embedding cache
    /// is neither read nor written with it.
    pub accuracy_level: Option<i64>,
    /// ONNX Runtime keeps every GPU buffer a WebGPU session released for its next run (its `simple`
    /// storage-buffer cache) instead of only those up to 160 MiB (`bucket`, its default). Absent: kept
    /// for images larger than 512x512 ([`crate::params::KEEP_BUFFERS_ABOVE_PIXELS`]); benchmarks set it
    /// to compare.
    pub keep_buffers: Option<bool>,
    /// For benchmarks: `true` fuses the transformer's attention into ONNX Runtime's `MultiHeadAttention`
    /// (its flash attention) on WebGPU (`crate::graph::attention`); by default it runs as exported, node by
    /// node, which measured faster (BENCHMARKS.md).
    pub fuse_attention: Option<bool>,
    /// For benchmarks and tests: `true` computes the transformer's wide projections per part on WebGPU
    /// (`crate::graph::projections`); by default as the GPU memory plan says.
    pub projections_per_part: Option<bool>,
    /// For benchmarks and tests: the transformer's token-wise chains (its MLPs and the second
    /// projection) computed on WebGPU in this many chunks of tokens (`crate::graph::rows`), clamped to 1
    /// to 64; by default as the GPU memory plan says.
    pub token_chunks: Option<u32>,
    /// For benchmarks and tests: the transformer streamed on WebGPU in this many pieces of its weights,
    /// one piece's session at a time (`crate::graph::split::by_weights`), clamped to 1 to 8; by default
    /// as the GPU memory plan says (whole, unless its weights do not fit beside its work).
    pub transformer_pieces: Option<u32>,
    /// For benchmarks and tests: the decoder runs on WebGPU as a chain of pieces of at most this many
    /// bytes each (`crate::graph::split`), the GPU awaited between them; by default as the GPU
    /// memory plan says (whole, unless the budget needs it).
    pub decoder_piece_bytes: Option<u64>,
    /// For tests: a `Gemm` whose weights weigh more than this many bytes is computed on WebGPU in
    /// parts of its weights' rows (`crate::graph::weight_parts`), and a `MatMulNBits` too where stages
    /// load one at a time; at least 1024; by default
    /// [`crate::graph::weight_parts::MAX_PART_BYTES`].
    pub weight_part_bytes: Option<u64>,
    /// Leaves nothing on disk: the images are kept only until the browser closes (not in the gallery),
    /// no notification shows the prompt, and the prompt's embeddings are not cached. Set for text
    /// selected in a private window unless the user allowed keeping those.
    pub private: bool,
}

/// A seed as it arrives in JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Seed {
    Number(f64),
    Text(String),
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Stage {
    TextEncoder,
    Transformer,
    Decoder,
}

impl Stage {
    /// The stage as English messages name it.
    pub fn name(self) -> &'static str {
        match self {
            Stage::TextEncoder => "text encoder",
            Stage::Transformer => "transformer",
            Stage::Decoder => "decoder",
        }
    }

    /// The `_locales` key of its name, which says the same in the page's language.
    pub fn message_key(self) -> &'static str {
        match self {
            Stage::TextEncoder => "stageTextEncoder",
            Stage::Transformer => "stageTransformer",
            Stage::Decoder => "stageDecoder",
        }
    }
}

/// The reply to a [`Request`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Reply {
    /// `installPack`/`resumePack` accepted; follow `packProgress` events.
    InstallStarted,
    /// `planPack`.
    PackPlan(PackPlan),
    /// `pausePack`, `cancelPack`, `deletePack` done.
    Done,
    PackStatus(PackStatus),
    /// `generate` accepted: the job id and the seed it will use (as a decimal string).
    #[serde(rename_all = "camelCase")]
    JobStarted {
        job: String,
        seed: String,
    },
    Cancelled {
        job: String,
    },
    Job(JobState),
    /// `galleryList`.
    Gallery(GalleryPage),
    /// `galleryImage`: the PNG as base64.
    GalleryImage {
        item: GalleryItem,
        png: String,
    },
    /// `galleryExport`: where the zip is (an OPFS path), its size and how many images it holds.
    GalleryExport {
        file: String,
        bytes: u64,
        images: u32,
    },
    /// `galleryLimit`: the caps now in force.
    GalleryLimit(GalleryLimit),
    KeepLoaded(Residency),
    GpuMemory(GpuMemoryStatus),
    /// The request was refused; `error` says what was wrong and what is allowed (in English).
    Error {
        error: String,
        /// The same, as a `_locales` message for the page's language (absent from older states).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<Message>,
    },
}

/// The state of a job (`job` request, and what pages show when they open late).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "camelCase")]
pub enum JobState {
    /// `prompt`: what is being drawn, so a page opened on the job can say so. `results`: the images
    /// of a batch finished so far.
    Running {
        progress: Option<Progress>,
        #[serde(default)]
        prompt: String,
        #[serde(default)]
        results: Vec<GenerateResult>,
        /// Made for a `private` request ([`GenerateRequest::private`]), like every one of its results.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        private: bool,
    },
    /// `result`: the last image; `results`: every image of the job, in order.
    Done {
        result: GenerateResult,
        #[serde(default)]
        results: Vec<GenerateResult>,
    },
    /// `results`: the images of a batch finished before it failed.
    Failed {
        error: String,
        /// The same, as a `_locales` message for the page's language (absent from older states).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<Message>,
        #[serde(default)]
        results: Vec<GenerateResult>,
    },
    /// `results`: the images of a batch finished before the cancel.
    Cancelled {
        #[serde(default)]
        results: Vec<GenerateResult>,
    },
    Unknown,
}

impl JobState {
    /// A failure with no image.
    pub fn failed(error: &(impl Localize + ?Sized)) -> JobState {
        JobState::Failed { error: error.to_string(), message: Some(error.message()), results: Vec::new() }
    }

    /// Whether the job has ended (done, failed, cancelled; an unknown job too): only a running one,
    /// queued or under way, has not.
    pub fn has_ended(&self) -> bool {
        !matches!(self, JobState::Running { .. })
    }

    /// Whether the job was made for a `private` request: nothing derived from it may be kept.
    pub fn is_private(&self) -> bool {
        matches!(self, JobState::Running { private: true, .. }) || self.results().iter().any(|r| r.private)
    }

    /// The images finished so far.
    pub fn results(&self) -> &[GenerateResult] {
        match self {
            JobState::Running { results, .. }
            | JobState::Done { results, .. }
            | JobState::Failed { results, .. }
            | JobState::Cancelled { results } => results,
            JobState::Unknown => &[],
        }
    }
}

/// One progress report of a running job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    pub stage: Stage,
    /// 1-based step within the stage (the transformer has `steps` of them, the others 1).
    pub step: u32,
    pub steps: u32,
    /// The image of the batch this is about, 0-based (the text encoder's is 0: it serves them all).
    #[serde(default)]
    pub image: u32,
    /// Images in the batch.
    #[serde(default = "one")]
    pub images: u32,
}

fn one() -> u32 {
    1
}

/// A finished image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerateResult {
    pub job: String,
    /// The PNG, base64. It carries the prompt, seed, size, steps and schedule in text chunks.
    pub png: String,
    /// What made it (in the JSON, its keys among these).
    #[serde(flatten)]
    pub image: ImageParams,
    /// Prompt tokens used, chat template included, at most 512.
    pub token_count: u32,
    /// Whether the prompt lost its tail to the 512-token limit.
    pub truncated: bool,
    pub trace: Option<Trace>,
    /// Where the time went, for benchmarks.
    pub timings: Option<Timings>,
    /// This image's place in its batch, 0-based (its seed is the batch's first plus `index`).
    #[serde(default)]
    pub index: u32,
    /// Images in the batch.
    #[serde(default = "one")]
    pub count: u32,
    /// Made for a `private` request: kept until the browser closes, never in the gallery.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub private: bool,
}

/// Time spent in one generation, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timings {
    /// Inside ORT's `InferenceSession.create`, all stages (shared by the images of a batch).
    pub session_create_ms: f64,
    /// Inside ORT's `run`, all stages: the prompt's encoding (none when its embeddings were cached) and
    /// this image's denoising and decoding.
    pub run_ms: f64,
    /// From the offscreen document starting the job to this PNG being ready.
    pub total_ms: f64,
    /// The same per stage, in the order they ran (`cargo xtask bench scale` reads it).
    #[serde(default)]
    pub stages: Vec<StageTimings>,
    /// The GPU memory plan the job ran with, and the budget it was made for (absent: no known limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryPlan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<u64>,
}

/// Where one stage's time went. Instants are milliseconds since the Unix epoch, so that a benchmark
/// outside the browser can line its own samples up with the stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageTimings {
    pub stage: Stage,
    /// The graph file its session was created from (`transformer.b32.onnx`: the form re-blocked to 32
    /// at install); empty when the stage did not run.
    #[serde(default)]
    pub graph_file: String,
    /// Attentions of the graph fused into `MultiHeadAttention` (`crate::graph::attention`).
    #[serde(default)]
    pub fused_attention: u32,
    /// Attentions computed in chunks of queries to hold less GPU memory (`crate::graph::attention::chunk_attention`).
    #[serde(default)]
    pub chunked_attention: u32,
    /// Projections computed per part to hold less GPU memory (`crate::graph::projections`); left out
    /// of the JSON when none, as results written before it were.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub parted_projections: u32,
    /// Token-wise chains computed in chunks of tokens to hold less GPU memory (`crate::graph::rows`);
    /// left out of the JSON when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub chunked_chains: u32,
    /// `Gemm`s computed in parts of their weights' rows, so that no weight is uploaded whole
    /// (`crate::graph::weight_parts`); left out of the JSON when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub parted_gemms: u32,
    /// `MatMulNBits` computed in parts of their weights' rows, where stages load one at a time
    /// (`crate::graph::weight_parts`); left out of the JSON when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub parted_matmuls: u32,
    /// Values the streamed transformer's pieces were given (what one passes the next) that it copied
    /// to the GPU itself through a staging buffer of at most `weightPartBytes`, a chunk at a time,
    /// over the image's steps; left out of the JSON when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub uploaded_values: u32,
    /// The stage worker handed ORT its wasm as bytes (stages loaded one at a time) rather than its URL
    /// (Chromium's code cache); left out of the JSON when not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ort_wasm_as_bytes: bool,
    /// The sessions its graph ran as: more than 1 for a decoder cut into a chain of pieces to hold less
    /// GPU memory (`crate::graph::split`); 0 when the stage did not run.
    #[serde(default)]
    pub pieces: u32,
    /// How long checking the stored form re-blocked to 32 took before it was loaded, in milliseconds:
    /// its files' lengths, and their checksums at its first load in a browser session (0: none loaded).
    #[serde(default)]
    pub stored_form_check_ms: f64,
    /// The stage worker's creation; 0 when the stage did not run (cached prompt embeddings).
    #[serde(default)]
    pub worker_created_at_ms: f64,
    /// When the worker had loaded and received its task.
    #[serde(default)]
    pub task_at_ms: f64,
    /// When its session creation began (the graph read from storage and prepared).
    pub started_at_ms: f64,
    /// When its work ended (the decoder: this image decoded). With the next stage loading while this
    /// one runs, stages overlap.
    #[serde(default)]
    pub finished_at_ms: f64,
    /// Inside `InferenceSession.create`; 0 when the session was `resident`.
    pub session_create_ms: f64,
    /// The session was loaded already, kept from an earlier job (`keepLoaded`).
    #[serde(default)]
    pub resident: bool,
    /// Inside `run`: all runs of this image (the transformer: of the whole batch), and each one.
    pub run_ms: f64,
    #[serde(default)]
    pub runs_ms: Vec<f64>,
    /// ONNX Runtime's profile of the stage, for a `generate` with `profile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<crate::ort_profile::StageProfile>,
}

/// What the independent reference needs to recompute an image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Trace {
    /// 512 ids, padded.
    pub input_ids: Vec<i64>,
    pub attention_mask: Vec<i64>,
    /// `steps + 1` sigmas, the last one 0.
    pub sigmas: Vec<f32>,
    /// Initial packed latents `[1, N, 128]`, float32 little-endian, base64.
    pub noise: String,
    /// The transformer's output at the first step (`noise_pred` for the initial latents), the same
    /// layout: what two forms of the graph must agree on for the same inputs.
    #[serde(default)]
    pub first_velocity: String,
    /// The transformer's `img_ids` as fed, `[1, N, 4]`, int64 little-endian, base64.
    #[serde(default)]
    pub img_ids: String,
    /// The transformer's `txt_ids` as fed, `[1, 512, 4]`, int64 little-endian, base64.
    #[serde(default)]
    pub txt_ids: String,
    /// The prompt embeddings fed as `encoder_hidden_states`, the rows of the real tokens only (those
    /// `attention_mask` marks, the first `T`): `[1, T, 7680]`, float32 little-endian, base64 (the
    /// padding rows would make it 21 MB).
    #[serde(default)]
    pub prompt_embeds: String,
}

/// An event, broadcast to every extension page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Event {
    #[serde(rename_all = "camelCase")]
    Progress {
        job: String,
        progress: Progress,
    },
    Result(GenerateResult),
    Failed {
        job: String,
        error: String,
        /// The same, as a `_locales` message for the page's language (absent from older states).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<Message>,
    },
    Cancelled {
        job: String,
    },
    PackProgress(DownloadProgress),
    #[serde(rename_all = "camelCase")]
    PackInstalled {
        bytes: u64,
        commit: String,
    },
    PackFailed {
        error: String,
        /// The same, as a `_locales` message for the page's language (absent from older states).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<Message>,
        /// The network was down (the Hub never answered): the download is tried again by itself.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        offline: bool,
    },
    /// The model or its download changed in a way no progress report tells: paused, resumed,
    /// cancelled, the model deleted, or a download's end recorded. Pages ask `packStatus` again.
    PackChanged {},
    /// Stages were loaded or released, or the keep-loaded setting changed.
    Residency(Residency),
    /// Images were deleted from the gallery: `ids`, or every image (`all`).
    GalleryDeleted {
        ids: Vec<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        all: bool,
    },
}

impl Request {
    /// What every open page should hear once this request is done, where no other event tells it.
    pub fn announcement(&self) -> Option<Event> {
        match self {
            Request::PausePack {}
            | Request::ResumePack {}
            | Request::CancelPack {}
            | Request::DeletePack {} => Some(Event::PackChanged {}),
            Request::GalleryDelete { id } => {
                Some(Event::GalleryDeleted { ids: vec![id.clone()], all: false })
            }
            Request::GalleryClear {} => Some(Event::GalleryDeleted { ids: Vec::new(), all: true }),
            _ => None,
        }
    }
}

impl Reply {
    /// The refusal `error`, in English and as a message.
    pub fn error(error: &(impl Localize + ?Sized)) -> Reply {
        Reply::Error { error: error.to_string(), message: Some(error.message()) }
    }
}

impl Event {
    /// Job `job` failed with `error`.
    pub fn failed(job: String, error: &(impl Localize + ?Sized)) -> Event {
        Event::Failed { job, error: error.to_string(), message: Some(error.message()) }
    }

    /// The download stopped with `error`; `offline` when the network was down.
    pub fn pack_failed(error: &(impl Localize + ?Sized), offline: bool) -> Event {
        Event::PackFailed { error: error.to_string(), message: Some(error.message()), offline }
    }

    /// What every open page should hear once the service worker has recorded this event: the end of a
    /// download changes the record the pages read, and they hear the event itself when the service
    /// worker does, so a page that asked at once could read the record from before.
    pub fn announcement(&self) -> Option<Event> {
        match self {
            Event::PackInstalled { .. } | Event::PackFailed { .. } => Some(Event::PackChanged {}),
            _ => None,
        }
    }

    /// What the toolbar badge says after this event: `Some("")` clears it, `None` leaves it. A running
    /// job shows its step (`2/4`), a download its percentage.
    pub fn badge(&self) -> Option<String> {
        match self {
            Event::Progress { progress, .. } => Some(match progress.stage {
                Stage::Transformer => format!("{}/{}", progress.step, progress.steps),
                Stage::TextEncoder | Stage::Decoder => "\u{2026}".to_owned(),
            }),
            Event::Result(_) | Event::Failed { .. } | Event::Cancelled { .. } => Some(String::new()),
            Event::PackProgress(p) => Some(match p.state {
                DownloadState::Downloading | DownloadState::Converting if p.total_bytes > 0 => {
                    format!("{}%", p.done_bytes.saturating_mul(100) / p.total_bytes)
                }
                _ => String::new(),
            }),
            Event::PackInstalled { .. } | Event::PackFailed { .. } => Some(String::new()),
            Event::PackChanged {} | Event::Residency(_) | Event::GalleryDeleted { .. } => None,
        }
    }
}

/// Who sent a message, from the browser's `runtime.MessageSender`: only the extension's own contexts are
/// listened to, and each channel only to the context that speaks on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// The background, `sw.js`: Chrome's service worker, in Firefox the event page that runs it. The
    /// offscreen document's commands.
    ServiceWorker,
    /// The offscreen document: the events it broadcasts.
    Offscreen,
    /// Another page of the extension (popup, result page, tests): requests.
    Page,
    /// Anything else: another extension, a content script, a web page.
    Foreign,
}

impl Sender {
    /// Classifies a sender by its extension id and URL, given this extension's id and origin
    /// (`runtime.getURL("")`: `chrome-extension://<id>/`; Firefox's `moz-extension://<uuid>/` does not
    /// name the id).
    pub fn classify(own_id: &str, own_origin: &str, id: Option<&str>, url: Option<&str>) -> Sender {
        match (id, url.and_then(|url| url.strip_prefix(own_origin))) {
            (Some(id), Some(path)) if id == own_id && own_origin.ends_with('/') => match path {
                // Firefox runs the background's scripts in a page it makes for them.
                "sw.js" | "_generated_background_page.html" => Sender::ServiceWorker,
                "offscreen.html" => Sender::Offscreen,
                _ => Sender::Page,
            },
            _ => Sender::Foreign,
        }
    }
}

#[cfg(test)]
mod tests;

fn is_zero(n: &u32) -> bool {
    *n == 0
}
