// The block modules of the hybrid layer: one class per block class of the Python library
// torchvision-customizer 2.1, with its constructor arguments (names, defaults), its child and
// parameter names (so state_dict keys are the library's) and its math. make_block
// (tvc/hybrid/blocks.h) builds them by registry name; they can be built directly too:
//
//   auto se = std::make_shared<hybrid::SEBlock>(256, 8);     // excitation.0.weight, ...
//   Tensor y = (*se)(x);                                      // x (N, 256, H, W)
//
// Shape legend: N batch, C channels (C_in, C_out), H,W height and width, L tokens.
//
// Layouts: a block on feature maps (a MapBlock) computes in NCHW. Built for Layout::NHWC (the
// stages of Swin) it takes and returns (N, H, W, C): forward permutes to NCHW and back, with no
// extra module, so the keys do not change. Map blocks reject tokens (make_block says so).
// Elementwise blocks (Mish, DropPath, LayerScale) take every layout; MultiHeadAttention takes
// tokens (N, L, C) and maps (each position a token).
//
// Blocks nested in a block (ResidualBlock's se_block, MBConv's se) are built for NCHW: their
// parent hands them NCHW maps.
//
// The activations the library builds with inplace=True (CBAMBlock's channel_fc, ConvBNAct, ...)
// compute out of place here: the same numbers, and the block's input is never overwritten.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tvc/hybrid/blocks.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/layers.h"

namespace tvc::hybrid {

// ---------------------------------------------------------------- bases

// The base of every block: the layout of the tensors it takes and, where the block defines it,
// the channel count of its output (ConvBlock: out_channels, SEBlock: channels); nullopt where
// the output keeps its input's channels whatever they are (Mish, DropPath, GeM,
// SpatialAttention).
class Block : public nn::Module {
 public:
  Layout layout() const { return layout_; }
  std::optional<int64_t> output_channels() const { return output_channels_; }

 protected:
  Block(Layout layout, std::optional<int64_t> output_channels) : layout_(layout), output_channels_(output_channels) {}
  Layout layout_;
  std::optional<int64_t> output_channels_;
};

// A block on feature maps: forward checks that x is 4-d, permutes (N, H, W, C) to (N, C, H, W)
// for Layout::NHWC, runs forward_map and permutes its (4-d) result back.
class MapBlock : public Block {
 public:
  Tensor forward(const Tensor& x) final;

 protected:
  MapBlock(Layout layout, std::optional<int64_t> output_channels) : Block(layout, output_channels) {}
  // The computation on x (N, C, H, W).
  virtual Tensor forward_map(const Tensor& x) = 0;
};

// ---------------------------------------------------------------- layers tvc::nn lacks
// (what the library's get_activation, get_normalization and blocks use: ELU, SELU, PReLU,
// InstanceNorm2d, Dropout2d, PyTorch's math and names)

// x if x > 0, else alpha * (exp(x) - 1). Any shape.
class ELU : public nn::Cloneable<ELU> {
 public:
  explicit ELU(double alpha = 1.0) : alpha(alpha) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override { return "alpha=" + nn::py_float_repr(alpha); }
  double alpha;
};

// scale * ELU(x) with PyTorch's alpha = 1.6732632423543772, scale = 1.0507009873554805.
class SELU : public nn::Cloneable<SELU> {
 public:
  Tensor forward(const Tensor& x) override;
};

// max(0, x) + weight * min(0, x); weight (num_parameters) filled with init (0.25), one value
// for every channel (dim 1) or one per channel. x (N, C, *) or any shape when num_parameters = 1.
class PReLU : public nn::Cloneable<PReLU> {
 public:
  explicit PReLU(int64_t num_parameters = 1, double init = 0.25);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override { return "num_parameters=" + std::to_string(num_parameters); }
  int64_t num_parameters;
};

// InstanceNorm2d(num_features) with PyTorch's defaults (affine=False, track_running_stats=False,
// so no parameters or buffers): each (n, c) plane normalised by its own mean and biased
// variance, eps 1e-5, in training and evaluation alike. x (N, C, H, W).
class InstanceNorm2d : public nn::Cloneable<InstanceNorm2d> {
 public:
  explicit InstanceNorm2d(int64_t num_features) : num_features(num_features) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t num_features;
};

// In training, zeroes whole channels with probability p (one draw per (n, c)) and scales the
// rest by 1 / (1 - p); the identity in evaluation. x (N, C, H, W).
class Dropout2d : public nn::Cloneable<Dropout2d> {
 public:
  explicit Dropout2d(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override { return "p=" + nn::py_float_repr(p) + ", inplace=False"; }
  double p;
};

// The library's get_activation(name) with its defaults: relu, leaky_relu (0.01), prelu (one
// parameter, 0.25), gelu, silu, sigmoid, tanh, elu (alpha 1), selu.
nn::ModulePtr make_activation(const std::string& name);
// The library's get_normalization(norm_type, channels): batch (BatchNorm2d), group
// (GroupNorm(32, channels)), instance (InstanceNorm2d), layer (LayerNorm((channels,)), which,
// as in the library, normalises the LAST dim of an (N, C, H, W) map: it needs W == channels),
// none (Identity).
nn::ModulePtr make_normalization(const std::string& norm_type, int64_t channels);

// ---------------------------------------------------------------- blocks (category "block")

// conv: ConvBlock(in_channels, out_channels, kernel_size=3, stride=1, padding=1,
// activation="relu" ("none": None), use_batchnorm=true, dropout_rate=0, pooling_type="none"
// (max, avg, adaptive_avg), pooling_kernel_size=2, pooling_stride=2, dilation=1, groups=1,
// bias=true). Children conv, bn, activation, dropout (Dropout2d), pooling, each only when used
// (adaptive_avg pools to pooling_kernel_size). (N, C_in, H, W) -> (N, out_channels, H', W').
struct ConvBlockOptions {
  int64_t kernel_size = 3, stride = 1, padding = 1;
  std::string activation = "relu";
  bool use_batchnorm = true;
  double dropout_rate = 0;
  std::string pooling_type = "none";
  int64_t pooling_kernel_size = 2, pooling_stride = 2, dilation = 1, groups = 1;
  bool bias = true;
};
class ConvBlock : public nn::Cloneable<ConvBlock, MapBlock> {
 public:
  ConvBlock(int64_t in_channels, int64_t out_channels, const ConvBlockOptions& options = {},
            Layout layout = Layout::NCHW);

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// residual: ResidualBlock(in_channels, out_channels, stride=1, downsample=false,
// activation="relu", norm_type="batch", use_se=false, se_reduction=16, bottleneck=false).
// out = act(main(x) [-> se_block] + shortcut(x)); main: conv1 3x3/stride, bn1, act, conv2 3x3,
// bn2 (bottleneck: conv1 1x1 to out/4, conv2 3x3/stride, conv3 1x1 to out, act between);
// shortcut: downsample_layer (1x1 conv/stride + norm) when stride != 1, in != out or
// downsample, else x. Children in the library's order: activation_fn, conv1, bn1, conv2, bn2,
// [conv3, bn3], [downsample_layer], [se_block (SEBlock(out, se_reduction, activation))].
// (N, C_in, H, W) -> (N, out_channels, H/stride, W/stride).
struct ResidualBlockOptions {
  int64_t stride = 1;
  bool downsample = false;
  std::string activation = "relu", norm_type = "batch";
  bool use_se = false;
  int64_t se_reduction = 16;
  bool bottleneck = false;
};
class ResidualBlock : public nn::Cloneable<ResidualBlock, MapBlock> {
 public:
  ResidualBlock(int64_t in_channels, int64_t out_channels, const ResidualBlockOptions& options = {},
                Layout layout = Layout::NCHW);

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// depthwise: DepthwiseBlock(in_channels, out_channels, kernel_size=3, stride=1, padding=1,
// activation="relu", norm_type="batch", add_residual=false). act(bn2(pointwise(act(bn1(
// depthwise(x))))) [+ x when add_residual and in == out, before the last act]; depthwise is
// k x k with groups = in_channels, pointwise 1x1, both without bias. Children activation_fn,
// depthwise, bn1, pointwise, bn2. (N, C_in, H, W) -> (N, out_channels, H', W').
struct DepthwiseBlockOptions {
  int64_t kernel_size = 3, stride = 1, padding = 1;
  std::string activation = "relu", norm_type = "batch";
  bool add_residual = false;
};
class DepthwiseBlock : public nn::Cloneable<DepthwiseBlock, MapBlock> {
 public:
  DepthwiseBlock(int64_t in_channels, int64_t out_channels, const DepthwiseBlockOptions& options = {},
                 Layout layout = Layout::NCHW);
  bool add_residual;  // options.add_residual and in_channels == out_channels

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// inception: InceptionModule(in_channels, out_1x1, out_3x3, out_5x5, out_pool=None
// (out_1x1 / 2), activation="relu", norm_type="batch"). Four branches, each followed by the
// activation, concatenated: branch_1x1 (1x1 conv, norm), branch_3x3 (1x1 to out_3x3/2, norm,
// 3x3, norm), branch_5x5 (1x1, norm, 5x5, norm), branch_pool (3x3/1 max pool, 1x1, norm).
// (N, C_in, H, W) -> (N, out_1x1 + out_3x3 + out_5x5 + out_pool, H, W).
struct InceptionModuleOptions {
  std::optional<int64_t> out_pool{};
  std::string activation = "relu", norm_type = "batch";
};
class InceptionModule : public nn::Cloneable<InceptionModule, MapBlock> {
 public:
  InceptionModule(int64_t in_channels, int64_t out_1x1, int64_t out_3x3, int64_t out_5x5,
                  const InceptionModuleOptions& options = {}, Layout layout = Layout::NCHW);

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// dense: DenseConnectionBlock(num_layers=4, in_channels, growth_rate=32, kernel_size=3,
// bottleneck_ratio=4, activation (accepted and unused, as in the library: the layers use ReLU),
// use_batchnorm=true, dropout_rate=0). layers.i = Sequential(BN|Identity, ReLU, 1x1 conv to
// bottleneck_ratio * growth_rate, BN|Identity, ReLU, k x k conv to growth_rate,
// Dropout2d|Identity) on the concatenation of x and every earlier layer's output (convs biased
// only without batchnorm). (N, C_in, H, W) -> (N, C_in + num_layers * growth_rate, H, W).
struct DenseConnectionBlockOptions {
  int64_t num_layers = 4, growth_rate = 32, kernel_size = 3, bottleneck_ratio = 4;
  std::string activation = "relu";
  bool use_batchnorm = true;
  double dropout_rate = 0;
};
class DenseConnectionBlock : public nn::Cloneable<DenseConnectionBlock, MapBlock> {
 public:
  DenseConnectionBlock(int64_t in_channels, const DenseConnectionBlockOptions& options = {},
                       Layout layout = Layout::NCHW);

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// The three bottlenecks share their layout: act(bn3(conv3(act(bn2(conv2(act(bn1(conv1(x))))))))
// + shortcut(x)), conv1 1x1 to mid, conv2 3x3/stride (groups) mid -> mid, conv3 1x1 to out, all
// without bias; shortcut downsample (1x1 conv/stride + norm) when stride != 1, in != out or
// use_downsample. Children activation_fn, conv1, bn1, conv2, bn2, conv3, bn3, [downsample].
// (N, C_in, H, W) -> (N, out_channels, H/stride, W/stride).
struct BottleneckOptions {
  int64_t stride = 1, expansion = 4;
  std::string activation = "relu", norm_type = "batch";
  bool use_downsample = false;
};
class BottleneckBlock : public MapBlock {
 protected:
  BottleneckBlock(int64_t in_channels, int64_t out_channels, int64_t mid_channels, int64_t groups,
                  const BottleneckOptions& options, Layout layout);
  Tensor forward_map(const Tensor& x) override;
};

// bottleneck: StandardBottleneck(in_channels, out_channels, stride=1, expansion=4,
// activation="relu", norm_type="batch", use_downsample=false); mid = max(1, out / expansion).
class StandardBottleneck : public nn::Cloneable<StandardBottleneck, BottleneckBlock> {
 public:
  StandardBottleneck(int64_t in_channels, int64_t out_channels, const BottleneckOptions& options = {},
                     Layout layout = Layout::NCHW);
};

// wide_bottleneck: WideBottleneck(in_channels, out_channels, width_multiplier=1.0, stride,
// expansion, activation, norm_type, use_downsample); mid = max(1, int(out / expansion *
// width_multiplier)).
class WideBottleneck : public nn::Cloneable<WideBottleneck, BottleneckBlock> {
 public:
  WideBottleneck(int64_t in_channels, int64_t out_channels, double width_multiplier = 1.0,
                 const BottleneckOptions& options = {}, Layout layout = Layout::NCHW);
};

// grouped_bottleneck: GroupedBottleneck(in_channels, out_channels, num_groups=2, stride,
// expansion, activation, norm_type, use_downsample); mid = max(1, out / expansion) rounded down
// to a multiple of num_groups (num_groups when that is 0), conv2 with min(num_groups, mid) groups.
class GroupedBottleneck : public nn::Cloneable<GroupedBottleneck, BottleneckBlock> {
 public:
  GroupedBottleneck(int64_t in_channels, int64_t out_channels, int64_t num_groups = 2,
                    const BottleneckOptions& options = {}, Layout layout = Layout::NCHW);
};

// coord_conv: CoordConv(in_channels, out_channels, kernel_size=3, with_r=false, and Conv2d's
// stride=1, padding=0, dilation=1, groups=1, bias=true, padding_mode="zeros"). conv (C_in + 2,
// or + 3 with_r) on [x, xx, yy (, rr)]: xx = linspace(-1, 1, W) along W, yy = linspace(-1, 1,
// H) along H, rr = sqrt(xx^2 + yy^2). (N, C_in, H, W) -> (N, out_channels, H', W').
struct CoordConvOptions {
  int64_t kernel_size = 3;
  bool with_r = false;
  nn::ConvOptions conv{};
};
class CoordConv : public nn::Cloneable<CoordConv, MapBlock> {
 public:
  CoordConv(int64_t in_channels, int64_t out_channels, const CoordConvOptions& options = {},
            Layout layout = Layout::NCHW);
  bool with_r;

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// conv_bn_act: ConvBNAct(in_channels, out_channels, kernel_size=3, stride=1, padding=None
// (kernel_size / 2), groups=1, activation="relu" (swish, gelu, mish, "none"), use_bn=true).
// act(bn(conv(x))); conv biased only without bn (bn is then Identity). Children conv, bn, act.
// (N, C_in, H, W) -> (N, out_channels, H', W').
struct ConvBNActOptions {
  int64_t kernel_size = 3, stride = 1;
  std::optional<int64_t> padding{};
  int64_t groups = 1;
  std::string activation = "relu";
  bool use_bn = true;
};
class ConvBNAct : public nn::Cloneable<ConvBNAct, MapBlock> {
 public:
  ConvBNAct(int64_t in_channels, int64_t out_channels, const ConvBNActOptions& options = {},
            Layout layout = Layout::NCHW);

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// The base of MBConv and FusedMBConv: forward runs expand, [depthwise], se, project and
// returns x + drop_path(y) when use_skip (stride 1 and in == out), else y.
class InvertedResidualBlock : public MapBlock {
 public:
  bool use_skip;

 protected:
  InvertedResidualBlock(int64_t in_channels, int64_t out_channels, int64_t stride, Layout layout)
      : MapBlock(layout, out_channels), use_skip(stride == 1 && in_channels == out_channels) {}
  Tensor forward_map(const Tensor& x) override;
};

// mbconv: MBConv(in_channels, out_channels, expansion=4, stride=1, kernel_size=3, use_se=true,
// se_reduction=4, drop_path=0). hidden = in * expansion; expand (ConvBNAct 1x1 swish, Identity
// when expansion is 1), depthwise (ConvBNAct k x k/stride, groups hidden, swish), se
// (SqueezeExcitation(hidden, expansion * se_reduction, swish) or Identity), project (ConvBNAct
// 1x1, no activation), drop_path (DropPath or Identity).
// (N, C_in, H, W) -> (N, out_channels, H/stride, W/stride).
struct MBConvOptions {
  int64_t expansion = 4, stride = 1, kernel_size = 3;
  bool use_se = true;
  int64_t se_reduction = 4;
  double drop_path = 0;
};
class MBConv : public nn::Cloneable<MBConv, InvertedResidualBlock> {
 public:
  MBConv(int64_t in_channels, int64_t out_channels, const MBConvOptions& options = {}, Layout layout = Layout::NCHW);
};

// fused_mbconv: FusedMBConv(in_channels, out_channels, expansion=4, stride=1, kernel_size=3,
// use_se=false, drop_path=0). expand (ConvBNAct k x k/stride to in * expansion, swish), se
// (SqueezeExcitation(hidden, expansion * 4, swish) or Identity), project (ConvBNAct 1x1, no
// activation), drop_path. (N, C_in, H, W) -> (N, out_channels, H/stride, W/stride).
struct FusedMBConvOptions {
  int64_t expansion = 4, stride = 1, kernel_size = 3;
  bool use_se = false;
  double drop_path = 0;
};
class FusedMBConv : public nn::Cloneable<FusedMBConv, InvertedResidualBlock> {
 public:
  FusedMBConv(int64_t in_channels, int64_t out_channels, const FusedMBConvOptions& options = {},
              Layout layout = Layout::NCHW);
};

// ---------------------------------------------------------------- attention
// Each: x (N, C, H, W) -> x * attention, same shape.

// se: SEBlock(channels, reduction=16, activation="relu"). s = sigmoid(Linear(C/r -> C)(
// act(Linear(C -> max(1, C/r))(avgpool(x))))), x * s. Children squeeze, excitation (0 Linear,
// 1 activation, 2 Linear, 3 Sigmoid).
class SEBlock : public nn::Cloneable<SEBlock, MapBlock> {
 public:
  SEBlock(int64_t channels, int64_t reduction = 16, const std::string& activation = "relu",
          Layout layout = Layout::NCHW);

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// channel_attention: ChannelAttention(channels, reduction=16, activation="relu" (else GELU)).
// x * sigmoid(fc2(act(fc1(avgpool(x))))), fc1 C -> max(1, C/r), fc2 back, both biased; the
// activation is functional (no child). Children fc1, fc2, sigmoid.
class ChannelAttention : public nn::Cloneable<ChannelAttention, MapBlock> {
 public:
  ChannelAttention(int64_t channels, int64_t reduction = 16, const std::string& activation = "relu",
                   Layout layout = Layout::NCHW);
  bool relu;

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// spatial_attention: SpatialAttention(kernel_size=7, odd). x * sigmoid(conv([mean over C,
// max over C])), conv 2 -> 1, k x k, padding k/2, no bias. Children conv, sigmoid.
class SpatialAttention : public nn::Cloneable<SpatialAttention, MapBlock> {
 public:
  explicit SpatialAttention(int64_t kernel_size = 7, Layout layout = Layout::NCHW);

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// cbam: ChannelSpatialAttention(channels, channel_reduction=16, spatial_kernel=7):
// spatial_attn(channel_attn(x)) (ChannelAttention, SpatialAttention).
class ChannelSpatialAttention : public nn::Cloneable<ChannelSpatialAttention, MapBlock> {
 public:
  ChannelSpatialAttention(int64_t channels, int64_t channel_reduction = 16, int64_t spatial_kernel = 7,
                          Layout layout = Layout::NCHW);

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// cbam_block: CBAMBlock(channels, reduction=16, spatial_kernel=7). Channel step: x * sigmoid(
// mlp(avgpool(x)) + mlp(maxpool(x))), mlp = channel_fc (Linear C -> max(1, C/r), ReLU, Linear
// back, no biases); spatial step: x * sigmoid(spatial_conv([mean over C, max over C])),
// spatial_conv 2 -> 1, k x k, padding k/2, no bias. Children avg_pool, max_pool, channel_fc,
// spatial_conv, sigmoid.
class CBAMBlock : public nn::Cloneable<CBAMBlock, MapBlock> {
 public:
  CBAMBlock(int64_t channels, int64_t reduction = 16, int64_t spatial_kernel = 7, Layout layout = Layout::NCHW);

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// eca: ECABlock(channels, kernel_size=None, gamma=2, beta=1). k = kernel_size, or
// t = int(|(log2(C) + beta) / gamma|) made odd (t + 1 when even). x * sigmoid(conv(avgpool(x)
// as (N, 1, C))) with conv a Conv1d(1, 1, k, padding (k - 1) / 2, no bias) across channels.
// Children avg_pool, conv (weight (1, 1, k)), sigmoid.
class ECABlock : public nn::Cloneable<ECABlock, MapBlock> {
 public:
  ECABlock(int64_t channels, std::optional<int64_t> kernel_size = std::nullopt, double gamma = 2, double beta = 1,
           Layout layout = Layout::NCHW);
  int64_t kernel_size;

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// se_enhanced: SqueezeExcitation(channels, reduction=16, activation="relu" (swish, gelu),
// gate_activation="sigmoid" (hardsigmoid), use_bn=false). x * fc(avgpool(x)), fc = Sequential
// (Linear C -> max(1, C/r) (no bias with use_bn), [BatchNorm1d], activation, Linear back,
// gate). Children avg_pool, fc.
class SqueezeExcitation : public nn::Cloneable<SqueezeExcitation, MapBlock> {
 public:
  SqueezeExcitation(int64_t channels, int64_t reduction = 16, const std::string& activation = "relu",
                    const std::string& gate_activation = "sigmoid", bool use_bn = false, Layout layout = Layout::NCHW);

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// multihead_attention: MultiHeadAttention(embed_dim, num_heads=8, dropout=0, bias=true,
// batch_first=true (tvc's tokens are batch first: false is rejected)). Self-attention:
// q_proj, k_proj, v_proj (E -> E), per head softmax(q k^T / sqrt(E / H)), dropout_layer on the
// weights, out_proj. Returns the output only (the library returns (output, weights), which a
// Sequential cannot pass on). Tokens (N, L, E) -> (N, L, E); a map is attended with each of
// its H*W positions a token: (N, E, H, W) or (N, H, W, E) -> the same shape.
class MultiHeadAttention : public nn::Cloneable<MultiHeadAttention, Block> {
 public:
  MultiHeadAttention(int64_t embed_dim, int64_t num_heads = 8, double dropout = 0, bool bias = true,
                     Layout layout = Layout::Tokens);
  Tensor forward(const Tensor& x) override;
  int64_t embed_dim, num_heads, head_dim;

 private:
  Tensor attend(const Tensor& tokens);  // (N, L, E) -> (N, L, E)
};

// attention_block: AttentionBlock(channels, use_channel=true, use_spatial=true,
// use_cross=false, channel_reduction=16, spatial_kernel=7). channel_attn (ChannelAttention),
// then spatial_attn (SpatialAttention), then x * cross_attn(x) (1x1 conv C -> C/2, ReLU, 1x1
// conv back, Sigmoid), each when enabled.
struct AttentionBlockOptions {
  bool use_channel = true, use_spatial = true, use_cross = false;
  int64_t channel_reduction = 16, spatial_kernel = 7;
};
class AttentionBlock : public nn::Cloneable<AttentionBlock, MapBlock> {
 public:
  explicit AttentionBlock(int64_t channels, const AttentionBlockOptions& options = {}, Layout layout = Layout::NCHW);

 protected:
  Tensor forward_map(const Tensor& x) override;
};

// ---------------------------------------------------------------- other

// drop_path: DropPath(drop_prob=0, scale_by_keep=true). In training with drop_prob > 0,
// x * mask with one Bernoulli(keep = 1 - drop_prob) draw per sample (mask (N, 1, ..., 1)),
// divided by keep when scale_by_keep; the identity otherwise. Any layout, any shape (N, *).
class DropPath : public nn::Cloneable<DropPath, Block> {
 public:
  explicit DropPath(double drop_prob = 0, bool scale_by_keep = true, Layout layout = Layout::NCHW);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override { return "drop_prob=" + nn::py_float_repr(drop_prob); }
  double drop_prob;
  bool scale_by_keep;
};

// layer_scale: LayerScale(dim, init_value=1e-5). x * gamma, gamma (dim) along the channel dim
// of the layout: viewed (C, 1, 1) for NCHW maps, the last dim for NHWC maps and tokens.
class LayerScale : public nn::Cloneable<LayerScale, Block> {
 public:
  explicit LayerScale(int64_t dim, double init_value = 1e-5, Layout layout = Layout::NCHW);
  Tensor forward(const Tensor& x) override;
};

// mish: Mish(). x * tanh(softplus(x)), any layout and shape.
class Mish : public nn::Cloneable<Mish, Block> {
 public:
  explicit Mish(Layout layout = Layout::NCHW) : Cloneable(layout, std::nullopt) {}
  Tensor forward(const Tensor& x) override;
};

// gem: GeM(p=3, eps=1e-6, learnable=true). avgpool(clamp(x, eps)^p)^(1/p) over H, W; p (1,)
// a parameter, or a buffer when not learnable. (N, C, H, W) -> (N, C, 1, 1) (NHWC:
// (N, H, W, C) -> (N, 1, 1, C)).
class GeM : public nn::Cloneable<GeM, MapBlock> {
 public:
  explicit GeM(double p = 3, double eps = 1e-6, bool learnable = true, Layout layout = Layout::NCHW);
  std::string extra_repr() const override;
  double eps;

 protected:
  Tensor forward_map(const Tensor& x) override;
};

}  // namespace tvc::hybrid
