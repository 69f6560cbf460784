//! Applies one of the stage worker's node edits to a graph on disk, as the stage worker does in memory
//! before it creates a WebGPU session (`imagine_core::graph::{attention, projections}`):
//!
//! ```text
//! cargo run -p imagine-core --example edit_graph -- fuse-attention IN.onnx OUT.onnx
//! cargo run -p imagine-core --example edit_graph -- chunk-attention IN.onnx OUT.onnx CHUNKS
//! cargo run -p imagine-core --example edit_graph -- per-part IN.onnx OUT.onnx
//! cargo run -p imagine-core --example edit_graph -- chunk-rows IN.onnx OUT.onnx CHUNKS
//! ```
//!
//! Writes the new graph to OUT.onnx (put it beside IN.onnx: its external data stays where it was) and
//! prints how many places changed (attentions, projections computed per part, chains in chunks), for
//! `tools/export/tests` to check that it computes what IN.onnx does.

use imagine_core::graph::{attention, projections, rows, RewriteError};

type Edit = Box<dyn Fn(&[u8]) -> Result<(Vec<u8>, usize), RewriteError>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (edit, input, output): (Edit, _, _) = match args.as_slice() {
        [e, input, output] if e == "fuse-attention" => (Box::new(attention::fuse_attention), input, output),
        [e, input, output] if e == "per-part" => (Box::new(projections::per_part), input, output),
        [e, input, output, chunks] if e == "chunk-attention" => match chunks.parse::<u32>() {
            Ok(chunks) => (Box::new(move |m: &[u8]| attention::chunk_attention(m, chunks)), input, output),
            Err(e) => usage(&format!("CHUNKS {chunks:?}: {e}")),
        },
        [e, input, output, chunks] if e == "chunk-rows" => match chunks.parse::<u32>() {
            Ok(chunks) => (Box::new(move |m: &[u8]| rows::chunk_rows(m, chunks)), input, output),
            Err(e) => usage(&format!("CHUNKS {chunks:?}: {e}")),
        },
        _ => usage("an edit and its arguments"),
    };
    let edited = std::fs::read(input)
        .map_err(|e| e.to_string())
        .and_then(|model| edit(&model).map_err(|e| e.to_string()))
        .and_then(|(graph, n)| std::fs::write(output, graph).map(|()| n).map_err(|e| e.to_string()));
    match edited {
        Ok(n) => println!("{n}"),
        Err(e) => {
            eprintln!("edit_graph: {input}: {e}");
            std::process::exit(1);
        }
    }
}

fn usage(why: &str) -> ! {
    eprintln!("usage: edit_graph fuse-attention|per-part IN.onnx OUT.onnx, or chunk-attention|chunk-rows IN.onnx OUT.onnx CHUNKS ({why})");
    std::process::exit(2);
}
