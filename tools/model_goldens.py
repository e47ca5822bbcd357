"""Goldens of a torchvision backbone for tvc's conformance tests (run with Debian's /usr/bin/python3).

    model_goldens.py MODEL NUM_CLASSES EVAL_SHAPES GRAD_SIZE [NODES] [--image-size S]
                     [--weights-image-size W] OUT_DIR
    e.g. model_goldens.py resnet50 1000 "2x224,1x161" 64 /tmp/g
         model_goldens.py vit_b_32 1000 2x160 0 --image-size 160 --weights-image-size 224 /tmp/g

--image-size builds the model with torchvision's image_size argument (ViT). With
--weights-image-size, weights.pth holds the weights of the model built for W, and the model
checked (built for S) loads them adapted by torchvision's interpolate_embeddings.

Writes into OUT_DIR:
  weights.pth           the model's state_dict (torch.save), with random weights in which every
                        BatchNorm buffer and affine parameter, every LayerNorm weight, every
                        bias, layer scale, class token, position embedding, relative-position
                        table and zero-initialised head is randomised too (zero biases, unit
                        statistics and 1e-6 layer scales hide bugs)
  goldens.safetensors   eval.K.input / eval.K.output   eval mode, for each N x S of EVAL_SHAPES
                        stage.NODE                     eval mode, for eval.0.input, the output of
                                                       each node of NODES ("layer1,layer2", as
                                                       create_feature_extractor names them)
                        train.input / train.output     train mode (batch statistics, dropout and
                                                       stochastic depth off; these three not with
                                                       NODES)
                        train.running.NAME             every BatchNorm buffer after that step
                        train64.running.NAME           the same step in float64 from the same
                                                       (float32) weights, buffers and input
                        grad.input / grad.cotangent    float64, eval mode, GRAD_SIZE pixels
                                                       (none of the grad tensors when it is 0)
                        grad64.NAME / grad32.NAME      d(sum(output * cotangent)) / d(parameter)
                        grad32cl.NAME                  in float64, and in float32 from the same
                                                       (rounded) weights and input, contiguous
                                                       and channels_last, with the float64
                                                       run's ReLU and max-pool decisions
  complete              written last: the folder is usable
"""
import dis
import inspect
import sys

import torch
import torchvision
from safetensors.torch import save_file
from torchvision.models.feature_extraction import create_feature_extractor
from torchvision.models.vision_transformer import interpolate_embeddings


def fix_fx_unpacking():
    """torch 1.13's fx Proxy.__iter__ looks up the caller's instruction at index f_lasti // 2,
    which Python 3.11's inline caches break: tracing `n, c, h, w = x.shape` (ViT) then fails with
    "Proxy object cannot be iterated". This is torch 2.0's fix: the instruction at offset f_lasti."""
    from torch.fx.proxy import Proxy

    def proxy_iter(self):
        frame = inspect.currentframe().f_back
        inst = next(i for i in dis.get_instructions(frame.f_code) if i.offset == frame.f_lasti)
        if inst.opname == "UNPACK_SEQUENCE":
            return (self[i] for i in range(inst.argval))
        return self.tracer.iter(self)

    if sys.version_info >= (3, 11) and torch.__version__ < "2":
        Proxy.__iter__ = proxy_iter


def randomise(model, gen):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_(0, 0.2, generator=gen)
                m.running_var.uniform_(0.5, 2.0, generator=gen)
                m.weight.uniform_(0.5, 1.5, generator=gen)
                m.bias.normal_(0, 0.2, generator=gen)
                m.num_batches_tracked.fill_(int(torch.randint(1, 1000, (1,), generator=gen)))
                continue
            if isinstance(m, (torch.nn.LayerNorm, torch.nn.GroupNorm)) and m.weight is not None:
                m.weight.uniform_(0.5, 1.5, generator=gen)
            if getattr(m, "bias", None) is not None and isinstance(m.bias, torch.nn.Parameter):
                m.bias.normal_(0, 0.1, generator=gen)
            if isinstance(m, torch.nn.Linear) and not m.weight.any():  # ViT's zero-initialised head
                m.weight.normal_(0, m.in_features ** -0.5, generator=gen)
        # What torchvision starts at constants or near zero: ConvNeXt's layer scale (1e-6), ViT's
        # class token (zeros) and position embedding, Swin's relative-position bias table.
        for name, p in model.named_parameters():
            leaf = name.split(".")[-1]
            if leaf == "layer_scale":
                p.uniform_(0.5, 1.5, generator=gen)
            elif leaf in ("class_token", "pos_embedding", "relative_position_bias_table"):
                p.normal_(0, 1.0, generator=gen)


def main():
    *args, out = sys.argv[1:]
    options = {}  # --image-size, --weights-image-size
    while len(args) > 2 and args[-2].startswith("--"):
        options[args[-2]] = int(args[-1])
        del args[-2:]
    name, num_classes, eval_shapes, grad_size = args[:4]
    nodes = args[4].split(",") if len(args) > 4 else []
    num_classes, grad_size = int(num_classes), int(grad_size)
    image_size = options.get("--image-size")

    def build(size=image_size):
        """A new torchvision model (for images of size, when given)."""
        kwargs = {} if size is None else {"image_size": size}
        return torchvision.models.__dict__[name](num_classes=num_classes, **kwargs)

    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(1234)
    torch.manual_seed(1234)
    model = build(options.get("--weights-image-size", image_size))
    randomise(model, gen)
    torch.save(model.state_dict(), f"{out}/weights.pth")
    if "--weights-image-size" in options:
        state = interpolate_embeddings(image_size, model.patch_size, model.state_dict())
        model = build()
        model.load_state_dict(state)
    tensors = {}

    model.eval()
    with torch.no_grad():
        for k, shape in enumerate(eval_shapes.split(",")):
            n, s = map(int, shape.split("x"))
            x = torch.randn(n, 3, s, s, generator=gen)
            tensors[f"eval.{k}.input"] = x
            tensors[f"eval.{k}.output"] = model(x)
        if nodes:
            fix_fx_unpacking()
            extractor = create_feature_extractor(model, return_nodes=nodes)
            for node, value in extractor(tensors["eval.0.input"]).items():
                tensors[f"stage.{node}"] = value

    # Train mode: batch statistics, dropout off (p = 0), running buffers updated once; in float32
    # and in float64 (PyTorch's own float32 error on the running statistics). Not for the stage
    # checks (NODES), which are eval mode only.
    n, s = map(int, eval_shapes.split(",")[0].split("x"))
    x = torch.randn(n, 3, s, s, generator=gen)
    train_modes = () if nodes else ((torch.float32, "train"), (torch.float64, "train64"))
    if train_modes:
        tensors["train.input"] = x
    for dtype, prefix in train_modes:
        train = build()
        train.load_state_dict(model.state_dict())
        train.train().to(dtype)
        for m in train.modules():  # dropout and stochastic depth off (checked separately)
            if isinstance(m, (torch.nn.Dropout, torchvision.ops.StochasticDepth)):
                m.p = 0.0
        with torch.no_grad():
            out_ = train(x.to(dtype))
        if prefix == "train":
            tensors["train.output"] = out_
        for key, value in train.state_dict().items():
            if "running_" in key:
                tensors[f"{prefix}.running.{key}"] = value

    # Gradients in eval mode, float64 and float32 from the same float32-representable values.
    if grad_size > 0:
        gradients(build, model, grad_size, gen, tensors)

    save_file({k: v.contiguous() for k, v in tensors.items()}, f"{out}/goldens.safetensors")
    open(f"{out}/complete", "w").write("ok\n")
    print("ok")


def decision_margin(model, x):
    """The smallest distance of any piecewise decision of model(x) from its tie, relative to the
    RMS of the tensor decided on: ReLU/ReLU6/Hardtanh inputs from their kinks (0, 6), Hardswish
    and Hardsigmoid inputs from +-3, max-pool windows' top two values (exact ties, e.g. zeros
    after a ReLU, decide alike in any precision and are left out). A float32 run decides a unit
    otherwise than float64 only when its rounding error exceeds this margin."""
    margins = []

    def kinks(points):
        def hook(module, inputs, output):
            t = inputs[0].detach()
            rms = t.pow(2).mean().sqrt().clamp_min(1e-30)
            d = torch.stack([(t - k).abs() for k in points]).min(0).values
            d = d[d > 0]
            if d.numel():
                margins.append(float(d.min() / rms))
        return hook

    def pool(module, inputs, output):
        t = inputs[0].detach()
        k, s, p, dil = (torch.nn.modules.utils._pair(v) for v in
                        (module.kernel_size, module.stride or module.kernel_size, module.padding, module.dilation))
        padded = torch.nn.functional.pad(t, (p[1], p[1], p[0], p[0]), value=-float("inf"))
        cols = torch.nn.functional.unfold(padded, k, dilation=dil, stride=s)  # (N, C*kh*kw, L)
        cols = cols.reshape(t.shape[0], t.shape[1], k[0] * k[1], -1)
        top = cols.topk(2, dim=2).values
        gap = top[:, :, 0] - top[:, :, 1]
        gap = gap[(gap > 0) & torch.isfinite(gap)]
        if gap.numel():
            margins.append(float(gap.min() / t.pow(2).mean().sqrt().clamp_min(1e-30)))

    hooks = []
    for m in model.modules():
        if isinstance(m, torch.nn.ReLU):
            hooks.append(m.register_forward_hook(kinks([0.0])))
        elif isinstance(m, (torch.nn.ReLU6, torch.nn.Hardtanh)):
            hooks.append(m.register_forward_hook(kinks([0.0, 6.0])))
        elif isinstance(m, (torch.nn.Hardswish, torch.nn.Hardsigmoid)):
            hooks.append(m.register_forward_hook(kinks([-3.0, 3.0])))
        elif isinstance(m, torch.nn.MaxPool2d):
            hooks.append(m.register_forward_hook(pool))
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return min(margins, default=float("inf"))


class PinnedDecisions:
    """Within `with pins:`, every ReLU and max pooling (each call of torch.nn.functional.relu and
    max_pool2d, which nn.ReLU, nn.MaxPool2d and torchvision's functional calls go through)
    records its decisions while pins.record is true (which inputs pass; which input each output
    takes) and replays them, call by call, once it is false. The float32 runs replay the float64
    run's decisions: a near-tie that float32 rounding decides the other way moves a gradient by
    far more than rounding, which would measure the input's distance from a tie rather than the
    kernels' accuracy. tests/model_conformance.cpp pins tvc's float32 run the same way."""

    def __init__(self):
        self.record, self.relu, self.pool = True, [], []

    def __enter__(self):
        functional = torch.nn.functional
        self.saved = relu, max_pool2d = functional.relu, functional.max_pool2d
        calls = {"relu": 0, "pool": 0}

        def next_decision(kind, taken):
            calls[kind] += 1
            return taken[calls[kind] - 1]

        def pinned_relu(x, inplace=False):
            if self.record:
                self.relu.append(x.detach() > 0)
                return relu(x)
            return x * next_decision("relu", self.relu).to(x.dtype)

        def pinned_max_pool2d(x, *args, return_indices=False, **kwargs):
            assert not return_indices, "max_pool2d(return_indices=True) is not pinned"
            out, taken = max_pool2d(x, *args, return_indices=True, **kwargs)
            if self.record:
                self.pool.append(taken)
                return out
            taken = next_decision("pool", self.pool)
            picked = x.flatten(2).gather(2, taken.flatten(2)).view(out.shape)
            return picked.contiguous(memory_format=torch.channels_last) if x.is_contiguous(
                memory_format=torch.channels_last) else picked

        functional.relu, functional.max_pool2d = pinned_relu, pinned_max_pool2d
        return self

    def __exit__(self, *exc):
        torch.nn.functional.relu, torch.nn.functional.max_pool2d = self.saved


def gradients(build, model, grad_size, gen, tensors):
    """Adds the grad.* / grad64.* / grad32.* / grad32cl.* tensors (see above) to tensors; build()
    makes a new model.

    The float32 gradients are compared with float64 ones, so a piecewise decision that float32
    rounding can flip (a near-tie) would move them by far more than rounding. ReLU and max-pool
    decisions are pinned to the float64 run's (PinnedDecisions); for the others (ReLU6, Hardtanh,
    Hardswish, Hardsigmoid) and to keep pinning rare, of eight random inputs, the one whose
    closest decision is farthest from a tie is used (measured in float32, whose error, ~1e-7 of
    the RMS, is far below the margins told apart, ~1e-6; models with no such decisions take the
    first)."""
    candidates = [torch.randn(2, 3, grad_size, grad_size, generator=gen) for _ in range(8)]
    deciding = (torch.nn.ReLU, torch.nn.ReLU6, torch.nn.Hardtanh, torch.nn.Hardswish, torch.nn.Hardsigmoid,
                torch.nn.MaxPool2d)
    x = candidates[0]
    if any(isinstance(m, deciding) for m in model.modules()):
        probe = build()
        probe.load_state_dict(model.state_dict())
        probe.eval().float()
        x = max(candidates, key=lambda c: decision_margin(probe, c))
    # PyTorch's float32 gradients are given in both memory formats: which one rounds closer to
    # float64 varies (a max-pooling near-tie decided the other way moves a gradient), and both
    # are PyTorch's own float32 error.
    layouts = ((torch.float64, "grad64", torch.contiguous_format),
               (torch.float32, "grad32", torch.contiguous_format),
               (torch.float32, "grad32cl", torch.channels_last))
    pins = PinnedDecisions()
    for dtype, prefix, layout in layouts:
        m = build()
        m.load_state_dict(model.state_dict())
        m.eval().to(dtype=dtype, memory_format=layout)
        xi = x.to(dtype).contiguous(memory_format=layout)
        pins.record = dtype == torch.float64
        with pins:
            out_ = m(xi)
        if prefix == "grad64":
            cot = torch.randn(out_.shape, generator=gen, dtype=torch.float64)
            tensors["grad.input"] = x.to(torch.float64)
            tensors["grad.cotangent"] = cot
            tensors["grad.output"] = out_.detach()
        (out_ * tensors["grad.cotangent"].to(dtype)).sum().backward()
        for pname, p in m.named_parameters():
            tensors[f"{prefix}.{pname}"] = p.grad.detach().clone()


if __name__ == "__main__":
    main()
