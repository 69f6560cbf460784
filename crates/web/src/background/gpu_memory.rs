//! The GPU memory budget, for the service worker: the user's setting (`imagine.gpuMemory`), the probe
//! of this GPU (`imagine.gpuProbe`, made once per adapter, when nothing of Imagine is loaded on it),
//! and what the pages need to say which sizes fit (`gpuMemory`). Setting or measuring the budget again
//! forgets what a failed plan taught the offscreen document (`opfs::learned`).

use imagine_core::api::{GpuMemoryRequest, GpuMemoryStatus};
use imagine_core::gpu_memory::{self, GpuMemorySetting, Probe};
use imagine_core::Backend;

use crate::background::service_worker::{loaded_stages, set_keep_loaded, ServiceWorkerError};
use crate::platform::gpu;
use crate::platform::js::LogError;
use crate::platform::opfs;
use crate::platform::storage;

/// `gpuMemory`: sets the setting if given, probes again if asked, and says what is in force.
pub async fn status(request: GpuMemoryRequest) -> Result<GpuMemoryStatus, ServiceWorkerError> {
    if let Some(setting) = request.setting {
        storage::GPU_MEMORY.set(&setting.checked()?).await?;
        // A new budget is tried afresh, whatever failed under the old one.
        opfs::learned::forget().await?;
        // What is loaded was loaded under the old budget: the next job loads what the new one allows.
        if !loaded_stages().await.is_empty() {
            set_keep_loaded(Some(0)).await?;
            set_keep_loaded(None).await?;
        }
    }
    let setting = storage::GPU_MEMORY.get().await.unwrap_or_default();
    let probe =
        if request.measure { measure(request.probe_cap_bytes).await? } else { known_probe(setting).await };
    let facts = gpu::memory_facts().await;
    Ok(GpuMemoryStatus { setting, budget: gpu_memory::budget(setting, probe.as_ref()), probe, facts })
}

/// The budget of a job on `backend`: `None` where there is no known limit (and always on the CPU).
pub async fn job_budget(backend: Backend) -> Option<u64> {
    if backend != Backend::WebGpu {
        return None;
    }
    let setting = storage::GPU_MEMORY.get().await.unwrap_or_default();
    gpu_memory::budget(setting, known_probe(setting).await.as_ref())
}

/// The probe of this GPU: the stored one if it was made on this adapter; else, where the setting is
/// Auto and nothing of Imagine is loaded (which the probe would count as taken), a new one.
async fn known_probe(setting: GpuMemorySetting) -> Option<Probe> {
    let report = gpu::device_report().await.ok()?;
    let stored = storage::GPU_PROBE.get().await.filter(|p| p.adapter == report.adapter_id());
    if stored.is_some() || setting != GpuMemorySetting::Auto || !loaded_stages().await.is_empty() {
        return stored;
    }
    let probe = gpu::probe_memory(&report, None).await.log_error("probing the GPU's memory")?;
    storage::GPU_PROBE.set_or_log(&probe).await;
    Some(probe)
}

/// Probes the GPU again, the stages kept loaded unloaded first (and kept again after).
async fn measure(cap: Option<u64>) -> Result<Option<Probe>, ServiceWorkerError> {
    let report = gpu::device_report().await?;
    let unloaded = !loaded_stages().await.is_empty();
    if unloaded {
        set_keep_loaded(Some(0)).await?;
    }
    let probe = gpu::probe_memory(&report, cap).await;
    if unloaded {
        set_keep_loaded(None).await?;
    }
    let probe = probe?;
    storage::GPU_PROBE.set(&probe).await?;
    opfs::learned::forget().await?;
    Ok(Some(probe))
}
