//! An image the decoder made, as the `result` event tells it: its parameters, each stage's timings
//! and, for a traced job, what the reference pipeline needs to make it again.

use base64::Engine;
use imagine_core::api::{GenerateResult, Stage, StageTimings, Timings, Trace};
use imagine_core::{EncodedPrompt, GenerateParams};
use js_sys::Uint8Array;
use wasm_bindgen::JsValue;

use super::memory::Plan;
use crate::platform::js::now_ms;
use crate::platform::protocol::{StageTiming, TransformerOutput};

/// What every image of a job shares.
pub(super) struct Made<'a> {
    pub(super) job: &'a str,
    pub(super) params: &'a GenerateParams,
    pub(super) prompt: &'a EncodedPrompt,
    /// The trace's prompt embeddings (base64), empty unless traced.
    pub(super) prompt_embeds: &'a str,
    /// When the job started (`now_ms`).
    pub(super) started: f64,
    pub(super) plan: Plan,
}

impl Made<'_> {
    /// The result of image `index` of the batch, whose decoder run took `decoded`.
    pub(super) fn result(
        &self,
        index: u32,
        encoder: &StageTiming,
        denoised: &TransformerOutput,
        decoded: StageTiming,
        png: &JsValue,
    ) -> GenerateResult {
        let params = self.params;
        let timings = Timings {
            session_create_ms: encoder.session_create_ms
                + denoised.timing.session_create_ms
                + decoded.session_create_ms,
            run_ms: encoder.run_ms
                + denoised.image_run_ms.get(index as usize).copied().unwrap_or_default()
                + decoded.run_ms,
            total_ms: now_ms() - self.started,
            stages: [
                (Stage::TextEncoder, encoder.clone()),
                (Stage::Transformer, denoised.timing.clone()),
                (Stage::Decoder, decoded),
            ]
            .into_iter()
            .map(|(stage, t)| stage_timings(stage, t))
            .collect(),
            memory: Some(self.plan.memory),
            budget: self.plan.budget,
        };
        let trace = params.trace.then(|| Trace {
            input_ids: self.prompt.input_ids.clone(),
            attention_mask: self.prompt.attention_mask.clone(),
            sigmas: denoised.sigmas.clone(),
            noise: denoised.noise.get(index as usize).cloned().unwrap_or_default(),
            first_velocity: denoised.first_velocity.get(index as usize).cloned().unwrap_or_default(),
            img_ids: denoised.img_ids.clone(),
            txt_ids: denoised.txt_ids.clone(),
            prompt_embeds: self.prompt_embeds.to_owned(),
        });
        GenerateResult {
            job: self.job.to_owned(),
            png: base64::engine::general_purpose::STANDARD.encode(Uint8Array::new(png).to_vec()),
            image: params.image(index),
            token_count: self.prompt.token_count as u32,
            truncated: self.prompt.truncated,
            trace,
            timings: Some(timings),
            index,
            count: params.count,
            private: params.private,
        }
    }
}

/// What a stage worker reported of its stage, as the API tells it.
fn stage_timings(stage: Stage, t: StageTiming) -> StageTimings {
    StageTimings {
        stage,
        graph_file: t.graph_file,
        fused_attention: t.fused_attention,
        chunked_attention: t.chunked_attention,
        parted_projections: t.parted_projections,
        chunked_chains: t.chunked_chains,
        parted_gemms: t.parted_gemms,
        parted_matmuls: t.parted_matmuls,
        uploaded_values: t.uploaded_values,
        ort_wasm_as_bytes: t.ort_wasm_as_bytes,
        pieces: t.pieces,
        stored_form_check_ms: t.stored_form_check_ms,
        worker_created_at_ms: t.worker_created_at_ms,
        task_at_ms: t.task_at_ms,
        started_at_ms: t.started_at_ms,
        finished_at_ms: t.finished_at_ms,
        session_create_ms: t.session_create_ms,
        resident: t.resident,
        run_ms: t.run_ms,
        runs_ms: t.runs_ms,
        profile: t.profile,
    }
}
