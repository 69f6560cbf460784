//! Every internal channel between the extension's contexts, typed: one serde enum per direction. A
//! message is its enum serialized to a plain object plus, in its `data` field, at most one transferable
//! (an `ArrayBuffer` or a `MessagePort`), which the typed part never carries.
//!
//! | channel | there | back |
//! |---|---|---|
//! | service worker → offscreen document (`runtime.sendMessage`, `target: "offscreen"`) | [`OffscreenCommand`] | [`OffscreenReply`] |
//! | offscreen document → stage worker | [`StageTask`] + the previous stage's output | [`StageReport`] + this stage's output |
//! | offscreen document → download worker | [`DownloadCommand`] + the port to the hash worker | [`DownloadReport`] |
//! | offscreen document → hash worker | [`HashSetup`] + the port to the download worker | |
//! | download worker → hash worker (that port) | [`HashCommand`] + a buffer | [`HashReport`] + the buffer, back |
//!
//! The public message API (pages ↔ service worker) is `imagine_core::api`.

use imagine_core::api::{DownloadProgress, InstallRequest, Stage};
use imagine_core::hub::HashCheckpoint;
use imagine_core::message::{ErrorText, Message};
use imagine_core::pack::Graph;
use imagine_core::params::SessionOptions;
use imagine_core::storage::PackRecord;
use imagine_core::{Backend, EncodedPrompt, GenerateParams};
use js_sys::Array;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use thiserror::Error;
use wasm_bindgen::prelude::*;

use crate::platform::js::{from_js, get, to_js, JsError};

/// A message that could not be posted, or that is not of the type its channel carries.
#[derive(Debug, Error)]
pub enum ProtocolError {
    /// Posting (or reading the message as JSON) failed in JS.
    #[error(transparent)]
    Js(#[from] JsError),
    /// The message is not of the expected type (serde says where and why: `unknown field ...`).
    #[error(transparent)]
    Malformed(#[from] serde_json::Error),
}

/// The `target` of the service worker's messages for the offscreen document (pages ignore them).
pub const OFFSCREEN_TARGET: &str = "offscreen";

/// The `target` of the offscreen document's "still working" message to the background, sent only in
/// Firefox: there the offscreen document is a frame of the background, an event page that Firefox
/// unloads after 30 s without an event (the frame and its workers with it, a job or download lost);
/// a message it receives is one. Every context ignores it.
pub const KEEP_ALIVE_TARGET: &str = "keepAlive";

/// Service worker → offscreen document.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "camelCase")]
pub enum OffscreenCommand {
    /// Queue a job; its stages run one after the other in workers, which stay loaded
    /// `keep_loaded_seconds` after the last job.
    RunJob {
        /// The job's id, as the service worker gave it to the page that asked.
        job: String,
        /// The validated parameters of its images.
        params: GenerateParams,
        /// Seconds the stages stay loaded after the last job (the user's setting).
        keep_loaded_seconds: u32,
        /// The GPU memory the job may use, in bytes (`imagine_core::gpu_memory`); `None`: no known
        /// limit.
        #[serde(default)]
        gpu_budget: Option<u64>,
    },
    /// How long stages stay loaded after the last job from now on (0 unloads the idle ones at once);
    /// nothing: only say which are loaded.
    KeepLoaded {
        /// The new setting, in seconds; `None` leaves it as it is.
        seconds: Option<u32>,
    },
    /// Stop a queued or running job.
    CancelJob {
        /// The id of the job to stop.
        job: String,
    },
    /// Start the download worker (or let a running one go on).
    InstallPack {
        /// Which pack to download, and from where.
        request: InstallRequest,
    },
    /// Stop the download worker, keeping what it saved.
    PausePack,
    /// Stop the download worker and empty the staging slot.
    CancelPack,
    /// The installed pack `commit` is being deleted: a store of its re-blocked forms is stopped (its
    /// worker terminated, its files let go of) and none starts for it again.
    StopStore {
        /// The commit of the pack being deleted.
        commit: String,
    },
    /// Whether a download worker runs.
    InstallStatus,
    /// The PNG of a private job's image ([`imagine_core::gallery::image_id`]), which only this
    /// document's memory holds; answered with [`OffscreenReply::PrivateImage`].
    PrivateImage {
        /// The image's id: `<job>` or `<job>-<index>`.
        id: String,
    },
    /// The last private window closed: every private job queued or running is cancelled and every
    /// private image is forgotten.
    ForgetPrivate,
}

/// The one limit on the jobs remembered once they have ended: the service worker keeps the state of
/// the latest this many ended jobs (for pages that open late), and the offscreen document names as
/// many ended jobs in its replies, beside every job it has queued or running. A job that has not ended
/// is never forgotten, however many there are.
pub const KEPT_ENDED_JOBS: usize = 8;

/// Offscreen document → service worker: the answer to an [`OffscreenCommand`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "camelCase")]
pub enum OffscreenReply {
    /// Done; whether a download worker runs now, which stages are loaded, and the jobs this document
    /// has (queued or running; and the latest [`KEPT_ENDED_JOBS`] it ended).
    Done {
        /// A download worker runs.
        installing: bool,
        /// The stages whose sessions are loaded now.
        #[serde(default)]
        loaded: Vec<Stage>,
        /// The ids of the jobs this document has queued or running, and of the latest
        /// [`KEPT_ENDED_JOBS`] it ended.
        #[serde(default)]
        jobs: Vec<String>,
    },
    /// The answer to [`OffscreenCommand::PrivateImage`]: the PNG in base64, or `None` when this
    /// document does not hold it (it was forgotten, or another document made it).
    PrivateImage {
        /// The PNG, base64.
        png: Option<String>,
    },
    /// Not done, and why.
    Refused(ErrorText),
}

/// Offscreen document → stage worker: a task of the one stage it runs (`data`: the previous stage's
/// output). A batch (`params.count` images) runs each stage once, on one session, for all its images. A
/// task posted without its `data` creates its session at once and waits for an `Input` with it: so a
/// stage loads while the one before it runs. With `keep`, the worker keeps its session after the task
/// and takes the next task of the same stage on it (a resident stage); without, it releases it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "task", rename_all = "camelCase")]
pub enum StageTask {
    /// The prompt, tokenized by the offscreen document, to `prompt_embeds`.
    TextEncoder {
        /// The job's parameters (backend, batch size, profiling).
        params: GenerateParams,
        /// The prompt's token ids and attention mask.
        prompt: EncodedPrompt,
        /// Keep the session after the task (a resident stage).
        keep: bool,
        /// The stored re-blocked forms (`<commit>:<file>`) whose checksums were checked already in this
        /// document's life: only their lengths are checked again ([`StageTiming::checked_form`]).
        #[serde(default)]
        checked: Vec<String>,
    },
    /// The denoising loop of each image, seeds in a row (`data`: the prompt embeddings, float32).
    Transformer {
        /// The job's parameters (size, steps, seed, schedule, batch size).
        params: GenerateParams,
        /// Keep the session after the task (a resident stage).
        keep: bool,
        /// The stored re-blocked forms (`<commit>:<file>`) whose checksums were checked already in this
        /// document's life: only their lengths are checked again ([`StageTiming::checked_form`]).
        #[serde(default)]
        checked: Vec<String>,
    },
    /// Each image's latents to a PNG (`data`: the final latents of every image, float32, one after the
    /// other).
    Decoder {
        /// The job's parameters (size, and what each PNG records of them).
        params: GenerateParams,
        /// Keep the session after the task (a resident stage).
        keep: bool,
        /// The stored re-blocked forms (`<commit>:<file>`) whose checksums were checked already in this
        /// document's life: only their lengths are checked again ([`StageTiming::checked_form`]).
        #[serde(default)]
        checked: Vec<String>,
    },
    /// The `data` of the task posted before without it.
    Input,
}

impl StageTask {
    /// The stage this task runs and where (an `Input` runs none of its own).
    pub fn stage(&self) -> Option<(Stage, Backend)> {
        match self {
            StageTask::TextEncoder { params, .. } => Some((Stage::TextEncoder, params.backend)),
            StageTask::Transformer { params, .. } => Some((Stage::Transformer, params.backend)),
            StageTask::Decoder { params, .. } => Some((Stage::Decoder, params.backend)),
            StageTask::Input => None,
        }
    }

    /// The pixels of the image the task works on (an `Input`: none).
    pub fn pixels(&self) -> u64 {
        match self {
            StageTask::TextEncoder { params, .. }
            | StageTask::Transformer { params, .. }
            | StageTask::Decoder { params, .. } => u64::from(params.width) * u64::from(params.height),
            StageTask::Input => 0,
        }
    }

    /// The options the task's session is made with (an `Input` has none of its own).
    pub fn session_options(&self) -> Option<SessionOptions> {
        let (params, graph) = match self {
            StageTask::TextEncoder { params, .. } => (params, Graph::TextEncoder),
            StageTask::Transformer { params, .. } => (params, Graph::Transformer),
            StageTask::Decoder { params, .. } => (params, Graph::Decoder),
            StageTask::Input => return None,
        };
        Some(params.session_options(graph))
    }
}

/// Stage worker → offscreen document.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum StageReport {
    /// Transformer step `step` of `steps` of image `image` is done.
    Progress {
        /// The image in the batch, from 0.
        image: u32,
        /// Steps done for that image, from 1.
        step: u32,
        /// Steps each image takes.
        steps: u32,
    },
    /// The decoder finished image `index` (`data`: its PNG); `timing`: its session's creation and
    /// ORT's run for this image.
    Image {
        /// The image in the batch, from 0.
        index: u32,
        /// The decoder's times for this image.
        timing: StageTiming,
    },
    /// The stage's session is created (for benchmarks that watch a stage which may not finish).
    SessionCreated {
        /// The times so far; `started_at_ms` and `session_create_ms` are set.
        timing: StageTiming,
    },
    /// The stage is done and its session released (`data`: its output buffer, if it hands one on).
    Done {
        /// What the stage hands on beside its buffer.
        output: StageOutput,
    },
    /// The stage failed.
    Error(ErrorText),
}

/// What a stage hands on beside its output buffer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "stage", rename_all = "camelCase")]
pub enum StageOutput {
    /// The text encoder's (`data`: the prompt embeddings).
    TextEncoder(EncoderOutput),
    /// The transformer's (`data`: the final latents).
    Transformer(TransformerOutput),
    /// The decoder's: it sent its PNGs one by one in [`StageReport::Image`], so only its times.
    Decoder {
        /// The decoder's times, all images.
        timing: StageTiming,
    },
}

/// What the text encoder hands on (`data`: the prompt embeddings).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EncoderOutput {
    /// The text encoder's times.
    pub timing: StageTiming,
}

/// What the transformer hands on (`data`: the final latents of every image).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransformerOutput {
    /// The noise levels of the schedule, `steps + 1` of them (the same for every image), for the trace.
    pub sigmas: Vec<f32>,
    /// Each image's initial noise, float32 LE base64, when tracing.
    pub noise: Vec<String>,
    /// Each image's first transformer output, float32 LE base64, when tracing.
    #[serde(default)]
    pub first_velocity: Vec<String>,
    /// The `img_ids` and `txt_ids` fed (the same for every image), int64 LE base64, when tracing.
    #[serde(default)]
    pub img_ids: String,
    /// See `img_ids`.
    #[serde(default)]
    pub txt_ids: String,
    /// Time in ORT's run for each image's denoising loop.
    pub image_run_ms: Vec<f64>,
    /// The transformer's times, all images.
    pub timing: StageTiming,
}

/// Where one stage's time went. Instants are milliseconds since the Unix epoch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageTiming {
    /// The graph file its session was created from (`transformer.b32.onnx` for the form re-blocked to 32
    /// at install, say).
    pub graph_file: String,
    /// `graph_file` was re-blocked to 32 while it loaded, on WebGPU: its form was not stored with the
    /// pack, or the stored one was damaged.
    pub reblocked_at_load: bool,
    /// The stored re-blocked form (`<commit>:<file>`) whose checksums this load checked, and found
    /// right.
    #[serde(default)]
    pub checked_form: Option<String>,
    /// How long checking the stored re-blocked form took (its lengths, and its checksums when it was
    /// not checked before), in milliseconds.
    #[serde(default)]
    pub stored_form_check_ms: f64,
    /// Attentions of `graph_file` fused into `MultiHeadAttention` (`imagine_core::graph::attention`).
    pub fused_attention: u32,
    /// Attentions computed in chunks of queries (`GenerateParams::attention_chunks`).
    #[serde(default)]
    pub chunked_attention: u32,
    /// Projections computed per part (`GenerateParams::projections_per_part`).
    #[serde(default)]
    pub parted_projections: u32,
    /// Token-wise chains computed in chunks of tokens (`GenerateParams::token_chunks`).
    #[serde(default)]
    pub chunked_chains: u32,
    /// `Gemm`s computed in parts of their weights' rows (`GenerateParams::weight_part_bytes`).
    #[serde(default)]
    pub parted_gemms: u32,
    /// `MatMulNBits` computed in parts of their weights' rows (`GenerateParams::matmuls_in_parts`).
    #[serde(default)]
    pub parted_matmuls: u32,
    /// Values a streamed transformer's pieces were given that it copied to the GPU in chunks of at
    /// most `GenerateParams::weight_part_bytes`, over this job's runs.
    #[serde(default)]
    pub uploaded_values: u32,
    /// ORT was given its wasm as bytes (`stage-worker.js?ort-wasm=bytes`).
    pub ort_wasm_as_bytes: bool,
    /// The sessions its graph ran as (more than 1: a chain of pieces, `GenerateParams::decoder_piece_bytes`).
    #[serde(default)]
    pub pieces: u32,
    /// The worker's creation (its `performance.timeOrigin`).
    pub worker_created_at_ms: f64,
    /// When its task arrived, i.e. once its script, wasm and ORT's bindings were loaded.
    pub task_at_ms: f64,
    /// When the session creation began (after the graph was read and edited).
    pub started_at_ms: f64,
    /// When the stage's work ended (its session released; the decoder: this image decoded).
    pub finished_at_ms: f64,
    /// How long creating the ORT session took (0 for a resident one), in milliseconds.
    pub session_create_ms: f64,
    /// The session was kept from an earlier task of this worker.
    pub resident: bool,
    /// Time inside ORT's `run`, all runs together, in milliseconds.
    pub run_ms: f64,
    /// Time inside ORT's `run`, each run in order, in milliseconds.
    pub runs_ms: Vec<f64>,
    /// ORT's profile, when the job asked for one.
    pub profile: Option<imagine_core::ort_profile::StageProfile>,
}

/// Offscreen document → download worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum DownloadCommand {
    /// Download (or resume) and install `request` (`data`: the port to the hash worker).
    Install {
        /// The pack's source and the backend it is for.
        request: InstallRequest,
    },
    /// No job runs: the verified pack may replace the installed one.
    Swap,
    /// Store the re-blocked forms of `graphs` (file names in the installed pack `commit`, which stages
    /// re-blocked while loading) with that pack, and add them to its record.
    StoreReblocked {
        /// The installed pack's commit; another one installed meanwhile is left alone.
        commit: String,
        /// The graphs, as the stages loaded them.
        graphs: Vec<String>,
    },
}

/// Download worker → offscreen document.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum DownloadReport {
    /// Bytes downloaded and verified so far.
    Progress {
        /// The download's progress, as the pages show it.
        progress: DownloadProgress,
    },
    /// Every file is verified; waiting for [`DownloadCommand::Swap`].
    SwapReady,
    /// [`DownloadCommand::StoreReblocked`] is done (or found another pack installed).
    ReblockedStored,
    /// The pack is installed.
    Installed {
        /// The record of the installed pack.
        pack: PackRecord,
    },
    /// The download stopped; `offline` when the Hub could not be reached at all.
    Failed {
        /// Why, as text and as a `_locales` message.
        error: ErrorText,
        /// The Hub could not be reached at all (no network), rather than answering with an error.
        offline: bool,
        /// A worker it needs died (the hash worker): the install goes on from its checkpoint with
        /// fresh workers.
        #[serde(default)]
        restart: bool,
    },
}

/// Offscreen document → hash worker, once (`data`: its port to the download worker).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum HashSetup {
    /// Here is the port to the download worker (`data`): hash what comes through it.
    Port,
}

/// Download worker → hash worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum HashCommand {
    /// Start over, from a checkpoint or from the first byte.
    Reset {
        /// The state to resume from; `None` starts from the first byte.
        checkpoint: Option<HashCheckpoint>,
    },
    /// Hash the first `length` bytes of the buffer in `data`, then send it back.
    Data {
        /// How many bytes of the buffer are the file's (the last block is short).
        length: u32,
    },
    /// The state after every block sent so far.
    Checkpoint,
    /// The digest of everything since the last reset.
    Finish,
}

/// Hash worker → download worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum HashReport {
    /// Reset, as asked ([`HashCommand::Reset`]).
    Reset,
    /// A buffer handed back (`data`).
    Buffer,
    /// The answer to [`HashCommand::Checkpoint`].
    Checkpoint {
        /// The hasher's state after every block sent so far, to save in the download record.
        checkpoint: HashCheckpoint,
    },
    /// The answer to [`HashCommand::Finish`].
    Digest {
        /// The SHA-256 of every byte since the last reset.
        digest: [u8; 32],
    },
    /// A command failed (a bad checkpoint, a `Data` without its buffer).
    Error(ErrorText),
}

/// Where messages can be posted: a worker, a worker's own scope, a message port.
pub trait Endpoint {
    /// `postMessage(message, transfer)`: the objects in the `transfer` array move, not copied.
    fn post_message_with_transfer(&self, message: &JsValue, transfer: &JsValue) -> Result<(), JsValue>;
    /// `postMessage(message)`.
    fn post_message(&self, message: &JsValue) -> Result<(), JsValue>;
}

impl Endpoint for web_sys::Worker {
    fn post_message_with_transfer(&self, message: &JsValue, transfer: &JsValue) -> Result<(), JsValue> {
        web_sys::Worker::post_message_with_transfer(self, message, transfer)
    }
    fn post_message(&self, message: &JsValue) -> Result<(), JsValue> {
        web_sys::Worker::post_message(self, message)
    }
}

impl Endpoint for web_sys::DedicatedWorkerGlobalScope {
    fn post_message_with_transfer(&self, message: &JsValue, transfer: &JsValue) -> Result<(), JsValue> {
        web_sys::DedicatedWorkerGlobalScope::post_message_with_transfer(self, message, transfer)
    }
    fn post_message(&self, message: &JsValue) -> Result<(), JsValue> {
        web_sys::DedicatedWorkerGlobalScope::post_message(self, message)
    }
}

impl Endpoint for web_sys::MessagePort {
    fn post_message_with_transfer(&self, message: &JsValue, transfer: &JsValue) -> Result<(), JsValue> {
        self.post_message_with_transferable(message, transfer)
    }
    fn post_message(&self, message: &JsValue) -> Result<(), JsValue> {
        web_sys::MessagePort::post_message(self, message)
    }
}

/// Posts `message`, with `data` (transferred) beside it.
pub fn post<T: Serialize>(
    to: &impl Endpoint,
    message: &T,
    data: Option<&JsValue>,
) -> Result<(), ProtocolError> {
    let object = to_js(message);
    let posted = match data {
        Some(data) => {
            let _ = js_sys::Reflect::set(&object, &"data".into(), data);
            to.post_message_with_transfer(&object, &Array::of1(data))
        }
        None => to.post_message(&object),
    };
    Ok(posted.map_err(JsError::from)?)
}

/// Reads a posted message: its typed part, and its `data` if it has one.
pub fn read<T: DeserializeOwned>(message: &JsValue) -> Result<(T, Option<JsValue>), ProtocolError> {
    let typed = from_js(message)?;
    let data = get(message, "data");
    Ok((typed, (!data.is_undefined() && !data.is_null()).then_some(data)))
}

/// The service worker's message for the offscreen document.
pub fn to_offscreen(command: &OffscreenCommand) -> JsValue {
    let object = to_js(command);
    let _ = js_sys::Reflect::set(&object, &"target".into(), &OFFSCREEN_TARGET.into());
    object
}

/// What the studio should show: a job (with its prompt, as text), or why the job could not start. Kept
/// in `storage::STUDIO_FOCUS`, which the studio reads when it opens and follows as it changes: a side
/// panel that is just opening and one already open both show what the context menu or a notification
/// asked for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StudioFocus {
    /// The job to follow, when it started.
    pub job: Option<String>,
    /// The prompt, to show in the studio's prompt box.
    #[serde(default)]
    pub prompt: String,
    /// The job is private (text selected in a private window): so is whatever the studio makes from
    /// its prompt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub private: bool,
    /// Why the job could not start, when it did not.
    pub error: Option<String>,
    /// The same, as a `_locales` message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    /// Changes on every request, so that asking twice for the same job is still a change.
    #[serde(default)]
    pub nonce: u64,
}

/// What the toolbar button opens: the studio in the side panel (default) or the quick-prompt popup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ToolbarOpens {
    /// The studio, in the side panel (the action has no popup).
    #[default]
    Studio,
    /// The quick-prompt popup (`popup.html`).
    Popup,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json<T: Serialize>(value: &T) -> String {
        serde_json::to_string(value).unwrap()
    }

    /// The fields the JS shims look at (`command`, `op`, `reply`) keep their names.
    #[test]
    fn tags_are_the_ones_the_shims_read() {
        assert_eq!(json(&OffscreenCommand::PausePack), r#"{"command":"pausePack"}"#);
        assert_eq!(json(&DownloadCommand::Swap), r#"{"op":"swap"}"#);
        assert_eq!(json(&HashCommand::Data { length: 3 }), r#"{"op":"data","length":3}"#);
        assert_eq!(
            json(&OffscreenReply::Refused(ErrorText {
                error: "x".into(),
                message: Some(Message::text("x"))
            })),
            r#"{"reply":"refused","error":"x","message":{"key":"errText","args":["x"]}}"#
        );
    }
}
