//! Re-blocks a graph's `MatMulNBits` to 32 on disk, as the stage worker does in memory before it creates
//! a WebGPU session (`imagine_core::matmul_blocks::to_block_32`):
//!
//! ```text
//! cargo run -p imagine-core --example block32 -- IN.onnx OUT.onnx
//! ```
//!
//! Writes the new graph to OUT.onnx (put it beside IN.onnx: its external data stays where it was) and
//! prints how many nodes changed, for `tools/export/tests` to check that it computes what IN.onnx does.

use imagine_core::matmul_blocks::to_block_32;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        eprintln!("usage: block32 IN.onnx OUT.onnx");
        std::process::exit(2);
    };
    let result = std::fs::read(input)
        .map_err(|e| e.to_string())
        .and_then(|model| to_block_32(&model).map_err(|e| e.to_string()))
        .and_then(|(graph, changed)| {
            std::fs::write(output, graph).map(|()| changed).map_err(|e| e.to_string())
        });
    match result {
        Ok(changed) => println!("{changed}"),
        Err(e) => {
            eprintln!("block32: {input}: {e}");
            std::process::exit(1);
        }
    }
}
