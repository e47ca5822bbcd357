"""Goldens of weight averaging for tvc's swa tests (run with Debian's /usr/bin/python3, torch 1.13).

    swa_goldens.py OUT_DIR

The model of every case: Sequential(Conv2d(3, 4, 3, padding=1), BatchNorm2d(4), ReLU, Flatten,
Linear(100, 6), BatchNorm1d(6)) on (N, 3, 5, 5) inputs. Writes into OUT_DIR:
  states/state_K.pth         K = 0..9: random float64 state_dicts (every parameter and buffer
                             random, num_batches_tracked a random count), torch.save'd; the
                             models whose weights are averaged, in order
  states/state_K.safetensors the same tensors (safetensors package), for mixed-format averaging
  states/ckpt_3.pth          state 3 wrapped as a training checkpoint {"state_dict", "epoch"}
  expected/CASE.pth          the AveragedModel state_dict (module.*, n_averaged) after updating
                             with the ten states in order, float64:
    swa, ema0999, ema09, ema09_buffers, custom   torch 1.13's AveragedModel (avg_fn, use_buffers)
                             then, after each update, the PyTorch 2.x / tvc buffer rules: without
                             use_buffers every buffer is the model's; integer buffers are always
                             copied from the model (torch would average and truncate them)
    formula_swa, formula_ema09, formula_ema09_buffers  the documented formulas in float64 loops
                             (PyTorch 2.x's get_*_fn helpers and multi_avg_fn, absent from 1.13);
                             checked here against the torch cases above
    warmup_timm              EMA decay 0.99 with timm ModelEmaV3's warm-up (min_decay 0.2),
                             use_buffers, by the formula
    every3                   SWA updated on every 3rd call only (states 2, 5, 8)
    bf16                     SWA of the states rounded to bfloat16, in float64 (tvc averages a
                             bfloat16 model in float32)
  update_bn.pth              the model (state 0 weights) after torch's update_bn over the batches
                             of batches.pth (a list of four (6, 3, 5, 5) inputs), given as
                             tensors and as (input, target) pairs (checked equal here)
  goldens.json               warm-up decay tables (timm's code, TensorFlow's form), SWALR
                             learning rates per step (cos and linear, two parameter groups,
                             anneal_epochs 4 and 0, chained in SequentialLR)
  complete                   written last: the folder is usable
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

torch.set_default_dtype(torch.float64)
STATES = 10


def make_model():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(100, 6), torch.nn.BatchNorm1d(6))


def random_state(gen):
    state = {}
    for name, t in make_model().state_dict().items():
        if name.endswith("num_batches_tracked"):
            state[name] = torch.randint(0, 1000, (), generator=gen, dtype=torch.int64)
        elif name.endswith("running_var"):
            state[name] = torch.rand(t.shape, generator=gen) + 0.5
        else:
            state[name] = torch.randn(t.shape, generator=gen)
    return state


def is_buffer(name):
    return name.split(".")[-1] in ("running_mean", "running_var", "num_batches_tracked")


def torch_average(states, avg_fn=None, use_buffers=False):
    """torch 1.13's AveragedModel over the states, with PyTorch 2.x's / tvc's buffer rules."""
    model = make_model()
    averaged = AveragedModel(model, avg_fn=avg_fn, use_buffers=use_buffers)
    for state in states:
        model.load_state_dict(state)
        averaged.update_parameters(model)
        with torch.no_grad():
            for (name, b_avg), b_model in zip(averaged.module.named_buffers(), model.buffers()):
                if not use_buffers or not b_avg.is_floating_point():
                    b_avg.copy_(b_model)
    return averaged.state_dict()


def formula_average(states, update, use_buffers=False):
    """The documented rule in plain float64 loops: first state copied, then update(a, x, n)."""
    avg, n = None, 0
    for state in states:
        if avg is None:
            avg = {k: v.clone() for k, v in state.items()}
        else:
            for k, x in state.items():
                averaged = not is_buffer(k) or (use_buffers and x.is_floating_point())
                avg[k] = update(avg[k], x, n) if averaged else x.clone()
        n += 1
    out = {"n_averaged": torch.tensor(n, dtype=torch.int64)}  # AveragedModel's own buffer comes first
    out.update({"module." + k: v for k, v in avg.items()})
    return out


def ema(decay):
    return lambda a, x, n: decay * a + (1 - decay) * x


def swa(a, x, n):
    return a + (x - a) / (n + 1)


def timm_decay(step, decay, min_decay, gamma=1.0, power=2.0 / 3.0):
    """timm ModelEmaV3.get_decay with update_after_step 0."""
    step = max(0, step - 0 - 1)
    if step <= 0:
        return 0.0
    d = 1 - (1 + step / gamma) ** -power
    return max(min(d, decay), min_decay)


def check_close(a, b, what):
    for k in b:
        err = (a[k].double() - b[k].double()).norm() / max(b[k].double().norm(), 1e-300)
        assert err < 1e-12, f"{what}: {k} differs by {err}"


def two_group_optimizer():
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
    return torch.optim.SGD([{"params": [params[0]], "lr": 0.5}, {"params": [params[1]], "lr": 0.1}], lr=0.3)


def stepped_lrs(opt, sched, steps):
    """Each group's lr after construction and after each of steps steps."""
    lrs = [[g["lr"] for g in opt.param_groups]]
    for _ in range(steps):
        opt.step()
        sched.step()
        lrs.append([g["lr"] for g in opt.param_groups])
    return lrs


def swalr_lrs(strategy, anneal_epochs, steps=10):
    opt = two_group_optimizer()
    return stepped_lrs(opt, SWALR(opt, swa_lr=[0.05, 0.02], anneal_epochs=anneal_epochs, anneal_strategy=strategy), steps)


def sequential_lrs(steps=12):
    opt = two_group_optimizer()
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=5)
    swa_sched = SWALR(opt, swa_lr=0.05, anneal_epochs=3, anneal_strategy="linear")
    return stepped_lrs(opt, torch.optim.lr_scheduler.SequentialLR(opt, [cosine, swa_sched], milestones=[5]), steps)


def main(out):
    gen = torch.Generator().manual_seed(20261201)
    os.makedirs(f"{out}/states", exist_ok=True)
    os.makedirs(f"{out}/expected", exist_ok=True)
    states = []
    for k in range(STATES):
        state = random_state(gen)
        torch.save(state, f"{out}/states/state_{k}.pth")
        save_file(state, f"{out}/states/state_{k}.safetensors")
        states.append(torch.load(f"{out}/states/state_{k}.pth"))
    torch.save({"state_dict": states[3], "epoch": 3}, f"{out}/states/ckpt_3.pth")

    cases = {
        "swa": torch_average(states),
        "ema0999": torch_average(states, ema(0.999)),
        "ema09": torch_average(states, ema(0.9)),
        "ema09_buffers": torch_average(states, ema(0.9), use_buffers=True),
        "custom": torch_average(states, lambda a, x, n: a + (x - a) * 2 / (n + 2)),
        "formula_swa": formula_average(states, swa),
        "formula_ema09": formula_average(states, ema(0.9)),
        "formula_ema09_buffers": formula_average(states, ema(0.9), use_buffers=True),
        "warmup_timm": formula_average(
            states, lambda a, x, n: ema(timm_decay(n + 1, 0.99, 0.2))(a, x, n), use_buffers=True),
        "every3": formula_average(states[2::3], swa),
        "bf16": formula_average([{k: v.to(torch.bfloat16).double() if v.is_floating_point() else v
                                  for k, v in s.items()} for s in states], swa),
    }
    check_close(cases["formula_swa"], cases["swa"], "SWA formula vs AveragedModel")
    check_close(cases["formula_ema09"], cases["ema09"], "EMA formula vs AveragedModel")
    check_close(cases["formula_ema09_buffers"], cases["ema09_buffers"], "EMA buffers formula vs AveragedModel")
    for name, sd in cases.items():
        torch.save(sd, f"{out}/expected/{name}.pth")

    # update_bn over four batches, as tensors and as (input, target) pairs.
    batches = [torch.randn(6, 3, 5, 5, generator=gen) * 2 + 0.5 for _ in range(4)]
    torch.save(batches, f"{out}/batches.pth")
    model = make_model()
    model.load_state_dict(states[0])
    update_bn(batches, model)
    pairs_model = make_model()
    pairs_model.load_state_dict(states[0])
    update_bn([(x, torch.zeros(6, dtype=torch.int64)) for x in batches], pairs_model)
    check_close(pairs_model.state_dict(), model.state_dict(), "update_bn pairs vs tensors")
    torch.save(model.state_dict(), f"{out}/update_bn.pth")

    goldens = {
        "timm_warmup": {"decay": 0.99, "min_decay": 0.2,
                        "table": [timm_decay(t + 1, 0.99, 0.2) for t in range(0, 60)]},
        "tf_warmup": {"decay": 0.999, "table": [min(0.999, (1 + t) / (10 + t)) for t in range(0, 60)]},
        "swalr": {f"{strategy}_{epochs}": swalr_lrs(strategy, epochs)
                  for strategy in ("cos", "linear") for epochs in (4, 0)},
        "sequential": sequential_lrs(),
    }
    with open(f"{out}/goldens.json", "w") as f:
        json.dump(goldens, f)
    open(f"{out}/complete", "w").close()


if __name__ == "__main__":
    main(sys.argv[1])
