#!/bin/bash
# Tests of the tvc program. Usage: test_cli.sh MODE TVC [DATA_DIR]
#   errors        exit codes and messages: usage errors exit 2, missing or malformed data exit 1
#                 with `error: <file>: <fault>` on stderr, --help exits 0
#   reproducible  a few training batches twice, with 1 and 2 threads: identical stdout (losses,
#                 the hash of the trained weights, the accuracy); with --ema the same plus the
#                 EMA's accuracy on the line before the last
#   train         `tvc train --epochs 1 --seed 0` ends with `test accuracy: NN.NN%` >= 88%
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
  "$tvc" train --seed 7 --max-batches 25 --threads 1 --data-dir "$data" >"$tmp/a" 2>"$tmp/a.err" ||
    fail "first run failed: $(cat "$tmp/a.err")"
  "$tvc" train --seed 7 --max-batches 25 --threads 2 --data-dir "$data" >"$tmp/b" 2>"$tmp/b.err" ||
    fail "second run failed: $(cat "$tmp/b.err")"
  "$tvc" train --seed 8 --max-batches 25 --threads 2 --data-dir "$data" >"$tmp/c" 2>"$tmp/c.err" ||
    fail "third run failed: $(cat "$tmp/c.err")"
  cat "$tmp/a"
  cmp -s "$tmp/a" "$tmp/b" || fail "same seed, different results: $(diff "$tmp/a" "$tmp/b")"
  cmp -s "$tmp/a" "$tmp/c" && fail "seeds 7 and 8 gave identical results"
  grep -q '^weights fnv1a: [0-9a-f]\{16\}$' "$tmp/a" || fail "no weights hash in the output"
  # --ema: the same training (losses, hash, raw accuracy last) plus the EMA's accuracy on the
  # line before the last, also independent of the thread count.
  "$tvc" train --seed 7 --max-batches 25 --threads 1 --ema 0.99 --data-dir "$data" >"$tmp/e1" 2>"$tmp/e1.err" ||
    fail "--ema run failed: $(cat "$tmp/e1.err")"
  "$tvc" train --seed 7 --max-batches 25 --threads 2 --ema 0.99 --data-dir "$data" >"$tmp/e2" 2>"$tmp/e2.err" ||
    fail "--ema run failed: $(cat "$tmp/e2.err")"
  cat "$tmp/e1"
  cmp -s "$tmp/e1" "$tmp/e2" || fail "--ema: same seed, different results: $(diff "$tmp/e1" "$tmp/e2")"
  grep -v '^EMA test accuracy' "$tmp/e1" | cmp -s - "$tmp/a" || fail "--ema changed the training: $(diff "$tmp/e1" "$tmp/a")"
  tail -n 2 "$tmp/e1" | head -n 1 | grep -Eq '^EMA test accuracy: [0-9]+\.[0-9][0-9]%$' ||
    fail "the line before the last is not 'EMA test accuracy: NN.NN%': $(cat "$tmp/e1")"
  ;;
train)
  start=$(date +%s)
  "$tvc" train --epochs 1 --seed 0 --data-dir "$data" >"$tmp/out" 2>"$tmp/err"
  code=$?
  cat "$tmp/err" "$tmp/out"
  echo "wall time: $(($(date +%s) - start)) s"
  [[ $code -eq 0 ]] || fail "tvc train exited $code"
  last=$(tail -n 1 "$tmp/out")
  if [[ $last =~ ^test\ accuracy:\ ([0-9]+)\.([0-9][0-9])%$ ]]; then
    hundredths=$((10#${BASH_REMATCH[1]} * 100 + 10#${BASH_REMATCH[2]}))
    ((hundredths >= 8800)) || fail "accuracy $last is below 88%"
  else
    fail "the last line of stdout is '$last', not 'test accuracy: NN.NN%'"
  fi
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
