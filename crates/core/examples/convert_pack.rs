//! Converts a float16 pack on disk for an adapter without `shader-f16`, with the core's own pack
//! conversion, the one the extension's download worker runs (`crates/web/src/offscreen/convert.rs`):
//!
//! ```text
//! cargo run --release -p imagine-core --example convert_pack -- PACK_DIR \
//!     --max-buffer-size BYTES --max-storage-buffer-binding-size BYTES [--json FILE]
//! ```
//!
//! `pack_conversion::plan_pack` over the pack's graphs (the adapter limits given, the extension's
//! lookup policy), `pack_conversion::cost` (the extra disk and GPU memory the popup states), then,
//! for every planned graph, its new `<stem>.f32-NNNNN.data` files piece by piece
//! (`GraphPlan::file_pieces`, `PIECE_SOURCE_BYTES` at a time, `f16_to_f32`) and its
//! `<stem>.f32.onnx`, written into PACK_DIR beside the pack as the extension writes them into the
//! pack's OPFS slot, and the `ConversionRecord` the extension installs with the pack. What the
//! extension adds around this (its OPFS checkpoints, reading every byte back) is not done here.
//!
//! It prints the cost, the time taken and the record, and writes them as JSON to FILE with `--json`.
//! Files of an earlier run (`*.f32.onnx`, `*.f32-NNNNN.data`) are overwritten, not counted as pack files.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Instant;

use imagine_core::graph::pack_conversion::{
    converted_graph_name, cost, plan_pack, ConversionRecord, GraphPlan, PIECE_SOURCE_BYTES,
};
use imagine_core::graph::{f16_to_f32, Limits};
use imagine_core::pack::Graph;

const USAGE: &str = "usage: convert_pack PACK_DIR --max-buffer-size BYTES \
                     --max-storage-buffer-binding-size BYTES [--json FILE]";

fn main() {
    if let Err(e) = run() {
        eprintln!("convert_pack: {e}");
        std::process::exit(1);
    }
}

/// Whether `name` is a file an earlier conversion wrote (`<stem>.f32.onnx`, `<stem>.f32-NNNNN.data`).
fn is_conversion_output(name: &str) -> bool {
    name.ends_with(".f32.onnx")
        || name.rsplit_once(".f32-").is_some_and(|(_, tail)| {
            tail.strip_suffix(".data").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// What the command line asks for.
struct Args {
    dir: String,
    limits: Limits,
    json: Option<String>,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let (mut dir, mut max_buffer, mut max_binding, mut json) = (None, None, None, None);
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{a} needs a value; {USAGE}"));
            let bytes = |v: &str| v.parse::<u64>().map_err(|e| format!("{a} {v:?}: {e} (a number of bytes)"));
            match a.as_str() {
                "--max-buffer-size" => max_buffer = Some(bytes(value()?)?),
                "--max-storage-buffer-binding-size" => max_binding = Some(bytes(value()?)?),
                "--json" => json = Some(value()?.clone()),
                _ if dir.is_none() && !a.starts_with("--") => dir = Some(a.clone()),
                _ => return Err(format!("unexpected argument {a:?}; {USAGE}")),
            }
        }
        let (Some(dir), Some(max_buffer_size), Some(max_storage_buffer_binding_size)) =
            (dir, max_buffer, max_binding)
        else {
            return Err(USAGE.into());
        };
        Ok(Args { dir, limits: Limits { max_storage_buffer_binding_size, max_buffer_size }, json })
    }
}

/// The files of the pack in `dir` and their sizes, an earlier conversion's left out.
fn pack_files(dir: &Path) -> Result<Vec<(String, u64)>, String> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name =
            entry.file_name().into_string().map_err(|n| format!("a file name that is not UTF-8: {n:?}"))?;
        if entry.file_type().map_err(|e| e.to_string())?.is_file() && !is_conversion_output(&name) {
            files.push((name, entry.metadata().map_err(|e| e.to_string())?.len()));
        }
    }
    Ok(files)
}

/// The pack's graphs found in `dir`, read.
fn read_graphs(dir: &Path) -> Result<Vec<(Graph, Vec<u8>)>, String> {
    let mut graph_bytes = Vec::new();
    for graph in Graph::ALL {
        let path = dir.join(graph.file_name());
        if path.exists() {
            graph_bytes.push((graph, fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?));
        }
    }
    if graph_bytes.is_empty() {
        return Err(format!("{} holds none of the pack's graphs ({USAGE})", dir.display()));
    }
    Ok(graph_bytes)
}

/// Reads, converts and writes one graph's new files and its graph; the bytes written.
fn write_converted(dir: &Path, plan: &GraphPlan, sources: &mut HashMap<String, File>) -> Result<u64, String> {
    let (mut half, mut float) = (Vec::new(), Vec::new());
    let mut written = 0u64;
    for (new, pieces) in plan.file_pieces(PIECE_SOURCE_BYTES) {
        let path = dir.join(&new.name);
        let io = |e: std::io::Error| format!("{}: {e}", path.display());
        let mut out = OpenOptions::new().write(true).create(true).truncate(true).open(&path).map_err(io)?;
        for piece in &pieces {
            let source = match sources.get_mut(&piece.source.file) {
                Some(f) => f,
                None => {
                    let f = File::open(dir.join(&piece.source.file))
                        .map_err(|e| format!("{}: {e}", piece.source.file))?;
                    sources.entry(piece.source.file.clone()).or_insert(f)
                }
            };
            let src_io = |e: std::io::Error| format!("{} at {}: {e}", piece.source.file, piece.source.offset);
            half.resize(piece.source.length as usize, 0);
            source.seek(SeekFrom::Start(piece.source.offset)).map_err(src_io)?;
            source.read_exact(&mut half).map_err(src_io)?;
            float.resize(half.len() * 2, 0);
            f16_to_f32(&half, &mut float).map_err(|e| e.to_string())?;
            out.seek(SeekFrom::Start(piece.target.offset)).map_err(io)?;
            out.write_all(&float).map_err(io)?;
        }
        // The gaps between tensors and the tail are zeros, as in the extension's files.
        out.set_len(new.size).map_err(io)?;
        out.sync_all().map_err(io)?;
        written += new.size;
    }
    let name = converted_graph_name(plan.graph);
    fs::write(dir.join(&name), &plan.rewrite.graph).map_err(|e| format!("{name}: {e}"))?;
    Ok(written + plan.rewrite.graph.len() as u64)
}

/// Every graph of `plans` converted and written, each with a line saying what it wrote; the bytes
/// written.
fn write_all(dir: &Path, plans: &[GraphPlan]) -> Result<u64, String> {
    let mut sources: HashMap<String, File> = HashMap::new();
    let mut written = 0u64;
    for plan in plans {
        let tg = Instant::now();
        written += write_converted(dir, plan, &mut sources)?;
        let p = &plan.rewrite.plan;
        println!(
            "{}: {} tensors into {} new files ({} B), {} inline, {} lookups, float32 I/O {:?}, external data {:?}; {:.2} s",
            converted_graph_name(plan.graph),
            p.copies.len(),
            p.new_files.len(),
            p.new_files.iter().map(|f| f.size).sum::<u64>(),
            p.inline_converted,
            p.lookups.len(),
            p.float32_io,
            p.graph_files,
            tg.elapsed().as_secs_f64()
        );
    }
    Ok(written)
}

fn run() -> Result<(), String> {
    let Args { dir, limits, json } = Args::parse()?;
    let dir = Path::new(&dir);

    let t0 = Instant::now();
    let file_sizes_owned = pack_files(dir)?;
    let listed: Vec<&str> = file_sizes_owned.iter().map(|(n, _)| n.as_str()).collect();
    let file_sizes: HashMap<&str, u64> = file_sizes_owned.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let graph_bytes = read_graphs(dir)?;
    let graphs: Vec<(Graph, &[u8])> = graph_bytes.iter().map(|(g, b)| (*g, b.as_slice())).collect();
    let plans = plan_pack(&graphs, limits, &listed).map_err(|e| e.to_string())?;
    let cost = cost(&plans, &graphs, &file_sizes);
    let plan_s = t0.elapsed().as_secs_f64();
    println!(
        "plan: {} of {} graphs to convert, extra disk {} B ({:.3} GB), GPU {} B ({:.3} GB), planned in {plan_s:.2} s",
        plans.len(),
        graphs.len(),
        cost.extra_disk_bytes,
        cost.extra_disk_bytes as f64 / 1e9,
        cost.gpu_bytes,
        cost.gpu_bytes as f64 / 1e9,
    );

    let t1 = Instant::now();
    let written = write_all(dir, &plans)?;
    let write_s = t1.elapsed().as_secs_f64();
    let record = ConversionRecord::new(&plans, limits);
    let total_s = t0.elapsed().as_secs_f64();
    println!(
        "converted: {written} B written ({:.3} GB) in {write_s:.2} s, {total_s:.2} s in all",
        written as f64 / 1e9
    );
    let summary = serde_json::json!({
        "limits": limits,
        "cost": cost,
        "bytesWritten": written,
        "planSeconds": plan_s,
        "writeSeconds": write_s,
        "totalSeconds": total_s,
        "pieceSourceBytes": PIECE_SOURCE_BYTES,
        "record": record,
    });
    let text = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
    println!("{text}");
    if let Some(path) = json {
        fs::write(&path, text + "\n").map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}
