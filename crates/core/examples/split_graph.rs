//! Cuts a graph into a chain of pieces on disk, as the stage worker will for the VAE decoder
//! (`imagine_core::graph::split`):
//!
//! ```text
//! cargo run -q -p imagine-core --example split_graph -- MODEL.onnx OUT_DIR LATENT_H LATENT_W MAX_PIECE_BYTES
//! ```
//!
//! Writes `OUT_DIR/piece-N.onnx` (their external data is read from the same files as MODEL.onnx's: put
//! those beside them) and prints, as JSON, the whole graph's activation bytes and each piece's file,
//! inputs, outputs, original nodes and bytes, for `tools/export/tests/test_split_graph.py` to run the
//! chain against the whole graph.

use imagine_core::graph::split;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, out_dir, h, w, max] = args.as_slice() else {
        eprintln!("usage: split_graph MODEL.onnx OUT_DIR LATENT_H LATENT_W MAX_PIECE_BYTES");
        std::process::exit(2);
    };
    match run(model, out_dir, h, w, max) {
        Ok(json) => println!("{json}"),
        Err(e) => {
            eprintln!("split_graph: {model}: {e}");
            std::process::exit(1);
        }
    }
}

fn run(model: &str, out_dir: &str, h: &str, w: &str, max: &str) -> Result<serde_json::Value, String> {
    let number = |s: &str| s.parse::<u64>().map_err(|e| format!("{s:?}: {e}"));
    let (h, w, max) = (number(h)?, number(w)?, number(max)?);
    let bytes = std::fs::read(model).map_err(|e| e.to_string())?;
    let whole = split::activation_bytes(&bytes, h, w).map_err(|e| e.to_string())?;
    let pieces = split::split(&bytes, h, w, max).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(out_dir).map_err(|e| e.to_string())?;
    let mut listed = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        let file = format!("piece-{i}.onnx");
        std::fs::write(std::path::Path::new(out_dir).join(&file), &piece.model).map_err(|e| e.to_string())?;
        listed.push(serde_json::json!({
            "file": file,
            "inputs": piece.inputs,
            "outputs": piece.outputs,
            "nodes": [piece.nodes.start, piece.nodes.end],
            "bytes": piece.bytes,
        }));
    }
    Ok(serde_json::json!({ "activationBytes": whole, "pieces": listed }))
}
