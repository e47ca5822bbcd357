#!/usr/bin/python3
# Makes the fuzzers' seed corpora: small valid weight files of every kind the readers take, so
# that libFuzzer starts from inputs that reach deep into the readers instead of dying at the
# first check. Run with Debian's python3 (/usr/bin/python3, which has torch 1.13):
#   /usr/bin/python3 fuzz/make_corpus.py      (writes fuzz/corpus/safetensors and fuzz/corpus/pth)
# The files are kept small (a few KB in all): libFuzzer mutates short inputs much faster.
# The legacy .pth format names storages by their memory address, so regenerated legacy files
# differ byte for byte from the committed ones while holding the same values.
import collections
import json
import os
import struct
import zipfile

import torch

here = os.path.dirname(os.path.abspath(__file__))
st_dir = os.path.join(here, "corpus", "safetensors")
pth_dir = os.path.join(here, "corpus", "pth")
os.makedirs(st_dir, exist_ok=True)
os.makedirs(pth_dir, exist_ok=True)


def write_safetensors(path, tensors, metadata=None):
    """The safetensors layout by hand (8-byte little-endian header length, JSON header, data),
    so that dtypes torch 1.13 lacks (float8, unsigned) can be written too.
    tensors: [(name, dtype string, shape, raw little-endian bytes)], in data order."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the reference writer pads to a multiple of 8
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, data in tensors:
            f.write(data)


def raw(t):
    return t.contiguous().numpy().tobytes() if t.dtype != torch.bfloat16 else \
        t.contiguous().view(torch.int16).numpy().tobytes()


torch.manual_seed(0)

# safetensors: a small state_dict with metadata (float32, int64, bfloat16).
write_safetensors(os.path.join(st_dir, "state_dict.safetensors"), [
    ("fc.weight", "F32", [2, 3], raw(torch.randn(2, 3))),
    ("fc.bias", "F32", [2], raw(torch.randn(2))),
    ("steps", "I64", [], raw(torch.tensor(7))),
    ("emb", "BF16", [2, 2], raw(torch.randn(2, 2).bfloat16())),
], metadata={"format": "pt", "note": "tvc fuzz seed"})
# safetensors: the dtypes tvc loads only widened or checks specially (8-bit float, unsigned,
# bool), an empty tensor, and no metadata.
write_safetensors(os.path.join(st_dir, "dtypes.safetensors"), [
    ("f8", "F8_E4M3", [4], bytes([0x00, 0x38, 0x7e, 0xb8])),
    ("u16", "U16", [2], struct.pack("<2H", 1, 65535)),
    ("mask", "BOOL", [3], bytes([1, 0, 1])),
    ("f16", "F16", [2], raw(torch.tensor([1.5, -2.0], dtype=torch.float16))),
    ("none", "F64", [0, 3], b""),
])

# .pth, zip format: a state_dict as torch.save writes it (OrderedDict, views of one storage).
model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
torch.save(model.state_dict(), os.path.join(pth_dir, "state_dict_zip.pth"))
# The same archive repacked by Python's zipfile: deflated entries, and zip64 records (torch
# writes neither, other tools do; the reader takes both).
with zipfile.ZipFile(os.path.join(pth_dir, "state_dict_zip.pth")) as z:
    entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
with zipfile.ZipFile(os.path.join(pth_dir, "state_dict_deflated.pth"), "w", zipfile.ZIP_DEFLATED) as z:
    for name, data in entries:
        z.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)  # fixed time: same bytes
with zipfile.ZipFile(os.path.join(pth_dir, "state_dict_zip64.pth"), "w", zipfile.ZIP_STORED) as z:
    for name, data in entries:
        with z.open(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), "w", force_zip64=True) as f:
            f.write(data)
# .pth, legacy format (torch < 1.6 and _use_new_zipfile_serialization=False).
torch.save(model.state_dict(), os.path.join(pth_dir, "state_dict_legacy.pth"),
           _use_new_zipfile_serialization=False)
# .pth, a training checkpoint: nested dicts, numbers, strings, a list, optimizer state, and a
# tensor that is a strided view sharing its storage with another.
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model(torch.randn(4, 3)).sum().backward()
opt.step()
base = torch.arange(6, dtype=torch.float32)
torch.save({
    "epoch": 3,
    "model_state_dict": model.state_dict(),
    "optimizer_state_dict": opt.state_dict(),
    "loss": 0.25,
    "tags": ["fuzz", b"seed", (1, None, True)],
    "views": [base, base.view(2, 3).t()],
}, os.path.join(pth_dir, "checkpoint.pth"))
# .pth, legacy format with half-precision and integer storages.
torch.save(collections.OrderedDict(h=torch.tensor([1.0, 2.0], dtype=torch.float16),
                                   i=torch.tensor([[1, 2]], dtype=torch.int32)),
           os.path.join(pth_dir, "small_legacy.pth"), _use_new_zipfile_serialization=False)

# Every file must load back in the reference readers, or it is no valid seed.
for name in sorted(os.listdir(pth_dir)):
    torch.load(os.path.join(pth_dir, name))
try:
    from safetensors import safe_open
except ImportError:
    safe_open = None
for name in sorted(os.listdir(st_dir)):
    if safe_open is not None and name == "state_dict.safetensors":  # the others hold dtypes torch 1.13 lacks
        with safe_open(os.path.join(st_dir, name), "pt") as f:
            for key in f.keys():
                f.get_tensor(key)
for d in (st_dir, pth_dir):
    for name in sorted(os.listdir(d)):
        print(f"{os.path.relpath(os.path.join(d, name), here)}: {os.path.getsize(os.path.join(d, name))} bytes")
