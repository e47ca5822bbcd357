#!/usr/bin/python3
"""PyTorch's side of tvc_bench: times torch.matmul (SGEMM) and torch.nn.functional.conv2d on the
shapes of bench/bench_main.cpp (keep the two lists in step), with the same thread counts, and
prints GFLOP/s under the same benchmark names ("torch" in place of the instruction set).

Given tvc_bench's JSON output (--tvc), it also prints tvc / torch as a ratio per benchmark.
See bench/README.md.

  /usr/bin/python3 tools/bench_torch.py [--threads 1 2] [--min-time 0.5] [--tvc tvc.json]
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

SGEMM_SIZES = [256, 512, 1024, 2048]

# name, C, O, H, k, stride, pad: ResNet-50's convolutions (3x3 padded by 1, 1x1 unpadded).
RESNET50_CONVS = [
    ("3x3_64x56", 64, 64, 56, 3, 1, 1),
    ("3x3_128x28", 128, 128, 28, 3, 1, 1),
    ("3x3_256x14", 256, 256, 14, 3, 1, 1),
    ("3x3_512x7", 512, 512, 7, 3, 1, 1),
    ("1x1_64-256x56", 64, 256, 56, 1, 1, 0),
    ("1x1_256-64x56", 256, 64, 56, 1, 1, 0),
    ("1x1_1024-256x14", 1024, 256, 14, 1, 1, 0),
    ("1x1_256-1024x14", 256, 1024, 14, 1, 1, 0),
    ("1x1_2048-512x7", 2048, 512, 7, 1, 1, 0),
    ("1x1_512-2048x7", 512, 2048, 7, 1, 1, 0),
]
BATCHES = [1, 8]


def gflops(fn, flop, min_time):
    """Mean GFLOP/s of fn over calls totalling at least min_time seconds (after one warm-up)."""
    fn()
    calls, total = 0, 0.0
    while total < min_time:
        t0 = time.perf_counter()
        fn()
        total += time.perf_counter() - t0
        calls += 1
    return flop * calls / total / 1e9


def run(threads, min_time):
    """{benchmark name: GFLOP/s} for every shape on `threads` threads (this process)."""
    torch.set_num_threads(threads)
    results = {}

    def record(name, fn, flop):
        results[name] = gflops(fn, flop, min_time)
        print(f"{name:45s} GFLOP/s={results[name]:.1f}", file=sys.stderr, flush=True)

    with torch.no_grad():
        for n in SGEMM_SIZES:
            a, b = torch.rand(n, n) * 2 - 1, torch.rand(n, n) * 2 - 1
            record(f"sgemm/torch/{n}/threads:{threads}", lambda: torch.matmul(a, b), 2.0 * n ** 3)
        for name, c, o, h, k, stride, pad in RESNET50_CONVS:
            w, bias = torch.randn(o, c, k, k), torch.randn(o)
            ho = (h + 2 * pad - k) // stride + 1
            for batch in BATCHES:
                x = torch.randn(batch, c, h, h)
                record(f"conv2d/{name}/N:{batch}/threads:{threads}",
                       lambda: F.conv2d(x, w, bias, stride, pad),
                       2.0 * batch * o * ho * ho * c * k * k)
    return results


def run_in_subprocess(threads, min_time):
    """run() in a fresh interpreter whose thread pools (OpenMP, and OpenBLAS, which ignores
    torch.set_num_threads) are sized to `threads` from the start."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, __file__, "--worker", str(threads),
                          "--min-time", str(min_time)],
                         env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def key(name):
    """The name without the tvc_bench suffix and the variant (instruction set, torch, onednn)."""
    parts = name.removesuffix("/manual_time").split("/")
    if parts[0] == "sgemm":
        del parts[1]
    return "/".join(parts)


def compare(tvc_json, torch_results):
    with open(tvc_json) as f:
        tvc = json.load(f)["benchmarks"]
    ours = {key(k): v for k, v in torch_results.items()}
    print(f"{'benchmark (tvc)':45s} {'tvc':>8s} {'torch':>8s}  tvc/torch")
    for b in tvc:
        k = key(b["name"])
        if k in ours and "GFLOP/s" in b:
            print(f"{b['name'].removesuffix('/manual_time'):45s} {b['GFLOP/s']:8.1f} "
                  f"{ours[k]:8.1f}  {b['GFLOP/s'] / ours[k]:.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cores = len(os.sched_getaffinity(0))
    p.add_argument("--threads", type=int, nargs="+",
                   default=[1, cores] if cores > 1 else [1], help="thread counts (default 1 and all)")
    p.add_argument("--min-time", type=float, default=0.5, help="seconds per benchmark")
    p.add_argument("--tvc", help="tvc_bench --benchmark_format=json output to compare with")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # one thread count, JSON out
    args = p.parse_args()
    if args.worker:
        json.dump(run(args.worker, args.min_time), sys.stdout)
        return
    print(f"torch {torch.__version__}", file=sys.stderr)
    results = {}
    for t in args.threads:
        results.update(run_in_subprocess(t, args.min_time))
    if args.tvc:
        compare(args.tvc, results)


if __name__ == "__main__":
    main()
