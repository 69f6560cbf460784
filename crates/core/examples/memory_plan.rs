//! What the GPU memory plan does for the published pack at each preset size, on both paths, under a
//! few budgets: `cargo run -q -p imagine-core --example memory_plan` (BENCHMARKS.md, "GPU memory").

use imagine_core::gpu_memory::{MemoryFacts, Precision, StageWeights, GB};

fn main() {
    let sizes = [(512, 512), (768, 1024), (1024, 768), (1024, 1024)];
    // 7 GB: what the probe leaves of a GPU with 8 GB free (90 % of what it could allocate).
    let budgets = [None, Some(16), Some(12), Some(8), Some(7), Some(6), Some(4)];
    println!("| path | size | budget | plan | attention chunks | projections | decoder pieces of | peak (GB) | fits |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for precision in [Precision::Float16, Precision::Float32] {
        let facts = MemoryFacts { weights: StageWeights::PUBLISHED, precision };
        for (width, height) in sizes {
            for budget in budgets {
                let plan = facts.default_plan(budget.map(|gb| gb * GB), width, height);
                let loading = match (plan.ahead, plan.keep, plan.levers.keep_buffers) {
                    (true, true, true) => "at once, kept, buffers kept",
                    (true, true, false) => "at once, kept",
                    (false, false, true) => "one stage at a time, buffers kept",
                    (false, false, false) => "one stage at a time",
                    _ => "other",
                };
                let loading = match plan.levers.transformer_pieces {
                    1 => loading.to_owned(),
                    n => format!("{loading}, transformer streamed in {n}"),
                };
                let pieces = plan
                    .levers
                    .decoder_piece_bytes
                    .map_or("whole".to_owned(), |b| format!("{:.1} GB", b as f64 / GB as f64));
                println!(
                    "| {precision:?} | {width}x{height} | {} | {loading} | {} | {} | {pieces} | {:.1} | {} |",
                    budget.map_or("none".to_owned(), |gb| format!("{gb} GB")),
                    plan.levers.attention_chunks,
                    match (plan.levers.projections_per_part, plan.levers.token_chunks) {
                        (false, _) => "whole".to_owned(),
                        (true, 1) => "per part".to_owned(),
                        (true, n) => format!("per part, tokens in {n}"),
                    },
                    plan.peak as f64 / GB as f64,
                    if plan.fits { "yes" } else { "no" },
                );
            }
        }
    }
}
