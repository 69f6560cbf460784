//! Takes the embedding tables out of a graph on disk, as the stage worker does in memory before it
//! creates a session (`imagine_core::graph::tables::take_out`):
//!
//! ```text
//! cargo run -p imagine-core --example take_tables_out -- IN.onnx OUT.onnx [--json FILE]
//! ```
//!
//! Writes the new graph to OUT.onnx (put it beside IN.onnx: its external data stays where it was) and
//! prints the lookups, also as JSON to FILE with `--json`, for `tools/export/tests` to check that the
//! new graph fed the gathered rows computes exactly what the original computes.

use imagine_core::graph::tables::take_out;

const USAGE: &str = "usage: take_tables_out IN.onnx OUT.onnx [--json FILE]";

fn main() {
    if let Err(e) = run() {
        eprintln!("take_tables_out: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, output, json) = match args.as_slice() {
        [i, o] => (i, o, None),
        [i, o, flag, j] if flag == "--json" => (i, o, Some(j)),
        _ => return Err(USAGE.into()),
    };
    let model = std::fs::read(input).map_err(|e| format!("{input}: {e}"))?;
    let (graph, lookups) = take_out(&model).map_err(|e| format!("{input}: {e}"))?;
    std::fs::write(output, &graph).map_err(|e| format!("{output}: {e}"))?;
    let text = serde_json::to_string_pretty(&lookups).map_err(|e| e.to_string())?;
    println!("{text}");
    if let Some(json) = json {
        std::fs::write(json, &text).map_err(|e| format!("{json}: {e}"))?;
    }
    Ok(())
}
