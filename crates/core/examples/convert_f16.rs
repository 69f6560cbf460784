//! Rewrites every float16 graph of a pack directory to float32, the way the extension does it, and
//! writes a complete pack: `cargo run -p imagine-core --example convert_f16 -- IN_DIR OUT_DIR
//! [--max-buffer BYTES] [--lookup always|never|when-too-large] [--piece BYTES]`.
//!
//! For each `<stem>.onnx` in IN_DIR it writes OUT_DIR/`<stem>.onnx` (the rewritten graph), the new
//! `<stem>.f32-NNNNN.data` files (converted piece by piece, as the web side does), a copy of each
//! original external file the new graph or a lookup still needs, `<stem>.manifest.json` listing the
//! new graph's files (when the original has a manifest), and `<stem>.plan.json` (the [`Plan`], for tests and people).

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use imagine_core::graph::{f16_to_f32, rewrite, Limits, LookupPolicy, Options, Plan};

fn main() {
    if let Err(e) = run() {
        eprintln!("convert_f16: {e}");
        std::process::exit(1);
    }
}

/// The command line: the two folders, the buffer limit, the lookup policy and the piece size.
struct Args {
    input: PathBuf,
    output: PathBuf,
    max_buffer: u64,
    lookup: LookupPolicy,
    piece: u64,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let usage = "usage: convert_f16 IN_DIR OUT_DIR [--max-buffer BYTES] [--lookup always|never|when-too-large] [--piece BYTES]";
        let (mut positional, mut max_buffer, mut lookup, mut piece) =
            (Vec::new(), u64::MAX, LookupPolicy::WhenTooLarge, 1 << 20);
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{a} needs a value; {usage}"));
            match a.as_str() {
                "--max-buffer" => max_buffer = value()?.parse().map_err(|e| format!("--max-buffer: {e}"))?,
                "--piece" => piece = value()?.parse().map_err(|e| format!("--piece: {e}"))?,
                "--lookup" => {
                    lookup = match value()?.as_str() {
                        "always" => LookupPolicy::Always,
                        "never" => LookupPolicy::Never,
                        "when-too-large" => LookupPolicy::WhenTooLarge,
                        other => return Err(format!("--lookup {other:?}; {usage}")),
                    }
                }
                _ => positional.push(a.clone()),
            }
        }
        let [input, output] = positional.as_slice() else { return Err(usage.into()) };
        Ok(Args { input: input.into(), output: output.into(), max_buffer, lookup, piece })
    }
}

fn run() -> Result<(), String> {
    let args = Args::parse()?;
    let (input, output) = (args.input.as_path(), args.output.as_path());
    fs::create_dir_all(output).map_err(|e| format!("{}: {e}", output.display()))?;
    let limits =
        Limits { max_storage_buffer_binding_size: args.max_buffer, max_buffer_size: args.max_buffer };
    let mut graphs: Vec<_> = fs::read_dir(input)
        .map_err(|e| format!("{}: {e}", input.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "onnx"))
        .collect();
    graphs.sort();
    for path in graphs {
        let stem = path.file_stem().and_then(|s| s.to_str()).ok_or("a graph name that is not UTF-8")?;
        let bytes = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut options = Options::new(stem, limits);
        options.lookup = args.lookup;
        let rewritten = rewrite(&bytes, &options).map_err(|e| format!("{}: {e}", path.display()))?;
        write_graph(&args, stem, &rewritten.graph, &rewritten.plan)?;
    }
    Ok(())
}

/// One converted graph written into the output folder: its data, the files it keeps, the graph, its
/// manifest and plan; and a line saying what it cost.
fn write_graph(args: &Args, stem: &str, graph: &[u8], plan: &Plan) -> Result<(), String> {
    let (input, output, piece) = (args.input.as_path(), args.output.as_path(), args.piece);
    write_data(input, output, plan, piece)?;
    let mut keep: Vec<&String> = plan.graph_files.iter().collect();
    keep.extend(plan.lookups.iter().map(|l| &l.source.file));
    for file in keep {
        if plan.new_files.iter().all(|f| &f.name != file) {
            fs::copy(input.join(file), output.join(file)).map_err(|e| format!("{file}: {e}"))?;
        }
    }
    fs::write(output.join(format!("{stem}.onnx")), graph).map_err(|e| e.to_string())?;
    if input.join(format!("{stem}.manifest.json")).exists() {
        fs::write(output.join(format!("{stem}.manifest.json")), plan.manifest_json())
            .map_err(|e| e.to_string())?;
    }
    let json = serde_json::to_string_pretty(plan).map_err(|e| e.to_string())?;
    fs::write(output.join(format!("{stem}.plan.json")), json).map_err(|e| e.to_string())?;
    println!(
        "{stem}: {} external tensors ({} pieces) into {} new files, {} inline, {} lookups; extra disk {} B (stale {} B), extra GPU {} B; float32 I/O {:?}",
        plan.copies.len(),
        plan.pieces(piece).len(),
        plan.new_files.len(),
        plan.inline_converted,
        plan.lookups.len(),
        plan.extra_disk_bytes,
        plan.stale_bytes,
        plan.extra_gpu_bytes,
        plan.float32_io
    );
    Ok(())
}

/// Converts the plan's pieces the way the web side does: one bounded buffer at a time.
fn write_data(input: &Path, output: &Path, plan: &Plan, piece: u64) -> Result<(), String> {
    for file in &plan.new_files {
        File::create(output.join(&file.name)).map_err(|e| format!("{}: {e}", file.name))?;
    }
    let mut src = vec![0u8; 0];
    let mut dst = vec![0u8; 0];
    for p in plan.pieces(piece) {
        let io = |e: std::io::Error| format!("{}: {e}", p.source.file);
        let mut reader = File::open(input.join(&p.source.file)).map_err(io)?;
        reader.seek(SeekFrom::Start(p.source.offset)).map_err(io)?;
        src.resize(p.source.length as usize, 0);
        reader.read_exact(&mut src).map_err(io)?;
        dst.resize(p.target.length as usize, 0);
        f16_to_f32(&src, &mut dst).map_err(|e| e.to_string())?;
        let mut writer = fs::OpenOptions::new().write(true).open(output.join(&p.target.file)).map_err(io)?;
        writer.seek(SeekFrom::Start(p.target.offset)).map_err(io)?;
        writer.write_all(&dst).map_err(io)?;
    }
    for file in &plan.new_files {
        let f =
            fs::OpenOptions::new().write(true).open(output.join(&file.name)).map_err(|e| e.to_string())?;
        f.set_len(file.size).map_err(|e| e.to_string())?;
    }
    Ok(())
}
