//! Re-blocks a graph's `MatMulNBits` to 32 on disk, as the stage worker does in memory before it creates
//! a WebGPU session (`imagine_core::graph::reblock`):
//!
//! ```text
//! cargo run -p imagine-core --example block32 -- [--computed] IN.onnx OUT.onnx
//! ```
//!
//! Writes the new graph to OUT.onnx (put it beside IN.onnx: its external data stays where it was) and
//! prints how many nodes changed, for `tools/export/tests` to check that it computes what IN.onnx does.
//! With `--computed` the repeated scales and zero points are computed from IN's (`to_block_32_computed`,
//! what the stage worker runs) and written beside OUT.onnx as `imagine-block32.data`; without it they
//! are nodes (`to_block_32`).

use std::collections::HashMap;
use std::path::Path;

use imagine_core::graph::reblock::{sources_to_read, to_block_32, to_block_32_computed, COMPUTED_DATA};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let computed = args.first().is_some_and(|a| a == "--computed");
    if computed {
        args.remove(0);
    }
    let [input, output] = args.as_slice() else {
        eprintln!("usage: block32 [--computed] IN.onnx OUT.onnx");
        std::process::exit(2);
    };
    match run(Path::new(input), Path::new(output), computed) {
        Ok(changed) => println!("{changed}"),
        Err(e) => {
            eprintln!("block32: {input}: {e}");
            std::process::exit(1);
        }
    }
}

fn run(input: &Path, output: &Path, computed: bool) -> Result<usize, String> {
    let model = std::fs::read(input).map_err(|e| e.to_string())?;
    if !computed {
        let (graph, changed) = to_block_32(&model).map_err(|e| e.to_string())?;
        std::fs::write(output, graph).map_err(|e| e.to_string())?;
        return Ok(changed);
    }
    let dir = input.parent().unwrap_or(Path::new("."));
    let mut read = HashMap::new();
    for range in sources_to_read(&model).map_err(|e| e.to_string())? {
        let file =
            std::fs::read(dir.join(&range.location)).map_err(|e| format!("{}: {e}", range.location))?;
        let bytes = usize::try_from(range.offset)
            .ok()
            .and_then(|start| file.get(start..start + usize::try_from(range.length).ok()?))
            .ok_or_else(|| format!("{} ends before byte {}", range.location, range.offset + range.length))?;
        read.insert(range.clone(), bytes.to_vec());
    }
    let mut data = Vec::new();
    let reblocked =
        to_block_32_computed(&model, &read, COMPUTED_DATA, &mut |bytes| data.extend_from_slice(bytes))
            .map_err(|e| e.to_string())?;
    std::fs::write(output, reblocked.graph).map_err(|e| e.to_string())?;
    let data_dir = output.parent().unwrap_or(Path::new("."));
    std::fs::write(data_dir.join(COMPUTED_DATA), data).map_err(|e| e.to_string())?;
    Ok(reblocked.changed)
}
