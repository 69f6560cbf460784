//! Fuses a graph's attention into `MultiHeadAttention` on disk, as the stage worker does in memory before
//! it creates a WebGPU session (`imagine_core::graph::attention`):
//!
//! ```text
//! cargo run -p imagine-core --example fuse_attention -- IN.onnx OUT.onnx
//! ```
//!
//! Writes the new graph to OUT.onnx (put it beside IN.onnx: its external data stays where it was) and
//! prints how many attentions were fused, for `tools/export/tests` to check that it computes what IN.onnx
//! does.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        eprintln!("usage: fuse_attention IN.onnx OUT.onnx");
        std::process::exit(2);
    };
    let fused = std::fs::read(input)
        .map_err(|e| e.to_string())
        .and_then(|model| imagine_core::graph::attention::fuse_attention(&model).map_err(|e| e.to_string()))
        .and_then(|(graph, fused)| std::fs::write(output, graph).map(|()| fused).map_err(|e| e.to_string()));
    match fused {
        Ok(fused) => println!("{fused}"),
        Err(e) => {
            eprintln!("fuse_attention: {input}: {e}");
            std::process::exit(1);
        }
    }
}
