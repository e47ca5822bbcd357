#!/usr/bin/env python3
"""tvc against PyTorch eager, ONNX Runtime and OpenVINO on this machine, in one run.

A development tool (issue 16), never part of the tests or CI. Run it with the Python of a virtual
environment holding the official wheels:

    python3 -m venv .venv-bench
    .venv-bench/bin/pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu
    .venv-bench/bin/pip install onnx onnxruntime openvino

(PyPI's torch wheel, built with CUDA, runs the same CPU kernels where download.pytorch.org is
out of reach; it pulls the CUDA libraries, about 4 GB.)
    .venv-bench/bin/python bench/compare.py --tvc build/tools/tvc --models resnet50 mobilenet_v2 \\
        --batch 1 8 --threads 2

For each model, batch and thread count the four engines run the same random-weight model on
fresh random (N, 3, S, S) inputs, alternating in rounds (tvc, PyTorch, ONNX Runtime, OpenVINO,
then again), so that the machine's drift touches all alike. tvc's steps are timed by `tvc bench`
(its median over each round's steps); the others' here. The table gives each engine's median ms
over all rounds and tvc's ratio to the best of the three others; --train adds a training step
(forward, cross-entropy, backward, SGD) against PyTorch's. The header names the date, CPU and
versions. Every engine computes in float32 (OpenVINO's precision hint is set to f32: on CPUs with
AMX or AVX512_BF16 it defaults to bfloat16). With --dtype bfloat16 (inference only) tvc runs
`tvc bench --dtype bfloat16` (bfloat16 weights of convolutions and linear layers, float32 sums),
PyTorch under torch.autocast("cpu", bfloat16), OpenVINO with the bf16 precision hint; ONNX Runtime
has no bfloat16 path on the CPU and stays float32, shown for reference and left out of "best". Timing is wall clock of a whole call (inference: output materialised); every engine's
fresh random input is made before its clock starts.
"""
import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def time_calls(fn, steps, make_input):
    """Times fn(x) on a fresh input x = make_input() per call, made before the clock starts."""
    times = []
    for _ in range(steps):
        x = make_input()
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return times


def tvc_round(tvc, model, batch, size, threads, steps, train, dtype="float32"):
    cmd = [tvc, "bench", model, "--batch", str(batch), "--size", str(size), "--threads", str(threads),
           "--iterations", str(steps), "--dtype", dtype] + (["--train"] if train else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    median = float(re.search(r"median ([0-9.]+) ms", out).group(1)) / 1000
    return [median] * steps  # one median per round, weighted like the others' steps


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tvc", default="build/tools/tvc")
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_large",
                                                        "efficientnet_b0", "densenet121", "convnext_tiny", "vit_b_16",
                                                        "swin_t"])
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--threads", nargs="+", type=int, default=[2])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per engine and round")
    parser.add_argument("--train", action="store_true", help="also time training steps against PyTorch's")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16: inference with bfloat16 products where each engine has them")
    parser.add_argument("--train-batch", nargs="+", type=int, default=[8], help="the batches of the training steps")
    args = parser.parse_args()

    import numpy as np
    import onnxruntime as ort
    import openvino as ov
    import torch
    import torchvision

    print(f"# {datetime.date.today()}, {cpu_name()}, {os.cpu_count()} logical CPUs, {platform.python_version()}; "
          f"torch {torch.__version__}, torchvision {torchvision.__version__}, onnxruntime {ort.__version__}, "
          f"openvino {ov.__version__}; tvc {args.tvc}; {args.dtype}")
    bf16 = args.dtype == "bfloat16"
    if bf16 and args.train:
        parser.error("--dtype bfloat16 times inference only")
    print(f"| model | batch | threads | tvc ms | PyTorch ms | ONNX Runtime ms{' (float32)' if bf16 else ''} | "
          "OpenVINO ms | tvc / best |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    train_rows = []
    core = ov.Core()
    for name in args.models:
        for threads in args.threads:
            torch.set_num_threads(threads)
            torch.manual_seed(0)
            model = torchvision.models.get_model(name, weights=None).eval()
            for batch in args.batch:
                shape = (batch, 3, args.size, args.size)
                with tempfile.TemporaryDirectory() as tmp:
                    onnx_path = os.path.join(tmp, "model.onnx")
                    torch.onnx.export(model, torch.randn(*shape), onnx_path, input_names=["x"], opset_version=17,
                                      dynamo=False)
                    options = ort.SessionOptions()
                    options.intra_op_num_threads = threads
                    options.inter_op_num_threads = 1
                    session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
                    # float32 like the others: on CPUs with AMX or AVX512_BF16 OpenVINO would
                    # otherwise run in bfloat16.
                    compiled = core.compile_model(onnx_path, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                                     "PERFORMANCE_HINT": "LATENCY",
                                                                     "INFERENCE_PRECISION_HINT": "bf16" if bf16
                                                                     else "f32"})
                request = compiled.create_infer_request()

                def run_torch(x):
                    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                        model(x)

                def run_ort(x):
                    session.run(None, {"x": x})

                def run_ov(x):
                    request.infer({0: x})

                def torch_input():
                    return torch.randn(*shape)

                def numpy_input():
                    return np.random.randn(*shape).astype(np.float32)

                engines = {"tvc": lambda steps: tvc_round(args.tvc, name, batch, args.size, threads, steps, False,
                                                          args.dtype),
                           "PyTorch": lambda steps: time_calls(run_torch, steps, torch_input),
                           "ONNX Runtime": lambda steps: time_calls(run_ort, steps, numpy_input),
                           "OpenVINO": lambda steps: time_calls(run_ov, steps, numpy_input)}
                for fn in list(engines.values())[1:]:  # warm-up (first-call costs are not timed)
                    fn(1)
                times = {k: [] for k in engines}
                for _ in range(args.rounds):
                    for k, fn in engines.items():
                        times[k] += fn(args.steps)
                ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
                best = min(ms["PyTorch"], ms["OpenVINO"]) if bf16 else min(ms["PyTorch"], ms["ONNX Runtime"],
                                                                             ms["OpenVINO"])
                print(f"| {name} | {batch} | {threads} | {ms['tvc']:.1f} | {ms['PyTorch']:.1f} | "
                      f"{ms['ONNX Runtime']:.1f} | {ms['OpenVINO']:.1f} | {ms['tvc'] / best:.2f} |", flush=True)
                if args.train and batch in args.train_batch:
                    trained = torchvision.models.get_model(name, weights=None).train()
                    optimizer = torch.optim.SGD(trained.parameters(), lr=1e-4, momentum=0.9)

                    def train_torch(inputs):
                        x, labels = inputs
                        loss = torch.nn.functional.cross_entropy(trained(x), labels)
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()

                    def train_inputs():
                        return torch.randn(*shape), torch.randint(0, 1000, (batch,))

                    train_torch(train_inputs())
                    t_times, p_times = [], []
                    for _ in range(args.rounds):
                        t_times += tvc_round(args.tvc, name, batch, args.size, threads, args.steps, True)
                        p_times += time_calls(train_torch, args.steps, train_inputs)
                    t, p = 1000 * statistics.median(t_times), 1000 * statistics.median(p_times)
                    train_rows.append(f"| {name} | {batch} | {threads} | {t:.1f} | {p:.1f} | {t / p:.2f} |")
    if train_rows:
        print("\nTraining steps (forward in train mode, cross-entropy, backward, SGD):\n")
        print("| model | batch | threads | tvc ms | PyTorch ms | tvc / PyTorch |")
        print("| --- | --- | --- | --- | --- | --- |")
        print("\n".join(train_rows))


if __name__ == "__main__":
    sys.exit(main())
