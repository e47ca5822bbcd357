#!/bin/bash
# Tests of the tvc program. Usage: test_cli.sh MODE TVC [DATA_DIR]
#   errors        exit codes and messages: usage errors exit 2, missing or malformed data exit 1
#                 with `error: <file>: <fault>` on stderr, --help exits 0
#   reproducible  a few training batches of the small CNN with 1 and 2 threads: bit-identical
#                 final weights; --ema adds the EMA's weights without changing the training
#   train         `tvc train --epochs 1 --seed 0` reaches a test accuracy >= 88%
#   bench         `tvc bench`: the result line's form, eval and train, --verbose's kernel table,
#                 bad options
#   distributed   the small CNN under mpirun: 2 and 4 ranks with sync_bn train as one process
#                 (1e-5), a killed or hung rank ends the job naming it, --resume with another
#                 rank count finishes the run
#   recipe        `tvc train --backbone resnet18 ...` on a small image folder (with a corrupt JPEG,
#                 a zero-byte file and a text file): the files it writes, bit-identical final
#                 weights after a SIGKILL mid-epoch and --resume, SIGINT's checkpoint, a misspelt
#                 key, `tvc eval`, and the exported .pth in torchvision's resnet18 (strict=True)
set -uo pipefail
mode=$1
tvc=$2
data=${3:-/usr/share/datasets/fashion-mnist}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# expect CODE PATTERN ARGS...: runs tvc ARGS, checks the exit status and that stderr matches
# the extended regular expression PATTERN.
expect() {
  local code=$1 pattern=$2
  shift 2
  "$tvc" "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  if [[ $got -ne $code ]]; then
    fail "tvc $* exited $got, expected $code; stderr: $(cat "$tmp/err")"
  elif ! grep -Eq -- "$pattern" "$tmp/err"; then
    fail "tvc $* : stderr does not match /$pattern/: $(cat "$tmp/err")"
  else
    echo "ok: tvc $* -> $got, $(head -1 "$tmp/err")"
  fi
}

# A copy of the dataset folder with one file replaced by the bytes given on stdin, gzipped
# unless the second argument is "raw".
broken_dir() {
  local name=$1 how=${2:-gzip}
  local d="$tmp/data-$RANDOM$RANDOM"
  mkdir -p "$d"
  cp "$data"/*.gz "$d"/
  if [[ $how == raw ]]; then cat >"$d/$name"; else gzip -c >"$d/$name"; fi
  echo "$d"
}

case $mode in
errors)
  expect 2 'unknown|not expected|Extra|following' train --no-such-option
  expect 2 'epochs' train --epochs abc
  expect 2 'epochs' train --epochs 0
  expect 2 'subcommand'
  expect 2 'lr' train --lr -1
  expect 2 'threads' train --threads -2
  expect 2 'ema' train --ema 1.5
  expect 2 'out' average "$tmp/none.pth"
  "$tvc" train --help >"$tmp/help" 2>&1 && grep -q -- --data-dir "$tmp/help" ||
    fail "tvc train --help did not exit 0 listing --data-dir: $(cat "$tmp/help")"
  expect 1 "^error: $tmp/none/train-images-idx3-ubyte.gz: cannot open: No such file or directory\$" \
    train --data-dir "$tmp/none"
  d=$(printf 'not gzip at all' | broken_dir train-labels-idx1-ubyte.gz raw)
  expect 1 "^error: $d/train-labels-idx1-ubyte.gz: not a gzip file" train --data-dir "$d"
  d=$(printf '\x00\x00\x08\x02\x00\x00\x00\x01' | broken_dir t10k-images-idx3-ubyte.gz)
  expect 1 "^error: $d/t10k-images-idx3-ubyte.gz: bad IDX magic number 0x802, expected 0x803" \
    train --data-dir "$d"
  d=$(gzip -dc "$data/train-images-idx3-ubyte.gz" | head -c 1000 | broken_dir train-images-idx3-ubyte.gz)
  expect 1 "^error: $d/train-images-idx3-ubyte.gz: truncated: the IDX data needs 47040000 bytes, the file has 984" \
    train --data-dir "$d"
  d=$(printf '\x00\x00\x08\x01\x00\x00\x00\x02\x01' | broken_dir t10k-labels-idx1-ubyte.gz)
  expect 1 "^error: $d/t10k-labels-idx1-ubyte.gz: truncated" train --data-dir "$d"
  d=$( (gzip -dc "$data/t10k-labels-idx1-ubyte.gz"; printf 'x') | broken_dir t10k-labels-idx1-ubyte.gz)
  expect 1 "^error: $d/t10k-labels-idx1-ubyte.gz: more data than the IDX dimensions \[10000\] declare" \
    train --data-dir "$d"
  d=$( (printf '\x00\x00\x08\x01\x00\x00\xea\x60'; head -c 60000 /dev/zero | tr '\0' '\013') |
    broken_dir train-labels-idx1-ubyte.gz)
  expect 1 "^error: $d/train-labels-idx1-ubyte.gz: label 11 at index 0 is not a class in \[0, 10\)" \
    train --data-dir "$d"
  ;;
reproducible)
  # The small CNN (the default recipe) for a few batches: the same final weights, bit for bit,
  # with 1 and 2 threads; another seed differs; --ema leaves the training as it is and adds the
  # EMA's weights and test accuracy.
  train_into() {  # train_into NAME ARGS...: tvc train ARGS into $tmp/NAME
    local name=$1
    shift
    "$tvc" train --max-batches 25 --val-split 0.01 --out "$tmp/$name" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" ||
      fail "tvc train $* failed: $(cat "$tmp/$name.err")"
  }
  train_into a --seed 7 --threads 1
  train_into b --seed 7 --threads 2
  train_into c --seed 8 --threads 2
  cat "$tmp/a.out"
  cmp -s "$tmp/a/final.safetensors" "$tmp/b/final.safetensors" || fail "same seed, different weights with 1 and 2 threads"
  cmp -s <(cut -d, -f1-7 "$tmp/a/metrics.csv") <(cut -d, -f1-7 "$tmp/b/metrics.csv") ||
    fail "same seed, different metrics: $(diff "$tmp/a/metrics.csv" "$tmp/b/metrics.csv")"
  cmp -s "$tmp/a/final.safetensors" "$tmp/c/final.safetensors" && fail "seeds 7 and 8 gave identical weights"
  train_into e1 --seed 7 --threads 1 --ema 0.99
  train_into e2 --seed 7 --threads 2 --ema 0.99
  cat "$tmp/e1.out"
  cmp -s "$tmp/e1/final.safetensors" "$tmp/a/final.safetensors" || fail "--ema changed the training"
  cmp -s "$tmp/e1/final_ema.safetensors" "$tmp/e2/final_ema.safetensors" || fail "--ema: same seed, different EMA weights"
  grep -Eq '^test accuracy on the Fashion-MNIST test set \(10000 images\): [0-9.]+%, ema [0-9.]+%$' "$tmp/e1.out" ||
    fail "no raw and EMA test accuracy: $(cat "$tmp/e1.out")"
  ;;
train)
  start=$(date +%s)
  "$tvc" train --epochs 1 --seed 0 --data-dir "$data" --out "$tmp/run" >"$tmp/out" 2>"$tmp/err"
  code=$?
  cat "$tmp/err" "$tmp/out"
  echo "wall time: $(($(date +%s) - start)) s"
  [[ $code -eq 0 ]] || fail "tvc train exited $code"
  line=$(grep '^test accuracy on ' "$tmp/out")
  if [[ $line =~ :\ ([0-9]+)\.([0-9][0-9])%$ ]]; then
    hundredths=$((10#${BASH_REMATCH[1]} * 100 + 10#${BASH_REMATCH[2]}))
    ((hundredths >= 8800)) || fail "accuracy $line is below 88%"
  else
    fail "no line 'test accuracy on ...: NN.NN%' in stdout"
  fi
  ;;
bench)
  # The figures are not checked (no timing thresholds in tests), only that they are there.
  number='[0-9]+(\.[0-9]+)?'
  line="^resnet18 batch 2 size 64 (eval|train), [0-9]+ threads \((generic|avx2|avx512|avx512_bf16)\): median $number ms \(min $number, max $number\), $number GFLOP/s, $number% of peak$"
  for mode in "" --train; do
    "$tvc" bench resnet18 --batch 2 --size 64 --iterations 3 $mode >"$tmp/bench.out" 2>"$tmp/bench.err" ||
      fail "tvc bench $mode failed: $(cat "$tmp/bench.err")"
    cat "$tmp/bench.out"
    head -n 1 "$tmp/bench.out" | grep -Eq "$line" || fail "tvc bench $mode: unexpected first line"
    sed -n 2p "$tmp/bench.out" | grep -Eq "^first call $number ms; peak resident memory [0-9]+ MiB; $number GFLOP per step .*; 3 timed steps$" ||
      fail "tvc bench $mode: unexpected second line"
  done
  # resnet18 at 64x64: 1.82 G multiply-adds at 224x224 scaled by (64/224)^2, 2 images, 2 FLOPs
  # each: 0.594 GFLOP a forward pass; a training step counts three times that.
  grep -q '; 1\.78[0-9] GFLOP per step' "$tmp/bench.out" || fail "--train: not 3 x 0.594 GFLOP per step"
  "$tvc" bench resnet18 --batch 2 --size 64 --iterations 1 >"$tmp/bench.out" 2>&1
  grep -q '; 0\.59[0-9] GFLOP per step' "$tmp/bench.out" || fail "resnet18 at 64x64, batch 2: not 0.594 GFLOP"
  # ViT's attention is called with x alone (self-attention): 17.56 GMAC as torchvision counts
  "$tvc" bench vit_b_16 --iterations 1 >"$tmp/bench.out" 2>&1 || fail "vit_b_16 failed: $(cat "$tmp/bench.out")"
  grep -q '; 35\.1[0-9]* GFLOP per step' "$tmp/bench.out" || fail "vit_b_16: not 35.1 GFLOP: $(cat "$tmp/bench.out")"
  "$tvc" bench mobilenet_v2 --size 32 --iterations 1 --verbose >"$tmp/verbose.out" 2>&1 || fail "--verbose failed"
  # features.0 (Conv2dNormActivation): its convolution, batch norm and ReLU6 as one fused kernel
  grep -Eq '^features\.0 +conv2d_epilogue +few-channel rows +\[1, 32, 16, 16\] +1 +[0-9.]+$' "$tmp/verbose.out" ||
    fail "--verbose: no fused row for features.0: $(head -5 "$tmp/verbose.out")"
  # features.1 (an inverted residual block): its depthwise convolution and projection as one kernel
  grep -Eq '^features\.1 +inverted_residual +inverted residual, (bands of rows|samples side by side|layer by layer) +\[1, 16, 16, 16\] +1 +[0-9.]+$' \
    "$tmp/verbose.out" || fail "--verbose: no inverted residual row for features.1: $(head -8 "$tmp/verbose.out")"
  grep -Eq '^\(all kernels\) +[0-9.]+$' "$tmp/verbose.out" || fail "--verbose: no total: $(tail -3 "$tmp/verbose.out")"
  # bfloat16 inference: where the CPU has AVX512_BF16 it runs and says so; the generic
  # instruction set (or a CPU without it) refuses with a clear error.
  if "$tvc" bench resnet18 --batch 2 --size 64 --iterations 1 --dtype bfloat16 >"$tmp/bf16.out" 2>&1; then
    grep -Eq '^resnet18 batch 2 size 64 eval bfloat16, [0-9]+ threads \(avx512_bf16\): median ' "$tmp/bf16.out" &&
      grep -q 'bfloat16 dot-product loop' "$tmp/bf16.out" || fail "--dtype bfloat16: unexpected output: $(cat "$tmp/bf16.out")"
  else
    grep -q 'bfloat16 inference is not supported on this CPU' "$tmp/bf16.out" ||
      fail "--dtype bfloat16 failed without the CPU error: $(cat "$tmp/bf16.out")"
  fi
  TVC_ISA=generic expect 1 'bfloat16 inference is not supported on this CPU: it needs AVX512_BF16' \
    bench resnet18 --dtype bfloat16
  expect 1 'times inference' bench resnet18 --dtype bfloat16 --train
  expect 2 'dtype' bench resnet18 --dtype float16
  expect 2 'batch' bench resnet18 --batch 0
  expect 2 'MODEL is required' bench
  expect 1 "unknown model 'resnet19'" bench resnet19
  ;;
distributed)
  # The small CNN recipe under mpirun (docs/distributed.md), 10 steps of a global batch of 8 (few
  # activations, so that no ReLU or max-pool decision flips on float32 rounding: see the doc).
  mpi=(mpirun --oversubscribe --allow-run-as-root)
  common=(--seed 7 --batch-size 8 --max-batches 10 --val-split 0.01 --threads 1 --workers 1 --sync-bn true)
  # worst_error A B [FILE]: the largest relative error ||a - b|| / ||b|| over the tensors of the
  # runs A's and B's FILE (final.pth). same_weights A B [FILE]: that error is at most 1e-5.
  worst_error() {
    /usr/bin/python3 - "$1/${3:-final.pth}" "$2/${3:-final.pth}" <<'PY'
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert a.keys() == b.keys(), "different keys"
print(max(((a[k].double() - b[k].double()).norm() / max(b[k].double().norm().item(), 1e-30)).item() for k in b))
PY
  }
  same_weights() {
    local e
    e=$(worst_error "$1" "$2" "${3:-final.pth}") || { fail "$1 vs $2: cannot compare the weights"; return; }
    echo "$1 vs $2 (${3:-final.pth}): worst relative error per tensor $e"
    /usr/bin/python3 -c "import sys; sys.exit(float('$e') > 1e-5)" || fail "$1 vs $2: ${3:-final.pth} differs by $e"
  }
  accuracy_line() { grep '^test accuracy on ' "$1"; }
  "$tvc" train "${common[@]}" --out "$tmp/one" >"$tmp/one.out" 2>&1 || fail "one process failed: $(cat "$tmp/one.out")"
  # With sync_bn, 2 and 4 ranks train as one process does (rank 0 alone prints and writes).
  for n in 2 4; do
    "${mpi[@]}" -np $n "$tvc" train "${common[@]}" --out "$tmp/r$n" >"$tmp/r$n.out" 2>"$tmp/r$n.err" ||
      fail "$n ranks failed: $(cat "$tmp/r$n.err")"
    cat "$tmp/r$n.out"
    same_weights "$tmp/r$n" "$tmp/one"
    [[ $(accuracy_line "$tmp/r$n.out") == $(accuracy_line "$tmp/one.out") ]] ||
      fail "$n ranks: $(accuracy_line "$tmp/r$n.out"), one process: $(accuracy_line "$tmp/one.out")"
    [[ $(grep -c '^test accuracy on ' "$tmp/r$n.out") -eq 1 ]] || fail "$n ranks: more than rank 0 printed"
    grep -q "; $n ranks, all-reduce wait [0-9.]* ms/step" "$tmp/r$n.out" || fail "$n ranks: no all-reduce time"
  done
  # SWA from the first epoch on 80 images: the average and its update_bn statistics (over all
  # the images, on every rank) are the single process's.
  swa=(--seed 3 --batch-size 8 --train-subset 80 --val-split 0.01 --threads 1 --workers 1 --sync-bn true --swa '{start_epoch: 1, swa_lr: 0.001}')
  "$tvc" train "${swa[@]}" --out "$tmp/swa1" >"$tmp/swa1.out" 2>&1 || fail "SWA, one process: $(cat "$tmp/swa1.out")"
  "${mpi[@]}" -np 2 "$tvc" train "${swa[@]}" --out "$tmp/swa2" >"$tmp/swa2.out" 2>&1 || fail "SWA, 2 ranks: $(cat "$tmp/swa2.out")"
  same_weights "$tmp/swa2" "$tmp/swa1" final_swa.pth
  # Without sync_bn each rank normalises with its share's statistics and keeps rank 0's running
  # statistics (PyTorch DDP's default): the weights differ from one process's.
  "${mpi[@]}" -np 2 "$tvc" train --seed 7 --batch-size 8 --max-batches 10 --val-split 0.01 --threads 1 --workers 1 --out "$tmp/local" \
    >"$tmp/local.out" 2>&1 || fail "2 ranks without sync_bn failed: $(cat "$tmp/local.out")"
  e=$(worst_error "$tmp/local" "$tmp/one")
  echo "2 ranks without sync_bn vs one process: worst relative error per tensor $e"
  /usr/bin/python3 -c "import sys; sys.exit(float('$e') <= 1e-5)" || fail "without sync_bn, 2 ranks gave one process's weights"

  # rank_of N PATTERN: the pid of rank N of the job whose command line matches PATTERN.
  rank_of() {
    for p in $(pgrep -f -- "$2"); do
      grep -qz "^OMPI_COMM_WORLD_RANK=$1\$" "/proc/$p/environ" 2>/dev/null && echo "$p" && return
    done
  }
  # mid_epoch_resume OUT: the resume log OUT says it resumed a checkpoint taken mid-epoch.
  mid_epoch_resume() {
    [[ $(grep -o '^resumed .* at epoch 1, batch [0-9]*' "$1") =~ batch\ ([0-9]+)$ ]] &&
      ((BASH_REMATCH[1] > 0 && BASH_REMATCH[1] < 300)) || fail "not resumed mid-epoch: $(cat "$1")"
  }
  # A rank killed after the first checkpoint of a 300-step run: mpirun ends the job naming it;
  # the checkpoint is intact and --resume with one process finishes the run.
  "${mpi[@]}" -np 2 "$tvc" train "${common[@]}" --max-batches 300 --checkpoint-every 2 --out "$tmp/killed" \
    >"$tmp/killed.out" 2>&1 &
  job=$!
  for _ in $(seq 600); do [[ -f $tmp/killed/checkpoints/last.pth ]] && break; sleep 0.02; done
  victim=$(rank_of 1 "$tmp/killed")
  [[ -n $victim ]] && kill -9 "$victim"
  wait $job
  code=$?
  ((code != 0)) || fail "the job with a killed rank exited 0: $(cat "$tmp/killed.out")"
  grep -q 'rank 1 .*exited on signal 9' "$tmp/killed.out" || fail "the killed rank is not named: $(cat "$tmp/killed.out")"
  "$tvc" train --resume "$tmp/killed" --threads 1 >"$tmp/resumed.out" 2>&1 || fail "--resume failed: $(cat "$tmp/resumed.out")"
  mid_epoch_resume "$tmp/resumed.out"
  [[ -s $tmp/killed/final.safetensors ]] || fail "the resumed run wrote no final weights"
  # A rank that hangs (SIGSTOP): the others wait rank_timeout seconds, then the job ends with a
  # message naming it; --resume with 4 ranks finishes the run.
  "${mpi[@]}" -np 2 "$tvc" train "${common[@]}" --max-batches 300 --checkpoint-every 2 --rank-timeout 5 \
    --out "$tmp/hung" >"$tmp/hung.out" 2>&1 &
  job=$!
  for _ in $(seq 600); do [[ -f $tmp/hung/checkpoints/last.pth ]] && break; sleep 0.02; done
  victim=$(rank_of 1 "$tmp/hung")
  [[ -n $victim ]] && kill -STOP "$victim"
  wait $job
  code=$?
  ((code != 0)) || fail "the job with a hung rank exited 0: $(cat "$tmp/hung.out")"
  grep -Eq '^error: rank 0: rank 1 (did not reach|reached) [a-z_]+ #[0-9]+(,| within).* 5 s: it died or hangs$' "$tmp/hung.out" ||
    fail "the hung rank is not named: $(cat "$tmp/hung.out")"
  "${mpi[@]}" -np 4 "$tvc" train --resume "$tmp/hung" --threads 1 >"$tmp/hung2.out" 2>&1 ||
    fail "--resume with 4 ranks failed: $(cat "$tmp/hung2.out")"
  mid_epoch_resume "$tmp/hung2.out"
  [[ -s $tmp/hung/final.safetensors ]] || fail "the resumed run wrote no final weights"
  ;;
recipe)
  # Three classes of noisy coloured squares, 16 images each, plus three files to skip.
  /usr/bin/python3 - "$tmp/imgs" <<'PY'
import os, random, sys
from PIL import Image
root = sys.argv[1]
rng = random.Random(0)
for c, colour in enumerate([(200, 40, 40), (40, 200, 40), (40, 40, 200)]):
    os.makedirs(f"{root}/class{c}", exist_ok=True)
    for i in range(16):
        img = Image.new("RGB", (40, 36), tuple(rng.randrange(0, 80) for _ in range(3)))
        x, y = rng.randrange(0, 16), rng.randrange(0, 12)
        img.paste(tuple(min(255, v + rng.randrange(-30, 30)) for v in colour), (x, y, x + 20, y + 20))
        img.save(f"{root}/class{c}/{i:02d}." + ("png" if i % 2 else "jpg"))
data = open(f"{root}/class0/00.jpg", "rb").read()
open(f"{root}/class1/corrupt.jpg", "wb").write(data[: len(data) // 2])
open(f"{root}/class2/empty.jpg", "wb").close()
open(f"{root}/class0/notes.txt", "w").write("not an image\n")
PY
  common=(--backbone resnet18 --data "$tmp/imgs" --image-size 32 --batch-size 8 --epochs 2 --val-split 0.25
          --workers 1 --threads 2 --optimizer sgd --lr 0.05 --scheduler cosine --ema 0.9 --checkpoint-every 2 --seed 3)
  "$tvc" train "${common[@]}" --out "$tmp/a" >"$tmp/a.out" 2>"$tmp/a.err" || fail "the run failed: $(cat "$tmp/a.err")"
  cat "$tmp/a.out"
  for f in corrupt.jpg empty.jpg notes.txt; do
    grep -q "^warning: skipping .*/$f: " "$tmp/a.err" || fail "$f was not named as skipped: $(cat "$tmp/a.err")"
  done
  grep -q "^warning: skipped 3 of 51 files in $tmp/imgs" "$tmp/a.err" || fail "no count of the skipped files"
  for f in recipe.yaml metrics.csv curves.svg checkpoints/last.pth final.safetensors final.pth best.safetensors \
    best.pth final_ema.safetensors final_ema.pth; do
    [[ -s $tmp/a/$f ]] || fail "the run did not write $f"
  done
  [[ $(wc -l <"$tmp/a/metrics.csv") -eq 3 ]] || fail "metrics.csv has not a header and 2 rows: $(cat "$tmp/a/metrics.csv")"
  grep -q '<svg' "$tmp/a/curves.svg" && grep -q '</svg>' "$tmp/a/curves.svg" || fail "curves.svg is not an SVG"
  tail -n 2 "$tmp/a.out" | head -n 1 | grep -Eq '^test accuracy on .*: [0-9.]+%, ema [0-9.]+%$' ||
    fail "the line before the last does not give the raw and EMA test accuracy"
  tail -n 1 "$tmp/a.out" | grep -q "^files in $tmp/a: " || fail "the last line does not say where the files are"

  # SIGKILL once a mid-epoch checkpoint exists, then --resume with another thread and worker
  # count: the same final weights, bit for bit.
  "$tvc" train "${common[@]}" --out "$tmp/b" >"$tmp/b.out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [[ -f $tmp/b/checkpoints/last.pth ]] && break; sleep 0.05; done
  kill -9 $pid
  wait $pid 2>/dev/null
  "$tvc" train --resume "$tmp/b" --threads 1 --workers 0 >"$tmp/b2.out" 2>&1 || fail "--resume failed: $(cat "$tmp/b2.out")"
  grep -q '^resumed ' "$tmp/b2.out" || fail "--resume did not say where it resumed: $(cat "$tmp/b2.out")"
  cmp -s "$tmp/a/final.safetensors" "$tmp/b/final.safetensors" || fail "final.safetensors differs after SIGKILL and --resume"
  cmp -s "$tmp/a/final_ema.safetensors" "$tmp/b/final_ema.safetensors" || fail "final_ema.safetensors differs after SIGKILL and --resume"
  # The same metrics rows but the timings.
  cmp -s <(cut -d, -f1-7 "$tmp/a/metrics.csv") <(cut -d, -f1-7 "$tmp/b/metrics.csv") ||
    fail "metrics.csv differs after SIGKILL and --resume: $(diff "$tmp/a/metrics.csv" "$tmp/b/metrics.csv")"

  # SIGINT saves a checkpoint and exits 130; --resume finishes the run.
  "$tvc" train "${common[@]}" --out "$tmp/c" --checkpoint-every 0 >"$tmp/c.out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q 'epoch 1/2 \[' "$tmp/c.out" && break; sleep 0.05; done
  kill -INT $pid
  wait $pid
  code=$?
  if [[ $code -eq 130 ]]; then
    grep -q "^stopped by SIGINT" "$tmp/c.out" || fail "SIGINT: no message: $(cat "$tmp/c.out")"
    "$tvc" train --resume "$tmp/c" >"$tmp/c2.out" 2>&1 || fail "--resume after SIGINT failed: $(cat "$tmp/c2.out")"
    cmp -s "$tmp/a/final.safetensors" "$tmp/c/final.safetensors" || fail "final.safetensors differs after SIGINT"
  elif [[ $code -ne 0 ]]; then  # 0: the signal came after the last step
    fail "SIGINT: exit status $code, expected 130: $(cat "$tmp/c.out")"
  fi

  # SWA with a patch and a frozen backbone: the average's files under the HybridModel's names,
  # which tvc eval loads.
  "$tvc" train --backbone resnet18 --data "$tmp/imgs" --image-size 32 --batch-size 8 --epochs 2 --val-split 0.25 \
    --workers 0 --patches '{"layer3": {"wrap": "se"}}' --freeze-backbone true --unfreeze-stages '[3]' \
    --swa '{start_epoch: 2, swa_lr: 0.01, anneal_epochs: 1}' --out "$tmp/s" >"$tmp/s.out" 2>&1 ||
    fail "the SWA run failed: $(cat "$tmp/s.out")"
  tail -n 2 "$tmp/s.out" | head -n 1 | grep -Eq '^test accuracy on .*: [0-9.]+%, swa [0-9.]+%$' ||
    fail "the SWA run does not give the raw and SWA test accuracy: $(cat "$tmp/s.out")"
  [[ -s $tmp/s/final_swa.safetensors && -s $tmp/s/final_swa.pth ]] || fail "the SWA run did not write final_swa.*"
  /usr/bin/python3 -c "
import sys, torch
sd = torch.load(sys.argv[1], weights_only=True)
assert any(k.startswith('stages.2.1.') for k in sd), list(sd)[:5]  # the SE block, HybridModel names
" "$tmp/s/final_swa.pth" || fail "final_swa.pth does not hold the HybridModel's names"
  "$tvc" eval "$tmp/s" --weights "$tmp/s/final_swa.pth" >"$tmp/se.out" 2>&1 ||
    fail "tvc eval of the SWA run failed: $(cat "$tmp/se.out")"

  expect 2 "unknown key 'batch_szie'; did you mean 'batch_size'" train --backbone resnet18 --batch-szie 8
  printf 'backbone: resnet18\nlearning_rate: 0.1\n' >"$tmp/bad.yaml"
  expect 2 "recipe $tmp/bad.yaml: unknown key 'learning_rate'" train --recipe "$tmp/bad.yaml"

  "$tvc" eval "$tmp/a" --weights "$tmp/a/final_ema.safetensors" --svg "$tmp/confusion.svg" >"$tmp/e.out" 2>&1 ||
    fail "tvc eval failed: $(cat "$tmp/e.out")"
  cat "$tmp/e.out"
  grep -Eq '^accuracy on .*\(12 images\): [0-9.]+%$' "$tmp/e.out" || fail "tvc eval: no accuracy line"
  grep -q 'class2' "$tmp/e.out" && grep -q '<svg' "$tmp/confusion.svg" || fail "tvc eval: no confusion matrix"
  "$tvc" predict --recipe "$tmp/a" --weights "$tmp/a/best.pth" "$tmp/imgs/class0/00.jpg" "$tmp/imgs/class2/01.png" \
    >"$tmp/p.out" 2>&1 || fail "tvc predict --recipe failed: $(cat "$tmp/p.out")"
  cat "$tmp/p.out"
  [[ $(grep -cE '^ +[0-9.]+%  [0-2]  class[0-2]$' "$tmp/p.out") -eq 6 ]] ||
    fail "tvc predict --recipe: not three classes per image: $(cat "$tmp/p.out")"

  # The exported .pth (torchvision's names: no patches) in torchvision's resnet18, strict=True,
  # gives tvc's outputs.
  /usr/bin/python3 - "$tmp" "$tvc" <<'PY' || fail "the exported .pth does not load into torchvision or gives other outputs"
import subprocess, sys, torch, torchvision
from safetensors.torch import save_file, load_file
tmp, tvc = sys.argv[1], sys.argv[2]
model = torchvision.models.resnet18(num_classes=3)
model.load_state_dict(torch.load(f"{tmp}/a/final.pth", weights_only=True), strict=True)
model.eval()
x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
save_file({"input": x}, f"{tmp}/x.safetensors")
subprocess.run([tvc, "run", "resnet18", "--weights", f"{tmp}/a/final.pth", "--num-classes", "3",
                "--input", f"{tmp}/x.safetensors", "--output", f"{tmp}/y.safetensors"], check=True)
ours = load_file(f"{tmp}/y.safetensors")["output"]
with torch.no_grad():
    theirs = model(x)
err = ((ours - theirs).norm() / theirs.norm()).item()
print(f"exported .pth in torchvision: relative error {err:.2e}")
sys.exit(0 if err < 1e-5 else 1)
PY
  ;;
*)
  echo "unknown mode $mode"
  exit 2
  ;;
esac

if ((failures > 0)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
