use super::*;

const W: StageWeights = StageWeights::PUBLISHED;

fn job(side: u32, precision: Precision) -> Job {
    Job { width: side, height: side, precision }
}

fn gb(bytes: u64) -> f64 {
    bytes as f64 / GB as f64
}

#[test]
fn needs_match_the_measured_figures_within_a_tenth() {
    use Precision::*;
    let cases = [
        (Stage::TextEncoder, 512, Float16, 2.04),
        (Stage::TextEncoder, 512, Float32, 2.39),
        (Stage::Transformer, 512, Float16, 5.85),
        (Stage::Transformer, 1024, Float16, 11.22),
        (Stage::Transformer, 512, Float32, 11.42),
        (Stage::Decoder, 512, Float16, 3.90),
        (Stage::Decoder, 1024, Float16, 17.94),
    ];
    for (stage, side, precision, measured) in cases {
        let need = gb(stage_need(stage, &W, &job(side, precision), Levers::NONE));
        // The text encoder's float16 need is its weights, 0.16 GB above what was measured.
        let tolerance = if stage == Stage::TextEncoder { 0.2 } else { 0.1 };
        assert!(
            (need - measured).abs() <= measured * tolerance,
            "{stage:?} {side} {precision:?}: {need} vs {measured}"
        );
    }
}

#[test]
fn chunks_bring_scores_under_the_cache_limit() {
    let big = job(1024, Precision::Float16);
    let chunks = attention_chunks(&big);
    assert_eq!(chunks, 7, "1.02 GB of scores in chunks of at most 160 MiB");
    assert!(big.transformer_scores().div_ceil(u64::from(chunks)) <= ORT_LARGEST_CACHED_BUFFER);
    assert!(big.transformer_scores().div_ceil(u64::from(chunks - 1)) > ORT_LARGEST_CACHED_BUFFER);
    assert_eq!(attention_chunks(&job(512, Precision::Float16)), 1, "113 MB fits already");
    let levers = Levers { attention_chunks: chunks, projections_per_part: true, ..Levers::NONE };
    let chunked = stage_need(Stage::Transformer, &W, &big, levers);
    assert!(chunked < 7 * GB, "{}", gb(chunked));
}

#[test]
fn needs_match_what_ran_on_a_gpu_held_to_8_gb() {
    use Precision::*;
    let chunked = |j: &Job| Levers { attention_chunks: attention_chunks(j), ..Levers::NONE };
    let parted = |j: &Job| Levers { projections_per_part: true, ..chunked(j) };
    let tokens = |j: &Job| Levers { token_chunks: j.token_chunks(), ..parted(j) };
    let small32 = job(512, Float32);
    let tall32 = Job { width: 768, height: 1024, precision: Float32 };
    let big32 = job(1024, Float32);
    let small16 = job(512, Float16);
    let tall16 = Job { width: 768, height: 1024, precision: Float16 };
    let big16 = job(1024, Float16);
    // The whole GPU's peak above its start (an H200 or an H100 held to 7.8 GB free, the transformer
    // the largest stage) against the transformer's need, within a tenth.
    let ran = [
        ("float32 512x512", &small32, chunked(&small32), 6.74),
        ("float32 512x512 per part", &small32, parted(&small32), 6.39),
        ("float32 768x1024 per part", &tall32, parted(&tall32), 7.07),
        ("float32 1024x1024 per part, tokens in 2", &big32, tokens(&big32), 7.76),
        ("float16 512x512", &small16, Levers::NONE, 5.8),
        ("float16 768x1024 per part", &tall16, parted(&tall16), 6.4),
        ("float16 1024x1024", &big16, chunked(&big16), 7.4),
        ("float16 1024x1024 per part", &big16, parted(&big16), 6.7),
    ];
    for (what, job, levers, measured) in ran {
        let need = gb(stage_need(Stage::Transformer, &W, job, levers));
        assert!((need - measured).abs() <= measured / 10.0, "{what}: {need} vs {measured}");
    }
    // What ran out with 7.8 GB free: the float32 transformer at 1024x1024 with its projections whole
    // or per part (without chunks of tokens), and at 768x1024 whole (also with every buffer kept).
    for (what, job, levers) in [
        ("1024x1024", &big32, chunked(&big32)),
        ("1024x1024 per part", &big32, parted(&big32)),
        ("768x1024", &tall32, chunked(&tall32)),
        ("768x1024, buffers kept", &tall32, Levers { keep_buffers: true, ..chunked(&tall32) }),
    ] {
        let need = stage_need(Stage::Transformer, &W, job, levers);
        assert!(need > 7_800_000_000, "float32 {what}: {}", gb(need));
    }
    // Streamed in pieces of its weights (H100s held to 8, 6 and 4 GB free; the GPU's use while the
    // transformer ran): the model errs above, by at most a fifth.
    let streamed = |j: &Job, pieces| Levers { transformer_pieces: pieces, ..parted(j) };
    for (what, job, levers, measured) in [
        ("float32 512x512 in 2", &small32, streamed(&small32, 2), 3.57),
        ("float32 512x512 in 4", &small32, streamed(&small32, 4), 2.40),
        ("float32 768x1024 in 2", &tall32, streamed(&tall32, 2), 4.18),
        ("float32 1024x1024 in 2", &big32, Levers { transformer_pieces: 2, ..tokens(&big32) }, 4.57),
        ("float16 512x512 in 3", &small16, Levers { transformer_pieces: 3, ..Levers::NONE }, 2.56),
    ] {
        let need = gb(stage_need(Stage::Transformer, &W, job, levers));
        assert!(need >= measured && need <= measured * 1.2, "{what}: {need} vs {measured}");
    }
    // The decoder in pieces of a quarter of the room, computing in NCHW, ran at 768x1024 and at
    // 1024x1024 within a budget of 7.0 GB.
    let facts = MemoryFacts { weights: W, precision: Float16 };
    for (width, height) in [(768, 1024), (1024, 1024)] {
        let p = facts.default_plan(Some(7_000_000_000), width, height);
        assert!(p.fits && p.levers.decoder_piece_bytes.is_some(), "{width}x{height}: {p:?}");
    }
}

const WANTED: Wanted = Wanted { ahead: true, keep: true, keep_buffers: true };

#[test]
fn no_budget_is_the_fastest_plan() {
    let p = plan(None, &W, &job(1024, Precision::Float16), WANTED);
    assert!(p.ahead && p.keep && p.levers.keep_buffers && p.fits);
    assert_eq!(p.levers.attention_chunks, 1);
}

#[test]
fn a_budget_steps_down_to_one_stage_at_a_time() {
    let small = job(512, Precision::Float16);
    let wanted = Wanted { keep_buffers: false, ..WANTED };
    let roomy = plan(Some(24 * GB), &W, &small, wanted);
    assert!(roomy.ahead && roomy.keep && roomy.fits, "{roomy:?}");
    let eight = plan(Some(8 * GB), &W, &small, wanted);
    assert!(!eight.ahead && !eight.keep && eight.fits, "{eight:?}");
    assert!(eight.peak <= 8 * GB);
    let six = plan(Some(6 * GB), &W, &small, wanted);
    assert!(six.fits && six.peak <= 6 * GB, "{six:?}");
    // With 4 GB the transformer's weights (4.1 GB) do not fit whole: streamed in 2 pieces; with what
    // the probe leaves of 4 GB free, in 3 (as ran).
    let four = plan(Some(4 * GB), &W, &small, wanted);
    assert!(four.fits && !four.ahead && !four.keep && four.peak <= 4 * GB, "{four:?}");
    assert_eq!(four.levers.transformer_pieces, 2, "{four:?}");
    assert_eq!(plan(Some(3_380_000_000), &W, &small, wanted).levers.transformer_pieces, 3);
    // With no room, the smallest plan: no buffers kept, the attention in chunks, the decoder split,
    // the transformer streamed in as many pieces as bring it under the decoder's floor.
    let big32 = plan(Some(4 * GB), &W, &job(1024, Precision::Float32), wanted);
    assert!(!big32.fits && !big32.levers.keep_buffers && big32.levers.attention_chunks > 1, "{big32:?}");
    assert!(big32.levers.decoder_piece_bytes.is_some(), "{big32:?}");
    assert_eq!(big32.levers.transformer_pieces, 2, "{big32:?}");
    assert_eq!(big32.peak, stage_need(Stage::Decoder, &W, &job(1024, Precision::Float32), big32.levers));
}

#[test]
fn keep_buffers_goes_before_loading_ahead() {
    let big = job(1024, Precision::Float16);
    let all_kept: u64 =
        STAGES.iter().map(|&s| stage_need(s, &W, &big, Levers { keep_buffers: true, ..Levers::NONE })).sum();
    let all_default: u64 = STAGES.iter().map(|&s| stage_need(s, &W, &big, Levers::NONE)).sum();
    let p = plan(Some((all_kept + all_default) / 2), &W, &big, WANTED);
    assert!(p.ahead && p.keep && !p.levers.keep_buffers && p.fits, "{p:?}");
}

#[test]
fn the_attention_is_chunked_and_the_decoder_split_only_where_the_budget_needs_it() {
    let tall = Job { width: 768, height: 1024, precision: Precision::Float16 };
    let roomy = plan(Some(20 * GB), &W, &tall, WANTED);
    assert_eq!((roomy.levers.attention_chunks, roomy.levers.decoder_piece_bytes), (1, None));
    // Whole, the decoder needs 13.6 GB at 768x1024: with 8 GB the attention is chunked and the
    // decoder split into pieces of a quarter of what its weights leave of the budget.
    assert!(stage_need(Stage::Decoder, &W, &tall, Levers::NONE) > 8 * GB);
    let p = plan(Some(8 * GB), &W, &tall, WANTED);
    assert!(p.fits && !p.ahead && !p.keep && !p.levers.keep_buffers, "{p:?}");
    assert_eq!(p.levers.attention_chunks, 4);
    assert_eq!(p.levers.decoder_piece_bytes, Some((8 * GB - W.decoder) / 4));
    assert!(p.peak <= 8 * GB, "{}", gb(p.peak));
    // As measured with 8 GB free (a budget of 7.0 GB): every preset size fits in float16. In float32
    // the larger sizes' transformer ran out with its projections whole; per part, 768x1024 and
    // 1024x768 ran within 7.1 GB, and 1024x1024 with its chains in 2 chunks of tokens within 7.8 GB:
    // above the 7.0 GB the probe allows, so the transformer is streamed there, and not with 8 GB.
    let seven = 7_000_000_000;
    for (w, h) in [(512, 512), (768, 1024), (1024, 768), (1024, 1024)] {
        let f16 = plan(Some(seven), &W, &Job { width: w, height: h, precision: Precision::Float16 }, WANTED);
        assert!(f16.fits && f16.levers.transformer_pieces == 1, "float16 {w}x{h}: {f16:?}");
        let job32 = Job { width: w, height: h, precision: Precision::Float32 };
        let f32 = plan(Some(seven), &W, &job32, WANTED);
        assert!(f32.fits, "float32 {w}x{h}: {f32:?}");
        let streamed = if w * h == 512 * 512 { 1 } else { 2 };
        assert_eq!(f32.levers.transformer_pieces, streamed, "float32 {w}x{h}: {f32:?}");
        let eight = plan(Some(8 * GB), &W, &job32, WANTED);
        assert!(eight.fits && eight.levers.transformer_pieces == 1, "float32 {w}x{h} in 8 GB: {eight:?}");
        assert!(f32.levers.projections_per_part, "float32 {w}x{h}: {f32:?}");
        assert_eq!(
            f32.levers.token_chunks,
            if w * h == 1024 * 1024 { 2 } else { 1 },
            "float32 {w}x{h}: {f32:?}"
        );
        let whole = Levers { projections_per_part: false, transformer_pieces: 1, ..f32.levers };
        let whole_fits = stage_need(Stage::Transformer, &W, &job32, whole) <= seven;
        assert_eq!(whole_fits, w * h == 512 * 512, "float32 {w}x{h} with whole projections");
    }
    // Every square up to the largest preset fits, streamed.
    let side = MemoryFacts { weights: W, precision: Precision::Float32 }.largest_square(seven);
    assert_eq!(side, Some(1056), "{side:?}");
    // With 6 GB free (the probe's budget 5.1 GB) float32 512x512 needs 6.2 GB whole: streamed in 2
    // pieces it fits, and a failure then streams it in pieces half as large.
    let facts32 = MemoryFacts { weights: W, precision: Precision::Float32 };
    let six = facts32.default_plan(Some(5_100_000_000), 512, 512);
    assert!(six.fits && six.levers.transformer_pieces == 2, "{six:?}");
    let again = facts32.after_out_of_memory(Some(5_100_000_000), 512, 512, &six).unwrap();
    assert_eq!(again.levers.transformer_pieces, 4, "{again:?}");
    let four = plan(Some(4 * GB), &W, &tall, WANTED);
    assert!(!four.fits && four.levers.decoder_piece_bytes.is_some(), "{four:?}");
}

#[test]
fn a_split_decoder_needs_at_least_its_largest_nodes() {
    let big = job(1024, Precision::Float16);
    let tiny_pieces = Levers { decoder_piece_bytes: Some(1), ..Levers::NONE };
    let need = stage_need(Stage::Decoder, &W, &big, tiny_pieces);
    assert!((6.2..6.6).contains(&gb(need)), "{}", gb(need));
    // Pieces larger than the whole decode change nothing.
    let huge = Levers { decoder_piece_bytes: Some(100 * GB), ..Levers::NONE };
    assert_eq!(
        stage_need(Stage::Decoder, &W, &big, huge),
        stage_need(Stage::Decoder, &W, &big, Levers::NONE)
    );
}

#[test]
fn after_running_out_the_plan_is_smaller_until_nothing_is_left_to_cut() {
    let facts = MemoryFacts { weights: W, precision: Precision::Float16 };
    let failed = facts.default_plan(Some(7 * GB), 1024, 768);
    let retry = facts.after_out_of_memory(Some(7 * GB), 1024, 768, &failed).unwrap();
    assert!(!retry.ahead && !retry.keep && !retry.levers.keep_buffers);
    assert!(retry.levers.attention_chunks >= failed.levers.attention_chunks);
    assert!(retry.levers.decoder_piece_bytes.unwrap() <= failed.levers.decoder_piece_bytes.unwrap() / 2);
    // Ballast grown meanwhile: the probe now finds less, and the plan follows it.
    let squeezed = facts.after_out_of_memory(Some(3 * GB), 1024, 768, &failed).unwrap();
    assert!(!squeezed.fits, "{squeezed:?}");
    // Each failure halves the pieces, down to the smallest: then there is nothing left to try.
    let mut plan = failed;
    let mut retries = 0;
    while let Some(next) = facts.after_out_of_memory(Some(7 * GB), 1024, 768, &plan) {
        plan = next;
        retries += 1;
        assert!(retries < 10, "{plan:?}");
    }
    assert_eq!(plan.levers.decoder_piece_bytes, Some(MIN_DECODER_PIECE_BYTES));
    // A whole decoder that failed is split at half its need.
    let roomy = facts.default_plan(None, 512, 512);
    let split = facts.after_out_of_memory(None, 512, 512, &roomy).unwrap();
    let whole = stage_need(Stage::Decoder, &W, &job(512, Precision::Float16), Levers::NONE) - W.decoder;
    assert_eq!(split.levers.decoder_piece_bytes, Some(whole / 2));
}

#[test]
fn out_of_memory_is_told_from_other_failures() {
    // As ORT reported them on the H200 with the rest of its memory held.
    let seen = [
        "running vae_decoder.onnx failed: failed to call OrtRun(). ERROR_CODE: 1, ERROR_MESSAGE: WebGPU \
         validation failed. [Invalid Buffer (unlabeled)] is invalid due to a previous error.\n - While \
         encoding [CommandEncoder (unlabeled)].CopyBufferToBuffer(...)",
        "running transformer_q8.onnx failed: failed to call OrtRun(). ERROR_CODE: 1, ERROR_MESSAGE: \
         /onnxruntime/core/providers/webgpu/buffer_manager.cc:643 void \
         onnxruntime::webgpu::BufferManager::Download(WGPUBuffer, void *, size_t)",
        "GPUOutOfMemoryError: Out of memory",
    ];
    for failure in seen {
        assert!(is_out_of_memory(failure), "{failure}");
    }
    for other in ["the transformer made no progress for 300 s and was stopped", "reading x: HTTP 404"] {
        assert!(!is_out_of_memory(other), "{other}");
    }
}

#[test]
fn the_pages_say_a_streamed_size_fits_slower() {
    let facts32 = MemoryFacts { weights: W, precision: Precision::Float32 };
    assert_eq!(facts32.default_plan(Some(8 * GB), 512, 512).size_fit(), SizeFit::Fits);
    assert_eq!(facts32.default_plan(Some(5_100_000_000), 512, 512).size_fit(), SizeFit::Streamed);
    let facts16 = MemoryFacts { weights: W, precision: Precision::Float16 };
    assert_eq!(facts16.default_plan(Some(4 * GB), 1024, 1024).size_fit(), SizeFit::TooBig);
}

#[test]
fn the_largest_square_that_fits() {
    let facts = MemoryFacts { weights: W, precision: Precision::Float16 };
    let side = facts.largest_square(8 * GB).unwrap();
    assert!(facts.default_plan(Some(8 * GB), side, side).fits);
    assert!(!facts.default_plan(Some(8 * GB), side + 16, side + 16).fits);
    assert_eq!(side % 16, 0);
    assert_eq!(facts.largest_square(GB), None);
}

#[test]
fn a_failed_plan_caps_later_budgets_on_its_adapter_and_pack() {
    let learned = Learned { adapter: "gpu".into(), pack: "c1".into(), failed_peak: 10 * GB };
    assert_eq!(learned.cap(None, "gpu", "c1"), Some(10 * GB - 1));
    assert_eq!(learned.cap(Some(6 * GB), "gpu", "c1"), Some(6 * GB));
    assert_eq!(learned.cap(Some(16 * GB), "gpu", "c1"), Some(10 * GB - 1));
    assert_eq!(learned.cap(None, "other gpu", "c1"), None);
    assert_eq!(learned.cap(Some(16 * GB), "gpu", "c2"), Some(16 * GB));
    // Below the failed plan, the same job is made one stage at a time.
    let facts = MemoryFacts { weights: W, precision: Precision::Float16 };
    let wanted = Wanted { ahead: true, keep: true, keep_buffers: false };
    let fast = facts.plan(None, 512, 512, wanted);
    let learned = Learned { failed_peak: fast.peak, ..learned };
    let again = facts.plan(learned.cap(None, "gpu", "c1"), 512, 512, wanted);
    assert!(!again.ahead && !again.keep && again.fits, "{again:?}");
}

#[test]
fn budgets_from_the_setting_or_the_probe() {
    let probe = |found| Probe { adapter: "a".into(), found };
    let refused = probe(ProbeFound::Refused { bytes: 10 * GB });
    assert_eq!(budget(GpuMemorySetting::Auto, Some(&refused)), Some(9 * GB));
    assert_eq!(budget(GpuMemorySetting::Set { bytes: 6 * GB }, Some(&refused)), Some(6 * GB));
    assert_eq!(
        budget(GpuMemorySetting::Auto, Some(&probe(ProbeFound::Plenty { bytes: PROBE_CAP_BYTES }))),
        None
    );
    assert_eq!(budget(GpuMemorySetting::Auto, Some(&probe(ProbeFound::Unknown))), None);
    assert_eq!(budget(GpuMemorySetting::Auto, None), None);
}

#[test]
fn settings_in_tenths_of_a_gigabyte() {
    assert_eq!(GpuMemorySetting::gigabytes(8.0), Ok(GpuMemorySetting::Set { bytes: 8 * GB }));
    assert_eq!(GpuMemorySetting::gigabytes(6.25), Ok(GpuMemorySetting::Set { bytes: 6_300_000_000 }));
    assert!(GpuMemorySetting::gigabytes(0.5).is_err());
    assert!(GpuMemorySetting::gigabytes(f64::NAN).is_err());
    assert!(GpuMemorySetting::gigabytes(1000.0).is_err());
    let json = serde_json::to_string(&GpuMemorySetting::Set { bytes: 8 * GB }).unwrap();
    assert_eq!(json, r#"{"mode":"set","bytes":8000000000}"#);
}

#[test]
fn weights_of_a_packs_files() {
    let files = [
        ("text_encoder_q4.onnx", 10),
        ("text_encoder_q4-00000.data", 100),
        ("text_encoder_q4.b32.data", 7),
        ("transformer_q8-00000.data", 200),
        ("transformer_q8.f32-00000.data", 300),
        ("vae_decoder.onnx.data", 30),
        ("tokenizer.json", 5),
    ];
    assert_eq!(
        StageWeights::of_files(files),
        StageWeights { text_encoder: 110, transformer: 200, decoder: 30 }
    );
}

#[test]
fn where_nothing_fits_streaming_is_taken_only_where_it_needs_a_tenth_less() {
    // A small pack (the tests' tiny one): its transformer's need is nearly all working memory, so
    // streaming its 3 MB of weights would only make it slower.
    let tiny = StageWeights { text_encoder: 23_000_000, transformer: 3_000_000, decoder: 700_000 };
    let p = plan(Some(GB), &tiny, &job(512, Precision::Float32), WANTED);
    assert!(!p.fits && p.levers.transformer_pieces == 1, "{p:?}");
    // The published pack at 1024x1024 with 4 GB: streamed, down to the decoder's floor.
    let big = plan(Some(4 * GB), &W, &job(1024, Precision::Float32), WANTED);
    assert!(!big.fits && big.levers.transformer_pieces > 1, "{big:?}");
}
