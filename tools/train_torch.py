"""The same training as `tvc train` in PyTorch, for comparison (a development tool, not a test).

    tvc train --recipe R --out RUN --dump-batches DUMP       # tvc writes every augmented batch
    /usr/bin/python3 tools/train_torch.py RUN DUMP [--threads N]

RUN is tvc's output folder (its recipe.yaml and metrics.csv); DUMP holds the batches tvc trained
on (epochE_batchB.safetensors: images, labels) and its initial weights (initial.safetensors,
HybridModel names). The hybrid is built as tools/hybrid_goldens.py builds it (the same module
tree and names as tvc's HybridModel), loaded with tvc's initial weights, and trained on tvc's
batches in tvc's order with the recipe's optimizer (SGD/AdamW/Adam, the norm/bias group without
weight decay), step scheduler (cosine with warm-up, step, one-cycle), label smoothing, gradient
clipping and EMA (AveragedModel over weights and buffers, the timm or tensorflow warm-up).
Fashion-MNIST's test set is prepared as tvc's eval transform does (PIL bilinear resize, center
crop, the weights' normalisation). Prints each epoch's seconds beside tvc's (metrics.csv), the
ratio, and both test accuracies. SWA recipes are not replayed (an error).
"""
import argparse
import csv
import gzip
import math
import os
import sys
import time

import numpy as np
import torch
import torchvision
import yaml
from PIL import Image
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hybrid_goldens  # noqa: E402  (sets float64 as the default dtype; reset below)

torch.set_default_dtype(torch.float32)


def ema_decay(decay, warmup, t):
    """swa/averaged_model.h's ema_decay: t models already averaged in."""
    if warmup == "timm":
        return max(0.0, min(decay, 1 - (1 + t) ** (-2.0 / 3.0)))
    if warmup == "tensorflow":
        return min(decay, (1 + t) / (10 + t))
    return decay


def fashion_mnist_test(directory, size, mean, std):
    """t10k through tvc's eval transform: grey to RGB, PIL bilinear resize of the shorter side
    to size, center crop size, /255, normalise. (N, 3, size, size) float32 and labels."""
    with gzip.open(os.path.join(directory, "t10k-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(os.path.join(directory, "t10k-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    transform = torchvision.transforms.Compose([
        torchvision.transforms.Resize(size, interpolation=torchvision.transforms.InterpolationMode.BILINEAR),
        torchvision.transforms.CenterCrop(size),
        torchvision.transforms.ToTensor(),
        torchvision.transforms.Normalize(mean, std),
    ])
    x = torch.stack([transform(Image.fromarray(img).convert("RGB")) for img in images])
    return x, torch.from_numpy(labels)


def accuracy(model, x, y, batch):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    return correct / len(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run")
    parser.add_argument("dump")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    r = yaml.safe_load(open(os.path.join(args.run, "recipe.yaml")))
    if r.get("swa"):
        sys.exit("train_torch.py: SWA recipes are not replayed")
    if r["data"]:
        sys.exit("train_torch.py: only Fashion-MNIST recipes are replayed")

    name, size = r["backbone"], r["image_size"]
    kwargs = {"image_size": size} if hybrid_goldens.family_of(name) == "vit" else {}
    model = getattr(torchvision.models, name)(**kwargs)
    patches = r["patches"] or {}
    hybrid_goldens.apply_patches(name, model, patches, max(size, 64))
    num_classes = r["num_classes"] or 10
    model = hybrid_goldens.split(name, model, num_classes, r["dropout"], max(size, 64))
    model.load_state_dict(load_file(os.path.join(args.dump, "initial.safetensors")), strict=True)
    if r["freeze_backbone"]:
        sys.exit("train_torch.py: freeze_backbone recipes are not replayed")

    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if r["no_decay_norm_bias"] and p.dim() <= 1 else decay).append(p)
    groups = [{"params": decay}] + ([{"params": no_decay, "weight_decay": 0.0}] if no_decay else [])
    if r["optimizer"] == "sgd":
        opt = torch.optim.SGD(groups, lr=r["lr"], momentum=r["momentum"], weight_decay=r["weight_decay"],
                              nesterov=r["nesterov"])
    elif r["optimizer"] == "adamw":
        opt = torch.optim.AdamW(groups, lr=r["lr"], weight_decay=r["weight_decay"])
    else:
        opt = torch.optim.Adam(groups, lr=r["lr"], weight_decay=r["weight_decay"])

    batches = sorted(f for f in os.listdir(args.dump) if f.startswith("epoch0_batch"))
    steps = len(batches)
    total = max(r["epochs"] * steps, 1)
    sched = None
    if r["scheduler"] == "cosine":
        warmup = min(round(r["warmup_epochs"] * steps), total - 1)
        cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, total - warmup, r["min_lr"])
        sched = cosine if warmup == 0 else torch.optim.lr_scheduler.SequentialLR(
            opt, [torch.optim.lr_scheduler.LinearLR(opt, 0.01, 1.0, warmup), cosine], [warmup])
    elif r["scheduler"] == "step":
        sched = torch.optim.lr_scheduler.StepLR(opt, r["step_size"] * steps, r["gamma"])
    elif r["scheduler"] == "onecycle":
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=r["lr"], total_steps=total)

    ema = None
    if r.get("ema"):
        e = r["ema"]
        ema = torch.optim.swa_utils.AveragedModel(
            model, avg_fn=lambda a, x, n: a + (x - a) * (1 - ema_decay(e["decay"], e["warmup"], int(n))),
            use_buffers=True)

    tvc_seconds = [float(row["epoch_seconds"]) for row in csv.DictReader(open(os.path.join(args.run, "metrics.csv")))]
    step = 0
    for epoch in range(r["epochs"]):
        model.train()
        start = time.perf_counter()
        loss_sum = 0.0
        for b in range(steps):
            data = load_file(os.path.join(args.dump, f"epoch{epoch}_batch{b}.safetensors"))
            loss = torch.nn.functional.cross_entropy(model(data["images"]), data["labels"],
                                                     label_smoothing=r["label_smoothing"])
            opt.zero_grad()
            loss.backward()
            if r["clip_grad_norm"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), r["clip_grad_norm"])
            opt.step()
            if sched:
                sched.step()
            step += 1
            if ema is not None and step % r["ema"]["every"] == 0:
                ema.update_parameters(model)
            loss_sum += loss.item()
        seconds = time.perf_counter() - start
        ratio = tvc_seconds[epoch] / seconds if epoch < len(tvc_seconds) else math.nan
        print(f"epoch {epoch + 1}/{r['epochs']}: PyTorch {seconds:.1f} s (mean loss {loss_sum / steps:.4f}), "
              f"tvc {tvc_seconds[epoch]:.1f} s: tvc / PyTorch {ratio:.2f}", flush=True)

    # tvc normalises with the weights' statistics: ImageNet's for every torchvision classifier.
    x, y = fashion_mnist_test(r["fashion_mnist_dir"], size, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    line = f"PyTorch test accuracy: {100 * accuracy(model, x, y, r['batch_size']):.2f}%"
    if ema is not None:
        line += f", ema {100 * accuracy(ema, x, y, r['batch_size']):.2f}%"
    print(line)


if __name__ == "__main__":
    main()
