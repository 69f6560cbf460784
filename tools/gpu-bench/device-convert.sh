#!/bin/bash
# The conversion check, ON the device machine, from the repository root, everything
# it needs under .gpu/ (prepare.sh; README.md, "Conversion mode"). Phases, each skipped when an
# earlier call on the same (still warm) machine finished it (markers in /tmp):
#   1. setup: as device.sh (loader debs, Node, dawn.node, ORT Web files, diffusers), plus the core's
#      convert_pack example;
#   2. export, three processes at once: the float16-activation transformer and text encoder into
#      /tmp/pack16 (the published pack's form), the float32-activation transformer of the same seed
#      into /tmp/pack32;
#   3. convert /tmp/pack16 with the core's pack conversion for the H200's limits (convert_pack);
#   4. compare the converted transformer with the float32 export on one set of inputs: ORT Web
#      (JSPI build) on WebGPU through Dawn, then, if time is left, onnxruntime CPU.
# Output: $OUT/device.log, $OUT/convert.json, $OUT/compare-webgpu.json, $OUT/compare-cpu.json,
# $OUT/export.json, $OUT/results.tgz (all logs).
set -u
G=$PWD/.gpu
W=/tmp/gpubench
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-585}
CONFIG=${CONFIG:-full}
EP=${EP:-webgpu}
SIZE=${SIZE:-256}
TEXT=${TEXT:-512}
MAX_BUFFER_SIZE=${MAX_BUFFER_SIZE:-1099511627776}                     # the H200's Dawn adapter (BENCHMARKS.md)
MAX_STORAGE_BUFFER_BINDING_SIZE=${MAX_STORAGE_BUFFER_BINDING_SIZE:-2147483644}
T0=$SECONDS
left() { echo $((LIMIT - (SECONDS - T0))); }
mkdir -p $W/logs $OUT
exec > >(tee -a $OUT/device.log) 2>&1
finish() {
  cp $W/logs/convert.json $W/logs/compare-*.json $OUT/ 2>/dev/null
  python3 - "$W/logs" "$OUT/export.json" <<'EOF' 2>/dev/null
import glob, json, os, sys
out = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.export.json"))):
    out[os.path.basename(f)[:-len(".export.json")]] = json.load(open(f))
json.dump(out, open(sys.argv[2], "w"), indent=2)
EOF
  (cd $W/logs && tar czf $OUT/results.tgz .)
}
trap finish EXIT
echo "== $(date -u +%FT%TZ) device-convert.sh, limit ${LIMIT} s"

# ---- 1. setup ------------------------------------------------------------------------------------
if [ ! -e $W/.setup-convert ]; then
  if [ -z "${NO_DEBS:-}" ]; then
    for f in $G/debs/*.deb; do dpkg -x $f /; done
    ldconfig
  fi
  xz -dc $G/node.xz > $W/node && chmod +x $W/node
  xz -dc $G/dawn.node.xz > $W/dawn.node
  mkdir -p $W/ort
  cp $G/ort/*.mjs $W/ort/
  xz -dc $G/ort/jspi.wasm.xz > $W/ort/ort-wasm-simd-threaded.jspi.wasm
  xz -dc $G/ort/async.wasm.xz > $W/ort/ort-wasm-simd-threaded.asyncify.wasm
  xz -dc $G/convert_pack.xz > $W/convert_pack && chmod +x $W/convert_pack
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $G/whl/*.whl || exit 1
  touch $W/.setup-convert
fi
export PYTHONPATH=/tmp/site
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nproc; free -g | head -2; df -h /tmp | tail -1
$W/node --version
python3 -c 'import torch, transformers, diffusers, onnx, onnxruntime, onnxscript; print("torch", torch.__version__, "transformers", transformers.__version__, "diffusers", diffusers.__version__, "onnx", onnx.__version__, "onnxruntime", onnxruntime.__version__, "onnxscript", onnxscript.__version__)'
echo "== setup done at $((SECONDS - T0)) s"

# ---- 2. export -----------------------------------------------------------------------------------
if [ ! -e $W/.exported ]; then
  (while true; do echo "$((SECONDS - T0)) s: $(free -g | awk '/Mem/{print "used " $3 " GiB, available " $7 " GiB"}'), disk $(df -h /tmp | awk 'NR==2{print $3 " used"}')"; sleep 15; done) > $W/logs/memory.log &
  MEM=$!
  pids=()
  for job in "transformer_q8 float16 /tmp/pack16" "text_encoder_q4 float16 /tmp/pack16" "transformer_q8 float32 /tmp/pack32"; do
    set -- $job
    mkdir -p $3
    PYTHONUNBUFFERED=1 timeout $(( $(left) - 20 )) python3 $G/tools/gpu-bench/export_stage.py \
      --stem $1 --config $CONFIG --activations $2 --out $3 --threads 5 > $W/logs/export-$1-$2.log 2>&1 &
    pids+=($!)
  done
  ok=1
  for p in "${pids[@]}"; do wait $p || ok=0; done
  kill $MEM
  for f in $W/logs/export-*.log; do grep -v Warning $f | grep "^t\|Error\|error" | tail -n 4; done
  tail -n 3 $W/logs/memory.log
  [ $ok = 1 ] || { echo "export FAILED"; exit 1; }
  cp /tmp/pack16/transformer_q8.export.json $W/logs/transformer_q8-float16.export.json
  cp /tmp/pack16/text_encoder_q4.export.json $W/logs/text_encoder_q4-float16.export.json
  cp /tmp/pack32/transformer_q8.export.json $W/logs/transformer_q8-float32.export.json
  ls -la /tmp/pack16 /tmp/pack32
  touch $W/.exported
fi
echo "== export done at $((SECONDS - T0)) s"

# ---- 3. convert ----------------------------------------------------------------------------------
if [ ! -e $W/.converted ]; then
  du -sb /tmp/pack16 | awk '{print "pack16 before: " $1 " B"}'
  /usr/bin/time -v $W/convert_pack /tmp/pack16 --max-buffer-size $MAX_BUFFER_SIZE \
    --max-storage-buffer-binding-size $MAX_STORAGE_BUFFER_BINDING_SIZE --json $W/logs/convert.json \
    2> $W/logs/convert-time.log || { cat $W/logs/convert-time.log; echo "convert FAILED"; exit 1; }
  grep -E "Elapsed|Maximum resident" $W/logs/convert-time.log
  du -sb /tmp/pack16 | awk '{print "pack16 after: " $1 " B"}'
  ls -la /tmp/pack16
  touch $W/.converted
fi
echo "== convert done at $((SECONDS - T0)) s"

# ---- 4. compare ----------------------------------------------------------------------------------
CMP="python3 $G/tools/gpu-bench/compare_transformer.py --reference /tmp/pack32/transformer_q8.onnx
  --converted /tmp/pack16/transformer_q8.f32.onnx --size $SIZE --text $TEXT --seed 7"
if [ ! -e $W/.cmp-web ]; then
  PYTHONUNBUFFERED=1 timeout $(( $(left) - 5 )) $CMP --work /tmp/cmp-web --node $W/node --ort-dir $W/ort \
    --dawn $W/dawn.node --ep $EP --build jspi --json $W/logs/compare-$EP.json && touch $W/.cmp-web
fi
echo "== $EP compare done at $((SECONDS - T0)) s"
if [ ! -e $W/.cmp-cpu ] && [ $(left) -gt 120 ]; then
  PYTHONUNBUFFERED=1 timeout $(( $(left) - 5 )) $CMP --work /tmp/cmp-cpu --cpu --json $W/logs/compare-cpu.json \
    && touch $W/.cmp-cpu
fi
echo "== all done at $((SECONDS - T0)) s"
