# The unlimited float16 images of the targets (cold 512x512 after a warm-up, its repeat, a cold
# 1024x1024), made by the build of 2026-12-04 (8feed5d, with its own bench) and by this one, in turn,
# twice each, on the same machine and Chromium. Run as `PROBE='bash /tmp/gpu/old/ab.sh'` with AGAIN=1 after
# the memory bench (tools/gpu-bench/README.md), carrying .gpu/5/old/: this script, the old build's store zip
# (old-dist.zip) and its tests/e2e/{bench,lib} and package.json (tree/).
W=/tmp/gpu; PACK=/tmp/pack; REPO=$PWD
while [ ! -e $PACK/.done ] && [ ! -e $PACK/.failed ]; do sleep 2; done
[ -e $PACK/.done ] || { echo "export failed"; exit 1; }
O=$W/old
rm -rf $O/dist && mkdir -p $O/dist && (cd $O/dist && python3 -m zipfile -e $O/old-dist.zip .)
ln -sfn $REPO/node_modules $O/tree/node_modules
ARGS="--pack $PACK --images f16-warm-up,f16-cold,f16-repeat,f16-large --f16-install"
for round in 1 2; do
  (cd $O/tree && IMAGINE_DIST=$O/dist node tests/e2e/bench/gpu.mjs $ARGS --out $W/logs/old-$round) > $W/logs/old-$round.log 2>&1
  echo "old $round exit $?"; grep -E "cold|repeat" $W/logs/old-$round.log | grep wall
  node tests/e2e/bench/gpu.mjs $ARGS --out $W/logs/new-$round > $W/logs/new-$round.log 2>&1
  echo "new $round exit $?"; grep -E "cold|repeat" $W/logs/new-$round.log | grep wall
done
