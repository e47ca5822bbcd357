#!/bin/bash
# The full conformance suite of the model zoo and the hybrid layer: every model against
# torchvision on random weights (tests/model_conformance.h), the larger hybrids against PyTorch
# (tests/test_hybrid.cpp), then docs/conformance.md rewritten with the measured errors.
#   bash tools/conformance.sh [--build DIR] [--only PATTERN]
# Hours on 2 cores for everything (the golden cache keeps at most TVC_GOLDEN_CACHE_GIB GiB of
# goldens, tests/torch_golden.h). CI runs a subset (the `models` and `hybrid` tests); this runs
# everything, including the tests named
# ModelConformanceFull.*, ModelStagesFull.*, ModelTreeFull.*, HybridConformanceFull.* and the
# disabled ones. --only reruns the tests whose full name matches PATTERN (shell wildcards,
# e.g. 'ModelConformanceFull.Vgg'). Each run's log is kept in DIR/conformance-logs/ and the table
# takes every test's lines from its latest run, so a rerun replaces that test's rows; the result
# line says "all checks passed" only when every test of the suite passed in its latest run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build
only='*'
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "usage: bash tools/conformance.sh [--build DIR] [--only PATTERN]" >&2; exit 2 ;;
  esac
done
suites=("tvc_model_tests ModelConformance*:ModelStages*:ModelTree*" "tvc_hybrid_tests *HybridConformance*")

ninja -C "$build" tests/tvc_model_tests tests/tvc_hybrid_tests tools/tvc
mkdir -p "$build/conformance-logs"
log=$build/conformance-logs/$(date -u +%Y%m%dT%H%M%S).log
expected=$build/conformance-logs/tests
: >"$expected"

# The suite's test names (gtest's listing: "Suite." then indented "Name  # GetParam() = ...").
list_tests() {
  "$build/tests/$1" --gtest_also_run_disabled_tests --gtest_filter="$2" --gtest_list_tests |
    awk '/^[^ ]/ {suite = $1; next} {print suite $1}'
}

status=0
for suite in "${suites[@]}"; do
  read -r binary filter <<<"$suite"
  list_tests "$binary" "$filter" >>"$expected"
  # Each test in its own process: memory a test's models leave cached in the allocator is not
  # held while the next one runs beside its PyTorch golden script (in one process, vit_l_32's
  # script, 12.4 GB, was killed for memory beside the tests before it, 11.7 GB, on 24 GB).
  # Each check prints "conformance MODEL (num_classes N[, image_size S]): eval E, ..., T s"
  # (tests/model_conformance.cpp), "stages MODEL: N nodes, err E" and "hybrid BACKBONE PATCHES:
  # eval32 E, ..." (tests/test_hybrid.cpp).
  while read -r test; do
    # shellcheck disable=SC2053  # PATTERN is a wildcard
    [[ $test == $only ]] || continue
    TVC_EXE=$build/tools/tvc "$build/tests/$binary" --gtest_also_run_disabled_tests \
      --gtest_filter="$test" </dev/null 2>&1 | tee -a "$log" || status=$?
  done < <(list_tests "$binary" "$filter")
done

/usr/bin/python3 - "$build/conformance-logs" "$expected" "$build/tools/tvc" >"$build/conformance.md" <<'PY'
import datetime, glob, os, re, subprocess, sys
logs, expected, tvc = sys.argv[1], sys.argv[2], sys.argv[3]
# Every test's lines and outcome from its latest run (the logs sort by time).
latest = {}
for path in sorted(glob.glob(os.path.join(logs, "*.log"))):
    test, lines = None, []
    for line in open(path, errors="replace"):
        m = re.match(r"^\[ RUN      \] (\S+)", line)
        if m:
            test, lines = m.group(1), []
            continue
        m = re.match(r"^\[ +(OK|FAILED) +\] (\S+)", line)
        if m and test == m.group(2):
            latest[test] = (m.group(1), lines)
            test = None
            continue
        if test:
            lines.append(line.rstrip("\n"))
suite = [t for t in open(expected).read().split() if t]
failed = [t for t in suite if latest.get(t, ("not run",))[0] == "FAILED"]
not_run = [t for t in suite if t not in latest]
text = "\n".join(l for t in suite if t in latest for l in latest[t][1])

order = subprocess.run([tvc, "list"], capture_output=True, text=True, check=True).stdout.split()
rows = re.findall(r"^conformance (\S+) \(num_classes (\d+)(?:, image_size (\d+))?\): eval (\S+), "
                  r"train (\S+), running (\S+) \(torch32 (\S+)\), grad64 (\S+), grad32 (\S+) "
                  r"\(torch32 (\S+)\)(?:, pinned (\S+))?, (\S+) s$", text, re.M)
stages = re.findall(r"^stages (\S+): (\d+) nodes, err (\S+)$", text, re.M)
hybrids = re.findall(r"^hybrid (\S+) (.*): eval32 (\S+), eval64 (\S+), stages64 (\S+), grad64 (\S+)$", text, re.M)
rows.sort(key=lambda r: (order.index(r[0]), -int(r[1]), int(r[2] or 0)))
# A model built for one image size (ViT) shows it: "vit_b_32 (64 px)".
rows = [(r[0] + (f" ({r[2]} px)" if r[2] else ""),) + r[1:2] + r[3:10] + (r[10] or "-", r[11]) for r in rows]
stages.sort(key=lambda r: order.index(r[0]))
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                     capture_output=True, text=True).stdout.strip()
print("# Model conformance with torchvision\n")
print("Generated by `bash tools/conformance.sh` (do not edit by hand) on",
      datetime.date.today().isoformat() + ",", cpu + ",", "with torchvision 0.14 / torch 1.13 (Debian).")
print("""
Each model is built with random weights in which every BatchNorm buffer and affine parameter
and every bias is randomised, saved by torch.save and read through tvc's .pth reader
(tools/model_goldens.py, tests/model_conformance.h). err = ||tvc - torch||2 / ||torch||2 per
tensor; the columns give the largest over the tensors checked. Limits: eval <= 1e-4 (batch 2 at
224 px and batch 1 at 161 px, Swin at 201 px), train-mode output <= 1e-3 (dropout and stochastic
depth off), running statistics <= 1e-4 each
(where PyTorch's own float32 error on a statistic, against float64, is larger than that, ours
against float64 within 3x of PyTorch's own), float64 parameter gradients <= 1e-8 (64 px),
float32 gradients of all parameters together within 3x of PyTorch's own float32-vs-float64
error (the larger of its contiguous and channels_last runs). A piecewise decision near a tie
that float32 rounding takes otherwise than float64 moves a gradient by far more than rounding:
the gradients' input is, of eight random draws, the one whose closest ReLU, max-pool or
hard-activation decision is farthest from a tie (relative to its tensor's RMS), and both sides'
float32 runs take the float64 run's ReLU and max-pool decisions ("pinned": how many of ours
float32 alone would have taken otherwise). The criterion still catches a lower precision: a
mutation test (ModelConformance.Float32GradientCriterionFailsABfloat16Convolution) rounds
every convolution result to bfloat16 and fails it by thousands of times PyTorch's error.
"torch32" columns: PyTorch's own float32 error against float64 on the same weights and input. Time: tvc's
time for all of these checks of one model, 2 threads. A ViT takes only the image size it is built
for: its plain row is eval (batch 2) and train mode at 224 px without gradients, its "(64 px)" row
every check on the model built for 64 px, and "(160 px)" the model built for 160 px loading
224-px weights (position embedding interpolated as torchvision's interpolate_embeddings).
""")
print("| model | classes | eval | train | running stats | running: torch32 | grad float64 "
      "| grad float32 | grad float32: torch32 | pinned | time (s) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    print("| " + " | ".join(r) + " |")
if stages:
    print("\nStage features (`forward_stages`) against torchvision's `create_feature_extractor`:\n")
    print("| model | nodes | largest err |\n| --- | --- | --- |")
    for s in stages:
        print("| " + " | ".join(s) + " |")
if hybrids:
    print("\nHybrid models (tests/test_hybrid.cpp, tools/hybrid_goldens.py) against the same network "
          "built in PyTorch, 64 px, batch 2: eval output in float32, and in float64 the output, the "
          "stage outputs and every parameter's gradient (limits 1e-4, 1e-10, 1e-10, 1e-8):\n")
    print("| backbone | patches | eval float32 | eval float64 | stages float64 | grad float64 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for h in hybrids:
        patches = " ".join(h[1].split()).replace("|", "\\|")
        print(f"| {h[0]} | `{patches}` | " + " | ".join(h[2:]) + " |")
problems = failed + [t + " (not run)" for t in not_run]
print("\nResult:", "all checks passed." if not problems else "FAILED: " + ", ".join(problems))
PY
mv "$build/conformance.md" docs/conformance.md
exit "$status"
