//! Prerequisites: what `build`, `dist`, `run`, `bench`, `e2e` and `test` need on the machine, and
//! installing what is missing.
//!
//! On a fresh Debian 12 machine with only Rust (rustup), Node 20 and Python 3 this installs:
//!
//! | what | when | how |
//! |---|---|---|
//! | the `wasm32-unknown-unknown` target | always | `rustup target add` |
//! | wasm-bindgen-cli at the version Cargo.toml pins | always | `cargo install` |
//! | node_modules/ as package-lock.json locks it | always | `npm ci` |
//! | Debian's Chromium | browser tests, `run`, `bench` | `apt-get` (as root; otherwise it says the command) |
//! | Debian's Firefox ESR and Mesa's Vulkan drivers (lavapipe: WebGPU with `shader-f16` on the CPU) | browser tests | `apt-get` (as root; otherwise it says the command) |
//! | tests/reference/requirements.txt | browser tests, fixture check | `pip install -r` |
//! | tools/export/requirements.txt (torch, diffusers, …) in `target/export-venv` | `test` (the exporter's tests) | `python3 -m venv`, `pip install -r` |
//!
//! Each install prints one line, `xtask: installing X (reason)`. When everything is there the checks
//! start no network traffic and take a fraction of a second, so every command runs them.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{run_cmd, Result};

/// Debian's Chromium binary (`/usr/bin/chromium` is a shell wrapper around it); the e2e harness
/// uses the same default and the same `IMAGINE_CHROMIUM` override.
const CHROMIUM: &str = "/usr/lib/chromium/chromium";
/// Debian's Firefox ESR; the Firefox tests use the same default and the same `IMAGINE_FIREFOX` override.
const FIREFOX: &str = "/usr/bin/firefox-esr";
/// Mesa's software Vulkan driver, which Firefox's WebGPU runs on in the tests (no GPU there).
const LAVAPIPE_ICD: &str = "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json";
const WASM_TARGET: &str = "wasm32-unknown-unknown";
const REQUIREMENTS: &str = "tests/reference/requirements.txt";
const EXPORT_REQUIREMENTS: &str = "tools/export/requirements.txt";
/// The exporter's virtual environment (torch and its CUDA libraries from PyPI: about 6 GB), kept out of
/// the system Python.
const EXPORT_VENV: &str = "target/export-venv";

/// What a command needs beyond the build tools (wasm32 target, wasm-bindgen, node_modules), which
/// every command needs.
#[derive(Clone, Copy, Debug)]
pub struct Needs {
    /// Chromium, to load the extension.
    pub chromium: bool,
    /// Firefox ESR and lavapipe, for the Firefox tests.
    pub firefox: bool,
    /// The Python packages of the reference and the fixture generator.
    pub python: bool,
}

impl Needs {
    /// `build`, `dist`.
    pub const BUILD: Needs = Needs { chromium: false, firefox: false, python: false };
    /// `run`, `bench`.
    pub const CHROMIUM: Needs = Needs { chromium: true, firefox: false, python: false };
    /// `run --browser firefox`.
    pub const FIREFOX: Needs = Needs { chromium: false, firefox: true, python: false };
    /// `e2e`, `test`: the browser tests, in Chromium and Firefox, compare with the Python reference.
    pub const ALL: Needs = Needs { chromium: true, firefox: true, python: true };
}

/// The tools found (or installed) that the build calls by path.
#[derive(Debug)]
pub struct Tools {
    pub wasm_bindgen: PathBuf,
}

/// Checks every prerequisite `needs` names, installing what is missing, in the order of least
/// surprise: the Rust pieces, node_modules, Python packages, then Chromium (apt).
pub fn ensure_prerequisites(root: &Path, needs: Needs) -> Result<Tools> {
    let mut present = Vec::new();
    ensure_wasm_target()?;
    present.push(WASM_TARGET.to_string());
    let wasm_bindgen = ensure_wasm_bindgen(root)?;
    present.push(format!("wasm-bindgen {}", pinned_wasm_bindgen(root)?));
    ensure_node_modules(root)?;
    present.push("node_modules".into());
    if needs.python {
        ensure_python_packages(root)?;
        present.push("Python packages".into());
    }
    if needs.chromium {
        let chromium = ensure_chromium()?;
        present.push(chromium.display().to_string());
    }
    if needs.firefox {
        let firefox = ensure_firefox()?;
        present.push(firefox.display().to_string());
    }
    println!("xtask: prerequisites ok: {}", present.join(", "));
    Ok(Tools { wasm_bindgen })
}

fn installing(what: &str, why: &str) {
    println!("xtask: installing {what} ({why})");
}

fn cargo() -> std::ffi::OsString {
    env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Whether this process runs as root (the owner of `/proc/self` is the effective uid).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

// ---------------------------------------------------------------------------------------------
// Rust: the wasm32 target

fn ensure_wasm_target() -> Result {
    if wasm_target_installed() {
        return Ok(());
    }
    installing(&format!("Rust target {WASM_TARGET}"), "the extension's code is built for it");
    run_cmd("rustup target add", Command::new("rustup").args(["target", "add", WASM_TARGET]))?;
    if !wasm_target_installed() {
        return Err(format!(
            "`rustup target add {WASM_TARGET}` ran, but the target's library is still missing"
        ));
    }
    Ok(())
}

/// The target's standard library is in the sysroot of the rustc that cargo uses (the rustc next
/// to `$CARGO` under rustup, else the one on PATH).
fn wasm_target_installed() -> bool {
    let rustc = env::var_os("CARGO")
        .map(PathBuf::from)
        .and_then(|c| c.parent().map(|d| d.join("rustc")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("rustc"));
    let Ok(out) = Command::new(rustc).args(["--print", "sysroot"]).output() else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    !sysroot.is_empty() && Path::new(&sysroot).join("lib/rustlib").join(WASM_TARGET).join("lib").is_dir()
}

// ---------------------------------------------------------------------------------------------
// Rust: wasm-bindgen-cli at the pinned version

/// Finds wasm-bindgen at exactly the pinned version (PATH, then `$CARGO_HOME/bin`), installing it
/// with `cargo install` into `$CARGO_HOME/bin` when none matches.
fn ensure_wasm_bindgen(root: &Path) -> Result<PathBuf> {
    let want = pinned_wasm_bindgen(root)?;
    let installed_bin = cargo_home().map(|h| h.join("bin/wasm-bindgen"));
    let mut candidates = vec![PathBuf::from("wasm-bindgen")];
    candidates.extend(installed_bin.clone());
    let mut found = Vec::new();
    for bin in &candidates {
        match wasm_bindgen_version(bin) {
            Some(v) if v == want => return Ok(bin.clone()),
            Some(v) => found.push(format!("{v} at {}", bin.display())),
            None => {}
        }
    }
    let why = if found.is_empty() {
        format!("Cargo.toml pins wasm-bindgen ={want}; none found")
    } else {
        format!("Cargo.toml pins wasm-bindgen ={want}; found {}", found.join(", "))
    };
    installing(&format!("wasm-bindgen-cli {want} (cargo install)"), &why);
    // No --locked: it fails on the registry mirror.
    run_cmd(
        "cargo install wasm-bindgen-cli",
        Command::new(cargo()).args(["install", "wasm-bindgen-cli", "--version", &want]),
    )?;
    for bin in installed_bin.iter().chain(&candidates) {
        if wasm_bindgen_version(bin).as_deref() == Some(want.as_str()) {
            return Ok(bin.clone());
        }
    }
    Err(format!("installed wasm-bindgen-cli {want}, but no wasm-bindgen {want} is found on PATH or in $CARGO_HOME/bin"))
}

fn cargo_home() -> Option<PathBuf> {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
}

/// `wasm-bindgen 0.2.130` -> `0.2.130`; None when it does not run.
fn wasm_bindgen_version(bin: &Path) -> Option<String> {
    let out = Command::new(bin).arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).split_whitespace().nth(1).map(str::to_string)
}

/// `wasm-bindgen = "=X"` under `[workspace.dependencies]` of the root Cargo.toml.
pub fn pinned_wasm_bindgen(root: &Path) -> Result<String> {
    let text = fs::read_to_string(root.join("Cargo.toml")).map_err(|e| format!("Cargo.toml: {e}"))?;
    parse_wasm_bindgen_pin(&text)
}

fn parse_wasm_bindgen_pin(cargo_toml: &str) -> Result<String> {
    let mut section = String::new();
    for line in cargo_toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        if section != "[workspace.dependencies]" {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if key.trim() != "wasm-bindgen" {
            continue;
        }
        // `"=0.2.130"` or `{ version = "=0.2.130", ... }`
        let value = value.trim();
        let version = if value.starts_with('{') {
            value.split("version").nth(1).and_then(|v| v.split('"').nth(1))
        } else {
            value.split('"').nth(1)
        };
        if let Some(v) = version {
            if let Some(exact) = v.strip_prefix('=') {
                return Ok(exact.trim().to_string());
            }
            return Err(format!("wasm-bindgen must be pinned with `=` in Cargo.toml, found \"{v}\""));
        }
    }
    Err("no `wasm-bindgen = \"=X\"` in [workspace.dependencies] of Cargo.toml".into())
}

// ---------------------------------------------------------------------------------------------
// npm: node_modules as locked

fn ensure_node_modules(root: &Path) -> Result {
    let Some(why) = node_modules_mismatch(root)? else {
        return Ok(());
    };
    installing("node_modules (npm ci)", &why);
    run_cmd("npm ci", Command::new("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(root))?;
    if let Some(why) = node_modules_mismatch(root)? {
        return Err(format!("`npm ci` ran, but node_modules still does not match package-lock.json: {why}"));
    }
    Ok(())
}

/// Why node_modules/ does not match package-lock.json (None when it does): every package the lock
/// names is in npm's own record of what it installed (`node_modules/.package-lock.json`) at the
/// locked version. Optional packages npm skipped (another platform's) do not count.
fn node_modules_mismatch(root: &Path) -> Result<Option<String>> {
    let lock = root.join("package-lock.json");
    let want = read_json(&lock)?;
    let have_path = root.join("node_modules/.package-lock.json");
    if !have_path.exists() {
        return Ok(Some("node_modules is missing".into()));
    }
    let have = read_json(&have_path)?;
    Ok(lock_mismatch(&want, &have))
}

fn lock_mismatch(want: &serde_json::Value, have: &serde_json::Value) -> Option<String> {
    let empty = serde_json::Map::new();
    let want = want.get("packages").and_then(|p| p.as_object()).unwrap_or(&empty);
    let have = have.get("packages").and_then(|p| p.as_object()).unwrap_or(&empty);
    let mut problems = Vec::new();
    for (path, entry) in want {
        if path.is_empty() {
            continue;
        }
        let version = entry.get("version").and_then(|v| v.as_str());
        match have.get(path) {
            None if entry.get("optional").and_then(|o| o.as_bool()) == Some(true) => {}
            None => problems.push(format!("{path} missing")),
            Some(h) if h.get("version").and_then(|v| v.as_str()) != version => problems.push(format!(
                "{path} is {}, locked {}",
                h.get("version").and_then(|v| v.as_str()).unwrap_or("?"),
                version.unwrap_or("?")
            )),
            Some(_) => {}
        }
    }
    if problems.is_empty() {
        return None;
    }
    let n = problems.len();
    problems.truncate(3);
    let more = if n > 3 { format!(" and {} more", n - 3) } else { String::new() };
    Some(format!("{}{more}", problems.join(", ")))
}

pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// Python packages

/// One python3 start asks for every pinned package's installed version; pip runs only when one
/// is missing or at another version (pip itself would contact the index to say so).
pub fn ensure_python_packages(root: &Path) -> Result {
    let path = root.join(REQUIREMENTS);
    let text = fs::read_to_string(&path).map_err(|e| format!("{REQUIREMENTS}: {e}"))?;
    let pins = parse_requirements(&text);
    let probe = python_probe(&pins)?;
    let wrong: Vec<String> = pins
        .iter()
        .filter_map(|(name, want)| match probe.versions.get(name) {
            Some(Some(have)) if have == want => None,
            Some(Some(have)) => Some(format!("{name} {have} installed, {want} wanted")),
            _ => Some(format!("{name} missing")),
        })
        .collect();
    if wrong.is_empty() {
        return Ok(());
    }
    if !probe.pip {
        if is_root() && has_apt() {
            installing("python3-pip (apt-get)", "python3 has no pip");
            apt_install(&["python3-pip"])?;
        } else {
            return Err(format!(
                "{} and python3 has no pip: run `sudo apt-get install -y python3-pip`, then again",
                wrong.join(", ")
            ));
        }
    }
    let mut pip = Command::new("python3");
    pip.args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "-r"]).arg(&path);
    let mut note = String::new();
    if probe.externally_managed {
        // Debian's own python3 refuses pip installs (PEP 668) outside a virtual environment.
        if !is_root() {
            return Err(format!(
                "{}; this python3 is managed by the system (PEP 668): activate a virtual environment \
                 (python3 -m venv ~/.venv-imagine && . ~/.venv-imagine/bin/activate) and run again, or run \
                 `python3 -m pip install --break-system-packages -r {REQUIREMENTS}`",
                wrong.join(", ")
            ));
        }
        pip.arg("--break-system-packages");
        note = ", into the system python3 (--break-system-packages)".into();
    }
    installing(&format!("Python packages from {REQUIREMENTS} (pip{note})"), &wrong.join(", "));
    run_cmd("pip install", &mut pip)?;
    let after = python_probe(&pins)?;
    let still: Vec<&str> = pins
        .iter()
        .filter(|(name, want)| after.versions.get(name).and_then(|v| v.as_deref()) != Some(want.as_str()))
        .map(|(name, _)| name.as_str())
        .collect();
    if !still.is_empty() {
        return Err(format!("pip ran, but these are still not at the pinned version: {}", still.join(", ")));
    }
    Ok(())
}

/// `name==version` lines (comments, blanks and unpinned lines are skipped: they are not checked).
fn parse_requirements(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_once("=="))
        .map(|(n, v)| (normalize_name(n), v.trim().to_string()))
        .collect()
}

/// PEP 503 normalisation: lower case, runs of `-_.` become `-`.
fn normalize_name(name: &str) -> String {
    let mut out = String::new();
    for c in name.trim().chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

struct PythonProbe {
    versions: std::collections::HashMap<String, Option<String>>,
    pip: bool,
    externally_managed: bool,
}

const PROBE: &str = r#"
import importlib.metadata as m, importlib.util as u, os, sys, sysconfig
for name in sys.argv[1:]:
    try:
        print("pkg", name, m.version(name))
    except m.PackageNotFoundError:
        print("pkg", name, "-")
print("pip", "1" if u.find_spec("pip") else "0")
venv = sys.prefix != sys.base_prefix
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
print("managed", "1" if os.path.exists(marker) and not venv else "0")
"#;

fn python_probe(pins: &[(String, String)]) -> Result<PythonProbe> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(PROBE)
        .args(pins.iter().map(|(n, _)| n))
        .output()
        .map_err(|e| format!("could not start python3: {e} (install Python 3.11)"))?;
    if !out.status.success() {
        return Err(format!("python3 probe failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let mut probe = PythonProbe { versions: Default::default(), pip: false, externally_managed: false };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["pkg", name, "-"] => {
                probe.versions.insert(name.to_string(), None);
            }
            ["pkg", name, version] => {
                probe.versions.insert(name.to_string(), Some(version.to_string()));
            }
            ["pip", flag] => probe.pip = *flag == "1",
            ["managed", flag] => probe.externally_managed = *flag == "1",
            _ => {}
        }
    }
    Ok(probe)
}

// ---------------------------------------------------------------------------------------------
// Chromium

/// `$IMAGINE_CHROMIUM` if set (never installed: it is the caller's choice), else Debian's Chromium,
/// installed with apt-get when running as root.
fn ensure_chromium() -> Result<PathBuf> {
    if let Some(custom) = env::var_os("IMAGINE_CHROMIUM") {
        let p = PathBuf::from(custom);
        if p.is_file() {
            return Ok(p);
        }
        return Err(format!("IMAGINE_CHROMIUM={} does not exist", p.display()));
    }
    let p = PathBuf::from(CHROMIUM);
    if p.is_file() {
        return Ok(p);
    }
    if !has_apt() {
        return Err(format!(
            "Chromium is missing ({CHROMIUM}) and this is not a Debian-like system (no apt-get): \
             install Chromium and set IMAGINE_CHROMIUM to its binary"
        ));
    }
    if !is_root() {
        return Err(chromium_not_root_message());
    }
    installing(
        "chromium (apt-get)",
        &format!("{CHROMIUM} is missing; the browser tests and `run` load the extension into it"),
    );
    apt_install(&["chromium"])?;
    if !p.is_file() {
        return Err(format!("apt-get installed chromium, but {CHROMIUM} is still missing"));
    }
    Ok(p)
}

/// `$IMAGINE_FIREFOX` if set (never installed), else Debian's Firefox ESR with Mesa's Vulkan drivers,
/// installed with apt-get when running as root.
fn ensure_firefox() -> Result<PathBuf> {
    if let Some(custom) = env::var_os("IMAGINE_FIREFOX") {
        let p = PathBuf::from(custom);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("IMAGINE_FIREFOX={} does not exist", p.display()))
        };
    }
    let p = PathBuf::from(FIREFOX);
    if p.is_file() && Path::new(LAVAPIPE_ICD).is_file() {
        return Ok(p);
    }
    let packages = ["firefox-esr", "mesa-vulkan-drivers"];
    if !has_apt() || !is_root() {
        return Err(format!(
            "Firefox ESR ({FIREFOX}) or Mesa's Vulkan drivers ({LAVAPIPE_ICD}) are missing: run `sudo \
             apt-get update && sudo apt-get install -y {}`, then again (or set IMAGINE_FIREFOX)",
            packages.join(" ")
        ));
    }
    installing(
        "firefox-esr and mesa-vulkan-drivers (apt-get)",
        "the Firefox tests run the extension there, on WebGPU over lavapipe",
    );
    apt_install(&packages)?;
    if !p.is_file() {
        return Err(format!("apt-get installed firefox-esr, but {FIREFOX} is still missing"));
    }
    Ok(p)
}

fn chromium_not_root_message() -> String {
    format!(
        "Chromium is missing ({CHROMIUM}) and installing it needs root: run \
         `sudo apt-get update && sudo apt-get install -y chromium`, then again"
    )
}

fn has_apt() -> bool {
    Path::new("/usr/bin/apt-get").exists()
}

fn apt_install(packages: &[&str]) -> Result {
    run_cmd(
        "apt-get update",
        Command::new("apt-get").args(["update", "-q"]).env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    run_cmd(
        "apt-get install",
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// The exporter's virtual environment with tools/export/requirements.txt installed; its python. A stamp
/// file holds the requirements it was made from, so a changed pin reinstalls and nothing else does.
pub fn ensure_export_venv(root: &Path) -> Result<PathBuf> {
    let venv = root.join(EXPORT_VENV);
    let python = venv.join("bin/python");
    let requirements = root.join(EXPORT_REQUIREMENTS);
    let wanted = fs::read_to_string(&requirements).map_err(|e| format!("{}: {e}", requirements.display()))?;
    let stamp = venv.join(".requirements");
    if python.exists() && fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(python);
    }
    if !python.exists() {
        installing(&format!("a virtual environment in {EXPORT_VENV}"), "the exporter's tests need torch");
        run_cmd("python3 -m venv", Command::new("python3").args(["-m", "venv"]).arg(&venv))
            .map_err(|e| format!("{e}: on Debian, `apt-get install -y python3-venv` provides it"))?;
    }
    installing(
        &format!("Python packages from {EXPORT_REQUIREMENTS} into {EXPORT_VENV}"),
        "torch is about 6 GB",
    );
    run_cmd(
        "pip install (exporter)",
        Command::new(&python)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "-r"])
            .arg(&requirements),
    )?;
    fs::write(&stamp, wanted).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(python)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_wasm_bindgen_pin() {
        let toml = "[workspace]\nmembers = []\n[workspace.dependencies]\nwasm-bindgen = \"=0.2.130\"\n";
        assert_eq!(parse_wasm_bindgen_pin(toml).unwrap(), "0.2.130");
        let table =
            "[workspace.dependencies]\nwasm-bindgen = { version = \"=0.2.99\", default-features = false }\n";
        assert_eq!(parse_wasm_bindgen_pin(table).unwrap(), "0.2.99");
        assert!(parse_wasm_bindgen_pin("[workspace.dependencies]\nwasm-bindgen = \"0.2\"\n").is_err());
        assert!(parse_wasm_bindgen_pin("[dependencies]\nwasm-bindgen = \"=0.2.1\"\n").is_err());
    }

    #[test]
    fn the_repo_pins_wasm_bindgen() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let v = pinned_wasm_bindgen(root).unwrap();
        assert!(v.split('.').count() == 3 && v.split('.').all(|p| p.parse::<u32>().is_ok()), "{v}");
    }

    #[test]
    fn node_modules_must_match_the_lock() {
        let want = json!({"packages": {
            "": {"name": "imagine"},
            "node_modules/a": {"version": "1.0.0"},
            "node_modules/b": {"version": "2.0.0"},
            "node_modules/c": {"version": "3.0.0", "optional": true},
        }});
        let same = json!({"packages": {
            "node_modules/a": {"version": "1.0.0"},
            "node_modules/b": {"version": "2.0.0"},
        }});
        assert_eq!(lock_mismatch(&want, &same), None);
        let old = json!({"packages": {"node_modules/a": {"version": "0.9.0"}}});
        assert_eq!(
            lock_mismatch(&want, &old).as_deref(),
            Some("node_modules/a is 0.9.0, locked 1.0.0, node_modules/b missing")
        );
    }

    #[test]
    fn requirements_are_read_as_pins() {
        let text = "# comment\nnumpy==2.4.6\nOnnx_Runtime == 1.32.0  # why\n\nrequests>=2\n";
        assert_eq!(
            parse_requirements(text),
            vec![
                ("numpy".to_string(), "2.4.6".to_string()),
                ("onnx-runtime".to_string(), "1.32.0".to_string())
            ]
        );
    }

    #[test]
    fn without_root_chromium_names_the_command() {
        let m = chromium_not_root_message();
        assert!(m.contains("sudo apt-get install -y chromium"), "{m}");
    }
}
