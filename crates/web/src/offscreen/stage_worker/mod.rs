//! A dedicated worker of the offscreen document that runs one stage, then is terminated.
//!
//! Messages: [`StageTask`] in (with the previous stage's output buffer, or without it, which comes
//! later in a `StageTask::Input` while the session is created), [`StageReport`] out (with this stage's
//! output buffer), see `crate::platform::protocol`.
//!
//! A task without `keep` releases the session before it reports `done`; the offscreen document then
//! terminates the worker, which frees the GPU device ORT opened in it and the wasm heap. A task with
//! `keep` leaves the session loaded for the next task of the same stage (a resident stage), until the
//! offscreen document terminates the worker.

use futures_channel::mpsc;
use futures_util::StreamExt;
use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;
use imagine_core::graph::reblock::{self, ReblockedForm, ReblockedRecord};
use imagine_core::graph::tables::{self, TableLookup};
use imagine_core::graph::{attention, clip, projections, rows, weight_parts};
use imagine_core::graph::{EmbeddingLookup, Range};
use imagine_core::message::{arg, cause, ErrorText, Localize, Message};
use imagine_core::pack::{self, Graph, PackError};
use imagine_core::params::SessionOptions;
use imagine_core::stages::{self, DenoiseParams, StageError};
use imagine_core::{
    Backend, DType, EncodedPrompt, GenerateParams, SessionError, Tensor, TensorData, TensorInfo,
};
use imagine_ort::{self as ort, ExternalData, OrtError, Provider, Session};
use js_sys::{Float32Array, Uint8Array};
use std::collections::HashMap;
use std::future::Future;
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{spawn_local, JsFuture};
use web_sys::{DedicatedWorkerGlobalScope, MessageEvent};

use crate::platform::error_messages::detail;
use crate::platform::gpu::{self, GpuError};
use crate::platform::js::{now_ms, time_origin_ms, JsError, LogError};
use crate::platform::opfs::{self, OpfsError};
use crate::platform::protocol::{
    self, EncoderOutput, ProtocolError, StageOutput, StageReport, StageTask, StageTiming, TransformerOutput,
};

mod loading;
mod session;

use loading::*;
use session::*;

/// Why a stage could not run.
#[derive(Debug, Error)]
pub enum StageWorkerError {
    /// A message to this worker that is not a [`StageTask`].
    #[error("not a stage task: {0}")]
    NotATask(ProtocolError),
    /// No pack is installed (it was deleted after the job was accepted).
    #[error("no model pack is installed: install one first")]
    NoPack,
    /// Reading the pack's files in OPFS.
    #[error(transparent)]
    Opfs(#[from] OpfsError),
    /// A graph of the installed pack that breaks the pack contract.
    #[error("{graph}: {source}")]
    Graph {
        /// The graph's file name.
        graph: String,
        /// What of the contract it breaks.
        source: PackError,
    },
    /// A graph that could not be edited before its session is created (tables taken out, blocks of 32):
    /// it is not a readable ONNX model.
    #[error("{graph}: {source}")]
    GraphEdit {
        /// The graph's file name.
        graph: String,
        /// Why the edit failed.
        source: imagine_core::graph::RewriteError,
    },
    /// A file a graph's external data is in.
    #[error("{graph} needs {file}: {source}")]
    ExternalData {
        /// The graph's file name.
        graph: String,
        /// The external-data file it names.
        file: String,
        /// Why that file could not be opened.
        source: Box<OpfsError>,
    },
    /// No WebGPU adapter, or one the chosen graph cannot run on.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// ORT could not create the session.
    #[error("loading {graph} failed: {source}")]
    Load {
        /// The graph's file name.
        graph: String,
        /// ORT's error.
        source: OrtError,
    },
    /// The pipeline itself (a graph that does not fit the contract, a failed run).
    #[error(transparent)]
    Stage(#[from] StageError),
    /// The previous stage's output did not come with the task.
    #[error("internal: missing {0}")]
    MissingInput(&'static str),
    /// A failure a test asked for (`opfs::failpoint_reached`).
    #[error("a test made the {0} fail")]
    Injected(String),
}

/// Entry point of `stage-worker.js`.
#[wasm_bindgen(js_name = stageWorkerMain)]
pub fn stage_worker_main() {
    imagine_ort::configure(1);
    // ORT asks for a high-performance adapter only; some machines offer their GPU for another preference.
    gpu::find_any_adapter();
    // ORT 1.30's subgroup-matrix kernels do not compile on every Chromium that offers the feature.
    gpu::open_devices_ort_can_use();
    let (sender, inbox) = mpsc::unbounded();
    let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |event: MessageEvent| {
        let _ = sender.unbounded_send((event.data(), Arrival::now()));
    });
    worker_scope().set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    // The worker lives exactly as long as this handler.
    on_message.forget();
    spawn_local(serve(inbox));
}

/// The messages posted to this worker, each with the moment it arrived.
type Inbox = mpsc::UnboundedReceiver<(JsValue, Arrival)>;

/// Runs the tasks in the order they arrive, each reported `Done` or `Error`. The session is kept
/// between tasks that ask for it (a resident stage) and released after one that does not.
async fn serve(mut inbox: Inbox) {
    let mut kept = None;
    while let Some((message, arrived)) = inbox.next().await {
        let outcome = match protocol::read::<StageTask>(&message) {
            Ok((task, data)) => run_task(task, data, arrived, &mut kept, &mut inbox).await,
            Err(e) => Err(StageWorkerError::NotATask(e)),
        };
        match outcome {
            Ok((output, data)) => report(&StageReport::Done { output }, data.as_ref()),
            Err(error) => report(&StageReport::Error(ErrorText::of(&error)), None),
        }
    }
}

async fn run_task(
    task: StageTask,
    data: Option<JsValue>,
    arrived: Arrival,
    kept: &mut Option<Stage>,
    inbox: &mut Inbox,
) -> StageResult {
    // A task posted without its input gets it in the next message, an `Input`.
    let input = async move {
        match data {
            Some(data) => Some(data),
            None => match inbox.next().await.map(|(message, _)| protocol::read::<StageTask>(&message)) {
                Some(Ok((StageTask::Input, data))) => data,
                _ => None,
            },
        }
    };
    match task {
        StageTask::TextEncoder { params, prompt, keep, checked } => {
            let stage = Stage::take(kept, Graph::TextEncoder, &params, &checked, arrived).await?;
            text_encoder(stage, &prompt, keep.then_some(kept)).await
        }
        StageTask::Transformer { params, keep, checked } => {
            let stage = Stage::take(kept, Graph::Transformer, &params, &checked, arrived).await?;
            transformer(stage, &params, input, keep.then_some(kept)).await
        }
        StageTask::Decoder { params, keep, checked } => {
            let stage = Stage::take(kept, Graph::Decoder, &params, &checked, arrived).await?;
            decoder(stage, &params, input, keep.then_some(kept)).await
        }
        StageTask::Input => Err(StageWorkerError::MissingInput("a task before its input")),
    }
}

fn worker_scope() -> DedicatedWorkerGlobalScope {
    js_sys::global().unchecked_into()
}

/// When this worker was created and when its task arrived (epoch milliseconds): what starting it cost.
#[derive(Clone, Copy)]
struct Arrival {
    worker_created_at_ms: f64,
    task_at_ms: f64,
}

impl Arrival {
    fn now() -> Arrival {
        Arrival { worker_created_at_ms: time_origin_ms(), task_at_ms: js_sys::Date::now() }
    }
}

/// Reports to the offscreen document, transferring `data` if given.
fn report(report: &StageReport, data: Option<&JsValue>) {
    if let Err(e) = protocol::post(&worker_scope(), report, data) {
        web_sys::console::error_1(&e.to_string().into());
    }
}

/// A stage's output, and the buffer it hands on (the decoder hands its PNGs on one by one instead).
type StageResult = Result<(StageOutput, Option<JsValue>), StageWorkerError>;

/// Stage 1: `prompt_embeds` of the prompt the offscreen document tokenized.
async fn text_encoder(
    mut stage: Stage,
    prompt: &EncodedPrompt,
    keep: Option<&mut Option<Stage>>,
) -> StageResult {
    let embeddings = stages::encode_prompt(&mut stage, prompt).await?;
    let timing = stage.end(keep).await;
    Ok((StageOutput::TextEncoder(EncoderOutput { timing }), Some(f32_buffer(&embeddings))))
}

/// Stage 2: the denoising loop of each image of the batch on one session, one progress report per
/// step; the final latents of all images, one after the other.
async fn transformer(
    mut stage: Stage,
    params: &GenerateParams,
    input: impl Future<Output = Option<JsValue>>,
    keep: Option<&mut Option<Stage>>,
) -> StageResult {
    let embeddings = f32_from_buffer(input.await, "prompt embeddings")?;
    let steps = params.steps;
    let mut latents = Vec::new();
    let (mut noise, mut first_velocity) = (Vec::new(), Vec::new());
    let (mut image_run_ms, mut sigmas) = (Vec::new(), Vec::new());
    let (mut img_ids, mut txt_ids) = (String::new(), String::new());
    for image in 0..params.count {
        let denoise = DenoiseParams {
            width: params.width,
            height: params.height,
            steps,
            seed: params.seed_of(image),
            schedule: params.schedule,
        };
        let before = stage.timing.run_ms;
        let progress = |step: u32| report(&StageReport::Progress { image, step, steps }, None);
        let denoised = stages::denoise(&mut stage, embeddings.clone(), &denoise, progress).await?;
        image_run_ms.push(stage.timing.run_ms - before);
        if params.trace {
            noise.push(base64_f32(&denoised.noise));
            first_velocity.push(base64_f32(&denoised.first_velocity));
            img_ids = base64_i64(&denoised.img_ids);
            txt_ids = base64_i64(&denoised.txt_ids);
        }
        latents.extend_from_slice(&denoised.latents);
        sigmas = denoised.sigmas;
    }
    let timing = stage.end(keep).await;
    let output = TransformerOutput { sigmas, noise, first_velocity, img_ids, txt_ids, image_run_ms, timing };
    Ok((StageOutput::Transformer(output), Some(f32_buffer(&latents))))
}

/// Float32 values as little-endian bytes in base64 (the trace format).
pub fn base64_f32(values: &[f32]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Int64 values as little-endian bytes in base64 (the trace format).
pub fn base64_i64(values: &[i64]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Stage 3: each image's latents unpacked into the layout the decoder declares, decoded and encoded
/// as a PNG, which is handed on at once (`Image`).
async fn decoder(
    mut stage: Stage,
    params: &GenerateParams,
    input: impl Future<Output = Option<JsValue>>,
    keep: Option<&mut Option<Stage>>,
) -> StageResult {
    let latents = f32_from_buffer(input.await, "latents")?;
    let count = params.count.max(1) as usize;
    if latents.is_empty() || latents.len() % count != 0 {
        return Err(StageWorkerError::MissingInput("the latents of every image"));
    }
    for (index, latents) in (0..params.count).zip(latents.chunks_exact(latents.len() / count)) {
        let meta = params.image(index);
        let (before, runs_before) = (stage.timing.run_ms, stage.timing.runs_ms.len());
        let sample = stages::decode(&mut stage, latents, params.width, params.height).await?;
        // The result of the last image carries the profile of every decode.
        let profile = if index + 1 == params.count { stage.take_profile().await } else { None };
        let timing = StageTiming {
            run_ms: stage.timing.run_ms - before,
            runs_ms: stage.timing.runs_ms[runs_before..].to_vec(),
            finished_at_ms: js_sys::Date::now(),
            profile,
            ..stage.timing.clone()
        };
        let png = stages::encode_image(&sample, &meta)?;
        let buffer: JsValue = Uint8Array::from(png.as_slice()).buffer().into();
        report(&StageReport::Image { index, timing }, Some(&buffer));
    }
    let timing = stage.end(keep).await;
    Ok((StageOutput::Decoder { timing }, None))
}

impl Localize for StageWorkerError {
    fn message(&self) -> Message {
        // Not exhaustive on purpose, like `GpuError`'s.
        #[allow(unreachable_patterns)]
        match self {
            StageWorkerError::NoPack => Message::new("errStageNoPack", []),
            StageWorkerError::Opfs(e) => e.message(),
            StageWorkerError::Graph { graph, source } => detail(arg(graph), cause(source)),
            StageWorkerError::GraphEdit { graph, source } => detail(arg(graph), arg(source)),
            StageWorkerError::ExternalData { graph, file, source } => {
                Message::new("errStageExternalData", [arg(graph), arg(file), cause(source.as_ref())])
            }
            StageWorkerError::Gpu(e) => e.message(),
            StageWorkerError::Load { graph, source } => {
                Message::new("errStageLoad", [arg(graph), arg(source)])
            }
            StageWorkerError::Stage(e) => e.message(),
            other => Message::text(other),
        }
    }
}
