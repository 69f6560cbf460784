//! The core's whole pipeline, natively, with the three graphs run by another process over stdin/stdout
//! (`tools/gpu-bench/bench.mjs`, on ONNX Runtime Web), so the rest is exactly the extension's code.
//!
//! ```text
//! stdio_pipeline --pack DIR --tokenizer-dir DIR --request JSON --plan none,transformer,transformer --out DIR
//! ```
//!
//! `--plan`: per image, the stages kept loaded after it (`none`, `transformer` or `all`). Frames, both
//! ways: a little-endian u32 header length, a JSON header, then the payload bytes it announces. To the
//! runtime: `open {graph}`, `run {graph, feeds, fetches}`, `close {graph, keep}`, `mark {what, image,
//! ...}`; from it `{ok: true, ...}` or `{ok: false, error}`. Writes `OUT/image-<i>.png` and
//! `OUT/core-trace.json`.

use std::collections::HashSet;
use std::future::Future;
use std::io::{self, Read, Write};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use half::f16;
use imagine_core::api::GenerateRequest;
use imagine_core::pack::{self, Graph};
use imagine_core::{
    decode, denoise, encode_image, encode_prompt, DType, DenoiseParams, Dim, EncodedPrompt, GenerateParams,
    PromptEncoder, Session, SessionError, Tensor, TensorData, TensorInfo,
};
use serde_json::{json, Value};

/// Polls a future to completion. The bridge session blocks inside `run`, so every future here is
/// ready on its first poll; the loop is only for form.
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

/// One framed connection to the runtime process.
struct Wire {
    input: io::StdinLock<'static>,
    output: io::StdoutLock<'static>,
}

impl Wire {
    fn send(&mut self, header: &Value, payload: &[&[u8]]) -> io::Result<()> {
        let mut header = header.clone();
        let total: usize = payload.iter().map(|p| p.len()).sum();
        if let Some(h) = header.as_object_mut() {
            h.insert("bytes".into(), total.into());
        }
        let text = header.to_string();
        self.output.write_all(&(text.len() as u32).to_le_bytes())?;
        self.output.write_all(text.as_bytes())?;
        for part in payload {
            self.output.write_all(part)?;
        }
        self.output.flush()
    }

    fn receive(&mut self) -> io::Result<(Value, Vec<u8>)> {
        let mut len = [0u8; 4];
        self.input.read_exact(&mut len)?;
        let mut text = vec![0u8; u32::from_le_bytes(len) as usize];
        self.input.read_exact(&mut text)?;
        let header: Value = serde_json::from_slice(&text).map_err(io::Error::other)?;
        let size = header.get("bytes").and_then(Value::as_u64).unwrap_or(0) as usize;
        let mut payload = vec![0u8; size];
        self.input.read_exact(&mut payload)?;
        Ok((header, payload))
    }

    /// Sends a request and returns the reply, or the runtime's error.
    fn call(&mut self, header: &Value, payload: &[&[u8]]) -> Result<(Value, Vec<u8>), String> {
        self.send(header, payload).map_err(|e| format!("writing to the runtime: {e}"))?;
        let (reply, bytes) = self.receive().map_err(|e| format!("reading from the runtime: {e}"))?;
        if reply.get("ok") == Some(&Value::Bool(true)) {
            Ok((reply, bytes))
        } else {
            Err(reply.get("error").and_then(Value::as_str).unwrap_or("the runtime failed").to_owned())
        }
    }
}

fn dtype_of(name: &str) -> DType {
    match name {
        "float32" => DType::Float32,
        "float16" => DType::Float16,
        "int64" => DType::Int64,
        other => DType::Other(other.to_owned()),
    }
}

fn infos(value: &Value) -> Vec<TensorInfo> {
    let list = value.as_array().cloned().unwrap_or_default();
    list.iter()
        .map(|v| TensorInfo {
            name: v["name"].as_str().unwrap_or_default().to_owned(),
            dtype: dtype_of(v["dtype"].as_str().unwrap_or_default()),
            shape: v["shape"]
                .as_array()
                .map(|dims| {
                    dims.iter()
                        .map(|d| match d.as_i64() {
                            Some(n) => Dim::Fixed(n),
                            None => Dim::Symbolic(d.as_str().unwrap_or_default().to_owned()),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect()
}

fn tensor_bytes(tensor: &Tensor) -> Vec<u8> {
    match &tensor.data {
        TensorData::Float32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorData::Float16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorData::Int64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

fn tensor_from(dtype: &str, dims: Vec<i64>, bytes: &[u8]) -> Result<Tensor, SessionError> {
    let data = match dtype {
        "float32" => TensorData::Float32(
            bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect(),
        ),
        "float16" => TensorData::Float16(
            bytes.chunks_exact(2).map(|b| f16::from_le_bytes(b.try_into().expect("2 bytes"))).collect(),
        ),
        "int64" => TensorData::Int64(
            bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect(),
        ),
        other => return Err(SessionError(format!("the runtime returned a {other} tensor"))),
    };
    Ok(Tensor { dims, data })
}

/// A graph opened by the runtime process.
struct Remote<'w> {
    wire: &'w mut Wire,
    graph: Graph,
    inputs: Vec<TensorInfo>,
    outputs: Vec<TensorInfo>,
    /// Milliseconds spent waiting for `run` replies (the runtime's run, plus the pipe).
    waited_ms: f64,
}

impl<'w> Remote<'w> {
    /// Asks the runtime to load `graph` from `pack`. The external-data files and whether the graph
    /// needs `shader-f16` come from the core's own reading of the graph, as in the stage worker.
    fn open(wire: &'w mut Wire, pack: &str, graph: Graph) -> Result<Self, String> {
        let name = graph.file_name();
        let path = format!("{pack}/{name}");
        let bytes = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
        let external: Vec<Value> = pack::external_data_locations(&bytes)
            .map_err(|e| format!("{name}: {e}"))?
            .into_iter()
            .map(|f| json!({"path": f.location, "file": f.file}))
            .collect();
        let needs_f16 = pack::declares_float16(&bytes).map_err(|e| format!("{name}: {e}"))?;
        let header = json!({"op": "open", "graph": name, "external": external, "needs_f16": needs_f16});
        let (reply, _) = wire.call(&header, &[])?;
        Ok(Remote {
            inputs: infos(&reply["inputs"]),
            outputs: infos(&reply["outputs"]),
            wire,
            graph,
            waited_ms: 0.0,
        })
    }

    fn close(self, keep: bool) -> Result<f64, String> {
        self.wire.call(&json!({"op": "close", "graph": self.graph.file_name(), "keep": keep}), &[])?;
        Ok(self.waited_ms)
    }
}

impl Session for Remote<'_> {
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
        let started = Instant::now();
        let bytes: Vec<Vec<u8>> = feeds.iter().map(|(_, t)| tensor_bytes(t)).collect();
        let described: Vec<Value> = feeds
            .iter()
            .zip(&bytes)
            .map(|((name, t), b)| json!({"name": name, "dtype": t.dtype().name(), "dims": t.dims, "bytes": b.len()}))
            .collect();
        let header =
            json!({"op": "run", "graph": self.graph.file_name(), "feeds": described, "fetches": fetches});
        let parts: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
        let (reply, payload) = self.wire.call(&header, &parts).map_err(SessionError)?;
        let mut outputs = Vec::new();
        let mut at = 0;
        for out in reply["outputs"].as_array().cloned().unwrap_or_default() {
            let len = out["bytes"].as_u64().unwrap_or(0) as usize;
            let dims = out["dims"]
                .as_array()
                .map(|d| d.iter().filter_map(Value::as_i64).collect())
                .unwrap_or_default();
            let slice = payload.get(at..at + len).ok_or_else(|| SessionError("short reply".into()))?;
            outputs.push(tensor_from(out["dtype"].as_str().unwrap_or_default(), dims, slice)?);
            at += len;
        }
        self.waited_ms += started.elapsed().as_secs_f64() * 1e3;
        Ok(outputs)
    }
}

struct Args {
    pack: String,
    tokenizer_dir: String,
    request: String,
    plan: Vec<String>,
    out: String,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        pack: String::new(),
        tokenizer_dir: String::new(),
        request: String::new(),
        plan: vec!["none".into()],
        out: ".".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--pack" => a.pack = value,
            "--tokenizer-dir" => a.tokenizer_dir = value,
            "--request" => a.request = value,
            "--plan" => a.plan = value.split(',').map(str::to_owned).collect(),
            "--out" => a.out = value,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.pack.is_empty() || a.tokenizer_dir.is_empty() || a.request.is_empty() {
        return Err("usage: stdio_pipeline --pack DIR --tokenizer-dir DIR --request JSON [--plan none,transformer,all] [--out DIR]".into());
    }
    Ok(a)
}

fn kept(plan: &str) -> Result<HashSet<Graph>, String> {
    Ok(match plan {
        "none" => HashSet::new(),
        "transformer" => [Graph::Transformer].into(),
        "all" => [Graph::TextEncoder, Graph::Transformer, Graph::Decoder].into(),
        other => return Err(format!("plan entry {other:?}: none, transformer or all")),
    })
}

fn mark(wire: &mut Wire, what: &str, image: usize, extra: Value) -> Result<(), String> {
    let mut header = json!({"op": "mark", "what": what, "image": image});
    if let (Some(h), Some(e)) = (header.as_object_mut(), extra.as_object()) {
        h.extend(e.clone());
    }
    wire.call(&header, &[]).map(|_| ())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("stdio_pipeline: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args = args()?;
    let request: GenerateRequest =
        serde_json::from_str(&args.request).map_err(|e| format!("--request: {e}"))?;
    let params = request.validate(0).map_err(|e| e.to_string())?;
    let (prompt, tokenizer_ms) = encoded(&args, &params)?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out))?;

    let mut wire = Wire { input: io::stdin().lock(), output: io::stdout().lock() };
    let mut images = Vec::new();
    let mut trace = json!({});
    for (i, plan) in args.plan.iter().enumerate() {
        let (image, image_trace) = make_image(&mut wire, &args, &params, &prompt, i, plan)?;
        images.push(image);
        trace = image_trace;
    }
    let summary = json!({
        "params": params,
        "tokenizer_ms": tokenizer_ms,
        "token_count": prompt.token_count,
        "truncated": prompt.truncated,
        "input_ids": prompt.input_ids,
        "attention_mask": prompt.attention_mask,
        "image_tokens": params.image_tokens(),
        "trace": trace,
        "images": images,
    });
    let path = format!("{}/core-trace.json", args.out);
    std::fs::write(&path, serde_json::to_string_pretty(&summary).expect("json"))
        .map_err(|e| format!("{path}: {e}"))?;
    wire.send(&json!({"op": "done"}), &[]).map_err(|e| e.to_string())?;
    Ok(())
}

/// The prompt's token ids, by the extension's tokenizer files, and how long that took (ms).
fn encoded(args: &Args, params: &GenerateParams) -> Result<(EncodedPrompt, f64), String> {
    let read = |name: &str| {
        let path = format!("{}/{name}", args.tokenizer_dir);
        std::fs::read(&path).map_err(|e| format!("{path}: {e}"))
    };
    let started = Instant::now();
    let encoder = PromptEncoder::new(&read("tokenizer.json")?, &read("tokenizer_config.json")?)
        .map_err(|e| e.to_string())?;
    let prompt = encoder.encode(&params.prompt).map_err(|e| e.to_string())?;
    Ok((prompt, started.elapsed().as_secs_f64() * 1e3))
}

/// Image `i`: the three stages over the bridge, the stages `plan` names kept loaded after it; its PNG
/// written; what the summary says of it, and its trace.
fn make_image(
    wire: &mut Wire,
    args: &Args,
    params: &GenerateParams,
    prompt: &EncodedPrompt,
    i: usize,
    plan: &str,
) -> Result<(Value, Value), String> {
    let keep = kept(plan)?;
    mark(wire, "image-start", i, json!({"plan": plan}))?;
    let image_started = Instant::now();
    let mut waited = 0.0;
    let dp = DenoiseParams {
        width: params.width,
        height: params.height,
        steps: params.steps,
        seed: params.seed,
        schedule: params.schedule,
    };

    let mut session = Remote::open(wire, &args.pack, Graph::TextEncoder)?;
    let embeddings = block_on(encode_prompt(&mut session, prompt)).map_err(|e| e.to_string())?;
    waited += session.close(keep.contains(&Graph::TextEncoder))?;

    let mut session = Remote::open(wire, &args.pack, Graph::Transformer)?;
    let denoised = block_on(denoise(&mut session, embeddings, &dp, |_| ())).map_err(|e| e.to_string())?;
    waited += session.close(keep.contains(&Graph::Transformer))?;

    let mut session = Remote::open(wire, &args.pack, Graph::Decoder)?;
    let sample = block_on(decode(&mut session, &denoised.latents, params.width, params.height))
        .map_err(|e| e.to_string())?;
    waited += session.close(keep.contains(&Graph::Decoder))?;

    let png = encode_image(&sample, &params.image(0)).map_err(|e| e.to_string())?;
    let path = format!("{}/image-{i}.png", args.out);
    std::fs::write(&path, &png).map_err(|e| format!("{path}: {e}"))?;
    let total_ms = image_started.elapsed().as_secs_f64() * 1e3;
    let finite = denoised.latents.iter().all(|v| v.is_finite()) && sample.iter().all(|v| v.is_finite());
    mark(
        wire,
        "image-end",
        i,
        json!({"core_total_ms": total_ms, "core_waiting_ms": waited, "png_bytes": png.len(), "finite": finite}),
    )?;
    let image = json!({"plan": plan, "total_ms": total_ms, "waiting_for_runs_ms": waited, "finite": finite});
    let trace = json!({
        "sigmas": denoised.sigmas,
        "noise_first8": &denoised.noise[..8],
        "latents_first8": &denoised.latents[..8],
    });
    Ok((image, trace))
}
