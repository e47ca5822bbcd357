#!/usr/bin/python3
"""Evaluates the op test table's cases with PyTorch (Debian's python3-torch).

Usage: torch_oracle.py MANIFEST.json RESULTS.json

MANIFEST: {"cases": [{"name", "expr", "inputs": [{"dtype", "shape", "data", "channels_last",
"grad"}], "proj": null | {"shape", "data"}}]}. Inputs are named a, b, c, ..., j in the expression.
RESULTS: {"results": [{"out": {"shape", "data"}, "grads": [null | {"shape", "data"}, ...]} or
{"error": "..."}]}, one per case, where grads are those of sum(out * proj).
"""
import json
import math
import sys

import torch
import torch.nn.functional as F  # noqa: F401 (used by expressions)

torch.set_num_threads(1)
DTYPES = {name: getattr(torch, name) for name in
          ["float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
           "uint8", "bool"]}


def number(v):
    """JSON has no NaN or infinity: those travel as the strings "nan", "inf", "-inf"."""
    return v if math.isfinite(v) else str(v)


def to_json(t):
    t = t.detach().to(torch.float64).contiguous()
    return {"shape": list(t.shape), "data": [number(float(v)) for v in t.reshape(-1).tolist()]}


def make_input(spec):
    t = torch.tensor(spec["data"], dtype=torch.float64).reshape(spec["shape"]).to(DTYPES[spec["dtype"]])
    if spec.get("channels_last"):
        t = t.contiguous(memory_format=torch.channels_last)
    if spec.get("grad"):
        t.requires_grad_(True)
    return t


def evaluate(case):
    inputs = [make_input(s) for s in case["inputs"]]
    env = {"torch": torch, "F": F, "math": math}
    env.update(dict(zip("abcdefghij", inputs)))
    out = eval(case["expr"], env)
    result = {"out": to_json(out), "grads": None}
    proj = case.get("proj")
    wrt = [t for t in inputs if t.requires_grad]
    if proj is not None and wrt and out.requires_grad:
        r = torch.tensor(proj["data"], dtype=torch.float64).reshape(proj["shape"]).to(out.dtype)
        grads = torch.autograd.grad((out * r).sum(), wrt, allow_unused=True)
        it = iter(grads)
        result["grads"] = [None if not t.requires_grad else (lambda g: None if g is None else to_json(g))(next(it))
                           for t in inputs]
    return result


def main():
    with open(sys.argv[1]) as f:
        manifest = json.load(f)
    results = []
    for case in manifest["cases"]:
        try:
            results.append(evaluate(case))
        except Exception as e:  # reported per case by the C++ test
            results.append({"error": f"{type(e).__name__}: {e}"})
    tmp = sys.argv[2] + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"results": results}, f)
    import os
    os.replace(tmp, sys.argv[2])


if __name__ == "__main__":
    main()
