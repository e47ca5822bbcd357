"""Checkpoints as users have them, for tests/test_opaque.cpp; run with Debian's /usr/bin/python3
(torch 1.13, torchvision, NumPy).

  checkpoint_fixtures.py DIR     writes into DIR, then the file `complete`:
    lightning.ckpt      a PyTorch Lightning-style checkpoint: state_dict, optimizer and scheduler
                        states, loops, callbacks, argparse.Namespace hyper-parameters, NumPy
                        scalars and arrays, NumPy's RNG state
    timm.pth.tar        a timm-style training checkpoint: arch, state_dict, optimizer, the
                        `args` Namespace, a NumPy float64 metric
    numpy.pt            NumPy arrays and scalars of every dtype (big-endian, Fortran order,
                        0-d, empty, strings, objects, structured, complex, unsigned)
    whole_resnet18.pt   torch.save(model) of torchvision's resnet18 (random weights)
    whole_custom.pt     torch.save(model) of a nested module whose classes live in this script,
                        with a None bias, a non-persistent buffer, a None buffer and tied weights
    whole_custom_legacy.pt  the same in torch.save's legacy format
    evil.pt             a state_dict beside objects whose unpickling calls os.system,
                        builtins.eval and subprocess.Popen, each creating a marker file in
                        DIR/markers/ (this script checks that torch.load(weights_only=False)
                        does create them, then removes them)
    NAME.json           the description of each file's object (see describe())
    NAME.expected.pt    for each file with weights: torch.save of the state_dict tvc must find
                        (checkpoint["state_dict"], or model.state_dict() for whole-model saves)

A description mirrors the object as tools/pth_fixtures.py's does, plus {"set": [...]},
{"bytes": hex} and, for instances and calls of other classes, what pickle records of them
(protocol 2, obj.__reduce_ex__(2)): {"object": {"global": "argparse.Namespace", "made":
"new"|"call"|"global", "args": [...], "state": ..., "appended": [...], "set_items": [...]}}.
NumPy arrays of dtypes tvc has are tensors, scalars are numbers; other NumPy data is
{"object": {"global": "numpy.ndarray"|"numpy.scalar", "made": "new", "state": {dtype, shape,
fortran_order, data}}} with the data in memory order, little-endian where it is numeric.
"""
import argparse
import collections
import copyreg
import json
import os
import subprocess
import sys
import types

import numpy as np
import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pth_fixtures import describe as describe_plain  # noqa: E402


def global_name(obj):
    return f"{obj.__module__}.{obj.__qualname__}"


def numpy_raw(kind, arr_or_scalar, shape):
    dtype = arr_or_scalar.dtype
    numeric = dtype.kind in "biufc" and dtype.fields is None
    if numeric and dtype.byteorder == ">":
        arr_or_scalar = arr_or_scalar.astype(dtype.newbyteorder("<"))
    state = [[{"str": "dtype"}, {"str": arr_or_scalar.dtype.str}]]
    if shape is not None:
        state.append([{"str": "shape"}, {"tuple": [{"int": d} for d in shape]}])
        state.append([{"str": "fortran_order"}, {"bool": bool(np.isfortran(arr_or_scalar))}])
    if dtype.hasobject:
        data = describe(list(np.asarray(arr_or_scalar).ravel(order="A")))
    elif shape is None:  # a scalar: the bytes pickle wrote (long double's padding included)
        data = {"bytes": arr_or_scalar.__reduce__()[1][1].hex()}
    else:
        data = {"bytes": np.asarray(arr_or_scalar).tobytes(order="A").hex()}
    state.append([{"str": "data"}, data])
    return {"object": {"global": kind, "made": "new", "args": [], "state": {"dict": state, "ordered": False},
                       "appended": [], "set_items": []}}


TVC_NUMPY = {"b", "u1", "i1", "i2", "i4", "i8", "f2", "f4", "f8"}


def numpy_code(dtype):
    return dtype.kind if dtype.kind == "b" else f"{dtype.kind}{dtype.itemsize}"


def describe(obj, storages=None):
    storages = {} if storages is None else storages
    if isinstance(obj, np.ndarray):
        if numpy_code(obj.dtype) in TVC_NUMPY and obj.dtype.fields is None:
            native = obj.astype(obj.dtype.newbyteorder("<")) if obj.dtype.byteorder == ">" else obj
            d = describe_plain(torch.from_numpy(native), {})
            if obj.size == 0:  # the pickle keeps no strides: read back, the array is C-contiguous
                d["tensor"]["stride"] = [int(np.prod(obj.shape[i + 1:])) for i in range(obj.ndim)]
            d["tensor"]["storage"] = len(storages)  # each array its own storage
            storages[("numpy", id(obj))] = len(storages)
            return d
        return numpy_raw("numpy.ndarray", obj, obj.shape)
    if isinstance(obj, np.generic):
        code = numpy_code(obj.dtype)
        if code == "b":
            return {"bool": bool(obj)}
        if obj.dtype.kind in "iu" and (obj.dtype.kind == "i" or int(obj) < 2**63):
            return {"int": int(obj)}
        if obj.dtype.kind == "f" and obj.dtype.itemsize <= 8:
            return {"float": float(obj)}
        return numpy_raw("numpy.scalar", obj, None)
    if isinstance(obj, np.dtype):
        return {"object": {"global": "numpy.dtype", "made": "call", "args": [{"str": obj.str}], "state": {"none": True},
                           "appended": [], "set_items": []}}
    if isinstance(obj, torch.Tensor) or obj is None or type(obj) in (bool, int, float, str):
        return describe_plain(obj, storages)
    if type(obj) in (dict, collections.OrderedDict):
        return {"dict": [[describe(k, storages), describe(v, storages)] for k, v in obj.items()],
                "ordered": type(obj) is collections.OrderedDict}
    if type(obj) is list:
        return {"list": [describe(v, storages) for v in obj]}
    if type(obj) is tuple:
        return {"tuple": [describe(v, storages) for v in obj]}
    if type(obj) in (set, frozenset):
        return {"set": [describe(v, storages) for v in obj]}
    if type(obj) is bytes:
        return {"bytes": obj.hex()}
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        return {"object": {"global": global_name(obj), "made": "global", "args": [], "state": {"none": True},
                           "appended": [], "set_items": []}}
    # What pickle protocol 2 records of any other object.
    reduced = obj.__reduce_ex__(2)
    func, args = reduced[0], reduced[1]
    state = reduced[2] if len(reduced) > 2 else None
    appended = list(reduced[3]) if len(reduced) > 3 and reduced[3] is not None else []
    set_items = list(reduced[4]) if len(reduced) > 4 and reduced[4] is not None else []
    if func is copyreg.__newobj__:
        made, name, args = "new", global_name(args[0]), args[1:]
    else:
        made, name = "call", global_name(func)
    return {"object": {"global": name, "made": made, "args": [describe(a, storages) for a in args],
                       "state": describe(state, storages), "appended": [describe(a, storages) for a in appended],
                       "set_items": [[describe(k, storages), describe(v, storages)] for k, v in set_items]}}


def randomised(model, seed):
    """Every parameter and buffer random (running variances positive)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.dtype.is_floating_point:
                t.copy_(torch.randint(0, 100, t.shape, generator=gen))
            elif name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
            else:
                t.copy_(torch.randn(t.shape, generator=gen))
    return model


def small_cnn():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))


def trained(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    model.train()
    model(torch.randn(4, 3, 16, 16)).logsumexp(1).sum().backward()
    opt.step()
    sched.step()
    return opt, sched


def lightning():
    model = small_cnn()
    opt, sched = trained(model)
    ckpt = {
        "epoch": 3,
        "global_step": 120,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": model.state_dict(),
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 4, "completed": 3}}}},
        "callbacks": {"ModelCheckpoint{'monitor': 'val_acc', 'mode': 'max'}": {
            "best_model_score": torch.tensor(0.91), "best_model_path": "/runs/epoch=3.ckpt", "dirpath": "/runs"}},
        "optimizer_states": [opt.state_dict()],
        "lr_schedulers": [sched.state_dict()],
        "hparams_name": "hparams",
        "hyper_parameters": argparse.Namespace(lr=0.1, name="x", layers=[1, 2], betas=(0.9, 0.999), note="é\n"),
        "metrics": {"val_acc": np.float64(0.9125), "val_loss": np.float32(0.25), "step": np.int64(120),
                    "flag": np.bool_(True)},
        "numpy_rng": np.random.RandomState(0).get_state(),
        "confusion": np.arange(12, dtype=np.int64).reshape(3, 4),
        "features": np.random.RandomState(1).randn(2, 3).astype(np.float32),
    }
    return ckpt, ckpt["state_dict"]


def timm():
    model = small_cnn()
    opt, _ = trained(model)
    args = argparse.Namespace(model="resnet18", lr=0.05, epochs=100, amp=True, mean=None, sched="cosine",
                              input_size=(3, 224, 224))
    ckpt = {"epoch": 10, "arch": "resnet18", "state_dict": model.state_dict(), "optimizer": opt.state_dict(),
            "version": 2, "args": args, "metric": np.float64(71.234)}
    return ckpt, ckpt["state_dict"]


def numpy_values():
    r = np.random.RandomState(2)
    values = {}
    for code in ["?", "u1", "i1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8", "c16"]:
        if code in ("c8", "c16"):
            a = (r.randn(2, 3) + 1j).astype(code)
        else:  # unsigned: from non-negative values (the uint64 beyond int64 is a scalar below)
            a = (r.randn(2, 3) * 100 if code[0] != "u" else np.abs(r.randn(2, 3)) * 100).astype(code)
        values[f"array_{code}"] = a
        values[f"scalar_{code}"] = a.flat[1]
    values["big_endian_i4"] = np.arange(6, dtype=">i4").reshape(2, 3) - 3
    values["big_endian_f8"] = r.randn(4).astype(">f8")
    values["big_endian_c16"] = (r.randn(2) + 2j).astype(">c16")
    values["fortran"] = np.asfortranarray(r.randn(3, 4).astype(np.float32))
    values["fortran_u4"] = np.asfortranarray(np.arange(6, dtype=np.uint32).reshape(2, 3))
    values["fortran_strings"] = np.asfortranarray(np.array([["a", "bb", "c"], ["dd", "e", "f"]]))
    values["zero_d"] = np.array(2.5)
    values["empty"] = np.zeros((0, 3), dtype=np.int32)
    values["strings"] = np.array(["ab", "cde"])
    values["bytes_array"] = np.array([b"x", b"yz"])
    values["objects"] = np.array([1, "two", None], dtype=object)
    values["structured"] = np.array([(1, 2.5)], dtype=[("a", "i4"), ("b", "f8")])
    values["uint64_huge"] = np.uint64(2**64 - 1)
    values["float128"] = np.longdouble(1.25)
    values["float16_scalar"] = np.float16(0.1)
    values["dtype"] = np.dtype("float32")
    values["int_keys_tuple"] = (np.int32(-7), np.uint8(200))
    return values


class Scale(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n))
        self.register_parameter("bias", None)
        self.register_buffer("calls", torch.tensor(0))
        self.register_buffer("cache", torch.randn(n), persistent=False)
        self.register_buffer("unused", None)
        self.note = argparse.Namespace(kind="scale", n=n)

    def forward(self, x):
        return x * self.weight


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.embed = torch.nn.Linear(4, 6, bias=False)
        self.blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), Scale(6))
                                           for _ in range(2)])
        self.norm = torch.nn.LayerNorm(6)
        self.head = torch.nn.Linear(6, 4, bias=False)
        self.head.weight = self.embed.weight  # tied: (4, 6) both
        self.missing = None
        self.table = np.arange(3, dtype=np.float64)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


class Marker:
    """An object whose unpickling runs call(*args)."""

    def __init__(self, call, *args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


def evil(markers):
    # os.system's __module__ is "posix"; pickle then names it posix.system. A stand-in named
    # os.system is pickled instead, which torch.load resolves to the real os.system.
    def system(command):
        raise RuntimeError("never called")
    system.__module__, system.__qualname__, system.__name__ = "os", "system", "system"
    real = os.system
    os.system = system
    model = small_cnn()
    obj = {"state_dict": model.state_dict(),
           "hook": Marker(system, f"touch {markers}/os_system"),
           "eval": Marker(eval, f"open({markers + '/builtins_eval'!r}, 'w').close()"),
           "popen": Marker(subprocess.Popen, ["touch", f"{markers}/subprocess_popen"])}
    return obj, model.state_dict(), lambda: setattr(os, "system", real)


def main():
    out = sys.argv[1]
    markers = os.path.join(out, "markers")
    os.makedirs(markers, exist_ok=True)
    files = {"lightning.ckpt": lightning(), "timm.pth.tar": timm(), "numpy.pt": (numpy_values(), None)}
    resnet = randomised(torchvision.models.resnet18(), 5)
    files["whole_resnet18.pt"] = (resnet, resnet.state_dict())
    net = Net()
    files["whole_custom.pt"] = (net, net.state_dict())
    for name, (obj, state_dict) in files.items():
        torch.save(obj, f"{out}/{name}")
        if state_dict is not None:
            torch.save(state_dict, f"{out}/{name}.expected.pt")
        if name != "whole_resnet18.pt":
            with open(f"{out}/{name}.json", "w") as f:
                json.dump(describe(obj), f)
    torch.save(net, f"{out}/whole_custom_legacy.pt", _use_new_zipfile_serialization=False)

    obj, state_dict, restore = evil(markers)
    try:
        torch.save(obj, f"{out}/evil.pt")
        description = describe(obj)
    finally:
        restore()
    torch.save(state_dict, f"{out}/evil.pt.expected.pt")
    with open(f"{out}/evil.pt.json", "w") as f:
        json.dump(description, f)
    # The file is what it claims: a full unpickle runs all three.
    torch.load(f"{out}/evil.pt", weights_only=False)
    subprocess.run(["sleep", "0.2"])  # Popen does not wait for touch
    made = sorted(os.listdir(markers))
    assert made == ["builtins_eval", "os_system", "subprocess_popen"], made
    for m in made:
        os.remove(os.path.join(markers, m))
    open(f"{out}/complete", "w").write("ok\n")


main()
