#!/bin/bash
# Installs the build into a temporary DESTDIR and uses it as an embedder would, with nothing but
# pkg-config's flags (the .pc files point into DESTDIR through --define-variable):
#   - the installed headers are the public API only (no tvc/internal/, no TensorImpl), and each
#     compiles alone with -Wall -Wextra -Wpedantic -Werror (tvc/c_api.h also as C11);
#   - a core-only C++ program (tests/install_core.cpp), linked with `pkg-config --static --libs
#     tvc`, and the swa and hybrid layers (tests/install_layers.cpp);
#   - the C API: examples/c/run_model.c built with `cc -std=c11 -Wall -Werror` and the flags of
#     `pkg-config --cflags --static --libs tvc-c` only, runs resnet18 with 10 classes on weights
#     written by torch.save (tools/c_api_goldens.py) and matches PyTorch within 1e-4; the Python
#     ctypes example (examples/python/run_model.py) does the same through the installed
#     libtvc-c-shared.so, which exports only tvc_* symbols;
#   - neither the core program nor the C program links or references an image or CUDA library.
# Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

meson install -C "$build" --no-rebuild --destdir "$dest" >"$dest/install.log" || { cat "$dest/install.log"; exit 1; }
pc=$(find "$dest" -name tvc.pc -print -quit)
[[ -n $pc ]] || fail "no tvc.pc installed"
include=$(dirname "$(find "$dest" -path '*/include/tvc/tensor.h' -print -quit)")
[[ -d $include ]] || fail "tvc/tensor.h not installed"
[[ -n $(find "$dest" -path '*/bin/tvc' -print -quit) ]] || fail "tvc program not installed"

# Public headers only.
for f in tvc.h version.h tensor.h ops.h autograd.h c_api.h models/models.h vision/preprocess.h swa/averaged_model.h \
         hybrid/hybrid.h; do
  [[ -f $include/$f ]] || fail "tvc/$f not installed"
done
for f in internal kernel.h op_list.h meson.build version.h.in; do
  [[ ! -e $include/$f ]] || fail "tvc/$f is installed (internal)"
done
if grep -rqE 'struct TensorImpl \{|class (Node|FunctionNode) :|class KernelRegistry' "$include"; then fail "installed headers define engine internals"; fi

# Each header alone, warnings as errors.
cxx=${CXX:-c++}
cc=${CC:-cc}
n=0
while IFS= read -r header; do
  rel=${header#"$include"/}
  echo "#include <tvc/$rel>" >"$dest/one.cpp"
  $cxx -std=c++20 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$(dirname "$include")" "$dest/one.cpp" ||
    fail "tvc/$rel does not compile alone"
  n=$((n + 1))
done < <(find "$include" -name '*.h' | sort)
echo '#include <tvc/c_api.h>' >"$dest/one.c"
$cc -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$(dirname "$include")" "$dest/one.c" ||
  fail "tvc/c_api.h does not compile as C11"
echo "$n public headers compile alone with -Wall -Wextra -Wpedantic -Werror"

export PKG_CONFIG_PATH=$(dirname "$pc")
prefix=$(pkg-config --variable=prefix tvc)
flags() { pkg-config --define-variable=prefix="$dest$prefix" "$@"; }
for p in tvc tvc-models tvc-vision tvc-swa tvc-hybrid tvc-c; do flags --exists "$p" || fail "no $p.pc"; done
! flags --cflags tvc-c tvc-hybrid tvc-vision | grep -qE -- '-std=c\+\+|-fopenmp' || fail "Cflags hold C++-only flags"

# No image or CUDA library in a program: not linked (ldd) and no symbol of theirs (nm).
lean() {
  if ldd "$1" | grep -iE 'jpeg|png|cuda'; then fail "$1 loads an image or CUDA library"; fi
  if nm "$1" | grep -iE ' [TtUu] (jpeg_|png_|cuda)'; then fail "$1 holds image or CUDA symbols"; fi
  return 0
}

core_flags=$(flags --cflags --static --libs tvc)
echo "pkg-config --cflags --static --libs tvc: $core_flags"
$cxx -std=c++20 -Wall -Wextra -Werror "$src/tests/install_core.cpp" $core_flags -o "$dest/install_core"
"$dest/install_core"
lean "$dest/install_core"

$cxx -std=c++20 -Wall -Wextra -Werror "$src/tests/install_layers.cpp" $(flags --cflags --static --libs tvc-swa tvc-hybrid) \
  -o "$dest/install_layers"
"$dest/install_layers"

c_flags=$(flags --cflags --static --libs tvc-c)
echo "pkg-config --cflags --static --libs tvc-c: $c_flags"
$cc -std=c11 -Wall -Werror "$src/examples/c/run_model.c" $c_flags -o "$dest/run_model"
lean "$dest/run_model"

/usr/bin/python3 "$src/tools/c_api_goldens.py" "$dest" || fail "tools/c_api_goldens.py failed (needs python3-torch)"
compare() {
  /usr/bin/python3 - "$1" "$dest/expected.f32" <<'PY'
import math, sys
from array import array
got, want = array("f"), array("f")
got.frombytes(open(sys.argv[1], "rb").read())
want.frombytes(open(sys.argv[2], "rb").read())
assert len(got) == len(want), (len(got), len(want))
err = math.sqrt(sum((a - b) ** 2 for a, b in zip(got, want)) / sum(b * b for b in want))
print(f"{sys.argv[1]}: err {err:.2e} against PyTorch")
sys.exit(0 if err <= 1e-4 else 1)
PY
}
"$dest/run_model" resnet18 10 "$dest/weights.pth" "$dest/input.f32" 2 64 64 "$dest/c.f32"
compare "$dest/c.f32" || fail "the C example's output differs from PyTorch's"

shared=$(find "$dest" -name 'libtvc-c-shared.so' -print -quit)
[[ -n $shared ]] || fail "libtvc-c-shared.so not installed"
others=$(nm -D --defined-only "$shared" | awk '$2 ~ /[TDBRW]/ {print $3}' | grep -v '^tvc_' || true)
[[ -z $others ]] || fail "libtvc-c-shared.so exports more than tvc_*: $others"
/usr/bin/python3 "$src/examples/python/run_model.py" "$shared" resnet18 10 "$dest/weights.pth" "$dest/input.f32" 2 64 64 \
  "$dest/py.f32"
compare "$dest/py.f32" || fail "the Python example's output differs from PyTorch's"
echo "install test passed"
