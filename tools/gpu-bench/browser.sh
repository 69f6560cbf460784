#!/bin/bash
# Browser mode, ON the GPU machine, from the repository root: the extension's release build in Chromium
# on the GPU, driven by tests/e2e/bench/gpu.mjs (README.md, "Browser mode"). The same command is called
# once per part that prepare-browser.sh made, back to back while the machine is warm, each call carrying
# its part (.gpu/N); then again, carrying nothing, until it prints "bench finished". Each call:
#   1. copies the part it carries to /tmp/gpu;
#   2. once (part 1): unpacks the loaders, Node, the extension and the diffusers wheel,
#      and starts the export of a full-size pack in the published form into /tmp/pack, in the
#      background (it outlives the call): text encoder int4 and transformer int8 with float16
#      activations, float32 decoder, random weights of seed 0, three processes at once;
#   3. once every part of Chromium is there: unpacks it and starts, in the background, the bench (it
#      waits for the export): tests/e2e/bench/gpu.mjs with $BENCH_ARGS (default --reference), and --ort-alt
#      when part 1 brought another onnxruntime-web; then tests/e2e/bench/layout.mjs on the export's decoder
#      (LAYOUT=0: not);
#   4. waits until the bench has finished or LIMIT seconds have passed, then copies the logs, the
#      report and the images to $OUT (results.tgz).
# EXPORT="stem:activations ..." (part 1's call) exports only those graphs; PACK_BASE (the call that
# completes Chromium, carrying it) brings the others, e.g. EXPORT=vae_decoder:float32 with
# PACK_BASE=target/tiny-packs/f16: the full-size decoder behind the tiny text encoder and transformer.
set -u
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-570}
W=/tmp/gpu
PACK=/tmp/pack
T0=$SECONDS
# AGAIN=1: the bench once more on a machine still held (the export and Chromium kept), with this call's
# BENCH_ARGS; the finished run's logs are moved aside to $W/run-N.
if [ -n "${AGAIN:-}" ] && [ -e $W/.bench-done ]; then
  mv $W/logs $W/run-$(ls -d $W/run-* 2>/dev/null | wc -l)
  rm -f $W/.bench-started $W/.bench-done
fi
mkdir -p $W/logs $OUT
exec > >(tee -a $OUT/device.log) 2>&1
echo "== $(date -u +%FT%TZ) browser.sh, limit $LIMIT s"
for d in .gpu/*/; do [ -d "$d" ] && cp -rv "$d". $W/ | sed 's/^/copied /'; done

export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 FONTCONFIG_FILE=$W/fonts.conf

# ---- setup and export (part 1) -------------------------------------------------------------------------
if [ ! -e $W/.setup ] && [ -e $W/node.xz ]; then
  for f in $W/debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
  # Chromium aborts on the first page with text where fontconfig has no configuration (none there).
  dpkg -x $W/fonts/*.deb $W/fonts
  printf '<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig><dir>%s</dir><cachedir>%s</cachedir></fontconfig>\n' \
    $W/fonts/usr/share/fonts $W/fonts/cache > $W/fonts.conf
  xz -dc $W/node.xz > $W/node && chmod +x $W/node
  rm -rf $W/dist && mkdir -p $W/dist && (cd $W/dist && python3 -m zipfile -e $W/extension.zip .)
  [ -e $W/ort-alt.tar.xz ] && mkdir -p $W/ort-alt && xz -dc $W/ort-alt.tar.xz | tar -x -C $W/ort-alt
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $W/diffusers-*.whl || exit 1
  touch $W/.setup
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc; free -g | head -2; df -h /tmp | tail -1
  $W/node --version
  echo "== setup done at $((SECONDS - T0)) s"
fi
if [ -e $W/.setup ] && [ ! -e $W/.export-started ] && [ -z "${PROBE:-}" ]; then
  touch $W/.export-started
  mkdir -p $PACK
  # The exporter runs from a copy: every later call copies the tree afresh, and an export still
  # importing its modules then finds them missing ("No module named 'export'", seen 2026-12-06).
  rm -rf $W/tools && mkdir -p $W/tools && cp -r tools/export tools/gpu-bench $W/tools/
  setsid bash -c '
    T=$SECONDS; ok=1; pids=()
    for job in '"${EXPORT:-text_encoder_q4:float16 transformer_q8:float16 vae_decoder:float32}"'; do
      set -- ${job/:/ }
      python3 '$W'/tools/gpu-bench/export_stage.py --stem $1 --config full --activations $2 --out '$PACK' \
        --threads 5 > '$W'/logs/export-$1.log 2>&1 & pids+=($!)
    done
    for p in "${pids[@]}"; do wait $p || ok=0; done
    echo "export: ok=$ok in $((SECONDS - T)) s" >> '$W'/logs/export.log
    [ $ok = 1 ] && touch '$PACK'/.done || touch '$PACK'/.failed
  ' < /dev/null > /dev/null 2>&1 &
  echo "== export started in the background at $((SECONDS - T0)) s"
fi

# ---- Chromium and the bench ----------------------------------------------------------------------------
parts=$(cat $W/parts 2>/dev/null || echo 99)
have=$(ls $W/chromium.part.* 2>/dev/null | wc -l)
if [ ! -x $W/chr/chromium/chromium ] && [ "$have" = "$parts" ]; then
  cat $(ls $W/chromium.part.* | sort -t. -k3 -n) > $W/chromium.tar.xz
  echo "$(cat $W/chromium.sha256)  $W/chromium.tar.xz" | sha256sum -c - || exit 1
  mkdir -p $W/chr && xz -dc $W/chromium.tar.xz | tar -x -C $W/chr && rm -f $W/chromium.tar.xz $W/chromium.part.*
  LD_LIBRARY_PATH=$W/chr/chromium/libs $W/chr/chromium/chromium --version
fi
# PACK_BASE=DIR (a folder of the tree, carried in this call): the graphs the export left out, e.g. the
# tiny real-architecture pack's text encoder and transformer beside a full-size decoder (EXPORT).
if [ -n "${PACK_BASE:-}" ] && [ -d "$PACK_BASE" ]; then mkdir -p $W/base && cp -r "$PACK_BASE"/. $W/base/; fi
if [ -x $W/chr/chromium/chromium ] && [ ! -e $W/.bench-started ]; then
  touch $W/.bench-started
  # playwright-core (the last part's), into node_modules, which is not part of the tree that travels.
  [ -d node_modules/playwright-core ] || { mkdir -p node_modules && xz -dc $W/playwright-core.tar.xz | tar -x -C node_modules; }
  setsid bash -c '
    export LD_LIBRARY_PATH='$W'/chr/chromium/libs IMAGINE_CHROMIUM='$W'/chr/chromium/chromium \
      IMAGINE_DIST='$W'/dist IMAGINE_WEBGPU=vulkan
    if [ -n "'"${PROBE:-}"'" ]; then
      PATH='$W':$PATH bash -c "'"${PROBE:-}"'" > '$W'/logs/probe.log 2>&1
      echo "probe exit $?" >> '$W'/logs/probe.log; touch '$W'/.bench-done; exit
    fi
    while [ ! -e '$PACK'/.done ] && [ ! -e '$PACK'/.failed ]; do sleep 2; done
    [ -e '$PACK'/.done ] || { echo "export failed" > '$W'/logs/bench.log; touch '$W'/.bench-done; exit; }
    [ -d '$W'/base ] && cp -n '$W'/base/* '$PACK'/
    ls -la '$PACK' > '$W'/logs/pack.txt; cp '$PACK'/*.export.json '$W'/logs/
    if [ -n "'"${MEMORY_ARGS:-}"'" ]; then
      # MAPS=1: under renderer_maps.py, which adds the extension renderer memory by kind of mapping.
      '"${MAPS:+python3 tools/gpu-bench/renderer_maps.py --}"' '$W'/node tests/e2e/bench/memory.mjs \
        --pack-dir '$PACK' --out '$W'/logs/memory.json '"${MEMORY_ARGS:-}"' > '$W'/logs/memory.log 2>&1
      echo "memory bench exit $?" >> '$W'/logs/memory.log; touch '$W'/.bench-done; exit
    fi
    alt=; [ -e '$W'/ort-alt/package ] && alt="--ort-alt '$W'/ort-alt/package"
    '$W'/node tests/e2e/bench/gpu.mjs --pack '$PACK' --out '$W'/logs/bench ${BENCH_ARGS---reference} $alt \
      > '$W'/logs/bench.log 2>&1
    echo "bench exit $?" >> '$W'/logs/bench.log
    if [ '"${LAYOUT:-1}"' = 1 ]; then
      '$W'/node tests/e2e/bench/layout.mjs --graph '$PACK'/vae_decoder.onnx --sizes 512,1024 --runs 3 \
        --out '$W'/logs/layout.json > '$W'/logs/layout.log 2>&1
      echo "layout bench exit $?" >> '$W'/logs/layout.log
    fi
    touch '$W'/.bench-done
  ' < /dev/null > /dev/null 2>&1 &
  echo "== bench started in the background at $((SECONDS - T0)) s"
fi

# ---- wait, then hand back what there is ----------------------------------------------------------------
if [ -e $W/.bench-started ]; then
  while [ ! -e $W/.bench-done ] && [ $((SECONDS - T0)) -lt $LIMIT ]; do sleep 5; done
fi
tail -n 2 $W/logs/export.log 2>/dev/null
for s in text_encoder_q4 transformer_q8 vae_decoder; do grep -h "^$s" $W/logs/export-$s.log 2>/dev/null | tail -n 2; done
tail -n 60 $W/logs/bench.log 2>/dev/null
tail -n 12 $W/logs/layout.log 2>/dev/null
tail -n 30 $W/logs/probe.log 2>/dev/null
nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null
# What comes back is at most 16 MiB a file: the logs, the report and the images compared with the
# reference (the others' PNGs and every trace stay there).
(cd $W/logs && tar czf $OUT/results.tgz $(ls -d *.log *.txt *.json bench/bench-gpu.json bench/*cold*.png bench/*acc4.png 2>/dev/null))
[ -e $W/.bench-done ] && echo "== bench finished at $((SECONDS - T0)) s" || echo "== not finished at $((SECONDS - T0)) s: call again"
