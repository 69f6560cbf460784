//! The WebGPU device of one stage worker.
//!
//! Each stage opens its own device and destroys it when the stage ends: ORT Web does not give GPU memory
//! back on `release()` alone, and a device cannot be shared across workers anyway.

use js_sys::{Array, Function, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

use crate::js::{error_text, get, Obj};

/// Limits ORT's WebGPU EP benefits from; we ask for the adapter's maximum of each.
const LIMITS: &[&str] = &[
    "maxBufferSize",
    "maxStorageBufferBindingSize",
    "maxComputeWorkgroupStorageSize",
    "maxComputeInvocationsPerWorkgroup",
    "maxComputeWorkgroupSizeX",
    "maxComputeWorkgroupSizeY",
    "maxComputeWorkgroupSizeZ",
    "maxComputeWorkgroupsPerDimension",
    "maxStorageBuffersPerShaderStage",
];

/// An open `GPUDevice`.
pub struct Device(JsValue);

impl Device {
    /// Opens a device. `needs_f16` is true when the graph about to load uses float16: without the
    /// adapter's `shader-f16` that would fail (native EP) or silently compute zeros (JSEP), so refuse.
    pub async fn open(needs_f16: bool, graph: &str) -> Result<Device, String> {
        let adapter = adapter().await?;
        let has_f16 = has_feature(&adapter, "shader-f16");
        if needs_f16 && !has_f16 {
            return Err(format!("{graph} uses float16, but {NO_F16}"));
        }
        let features = Array::new();
        if has_f16 {
            features.push(&"shader-f16".into());
        }
        let adapter_limits = get(&adapter, "limits");
        let limits =
            LIMITS.iter().fold(Obj::new(), |limits, name| limits.set(name, get(&adapter_limits, name)));
        let descriptor =
            Obj::new().set("requiredFeatures", features).set("requiredLimits", limits.build()).build();
        let device = call_async(&adapter, "requestDevice", &descriptor)
            .await
            .map_err(|e| format!("opening the WebGPU device failed: {e}"))?;
        Ok(Device(device))
    }

    /// The `GPUDevice`, for ORT's execution-provider options.
    pub fn js(&self) -> &JsValue {
        &self.0
    }

    /// Destroys the device, freeing everything allocated on it.
    pub fn destroy(self) {
        if let Ok(destroy) = Reflect::get(&self.0, &"destroy".into()) {
            let _ = destroy.unchecked_into::<Function>().call0(&self.0);
        }
    }
}

const NO_F16: &str = "this GPU's WebGPU adapter does not support shader-f16. Use a GPU and browser \
                       with shader-f16, or choose the wasm backend (much slower).";

/// The WebGPU adapter, or what is missing.
async fn adapter() -> Result<JsValue, String> {
    let gpu = get(&get(&js_sys::global(), "navigator"), "gpu");
    if gpu.is_undefined() {
        return Err("WebGPU is not available in this browser (navigator.gpu is missing). \
                    Use a browser with WebGPU, or choose the wasm backend."
            .into());
    }
    let options = Obj::new().set("powerPreference", "high-performance").build();
    let adapter = call_async(&gpu, "requestAdapter", &options)
        .await
        .map_err(|e| format!("requesting a WebGPU adapter failed: {e}"))?;
    if adapter.is_null() || adapter.is_undefined() {
        return Err("no WebGPU adapter is available on this device. Choose the wasm backend instead.".into());
    }
    Ok(adapter)
}

/// Checks, without opening a device, that this GPU can run a pack whose graphs need `shader-f16`
/// (`needs_f16`) and whose largest tensor is `largest_tensor` bytes. Says what is missing otherwise.
pub async fn check_device(needs_f16: bool, largest_tensor: u64) -> Result<(), String> {
    let adapter = adapter().await?;
    if needs_f16 && !has_feature(&adapter, "shader-f16") {
        return Err(format!("the model uses float16, but {NO_F16}"));
    }
    let limits = get(&adapter, "limits");
    for limit in ["maxBufferSize", "maxStorageBufferBindingSize"] {
        let available = get(&limits, limit).as_f64().unwrap_or(0.0) as u64;
        if available < largest_tensor {
            return Err(format!(
                "the model has a {largest_tensor}-byte tensor, but this GPU's {limit} is {available} bytes"
            ));
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

async fn call_async(target: &JsValue, method: &str, argument: &JsValue) -> Result<JsValue, String> {
    let function: Function = get(target, method).unchecked_into();
    let promise = function.call1(target, argument).map_err(|e| error_text(&e))?;
    JsFuture::from(js_sys::Promise::from(promise)).await.map_err(|e| error_text(&e))
}
