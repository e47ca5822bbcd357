#!/bin/bash
# The sanitizer build and the fuzzers of the weight-file readers (used by .ci/run).
#   bash tools/sanitize.sh
# Run as root on Debian 12 after `bash tools/setup.sh --build-only` (which installs the base
# packages), it installs clang, builds tvc in ./build-asan with AddressSanitizer and
# UndefinedBehaviorSanitizer (any report fails; the AVX-512 kernels without them, meson.build
# says why), runs the test suites that are fast under them,
# then runs each libFuzzer target of fuzz/ for $TVC_FUZZ_SECONDS seconds (default 45) from its
# seed corpus, then the threads test in a ThreadSanitizer build (./build-tsan). Exit status: 0
# when everything passed, 1 otherwise. Crashing inputs are left in
# build-asan/fuzz-run/NAME/artifacts/ and printed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fuzz_seconds=${TVC_FUZZ_SECONDS:-45}
build="build-asan"

# libFuzzer and the sanitizer runtimes come with clang; the project's OpenMP needs clang's
# libomp (GCC's libgomp is not what clang's -fopenmp links); hexdump (bsdextrautils, not in
# every base image) shows the inputs the fuzzers save.
packages=(clang libclang-rt-14-dev libomp-14-dev bsdextrautils)
if [[ $(id -u) -eq 0 ]]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${packages[@]}"
else
  echo "sanitize.sh: not root, skipping apt-get; make sure these are installed: ${packages[*]}" >&2
fi

# -Dfuzz=true: libFuzzer's coverage instrumentation of the engine and the fuzz/ targets (clang only).
# b_lundef=false: meson's default -Wl,--no-undefined does not link with clang's sanitizers.
# -fno-sanitize-recover=all: UBSan reports abort (by default they print and go on, so a test
# with undefined behaviour would still pass). CUDA and oneDNN are off: nvcc code is not
# instrumented, and oneDNN only serves the benchmarks, which are not run here. MPI is off too, so
# that CI also builds the library as a machine without MPI does (-Dmpi=disabled).
# -O1 with line tables only: reports keep file:line, and the build takes far less time than at
# -O2 -g.
fast_debug=(-Dbuildtype=plain -Doptimization=1 "-Dc_args=-gline-tables-only"
            "-Dcpp_args=-gline-tables-only -fno-sanitize-recover=all")
meson_args=(-Dcuda=disabled -Donednn=disabled -Dmpi=disabled -Dfuzz=true "-Db_sanitize=address,undefined"
            -Db_lundef=false "${fast_debug[@]}")
if [[ -f $build/build.ninja ]]; then
  meson setup --reconfigure "$build" "${meson_args[@]}"
else
  CC=clang CXX=clang++ meson setup "$build" "${meson_args[@]}"
fi

# Only what the tests below and the fuzzers need (the benchmarks would only add build time).
# `meson test --no-rebuild` then runs on exactly these binaries.
ninja -C "$build" -j "$(nproc)" tests/tvc_tests tests/tvc_io_tests tests/tvc_op_table tests/tvc_train_tests \
  tests/tvc_c_api_tests tests/tvc_dist_tests tests/tvc_dist_no_mpi_tests tools/tvc \
  fuzz/fuzz_safetensors fuzz/fuzz_pth fuzz/fuzz_tensor

# PyTorch's goldens are the same for every build (keyed by their code): reuse those the release
# build's tests made (.ci/run runs them first) instead of running PyTorch again.
if [[ -z ${TVC_GOLDEN_CACHE:-} && -d build/golden-cache ]]; then export TVC_GOLDEN_CACHE=$PWD/build/golden-cache; fi

# Leaks are findings too; abort_on_error makes every report a crash the test runner sees.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

status=0

# The suites worth running under the sanitizers, all fast enough there (CI on 2 cores, two at a
# time: unit about 110 s, io 50 s, op-table 40 s, cli-errors 2 s, train: recipes, image folders
# and the threaded loader, a second; c-api: the C API's error paths leak nothing, 17 s; dist and
# dist-no-mpi: the one-process communicator and the build without MPI, under a second). Left out:
# train-fashion-mnist, cli-reproducible and cli-recipe (minutes of training), install (a
# packaging check).
tests=(unit io op-table cli-errors train c-api dist dist-no-mpi)
listed=$(meson test -C "$build" --no-rebuild --list)
for t in "${tests[@]}"; do
  if ! grep -qx -- "$t" <<<"$listed"; then
    echo "sanitize.sh: test '$t' is not defined any more (tests/meson.build); update this script" >&2
    status=1
  fi
done
if ((status == 0)); then
  meson test -C "$build" --no-rebuild --print-errorlogs "${tests[@]}" || status=1
fi

# Each fuzzer starts from a fresh copy of its seed corpus (the copy grows as libFuzzer finds
# new inputs; the checked-in seeds stay as they are). Limits: 10 s per input, 1 GiB per
# allocation and 2 GiB in all, beyond which libFuzzer reports the input as a finding. The
# fuzzers (one thread each) run side by side, for $fuzz_seconds s of wall time.
summaries=()
fuzzers=(safetensors pth tensor)
pids=()
for name in "${fuzzers[@]}"; do
  work=$build/fuzz-run/$name
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  if [[ -d fuzz/corpus/$name ]]; then cp fuzz/corpus/$name/* "$work/corpus/"; fi
  dict=()
  if [[ -f fuzz/$name.dict ]]; then dict=(-dict="fuzz/$name.dict"); fi
  echo "sanitize.sh: fuzz_$name for $fuzz_seconds s (log: $work/log)"
  "$build/fuzz/fuzz_$name" -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -timeout=10 "${dict[@]}" -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1 &
  pids+=($!)
done
for i in "${!fuzzers[@]}"; do
  name=${fuzzers[$i]}
  work=$build/fuzz-run/$name
  rc=0
  wait "${pids[$i]}" || rc=$?
  # libFuzzer's last words on a clean run: "Done N runs in S second(s)".
  done_line=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$work/log" | tail -1 || true)
  artifacts=("$work"/artifacts/*)
  [[ -e ${artifacts[0]} ]] || artifacts=()
  if ((rc != 0)) || ((${#artifacts[@]})) || [[ -z $done_line ]]; then
    status=1
    summaries+=("fuzz_$name: FAILED (exit status $rc, ${#artifacts[@]} input(s) saved)")
    echo "---- fuzz_$name: last lines of $work/log"
    tail -n 60 "$work/log"
    for a in "${artifacts[@]}"; do
      echo "---- fuzz_$name finding: $a ($(stat -c %s "$a") bytes); rerun: $build/fuzz/fuzz_$name $a"
      hexdump -C "$a" | head -n 16
    done
  else
    summaries+=("fuzz_$name: OK, ${done_line#Done }")
  fi
done

# ThreadSanitizer: the threads test (tests/test_threads.cpp) in its own build, which compiles only
# the core and that test. LLVM's OpenMP loads its Archer tool (OMP_TOOL_LIBRARIES),
# which tells TSan about OpenMP's barriers and locks; its verbose line shows that it did.
# ignore_noninstrumented_modules: the OpenMP runtime itself is not instrumented (Archer's advice).
tsan_build=build-tsan
tsan_args=(-Dcuda=disabled -Donednn=disabled -Dmpi=disabled "-Db_sanitize=thread" -Db_lundef=false "${fast_debug[@]}")
if [[ -f $tsan_build/build.ninja ]]; then
  meson setup --reconfigure "$tsan_build" "${tsan_args[@]}"
else
  CC=clang CXX=clang++ meson setup "$tsan_build" "${tsan_args[@]}"
fi
ninja -C "$tsan_build" -j "$(nproc)" tests/tvc_thread_tests
archer=$(dirname "$(readlink -f "$(command -v clang)")")/../lib/libarcher.so  # libomp-14-dev
[[ -f $archer ]] || { echo "sanitize.sh: no Archer library at $archer" >&2; exit 1; }
tsan_log=$tsan_build/threads.log
echo "sanitize.sh: tests/tvc_thread_tests under ThreadSanitizer with $archer (log: $tsan_log)"
rc=0
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ignore_noninstrumented_modules=1" OMP_TOOL_LIBRARIES="$archer" ARCHER_OPTIONS=verbose=1 \
  "$tsan_build/tests/tvc_thread_tests" >"$tsan_log" 2>&1 || rc=$?
if ((rc != 0)) || ! grep -q "Archer detected OpenMP application with TSan" "$tsan_log"; then
  status=1
  summaries+=("threads under TSan: FAILED (exit status $rc; Archer $(grep -q 'Archer detected' "$tsan_log" && echo loaded || echo 'NOT loaded'))")
  tail -n 80 "$tsan_log"
else
  summaries+=("threads under TSan: OK, $(grep -E '^\[  PASSED  \]' "$tsan_log")")
fi

echo "---- sanitize.sh summary"
printf '%s\n' "${summaries[@]}"
if ((status == 0)); then echo "sanitize.sh: passed"; else echo "sanitize.sh: FAILED"; fi
exit $status
