# The unlimited float16 images of the targets (cold 512x512 after a warm-up, its repeat, a cold
# 1024x1024), made by the build of 2026-12-04 (8feed5d, with its own bench) and by this one, in turn,
# twice each, on the same machine and Chromium.
W=/tmp/gpu; PACK=/tmp/pack; REPO=$PWD
while [ ! -e $PACK/.done ] && [ ! -e $PACK/.failed ]; do sleep 2; done
[ -e $PACK/.done ] || { echo "export failed"; exit 1; }
O=$W/old
rm -rf $O/dist && mkdir -p $O/dist && (cd $O/dist && python3 -m zipfile -e $O/old-dist.zip .)
ln -sfn $REPO/node_modules $O/tree/node_modules
ARGS="--pack $PACK --images f16-warm-up,f16-cold,f16-repeat,f16-large --f16-install"
one() { # old|new N
  if [ $1 = old ]; then
    (cd $O/tree && IMAGINE_DIST=$O/dist node tests/e2e/bench/gpu.mjs $ARGS --out $W/logs/old-$2) > $W/logs/old-$2.log 2>&1
  else
    node tests/e2e/bench/gpu.mjs $ARGS --out $W/logs/new-$2 > $W/logs/new-$2.log 2>&1
  fi
  echo "$1 $2 exit $?"; grep -E "cold|repeat" $W/logs/$1-$2.log | grep wall
}
# In the order old, new, new, old, so that a run cut short by the device's time still pairs them.
one old 1; one new 1; one new 2; one old 2
