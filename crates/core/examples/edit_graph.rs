//! Applies one of the stage worker's node edits to a graph on disk, as the stage worker does in memory
//! before it creates a WebGPU session (`imagine_core::graph::{attention, clip, projections, rows, weight_parts}`):
//!
//! ```text
//! cargo run -p imagine-core --example edit_graph -- fuse-attention IN.onnx OUT.onnx
//! cargo run -p imagine-core --example edit_graph -- chunk-attention IN.onnx OUT.onnx CHUNKS
//! cargo run -p imagine-core --example edit_graph -- per-part IN.onnx OUT.onnx
//! cargo run -p imagine-core --example edit_graph -- chunk-rows IN.onnx OUT.onnx CHUNKS
//! cargo run -p imagine-core --example edit_graph -- clip-as-max-min IN.onnx OUT.onnx
//! cargo run -p imagine-core --example edit_graph -- gemm-parts IN.onnx OUT.onnx MAX_PART_BYTES
//! cargo run -p imagine-core --example edit_graph -- matmul-parts IN.onnx OUT.onnx MAX_PART_BYTES
//! cargo run -p imagine-core --example edit_graph -- by-weights IN.onnx OUT PARTS
//! ```
//!
//! Writes the new graph to OUT.onnx (put it beside IN.onnx: its external data stays where it was) and
//! prints how many places changed (attentions, projections computed per part, chains in chunks, clips,
//! `Gemm`s or `MatMulNBits` in parts), for `tools/export/tests` to check that it computes what IN.onnx does. `by-weights` cuts the graph into
//! PARTS pieces of its weights as the stage worker streams the transformer
//! (`imagine_core::graph::split::by_weights`), writes them to OUT.0.onnx, OUT.1.onnx, ... and prints
//! how many.

use imagine_core::graph::{attention, clip, projections, rows, split, weight_parts, RewriteError};

type Edit = Box<dyn Fn(&[u8]) -> Result<(Vec<u8>, usize), RewriteError>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [e, input, output, parts] = args.as_slice() {
        if e == "by-weights" {
            return pieces(input, output, parts);
        }
    }
    let (edit, input, output): (Edit, _, _) = match args.as_slice() {
        [e, input, output] if e == "fuse-attention" => (Box::new(attention::fuse_attention), input, output),
        [e, input, output] if e == "per-part" => (Box::new(projections::per_part), input, output),
        [e, input, output] if e == "clip-as-max-min" => (Box::new(clip::as_max_min), input, output),
        [e, input, output, chunks] if e == "chunk-attention" => match chunks.parse::<u32>() {
            Ok(chunks) => (Box::new(move |m: &[u8]| attention::chunk_attention(m, chunks)), input, output),
            Err(e) => usage(&format!("CHUNKS {chunks:?}: {e}")),
        },
        [e, input, output, max] if e == "gemm-parts" || e == "matmul-parts" => match max.parse::<u64>() {
            Ok(max) => {
                let op =
                    if e == "gemm-parts" { weight_parts::Op::Gemm } else { weight_parts::Op::MatMulNBits };
                (Box::new(move |m: &[u8]| weight_parts::by_rows(m, max, op)), input, output)
            }
            Err(e) => usage(&format!("MAX_PART_BYTES {max:?}: {e}")),
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

/// `by-weights`: the pieces of `input` written to `output`.N.onnx.
fn pieces(input: &str, output: &str, parts: &str) {
    let Ok(parts) = parts.parse::<u32>() else { usage(&format!("PARTS {parts:?}")) };
    let written = std::fs::read(input).map_err(|e| e.to_string()).and_then(|model| {
        let pieces = split::by_weights(&model, parts).map_err(|e| e.to_string())?;
        for (i, piece) in pieces.iter().enumerate() {
            std::fs::write(format!("{output}.{i}.onnx"), &piece.model).map_err(|e| e.to_string())?;
        }
        Ok(pieces.len())
    });
    match written {
        Ok(n) => println!("{n}"),
        Err(e) => {
            eprintln!("edit_graph: {input}: {e}");
            std::process::exit(1);
        }
    }
}

fn usage(why: &str) -> ! {
    eprintln!("usage: edit_graph fuse-attention|per-part|clip-as-max-min IN.onnx OUT.onnx, chunk-attention|chunk-rows IN.onnx OUT.onnx CHUNKS, gemm-parts|matmul-parts IN.onnx OUT.onnx MAX_PART_BYTES, or by-weights IN.onnx OUT PARTS ({why})");
    std::process::exit(2);
}
