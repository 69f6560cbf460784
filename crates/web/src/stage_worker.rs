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

use imagine_core::image::{encode_png, to_rgba8, PngMeta};
use imagine_core::latents::{euler_step, image_ids, initial_noise, text_ids, unpack_tokens, unpatchify};
use imagine_core::pack::{self, Graph};
use imagine_core::prompt::PromptEncoder;
use imagine_core::schedule::Schedule;
use imagine_ort::{DType, Dim, ExternalData, Provider, Session, Tensor, ValueInfo};
use js_sys::{Array, Float32Array, Uint8Array};
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{spawn_local, JsFuture};
use web_sys::{DedicatedWorkerGlobalScope, MessageEvent};

use crate::download;
use crate::gpu::Device;
use crate::js::{error_text, from_js, get, get_string, now_ms, to_js, Obj};
use crate::opfs;

/// Width of one text token's embedding (three Qwen3 layers of 2560, concatenated).
const EMBED_WIDTH: i64 = 7680;
/// Channels of one packed latent token.
const LATENT_CHANNELS: usize = 128;

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

    fn tokens_high(&self) -> usize {
        (self.height / 16) as usize
    }

    fn tokens_wide(&self) -> usize {
        (self.width / 16) as usize
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

/// A session on the chosen backend, with the device it owns.
struct Stage {
    session: Session,
    device: Option<Device>,
    graph: Graph,
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
        Ok(Stage { session, device, graph, timing })
    }

    /// The declared input `name`, or a clear error naming the graph.
    fn input(&self, name: &str) -> Result<ValueInfo, String> {
        find(&self.session.inputs(), name).ok_or_else(|| self.contract_error("input", name))
    }

    fn output(&self, name: &str) -> Result<ValueInfo, String> {
        find(&self.session.outputs(), name).ok_or_else(|| self.contract_error("output", name))
    }

    fn contract_error(&self, kind: &str, name: &str) -> String {
        let names: Vec<String> =
            self.session.inputs().into_iter().chain(self.session.outputs()).map(|v| v.name).collect();
        format!("{} has no {kind} named `{name}` (it declares: {})", self.graph.file_name(), names.join(", "))
    }

    async fn run(&mut self, feeds: &[(&str, &Tensor)], wanted: &[&str]) -> Result<Vec<Tensor>, String> {
        let started = now_ms();
        let outputs = self
            .session
            .run(feeds, wanted)
            .await
            .map_err(|e| format!("running {} failed: {e}", self.graph.file_name()))?;
        self.timing.run_ms += now_ms() - started;
        Ok(outputs)
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

fn find(values: &[ValueInfo], name: &str) -> Option<ValueInfo> {
    values.iter().find(|v| v.name == name).cloned()
}

/// The float type of a declared value: float32 or float16, anything else is a contract error.
fn float_type(graph: Graph, value: &ValueInfo) -> Result<DType, String> {
    match value.dtype {
        DType::Float32 | DType::Float16 => Ok(value.dtype.clone()),
        ref other => Err(format!(
            "{}: `{}` is {}, expected float32 or float16",
            graph.file_name(),
            value.name,
            other.name()
        )),
    }
}

fn require_int64(graph: Graph, value: &ValueInfo) -> Result<(), String> {
    if value.dtype == DType::Int64 {
        Ok(())
    } else {
        Err(format!("{}: `{}` is {}, expected int64", graph.file_name(), value.name, value.dtype.name()))
    }
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
    let graph = stage.graph;
    for name in ["input_ids", "attention_mask"] {
        require_int64(graph, &stage.input(name)?)?;
    }
    let output = stage.output("prompt_embeds")?;
    float_type(graph, &output)?;
    let length = encoded.input_ids.len() as i64;
    let ids = Tensor::from_i64(&encoded.input_ids, &[1, length]).map_err(|e| e.to_string())?;
    let mask = Tensor::from_i64(&encoded.attention_mask, &[1, length]).map_err(|e| e.to_string())?;
    let outputs = stage.run(&[("input_ids", &ids), ("attention_mask", &mask)], &["prompt_embeds"]).await?;
    let embeds = &outputs[0];
    let dims = embeds.dims();
    if dims != [1, length, EMBED_WIDTH] {
        return Err(format!(
            "{}: prompt_embeds has shape {dims:?}, expected [1, {length}, {EMBED_WIDTH}]",
            graph.file_name()
        ));
    }
    let values = embeds.to_f32().map_err(|e| e.to_string())?;
    let timing = stage.close().await;
    let output = EncoderOutput {
        input_ids: encoded.input_ids,
        attention_mask: encoded.attention_mask,
        token_count: encoded.token_count as u32,
        truncated: encoded.truncated,
        timing,
    };
    Ok((to_js(&output), Some(f32_buffer(&values))))
}

/// Stage 2: the denoising loop, one progress report per step.
async fn transformer(params: &JsValue, data: &JsValue) -> StageResult {
    let spec: JobSpec = from_js(params)?;
    let embeddings = f32_from_buffer(data, "prompt embeddings")?;
    let (h, w) = (spec.tokens_high(), spec.tokens_wide());
    let tokens = h * w;
    let schedule =
        Schedule::from_name(&spec.schedule).ok_or_else(|| format!("unknown schedule {:?}", spec.schedule))?;
    let sigmas = schedule.sigmas(tokens as u32, spec.steps);
    let noise = initial_noise(spec.seed()?, spec.width, spec.height);
    let text_tokens = (embeddings.len() as i64) / EMBED_WIDTH;

    let mut stage = Stage::open(Graph::Transformer, &spec.backend).await?;
    let graph = stage.graph;
    let float = float_type(graph, &stage.input("hidden_states")?)?;
    let text_float = float_type(graph, &stage.input("encoder_hidden_states")?)?;
    let time_float = float_type(graph, &stage.input("timestep")?)?;
    require_int64(graph, &stage.input("img_ids")?)?;
    require_int64(graph, &stage.input("txt_ids")?)?;
    stage.output("noise_pred")?;

    let tensor = |dtype: &DType, values: &[f32], dims: &[i64]| {
        Tensor::from_f32_in(dtype, values, dims).map_err(|e| e.to_string())
    };
    let context = tensor(&text_float, &embeddings, &[1, text_tokens, EMBED_WIDTH])?;
    drop(embeddings);
    let img_ids = Tensor::from_i64(&image_ids(spec.height, spec.width), &[1, tokens as i64, 4])
        .map_err(|e| e.to_string())?;
    let txt_ids = Tensor::from_i64(&text_ids(), &[1, text_tokens, 4]).map_err(|e| e.to_string())?;

    let mut latents = noise.clone();
    for step in 0..spec.steps as usize {
        let x = tensor(&float, &latents, &[1, tokens as i64, LATENT_CHANNELS as i64])?;
        let t = tensor(&time_float, &[sigmas[step]], &[1])?;
        let outputs = stage
            .run(
                &[
                    ("hidden_states", &x),
                    ("encoder_hidden_states", &context),
                    ("timestep", &t),
                    ("img_ids", &img_ids),
                    ("txt_ids", &txt_ids),
                ],
                &["noise_pred"],
            )
            .await?;
        let velocity = outputs[0].to_f32().map_err(|e| e.to_string())?;
        if velocity.len() != latents.len() {
            return Err(format!(
                "{}: noise_pred has shape {:?}, expected [1, {tokens}, {LATENT_CHANNELS}]",
                graph.file_name(),
                outputs[0].dims()
            ));
        }
        euler_step(&mut latents, &velocity, sigmas[step], sigmas[step + 1]).map_err(|e| e.to_string())?;
        x.dispose();
        post(
            &Obj::new().set("kind", "progress").set("step", step as u32 + 1).set("steps", spec.steps).build(),
            None,
        );
    }
    let timing = stage.close().await;
    let noise = spec.trace.then(|| base64_f32(&noise));
    let output = TransformerOutput { sigmas, noise, timing };
    Ok((to_js(&output), Some(f32_buffer(&latents))))
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
    let (h, w) = (spec.tokens_high(), spec.tokens_wide());

    let mut stage = Stage::open(Graph::Decoder, &spec.backend).await?;
    let graph = stage.graph;
    let inputs = stage.session.inputs();
    let [input] = inputs.as_slice() else {
        return Err(format!(
            "{} declares {} inputs, expected one latent input",
            graph.file_name(),
            inputs.len()
        ));
    };
    let float = float_type(graph, input)?;
    let outputs = stage.session.outputs();
    let [output] = outputs.as_slice() else {
        return Err(format!(
            "{} declares {} outputs, expected one image output",
            graph.file_name(),
            outputs.len()
        ));
    };
    let (values, dims) = match input.shape.as_slice() {
        [_, Dim::Fixed(128), _, _] => {
            (unpack_tokens(&latents, h, w).map_err(|e| e.to_string())?, [1, 128, h as i64, w as i64])
        }
        [_, Dim::Fixed(32), _, _] => {
            let packed = unpack_tokens(&latents, h, w).map_err(|e| e.to_string())?;
            (unpatchify(&packed, h, w).map_err(|e| e.to_string())?, [1, 32, 2 * h as i64, 2 * w as i64])
        }
        shape => {
            return Err(format!(
                "{}: input `{}` has shape {shape:?}; the decoder must take [batch, 128, height, width] \
                 (packed latents) or [batch, 32, height, width] (unpatchified latents)",
                graph.file_name(),
                input.name
            ))
        }
    };
    let latent = Tensor::from_f32_in(&float, &values, &dims).map_err(|e| e.to_string())?;
    let results = stage.run(&[(input.name.as_str(), &latent)], &[output.name.as_str()]).await?;
    let sample_dims = results[0].dims();
    let expected = [1, 3, spec.height as i64, spec.width as i64];
    if sample_dims != expected {
        return Err(format!(
            "{}: `{}` has shape {sample_dims:?}, expected {expected:?}",
            graph.file_name(),
            output.name
        ));
    }
    let sample = results[0].to_f32().map_err(|e| e.to_string())?;
    let timing = stage.close().await;
    let rgba = to_rgba8(&sample, spec.width, spec.height).map_err(|e| e.to_string())?;
    let meta = PngMeta {
        prompt: spec.prompt.clone(),
        seed: spec.seed()?,
        width: spec.width,
        height: spec.height,
        steps: spec.steps,
        schedule: spec.schedule.clone(),
    };
    let png = encode_png(&rgba, spec.width, spec.height, &meta)
        .map_err(|e| format!("encoding the PNG failed: {e}"))?;
    let buffer: JsValue = Uint8Array::from(png.as_slice()).buffer().into();
    Ok((to_js(&timing), Some(buffer)))
}
