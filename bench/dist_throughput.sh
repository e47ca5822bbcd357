#!/bin/bash
# Data-parallel throughput of `tvc train` on 1, 2 and 4 ranks of this machine (mpirun), for the
# small CNN recipe and the main job's recipe (resnet18 + SE at 32x32, batch 128), with sync_bn:
# the training images/s of the global batch (rank 0's epoch line, without validation and test)
# and the all-reduce wait per step. 1 rank uses every core; N ranks one thread each when the
# machine has N cores or fewer, else cores / N (`--threads`).
# Usage: bench/dist_throughput.sh [TVC] [STEPS]   (default build/tools/tvc, 100 steps)
set -euo pipefail
tvc=${1:-build/tools/tvc}
steps=${2:-100}
cores=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-28s %5s %7s %12s %22s\n' recipe ranks threads "images/s" "all-reduce ms/step"
for recipe in small_cnn recipes/fashion_resnet18_se_ema.yaml; do
  for ranks in 1 2 4; do
    threads=$((cores / ranks > 0 ? cores / ranks : 1))
    launch=()
    ((ranks > 1)) && launch=(mpirun -np "$ranks" --oversubscribe --bind-to none --allow-run-as-root)
    "${launch[@]}" "$tvc" train --recipe "$recipe" --epochs 1 --max-batches "$steps" --threads "$threads" \
      --sync-bn true --out "$tmp/run" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
    line=$(grep '^epoch 1/1: ' "$tmp/out")
    images=$(sed -E 's/.*; ([0-9]+) images\/s \(loader.*/\1/' <<<"$line")
    wait_ms=$(grep -oE 'all-reduce wait [0-9.]+' <<<"$line" | grep -oE '[0-9.]+$' || echo -)
    printf '%-28s %5s %7s %12s %22s\n' "$(basename "$recipe" .yaml)" "$ranks" "$threads" "$images" "$wait_ms"
  done
done
