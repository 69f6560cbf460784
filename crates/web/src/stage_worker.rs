//! A dedicated worker of the offscreen document that runs one stage, then is terminated.
//!
//! Protocol (internal to the offscreen document):
//! * in: `{ task, params, data? }`: `task` is `textEncoder`, `transformer`, `decoder` or `installPack`,
//!   `params` a JSON object, `data` an `ArrayBuffer` or the hash worker's port (transferred); then, for
//!   `installPack` only, `{ op: "swap" }` once the new pack may replace the installed one.
//! * out: `{ kind: "progress", step, steps }`, `{ kind: "packProgress", ... }`, `{ kind: "swapReady" }`
//!   (every file verified, waiting for `swap`), `{ kind: "done", output, data? }` or
//!   `{ kind: "error", message }`.
//!
//! Each stage releases its session and destroys its GPU device before it reports `done`; the offscreen
//! document then terminates the worker, which also returns the wasm heap.

use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;
use imagine_core::image::PngMeta;
use imagine_core::pack::{self, Graph};
use imagine_core::prompt::PromptEncoder;
use imagine_core::schedule::Schedule;
use imagine_core::stages::{self, DenoiseParams};
use imagine_core::{DType, Dim, SessionError, Tensor, TensorData, TensorInfo};
use imagine_ort::{self as ort, ExternalData, Provider, Session};
use js_sys::{Array, Float32Array, Uint8Array};
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{spawn_local, JsFuture};
use web_sys::{DedicatedWorkerGlobalScope, MessageEvent};

use crate::download;
use crate::gpu::Device;
use crate::js::{error_text, from_js, get, get_string, now_ms, to_js, Obj};
use crate::opfs;

/// What every stage of a job needs to know.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    pub prompt: String,
    pub width: u32,
    pub height: u32,
    pub steps: u32,
    /// Decimal, so the full u64 survives JSON.
    pub seed: String,
    pub schedule: String,
    pub trace: bool,
    /// `webgpu` or `wasm`.
    pub backend: String,
}

impl JobSpec {
    fn seed(&self) -> Result<u64, String> {
        self.seed.parse().map_err(|_| format!("bad seed {}", self.seed))
    }
}

/// What the text encoder hands on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EncoderOutput {
    pub input_ids: Vec<i64>,
    pub attention_mask: Vec<i64>,
    pub token_count: u32,
    pub truncated: bool,
    pub timing: StageTiming,
}

/// What the transformer hands on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransformerOutput {
    pub sigmas: Vec<f32>,
    /// Initial noise, float32 LE base64, when tracing.
    pub noise: Option<String>,
    pub timing: StageTiming,
}

/// Time spent inside ORT during one stage.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageTiming {
    pub session_create_ms: f64,
    pub run_ms: f64,
}

/// Entry point of `stage-worker.js`.
#[wasm_bindgen(js_name = stageWorkerMain)]
pub fn stage_worker_main() {
    imagine_ort::configure(1);
    let scope = worker_scope();
    let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |event: MessageEvent| {
        let message = event.data();
        if get_string(&message, "op").as_deref() == Some("swap") {
            download::allow_swap();
            return;
        }
        spawn_local(async move {
            let task = get_string(&message, "task").unwrap_or_default();
            let params = get(&message, "params");
            let data = get(&message, "data");
            let outcome = match task.as_str() {
                "textEncoder" => text_encoder(&params).await,
                "transformer" => transformer(&params, &data).await,
                "decoder" => decoder(&params, &data).await,
                "installPack" => download::install(&params, &data).await,
                other => Err(format!("unknown stage task {other:?}")),
            };
            match outcome {
                Ok((output, data)) => post_done(output, data),
                Err(message) => post(&Obj::new().set("kind", "error").set("message", message).build(), None),
            }
        });
    });
    scope.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    // The worker lives exactly as long as this handler.
    on_message.forget();
}

fn worker_scope() -> DedicatedWorkerGlobalScope {
    js_sys::global().unchecked_into()
}

/// Posts a message to the offscreen document, transferring `buffer` if given.
pub fn post(message: &JsValue, buffer: Option<&JsValue>) {
    let result = match buffer {
        Some(buffer) => worker_scope().post_message_with_transfer(message, &Array::of1(buffer)),
        None => worker_scope().post_message(message),
    };
    if let Err(e) = result {
        web_sys::console::error_1(&e);
    }
}

fn post_done(output: JsValue, data: Option<JsValue>) {
    let mut message = Obj::new().set("kind", "done").set("output", output);
    if let Some(data) = &data {
        message = message.set("data", data.clone());
    }
    post(&message.build(), data.as_ref());
}

type StageResult = Result<(JsValue, Option<JsValue>), String>;

/// A session on the chosen backend, with the device it owns; the pipeline runs it through
/// [`imagine_core::Session`].
struct Stage {
    session: Session,
    device: Option<Device>,
    inputs: Vec<TensorInfo>,
    outputs: Vec<TensorInfo>,
    timing: StageTiming,
}

impl Stage {
    /// Loads `graph` from the installed pack. Its external data is passed to ORT as OPFS `File`s, which ORT
    /// reads itself, one initializer at a time (see `imagine_ort`).
    async fn open(graph: Graph, backend: &str) -> Result<Stage, String> {
        let (_, dir) = opfs::installed_pack()
            .await
            .ok_or_else(|| "no model pack is installed: install one first".to_string())?;
        let name = graph.file_name();
        let bytes = opfs::read(&dir, &name).await?;
        let mut external = Vec::new();
        for external_file in pack::external_data_locations(&bytes).map_err(|e| format!("{name}: {e}"))? {
            // Opened by the name the planner downloaded it under, handed to ORT under the graph's own.
            let pack::ExternalFile { location, file } = external_file;
            let data = opfs::file(&dir, &file).await.map_err(|e| format!("{name} needs {file}: {e}"))?;
            external.push(ExternalData { path: location, data: data.into() });
        }
        let (provider, device) = match backend {
            "wasm" => (Provider::Wasm, None),
            _ => {
                let needs_f16 = pack::declares_float16(&bytes).map_err(|e| format!("{name}: {e}"))?;
                let device = Device::open(needs_f16, &name).await?;
                (Provider::WebGpu(device.js().clone()), Some(device))
            }
        };
        let started = now_ms();
        let created = Session::create(&Uint8Array::from(bytes.as_slice()), &external, &provider).await;
        let session = match created {
            Ok(session) => session,
            Err(e) => {
                if let Some(device) = device {
                    device.destroy();
                }
                return Err(format!("loading {name} failed: {e}"));
            }
        };
        let timing = StageTiming { session_create_ms: now_ms() - started, run_ms: 0.0 };
        let inputs = session.inputs().iter().map(tensor_info).collect();
        let outputs = session.outputs().iter().map(tensor_info).collect();
        Ok(Stage { session, device, inputs, outputs, timing })
    }

    /// Releases the session and destroys the device; the worker is terminated next.
    async fn close(self) -> StageTiming {
        let _ = self.session.release().await;
        if let Some(device) = self.device {
            device.destroy();
        }
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

fn tensor_info(value: &ort::ValueInfo) -> TensorInfo {
    let dtype = match &value.dtype {
        ort::DType::Float32 => DType::Float32,
        ort::DType::Float16 => DType::Float16,
        ort::DType::Int64 => DType::Int64,
        ort::DType::Other(name) => DType::Other(name.clone()),
    };
    let shape = value
        .shape
        .iter()
        .map(|dim| match dim {
            ort::Dim::Fixed(n) => Dim::Fixed(*n),
            ort::Dim::Symbolic(name) => Dim::Symbolic(name.clone()),
        })
        .collect();
    TensorInfo { name: value.name.clone(), dtype, shape }
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
        ort::DType::Float32 => TensorData::Float32(tensor.to_f32().map_err(session_error)?),
        ort::DType::Float16 => {
            TensorData::Float16(tensor.f16_bits().map_err(session_error)?.reinterpret_into())
        }
        other => {
            return Err(SessionError(format!("an output is {}, which Imagine does not read", other.name())))
        }
    };
    Ok(Tensor { dims: tensor.dims(), data })
}

async fn fetch_bytes(path: &str) -> Result<Vec<u8>, String> {
    let response = JsFuture::from(worker_scope().fetch_with_str(path))
        .await
        .map_err(|e| format!("reading {path}: {}", error_text(&e)))?;
    let response: web_sys::Response = response.unchecked_into();
    if !response.ok() {
        return Err(format!("reading {path}: HTTP {}", response.status()));
    }
    let buffer = JsFuture::from(response.array_buffer().map_err(|e| error_text(&e))?)
        .await
        .map_err(|e| error_text(&e))?;
    Ok(Uint8Array::new(&buffer).to_vec())
}

fn f32_buffer(values: &[f32]) -> JsValue {
    Float32Array::from(values).buffer().into()
}

fn f32_from_buffer(data: &JsValue, what: &str) -> Result<Vec<f32>, String> {
    if !data.is_instance_of::<js_sys::ArrayBuffer>() {
        return Err(format!("internal: missing {what}"));
    }
    Ok(Float32Array::new(data).to_vec())
}

/// Stage 1: chat template, tokens, `prompt_embeds`.
async fn text_encoder(params: &JsValue) -> StageResult {
    let spec: JobSpec = from_js(params)?;
    let tokenizer = fetch_bytes("tokenizer/tokenizer.json").await?;
    let config = fetch_bytes("tokenizer/tokenizer_config.json").await?;
    let encoder =
        PromptEncoder::new(&tokenizer, &config).map_err(|e| format!("loading the tokenizer failed: {e}"))?;
    let encoded = encoder.encode(&spec.prompt).map_err(|e| format!("encoding the prompt failed: {e}"))?;

    let mut stage = Stage::open(Graph::TextEncoder, &spec.backend).await?;
    let embeddings = stages::encode_prompt(&mut stage, &encoded).await.map_err(|e| e.to_string())?;
    let timing = stage.close().await;
    let output = EncoderOutput {
        input_ids: encoded.input_ids,
        attention_mask: encoded.attention_mask,
        token_count: encoded.token_count as u32,
        truncated: encoded.truncated,
        timing,
    };
    Ok((to_js(&output), Some(f32_buffer(&embeddings))))
}

/// Stage 2: the denoising loop, one progress report per step.
async fn transformer(params: &JsValue, data: &JsValue) -> StageResult {
    let spec: JobSpec = from_js(params)?;
    let embeddings = f32_from_buffer(data, "prompt embeddings")?;
    let schedule =
        Schedule::from_name(&spec.schedule).ok_or_else(|| format!("unknown schedule {:?}", spec.schedule))?;
    let denoise = DenoiseParams {
        width: spec.width,
        height: spec.height,
        steps: spec.steps,
        seed: spec.seed()?,
        schedule,
    };

    let mut stage = Stage::open(Graph::Transformer, &spec.backend).await?;
    let report = |step: u32| {
        post(&Obj::new().set("kind", "progress").set("step", step).set("steps", spec.steps).build(), None)
    };
    let denoised =
        stages::denoise(&mut stage, embeddings, &denoise, report).await.map_err(|e| e.to_string())?;
    let timing = stage.close().await;
    let noise = spec.trace.then(|| base64_f32(&denoised.noise));
    let output = TransformerOutput { sigmas: denoised.sigmas, noise, timing };
    Ok((to_js(&output), Some(f32_buffer(&denoised.latents))))
}

/// Float32 values as little-endian bytes in base64 (the trace format).
pub fn base64_f32(values: &[f32]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Stage 3: unpack the latents into the layout the decoder declares, decode, and encode the PNG.
async fn decoder(params: &JsValue, data: &JsValue) -> StageResult {
    let spec: JobSpec = from_js(params)?;
    let latents = f32_from_buffer(data, "latents")?;
    let meta = PngMeta {
        prompt: spec.prompt.clone(),
        seed: spec.seed()?,
        width: spec.width,
        height: spec.height,
        steps: spec.steps,
        schedule: spec.schedule.clone(),
    };

    let mut stage = Stage::open(Graph::Decoder, &spec.backend).await?;
    let sample =
        stages::decode(&mut stage, &latents, spec.width, spec.height).await.map_err(|e| e.to_string())?;
    let timing = stage.close().await;
    let png = stages::encode_image(&sample, &meta).map_err(|e| e.to_string())?;
    let buffer: JsValue = Uint8Array::from(png.as_slice()).buffer().into();
    Ok((to_js(&timing), Some(buffer)))
}
