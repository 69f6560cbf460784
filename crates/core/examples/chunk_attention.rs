//! Computes a graph's attention in chunks of query rows on disk, as the memory plan asks of the stage
//! worker (`imagine_core::graph::attention::chunk_attention`):
//!
//! ```text
//! cargo run -p imagine-core --example chunk_attention -- IN.onnx OUT.onnx CHUNKS
//! ```
//!
//! Writes the new graph to OUT.onnx (put it beside IN.onnx: its external data stays where it was) and
//! prints how many attentions were chunked, for `tools/export/tests` to check that it computes what
//! IN.onnx does.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, output, chunks) = match args.as_slice() {
        [input, output, chunks] => match chunks.parse::<u32>() {
            Ok(chunks) => (input, output, chunks),
            Err(e) => usage(&format!("CHUNKS {chunks:?}: {e}")),
        },
        _ => usage("three arguments"),
    };
    let chunked = std::fs::read(input)
        .map_err(|e| e.to_string())
        .and_then(|model| {
            imagine_core::graph::attention::chunk_attention(&model, chunks).map_err(|e| e.to_string())
        })
        .and_then(|(graph, n)| std::fs::write(output, graph).map(|()| n).map_err(|e| e.to_string()));
    match chunked {
        Ok(n) => println!("{n}"),
        Err(e) => {
            eprintln!("chunk_attention: {input}: {e}");
            std::process::exit(1);
        }
    }
}

fn usage(why: &str) -> ! {
    eprintln!("usage: chunk_attention IN.onnx OUT.onnx CHUNKS ({why})");
    std::process::exit(2);
}
