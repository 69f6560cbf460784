use super::*;

#[test]
fn a_size_not_allowed_gets_the_nearest_allowed_ones() {
    assert_eq!(nearest_sizes(500), [496, 512]);
    assert_eq!(nearest_sizes(504), [496, 512]);
    assert_eq!(nearest_sizes(100), [256]);
    assert_eq!(nearest_sizes(255), [256]);
    assert_eq!(nearest_sizes(2000), [1536]);
    assert_eq!(nearest_sizes(1537), [1536]);
    assert_eq!(nearest_sizes(-7), [256]);
    assert_eq!(nearest_sizes(i64::MAX), [1536]);
    assert!(nearest_sizes(512).is_empty() && nearest_sizes(256).is_empty() && nearest_sizes(1536).is_empty());
    for v in [257, 1000, 1530] {
        for s in nearest_sizes(v) {
            assert!(size("width", Some(i64::from(s))).is_ok(), "{v}: {s}");
        }
    }
}

#[test]
fn params_cross_json_with_the_whole_seed_and_the_api_names() {
    let request = GenerateRequest {
        prompt: "a cat".into(),
        seed: Some(Seed::Text(u64::MAX.to_string())),
        schedule: Some("linear-shift".into()),
        backend: Some("wasm".into()),
        ..Default::default()
    };
    let params = request.validate(0).unwrap();
    let text = serde_json::to_string(&params).unwrap();
    assert!(text.contains(r#""seed":"18446744073709551615""#), "{text}");
    assert!(text.contains(r#""schedule":"linear-shift""#) && text.contains(r#""backend":"wasm""#), "{text}");
    assert_eq!(serde_json::from_str::<GenerateParams>(&text).unwrap(), params);
    for schedule in Schedule::ALL {
        assert_eq!(serde_json::to_string(&schedule).unwrap(), format!("\"{}\"", schedule.name()));
    }
    for backend in Backend::ALL {
        assert_eq!(serde_json::to_string(&backend).unwrap(), format!("\"{}\"", backend.name()));
    }
}

fn req(json: &str) -> GenerateRequest {
    serde_json::from_str(json).expect("test request is valid JSON")
}

fn err(json: &str) -> String {
    req(json).validate(7).expect_err("should be refused").to_string()
}

#[test]
fn defaults() {
    let p = req(r#"{"prompt":"a cat"}"#).validate(42).unwrap();
    assert_eq!(
        p,
        GenerateParams {
            prompt: "a cat".into(),
            width: 512,
            height: 512,
            steps: 4,
            seed: 42,
            schedule: Schedule::Empirical,
            trace: false,
            backend: Backend::WebGpu,
            count: 1,
            load_ahead: true,
            profile: false,
            accuracy_level: None,
            keep_buffers: false,
            fuse_attention: false,
            projections_per_part: false,
            token_chunks: 1,
            transformer_pieces: 1,
            private: false,
            attention_chunks: 1,
            decoder_piece_bytes: None,
            weight_part_bytes: 16 << 20,
            matmuls_in_parts: false,
        }
    );
    assert_eq!(p.latent_size(), (32, 32));
    assert_eq!(p.image_tokens(), 1024);
    assert_eq!(p.sigmas().len(), 5);
}

#[test]
fn every_field_set() {
    let p = req(r#"{"prompt":"","width":1536,"height":256,"steps":50,"seed":"18446744073709551615",
            "schedule":"linear-shift","trace":true,"backend":"wasm"}"#)
    .validate(1)
    .unwrap();
    assert_eq!((p.width, p.height, p.steps), (1536, 256, 50));
    assert_eq!(p.seed, u64::MAX);
    assert_eq!(p.schedule, Schedule::LinearShift);
    assert!(p.trace);
    assert_eq!(p.backend, Backend::Wasm);
    assert_eq!(p.prompt, "");
    assert_eq!(p.latent_size(), (16, 96));
}

#[test]
fn sizes() {
    for ok in [256, 272, 512, 1024, 1088, 1536] {
        let p = req(&format!(r#"{{"width":{ok},"height":{ok}}}"#)).validate(0).unwrap();
        assert_eq!((p.width, p.height), (ok as u32, ok as u32));
    }
    assert_eq!(
        err(r#"{"width":500}"#),
        "width 500 is not allowed: width must be a multiple of 16 from 256 to 1536"
    );
    assert_eq!(
        err(r#"{"height":1552}"#),
        "height 1552 is not allowed: height must be a multiple of 16 from 256 to 1536"
    );
    for bad in [0, 240, 255, 257, 1537, 1552, -512, 4294967808i64] {
        assert!(err(&format!(r#"{{"width":{bad}}}"#)).starts_with(&format!("width {bad} ")));
        assert!(err(&format!(r#"{{"height":{bad}}}"#)).starts_with(&format!("height {bad} ")));
    }
}

#[test]
fn steps() {
    for ok in [1, 4, 50] {
        assert_eq!(req(&format!(r#"{{"steps":{ok}}}"#)).validate(0).unwrap().steps, ok as u32);
    }
    assert_eq!(err(r#"{"steps":0}"#), "steps 0 is not allowed: steps must be an integer from 1 to 50");
    for bad in [-1, 51, 4294967297i64] {
        assert!(err(&format!(r#"{{"steps":{bad}}}"#)).starts_with(&format!("steps {bad} ")));
    }
}

#[test]
fn seeds() {
    let seed = |json: &str| req(json).validate(99).map(|p| p.seed);
    assert_eq!(seed(r#"{}"#), Ok(99));
    assert_eq!(seed(r#"{"seed":0}"#), Ok(0));
    assert_eq!(seed(r#"{"seed":12345}"#), Ok(12345));
    assert_eq!(seed(r#"{"seed":9007199254740992}"#), Ok(1 << 53));
    assert_eq!(seed(r#"{"seed":"0"}"#), Ok(0));
    assert_eq!(seed(r#"{"seed":"18446744073709551615"}"#), Ok(u64::MAX));
    for bad in [
        r#"{"seed":-1}"#,
        r#"{"seed":1.5}"#,
        r#"{"seed":9007199254740994}"#,
        r#"{"seed":1e300}"#,
        r#"{"seed":""}"#,
        r#"{"seed":"-1"}"#,
        r#"{"seed":"+1"}"#,
        r#"{"seed":" 1"}"#,
        r#"{"seed":"0x10"}"#,
        r#"{"seed":"18446744073709551616"}"#,
    ] {
        assert!(matches!(seed(bad), Err(ParamError::Seed { .. })), "{bad}");
    }
    assert_eq!(
        err(r#"{"seed":-1}"#),
        "seed -1 is not allowed: seed must be a whole number from 0 to 2^53 (9007199254740992) \
         as a JSON number, or a decimal string from 0 to 18446744073709551615"
    );
    assert!(err(r#"{"seed":"abc"}"#).starts_with(r#"seed "abc" is not allowed"#));
}

#[test]
fn counts_and_the_seeds_of_a_batch() {
    for ok in [1, 4, 8] {
        assert_eq!(req(&format!(r#"{{"count":{ok}}}"#)).validate(0).unwrap().count, ok as u32);
    }
    assert_eq!(err(r#"{"count":0}"#), "count 0 is not allowed: count must be an integer from 1 to 8");
    for bad in [-1, 9, 4294967297i64] {
        assert!(err(&format!(r#"{{"count":{bad}}}"#)).starts_with(&format!("count {bad} ")));
    }
    let p = req(r#"{"count":3,"seed":"18446744073709551614"}"#).validate(0).unwrap();
    assert_eq!([p.seed_of(0), p.seed_of(1), p.seed_of(2)], [u64::MAX - 1, u64::MAX, 0]);
    // Params stored before `count` existed read as one image.
    let mut text = serde_json::to_value(&p).unwrap();
    text.as_object_mut().unwrap().remove("count");
    assert_eq!(serde_json::from_value::<GenerateParams>(text).unwrap().count, 1);
}

#[test]
fn keep_loaded_and_loading_ahead() {
    for ok in [0, 300, 3600] {
        assert_eq!(keep_loaded_seconds(ok), Ok(ok as u32));
    }
    assert_eq!(
        keep_loaded_seconds(3601).unwrap_err().to_string(),
        "keepLoaded seconds 3601 is not allowed: seconds must be an integer from 0 (unload after each image) to 3600"
    );
    assert!(keep_loaded_seconds(-1).is_err());
    assert!(req("{}").validate(0).unwrap().load_ahead);
    assert!(!req(r#"{"loadAhead":false}"#).validate(0).unwrap().load_ahead);
    assert!(!req("{}").validate(0).unwrap().profile);
    assert!(req(r#"{"profile":true}"#).validate(0).unwrap().profile);
    assert_eq!(req("{}").validate(0).unwrap().accuracy_level, None);
    let prompt =
        |n: usize| GenerateRequest { prompt: "ä".repeat(n), ..GenerateRequest::default() }.validate(0);
    assert!(prompt(MAX_PROMPT_CHARS).is_ok(), "characters are counted, not bytes");
    assert_eq!(
        prompt(MAX_PROMPT_CHARS + 1).unwrap_err().to_string(),
        "the prompt is 20001 characters long: at most 20000 are allowed (only the first 512 tokens, about 2000 characters of English, are used)"
    );
    assert_eq!(req(r#"{"accuracyLevel":4}"#).validate(0).unwrap().accuracy_level, Some(4));
    // Buffers are kept above 512x512 pixels unless the request says.
    assert!(!req("{}").validate(0).unwrap().keep_buffers);
    assert!(!req(r#"{"width":512,"height":512}"#).validate(0).unwrap().keep_buffers);
    assert!(req(r#"{"width":528,"height":512}"#).validate(0).unwrap().keep_buffers);
    assert!(req(r#"{"width":1024,"height":1024}"#).validate(0).unwrap().keep_buffers);
    assert!(!req(r#"{"width":1024,"height":1024,"keepBuffers":false}"#).validate(0).unwrap().keep_buffers);
    let large = req(r#"{"width":1024,"height":1024}"#).validate(0).unwrap();
    assert!(large.keeps_buffers(Graph::Transformer) && large.keeps_buffers(Graph::Decoder));
    assert!(!large.keeps_buffers(Graph::TextEncoder));
    assert!(req(r#"{"keepBuffers":true}"#).validate(0).unwrap().keep_buffers);
    assert!(!req("{}").validate(0).unwrap().fuse_attention);
    let fused = req(r#"{"fuseAttention":true}"#).validate(0).unwrap();
    assert!(fused.fuses_attention(Graph::Transformer));
    assert!(!fused.fuses_attention(Graph::Decoder) && !fused.fuses_attention(Graph::TextEncoder));
    assert!(!req("{}").validate(0).unwrap().private);
    assert!(req(r#"{"private":true}"#).validate(0).unwrap().private);
    assert_eq!(
        req(r#"{"accuracyLevel":5}"#).validate(0).unwrap_err().to_string(),
        "accuracyLevel 5 is not allowed: it must be an integer from 0 to 4"
    );
    assert!(req(r#"{"accuracyLevel":-1}"#).validate(0).is_err());
    // Params stored before `loadAhead` existed load ahead.
    let mut text = serde_json::to_value(req("{}").validate(0).unwrap()).unwrap();
    text.as_object_mut().unwrap().remove("loadAhead");
    assert!(serde_json::from_value::<GenerateParams>(text).unwrap().load_ahead);
}

#[test]
fn names() {
    assert_eq!(
        err(r#"{"schedule":"karras"}"#),
        r#"schedule "karras" is not known: schedule must be one of "empirical" (the default) or "linear-shift""#
    );
    assert_eq!(
        err(r#"{"backend":"cpu"}"#),
        r#"backend "cpu" is not known: backend must be "webgpu" (the default) or "wasm""#
    );
    assert_eq!(
        req(r#"{"schedule":"empirical","backend":"webgpu"}"#).validate(0).unwrap().backend,
        Backend::WebGpu
    );
    for b in Backend::ALL {
        assert_eq!(Backend::from_name(b.name()), Some(b));
    }
}

#[test]
fn benchmark_levers_are_clamped_and_apply_to_the_transformer_on_webgpu_only() {
    let p = |json: &str| req(json).validate(0).unwrap();
    assert_eq!(p(r#"{"tokenChunks":0,"transformerPieces":0}"#).transformer_pieces(Graph::Transformer), 1);
    let many = p(r#"{"tokenChunks":1000,"transformerPieces":1000}"#);
    assert_eq!(many.token_chunks(Graph::Transformer), MAX_TOKEN_CHUNKS);
    assert_eq!(many.transformer_pieces(Graph::Transformer), MAX_TRANSFORMER_PIECES);
    for graph in [Graph::TextEncoder, Graph::Decoder] {
        assert_eq!((many.token_chunks(graph), many.transformer_pieces(graph)), (1, 1), "{graph:?}");
    }
    let wasm = p(r#"{"transformerPieces":3,"backend":"wasm"}"#);
    assert_eq!(wasm.transformer_pieces(Graph::Transformer), 1, "the wasm backend has no GPU memory to save");
    assert_eq!(p(r#"{"transformerPieces":3}"#).session_options(Graph::Transformer).transformer_pieces, 3);
}

#[test]
fn the_gemm_part_limit_is_the_default_unless_a_test_asks_and_at_least_1024() {
    let p = |json: &str| req(json).validate(0).unwrap().weight_part_bytes;
    assert_eq!(p("{}"), crate::graph::weight_parts::MAX_PART_BYTES);
    assert_eq!(p(r#"{"weightPartBytes":16384}"#), 16384);
    assert_eq!(p(r#"{"weightPartBytes":0}"#), 1024);
    let options =
        req(r#"{"weightPartBytes":16384}"#).validate(0).unwrap().session_options(Graph::Transformer);
    assert_eq!(options.weight_part_bytes, 16384, "a session made with other parts is not reused");
}
