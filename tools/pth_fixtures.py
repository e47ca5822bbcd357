"""Fixtures for tests/test_pth.cpp, run with Debian's /usr/bin/python3 (torch 1.13).

  pth_fixtures.py make DIR       writes the .pth files below and their descriptions (*.json)
  pth_fixtures.py describe FILE  prints the description of torch.load(FILE, weights_only=True)
  pth_fixtures.py describe_full FILE   the same with weights_only=False: torch 1.13's
                                 weights_only unpickler lacks BINFLOAT (opcode 'G'), so it cannot
                                 load any checkpoint holding a Python float

A description is JSON mirroring the object: {"dict": [[key, value], ...], "ordered": bool},
{"list": [...]}, {"tuple": [...]}, {"int": n}, {"float": x}, {"str": s}, {"bool": b},
{"none": true}, and for tensors {"tensor": {dtype, shape, stride, offset, storage, storage_size,
requires_grad, hex}} where storage numbers storages by first use (so equal numbers mean one
shared storage) and hex is the bytes of the tensor's elements in row-major order.
"""
import collections
import json
import sys
import zipfile

import torch


def describe(obj, storages):
    if isinstance(obj, torch.Tensor):
        # Empty storages all have data_ptr 0 but are distinct storages.
        ptr = obj.storage().data_ptr() if obj.storage().size() else ("empty", len(storages))
        storages.setdefault(ptr, len(storages))
        raw = obj.contiguous().reshape(-1).view(torch.uint8) if obj.numel() else torch.empty(0, dtype=torch.uint8)
        return {"tensor": {"dtype": str(obj.dtype), "shape": list(obj.shape), "stride": list(obj.stride()),
                           "offset": obj.storage_offset(), "storage": storages[ptr],
                           "storage_size": obj.storage().size(), "requires_grad": obj.requires_grad,
                           "hex": bytes(raw.tolist()).hex()}}
    if isinstance(obj, dict):
        return {"dict": [[describe(k, storages), describe(v, storages)] for k, v in obj.items()],
                "ordered": isinstance(obj, collections.OrderedDict)}
    if isinstance(obj, list):
        return {"list": [describe(v, storages) for v in obj]}
    if isinstance(obj, tuple):
        return {"tuple": [describe(v, storages) for v in obj]}
    if obj is None:
        return {"none": True}
    if isinstance(obj, bool):
        return {"bool": obj}
    if isinstance(obj, int):
        return {"int": obj}
    if isinstance(obj, float):
        return {"float": obj}
    if isinstance(obj, str):
        return {"str": obj}
    raise TypeError(type(obj))


def state_dict():
    torch.manual_seed(0)
    sd = collections.OrderedDict()
    for name, dtype in [("f32", torch.float32), ("f64", torch.float64), ("f16", torch.float16),
                        ("bf16", torch.bfloat16), ("i64", torch.int64), ("i32", torch.int32),
                        ("i16", torch.int16), ("i8", torch.int8), ("u8", torch.uint8), ("bool", torch.bool)]:
        if dtype.is_floating_point:
            t = torch.randn(3, 4, dtype=torch.float64).to(dtype)
        elif dtype == torch.bool:
            t = torch.rand(3, 4) > 0.5
        else:
            info = torch.iinfo(dtype)
            t = torch.randint(max(info.min, -2**62), min(info.max, 2**62), (3, 4), dtype=dtype)
        sd[name] = t
    sd["special"] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-45, 3.4e38])
    sd["empty"] = torch.empty(0)
    sd["empty2d"] = torch.zeros(2, 0, dtype=torch.int32)
    sd["scalar"] = torch.tensor(3.5)
    sd["scalar_int"] = torch.tensor(-7)
    sd["transposed"] = torch.randn(4, 6).t()
    base = torch.randn(6, 5)
    sd["shared_base"] = base
    sd["sliced"] = base[1:, ::2]          # offset 5, strides (5, 2), shares base's storage
    sd["shared_rows"] = base[2:4]
    sd["nested"] = {"inner": {"deep": torch.arange(5, dtype=torch.int64)}, "count": 2}
    sd._metadata = collections.OrderedDict([("", {"version": 1}), ("layer", {"version": 2})])
    return sd


def checkpoint():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return {"epoch": 3, "state_dict": model.state_dict(), "optimizer": opt.state_dict(),
            "loss": 0.1234567890123, "history": [1.5, 2.25, -3.0], "name": "run-1", "done": False,
            "nothing": None, "big": 2**40, "neg": -5, "int_keys": {1: "a", -2: "b"}, "pair": (1, "x", 2.5),
            "param": torch.nn.Parameter(torch.randn(3))}


def repack(src, dst, folder):
    """src's entries under another top folder, deflated, with zip64 local headers."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            name = folder + "/" + info.filename.split("/", 1)[1]
            with zout.open(name, "w", force_zip64=True) as f:
                f.write(zin.read(info.filename))


def main():
    if sys.argv[1] in ("describe", "describe_full"):
        obj = torch.load(sys.argv[2], weights_only=sys.argv[1] == "describe")
        print(json.dumps(describe(obj, {})))
        return
    out = sys.argv[2]
    for name, obj in [("sd", state_dict()), ("ckpt", checkpoint())]:
        torch.save(obj, f"{out}/{name}.pt")
        torch.save(obj, f"{out}/{name}_legacy.pt", _use_new_zipfile_serialization=False)
        repack(f"{out}/{name}.pt", f"{out}/{name}_repack.pt", "renamed_folder")
        with open(f"{out}/{name}.json", "w") as f:
            json.dump(describe(obj, {}), f)


if __name__ == "__main__":
    main()
