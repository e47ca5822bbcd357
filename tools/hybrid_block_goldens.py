"""Goldens of the hybrid layer's blocks for tvc's hybrid tests (run with Debian's /usr/bin/python3,
torch 1.13; the blocks are tools/hybrid_blocks.py).

    hybrid_block_goldens.py [--key KEY] OUT_DIR

KEY is ignored: the tests pass a hash of tools/hybrid_blocks.py, so that the golden cache (keyed
by this script's text and its arguments) is regenerated when the references change.

For every case of CASES (a block name or alias, its params, the inferred channels, the layout and
the input shape) the block is built in float64 with torch.manual_seed, EVERY parameter and buffer
is randomised (weights ~ N(0, 1/fan_in), biases, BatchNorm affine parameters and running
statistics, LayerScale's gamma, GeM's p in [2, 4]), and OUT_DIR/ID/ gets:
  state.pth             the block's state_dict (torch.save), float64
  tensors.safetensors   input             random, never zero (positive for GeM)
                        output            eval mode
                        grad.cotangent    the upstream gradient g (random)
                        grad.input        d sum(output * g) / d input, eval mode, float64
                        grad.NAME         the same for every parameter NAME
                        train.output      train mode (batch statistics), for blocks holding a
                                          BatchNorm and no randomness (dropout / drop_path
                                          probabilities 0); from the same state and input
                        train.state.NAME  every buffer after that step
OUT_DIR/cases.json lists the cases: id, block, params, in_channels, out_channels, layout
("NCHW", "NHWC", "tokens"), train. `complete` is written last: the folder is usable.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hybrid_blocks  # noqa: E402

torch.set_default_dtype(torch.float64)


def case(id_, block, params, cin, cout, shape, layout="NCHW"):
    return {"id": id_, "block": block, "params": params, "in_channels": cin, "out_channels": cout,
            "layout": layout, "shape": shape}


# Every block at least once; the parameter variants that change the structure; NHWC maps for
# map blocks; tokens for the blocks that take them. Names and aliases mixed.
CASES = [
    case("conv", "conv", {}, 4, 8, [2, 4, 6, 6]),
    case("conv_maxpool_leaky", "conv2d", {"activation": "leaky_relu", "pooling_type": "max", "bias": False}, 4, 8,
         [2, 4, 6, 6]),
    case("conv_avgpool_plain", "convblock",
         {"activation": "none", "use_batchnorm": False, "pooling_type": "avg", "kernel_size": 5, "padding": 2,
          "stride": 2}, 4, 6, [2, 4, 9, 8]),
    case("conv_adaptive_gelu_nhwc", "conv", {"activation": "gelu", "pooling_type": "adaptive_avg",
                                             "pooling_kernel_size": 3, "dilation": 2, "padding": 2, "groups": 2},
         4, 8, [2, 7, 7, 4], "NHWC"),
    case("residual", "residual", {}, 8, 8, [2, 8, 5, 5]),
    case("residual_bottleneck_se_prelu", "res", {"stride": 2, "use_se": True, "se_reduction": 4, "bottleneck": True,
                                                 "activation": "prelu"}, 8, 16, [2, 8, 6, 6]),
    case("residual_group_downsample", "resblock", {"norm_type": "group", "downsample": True}, 32, 32, [2, 32, 4, 4]),
    case("residual_instance_elu_nhwc", "residual", {"norm_type": "instance", "activation": "elu"}, 8, 8,
         [2, 5, 5, 8], "NHWC"),
    case("se", "se", {"reduction": 4}, 16, 16, [2, 16, 5, 5]),
    case("se_alias_selu_nhwc", "SEBlock", {"reduction": 4, "activation": "selu"}, 16, 16, [2, 4, 5, 16], "NHWC"),
    case("depthwise", "dw", {"kernel_size": 5, "padding": 2, "stride": 2}, 8, 16, [2, 8, 7, 7]),
    case("depthwise_residual_layernorm", "depthwise_separable",
         {"add_residual": True, "norm_type": "layer", "activation": "tanh"}, 6, 6, [2, 6, 5, 6]),
    case("inception", "inception", {"out_1x1": 4, "out_3x3": 6, "out_5x5": 2}, 8, 8, [2, 8, 5, 5]),
    case("inception_pool_silu_nhwc", "inception_module",
         {"out_1x1": 4, "out_3x3": 4, "out_5x5": 2, "out_pool": 3, "activation": "silu", "norm_type": "none"},
         8, 8, [2, 5, 4, 8], "NHWC"),
    case("dense", "dense", {"num_layers": 3, "growth_rate": 4, "bottleneck_ratio": 2}, 8, 8, [2, 8, 5, 5]),
    case("dense_plain", "densenet", {"num_layers": 2, "growth_rate": 3, "use_batchnorm": False, "kernel_size": 5},
         4, 4, [2, 4, 6, 6]),
    case("bottleneck", "bottleneck", {}, 8, 16, [2, 8, 5, 5]),
    case("bottleneck_sigmoid_nhwc", "bottleneck", {"activation": "sigmoid", "use_downsample": True}, 8, 8,
         [2, 5, 5, 8], "NHWC"),
    case("wide_bottleneck", "wide_bottleneck", {"width_multiplier": 1.5, "stride": 2}, 8, 16, [2, 8, 6, 6]),
    case("grouped_bottleneck", "grouped_bottleneck", {"num_groups": 4}, 16, 16, [2, 16, 5, 5]),
    case("grouped_bottleneck_small", "grouped_bottleneck", {"num_groups": 3}, 8, 8, [2, 8, 4, 4]),
    case("coord_conv", "coord_conv", {"padding": 1}, 4, 8, [2, 4, 5, 6]),
    case("coord_conv_r", "CoordConv", {"with_r": True, "kernel_size": 1}, 4, 6, [2, 4, 5, 7]),
    case("coord_conv_r_nhwc", "coord_conv", {"with_r": True, "stride": 2, "bias": False}, 4, 6, [2, 7, 6, 4],
         "NHWC"),
    case("conv_bn_act", "conv_bn_act", {}, 8, 8, [2, 8, 5, 5]),
    case("conv_bn_act_swish", "ConvBNAct", {"activation": "swish", "stride": 2}, 8, 16, [2, 8, 6, 6]),
    case("conv_bn_act_gelu_nobn", "conv_bn_act", {"activation": "gelu", "use_bn": False, "kernel_size": 5}, 8, 8,
         [2, 8, 5, 5]),
    case("conv_bn_act_mish", "conv_bn_act", {"activation": "mish", "padding": 0}, 8, 8, [2, 8, 5, 5]),
    case("conv_bn_act_none_groups", "conv_bn_act", {"activation": "none", "groups": 2, "kernel_size": 1}, 8, 8,
         [2, 8, 4, 4]),
    case("mbconv", "mbconv", {}, 8, 8, [2, 8, 5, 5]),
    case("mbconv_noexpand_stride", "MBConv", {"expansion": 1, "stride": 2, "kernel_size": 5}, 8, 16, [2, 8, 6, 6]),
    case("mbconv_nose_droppath", "inverted_residual", {"use_se": False, "drop_path": 0.2}, 8, 8, [2, 8, 4, 4]),
    case("mbconv_nhwc", "mbconv", {"expansion": 2}, 8, 8, [2, 4, 4, 8], "NHWC"),
    case("fused_mbconv", "fused_mbconv", {}, 8, 8, [2, 8, 5, 5]),
    case("fused_mbconv_se_stride", "FusedMBConv", {"use_se": True, "stride": 2, "expansion": 2}, 8, 12,
         [2, 8, 6, 6]),
    case("channel_attention", "channel_attention", {"reduction": 4}, 16, 16, [2, 16, 4, 4]),
    case("channel_attention_gelu_nhwc", "ca", {"activation": "gelu", "reduction": 2}, 8, 8, [2, 4, 5, 8], "NHWC"),
    case("spatial_attention", "spatial_attention", {}, 8, 8, [2, 8, 6, 6]),
    case("spatial_attention_k3", "sa", {"kernel_size": 3}, 8, 8, [2, 8, 5, 5]),
    case("cbam", "cbam", {"channel_reduction": 4}, 16, 16, [2, 16, 5, 5]),
    case("cbam_nhwc", "channel_spatial", {"spatial_kernel": 5}, 16, 16, [2, 5, 5, 16], "NHWC"),
    case("cbam_block", "cbam_block", {"reduction": 4}, 16, 16, [2, 16, 5, 5]),
    case("cbam_block_nhwc", "CBAMBlock", {"spatial_kernel": 3, "reduction": 8}, 16, 16, [2, 4, 6, 16], "NHWC"),
    case("cbam_block_tiny", "cbam_attention", {}, 8, 8, [2, 8, 5, 5]),
    case("eca_64", "eca", {}, 64, 64, [2, 64, 3, 3]),
    case("eca_256", "ECABlock", {}, 256, 256, [2, 256, 2, 2]),
    case("eca_2048", "eca_block", {}, 2048, 2048, [2, 2048, 2, 2]),
    case("eca_given_k_nhwc", "efficient_channel", {"kernel_size": 5, "gamma": 1, "beta": 0.5}, 16, 16,
         [2, 3, 4, 16], "NHWC"),
    case("se_enhanced", "se_enhanced", {"reduction": 4}, 16, 16, [2, 16, 4, 4]),
    case("se_enhanced_bn_swish_hard", "squeeze_excite",
         {"use_bn": True, "activation": "swish", "gate_activation": "hardsigmoid", "reduction": 4}, 16, 16,
         [3, 16, 4, 4]),
    case("se_enhanced_gelu_nhwc", "se_v2", {"activation": "gelu", "reduction": 2}, 8, 8, [2, 4, 4, 8], "NHWC"),
    case("mha_tokens", "multihead_attention", {"num_heads": 4}, 16, 16, [2, 5, 16], "tokens"),
    case("mha_nchw", "mha", {"num_heads": 2}, 8, 8, [2, 8, 3, 4]),
    case("mha_nhwc_nobias", "mha", {"num_heads": 2, "bias": False}, 8, 8, [2, 3, 4, 8], "NHWC"),
    case("attention_block", "attention_block", {"channel_reduction": 4}, 16, 16, [2, 16, 5, 5]),
    case("attention_block_cross", "attention_block", {"use_cross": True, "use_channel": False, "spatial_kernel": 3},
         8, 8, [2, 8, 5, 5]),
    case("attention_block_all_nhwc", "attention_block", {"use_cross": True, "channel_reduction": 2}, 8, 8,
         [2, 4, 5, 8], "NHWC"),
    case("drop_path", "drop_path", {"drop_prob": 0.3}, 8, 8, [2, 8, 4, 4]),
    case("drop_path_tokens", "DropPath", {}, 8, 8, [2, 5, 8], "tokens"),
    case("drop_path_nhwc", "stochastic_depth", {"drop_prob": 0.5, "scale_by_keep": False}, 8, 8, [2, 4, 4, 8],
         "NHWC"),
    case("layer_scale", "layer_scale", {"init_value": 0.1}, 8, 8, [2, 8, 4, 5]),
    case("layer_scale_nhwc", "layer_scale", {}, 8, 8, [2, 4, 5, 8], "NHWC"),
    case("layer_scale_tokens", "layer_scale", {}, 16, 16, [2, 7, 16], "tokens"),
    case("mish", "mish", {}, 8, 8, [2, 8, 4, 4]),
    case("mish_tokens", "mish", {}, 8, 8, [2, 6, 8], "tokens"),
    case("gem", "gem", {}, 8, 8, [2, 8, 5, 5]),
    case("gem_buffer_nhwc", "GeM", {"learnable": False, "p": 2.5, "eps": 0.2}, 8, 8, [2, 5, 4, 8], "NHWC"),
]


def randomise(block, gen):
    """Every parameter and buffer random (no zero bias, unit statistics or 1e-5 scale left)."""
    with torch.no_grad():
        for name, t in list(block.named_parameters()) + list(block.named_buffers()):
            leaf = name.split(".")[-1]
            if leaf == "num_batches_tracked":
                t.fill_(int(torch.randint(1, 100, (), generator=gen)))
            elif leaf == "running_var":
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
            elif leaf == "p":  # GeM
                t.copy_(torch.rand(t.shape, generator=gen) * 2 + 2)
            elif t.dim() >= 2:
                fan_in = t[0].numel()
                t.copy_(torch.randn(t.shape, generator=gen) / fan_in ** 0.5)
            elif leaf in ("weight", "gamma"):  # norms, PReLU, LayerScale
                t.copy_(1 + 0.3 * torch.randn(t.shape, generator=gen))
            else:  # biases, running means
                t.copy_(0.3 * torch.randn(t.shape, generator=gen))


def has_randomness(block):
    for m in block.modules():
        p = getattr(m, "drop_prob", None) if isinstance(m, hybrid_blocks.DropPath) else getattr(m, "p", None)
        if isinstance(m, (torch.nn.Dropout, torch.nn.Dropout2d, hybrid_blocks.DropPath)) and p > 0:
            return True
    return False


def run_case(c, index, out_dir):
    torch.manual_seed(1000 + index)
    gen = torch.Generator().manual_seed(2000 + index)
    block = hybrid_blocks.make_block(c["block"], c["params"], c["in_channels"], c["out_channels"], c["layout"])
    block = block.double()
    randomise(block, gen)
    block.eval()
    folder = os.path.join(out_dir, c["id"])
    os.makedirs(folder, exist_ok=True)
    state = {k: v.clone() for k, v in block.state_dict().items()}
    torch.save(state, os.path.join(folder, "state.pth"))

    x = torch.randn(c["shape"], generator=gen)
    if hybrid_blocks.canonical_name(c["block"]) == "gem":
        x = torch.rand(c["shape"], generator=gen) + 0.1
    tensors = {"input": x.clone()}
    xg = x.clone().requires_grad_(True)
    out = hybrid_blocks.run_block(c["block"], block, xg, c["layout"])
    g = torch.randn(out.shape, generator=gen)
    (out * g).sum().backward()
    tensors["output"] = out.detach().clone()
    tensors["grad.cotangent"] = g
    tensors["grad.input"] = xg.grad.clone()
    for name, p in block.named_parameters():
        tensors["grad." + name] = p.grad.clone()

    has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in block.modules())
    c["train"] = has_bn and not has_randomness(block)
    if c["train"]:
        block.train()
        with torch.no_grad():
            tensors["train.output"] = hybrid_blocks.run_block(c["block"], block, x, c["layout"]).clone()
        for name, b in block.named_buffers():
            tensors["train.state." + name] = b.clone()
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, "tensors.safetensors"))


def main():
    out_dir = sys.argv[-1]
    os.makedirs(out_dir, exist_ok=True)
    for i, c in enumerate(CASES):
        run_case(c, i, out_dir)
    with open(os.path.join(out_dir, "cases.json"), "w") as f:
        json.dump([{k: v for k, v in c.items() if k != "shape"} for c in CASES], f, indent=1)
    with open(os.path.join(out_dir, "complete"), "w") as f:
        f.write("ok\n")


if __name__ == "__main__":
    main()
