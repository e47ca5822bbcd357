#!/bin/bash
# Sets tvc up on a fresh Debian 12 machine, as root: installs the packages it needs, configures
# and builds it in ./build, then runs the main job: `tvc train --recipe
# recipes/fashion_resnet18_se_ema.yaml` (resnet18 + SE on layer3 + EMA on Fashion-MNIST, about 13
# minutes on 2 cores, timed apart from the install and build; docs/training.md).
#   bash tools/setup.sh               everything
#   bash tools/setup.sh --build-only  install and build, no training run (CI)
# Extra arguments after --meson are passed to `meson setup` (e.g. --meson -Dcuda=disabled).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

train=1
meson_args=()
while (($#)); do
  case $1 in
  --build-only) train=0 ;;
  --meson) shift; meson_args=("$@"); break ;;
  *) echo "setup.sh: unknown argument $1 (expected --build-only or --meson ARGS...)" >&2; exit 2 ;;
  esac
  shift
done

packages=(
  meson ninja-build g++ pkg-config cmake     # build (cmake: meson finds oneDNN through it)
  zlib1g-dev libzip-dev nlohmann-json3-dev   # the library (.pth zip archives, safetensors headers)
  libjpeg-dev libpng-dev                     # the library (images of tvc predict)
  libcli11-dev libyaml-cpp-dev               # the tvc program (command line, training recipes)
  libgtest-dev python3-pip                   # tests (pip: the safetensors package, below)
  python3-torch python3-torchvision          # PyTorch, the tests' oracle (/usr/bin/python3)
  libopenblas0-pthread                       # a fast BLAS for that oracle
  libbenchmark-dev libeigen3-dev libdnnl-dev # benchmarks and their references
  libopenmpi-dev openmpi-bin                 # data-parallel training (mpirun tvc train, docs/distributed.md)
  dataset-fashion-mnist                      # data of `tvc train`
)
if [[ $(id -u) -eq 0 ]]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${packages[@]}"
  # The reference safetensors implementation, which the weight-file tests compare with.
  /usr/bin/python3 -m pip install --quiet --break-system-packages --root-user-action=ignore safetensors==0.8.0
else
  echo "setup.sh: not root, skipping apt-get; make sure these are installed: ${packages[*]}" >&2
fi

if [[ -f build/build.ninja ]]; then
  meson setup --reconfigure build "${meson_args[@]}"
else
  meson setup build "${meson_args[@]}"
fi
ninja -C build
if ((train)); then
  start=$(date +%s)
  ./build/tools/tvc train --recipe recipes/fashion_resnet18_se_ema.yaml
  echo "training time: $(($(date +%s) - start)) s"
fi
