# PROBE for browser.sh (README.md): waits for the export, then the memory bench with $MAPS_ARGS under
# renderer_maps.py; its report in /tmp/gpu/logs/maps.log (handed back with the logs).
while [ ! -e /tmp/pack/.done ] && [ ! -e /tmp/pack/.failed ]; do sleep 2; done
[ -e /tmp/pack/.done ] || { echo "export failed"; exit 1; }
[ -d /tmp/gpu/base ] && cp -n /tmp/gpu/base/* /tmp/pack/
python3 tools/gpu-bench/renderer_maps.py -- node tests/e2e/bench/memory.mjs --pack-dir /tmp/pack --out /tmp/gpu/logs/memory.json $MAPS_ARGS > /tmp/gpu/logs/maps.log 2>&1
echo "maps exit $?" >> /tmp/gpu/logs/maps.log
grep -v rendererTrace /tmp/gpu/logs/maps.log | tail -40
