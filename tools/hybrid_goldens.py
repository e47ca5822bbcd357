"""Goldens of hybrid models for tvc's hybrid tests (run with Debian's /usr/bin/python3, torch 1.13).

    hybrid_goldens.py CASE DEPS OUT_DIR

CASE is JSON: {"backbone": "resnet18", "patches": {"layer3": {"wrap": "se"}}, "num_classes": 10,
"dropout": 0.0, "size": 64, "batch": 2, "nodes": ["stages.0", ...]} (size: the input size; ViT is
built for it; nodes: tvc's stage output modules, checked by the test). DEPS is a
fingerprint of the Python files imported here (it keys the golden cache; unused).

The hybrid is built as the Python library (torchvision-customizer 2.1) builds it where that is
correct, and as docs/hybrid.md documents where tvc fixes it: the torchvision backbone with random
weights, the patches applied on its module tree (blocks from hybrid_blocks.py, channels from the
target's measured output), then split into stem, stages and head:
  resnet family   stem Sequential(conv1, bn1, relu, maxpool); stages layer1..4;
                  head [avgpool, Flatten, Dropout if p > 0, Linear]         (the library's names)
  efficientnet, mobilenet_v3                                                  (the library's names)
                  stem Identity; stages [features]; head [avgpool, Flatten, Dropout?, Linear]
  mobilenet_v2    head [AdaptiveAvgPool2d(1), Flatten, Dropout?, Linear]
  densenet        head [ReLU, AdaptiveAvgPool2d(1), Flatten, Dropout?, Linear]
  vgg             head [avgpool, Flatten, classifier[0:6], Dropout?, Linear]
  convnext        head [avgpool, classifier.0 (LayerNorm2d), Flatten, Dropout?, Linear]
  swin            head [norm, permute, avgpool, flatten, Dropout?, Linear]
  vit             stem ViTStem(conv_proj, class_token); stages [encoder]; head [ClassToken, Dropout?, Linear]
Every parameter and buffer is then randomised (model_goldens.randomise, and every parameter of the
blocks and the head), the model is float64 and in eval mode.

Writes into OUT_DIR:
  weights.pth          the hybrid's state_dict (float64)
  goldens.safetensors  input (N, 3, S, S); output (eval); stage.K: get_stage_outputs' K-th map
                       (the stem's output, then each resolution stage's, NCHW); cotangent and
                       grad.NAME: d(sum(output * cotangent)) / d(parameter) for every parameter
  complete             written last
"""
import json
import os
import sys

import torch
import torchvision
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hybrid_blocks  # noqa: E402
from model_goldens import randomise  # noqa: E402

torch.set_default_dtype(torch.float64)


def family_of(name):
    for prefix in ("resnet", "wide_resnet", "resnext"):
        if name.startswith(prefix):
            return "resnet"
    for family in ("efficientnet", "vgg", "densenet", "mobilenet_v2", "mobilenet_v3", "convnext", "vit", "swin"):
        if name.startswith(family):
            return family
    raise ValueError(name)


def module_at(model, path):
    m = model
    for part in path.split("."):
        m = m[int(part)] if part.isdigit() and isinstance(m, (torch.nn.Sequential, torch.nn.ModuleList)) else getattr(m, part)
    return m


def set_module(model, path, new):
    parent, _, leaf = path.rpartition(".")
    p = module_at(model, parent) if parent else model
    setattr(p, leaf, new)


def layout_of(family, path, out):
    if out.dim() != 4:
        return "tokens"
    if family == "swin" and path != "features.0.0" and (path.startswith("features") or path == "norm"):
        return "NHWC"
    return "NCHW"


def apply_patches(name, model, patches, size):
    family = family_of(name)
    shapes = {}

    def record(target):
        def hook(module, inputs, output):
            shapes.setdefault(target, (inputs[0], output))
        return hook

    hooks = [module_at(model, t).register_forward_hook(record(t)) for t in patches]
    model.eval()
    with torch.no_grad():
        model(torch.randn(1, 3, size, size))
    for h in hooks:
        h.remove()
    ops = {"wrap": "wrap", "inject": "wrap", "inject_after": "wrap", "replace": "replace"}
    built = []
    for target, spec in patches.items():
        (op, block), = spec.items()
        block_type, params = (block, {}) if isinstance(block, str) else (block.get("type", block.get("block")), block.get("params", {}))
        inp, out = shapes[target]
        layout = layout_of(family, target, out)
        out_c = out.shape[1] if layout == "NCHW" else out.shape[-1]
        in_layout = layout_of(family, target, inp) if ops[op] == "replace" else layout
        in_c = (inp.shape[1] if in_layout == "NCHW" else inp.shape[-1]) if ops[op] == "replace" else out_c
        b = hybrid_blocks.make_block(block_type, params, in_c, out_c, layout)
        if layout == "NHWC" and hybrid_blocks.canonical_name(block_type) not in hybrid_blocks.LAYOUT_AWARE:
            # a map block on Swin's NHWC stages computes in NCHW (no module added: same keys)
            b.register_forward_pre_hook(lambda m, args: (args[0].permute(0, 3, 1, 2),))
            b.register_forward_hook(lambda m, args, out: out.permute(0, 2, 3, 1))
        built.append((target, ops[op], b))
    # deepest first, as tvc applies them
    for target, op, b in sorted(built, key=lambda t: -t[0].count(".")):
        original = module_at(model, target)
        set_module(model, target, b if op == "replace" else torch.nn.Sequential(original, b))


class ViTStem(torch.nn.Module):
    def __init__(self, vit):
        super().__init__()
        self.conv_proj = vit.conv_proj
        self.class_token = vit.class_token

    def forward(self, x):
        x = self.conv_proj(x)
        n, c = x.shape[:2]
        x = x.reshape(n, c, -1).permute(0, 2, 1)
        return torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)


class ClassToken(torch.nn.Module):
    def forward(self, x):
        return x[:, 0]


class Hybrid(torch.nn.Module):
    def __init__(self, stem, stages, head):
        super().__init__()
        self.stem, self.stages, self.head = stem, torch.nn.ModuleList(stages), head

    def features(self, x):
        x = self.stem(x)
        for s in self.stages:
            x = s(x)
        return x

    def forward(self, x):
        return self.head(self.features(x))


def split(name, model, num_classes, dropout, size):
    """The hybrid of the patched model (the head's width measured)."""
    family = family_of(name)
    flatten = torch.nn.Flatten(1)
    if family == "resnet":
        stem = torch.nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool)
        stages = [model.layer1, model.layer2, model.layer3, model.layer4]
        parts = [model.avgpool, flatten]
    elif family == "vit":
        stem, stages, parts = ViTStem(model), [model.encoder], [ClassToken()]
    else:
        stem, stages = torch.nn.Identity(), [model.features]
        parts = {
            "efficientnet": lambda: [model.avgpool, flatten],
            "mobilenet_v3": lambda: [model.avgpool, flatten],
            "mobilenet_v2": lambda: [torch.nn.AdaptiveAvgPool2d(1), flatten],
            "densenet": lambda: [torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), flatten],
            "vgg": lambda: [model.avgpool, flatten] + list(model.classifier)[:6],
            "convnext": lambda: [model.avgpool, model.classifier[0], flatten],
            "swin": lambda: [model.norm, model.permute, model.avgpool, model.flatten],
        }[family]()
    pre = Hybrid(stem, stages, torch.nn.Sequential(*parts)).eval()
    with torch.no_grad():
        width = pre(torch.randn(1, 3, size, size)).shape[1]
    head = parts + ([torch.nn.Dropout(dropout)] if dropout > 0 else []) + [torch.nn.Linear(width, num_classes)]
    return Hybrid(stem, stages, torch.nn.Sequential(*head))


def to_map(t, layout):
    if layout == "NHWC":
        return t.permute(0, 3, 1, 2)
    if layout == "tokens":
        n, length, c = t.shape
        g = int(round((length - 1) ** 0.5))
        return t[:, 1:].permute(0, 2, 1).reshape(n, c, g, g)
    return t


def main():
    case, _, out = sys.argv[1:]
    case = json.loads(case)
    name, size, batch = case["backbone"], case["size"], case.get("batch", 2)
    family = family_of(name)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    kwargs = {"image_size": size} if family == "vit" else {}
    model = getattr(torchvision.models, name)(**kwargs)
    randomise(model, gen)
    apply_patches(name, model, case.get("patches", {}), size)
    hybrid = split(name, model, case["num_classes"], case.get("dropout", 0.0), size)
    nodes = case["nodes"]
    randomise(hybrid, gen)
    with torch.no_grad():  # what the blocks start at constants: LayerScale's gamma, GeM's p
        for pname, p in hybrid.named_parameters():
            leaf = pname.split(".")[-1]
            if leaf == "gamma":
                p.uniform_(0.5, 1.5, generator=gen)
            elif leaf == "p":
                p.uniform_(2.0, 4.0, generator=gen)
    hybrid = hybrid.double().eval()
    torch.save(hybrid.state_dict(), os.path.join(out, "weights.pth"))

    x = torch.randn(batch, 3, size, size, generator=gen)
    outputs = {}

    def capture(k):
        def hook(module, inputs, output):
            outputs.setdefault(k, output.clone())
        return hook

    hooks = [hybrid.stem.register_forward_hook(capture(0))]
    for k, node in enumerate(nodes):
        hooks.append(module_at(hybrid, node).register_forward_hook(capture(k + 1)))
    y = hybrid(x)
    for h in hooks:
        h.remove()
    stem_layout = "tokens" if family == "vit" else "NCHW"
    stage_layout = {"vit": "tokens", "swin": "NHWC"}.get(family, "NCHW")
    tensors = {"input": x, "output": y.detach()}
    for k in range(len(nodes) + 1):
        tensors[f"stage.{k}"] = to_map(outputs[k], stem_layout if k == 0 else stage_layout)
    cotangent = torch.randn(y.shape, generator=gen)
    (y * cotangent).sum().backward()
    tensors["cotangent"] = cotangent
    for pname, p in hybrid.named_parameters():
        tensors["grad." + pname] = p.grad
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, os.path.join(out, "goldens.safetensors"))
    open(os.path.join(out, "complete"), "w").close()


if __name__ == "__main__":
    main()
