#!/bin/bash
# Runs ON the device machine (NVIDIA H200), from the repository root, everything it needs under .gpu/
# (tools/gpu-bench/README.md says how .gpu/ is filled and how this is called). Phases, each skipped
# when an earlier call on the same (still warm) machine finished it:
#   1. setup: Vulkan/GL loader debs, Node, dawn.node, ORT Web files, tokenizer, the core's bridge,
#      the diffusers wheel;
#   2. export: the full-size float32-activation pack, the three graphs in parallel, into /tmp/pack;
#   3. bench: tools/gpu-bench/bench.mjs with the extension's JSPI build (cold, then the transformer
#      kept loaded);
#   4. if time is left: one cold image with the asyncify build, for comparison.
# Output: $OUT/device.log (everything printed) and $OUT/results.tgz (logs, bench.json, PNGs, traces).
set -u
G=$PWD/.gpu
W=/tmp/gpubench
PACK=/tmp/pack
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-585}            # seconds this command may run (the tool's limit is 600)
PLAN=${PLAN:-none,transformer,transformer}
CONFIG=${CONFIG:-full}         # tiny: the exporter's tiny configuration (to try this script without a GPU)
EP=${EP:-webgpu}               # wasm: ORT's CPU backend (likewise)
T0=$SECONDS
left() { echo $((LIMIT - (SECONDS - T0))); }
mkdir -p $W/logs $OUT
exec > >(tee -a $OUT/device.log) 2>&1
pack_results() { (cd $W/logs && tar czf $OUT/results.tgz .) ; }
trap pack_results EXIT
echo "== $(date -u +%FT%TZ) device.sh, limit ${LIMIT} s"

# ---- 1. setup ------------------------------------------------------------------------------------
if [ ! -e $W/.setup ]; then
  if [ -z "${NO_DEBS:-}" ]; then
    for f in $G/debs/*.deb; do dpkg -x $f /; done
    ldconfig
  fi
  xz -dc $G/node.xz > $W/node && chmod +x $W/node
  xz -dc $G/dawn.node.xz > $W/dawn.node
  mkdir -p $W/ort $W/tok
  cp $G/ort/*.mjs $W/ort/
  xz -dc $G/ort/jspi.wasm.xz > $W/ort/ort-wasm-simd-threaded.jspi.wasm
  xz -dc $G/ort/async.wasm.xz > $W/ort/ort-wasm-simd-threaded.asyncify.wasm
  xz -dc $G/tok/tokenizer.json.xz > $W/tok/tokenizer.json
  cp $G/tok/tokenizer_config.json $W/tok/
  xz -dc $G/stdio_pipeline.xz > $W/stdio_pipeline && chmod +x $W/stdio_pipeline
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $G/whl/*.whl || exit 1
  touch $W/.setup
fi
export PYTHONPATH=/tmp/site
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nproc; free -g | head -2
$W/node --version
python3 -c 'import torch, transformers, diffusers, onnx, onnxruntime, onnxscript; print("torch", torch.__version__, "transformers", transformers.__version__, "diffusers", diffusers.__version__, "onnx", onnx.__version__, "onnxruntime", onnxruntime.__version__, "onnxscript", onnxscript.__version__)'
echo "== setup done at $((SECONDS - T0)) s"

# ---- 2. export -----------------------------------------------------------------------------------
if [ ! -e $PACK/.done ]; then
  mkdir -p $PACK
  (while true; do echo "$((SECONDS - T0)) s: $(free -g | awk '/Mem/{print "used " $3 " GiB, available " $7 " GiB"}'), disk $(df -h /tmp | awk 'NR==2{print $3 " used"}')"; sleep 15; done) > $W/logs/memory.log &
  MEM=$!
  pids=()
  for s in transformer_q8 text_encoder_q4 vae_decoder; do
    PYTHONUNBUFFERED=1 timeout $(( $(left) - 150 )) python3 $G/tools/gpu-bench/export_stage.py \
      --stem $s --config $CONFIG --activations float32 --out $PACK --threads 5 > $W/logs/export-$s.log 2>&1 &
    pids+=($!)
  done
  ok=1
  for p in "${pids[@]}"; do wait $p || ok=0; done
  kill $MEM
  for s in transformer_q8 text_encoder_q4 vae_decoder; do grep -v Warning $W/logs/export-$s.log | grep "^$s\|Error\|error" | tail -n 6; done
  tail -n 3 $W/logs/memory.log
  [ $ok = 1 ] && touch $PACK/.done || { echo "export FAILED"; exit 1; }
  ls -la $PACK
  cp $PACK/*.export.json $W/logs/
fi
echo "== export done at $((SECONDS - T0)) s"

# ---- 3. bench, the extension's build (JSPI) -------------------------------------------------------
bench() { # build plan outdir
  timeout $(( $(left) - 8 )) $W/node --experimental-wasm-jspi $G/tools/gpu-bench/bench.mjs \
    --pack $PACK --bridge $W/stdio_pipeline --tokenizer-dir $W/tok --ort-dir $W/ort \
    --dawn $W/dawn.node --dawn-label webgpu@0.6.2 --ep $EP --build $1 --plan $2 --out $W/logs/$3 --seed 42 --size 512 --steps 4
}
if [ ! -e $W/.bench-jspi ]; then
  bench jspi $PLAN bench-jspi && touch $W/.bench-jspi
fi
echo "== jspi bench done at $((SECONDS - T0)) s"

# ---- 4. asyncify, one cold image -----------------------------------------------------------------
if [ ! -e $W/.bench-asyncify ] && [ $(left) -gt 75 ]; then
  bench asyncify none bench-asyncify && touch $W/.bench-asyncify
fi
echo "== all done at $((SECONDS - T0)) s"
