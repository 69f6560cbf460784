# This session's device run (2026-12-07, second session): the memory bench of this build under an 8 GB
# ballast (float32 conversion, 1024x1024, Chromium's memory dumps), then ab.sh (this build
# against 8feed5d with no budget). Run as PROBE='bash /tmp/gpu/old/probe.sh' in the call that completes
# Chromium, the export started by part 1's call.
W=/tmp/gpu; PACK=/tmp/pack
while [ ! -e $PACK/.done ] && [ ! -e $PACK/.failed ]; do sleep 2; done
[ -e $PACK/.done ] || { echo "export failed"; exit 1; }
cp $PACK/*.export.json $W/logs/ 2>/dev/null
# This build's store zip, carried in this call, in place of part 1's.
if [ -e $W/new/imagine-0.1.0.zip ]; then
  rm -rf $W/dist && mkdir -p $W/dist && (cd $W/dist && python3 -m zipfile -e $W/new/imagine-0.1.0.zip .)
  echo "dist: $(sha256sum $W/new/imagine-0.1.0.zip)"
fi
$W/node tests/e2e/bench/memory.mjs --pack-dir $PACK --out $W/logs/memory.json \
  --free-gb 8 --sizes 1024 --steps 2 --dumps > $W/logs/memory.log 2>&1
echo "memory bench exit $?"; grep -E "renderer|GB" $W/logs/memory.log | tail -n 12
bash $W/old/ab.sh
