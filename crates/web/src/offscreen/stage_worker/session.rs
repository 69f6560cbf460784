//! A stage's session (`Stage`): made on the chosen backend from its loaded graph, run through
//! `imagine_core::Session`, and the tensors it passes to and from ONNX Runtime.

use super::*;

/// A session on the chosen backend; the pipeline runs it through
/// [`imagine_core::Session`].
pub(super) struct Stage {
    pub(super) graph: Graph,
    pub(super) backend: Backend,
    /// What its session was made with besides the graph (`GenerateParams::session_options`).
    pub(super) options: SessionOptions,
    pub(super) session: Loaded,
    pub(super) inputs: Vec<TensorInfo>,
    pub(super) outputs: Vec<TensorInfo>,
    pub(super) timing: StageTiming,
    /// Tables of the float32 conversion looked up here and fed as float32 inputs.
    pub(super) lookups: Vec<(EmbeddingLookup, web_sys::File)>,
    /// Tables taken out of the graph (`imagine_core::graph::tables`), fed as they are stored.
    pub(super) tables: Vec<(TableLookup, web_sys::File)>,
    /// ORT profiles the session (until [`Stage::take_profile`]).
    pub(super) profiling: bool,
}

impl Stage {
    /// Loads `graph` from the installed pack. Its external data is passed to ORT as OPFS file handles, which
    /// ORT reads itself, one initializer at a time (see `imagine_ort`); its embedding tables stay in their
    /// files and only the prompt's rows are read (see `imagine_core::graph::tables`).
    pub(super) async fn open(
        graph: Graph,
        params: &GenerateParams,
        checked: &[String],
        arrived: Arrival,
    ) -> Result<Stage, StageWorkerError> {
        Stage::open_with(graph, params, checked, arrived, true).await
    }

    /// [`Stage::open`], from the stored re-blocked form where `stored_form` and it is sound. A stored
    /// form's checksums are checked while its session is made (they cost about a second a GB): a
    /// damaged one's session is released before it runs, and the graph loaded again, re-blocked while
    /// it loads, as if the form had never been stored.
    ///
    /// Long because loading is one sequence (the pack, the adapter, the graph and its stored form, its
    /// tables, its external data, the WebGPU edits, the session) whose steps read what the ones
    /// before found; each step of more than a few lines is a function of its own.
    async fn open_with(
        graph: Graph,
        params: &GenerateParams,
        checked: &[String],
        arrived: Arrival,
        stored_form: bool,
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
            Backend::WebGpu if stored_form => ReblockedRecord::form(record.block32.as_ref(), &name),
            Backend::WebGpu => ReblockedForm::AtLoad,
            Backend::Wasm => ReblockedForm::Unchanged,
        };
        let StoredForm { form: block32, onnx: stored_onnx, unchecked, check_ms } =
            StoredForm::if_whole(&record.commit, &dir, block32, checked).await;
        let stored = match &block32 {
            ReblockedForm::Stored(stored) => Some(*stored),
            _ => None,
        };
        let (name, bytes) = match (stored, stored_onnx) {
            (Some(stored), Some(onnx)) => (stored.onnx.clone(), onnx),
            _ => (name, bytes),
        };
        let (bytes, taken_out) = tables::take_out(&bytes)
            .map_err(|source| StageWorkerError::GraphEdit { graph: name.clone(), source })?;
        let tables = open_tables(&dir, &name, taken_out).await?;
        let (mut external, files) = external_data(&dir, &name, &bytes).await?;
        let (mut reblocked_at_load, mut edited) = (false, Edited::default());
        let (bytes, provider) = match backend {
            Backend::Wasm => (bytes, Provider::Wasm),
            // ORT's tiled WebGPU kernel takes block 32 only (see `imagine_core::graph::reblock`).
            Backend::WebGpu => {
                let (mut bytes, computed) = match block32 {
                    ReblockedForm::AtLoad => reblock(&name, &bytes, &dir, &files).await?,
                    ReblockedForm::Stored(_) | ReblockedForm::Unchanged => (bytes, None),
                };
                reblocked_at_load = computed.is_some();
                external.extend(computed);
                (bytes, edited) = edited_for_webgpu(bytes, graph, params)
                    .map_err(|source| StageWorkerError::GraphEdit { graph: name.clone(), source })?;
                let channels_first = adapter.is_some_and(|a| a.cpu_backed);
                let keep_buffers = params.keeps_buffers(graph);
                (bytes, Provider::WebGpu { channels_first, keep_buffers, gpu_outputs: false })
            }
        };
        injected_failure(graph).await?;
        let started_at_ms = js_sys::Date::now();
        let create = timed(create_session(&name, bytes, &external, &provider, params, graph, profile));
        let check = timed(async move {
            match (unchecked, stored) {
                (Some(unchecked), Some(stored)) => Some(unchecked.check(stored).await),
                _ => None,
            }
        });
        let ((loaded, session_create_ms), (checked_now, hash_ms)) = futures_util::join!(create, check);
        let checked_form = match checked_now {
            Some(Err(why)) => {
                if let Ok(session) = loaded {
                    session.release().await.log_error("releasing the session");
                }
                warn_damaged(stored.map_or(name.as_str(), |s| s.graph.as_str()), &why);
                return Box::pin(Stage::open_with(graph, params, checked, arrived, false)).await;
            }
            Some(Ok(key)) => Some(key),
            None => None,
        };
        let session = loaded.map_err(|source| StageWorkerError::Load { graph: name.clone(), source })?;
        let timing = StageTiming {
            graph_file: name,
            reblocked_at_load,
            checked_form,
            stored_form_check_ms: check_ms + hash_ms,
            fused_attention: edited.fused_attention,
            chunked_attention: edited.chunked_attention,
            parted_projections: edited.parted_projections,
            chunked_chains: edited.chunked_chains,
            parted_gemms: edited.parted_gemms,
            parted_matmuls: edited.parted_matmuls,
            ort_wasm_as_bytes: ort_wasm_as_bytes(),
            pieces: session.pieces(),
            worker_created_at_ms: arrived.worker_created_at_ms,
            task_at_ms: arrived.task_at_ms,
            started_at_ms,
            session_create_ms,
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
            options: params.session_options(graph),
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
    pub(super) async fn take(
        kept: &mut Option<Stage>,
        graph: Graph,
        params: &GenerateParams,
        checked: &[String],
        arrived: Arrival,
    ) -> Result<Stage, StageWorkerError> {
        let same = |stage: &Stage| {
            stage.graph == graph
                && stage.backend == params.backend
                && stage.options == params.session_options(graph)
        };
        match kept.take() {
            Some(mut stage) if same(&stage) && !params.profile => {
                stage.timing = StageTiming {
                    graph_file: std::mem::take(&mut stage.timing.graph_file),
                    fused_attention: stage.timing.fused_attention,
                    chunked_attention: stage.timing.chunked_attention,
                    parted_projections: stage.timing.parted_projections,
                    chunked_chains: stage.timing.chunked_chains,
                    parted_gemms: stage.timing.parted_gemms,
                    parted_matmuls: stage.timing.parted_matmuls,
                    ort_wasm_as_bytes: stage.timing.ort_wasm_as_bytes,
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
    pub(super) async fn take_profile(&mut self) -> Option<imagine_core::ort_profile::StageProfile> {
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
    pub(super) async fn end(mut self, kept: Option<&mut Option<Stage>>) -> StageTiming {
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
    pub(super) async fn close(self) {
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
        let (started, uploaded) = (now_ms(), self.session.uploaded_values());
        let outputs = self.session.run(&named, fetches).await;
        let ran = now_ms() - started;
        self.timing.run_ms += ran;
        self.timing.runs_ms.push(ran);
        self.timing.uploaded_values += self.session.uploaded_values() - uploaded;
        // Free the inputs' copies now rather than at garbage collection: one per step adds up.
        tensors.into_iter().for_each(ort::Tensor::dispose);
        outputs.map_err(session_error)?.iter().map(from_ort).collect()
    }
}

pub(super) fn session_error(e: ort::OrtError) -> SessionError {
    SessionError(e.to_string())
}

pub(super) fn to_ort(tensor: &Tensor) -> Result<ort::Tensor, SessionError> {
    match &tensor.data {
        TensorData::Float32(values) => ort::Tensor::from_f32(values, &tensor.dims),
        TensorData::Float16(values) => ort::Tensor::from_f16_bits(values.reinterpret_cast(), &tensor.dims),
        TensorData::Int64(values) => ort::Tensor::from_i64(values, &tensor.dims),
    }
    .map_err(session_error)
}

pub(super) fn from_ort(tensor: &ort::Tensor) -> Result<Tensor, SessionError> {
    let data = match tensor.dtype() {
        DType::Float32 => TensorData::Float32(tensor.to_f32().map_err(session_error)?),
        DType::Float16 => TensorData::Float16(tensor.f16_bits().map_err(session_error)?.reinterpret_into()),
        other => {
            return Err(SessionError(format!("an output is {}, which Imagine does not read", other.name())))
        }
    };
    Ok(Tensor { dims: tensor.dims(), data })
}

pub(super) fn f32_buffer(values: &[f32]) -> JsValue {
    Float32Array::from(values).buffer().into()
}

pub(super) fn f32_from_buffer(
    data: Option<JsValue>,
    what: &'static str,
) -> Result<Vec<f32>, StageWorkerError> {
    match data {
        Some(buffer) if buffer.is_instance_of::<js_sys::ArrayBuffer>() => {
            Ok(Float32Array::new(&buffer).to_vec())
        }
        _ => Err(StageWorkerError::MissingInput(what)),
    }
}

/// The stored re-blocked form a stage loads, if its lengths are right. A stored form is loaded only
/// as it was stored: its lengths checked at every load, its checksums at its first load in this
/// document's life ([`Stage::open_with`]). A damaged one is left alone (the job stores it again after
/// it) and the graph re-blocked while it loads, as if the form had never been stored.
struct StoredForm<'r> {
    /// `AtLoad` in place of a stored form whose lengths are wrong.
    form: ReblockedForm<'r>,
    /// The stored form's graph, where its lengths are right.
    onnx: Option<Vec<u8>>,
    /// Its checksums, where this document has not checked them yet.
    unchecked: Option<UncheckedForm>,
    /// How long reading it and checking its lengths took.
    check_ms: f64,
}

impl<'r> StoredForm<'r> {
    async fn if_whole(
        commit: &str,
        dir: &web_sys::FileSystemDirectoryHandle,
        form: ReblockedForm<'r>,
        checked: &[String],
    ) -> StoredForm<'r> {
        let ReblockedForm::Stored(stored) = form else {
            return StoredForm { form, onnx: None, unchecked: None, check_ms: 0.0 };
        };
        let key = format!("{commit}:{}", stored.onnx);
        let checksums = !checked.contains(&key);
        let (read, check_ms) = timed(stored_form(dir, stored, key, checksums)).await;
        match read {
            Ok((onnx, unchecked)) => StoredForm { form, onnx: Some(onnx), unchecked, check_ms },
            Err(why) => {
                warn_damaged(&stored.graph, &why);
                StoredForm { form: ReblockedForm::AtLoad, onnx: None, unchecked: None, check_ms }
            }
        }
    }
}

fn warn_damaged(graph: &str, why: &str) {
    web_sys::console::warn_1(
        &format!(
            "imagine: the stored form of {graph} is not loaded ({why}): re-blocked while loading, and stored \
             again after the job"
        )
        .into(),
    );
}

/// The files of the tables `taken_out` of the graph `name`, opened.
async fn open_tables(
    dir: &web_sys::FileSystemDirectoryHandle,
    name: &str,
    taken_out: Vec<TableLookup>,
) -> Result<Vec<(TableLookup, web_sys::File)>, StageWorkerError> {
    let mut tables = Vec::new();
    for table in taken_out {
        let file = open_external(dir, name, &table.source.file).await?;
        tables.push((table, file));
    }
    Ok(tables)
}

/// The external data of `bytes` (the graph `name`) as ORT reads it, each location's file handle, and
/// the file each location names.
async fn external_data(
    dir: &web_sys::FileSystemDirectoryHandle,
    name: &str,
    bytes: &[u8],
) -> Result<(Vec<ExternalData>, HashMap<String, String>), StageWorkerError> {
    let broken = |source| StageWorkerError::Graph { graph: name.to_owned(), source };
    let mut external = Vec::new();
    let mut files = HashMap::new();
    for external_file in pack::external_data_locations(bytes).map_err(broken)? {
        // Opened by the name the planner downloaded it under, handed to ORT under the graph's own.
        let pack::ExternalFile { location, file } = external_file;
        let handle = opfs::file_handle(dir, &file, false).await;
        let data = handle.map_err(|e| external_data_error(name, &file, e))?;
        external.push(ExternalData { path: location.clone(), data: data.into() });
        files.insert(location, file);
    }
    Ok((external, files))
}

/// What `future` gives, and how long it took (ms).
async fn timed<T>(future: impl Future<Output = T>) -> (T, f64) {
    let started = now_ms();
    let out = future.await;
    (out, now_ms() - started)
}

/// `bytes` (the graph `name`) made into ORT's session, or a chain of sessions where `params` cut the
/// decoder into pieces (resident) or the transformer (streamed).
async fn create_session(
    name: &str,
    bytes: Vec<u8>,
    external: &[ExternalData],
    provider: &Provider,
    params: &GenerateParams,
    graph: Graph,
    profile: bool,
) -> Result<Loaded, OrtError> {
    let streamed = params.transformer_pieces(graph);
    if streamed > 1 {
        if let Some((pieces, io)) = pieces_by_weights(name, &bytes, streamed) {
            let staging = params.weight_part_bytes;
            let chain = ort::Chain::streamed(pieces, external.to_vec(), provider.clone(), io, staging);
            return chain.await.map(Loaded::Chain);
        }
    }
    let pieces = match params.decoder_piece_bytes(graph) {
        Some(max) => pieces(name, &bytes, params, max),
        None => Vec::new(),
    };
    if pieces.len() > 1 {
        ort::Chain::create(pieces, external).await.map(Loaded::Chain)
    } else {
        Session::create(&Uint8Array::from(bytes.as_slice()), external, provider, profile)
            .await
            .map(Loaded::Whole)
    }
}

/// What [`edited_for_webgpu`] changed in a graph.
#[derive(Default)]
struct Edited {
    fused_attention: u32,
    chunked_attention: u32,
    parted_projections: u32,
    chunked_chains: u32,
    parted_gemms: u32,
    parted_matmuls: u32,
}

/// The graph with the edits `params` ask of `graph` on WebGPU: the accuracy level, the attention fused
/// or chunked, the wide projections per part, the token-wise chains in chunks of tokens, heavy
/// `MatMulNBits` in parts; and in every plan `Clip` as `Max` then `Min`, which Firefox's shader compiler
/// takes where it refuses ORT's `Clip`, and `Gemm`s with heavy weights in parts, so that none of those
/// weights passes through the renderer whole.
fn edited_for_webgpu(
    mut bytes: Vec<u8>,
    graph: Graph,
    params: &GenerateParams,
) -> Result<(Vec<u8>, Edited), imagine_core::graph::RewriteError> {
    let mut edited = Edited::default();
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    if let Some(level) = params.accuracy_level {
        bytes = reblock::with_accuracy_level(&bytes, level)?.0;
    }
    if params.fuses_attention(graph) {
        let (fused, n) = attention::fuse_attention(&bytes)?;
        (bytes, edited.fused_attention) = (fused, count(n));
    }
    let chunks = params.attention_chunks(graph);
    if chunks > 1 {
        let (chunked, n) = attention::chunk_attention(&bytes, chunks)?;
        (bytes, edited.chunked_attention) = (chunked, count(n));
    }
    if params.parts_projections(graph) {
        let (parted, n) = projections::per_part(&bytes)?;
        (bytes, edited.parted_projections) = (parted, count(n));
    }
    let token_chunks = params.token_chunks(graph);
    if token_chunks > 1 {
        let (chunked, n) = rows::chunk_rows(&bytes, token_chunks)?;
        (bytes, edited.chunked_chains) = (chunked, count(n));
    }
    let (parted, n) = weight_parts::by_rows(&bytes, params.weight_part_bytes, weight_parts::Op::Gemm)?;
    (bytes, edited.parted_gemms) = (parted, count(n));
    if params.matmuls_in_parts {
        let (parted, n) =
            weight_parts::by_rows(&bytes, params.weight_part_bytes, weight_parts::Op::MatMulNBits)?;
        (bytes, edited.parted_matmuls) = (parted, count(n));
    }
    Ok((clip::as_max_min(&bytes)?.0, edited))
}

/// Lets a test make a stage's session fail to be created once, as a GPU out of memory would, or run
/// out of GPU memory in the words WebGPU uses.
async fn injected_failure(graph: Graph) -> Result<(), StageWorkerError> {
    if opfs::failpoint_reached(&format!("stage:create-fails:{graph:?}")).await {
        return Err(StageWorkerError::Injected(format!("{graph:?} session creation")));
    }
    if opfs::failpoint_reached(&format!("stage:out-of-memory:{graph:?}")).await {
        return Err(StageWorkerError::Injected(format!(
            "{graph:?} session (GPUOutOfMemoryError: Out of memory)"
        )));
    }
    Ok(())
}

/// Whether `stage-worker.js` handed ORT its wasm as bytes (`ort.env.wasm.wasmBinary`).
fn ort_wasm_as_bytes() -> bool {
    let get =
        |target: &JsValue, key: &str| js_sys::Reflect::get(target, &key.into()).unwrap_or(JsValue::UNDEFINED);
    let wasm = get(&get(&get(&js_sys::global(), "ort"), "env"), "wasm");
    !wasm.is_undefined() && !get(&wasm, "wasmBinary").is_undefined()
}
