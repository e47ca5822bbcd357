#!/bin/bash
# The tree's C, C++ and CUDA sources against .clang-format (used by .ci/run).
#   bash tools/check_format.sh          lists the files clang-format would change; exit 1 if any
#   bash tools/check_format.sh --fix    formats them in place
# Uses Debian 12's clang-format (14), installed when run as root and missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v clang-format >/dev/null; then
  if [[ $(id -u) -eq 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends clang-format
  else
    echo "check_format.sh: clang-format is not installed" >&2
    exit 1
  fi
fi
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cpp' '*.cu' '*.cuh')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
unformatted=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || unformatted+=("$f")
done
if ((${#unformatted[@]})); then
  echo "check_format.sh: ${#unformatted[@]} of ${#files[@]} files differ from .clang-format (bash tools/check_format.sh --fix):"
  printf '  %s\n' "${unformatted[@]}"
  exit 1
fi
echo "check_format.sh: all ${#files[@]} files follow .clang-format"
