//! The WebGPU device of one stage worker.
//!
//! Each stage opens its own device and destroys it when the stage ends: ORT Web does not give GPU memory
//! back on `release()` alone, and a device cannot be shared across workers anyway.

use js_sys::{Array, Function, Reflect};
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
    #[error("opening the WebGPU device failed: {0}")]
    Device(JsError),
}

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
    pub async fn open(needs_f16: bool, graph: &str) -> Result<Device, GpuError> {
        let adapter = adapter().await?;
        let has_f16 = has_feature(&adapter, "shader-f16");
        if needs_f16 && !has_f16 {
            return Err(GpuError::NoF16 { what: graph.to_owned() });
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
        let device = call_async(&adapter, "requestDevice", &descriptor).await.map_err(GpuError::Device)?;
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

/// What the options page reports about this device before anything is downloaded.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceReport {
    /// `GPUAdapterInfo`: vendor, architecture, description (each may be empty).
    pub vendor: String,
    pub architecture: String,
    pub description: String,
    pub shader_f16: bool,
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
}

/// The adapter's identity, `shader-f16` and the buffer limits that decide which packs fit.
pub async fn device_report() -> Result<DeviceReport, GpuError> {
    let adapter = adapter().await?;
    let info = get(&adapter, "info");
    let text = |key| get(&info, key).as_string().unwrap_or_default();
    let limits = get(&adapter, "limits");
    let limit = |key| get(&limits, key).as_f64().unwrap_or(0.0) as u64;
    Ok(DeviceReport {
        vendor: text("vendor"),
        architecture: text("architecture"),
        description: text("description"),
        shader_f16: has_feature(&adapter, "shader-f16"),
        max_buffer_size: limit("maxBufferSize"),
        max_storage_buffer_binding_size: limit("maxStorageBufferBindingSize"),
    })
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
