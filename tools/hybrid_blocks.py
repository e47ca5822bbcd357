"""PyTorch references of the hybrid layer's blocks (torchvision-customizer 2.1's block classes),
for tvc's dev scripts (tools/hybrid_block_goldens.py). Torch only; Debian's /usr/bin/python3
(torch 1.13).

Each class keeps the library's constructor arguments, child and parameter names (so state_dict
keys are the library's) and math, written from docs NOTES section 1 and the library's layout.
Where tvc's documented behaviour differs from the library (hybrid/tvc/hybrid/block_modules.h),
these classes follow tvc: LayerScale scales the channel dim of its layout, MultiHeadAttention
returns its output only and attends maps position by position.

    block = make_block("se", {"reduction": 8}, in_channels=64, out_channels=64)
    y = run_block(block, x, "NHWC")      # x (N, H, W, C): the block computes in NCHW

make_block looks names up exactly (canonical or alias) and fills channel parameters as the
library's HybridBuilder does: channels / out_channels / dim (and embed_dim, a tvc addition) from
out_channels, in_channels from in_channels, unless params gives them.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYOUTS = ("NCHW", "NHWC", "tokens")


# ---------------------------------------------------------------- factories of the library

def get_activation(name):
    """The library's get_activation with its defaults."""
    return {
        "relu": lambda: nn.ReLU(),
        "leaky_relu": lambda: nn.LeakyReLU(0.01),
        "prelu": lambda: nn.PReLU(1),
        "gelu": lambda: nn.GELU(),
        "silu": lambda: nn.SiLU(),
        "sigmoid": lambda: nn.Sigmoid(),
        "tanh": lambda: nn.Tanh(),
        "elu": lambda: nn.ELU(1.0),
        "selu": lambda: nn.SELU(),
    }[name]()


def get_normalization(norm_type, channels):
    """The library's get_normalization (LayerNorm over the last dim, as the library does)."""
    return {
        "batch": lambda: nn.BatchNorm2d(channels),
        "group": lambda: nn.GroupNorm(32, channels),
        "instance": lambda: nn.InstanceNorm2d(channels),
        "layer": lambda: nn.LayerNorm((channels,)),
        "none": lambda: nn.Identity(),
    }[norm_type]()


def conv(cin, cout, k, **kw):
    kw.setdefault("bias", False)
    return nn.Conv2d(cin, cout, k, **kw)


# ---------------------------------------------------------------- blocks

class ConvBlock(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, padding=1, activation="relu",
                 use_batchnorm=True, dropout_rate=0.0, pooling_type=None, pooling_kernel_size=2,
                 pooling_stride=2, dilation=1, groups=1, bias=True):
        super().__init__()
        self.out_channels = out_channels
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                              dilation=dilation, groups=groups, bias=bias)
        if use_batchnorm:
            self.bn = nn.BatchNorm2d(out_channels)
        if activation not in (None, "none"):
            self.activation = get_activation(activation)
        if dropout_rate > 0:
            self.dropout = nn.Dropout2d(dropout_rate)
        k, s = (pooling_kernel_size,) * 2, (pooling_stride,) * 2
        if pooling_type == "max":
            self.pooling = nn.MaxPool2d(k, s)
        elif pooling_type == "avg":
            self.pooling = nn.AvgPool2d(k, s)
        elif pooling_type == "adaptive_avg":
            self.pooling = nn.AdaptiveAvgPool2d(k)

    def forward(self, x):
        x = self.conv(x)
        for name in ("bn", "activation", "dropout", "pooling"):
            if hasattr(self, name):
                x = getattr(self, name)(x)
        return x


class SEBlock(nn.Module):
    def __init__(self, channels, reduction=16, activation="relu"):
        super().__init__()
        r = max(1, channels // reduction)
        self.squeeze = nn.AdaptiveAvgPool2d(1)
        self.excitation = nn.Sequential(nn.Linear(channels, r), get_activation(activation), nn.Linear(r, channels),
                                        nn.Sigmoid())

    def forward(self, x):
        n, c = x.shape[:2]
        return x * self.excitation(self.squeeze(x).view(n, c)).view(n, c, 1, 1)


class ResidualBlock(nn.Module):
    def __init__(self, in_channels, out_channels, stride=1, downsample=False, activation="relu", norm_type="batch",
                 use_se=False, se_reduction=16, bottleneck=False):
        super().__init__()
        self.activation_fn = get_activation(activation)
        self.bottleneck = bottleneck
        if bottleneck:
            mid = max(1, out_channels // 4)
            self.conv1 = conv(in_channels, mid, 1)
            self.bn1 = get_normalization(norm_type, mid)
            self.conv2 = conv(mid, mid, 3, stride=stride, padding=1)
            self.bn2 = get_normalization(norm_type, mid)
            self.conv3 = conv(mid, out_channels, 1)
            self.bn3 = get_normalization(norm_type, out_channels)
        else:
            self.conv1 = conv(in_channels, out_channels, 3, stride=stride, padding=1)
            self.bn1 = get_normalization(norm_type, out_channels)
            self.conv2 = conv(out_channels, out_channels, 3, padding=1)
            self.bn2 = get_normalization(norm_type, out_channels)
        self.has_shortcut = stride != 1 or in_channels != out_channels or downsample
        if self.has_shortcut:
            self.downsample_layer = nn.Sequential(conv(in_channels, out_channels, 1, stride=stride),
                                                  get_normalization(norm_type, out_channels))
        self.use_se = use_se
        if use_se:
            self.se_block = SEBlock(out_channels, se_reduction, activation)

    def forward(self, x):
        act = self.activation_fn
        out = self.bn2(self.conv2(act(self.bn1(self.conv1(x)))))
        if self.bottleneck:
            out = self.bn3(self.conv3(act(out)))
        if self.use_se:
            out = self.se_block(out)
        identity = self.downsample_layer(x) if self.has_shortcut else x
        return act(out + identity)


class DepthwiseBlock(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, padding=1, activation="relu",
                 norm_type="batch", add_residual=False):
        super().__init__()
        self.add_residual = add_residual and in_channels == out_channels
        self.activation_fn = get_activation(activation)
        self.depthwise = conv(in_channels, in_channels, kernel_size, stride=stride, padding=padding,
                              groups=in_channels)
        self.bn1 = get_normalization(norm_type, in_channels)
        self.pointwise = conv(in_channels, out_channels, 1)
        self.bn2 = get_normalization(norm_type, out_channels)

    def forward(self, x):
        out = self.bn2(self.pointwise(self.activation_fn(self.bn1(self.depthwise(x)))))
        if self.add_residual:
            out = out + x
        return self.activation_fn(out)


class InceptionModule(nn.Module):
    def __init__(self, in_channels, out_1x1, out_3x3, out_5x5, out_pool=None, activation="relu",
                 norm_type="batch"):
        super().__init__()
        if out_pool is None:
            out_pool = out_1x1 // 2
        norm = lambda c: get_normalization(norm_type, c)  # noqa: E731
        self.activation_fn = get_activation(activation)
        self.branch_1x1 = nn.Sequential(conv(in_channels, out_1x1, 1), norm(out_1x1))
        h = out_3x3 // 2
        self.branch_3x3 = nn.Sequential(conv(in_channels, h, 1), norm(h), conv(h, out_3x3, 3, padding=1), norm(out_3x3))
        self.branch_5x5 = nn.Sequential(conv(in_channels, out_5x5, 1), norm(out_5x5),
                                        conv(out_5x5, out_5x5, 5, padding=2), norm(out_5x5))
        self.branch_pool = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), conv(in_channels, out_pool, 1),
                                         norm(out_pool))
        self.out_channels = out_1x1 + out_3x3 + out_5x5 + out_pool

    def forward(self, x):
        branches = (self.branch_1x1, self.branch_3x3, self.branch_5x5, self.branch_pool)
        return torch.cat([self.activation_fn(b(x)) for b in branches], 1)


class DenseConnectionBlock(nn.Module):
    def __init__(self, num_layers=4, in_channels=64, growth_rate=32, kernel_size=3, bottleneck_ratio=4,
                 activation="relu", use_batchnorm=True, dropout_rate=0.0):
        super().__init__()
        bn = lambda c: nn.BatchNorm2d(c) if use_batchnorm else nn.Identity()  # noqa: E731
        mid = bottleneck_ratio * growth_rate
        self.layers = nn.ModuleList()
        c = in_channels
        for _ in range(num_layers):
            self.layers.append(nn.Sequential(
                bn(c), nn.ReLU(), nn.Conv2d(c, mid, 1, bias=not use_batchnorm), bn(mid), nn.ReLU(),
                nn.Conv2d(mid, growth_rate, kernel_size, padding=kernel_size // 2, bias=not use_batchnorm),
                nn.Dropout2d(dropout_rate) if dropout_rate > 0 else nn.Identity()))
            c += growth_rate
        self.out_channels = c

    def forward(self, x):
        features = [x]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        return torch.cat(features, 1)


class _Bottleneck(nn.Module):
    def __init__(self, in_channels, out_channels, mid, groups, stride, activation, norm_type, use_downsample):
        super().__init__()
        self.activation_fn = get_activation(activation)
        self.conv1 = conv(in_channels, mid, 1)
        self.bn1 = get_normalization(norm_type, mid)
        self.conv2 = conv(mid, mid, 3, stride=stride, padding=1, groups=groups)
        self.bn2 = get_normalization(norm_type, mid)
        self.conv3 = conv(mid, out_channels, 1)
        self.bn3 = get_normalization(norm_type, out_channels)
        self.downsample = None
        if stride != 1 or in_channels != out_channels or use_downsample:
            self.downsample = nn.Sequential(conv(in_channels, out_channels, 1, stride=stride),
                                            get_normalization(norm_type, out_channels))

    def forward(self, x):
        act = self.activation_fn
        out = self.bn3(self.conv3(act(self.bn2(self.conv2(act(self.bn1(self.conv1(x))))))))
        identity = x if self.downsample is None else self.downsample(x)
        return act(out + identity)


class StandardBottleneck(_Bottleneck):
    def __init__(self, in_channels, out_channels, stride=1, expansion=4, activation="relu", norm_type="batch",
                 use_downsample=False):
        super().__init__(in_channels, out_channels, max(1, out_channels // expansion), 1, stride, activation,
                         norm_type, use_downsample)


class WideBottleneck(_Bottleneck):
    def __init__(self, in_channels, out_channels, width_multiplier=1.0, stride=1, expansion=4, activation="relu",
                 norm_type="batch", use_downsample=False):
        mid = max(1, int(out_channels / expansion * width_multiplier))
        super().__init__(in_channels, out_channels, mid, 1, stride, activation, norm_type, use_downsample)


class GroupedBottleneck(_Bottleneck):
    def __init__(self, in_channels, out_channels, num_groups=2, stride=1, expansion=4, activation="relu",
                 norm_type="batch", use_downsample=False):
        mid = max(1, out_channels // expansion) // num_groups * num_groups or num_groups
        super().__init__(in_channels, out_channels, mid, min(num_groups, mid), stride, activation, norm_type,
                         use_downsample)


class CoordConv(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size=3, with_r=False, **kwargs):
        super().__init__()
        self.with_r = with_r
        self.conv = nn.Conv2d(in_channels + (3 if with_r else 2), out_channels, kernel_size, **kwargs)

    def forward(self, x):
        n, _, h, w = x.shape
        xx = torch.linspace(-1, 1, w, dtype=x.dtype).view(1, 1, 1, w).expand(n, 1, h, w)
        yy = torch.linspace(-1, 1, h, dtype=x.dtype).view(1, 1, h, 1).expand(n, 1, h, w)
        parts = [x, xx, yy]
        if self.with_r:
            parts.append(torch.sqrt(xx ** 2 + yy ** 2))
        return self.conv(torch.cat(parts, 1))


class Mish(nn.Module):
    def forward(self, x):
        return x * torch.tanh(F.softplus(x))


class ConvBNAct(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, padding=None, groups=1,
                 activation="relu", use_bn=True):
        super().__init__()
        if padding is None:
            padding = kernel_size // 2
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, groups=groups,
                              bias=not use_bn)
        self.bn = nn.BatchNorm2d(out_channels) if use_bn else nn.Identity()
        self.act = {"swish": nn.SiLU, "gelu": nn.GELU, "mish": Mish, "none": nn.Identity, None: nn.Identity}.get(
            activation, nn.ReLU)()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class SqueezeExcitation(nn.Module):
    def __init__(self, channels, reduction=16, activation="relu", gate_activation="sigmoid", use_bn=False):
        super().__init__()
        r = max(1, channels // reduction)
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        layers = [nn.Linear(channels, r, bias=not use_bn)]
        if use_bn:
            layers.append(nn.BatchNorm1d(r))
        layers.append({"swish": nn.SiLU, "gelu": nn.GELU}.get(activation, nn.ReLU)())
        layers.append(nn.Linear(r, channels))
        layers.append(nn.Hardsigmoid() if gate_activation == "hardsigmoid" else nn.Sigmoid())
        self.fc = nn.Sequential(*layers)

    def forward(self, x):
        n, c = x.shape[:2]
        return x * self.fc(self.avg_pool(x).view(n, c)).view(n, c, 1, 1)


class DropPath(nn.Module):
    def __init__(self, drop_prob=0.0, scale_by_keep=True):
        super().__init__()
        self.drop_prob, self.scale_by_keep = drop_prob, scale_by_keep

    def forward(self, x):
        if self.drop_prob == 0 or not self.training:
            return x
        keep = 1 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * (mask / keep if self.scale_by_keep else mask)


class _InvertedResidual(nn.Module):
    def forward(self, x):
        y = x
        for name in ("expand", "depthwise", "se", "project"):
            if hasattr(self, name):
                y = getattr(self, name)(y)
        return x + self.drop_path(y) if self.use_skip else y


class MBConv(_InvertedResidual):
    def __init__(self, in_channels, out_channels, expansion=4, stride=1, kernel_size=3, use_se=True, se_reduction=4,
                 drop_path=0.0):
        super().__init__()
        hidden = in_channels * expansion
        self.expand = ConvBNAct(in_channels, hidden, 1, activation="swish") if expansion != 1 else nn.Identity()
        self.depthwise = ConvBNAct(hidden, hidden, kernel_size, stride, kernel_size // 2, hidden, "swish")
        self.se = SqueezeExcitation(hidden, expansion * se_reduction, "swish") if use_se else nn.Identity()
        self.project = ConvBNAct(hidden, out_channels, 1, activation=None)
        self.use_skip = stride == 1 and in_channels == out_channels
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()


class FusedMBConv(_InvertedResidual):
    def __init__(self, in_channels, out_channels, expansion=4, stride=1, kernel_size=3, use_se=False, drop_path=0.0):
        super().__init__()
        hidden = in_channels * expansion
        self.expand = ConvBNAct(in_channels, hidden, kernel_size, stride, activation="swish")
        self.se = SqueezeExcitation(hidden, expansion * 4, "swish") if use_se else nn.Identity()
        self.project = ConvBNAct(hidden, out_channels, 1, activation=None)
        self.use_skip = stride == 1 and in_channels == out_channels
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()


# ---------------------------------------------------------------- attention

def spatial_gate(x, conv_, sigmoid):
    stats = torch.cat([x.mean(1, keepdim=True), x.max(1, keepdim=True)[0]], 1)
    return x * sigmoid(conv_(stats))


class ChannelAttention(nn.Module):
    def __init__(self, channels, reduction=16, activation="relu"):
        super().__init__()
        r = max(1, channels // reduction)
        self.fc1 = nn.Linear(channels, r)
        self.activation = F.relu if activation == "relu" else F.gelu
        self.fc2 = nn.Linear(r, channels)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x):
        n, c = x.shape[:2]
        e = self.fc2(self.activation(self.fc1(F.adaptive_avg_pool2d(x, 1).view(n, c))))
        return x * self.sigmoid(e).view(n, c, 1, 1)


class SpatialAttention(nn.Module):
    def __init__(self, kernel_size=7):
        super().__init__()
        self.conv = nn.Conv2d(2, 1, kernel_size, padding=kernel_size // 2, bias=False)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x):
        return spatial_gate(x, self.conv, self.sigmoid)


class ChannelSpatialAttention(nn.Module):
    def __init__(self, channels, channel_reduction=16, spatial_kernel=7):
        super().__init__()
        self.channel_attn = ChannelAttention(channels, channel_reduction)
        self.spatial_attn = SpatialAttention(spatial_kernel)

    def forward(self, x):
        return self.spatial_attn(self.channel_attn(x))


class CBAMBlock(nn.Module):
    def __init__(self, channels, reduction=16, spatial_kernel=7):
        super().__init__()
        r = max(1, channels // reduction)
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.max_pool = nn.AdaptiveMaxPool2d(1)
        self.channel_fc = nn.Sequential(nn.Linear(channels, r, bias=False), nn.ReLU(), nn.Linear(r, channels, bias=False))
        self.spatial_conv = nn.Conv2d(2, 1, spatial_kernel, padding=spatial_kernel // 2, bias=False)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x):
        n, c = x.shape[:2]
        a = self.channel_fc(self.avg_pool(x).view(n, c)) + self.channel_fc(self.max_pool(x).view(n, c))
        x = x * self.sigmoid(a).view(n, c, 1, 1)
        return spatial_gate(x, self.spatial_conv, self.sigmoid)


class ECABlock(nn.Module):
    def __init__(self, channels, kernel_size=None, gamma=2, beta=1):
        super().__init__()
        if kernel_size is None:
            t = int(abs((math.log2(channels) + beta) / gamma))
            kernel_size = t if t % 2 else t + 1
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.conv = nn.Conv1d(1, 1, kernel_size, padding=(kernel_size - 1) // 2, bias=False)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x):
        y = self.conv(self.avg_pool(x).squeeze(-1).transpose(-1, -2))
        return x * self.sigmoid(y.transpose(-1, -2).unsqueeze(-1))


class MultiHeadAttention(nn.Module):
    """Self-attention; returns the output only. layout: tokens (N, L, E), or a map whose
    positions are the tokens."""

    def __init__(self, embed_dim, num_heads=8, dropout=0.0, bias=True, batch_first=True, layout="tokens"):
        super().__init__()
        assert batch_first
        self.num_heads, self.head_dim, self.layout = num_heads, embed_dim // num_heads, layout
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.dropout_layer = nn.Dropout(dropout)

    def attend(self, t):
        n, l, e = t.shape
        q, k, v = (p(t).view(n, l, self.num_heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        w = self.dropout_layer(F.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.head_dim), -1))
        return self.out_proj((w @ v).transpose(1, 2).reshape(n, l, e))

    def forward(self, x):
        if self.layout == "tokens":
            return self.attend(x)
        if self.layout == "NHWC":
            n, h, w, c = x.shape
            return self.attend(x.reshape(n, h * w, c)).reshape(x.shape)
        return self.attend(x.flatten(2).transpose(1, 2)).transpose(1, 2).reshape(x.shape)


class AttentionBlock(nn.Module):
    def __init__(self, channels, use_channel=True, use_spatial=True, use_cross=False, channel_reduction=16,
                 spatial_kernel=7):
        super().__init__()
        if use_channel:
            self.channel_attn = ChannelAttention(channels, channel_reduction)
        if use_spatial:
            self.spatial_attn = SpatialAttention(spatial_kernel)
        if use_cross:
            self.cross_attn = nn.Sequential(nn.Conv2d(channels, channels // 2, 1), nn.ReLU(),
                                            nn.Conv2d(channels // 2, channels, 1), nn.Sigmoid())

    def forward(self, x):
        for name in ("channel_attn", "spatial_attn"):
            if hasattr(self, name):
                x = getattr(self, name)(x)
        return x * self.cross_attn(x) if hasattr(self, "cross_attn") else x


# ---------------------------------------------------------------- other

class LayerScale(nn.Module):
    """x * gamma along the channel dim of the layout (tvc's rule; the library multiplies the
    last dim whatever the layout)."""

    def __init__(self, dim, init_value=1e-5, layout="NCHW"):
        super().__init__()
        self.layout = layout
        self.gamma = nn.Parameter(init_value * torch.ones(dim))

    def forward(self, x):
        return x * (self.gamma.view(-1, 1, 1) if self.layout == "NCHW" else self.gamma)


class GeM(nn.Module):
    def __init__(self, p=3.0, eps=1e-6, learnable=True):
        super().__init__()
        self.eps = eps
        if learnable:
            self.p = nn.Parameter(torch.ones(1) * p)
        else:
            self.register_buffer("p", torch.tensor([p]))

    def forward(self, x):
        return F.adaptive_avg_pool2d(x.clamp(min=self.eps).pow(self.p), 1).pow(1.0 / self.p)


# ---------------------------------------------------------------- the registry

# canonical name -> (class, aliases)
BLOCKS = {
    "conv": (ConvBlock, ["conv2d", "convblock"]),
    "residual": (ResidualBlock, ["res", "resblock"]),
    "se": (SEBlock, ["squeeze_excitation", "seblock", "SEBlock"]),
    "depthwise": (DepthwiseBlock, ["dw", "depthwise_separable"]),
    "inception": (InceptionModule, ["inception_module"]),
    "dense": (DenseConnectionBlock, ["dense_block", "densenet"]),
    "bottleneck": (StandardBottleneck, []),
    "wide_bottleneck": (WideBottleneck, []),
    "grouped_bottleneck": (GroupedBottleneck, []),
    "coord_conv": (CoordConv, ["CoordConv"]),
    "conv_bn_act": (ConvBNAct, ["ConvBNAct"]),
    "mbconv": (MBConv, ["MBConv", "inverted_residual"]),
    "fused_mbconv": (FusedMBConv, ["FusedMBConv"]),
    "channel_attention": (ChannelAttention, ["ca"]),
    "spatial_attention": (SpatialAttention, ["sa"]),
    "cbam": (ChannelSpatialAttention, ["channel_spatial"]),
    "cbam_block": (CBAMBlock, ["CBAMBlock", "cbam_attention"]),
    "eca": (ECABlock, ["eca_block", "ECABlock", "efficient_channel"]),
    "se_enhanced": (SqueezeExcitation, ["squeeze_excite", "se_v2"]),
    "multihead_attention": (MultiHeadAttention, ["mha"]),
    "attention_block": (AttentionBlock, []),
    "drop_path": (DropPath, ["stochastic_depth", "DropPath"]),
    "layer_scale": (LayerScale, []),
    "mish": (Mish, []),
    "gem": (GeM, ["GeM"]),
}
# Blocks whose forward takes the layout itself (the others compute on NCHW maps).
LAYOUT_AWARE = {"multihead_attention", "layer_scale", "drop_path", "mish"}


def canonical_name(name):
    for canonical, (_, aliases) in BLOCKS.items():
        if name == canonical or name in aliases:
            return canonical
    raise KeyError(f"unknown block '{name}'; known blocks: {', '.join(sorted(BLOCKS))}")


def make_block(name, params, in_channels, out_channels, layout="NCHW"):
    """The block called name (canonical or alias) with params, its channel parameters filled
    from in_channels / out_channels where params does not give them."""
    import inspect
    canonical = canonical_name(name)
    cls = BLOCKS[canonical][0]
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = dict(params)
    for key, value in (("channels", out_channels), ("out_channels", out_channels), ("dim", out_channels),
                       ("embed_dim", out_channels), ("in_channels", in_channels)):
        if key in accepted and key not in kwargs:
            kwargs[key] = value
    if "layout" in accepted:
        kwargs["layout"] = layout
    if kwargs.get("pooling_type") == "none":
        kwargs["pooling_type"] = None
    return cls(**kwargs)


def run_block(name, block, x, layout="NCHW"):
    """block(x) for x laid out as layout: map blocks compute in NCHW, so an NHWC x is permuted
    there and back."""
    if canonical_name(name) in LAYOUT_AWARE or layout == "NCHW":
        return block(x)
    assert layout == "NHWC", f"block '{name}' takes no tokens"
    return block(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
