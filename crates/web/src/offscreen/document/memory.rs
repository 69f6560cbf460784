//! The job's GPU memory: the plan it is made with, what is learnt when the GPU runs out of memory,
//! and what the failure says.

use super::*;

pub(super) fn out_of_memory_text(
    budget: Option<u64>,
    largest_square: Option<u32>,
    cause: &OffscreenError,
) -> String {
    match budget {
        Some(budget) => format!(
            "The GPU ran out of memory making this image, also when made again with less: Imagine may use {} \
             GB on this GPU now ({cause}). {}",
            gigabytes(budget),
            fits_text(largest_square)
        ),
        None => format!(
            "The GPU ran out of memory making this image, also when made again with less ({cause}). Try a \
             smaller size, or close programs that use the GPU."
        ),
    }
}

pub(super) fn fits_text(largest_square: Option<u32>) -> String {
    match largest_square {
        Some(side) => format!("Sizes up to {side}×{side} fit."),
        None => "No size fits: give Imagine more GPU memory on the options page, or close programs that use \
                 the GPU."
            .into(),
    }
}

/// The budget after the GPU ran out of memory: `budget`, lowered to what a probe finds free now (every
/// stage unloaded) where the browser tells.
pub(super) async fn free_now(budget: Option<u64>) -> Option<u64> {
    let found = match crate::platform::gpu::device_report().await {
        Ok(report) => crate::platform::gpu::probe_memory(&report, None).await.ok().and_then(|p| p.budget()),
        Err(_) => None,
    };
    match (budget, found) {
        (Some(budget), Some(found)) => Some(budget.min(found)),
        (budget, found) => budget.or(found),
    }
}

/// Keeps that a plan needing `failed_peak` bytes failed on this GPU with the pack `pack`.
pub(super) async fn learn(pack: &str, failed_peak: u64) {
    let Ok(report) = crate::platform::gpu::device_report().await else { return };
    let learned = Learned { adapter: report.adapter_id(), pack: pack.to_owned(), failed_peak };
    crate::platform::opfs::learned::set(&learned).await.log_error("keeping what the failed plan taught");
}

/// The memory plan of `params` within `gpu_budget` (lowered below a plan that failed here before), what
/// it was made from, and the budget it was made for.
pub(super) async fn memory_plan(
    params: &GenerateParams,
    pack: Option<&str>,
    gpu_budget: Option<u64>,
    keep: bool,
) -> (MemoryPlan, MemoryFacts, Option<u64>) {
    let gpu_budget = match (crate::platform::opfs::learned::get().await, pack) {
        (Some(learned), Some(pack)) => match crate::platform::gpu::device_report().await {
            Ok(report) => learned.cap(gpu_budget, &report.adapter_id(), pack),
            Err(_) => gpu_budget,
        },
        _ => gpu_budget,
    };
    let facts = crate::platform::gpu::memory_facts().await;
    let wanted = Wanted { ahead: params.load_ahead, keep, keep_buffers: params.keep_buffers };
    let budget = if params.backend == Backend::WebGpu { gpu_budget } else { None };
    (facts.plan(budget, params.width, params.height, wanted), facts, budget)
}

/// How a job loads its stages: its memory plan (`ahead`: every stage starts loading when the job
/// starts, else each when the one before it is done; `keep`: stages stay loaded after the job), and the
/// budget it was made for (both reported with each image's timings).
#[derive(Clone, Copy, PartialEq)]
pub(super) struct Plan {
    pub(super) memory: MemoryPlan,
    pub(super) budget: Option<u64>,
}

impl Plan {
    /// One stage loaded at a time, nothing kept, no buffers kept: the least memory.
    pub(super) fn lean(self) -> Plan {
        let levers = Levers { keep_buffers: false, ..self.memory.levers };
        Plan { memory: MemoryPlan { ahead: false, keep: false, levers, ..self.memory }, ..self }
    }
}
