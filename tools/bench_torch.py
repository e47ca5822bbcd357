#!/usr/bin/python3
"""PyTorch's side of tvc_bench: times torch.matmul (SGEMM), torch.nn.functional.conv2d and
torchvision models on the shapes of bench/bench_main.cpp (keep the lists in step), with the same
thread counts, and prints GFLOP/s (models: images/s) under the same benchmark names ("torch" in
place of the instruction set).

Given tvc_bench's JSON output (--tvc), it also prints tvc / torch as a ratio per benchmark.
See bench/README.md.

  /usr/bin/python3 tools/bench_torch.py [--threads 1 2] [--min-time 0.5] [--filter REGEX]
                                        [--tvc tvc.json]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import torchvision

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

# Whole backbones, eval forward and a train step (forward in train mode + backward of sum).
MODELS = ["resnet50", "mobilenet_v2", "densenet121"]


def calls_per_second(fn, min_time):
    """Mean calls per second of fn over calls totalling at least min_time seconds (after one
    warm-up)."""
    fn()
    calls, total = 0, 0.0
    while total < min_time:
        t0 = time.perf_counter()
        fn()
        total += time.perf_counter() - t0
        calls += 1
    return calls / total


def model_step(name, train, batch):
    """One eval forward (no autograd) or train step of torchvision's `name` on random input."""
    model = torchvision.models.__dict__[name]().train(train)
    x = torch.randn(batch, 3, 224, 224)

    def step():
        if train:
            model.zero_grad(set_to_none=True)
            model(x).sum().backward()
        else:
            with torch.no_grad():
                model(x)
    return step


def run(threads, min_time, wanted):
    """{benchmark name: rate} for every benchmark whose name matches the regex `wanted`, on
    `threads` threads (this process)."""
    torch.set_num_threads(threads)
    results = {}

    def record(name, fn, units_per_call, unit="GFLOP/s"):
        if not re.search(wanted, name):
            return
        results[name] = units_per_call * calls_per_second(fn, min_time)
        print(f"{name:45s} {unit}={results[name]:.1f}", file=sys.stderr, flush=True)

    with torch.no_grad():
        for n in SGEMM_SIZES:
            a, b = torch.rand(n, n) * 2 - 1, torch.rand(n, n) * 2 - 1
            record(f"sgemm/torch/{n}/threads:{threads}", lambda: torch.matmul(a, b), 2e-9 * n ** 3)
        for name, c, o, h, k, stride, pad in RESNET50_CONVS:
            w, bias = torch.randn(o, c, k, k), torch.randn(o)
            ho = (h + 2 * pad - k) // stride + 1
            for batch in BATCHES:
                x = torch.randn(batch, c, h, h)
                record(f"conv2d/{name}/N:{batch}/threads:{threads}",
                       lambda: F.conv2d(x, w, bias, stride, pad),
                       2e-9 * batch * o * ho * ho * c * k * k)
    for name in MODELS:
        for train in (False, True):
            for batch in BATCHES:
                bench = f"model/{name}/{'train' if train else 'eval'}/N:{batch}/threads:{threads}"
                if re.search(wanted, bench):
                    record(bench, model_step(name, train, batch), batch, "img/s")
    return results


def run_in_subprocess(threads, min_time, wanted):
    """run() in a fresh interpreter whose thread pools (OpenMP, and OpenBLAS, which ignores
    torch.set_num_threads) are sized to `threads` from the start."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, __file__, "--worker", str(threads),
                          "--min-time", str(min_time), "--filter", wanted],
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
        rate = b.get("GFLOP/s", b.get("img/s"))  # models report images/s, the rest GFLOP/s
        if k in ours and rate is not None:
            print(f"{b['name'].removesuffix('/manual_time'):45s} {rate:8.1f} "
                  f"{ours[k]:8.1f}  {rate / ours[k]:.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cores = len(os.sched_getaffinity(0))
    p.add_argument("--threads", type=int, nargs="+",
                   default=[1, cores] if cores > 1 else [1], help="thread counts (default 1 and all)")
    p.add_argument("--min-time", type=float, default=0.5, help="seconds per benchmark")
    p.add_argument("--tvc", help="tvc_bench --benchmark_format=json output to compare with")
    p.add_argument("--filter", default="", help="regex: only the benchmarks whose names match")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # one thread count, JSON out
    args = p.parse_args()
    if args.worker:
        json.dump(run(args.worker, args.min_time, args.filter), sys.stdout)
        return
    print(f"torch {torch.__version__}", file=sys.stderr)
    results = {}
    for t in args.threads:
        results.update(run_in_subprocess(t, args.min_time, args.filter))
    if args.tvc:
        compare(args.tvc, results)


if __name__ == "__main__":
    main()
