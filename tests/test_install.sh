#!/bin/bash
# Installs the build into a temporary DESTDIR, then compiles and runs tests/install_smoke.cpp
# against it with nothing but `pkg-config --cflags --libs tvc`, as a user of the library would.
# Usage: test_install.sh BUILD_DIR SMOKE_SOURCE
set -euo pipefail
build=$1
source=$2
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT

meson install -C "$build" --no-rebuild --destdir "$dest" >"$dest/install.log" ||
  { cat "$dest/install.log"; exit 1; }
pc=$(find "$dest" -name tvc.pc -print -quit)
[[ -n $pc ]] || { echo "FAIL: no tvc.pc installed"; exit 1; }
for f in tvc/tensor.h tvc/ops.h tvc/autograd.h; do
  [[ -n $(find "$dest" -path "*/include/$f" -print -quit) ]] || { echo "FAIL: $f not installed"; exit 1; }
done
[[ -n $(find "$dest" -path '*/bin/tvc' -print -quit) ]] || { echo "FAIL: tvc program not installed"; exit 1; }

# The .pc file names the real prefix; point it into DESTDIR.
export PKG_CONFIG_PATH=$(dirname "$pc")
prefix=$(pkg-config --variable=prefix tvc)
flags=$(pkg-config --define-variable=prefix="$dest$prefix" --cflags --libs tvc)
echo "pkg-config --cflags --libs tvc: $flags"
${CXX:-c++} "$source" $flags -o "$dest/install_smoke"
"$dest/install_smoke"
