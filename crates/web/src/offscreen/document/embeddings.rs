//! The prompt's tokens and embeddings: the tokenizer, loaded once, and the embedding cache (a cached
//! prompt skips the text encoder).

use super::*;

thread_local! {
    /// The prompt encoder, loaded on the first job of this document (loading takes far longer than
    /// encoding).
    static PROMPT_ENCODER: RefCell<Option<Rc<PromptEncoder>>> = const { RefCell::new(None) };
}

/// The prompt's tokens, as the text encoder takes them; they also key the embedding cache.
pub(super) async fn tokenize(prompt: &str) -> Result<EncodedPrompt, OffscreenError> {
    let encoder = match PROMPT_ENCODER.with_borrow(Clone::clone) {
        Some(encoder) => encoder,
        None => {
            let encoder = Rc::new(crate::platform::prompt_encoder::load().await?);
            PROMPT_ENCODER.set(Some(encoder.clone()));
            encoder
        }
    };
    encoder.encode(prompt).map_err(OffscreenError::Prompt)
}

/// The prompt's embeddings (an `ArrayBuffer` of float32) and the text encoder's timing: from the cache
/// when this pack has encoded these tokens before (no text-encoder worker at all), otherwise from the
/// text-encoder worker, and then kept. The cache failing never fails the job: it is only a shortcut.
pub(super) async fn prompt_embeddings(
    job: &str,
    params: &GenerateParams,
    prompt: &EncodedPrompt,
    commit: Option<&str>,
    keep: bool,
) -> Result<(JsValue, StageTiming), StageFailure> {
    // Embeddings of a graph edited for a benchmark (`accuracyLevel`) are not the pack's, and a profile
    // is of every stage.
    let commit = commit.filter(|_| params.accuracy_level.is_none() && !params.profile);
    let key = match commit {
        Some(commit) => {
            Some(embedding_cache::key(commit, params.backend, encoder_form(params.backend).await, prompt))
        }
        None => None,
    };
    let values = MAX_TOKENS * EMBED_WIDTH;
    if let (Some(commit), Some(key)) = (commit, &key) {
        // A private job uses a cached prompt without marking it as used: nothing of it goes to disk.
        match crate::platform::opfs::embeddings::read_entry(commit, key, values, !params.private).await {
            Ok(Some(embeddings)) => return Ok((embeddings.into(), StageTiming::default())),
            Ok(None) => {}
            Err(e) => warn(&format!("imagine: the embedding cache could not be read: {e}")),
        }
    }
    let task = StageTask::TextEncoder {
        params: params.clone(),
        prompt: prompt.clone(),
        keep,
        checked: checked_forms(),
    };
    let mut encoder = StageRun::start(job, &task, None)?;
    let (StageOutput::TextEncoder(encoded), embeddings) = encoder.done(params.count).await? else {
        return Err(unexpected(Stage::TextEncoder));
    };
    encoder.end(keep);
    let embeddings = embeddings.ok_or(OffscreenError::NoOutput)?;
    // A private job leaves nothing on disk, its prompt's embeddings included.
    if let (Some(commit), Some(key), false) = (commit, &key, params.private) {
        // Written before the buffer is transferred to the transformer.
        let (count, truncated) = (prompt.token_count as u32, prompt.truncated);
        if let Err(e) = crate::platform::opfs::embeddings::write_entry(
            commit,
            key,
            embeddings.unchecked_ref(),
            count,
            truncated,
        )
        .await
        {
            warn(&format!("imagine: the prompt embeddings could not be cached: {e}"));
        }
    }
    Ok((embeddings, encoded.timing))
}

/// The form of the text encoder the stage worker runs (as `stage_worker::choose_graph` picks it): the
/// install's float32 conversion on WebGPU without `shader-f16`, when the pack has one.
pub(super) async fn encoder_form(backend: Backend) -> EncoderForm {
    if backend != Backend::WebGpu {
        return EncoderForm::Pack;
    }
    let converted =
        crate::platform::opfs::installed_pack().await.is_some_and(|(record, _)| record.conversion.is_some());
    if !converted {
        return EncoderForm::Pack;
    }
    match crate::platform::gpu::adapter_info().await {
        Ok(adapter) if !adapter.has_f16 => EncoderForm::Float32Conversion,
        _ => EncoderForm::Pack,
    }
}
