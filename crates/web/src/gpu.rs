//! What the WebGPU adapter offers, checked before a download and before each stage loads.
//!
//! ORT opens the device itself, one per stage worker; terminating the worker frees it (ORT Web does
//! not give GPU memory back on `release()` alone).

use js_sys::{Function, Reflect};
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

use crate::js::{get, JsError, Obj};

/// What keeps this browser or GPU from running a pack on WebGPU; each message says what to do.
#[derive(Debug, Error)]
pub enum GpuError {
    #[error(
        "WebGPU is not available in this browser (navigator.gpu is missing). Use a browser with WebGPU, or \
         choose the wasm backend."
    )]
    NoWebGpu,
    #[error("requesting a WebGPU adapter failed: {0}")]
    Adapter(JsError),
    #[error("no WebGPU adapter is available on this device. Choose the wasm backend instead.")]
    NoAdapter,
    /// `what` (a graph, or the model) uses float16 and the adapter lacks `shader-f16`.
    #[error("{what} uses float16, but {NO_F16}")]
    NoF16 { what: String },
    /// A tensor larger than a buffer may be on this GPU.
    #[error("the model has a {largest_tensor}-byte tensor, but this GPU's {limit} is {available} bytes")]
    Limit { limit: &'static str, largest_tensor: u64, available: u64 },
}

/// Checks that this adapter can run `graph` before ORT opens its device for it: a float16 graph
/// (`needs_f16`) without the adapter's `shader-f16` would fail (native EP) or silently compute zeros.
pub async fn check_stage(needs_f16: bool, graph: &str) -> Result<(), GpuError> {
    let adapter = adapter().await?;
    if needs_f16 && !has_feature(&adapter, "shader-f16") {
        return Err(GpuError::NoF16 { what: graph.to_owned() });
    }
    Ok(())
}

const NO_F16: &str = "this GPU's WebGPU adapter does not support shader-f16. Use a GPU and browser \
                       with shader-f16, or choose the wasm backend (much slower).";

/// The WebGPU adapter, or what is missing.
async fn adapter() -> Result<JsValue, GpuError> {
    let gpu = get(&get(&js_sys::global(), "navigator"), "gpu");
    if gpu.is_undefined() {
        return Err(GpuError::NoWebGpu);
    }
    let options = Obj::new().set("powerPreference", "high-performance").build();
    let adapter = call_async(&gpu, "requestAdapter", &options).await.map_err(GpuError::Adapter)?;
    if adapter.is_null() || adapter.is_undefined() {
        return Err(GpuError::NoAdapter);
    }
    Ok(adapter)
}

/// Checks, without opening a device, that this GPU can run a pack whose graphs need `shader-f16`
/// (`needs_f16`) and whose largest tensor is `largest_tensor` bytes. Says what is missing otherwise.
pub async fn check_device(needs_f16: bool, largest_tensor: u64) -> Result<(), GpuError> {
    let adapter = adapter().await?;
    if needs_f16 && !has_feature(&adapter, "shader-f16") {
        return Err(GpuError::NoF16 { what: "the model".into() });
    }
    let limits = get(&adapter, "limits");
    for limit in ["maxBufferSize", "maxStorageBufferBindingSize"] {
        let available = get(&limits, limit).as_f64().unwrap_or(0.0) as u64;
        if available < largest_tensor {
            return Err(GpuError::Limit { limit, largest_tensor, available });
        }
    }
    Ok(())
}

fn has_feature(adapter: &JsValue, name: &str) -> bool {
    let features = get(adapter, "features");
    Reflect::get(&features, &"has".into())
        .ok()
        .and_then(|has| has.unchecked_into::<Function>().call1(&features, &name.into()).ok())
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
}

async fn call_async(target: &JsValue, method: &str, argument: &JsValue) -> Result<JsValue, JsError> {
    let function: Function = get(target, method).unchecked_into();
    let promise = function.call1(target, argument)?;
    Ok(JsFuture::from(js_sys::Promise::from(promise)).await?)
}
