//! A dedicated worker of the offscreen document that runs one stage, then is terminated.
//!
//! Messages: [`StageTask`] in (with the previous stage's output buffer), [`StageReport`] out (with this
//! stage's output buffer), see `crate::protocol`.
//!
//! Each stage releases its session before it reports `done`; the offscreen document then terminates
//! the worker, which frees the GPU device ORT opened in it and the wasm heap.

use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;
use imagine_core::image::PngMeta;
use imagine_core::pack::{self, Graph, PackError};
use imagine_core::prompt::{PromptEncoder, PromptError};
use imagine_core::stages::{self, DenoiseParams, StageError};
use imagine_core::{Backend, DType, GenerateParams, SessionError, Tensor, TensorData, TensorInfo};
use imagine_ort::{self as ort, ExternalData, OrtError, Provider, Session};
use js_sys::{Float32Array, Uint8Array};
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{spawn_local, JsFuture};
use web_sys::{DedicatedWorkerGlobalScope, MessageEvent};

use crate::gpu::{self, GpuError};
use crate::js::{now_ms, JsError};
use crate::opfs::{self, OpfsError};
use crate::protocol::{
    self, EncoderOutput, ProtocolError, StageOutput, StageReport, StageTask, StageTiming, TransformerOutput,
};

/// Why a stage could not run.
#[derive(Debug, Error)]
pub enum StageWorkerError {
    #[error("not a stage task: {0}")]
    NotATask(ProtocolError),
    #[error("no model pack is installed: install one first")]
    NoPack,
    #[error(transparent)]
    Opfs(#[from] OpfsError),
    /// A graph of the installed pack that breaks the pack contract.
    #[error("{graph}: {source}")]
    Graph { graph: String, source: PackError },
    /// A file a graph's external data is in.
    #[error("{graph} needs {file}: {source}")]
    ExternalData { graph: String, file: String, source: Box<OpfsError> },
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("loading {graph} failed: {source}")]
    Load { graph: String, source: OrtError },
    /// A file shipped with the extension (the tokenizer) could not be read.
    #[error("reading {path}: {source}")]
    Asset { path: &'static str, source: JsError },
    #[error("reading {path}: HTTP {status}")]
    AssetStatus { path: &'static str, status: u16 },
    #[error("loading the tokenizer failed: {0}")]
    Tokenizer(PromptError),
    #[error("encoding the prompt failed: {0}")]
    Prompt(PromptError),
    /// The pipeline itself (a graph that does not fit the contract, a failed run).
    #[error(transparent)]
    Stage(#[from] StageError),
    /// The previous stage's output did not come with the task.
    #[error("internal: missing {0}")]
    MissingInput(&'static str),
}

/// Entry point of `stage-worker.js`.
#[wasm_bindgen(js_name = stageWorkerMain)]
pub fn stage_worker_main() {
    imagine_ort::configure(1);
    let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |event: MessageEvent| {
        let message = event.data();
        spawn_local(async move {
            let outcome = match protocol::read::<StageTask>(&message) {
                Ok((StageTask::TextEncoder { params }, _)) => text_encoder(&params).await,
                Ok((StageTask::Transformer { params }, data)) => transformer(&params, data).await,
                Ok((StageTask::Decoder { params }, data)) => decoder(&params, data).await,
                Err(e) => Err(StageWorkerError::NotATask(e)),
            };
            match outcome {
                Ok((output, data)) => report(&StageReport::Done { output }, Some(&data)),
                Err(error) => report(&StageReport::Error { message: error.to_string() }, None),
            }
        });
    });
    worker_scope().set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    // The worker lives exactly as long as this handler.
    on_message.forget();
}

fn worker_scope() -> DedicatedWorkerGlobalScope {
    js_sys::global().unchecked_into()
}

/// Reports to the offscreen document, transferring `data` if given.
fn report(report: &StageReport, data: Option<&JsValue>) {
    if let Err(e) = protocol::post(&worker_scope(), report, data) {
        web_sys::console::error_1(&e.to_string().into());
    }
}

/// A stage's output, and the buffer it hands on.
type StageResult = Result<(StageOutput, JsValue), StageWorkerError>;

/// A session on the chosen backend; the pipeline runs it through
/// [`imagine_core::Session`].
struct Stage {
    session: Session,
    inputs: Vec<TensorInfo>,
    outputs: Vec<TensorInfo>,
    timing: StageTiming,
}

impl Stage {
    /// Loads `graph` from the installed pack. Its external data is passed to ORT as OPFS `File`s, which ORT
    /// reads itself (the asyncify build reads each whole into memory first; see `imagine_ort`).
    async fn open(graph: Graph, backend: Backend) -> Result<Stage, StageWorkerError> {
        let (_, dir) = opfs::installed_pack().await.ok_or(StageWorkerError::NoPack)?;
        let name = graph.file_name();
        let bytes = opfs::read(&dir, &name).await?;
        let broken = |source| StageWorkerError::Graph { graph: name.clone(), source };
        let mut external = Vec::new();
        for external_file in pack::external_data_locations(&bytes).map_err(broken)? {
            // Opened by the name the planner downloaded it under, handed to ORT under the graph's own.
            let pack::ExternalFile { location, file } = external_file;
            let data = match opfs::file(&dir, &file).await {
                Ok(data) => data,
                Err(e) => {
                    return Err(StageWorkerError::ExternalData { graph: name, file, source: Box::new(e) })
                }
            };
            external.push(ExternalData { path: location, data: data.into() });
        }
        let provider = match backend {
            Backend::Wasm => Provider::Wasm,
            Backend::WebGpu => {
                let needs_f16 = pack::declares_float16(&bytes).map_err(broken)?;
                gpu::check_stage(needs_f16, &name).await?;
                Provider::WebGpu
            }
        };
        let started = now_ms();
        let created = Session::create(&Uint8Array::from(bytes.as_slice()), &external, &provider).await;
        let session = created.map_err(|source| StageWorkerError::Load { graph: name, source })?;
        let timing = StageTiming { session_create_ms: now_ms() - started, run_ms: 0.0 };
        let inputs = session.inputs();
        let outputs = session.outputs();
        Ok(Stage { session, inputs, outputs, timing })
    }

    /// Releases the session; the worker is terminated next, which frees ORT's device.
    async fn close(self) -> StageTiming {
        let _ = self.session.release().await;
        self.timing
    }
}

impl imagine_core::Session for Stage {
    fn inputs(&self) -> &[TensorInfo] {
        &self.inputs
    }

    fn outputs(&self) -> &[TensorInfo] {
        &self.outputs
    }

    async fn run(
        &mut self,
        feeds: &[(&str, &Tensor)],
        fetches: &[&str],
    ) -> Result<Vec<Tensor>, SessionError> {
        let tensors = feeds.iter().map(|(_, tensor)| to_ort(tensor)).collect::<Result<Vec<_>, _>>()?;
        let named: Vec<(&str, &ort::Tensor)> =
            feeds.iter().zip(&tensors).map(|((name, _), t)| (*name, t)).collect();
        let started = now_ms();
        let outputs = self.session.run(&named, fetches).await;
        self.timing.run_ms += now_ms() - started;
        // Free the inputs' copies now rather than at garbage collection: one per step adds up.
        tensors.into_iter().for_each(ort::Tensor::dispose);
        outputs.map_err(session_error)?.iter().map(from_ort).collect()
    }
}

fn session_error(e: ort::OrtError) -> SessionError {
    SessionError(e.to_string())
}

fn to_ort(tensor: &Tensor) -> Result<ort::Tensor, SessionError> {
    match &tensor.data {
        TensorData::Float32(values) => ort::Tensor::from_f32(values, &tensor.dims),
        TensorData::Float16(values) => ort::Tensor::from_f16_bits(values.reinterpret_cast(), &tensor.dims),
        TensorData::Int64(values) => ort::Tensor::from_i64(values, &tensor.dims),
    }
    .map_err(session_error)
}

fn from_ort(tensor: &ort::Tensor) -> Result<Tensor, SessionError> {
    let data = match tensor.dtype() {
        DType::Float32 => TensorData::Float32(tensor.to_f32().map_err(session_error)?),
        DType::Float16 => TensorData::Float16(tensor.f16_bits().map_err(session_error)?.reinterpret_into()),
        other => {
            return Err(SessionError(format!("an output is {}, which Imagine does not read", other.name())))
        }
    };
    Ok(Tensor { dims: tensor.dims(), data })
}

async fn fetch_bytes(path: &'static str) -> Result<Vec<u8>, StageWorkerError> {
    let failed = |e: JsValue| StageWorkerError::Asset { path, source: e.into() };
    let response = JsFuture::from(worker_scope().fetch_with_str(path)).await.map_err(failed)?;
    let response: web_sys::Response = response.unchecked_into();
    if !response.ok() {
        return Err(StageWorkerError::AssetStatus { path, status: response.status() });
    }
    let buffer = JsFuture::from(response.array_buffer().map_err(failed)?).await.map_err(failed)?;
    Ok(Uint8Array::new(&buffer).to_vec())
}

fn f32_buffer(values: &[f32]) -> JsValue {
    Float32Array::from(values).buffer().into()
}

fn f32_from_buffer(data: Option<JsValue>, what: &'static str) -> Result<Vec<f32>, StageWorkerError> {
    match data {
        Some(buffer) if buffer.is_instance_of::<js_sys::ArrayBuffer>() => {
            Ok(Float32Array::new(&buffer).to_vec())
        }
        _ => Err(StageWorkerError::MissingInput(what)),
    }
}

/// Stage 1: chat template, tokens, `prompt_embeds`.
async fn text_encoder(params: &GenerateParams) -> StageResult {
    let tokenizer = fetch_bytes("tokenizer/tokenizer.json").await?;
    let config = fetch_bytes("tokenizer/tokenizer_config.json").await?;
    let encoder = PromptEncoder::new(&tokenizer, &config).map_err(StageWorkerError::Tokenizer)?;
    let encoded = encoder.encode(&params.prompt).map_err(StageWorkerError::Prompt)?;

    let mut stage = Stage::open(Graph::TextEncoder, params.backend).await?;
    let embeddings = stages::encode_prompt(&mut stage, &encoded).await?;
    let timing = stage.close().await;
    let output = EncoderOutput {
        input_ids: encoded.input_ids,
        attention_mask: encoded.attention_mask,
        token_count: encoded.token_count as u32,
        truncated: encoded.truncated,
        timing,
    };
    Ok((StageOutput::TextEncoder(output), f32_buffer(&embeddings)))
}

/// Stage 2: the denoising loop, one progress report per step.
async fn transformer(params: &GenerateParams, data: Option<JsValue>) -> StageResult {
    let embeddings = f32_from_buffer(data, "prompt embeddings")?;
    let denoise = DenoiseParams {
        width: params.width,
        height: params.height,
        steps: params.steps,
        seed: params.seed,
        schedule: params.schedule,
    };

    let mut stage = Stage::open(Graph::Transformer, params.backend).await?;
    let steps = params.steps;
    let progress = |step: u32| report(&StageReport::Progress { step, steps }, None);
    let denoised = stages::denoise(&mut stage, embeddings, &denoise, progress).await?;
    let timing = stage.close().await;
    let noise = params.trace.then(|| base64_f32(&denoised.noise));
    let output = TransformerOutput { sigmas: denoised.sigmas, noise, timing };
    Ok((StageOutput::Transformer(output), f32_buffer(&denoised.latents)))
}

/// Float32 values as little-endian bytes in base64 (the trace format).
pub fn base64_f32(values: &[f32]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Stage 3: unpack the latents into the layout the decoder declares, decode, and encode the PNG.
async fn decoder(params: &GenerateParams, data: Option<JsValue>) -> StageResult {
    let latents = f32_from_buffer(data, "latents")?;
    let meta = PngMeta {
        prompt: params.prompt.clone(),
        seed: params.seed,
        width: params.width,
        height: params.height,
        steps: params.steps,
        schedule: params.schedule.name().to_owned(),
    };

    let mut stage = Stage::open(Graph::Decoder, params.backend).await?;
    let sample = stages::decode(&mut stage, &latents, params.width, params.height).await?;
    let timing = stage.close().await;
    let png = stages::encode_image(&sample, &meta)?;
    let buffer: JsValue = Uint8Array::from(png.as_slice()).buffer().into();
    Ok((StageOutput::Decoder { timing }, buffer))
}
