//! What the WebGPU adapter offers, checked before a download and before each stage loads.
//!
//! ORT opens the device itself, one per stage worker (asking for the adapter's limits and `shader-f16`
//! where present); terminating the worker frees it, as ORT Web does not give GPU memory back on
//! `release()` alone.

use js_sys::{Function, Promise, Reflect};
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

use imagine_core::device_verdict::{software_renderer, AdapterFacts};
use imagine_core::gpu_memory::{MemoryFacts, Precision, Probe, ProbeFound, StageWeights, PROBE_CAP_BYTES};
use imagine_core::graph::Limits;

use crate::platform::js::{get, JsError};

/// What keeps this browser or GPU from running a pack on WebGPU; each message says what to do.
#[derive(Debug, Error)]
pub enum GpuError {
    /// `navigator.gpu` is missing: no WebGPU in this browser or context.
    #[error(
        "WebGPU is not available in this browser (navigator.gpu is missing). Use a browser with WebGPU, or \
         choose the wasm backend."
    )]
    NoWebGpu,
    /// `requestAdapter` threw or rejected.
    #[error("requesting a WebGPU adapter failed: {0}")]
    Adapter(JsError),
    /// `requestAdapter` answered `null` for every power preference.
    #[error("no WebGPU adapter is available on this device. Choose the wasm backend instead.")]
    NoAdapter,
    /// `what` (a graph) uses float16, the adapter lacks `shader-f16`, and the installed pack has no
    /// float32 conversion for this adapter.
    #[error("{what} uses float16, but {NO_F16}")]
    NoF16 {
        /// The graph's file name.
        what: String,
    },
    /// A tensor larger than a buffer may be on this GPU.
    #[error("the model has a {largest_tensor}-byte tensor, but this GPU's {limit} is {available} bytes")]
    Limit {
        /// The WebGPU limit's name: `maxBufferSize` or `maxStorageBufferBindingSize`.
        limit: &'static str,
        /// The model's largest tensor, in bytes.
        largest_tensor: u64,
        /// The adapter's value of that limit, in bytes.
        available: u64,
    },
}

const NO_F16: &str = "this GPU's WebGPU adapter does not support shader-f16 and the installed pack was not \
                       converted to float32 for it (it was installed for the wasm backend, or converted for a GPU \
                       with other limits). Install the pack again for this GPU, or choose the wasm backend.";

#[wasm_bindgen(module = "/src/platform/gpu_adapter.js")]
extern "C" {
    #[wasm_bindgen(catch, js_name = requestAnyAdapter)]
    fn request_any_adapter(gpu: &JsValue) -> Result<Promise, JsValue>;

    #[wasm_bindgen(catch, js_name = probeMemory)]
    fn probe_memory_js(gpu: &JsValue, cap_bytes: f64, chunk_bytes: f64) -> Result<Promise, JsValue>;

    /// Makes every `requestAdapter` in this global, ONNX Runtime's too, try each power preference
    /// (`gpu_adapter.js`). The stage workers call it before ORT opens its device.
    #[wasm_bindgen(js_name = findAnyAdapter)]
    pub fn find_any_adapter();

    /// Makes every `requestDevice` in this global, ONNX Runtime's, leave out
    /// `chromium-experimental-subgroup-matrix` where ORT's subgroup-matrix WGSL does not compile
    /// (`gpu_adapter.js`). The stage workers call it before ORT opens its device.
    #[wasm_bindgen(js_name = openDevicesOrtCanUse)]
    pub fn open_devices_ort_can_use();
}

/// The WebGPU adapter and the power preference that found it (`high-performance`, `default` or
/// `low-power`, tried in that order), or what is missing.
async fn adapter() -> Result<(JsValue, String), GpuError> {
    let gpu = get(&get(&js_sys::global(), "navigator"), "gpu");
    if gpu.is_undefined() {
        return Err(GpuError::NoWebGpu);
    }
    let found = request_any_adapter(&gpu).map_err(|e| GpuError::Adapter(e.into()))?;
    let found = JsFuture::from(found).await.map_err(|e| GpuError::Adapter(e.into()))?;
    let adapter = get(&found, "adapter");
    if adapter.is_null() || adapter.is_undefined() {
        return Err(GpuError::NoAdapter);
    }
    Ok((adapter, get(&found, "powerPreference").as_string().unwrap_or_default()))
}

/// What the WebGPU adapter offers that decides how a pack runs.
#[derive(Debug, Clone, Copy)]
pub struct AdapterInfo {
    /// `shader-f16`: float16 graphs run as they are; without it they are converted to float32.
    pub has_f16: bool,
    /// The buffer limits every tensor must fit.
    pub limits: Limits,
    /// The adapter runs on the CPU (a fallback adapter, SwiftShader, llvmpipe).
    pub cpu_backed: bool,
}

/// The adapter's features and limits, without opening a device.
pub async fn adapter_info() -> Result<AdapterInfo, GpuError> {
    let (adapter, _) = adapter().await?;
    let info = get(&adapter, "info");
    let text = |key| get(&info, key).as_string().unwrap_or_default();
    let cpu_backed = get(&info, "isFallbackAdapter").as_bool() == Some(true)
        || text("architecture") == "swiftshader"
        || text("description").contains("llvmpipe");
    Ok(AdapterInfo {
        has_f16: has_feature(&adapter, "shader-f16"),
        limits: buffer_limits(&adapter),
        cpu_backed,
    })
}

/// Checks that a tensor of `largest_tensor` bytes fits this adapter's buffers; says which limit does
/// not otherwise.
pub fn check_limits(limits: Limits, largest_tensor: u64) -> Result<(), GpuError> {
    for (limit, available) in [
        ("maxBufferSize", limits.max_buffer_size),
        ("maxStorageBufferBindingSize", limits.max_storage_buffer_binding_size),
    ] {
        if available < largest_tensor {
            return Err(GpuError::Limit { limit, largest_tensor, available });
        }
    }
    Ok(())
}

/// What the options page reports about this device before anything is downloaded.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceReport {
    /// `GPUAdapterInfo.vendor` (may be empty, as each of these three).
    pub vendor: String,
    /// `GPUAdapterInfo.architecture`.
    pub architecture: String,
    /// `GPUAdapterInfo.description`.
    pub description: String,
    /// The power preference that found it: `high-performance`, `default` (none) or `low-power`.
    pub power_preference: String,
    /// The adapter has `shader-f16` (float16 graphs run as they are).
    pub shader_f16: bool,
    /// The adapter's `maxBufferSize`, in bytes.
    pub max_buffer_size: u64,
    /// The adapter's `maxStorageBufferBindingSize`, in bytes.
    pub max_storage_buffer_binding_size: u64,
    /// The software renderer the adapter is (SwiftShader, llvmpipe), if it is one.
    pub software_renderer: Option<String>,
}

impl DeviceReport {
    /// The adapter's name as a probe records it: another GPU is probed anew. Firefox names no adapter
    /// (vendor, architecture and description all empty): there its features and limits stand for the
    /// name, so a GPU with other ones is probed anew too.
    pub fn adapter_id(&self) -> String {
        let named = [&self.vendor, &self.architecture, &self.description].map(|s| s.as_str()).join(" ");
        if !named.trim().is_empty() {
            return named.trim().to_owned();
        }
        format!(
            "unnamed adapter (shader-f16: {}, maxBufferSize {}, maxStorageBufferBindingSize {})",
            self.shader_f16, self.max_buffer_size, self.max_storage_buffer_binding_size
        )
    }

    /// What decides the device verdict (`imagine_core::device_verdict`).
    pub fn facts(&self) -> AdapterFacts {
        AdapterFacts { shader_f16: self.shader_f16, software_renderer: self.software_renderer.clone() }
    }
}

/// The adapter's identity, `shader-f16` and the buffer limits that decide which packs fit.
pub async fn device_report() -> Result<DeviceReport, GpuError> {
    let (adapter, power_preference) = adapter().await?;
    let info = get(&adapter, "info");
    let text = |key| get(&info, key).as_string().unwrap_or_default();
    let limits = buffer_limits(&adapter);
    Ok(DeviceReport {
        vendor: text("vendor"),
        architecture: text("architecture"),
        description: text("description"),
        power_preference,
        shader_f16: has_feature(&adapter, "shader-f16"),
        max_buffer_size: limits.max_buffer_size,
        max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
        software_renderer: software_renderer(
            &text("architecture"),
            &text("description"),
            get(&info, "isFallbackAdapter").as_bool() == Some(true),
        ),
    })
}

fn buffer_limits(adapter: &JsValue) -> Limits {
    let limits = get(adapter, "limits");
    let limit = |name| get(&limits, name).as_f64().unwrap_or(0.0) as u64;
    Limits {
        max_storage_buffer_binding_size: limit("maxStorageBufferBindingSize"),
        max_buffer_size: limit("maxBufferSize"),
    }
}

fn has_feature(adapter: &JsValue, name: &str) -> bool {
    let features = get(adapter, "features");
    Reflect::get(&features, &"has".into())
        .ok()
        .and_then(|has| has.unchecked_into::<Function>().call1(&features, &name.into()).ok())
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
}

/// The buffers the memory probe allocates: small enough to come close to what is free, large enough
/// to take few round trips.
const PROBE_CHUNK_BYTES: u64 = 256 << 20;

/// How much GPU memory one device can hold now (`gpu_adapter.js`'s `probeMemory`), up to
/// [`PROBE_CAP_BYTES`] or `cap`. A software renderer's "GPU memory" is the computer's own, which the
/// probe must not fill: it is said to be unknown there, unless a test gives a `cap`.
pub async fn probe_memory(report: &DeviceReport, cap: Option<u64>) -> Result<Probe, GpuError> {
    let adapter = report.adapter_id();
    if report.software_renderer.is_some() && cap.is_none() {
        return Ok(Probe { adapter, found: ProbeFound::Unknown });
    }
    let gpu = get(&get(&js_sys::global(), "navigator"), "gpu");
    let cap = cap.unwrap_or(PROBE_CAP_BYTES).min(PROBE_CAP_BYTES);
    let probing = probe_memory_js(&gpu, cap as f64, PROBE_CHUNK_BYTES as f64)
        .map_err(|e| GpuError::Adapter(e.into()))?;
    let held = JsFuture::from(probing).await.map_err(|e| GpuError::Adapter(e.into()))?;
    let bytes = get(&held, "heldBytes").as_f64().unwrap_or(0.0) as u64;
    let found = if get(&held, "refused").as_bool() == Some(true) {
        ProbeFound::Refused { bytes }
    } else {
        ProbeFound::Plenty { bytes }
    };
    Ok(Probe { adapter, found })
}

/// What a memory plan needs to know of this device and pack: each stage's weights (the installed
/// pack's, else the published pack's) and how the graphs compute (float16 only with `shader-f16`).
pub async fn memory_facts() -> MemoryFacts {
    let weights = match crate::platform::opfs::installed_pack().await {
        Some((record, _)) => StageWeights::of_files(record.files.iter().map(|f| (f.path.as_str(), f.size))),
        None => StageWeights::PUBLISHED,
    };
    let precision = match adapter_info().await {
        Ok(adapter) if adapter.has_f16 => Precision::Float16,
        _ => Precision::Float32,
    };
    MemoryFacts { weights, precision }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(vendor: &str, description: &str, max_buffer_size: u64) -> DeviceReport {
        DeviceReport {
            vendor: vendor.to_owned(),
            architecture: String::new(),
            description: description.to_owned(),
            power_preference: "high-performance".to_owned(),
            shader_f16: true,
            max_buffer_size,
            max_storage_buffer_binding_size: 1 << 30,
            software_renderer: None,
        }
    }

    #[test]
    fn an_adapter_is_known_by_its_names_or_where_it_has_none_by_its_features_and_limits() {
        assert_eq!(report("nvidia", "NVIDIA H200", 1 << 32).adapter_id(), "nvidia  NVIDIA H200");
        let unnamed = report("", "", 1 << 30).adapter_id();
        assert_eq!(
            unnamed,
            "unnamed adapter (shader-f16: true, maxBufferSize 1073741824, maxStorageBufferBindingSize 1073741824)"
        );
        assert_ne!(unnamed, report("", "", 1 << 31).adapter_id(), "another GPU, another probe");
    }
}
