//! Thin bindings to ONNX Runtime Web (`onnxruntime-web/webgpu`, the native WebGPU execution provider).
//!
//! The ORT bundle ships inside the extension. A worker's entry shim imports it and exposes it as
//! `globalThis.ort` before the wasm module starts, so these bindings never load code from anywhere and
//! the contexts that don't run models (the service worker, pages) never load ORT at all.
//!
//! What is covered is what the pipeline needs: creating a session from graph bytes with its external
//! data given as URLs, `Blob`s or OPFS file handles, input and output metadata, float32 / float16 /
//! int64 tensors (and tensors of a looked-up table's type, from its bytes), `run` and `release`.
//!
//! What loading costs in memory: the build we ship is ORT's JSPI build (`ort.jspi.bundle.min.mjs`), which
//! reads an external-data file one initializer at a time. The asyncify build would read every file of
//! a session whole into JS memory before creating it, holding the weights twice while a stage loads.
//! Each file goes to ORT as a `ChunkedBlob` (`chunked_blob.js`): read in chunks rather than with the BYOB
//! stream reads that now and then never settle in a Chromium worker, and, for an OPFS file handle, into
//! one reused buffer, so that reading the weights leaves no garbage behind.
//! ORT opens its own `GPUDevice`: a device passed in is imported into a wgpu instance that cannot wait
//! on it with timeouts, which ORT's synchronous downloads need (onnxruntime #32257).

// The workspace denies `missing_docs` (Cargo.toml). `unwrap_used` is denied here rather than there
// because xtask's tests unwrap; a panic in wasm silently kills the worker running the model. `expect`
// panics the same way.
#![deny(clippy::unwrap_used, clippy::expect_used)]
// Tests may unwrap: a failing unwrap is a failing test, with the value in its message.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub use imagine_core::graph::tables::ElemType;
pub use imagine_core::{DType, Dim, TensorInfo};
use js_sys::{
    Array, BigInt64Array, Float32Array, Int32Array, Int8Array, Object, Promise, Reflect, Uint16Array,
    Uint8Array,
};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = ort, js_name = InferenceSession)]
    type JsSession;

    #[wasm_bindgen(catch, static_method_of = JsSession, js_namespace = ort, js_class = "InferenceSession", js_name = create)]
    fn create(model: &Uint8Array, options: &Object) -> Result<Promise, JsValue>;

    #[wasm_bindgen(method, getter, js_name = inputMetadata)]
    fn input_metadata(this: &JsSession) -> Array;

    #[wasm_bindgen(method, getter, js_name = outputMetadata)]
    fn output_metadata(this: &JsSession) -> Array;

    #[wasm_bindgen(catch, method)]
    fn run(this: &JsSession, feeds: &Object) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, method)]
    fn release(this: &JsSession) -> Result<Promise, JsValue>;

    #[wasm_bindgen(js_namespace = ort, js_name = Tensor)]
    type JsTensor;

    #[wasm_bindgen(catch, constructor, js_namespace = ort, js_class = "Tensor")]
    fn new(dtype: &str, data: &JsValue, dims: &Array) -> Result<JsTensor, JsValue>;

    #[wasm_bindgen(method, getter)]
    fn data(this: &JsTensor) -> JsValue;

    #[wasm_bindgen(method, getter)]
    fn dims(this: &JsTensor) -> Array;

    #[wasm_bindgen(method, getter, js_name = type)]
    fn dtype(this: &JsTensor) -> String;

    #[wasm_bindgen(method)]
    fn dispose(this: &JsTensor);

    #[wasm_bindgen(method, getter)]
    fn location(this: &JsTensor) -> String;

    #[wasm_bindgen(thread_local_v2, js_namespace = ort, js_name = env)]
    static ENV: Object;
}

#[wasm_bindgen(module = "/src/chunked_blob.js")]
extern "C" {
    /// An OPFS file handle or a `Blob` wrapped so that ORT reads it in chunks, or bytes in memory as a
    /// `Blob` (see `chunked_blob.js`).
    #[wasm_bindgen(js_name = forOrt)]
    fn for_ort(data: &JsValue) -> Promise;

    /// Closes the file access handles ORT's reads opened.
    #[wasm_bindgen(js_name = closeFiles)]
    fn close_files() -> Promise;
}

#[wasm_bindgen(module = "/src/gpu.js")]
extern "C" {
    #[wasm_bindgen(js_name = gpuWorkDone)]
    fn gpu_work_done() -> Promise;

    /// An output ORT left on the GPU, read into `reuse` (an `ArrayBuffer`) when large enough, as a CPU
    /// tensor, `chunk` bytes at a time; ORT's output is disposed (see `gpu.js`).
    #[wasm_bindgen(js_name = readBack)]
    fn read_back(tensor: &JsTensor, reuse: &JsValue, chunk: u32) -> Promise;

    /// A CPU tensor of more than `chunk` bytes copied onto ORT's device a chunk at a time, as a GPU
    /// tensor; any other as it is (see `gpu.js`).
    fn upload(tensor: &JsTensor, chunk: u32) -> Promise;
}

#[wasm_bindgen(module = "/src/profile.js")]
extern "C" {
    /// Lets [`Session::end_profiling`] take the profile ORT writes to the console (see `profile.js`).
    #[wasm_bindgen(js_name = tapConsoleLog)]
    fn tap_console_log();

    #[wasm_bindgen(js_name = endProfiling)]
    fn end_profiling(session: &JsSession) -> Promise;
}

/// Why an ORT call failed.
#[derive(Debug, thiserror::Error)]
pub enum OrtError {
    /// ORT threw or rejected; the message is ORT's own.
    #[error("{0}")]
    Ort(String),
    /// A tensor did not have the type the caller asked for.
    #[error("tensor `{name}` is {found}, expected {expected}")]
    WrongType {
        /// The tensor's name in the graph.
        name: String,
        /// Its element type, as ONNX names it.
        found: String,
        /// The type asked for.
        expected: &'static str,
    },
    /// `run` did not return an output the caller asked for.
    #[error("the graph returned no output named `{0}`")]
    MissingOutput(String),
    /// A piece of a chain had no session when its turn came (a chain run twice at once).
    #[error("a piece of the chain has no session")]
    Released,
}

impl From<JsValue> for OrtError {
    fn from(value: JsValue) -> Self {
        let message = value
            .dyn_ref::<js_sys::Error>()
            .map(|e| String::from(e.message()))
            .or_else(|| value.as_string())
            .unwrap_or_else(|| format!("{value:?}"));
        OrtError::Ort(message)
    }
}

/// Which ORT execution provider runs a session.
#[derive(Debug, Clone)]
pub enum Provider {
    /// The native WebGPU EP on a device ORT opens itself (asking for the adapter's limits and
    /// `shader-f16` where present). It lives as long as the worker: terminating the worker frees it.
    WebGpu {
        /// Convolutions in the graphs' own layout (NCHW) rather than ORT's default (NHWC, which
        /// transposes the activations around every Conv, normalization and Resize of the decoder: 60
        /// Transposes). Same outputs. NHWC is faster on a GPU (the decoder's run 1.3-1.5x on an H200),
        /// NCHW on an adapter that runs on the CPU (1.4x on SwiftShader), see BENCHMARKS.md.
        channels_first: bool,
        /// ORT keeps every GPU buffer a run released for the next run (its `simple` storage-buffer
        /// cache) rather than only those up to 160 MiB (`bucket`, its default): larger ones are
        /// allocated afresh on every run.
        keep_buffers: bool,
        /// Outputs stay on the GPU (`preferredOutputLocation: "gpu-buffer"`), for another session of
        /// this worker to read ([`Chain`]).
        gpu_outputs: bool,
    },
    /// ORT's CPU backend in wasm.
    Wasm,
}

/// Where one external-data file of a graph comes from.
#[derive(Clone)]
pub struct ExternalData {
    /// The location recorded in the graph.
    pub path: String,
    /// A URL string, a `Blob`/`File`, an OPFS `FileSystemFileHandle` (read in chunks into one reused
    /// buffer through a read-only sync access handle; ORT reads one initializer at a time), or an `Array`
    /// of `Uint8Array`s, the file's bytes in order, already in this worker's memory.
    pub data: JsValue,
}

/// Sets process-wide ORT options, and lets profiles be taken (see `profile.js`). Call before the first
/// session.
pub fn configure(threads: u32) {
    ENV.with(|env| {
        if let Ok(wasm) = Reflect::get(env, &"wasm".into()) {
            let _ = Reflect::set(&wasm, &"numThreads".into(), &threads.into());
        }
    });
    tap_console_log();
}

/// An ORT inference session.
pub struct Session {
    inner: JsSession,
}

impl Session {
    /// Creates a session from the graph's bytes and its external data, with ORT's profiling on when
    /// `profile` ([`Session::end_profiling`]).
    pub async fn create(
        graph: &Uint8Array,
        external: &[ExternalData],
        provider: &Provider,
        profile: bool,
    ) -> Result<Session, OrtError> {
        let options = Object::new();
        let providers = Array::new();
        match provider {
            Provider::WebGpu { channels_first, keep_buffers, gpu_outputs } => {
                if *gpu_outputs {
                    set(&options, "preferredOutputLocation", &"gpu-buffer".into());
                }
                let webgpu = Object::new();
                set(&webgpu, "name", &"webgpu".into());
                set(&webgpu, "preferredLayout", &(if *channels_first { "NCHW" } else { "NHWC" }).into());
                if *keep_buffers {
                    set(&webgpu, "storageBufferCacheMode", &"simple".into());
                }
                providers.push(&webgpu);
            }
            Provider::Wasm => {
                providers.push(&"wasm".into());
            }
        }
        set(&options, "executionProviders", &providers);
        let files = Array::new();
        for file in external {
            let entry = Object::new();
            set(&entry, "path", &file.path.as_str().into());
            set(&entry, "data", &JsFuture::from(for_ort(&file.data)).await?);
            files.push(&entry);
        }
        set(&options, "externalData", &files);
        set(&options, "graphOptimizationLevel", &"all".into());
        if profile {
            set(&options, "enableProfiling", &true.into());
        }
        let created = match JsSession::create(graph, &options) {
            Ok(promise) => JsFuture::from(promise).await,
            Err(e) => Err(e),
        };
        // ORT reads the external data only while it creates the session.
        let _ = JsFuture::from(close_files()).await;
        Ok(Session { inner: created?.unchecked_into() })
    }

    /// The graph's declared inputs.
    pub fn inputs(&self) -> Vec<TensorInfo> {
        value_infos(&self.inner.input_metadata())
    }

    /// The graph's declared outputs.
    pub fn outputs(&self) -> Vec<TensorInfo> {
        value_infos(&self.inner.output_metadata())
    }

    /// Runs the graph and returns the outputs named in `wanted`, in that order.
    pub async fn run(&self, feeds: &[(&str, &Tensor)], wanted: &[&str]) -> Result<Vec<Tensor>, OrtError> {
        let map = Object::new();
        for (name, tensor) in feeds {
            set(&map, name, &tensor.inner);
        }
        let results: Object = JsFuture::from(self.inner.run(&map)?).await?.unchecked_into();
        let mut outputs = Vec::with_capacity(wanted.len());
        for name in wanted {
            let value = Reflect::get(&results, &(*name).into())?;
            if value.is_undefined() {
                return Err(OrtError::MissingOutput((*name).to_owned()));
            }
            outputs.push(Tensor { inner: value.unchecked_into(), name: (*name).to_owned() });
        }
        Ok(outputs)
    }

    /// Ends the profile of a session created with `profile`: ORT's trace events, a JSON array (see
    /// `imagine_core::ort_profile`).
    pub async fn end_profiling(&self) -> Result<String, OrtError> {
        let trace = JsFuture::from(end_profiling(&self.inner)).await?;
        Ok(trace.as_string().unwrap_or_default())
    }

    /// Releases the session's native resources.
    pub async fn release(self) -> Result<(), OrtError> {
        JsFuture::from(self.inner.release()?).await?;
        Ok(())
    }
}

/// A graph run as a chain of smaller graphs ("pieces", `imagine_core::graph::split`), one session
/// each, in order. What no later piece reads is freed after each piece, and the GPU is waited for before
/// the next.
///
/// Resident ([`Chain::create`]): every piece's session stays made, what a piece passes on stays on the
/// GPU, and the chain's peak is its largest piece's work rather than the whole graph's (the decoder).
/// Streamed ([`Chain::streamed`]): one piece's session at a time, made when it runs and released
/// before the next is made, so that only one piece's weights are ever on the GPU (a transformer whose
/// weights do not fit beside its work), at the cost of reading every piece's weights again on every
/// run. What a piece passes on is read back to the CPU, into arrays of the chain's own reused on every
/// run, rather than into new ones each time (57 MB a value at 1024x1024 in float32, which the
/// renderer held as garbage until collected). It cannot stay on the GPU: ORT closes its device, with
/// every buffer on it, when its last session is released; and a session kept open to hold the device
/// keeps ORT's buffer cache with it, which held more GPU memory than an 8 GB budget has (H100).
pub struct Chain {
    pieces: Vec<ChainPiece>,
    /// Where a streamed chain's pieces are made from; `None` for a resident chain.
    streamed: Option<Streamed>,
    /// The chain's declared inputs and outputs (the whole graph's).
    inputs: Vec<TensorInfo>,
    outputs: Vec<TensorInfo>,
}

struct ChainPiece {
    /// Made; in a streamed chain only while it runs (and the first piece until the first run).
    session: RefCell<Option<Session>>,
    /// The graph, kept to make the session again (streamed chains only).
    graph: Vec<u8>,
    inputs: Vec<String>,
    outputs: Vec<String>,
}

struct Streamed {
    external: Vec<ExternalData>,
    provider: Provider,
    /// The arrays what the pieces pass on is read back into, by the value's name.
    arrays: RefCell<HashMap<String, JsValue>>,
    /// The most bytes one copy to or from the GPU stages at a time (a multiple of 16).
    chunk: u32,
    /// How many values it copied to the GPU itself, in chunks, over all its runs.
    uploaded: Cell<u32>,
}

impl Chain {
    /// Creates a session for each piece (`(graph bytes, input names, output names)`), all reading the
    /// same `external` data; every piece but the last keeps its outputs on the GPU.
    ///
    /// The pieces compute in the graph's own layout (NCHW): a chain is what runs where memory is
    /// short, and NHWC would transpose each piece's activations in and out around its convolutions,
    /// holding every full-size tensor of a piece twice.
    pub async fn create(
        pieces: Vec<(Vec<u8>, Vec<String>, Vec<String>)>,
        external: &[ExternalData],
    ) -> Result<Chain, OrtError> {
        let last = pieces.len().saturating_sub(1);
        let mut created = Vec::with_capacity(pieces.len());
        let (mut chain_inputs, mut computed) = (Vec::new(), std::collections::HashSet::new());
        let mut chain_outputs = Vec::new();
        for (i, (graph, inputs, outputs)) in pieces.into_iter().enumerate() {
            let provider =
                Provider::WebGpu { channels_first: true, keep_buffers: false, gpu_outputs: i < last };
            let session =
                Session::create(&Uint8Array::from(graph.as_slice()), external, &provider, false).await?;
            // The chain's inputs: those of its pieces that no piece before them computes.
            for info in session.inputs() {
                if !computed.contains(&info.name)
                    && !chain_inputs.iter().any(|c: &TensorInfo| c.name == info.name)
                {
                    chain_inputs.push(info);
                }
            }
            computed.extend(outputs.iter().cloned());
            chain_outputs = session.outputs();
            let session = RefCell::new(Some(session));
            created.push(ChainPiece { session, graph: Vec::new(), inputs, outputs });
        }
        Ok(Chain { pieces: created, streamed: None, inputs: chain_inputs, outputs: chain_outputs })
    }

    /// A streamed chain of `pieces` on `provider`, taking `inputs` and giving `outputs` as the whole
    /// graph declares them. What the pieces pass each other, and any input, goes between the CPU and
    /// the GPU through staging buffers of at most `staging_bytes`. Only the first piece's session is
    /// made here, for the first run.
    pub async fn streamed(
        pieces: Vec<(Vec<u8>, Vec<String>, Vec<String>)>,
        external: Vec<ExternalData>,
        provider: Provider,
        (inputs, outputs): (Vec<TensorInfo>, Vec<TensorInfo>),
        staging_bytes: u64,
    ) -> Result<Chain, OrtError> {
        let chunk = (staging_bytes.clamp(16, u64::from(u32::MAX)) as u32) & !15;
        let streamed =
            Streamed { external, provider, arrays: RefCell::default(), chunk, uploaded: Cell::new(0) };
        let several = pieces.len() > 1;
        let mut made = Vec::with_capacity(pieces.len());
        for (i, (graph, inputs, outputs)) in pieces.into_iter().enumerate() {
            let session = if i == 0 { Some(streamed.session(&graph, several).await?) } else { None };
            made.push(ChainPiece { session: RefCell::new(session), graph, inputs, outputs });
        }
        Ok(Chain { pieces: made, streamed: Some(streamed), inputs, outputs })
    }

    /// How many values a streamed chain copied to the GPU itself, in chunks, over all its runs (0 for
    /// a resident chain, whose values stay on the GPU).
    pub fn uploaded_values(&self) -> u32 {
        self.streamed.as_ref().map_or(0, |s| s.uploaded.get())
    }

    /// How many pieces.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether it has no pieces.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The chain's declared inputs.
    pub fn inputs(&self) -> Vec<TensorInfo> {
        self.inputs.clone()
    }

    /// The chain's declared outputs, the graph's.
    pub fn outputs(&self) -> Vec<TensorInfo> {
        self.outputs.clone()
    }

    /// Runs the pieces in order on `feeds` and returns the outputs named in `wanted`. A streamed chain
    /// makes each piece's session before it runs and releases the one before.
    pub async fn run(&self, feeds: &[(&str, &Tensor)], wanted: &[&str]) -> Result<Vec<Tensor>, OrtError> {
        let mut held: HashMap<String, Tensor> = HashMap::new();
        for (i, piece) in self.pieces.iter().enumerate() {
            if let Some(streamed) = &self.streamed {
                let before = if i == 0 { self.pieces.last() } else { self.pieces.get(i - 1) };
                if let Some(before) = before.filter(|_| self.pieces.len() > 1) {
                    before.release_session().await?;
                }
                if piece.session.borrow().is_none() {
                    let session = streamed.session(&piece.graph, i + 1 < self.pieces.len()).await?;
                    *piece.session.borrow_mut() = Some(session);
                }
            }
            let mut given = Vec::with_capacity(piece.inputs.len());
            for name in &piece.inputs {
                let fed = feeds.iter().find(|(n, _)| n == name).map(|(_, t)| *t);
                let tensor =
                    fed.or_else(|| held.get(name)).ok_or_else(|| OrtError::MissingOutput(name.clone()))?;
                given.push(tensor);
            }
            // A streamed piece's large inputs go to the GPU through our reused staging buffer (see
            // `Streamed::upload`), and are freed once it has run.
            let mut uploaded = Vec::new();
            if let Some(streamed) = &self.streamed {
                for tensor in &given {
                    uploaded.push(streamed.upload(tensor).await?);
                }
            }
            let inputs = if uploaded.is_empty() { given } else { uploaded.iter().collect() };
            let named: Vec<(&str, &Tensor)> = piece.inputs.iter().map(String::as_str).zip(inputs).collect();
            let names: Vec<&str> = piece.outputs.iter().map(String::as_str).collect();
            // Taken out while it runs: no borrow is held across the await.
            let session = piece.session.borrow_mut().take().ok_or(OrtError::Released)?;
            let outputs = session.run(&named, &names).await;
            *piece.session.borrow_mut() = Some(session);
            for tensor in uploaded.into_iter().filter(|t| t.inner.location() == "gpu-buffer") {
                tensor.dispose();
            }
            let mut outputs = outputs?;
            if let Some(streamed) = &self.streamed {
                for output in outputs.iter_mut().filter(|o| o.inner.location() == "gpu-buffer") {
                    *output = streamed.read_back(output).await?;
                }
            }
            held.extend(piece.outputs.iter().cloned().zip(outputs));
            let later: std::collections::HashSet<&str> =
                self.pieces[i + 1..].iter().flat_map(|p| p.inputs.iter().map(String::as_str)).collect();
            let done: Vec<String> = held
                .keys()
                .filter(|k| !later.contains(k.as_str()) && !wanted.contains(&k.as_str()))
                .cloned()
                .collect();
            for name in done {
                if let Some(tensor) = held.remove(&name) {
                    tensor.dispose();
                }
            }
            JsFuture::from(gpu_work_done()).await?;
        }
        wanted
            .iter()
            .map(|name| held.remove(*name).ok_or_else(|| OrtError::MissingOutput((*name).to_owned())))
            .collect()
    }

    /// Releases every piece's session.
    pub async fn release(self) -> Result<(), OrtError> {
        for piece in &self.pieces {
            piece.release_session().await?;
        }
        Ok(())
    }
}

impl ChainPiece {
    async fn release_session(&self) -> Result<(), OrtError> {
        let session = self.session.borrow_mut().take();
        if let Some(session) = session {
            session.release().await?;
            // The GPU's copies of its weights are freed once the GPU has caught up.
            JsFuture::from(gpu_work_done()).await?;
        }
        Ok(())
    }
}

impl Streamed {
    /// A piece's session; with `gpu_outputs` its outputs stay on the GPU for [`Streamed::read_back`].
    async fn session(&self, graph: &[u8], gpu_outputs: bool) -> Result<Session, OrtError> {
        let mut provider = self.provider.clone();
        if let Provider::WebGpu { gpu_outputs: on_gpu, .. } = &mut provider {
            *on_gpu = gpu_outputs;
        }
        Session::create(&Uint8Array::from(graph), &self.external, &provider, false).await
    }

    /// `tensor` on ORT's device when it is larger than the staging chunk, copied a chunk at a time:
    /// ORT's own upload maps a staging buffer the size of the value, and Chromium keeps that much
    /// shared memory in the renderer until the worker ends. Any other tensor comes back as it is.
    async fn upload(&self, tensor: &Tensor) -> Result<Tensor, OrtError> {
        let inner: JsTensor = JsFuture::from(upload(&tensor.inner, self.chunk)).await?.unchecked_into();
        if inner.location() == "gpu-buffer" {
            self.uploaded.set(self.uploaded.get() + 1);
        }
        Ok(Tensor { inner, name: tensor.name.clone() })
    }

    /// `tensor` on the CPU: an output left on the GPU read back into the chain's array for its name
    /// (made again only when too small), before its session goes.
    async fn read_back(&self, tensor: &Tensor) -> Result<Tensor, OrtError> {
        let reuse = self.arrays.borrow().get(&tensor.name).cloned().unwrap_or(JsValue::UNDEFINED);
        let inner: JsTensor =
            JsFuture::from(read_back(&tensor.inner, &reuse, self.chunk)).await?.unchecked_into();
        let array = Reflect::get(&inner.data(), &"buffer".into())?;
        self.arrays.borrow_mut().insert(tensor.name.clone(), array);
        Ok(Tensor { inner, name: tensor.name.clone() })
    }
}

/// A CPU tensor.
pub struct Tensor {
    inner: JsTensor,
    name: String,
}

impl Tensor {
    fn build(dtype: &'static str, data: JsValue, dims: &[i64]) -> Result<Tensor, OrtError> {
        let shape: Array = dims.iter().map(|&d| JsValue::from_f64(d as f64)).collect();
        let inner = JsTensor::new(dtype, &data, &shape)?;
        Ok(Tensor { inner, name: String::from("input") })
    }

    /// A float32 tensor holding a copy of `data`.
    pub fn from_f32(data: &[f32], dims: &[i64]) -> Result<Tensor, OrtError> {
        Self::build("float32", Float32Array::from(data).into(), dims)
    }

    /// A float16 tensor from raw half-precision bits.
    pub fn from_f16_bits(bits: &[u16], dims: &[i64]) -> Result<Tensor, OrtError> {
        Self::build("float16", Uint16Array::from(bits).into(), dims)
    }

    /// A tensor of `elem_type` from its little-endian bytes, as an ONNX file stores them.
    pub fn from_bytes(elem_type: ElemType, bytes: &[u8], dims: &[i64]) -> Result<Tensor, OrtError> {
        // A fresh buffer, so every view starts aligned.
        let buffer = Uint8Array::from(bytes).buffer();
        let data: JsValue = match elem_type {
            ElemType::Float32 => Float32Array::new(&buffer).into(),
            ElemType::Uint8 => Uint8Array::new(&buffer).into(),
            ElemType::Int8 => Int8Array::new(&buffer).into(),
            ElemType::Int32 => Int32Array::new(&buffer).into(),
            ElemType::Int64 => BigInt64Array::new(&buffer).into(),
            ElemType::Float16 => Uint16Array::new(&buffer).into(),
        };
        Self::build(elem_type.ort_name(), data, dims)
    }

    /// An int64 tensor.
    pub fn from_i64(data: &[i64], dims: &[i64]) -> Result<Tensor, OrtError> {
        Self::build("int64", BigInt64Array::from(data).into(), dims)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        DType::from_name(&self.inner.dtype())
    }

    /// The shape.
    pub fn dims(&self) -> Vec<i64> {
        self.inner.dims().iter().map(|d| d.as_f64().unwrap_or(-1.0) as i64).collect()
    }

    /// The values as float32, converting from float16 where needed.
    pub fn to_f32(&self) -> Result<Vec<f32>, OrtError> {
        let data = self.inner.data();
        match self.dtype() {
            DType::Float32 => Ok(data.unchecked_into::<Float32Array>().to_vec()),
            DType::Float16 => {
                Ok(self.f16_bits()?.into_iter().map(|b| half::f16::from_bits(b).to_f32()).collect())
            }
            other => Err(self.wrong_type(other, "float32 or float16")),
        }
    }

    /// The raw half-precision bits of a float16 tensor (ORT may hand back a `Float16Array`).
    pub fn f16_bits(&self) -> Result<Vec<u16>, OrtError> {
        let dtype = self.dtype();
        if dtype != DType::Float16 {
            return Err(self.wrong_type(dtype, "float16"));
        }
        let data = self.inner.data();
        let buffer = Reflect::get(&data, &"buffer".into())?;
        let offset = Reflect::get(&data, &"byteOffset".into())?.as_f64().unwrap_or(0.0) as u32;
        let length = Reflect::get(&data, &"length".into())?.as_f64().unwrap_or(0.0) as u32;
        Ok(Uint16Array::new_with_byte_offset_and_length(&buffer, offset, length).to_vec())
    }

    fn wrong_type(&self, found: DType, expected: &'static str) -> OrtError {
        OrtError::WrongType { name: self.name.clone(), found: found.name().to_owned(), expected }
    }

    /// Frees the tensor's data now rather than at garbage collection.
    pub fn dispose(self) {
        self.inner.dispose();
    }
}

fn set(target: &Object, key: &str, value: &JsValue) {
    // Setting a property on a plain object we just created cannot fail.
    let _ = Reflect::set(target, &key.into(), value);
}

fn value_infos(metadata: &Array) -> Vec<TensorInfo> {
    metadata
        .iter()
        .map(|item| {
            let get = |key: &str| Reflect::get(&item, &key.into()).unwrap_or(JsValue::UNDEFINED);
            let shape = get("shape");
            let shape = if Array::is_array(&shape) {
                Array::from(&shape)
                    .iter()
                    .map(|d| match d.as_f64() {
                        Some(n) => Dim::Fixed(n as i64),
                        None => Dim::Symbolic(d.as_string().unwrap_or_default()),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            TensorInfo {
                name: get("name").as_string().unwrap_or_default(),
                dtype: DType::from_name(&get("type").as_string().unwrap_or_default()),
                shape,
            }
        })
        .collect()
}
