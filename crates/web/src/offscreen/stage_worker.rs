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

use crate::platform::error_messages::detail;
use futures_channel::mpsc;
use futures_util::StreamExt;
use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;
use imagine_core::attention;
use imagine_core::f32_rewrite::{EmbeddingLookup, Range};
use imagine_core::image::PngMeta;
use imagine_core::matmul_blocks::{self, Block32Form, Block32Record};
use imagine_core::message::{arg, cause, ErrorText, Localize, Message};
use imagine_core::pack::{self, Graph, PackError};
use imagine_core::stages::{self, DenoiseParams, StageError};
use imagine_core::table_lookup::{self, TableLookup};
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

use crate::platform::gpu::{self, GpuError};
use crate::platform::js::{get, now_ms, time_origin_ms, JsError, LogError};
use crate::platform::opfs::{self, OpfsError};
use crate::platform::protocol::{
    self, EncoderOutput, ProtocolError, StageOutput, StageReport, StageTask, StageTiming, TransformerOutput,
};

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
        source: imagine_core::f32_rewrite::RewriteError,
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

/// A session on the chosen backend; the pipeline runs it through
/// [`imagine_core::Session`].
struct Stage {
    graph: Graph,
    backend: Backend,
    /// The `MatMulNBits` accuracy level set on the graph, if any.
    accuracy_level: Option<u8>,
    /// ORT keeps every released GPU buffer for the next run (`GenerateParams::keeps_buffers`).
    keep_buffers: bool,
    /// Its attention was fused into `MultiHeadAttention` where it could be (`GenerateParams::fuses_attention`).
    fuse_attention: bool,
    /// Its attention is computed in this many chunks of queries (`GenerateParams::attention_chunks`).
    attention_chunks: u32,
    /// It runs as a chain of pieces of at most this many bytes (`GenerateParams::decoder_piece_bytes`).
    piece_bytes: Option<u64>,
    session: Loaded,
    inputs: Vec<TensorInfo>,
    outputs: Vec<TensorInfo>,
    timing: StageTiming,
    /// Tables of the float32 conversion looked up here and fed as float32 inputs.
    lookups: Vec<(EmbeddingLookup, web_sys::File)>,
    /// Tables taken out of the graph (`imagine_core::table_lookup`), fed as they are stored.
    tables: Vec<(TableLookup, web_sys::File)>,
    /// ORT profiles the session (until [`Stage::take_profile`]).
    profiling: bool,
}

impl Stage {
    /// Loads `graph` from the installed pack. Its external data is passed to ORT as OPFS file handles, which
    /// ORT reads itself, one initializer at a time (see `imagine_ort`); its embedding tables stay in their
    /// files and only the prompt's rows are read (see `imagine_core::table_lookup`).
    async fn open(
        graph: Graph,
        params: &GenerateParams,
        checked: &[String],
        arrived: Arrival,
    ) -> Result<Stage, StageWorkerError> {
        let (backend, profile) = (params.backend, params.profile);
        let (record, dir) = opfs::installed_pack().await.ok_or(StageWorkerError::NoPack)?;
        let adapter = match backend {
            Backend::WebGpu => Some(gpu::adapter_info().await?),
            Backend::Wasm => None,
        };
        let (name, bytes, lookups) = choose_graph(&record, &dir, graph, adapter).await?;
        // The wasm backend's kernels need no re-blocking.
        let block32 = match backend {
            Backend::WebGpu => Block32Record::form(record.block32.as_ref(), &name),
            Backend::Wasm => Block32Form::Unchanged,
        };
        // A stored form is loaded only as it was stored: its lengths checked at every load, its checksums
        // at its first load in this document's life. A damaged one is left alone (the job stores it again
        // after it) and the graph re-blocked while it loads, as if the form had never been stored.
        let (mut checked_form, mut stored_form_check_ms) = (None, 0.0);
        let (block32, stored_onnx) = match block32 {
            Block32Form::Stored(stored) => {
                let key = format!("{}:{}", record.commit, stored.onnx);
                let full = !checked.contains(&key);
                let started = now_ms();
                let read = stored_form(&dir, stored, full).await;
                stored_form_check_ms = now_ms() - started;
                match read {
                    Ok(onnx) => {
                        checked_form = full.then_some(key);
                        (block32, Some(onnx))
                    }
                    Err(why) => {
                        web_sys::console::warn_1(
                            &format!(
                                "imagine: the stored form of {} is not loaded ({why}): re-blocked while loading, and \
                                 stored again after the job",
                                stored.graph
                            )
                            .into(),
                        );
                        (Block32Form::AtLoad, None)
                    }
                }
            }
            other => (other, None),
        };
        let (name, bytes) = match (&block32, stored_onnx) {
            (Block32Form::Stored(stored), Some(onnx)) => (stored.onnx.clone(), onnx),
            _ => (name, bytes),
        };
        let (bytes, taken_out) = table_lookup::take_out(&bytes)
            .map_err(|source| StageWorkerError::GraphEdit { graph: name.clone(), source })?;
        let mut tables = Vec::new();
        for table in taken_out {
            let file = open_external(&dir, &name, &table.source.file).await?;
            tables.push((table, file));
        }
        let broken = |source| StageWorkerError::Graph { graph: name.clone(), source };
        let mut external = Vec::new();
        let mut files = HashMap::new();
        for external_file in pack::external_data_locations(&bytes).map_err(broken)? {
            // Opened by the name the planner downloaded it under, handed to ORT under the graph's own.
            let pack::ExternalFile { location, file } = external_file;
            let handle = opfs::file_handle(&dir, &file, false).await;
            let data = handle.map_err(|e| external_data_error(&name, &file, e))?;
            external.push(ExternalData { path: location.clone(), data: data.into() });
            files.insert(location, file);
        }
        let (mut reblocked_at_load, mut fused_attention, mut chunked_attention) = (false, 0, 0);
        let mut channels_first_used = false;
        let (bytes, provider) = match backend {
            Backend::Wasm => (bytes, Provider::Wasm),
            // ORT's tiled WebGPU kernel takes block 32 only (see `imagine_core::matmul_blocks`).
            Backend::WebGpu => {
                let (mut bytes, computed) = match block32 {
                    Block32Form::AtLoad => reblock(&name, &bytes, &dir, &files).await?,
                    Block32Form::Stored(_) | Block32Form::Unchanged => (bytes, None),
                };
                reblocked_at_load = computed.is_some();
                external.extend(computed);
                let edit_failed = |source| StageWorkerError::GraphEdit { graph: name.clone(), source };
                if let Some(level) = params.accuracy_level {
                    bytes = matmul_blocks::with_accuracy_level(&bytes, level).map_err(edit_failed)?.0;
                }
                if params.fuses_attention(graph) {
                    (bytes, fused_attention) = attention::fuse_attention(&bytes).map_err(edit_failed)?;
                }
                let chunks = params.attention_chunks(graph);
                if chunks > 1 {
                    (bytes, chunked_attention) =
                        attention::chunk_attention(&bytes, chunks).map_err(edit_failed)?;
                }
                let channels_first = adapter.is_some_and(|a| a.cpu_backed);
                channels_first_used = channels_first;
                let keep_buffers = params.keeps_buffers(graph);
                (bytes, Provider::WebGpu { channels_first, keep_buffers, gpu_outputs: false })
            }
        };
        // Lets a test make this stage's session fail to be created once, as a GPU out of memory would.
        if opfs::failpoint_reached(&format!("stage:create-fails:{graph:?}")).await {
            return Err(StageWorkerError::Injected(format!("{graph:?} session creation")));
        }
        // ... or run out of GPU memory, in the words WebGPU uses.
        if opfs::failpoint_reached(&format!("stage:out-of-memory:{graph:?}")).await {
            return Err(StageWorkerError::Injected(format!(
                "{graph:?} session (GPUOutOfMemoryError: Out of memory)"
            )));
        }
        let started_at_ms = js_sys::Date::now();
        let started = now_ms();
        let pieces = match params.decoder_piece_bytes(graph) {
            Some(max) => pieces(&name, &bytes, params, max),
            None => Vec::new(),
        };
        let loaded = if pieces.len() > 1 {
            ort::Chain::create(pieces, &external, channels_first_used).await.map(Loaded::Chain)
        } else {
            Session::create(&Uint8Array::from(bytes.as_slice()), &external, &provider, profile)
                .await
                .map(Loaded::Whole)
        };
        let session = loaded.map_err(|source| StageWorkerError::Load { graph: name.clone(), source })?;
        let timing = StageTiming {
            graph_file: name,
            reblocked_at_load,
            checked_form,
            stored_form_check_ms,
            fused_attention: fused_attention as u32,
            chunked_attention: chunked_attention as u32,
            pieces: session.pieces(),
            worker_created_at_ms: arrived.worker_created_at_ms,
            task_at_ms: arrived.task_at_ms,
            started_at_ms,
            session_create_ms: now_ms() - started,
            ..StageTiming::default()
        };
        report(&StageReport::SessionCreated { timing: timing.clone() }, None);
        // Lets a test hold a stage for ever, as a kernel that never returns would.
        opfs::failpoint(&format!("stage:session-created:{graph:?}")).await;
        let inputs = session.inputs();
        let outputs = session.outputs();
        Ok(Stage {
            graph,
            backend,
            accuracy_level: params.accuracy_level,
            keep_buffers: params.keeps_buffers(graph),
            fuse_attention: params.fuses_attention(graph),
            attention_chunks: params.attention_chunks(graph),
            piece_bytes: params.decoder_piece_bytes(graph),
            session,
            inputs,
            outputs,
            timing,
            lookups,
            tables,
            profiling: profile,
        })
    }

    /// The session `kept` from this worker's last task, when it is of `graph` as `params` ask for it
    /// (backend, accuracy level, buffer cache, attention) and they ask for no profile; else a new one
    /// ([`Stage::open`]).
    async fn take(
        kept: &mut Option<Stage>,
        graph: Graph,
        params: &GenerateParams,
        checked: &[String],
        arrived: Arrival,
    ) -> Result<Stage, StageWorkerError> {
        let same = |stage: &Stage| {
            stage.graph == graph
                && stage.backend == params.backend
                && stage.accuracy_level == params.accuracy_level
                && stage.keep_buffers == params.keeps_buffers(graph)
                && stage.fuse_attention == params.fuses_attention(graph)
                && stage.attention_chunks == params.attention_chunks(graph)
                && stage.piece_bytes == params.decoder_piece_bytes(graph)
        };
        match kept.take() {
            Some(mut stage) if same(&stage) && !params.profile => {
                stage.timing = StageTiming {
                    graph_file: std::mem::take(&mut stage.timing.graph_file),
                    fused_attention: stage.timing.fused_attention,
                    chunked_attention: stage.timing.chunked_attention,
                    pieces: stage.timing.pieces,
                    worker_created_at_ms: arrived.worker_created_at_ms,
                    task_at_ms: arrived.task_at_ms,
                    started_at_ms: js_sys::Date::now(),
                    resident: true,
                    ..StageTiming::default()
                };
                Ok(stage)
            }
            other => {
                if let Some(stage) = other {
                    stage.close().await;
                }
                Stage::open(graph, params, checked, arrived).await
            }
        }
    }

    /// Ends ORT's profile of the session, once: its summary (`None` when not profiling, or when ORT
    /// wrote nothing it could read, which is logged).
    async fn take_profile(&mut self) -> Option<imagine_core::ort_profile::StageProfile> {
        if !std::mem::take(&mut self.profiling) {
            return None;
        }
        let summary = match self.session.end_profiling().await {
            Ok(trace) => imagine_core::ort_profile::summarize(&trace).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        summary.map_err(|e| web_sys::console::warn_1(&format!("imagine: no profile: {e}").into())).ok()
    }

    /// Ends a task: the session is kept in `kept` for the next task, or released (the worker is
    /// terminated next, which frees ORT's device). Returns the task's timing, with the profile.
    async fn end(mut self, kept: Option<&mut Option<Stage>>) -> StageTiming {
        let profile = self.take_profile().await;
        let timing = StageTiming { finished_at_ms: js_sys::Date::now(), profile, ..self.timing.clone() };
        match kept {
            Some(kept) => *kept = Some(self),
            None => {
                self.session.release().await.log_error("releasing the session");
            }
        }
        timing
    }

    /// Releases the session.
    async fn close(self) {
        self.session.release().await.log_error("releasing the session");
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
        let mut names: Vec<String> = feeds.iter().map(|(name, _)| (*name).to_owned()).collect();
        let mut tensors = feeds.iter().map(|(_, tensor)| to_ort(tensor)).collect::<Result<Vec<_>, _>>()?;
        for (name, tensor) in look_up(&self.lookups, &self.tables, feeds).await? {
            names.push(name);
            tensors.push(tensor);
        }
        let named: Vec<(&str, &ort::Tensor)> = names.iter().map(String::as_str).zip(&tensors).collect();
        let started = now_ms();
        let outputs = self.session.run(&named, fetches).await;
        let ran = now_ms() - started;
        self.timing.run_ms += ran;
        self.timing.runs_ms.push(ran);
        // Free the inputs' copies now rather than at garbage collection: one per step adds up.
        tensors.into_iter().for_each(ort::Tensor::dispose);
        outputs.map_err(session_error)?.iter().map(from_ort).collect()
    }
}

/// A stage's loaded graph: one session, or a chain of pieces.
enum Loaded {
    Whole(Session),
    Chain(ort::Chain),
}

impl Loaded {
    /// How many sessions (1 for a whole graph).
    fn pieces(&self) -> u32 {
        match self {
            Loaded::Whole(_) => 1,
            Loaded::Chain(chain) => chain.len() as u32,
        }
    }

    fn inputs(&self) -> Vec<TensorInfo> {
        match self {
            Loaded::Whole(session) => session.inputs(),
            Loaded::Chain(chain) => chain.inputs(),
        }
    }

    fn outputs(&self) -> Vec<TensorInfo> {
        match self {
            Loaded::Whole(session) => session.outputs(),
            Loaded::Chain(chain) => chain.outputs(),
        }
    }

    async fn run(
        &self,
        feeds: &[(&str, &ort::Tensor)],
        wanted: &[&str],
    ) -> Result<Vec<ort::Tensor>, OrtError> {
        match self {
            Loaded::Whole(session) => session.run(feeds, wanted).await,
            Loaded::Chain(chain) => chain.run(feeds, wanted).await,
        }
    }

    /// ORT's profile of a whole graph (a chain is never profiled: `profile` loads stages whole).
    async fn end_profiling(&self) -> Result<String, OrtError> {
        match self {
            Loaded::Whole(session) => session.end_profiling().await,
            Loaded::Chain(_) => Ok(String::new()),
        }
    }

    async fn release(self) -> Result<(), OrtError> {
        match self {
            Loaded::Whole(session) => session.release().await,
            Loaded::Chain(chain) => chain.release().await,
        }
    }
}

/// `bytes` (the graph `name`) cut into pieces of at most `max` bytes for `params`' image
/// (`imagine_core::f32_rewrite::split`), as `(graph, inputs, outputs)`; none where it cannot be cut,
/// which is logged: the graph then runs whole.
fn pieces(
    name: &str,
    bytes: &[u8],
    params: &GenerateParams,
    max: u64,
) -> Vec<(Vec<u8>, Vec<String>, Vec<String>)> {
    use imagine_core::f32_rewrite::split;
    let cut = split::latent_channels(bytes).and_then(|channels| {
        // The decoder reads packed tokens at 1/16 of the image, or the unpatchified latent at 1/8.
        let factor = if channels == Some(imagine_core::latents::TOKEN_CHANNELS as u64) { 16 } else { 8 };
        split::split(bytes, u64::from(params.height / factor), u64::from(params.width / factor), max)
    });
    match cut {
        Ok(pieces) => pieces.into_iter().map(|p| (p.model, p.inputs, p.outputs)).collect(),
        Err(e) => {
            web_sys::console::warn_1(
                &format!("imagine: {name} runs whole: it could not be cut ({e})").into(),
            );
            Vec::new()
        }
    }
}

/// The graph `graph` runs as on WebGPU `adapter` (`None`: the wasm backend): `(file name, bytes, tables
/// to look up)`. On a WebGPU adapter without `shader-f16`, a float16 graph runs as the pack's float32
/// conversion made for this adapter's limits; without one it is refused before anything is loaded.
async fn choose_graph(
    record: &opfs::PackRecord,
    dir: &web_sys::FileSystemDirectoryHandle,
    graph: Graph,
    adapter: Option<gpu::AdapterInfo>,
) -> Result<(String, Vec<u8>, Vec<(EmbeddingLookup, web_sys::File)>), StageWorkerError> {
    let name = graph.file_name();
    let bytes = opfs::read(dir, &name).await?;
    let Some(adapter) = adapter else {
        return Ok((name, bytes, Vec::new()));
    };
    let needs_f16 = pack::declares_float16(&bytes)
        .map_err(|source| StageWorkerError::Graph { graph: name.clone(), source })?;
    if adapter.has_f16 || !needs_f16 {
        return Ok((name, bytes, Vec::new()));
    }
    let converted = record
        .conversion
        .as_ref()
        .filter(|c| c.limits == adapter.limits)
        .and_then(|c| c.graph(graph))
        .ok_or(GpuError::NoF16 { what: name })?;
    let mut lookups = Vec::new();
    for lookup in &converted.lookups {
        lookups.push((lookup.clone(), open_external(dir, &converted.onnx, &lookup.source.file).await?));
    }
    Ok((converted.onnx.clone(), opfs::read(dir, &converted.onnx).await?, lookups))
}

/// The stored re-blocked graph of `stored` (its bytes), once its files are checked against the record:
/// their lengths, and with `checksums` their checksums too (the data a piece at a time); why not, if
/// they differ (or cannot be read).
async fn stored_form(
    dir: &web_sys::FileSystemDirectoryHandle,
    stored: &matmul_blocks::Block32Graph,
    checksums: bool,
) -> Result<Vec<u8>, String> {
    let onnx = opfs::read(dir, &stored.onnx).await.map_err(|e| e.to_string())?;
    let data = opfs::file(dir, &stored.data).await.map_err(|e| e.to_string())?;
    let data_len = data.size() as u64;
    stored.check(onnx.len() as u64, data_len, None).map_err(|e| e.to_string())?;
    if !checksums {
        return Ok(onnx);
    }
    let mut onnx_digest = imagine_core::hub::ResumableSha256::new();
    onnx_digest.update(&onnx);
    // A piece at a time, each hashed by the browser (`crypto.subtle`), far faster than SHA-256 in wasm.
    let subtle = get(&get(&js_sys::global(), "crypto"), "subtle");
    let digest: js_sys::Function = get(&subtle, "digest").unchecked_into();
    let mut data_digest = matmul_blocks::PieceDigest::new();
    let mut offset = 0u64;
    while offset < data_len {
        let end = (offset + matmul_blocks::DIGEST_PIECE_BYTES).min(data_len);
        let read = |e: JsValue| OpfsError::js(opfs::Op::Read, stored.data.as_str(), e).to_string();
        let slice = data.slice_with_f64_and_f64(offset as f64, end as f64).map_err(read)?;
        let piece = JsFuture::from(slice.array_buffer()).await.map_err(read)?;
        let hashed = digest.call2(&subtle, &"SHA-256".into(), &piece).map_err(read)?;
        let hashed = JsFuture::from(js_sys::Promise::from(hashed)).await.map_err(read)?;
        let hashed: [u8; 32] =
            Uint8Array::new(&hashed).to_vec().try_into().map_err(|_| "a digest of another length")?;
        data_digest.piece(&hashed);
        offset = end;
    }
    let (onnx_digest, data_digest) = (onnx_digest.finalize(), data_digest.finalize());
    stored
        .check(onnx.len() as u64, data_len, Some((&onnx_digest, &data_digest)))
        .map_err(|e| e.to_string())?;
    Ok(onnx)
}

/// Opens `file`, which `graph` needs.
async fn open_external(
    dir: &web_sys::FileSystemDirectoryHandle,
    graph: &str,
    file: &str,
) -> Result<web_sys::File, StageWorkerError> {
    opfs::file(dir, file).await.map_err(|e| external_data_error(graph, file, e))
}

fn external_data_error(graph: &str, file: &str, source: opfs::OpfsError) -> StageWorkerError {
    StageWorkerError::ExternalData {
        graph: graph.to_owned(),
        file: file.to_owned(),
        source: Box::new(source),
    }
}

/// The inputs of the tables that left the graph, named: the rows of the ids fed, read from each
/// table's file (each distinct row once); the float32 conversion's tables converted to float32.
async fn look_up(
    lookups: &[(EmbeddingLookup, web_sys::File)],
    tables: &[(TableLookup, web_sys::File)],
    feeds: &[(&str, &Tensor)],
) -> Result<Vec<(String, ort::Tensor)>, SessionError> {
    let ids_of = |ids_input: &str, table: &str| match feeds.iter().find(|(name, _)| *name == ids_input) {
        Some((_, Tensor { dims, data: TensorData::Int64(ids) })) => Ok((dims, ids)),
        _ => Err(SessionError(format!("no int64 `{ids_input}` fed to look `{table}` up"))),
    };
    let failed = |e: imagine_core::f32_rewrite::LookupError| SessionError(e.to_string());
    let mut inputs = Vec::new();
    for (lookup, file) in lookups {
        let (dims, ids) = ids_of(&lookup.ids_input, &lookup.table)?;
        let rows = read_rows(file, ids.iter().map(|&id| lookup.row_range(id))).await?;
        let values = lookup.gather(ids, |offset, out| copy_row(&rows, offset, out)).map_err(failed)?;
        let mut shape = dims.clone();
        shape.push(lookup.row_elements as i64);
        inputs.push((lookup.input.clone(), ort::Tensor::from_f32(&values, &shape).map_err(session_error)?));
    }
    for (table, file) in tables {
        let (dims, ids) = ids_of(&table.ids_input, &table.table)?;
        let rows = read_rows(file, ids.iter().map(|&id| table.row_range(id))).await?;
        let bytes = table.gather(ids, |offset, out| copy_row(&rows, offset, out)).map_err(failed)?;
        let tensor = ort::Tensor::from_bytes(table.elem_type, &bytes, &table.input_dims(dims));
        inputs.push((table.input.clone(), tensor.map_err(session_error)?));
    }
    Ok(inputs)
}

/// `bytes` (the graph `name`, its external-data locations stored as `files` in `dir`) re-blocked to 32
/// with the repeated scales and zero points computed here, and the data file ORT then needs beside the
/// others: the computed tensors, each copied out of this worker's wasm memory as it is made (which never
/// shrinks) and handed to ORT where they are, in JS memory, until the session is created.
async fn reblock(
    name: &str,
    bytes: &[u8],
    dir: &web_sys::FileSystemDirectoryHandle,
    files: &HashMap<String, String>,
) -> Result<(Vec<u8>, Option<ExternalData>), StageWorkerError> {
    let edit_failed = |source| StageWorkerError::GraphEdit { graph: name.to_owned(), source };
    let mut opened: HashMap<&str, web_sys::File> = HashMap::new();
    let mut reads = Vec::new();
    for range in matmul_blocks::sources_to_read(bytes).map_err(edit_failed)? {
        // A location the graph names but the pack does not list is left to the nodes' fallback.
        let Some(file) = files.get(&range.location) else { continue };
        if !opened.contains_key(file.as_str()) {
            opened.insert(file, open_external(dir, name, file).await?);
        }
        let failed =
            move |e: JsValue| external_data_error(name, file, OpfsError::js(opfs::Op::Read, file, e));
        let end = range.offset + range.length;
        let slice =
            opened[file.as_str()].slice_with_f64_and_f64(range.offset as f64, end as f64).map_err(failed)?;
        // A few hundred small reads (one per node's scales or zero points), all in flight at once.
        reads.push(async move {
            let buffer = JsFuture::from(slice.array_buffer()).await.map_err(failed)?;
            Ok::<_, StageWorkerError>((range, Uint8Array::new(&buffer).to_vec()))
        });
    }
    let read: HashMap<_, _> = futures_util::future::try_join_all(reads).await?.into_iter().collect();
    let parts = js_sys::Array::new();
    let reblocked =
        matmul_blocks::to_block_32_computed(bytes, &read, matmul_blocks::COMPUTED_DATA, &mut |chunk| {
            parts.push(&Uint8Array::from(chunk));
        })
        .map_err(edit_failed)?;
    if reblocked.data_length == 0 {
        return Ok((reblocked.graph, None));
    }
    Ok((
        reblocked.graph,
        Some(ExternalData { path: matmul_blocks::COMPUTED_DATA.to_owned(), data: parts.into() }),
    ))
}

/// Each distinct row of `ranges` read from `file`, by its offset.
async fn read_rows(
    file: &web_sys::File,
    ranges: impl Iterator<Item = Result<Range, imagine_core::f32_rewrite::LookupError>>,
) -> Result<std::collections::HashMap<u64, Vec<u8>>, SessionError> {
    let mut rows = std::collections::HashMap::new();
    for range in ranges {
        let range = range.map_err(|e| SessionError(e.to_string()))?;
        if rows.contains_key(&range.offset) {
            continue;
        }
        let read = |e: JsValue| SessionError(format!("reading {}: {}", range.file, JsError::from(e)));
        let end = range.offset + range.length;
        let slice = file.slice_with_f64_and_f64(range.offset as f64, end as f64).map_err(read)?;
        let buffer = JsFuture::from(slice.array_buffer()).await.map_err(read)?;
        rows.insert(range.offset, Uint8Array::new(&buffer).to_vec());
    }
    Ok(rows)
}

fn copy_row(
    rows: &std::collections::HashMap<u64, Vec<u8>>,
    offset: u64,
    out: &mut [u8],
) -> Result<(), String> {
    match rows.get(&offset) {
        Some(row) if row.len() == out.len() => {
            out.copy_from_slice(row);
            Ok(())
        }
        _ => Err(format!("the row at byte {offset} is cut short")),
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
        let meta = PngMeta {
            prompt: params.prompt.clone(),
            seed: params.seed_of(index),
            width: params.width,
            height: params.height,
            steps: params.steps,
            schedule: params.schedule.name().to_owned(),
        };
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
