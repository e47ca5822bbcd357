// Building blocks of torchvision.ops (misc.py, stochastic_depth.py) shared by the model families,
// with torchvision's child names so that state_dict keys match.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tvc/nn/containers.h"
#include "tvc/nn/layers.h"

namespace tvc::models::detail {

// torchvision's _make_divisible(v, divisor): v rounded to the nearest multiple of divisor (at
// least divisor), one multiple up when that rounds v down by more than 10%.
int64_t make_divisible(double v, int64_t divisor);

// torchvision.ops.Conv2dNormActivation: "0" Conv2d (kernel k, padding (k - 1) / 2 unless given,
// no bias unless asked), "1" the norm (BatchNorm2d with the given options, or a norm module),
// "2" the activation when there is one. (N, in, H, W) -> (N, out, H/s, W/s).
class Conv2dNormActivation : public nn::Cloneable<Conv2dNormActivation, nn::Sequential> {
 public:
  struct Conv {
    int64_t kernel = 3;
    int64_t stride = 1;
    int64_t groups = 1;
    std::optional<int64_t> padding{};  // default (kernel - 1) / 2
    bool bias = false;
  };
  Conv2dNormActivation(int64_t in, int64_t out, Conv conv, const nn::BatchNormOptions& norm, nn::ModulePtr activation);
  Conv2dNormActivation(int64_t in, int64_t out, Conv conv, nn::ModulePtr norm, nn::ModulePtr activation);
};

// The stage nodes of a `features` Sequential from the stride of each child: the child before
// each later child that downsamples (stride > 1; the stem, child 0, is not counted) and the last
// child, as "features.K" -- the last block of each resolution stage.
std::vector<std::string> stride_stage_nodes(const std::vector<int64_t>& strides);

// torchvision.ops.SqueezeExcitation: x * scale_activation(fc2(activation(fc1(avgpool(x))))),
// fc1 and fc2 1x1 convolutions with bias (children avgpool, fc1, fc2, activation,
// scale_activation). (N, C, H, W) -> (N, C, H, W).
class SqueezeExcitation : public nn::Cloneable<SqueezeExcitation> {
 public:
  SqueezeExcitation(int64_t input_channels, int64_t squeeze_channels, nn::ModulePtr activation,
                    nn::ModulePtr scale_activation);
  Tensor forward(const Tensor& x) override;  // scale(x) * x
  // scale_activation(fc2(activation(fc1(avgpool(x))))): (N, C, H, W) -> (N, C, 1, 1).
  Tensor scale(const Tensor& x);
};

// An inverted-residual body (MobileNet v2's "conv", v3's "block", EfficientNet's MBConv "block")
// plus residual (undefined: nothing added): when it is a plain Sequential, its children in order,
// as its forward runs them, except that a SqueezeExcitation followed by a Conv2dNormActivation
// hands its scale to that layer (nn::conv_norm_activation's input_scale, which in inference folds
// it into a pointwise convolution's weights) instead of multiplying the map by it, and that the
// residual goes into the body's last convolution and norm (its last two children, a Conv2d and a
// BatchNorm2d, or its last child, a Conv2dNormActivation of those two without hooks), added in
// their fused kernel rather than in a pass of its own. Any other module, or a body or
// squeeze-excitation with hooks, runs as it is, and the residual is added to its output.
Tensor run_inverted_residual_body(nn::Module& body, const Tensor& x, const Tensor& residual = Tensor());

// torchvision.ops.StochasticDepth: in training mode with p > 0, x times a Bernoulli(1 - p) mask
// divided by 1 - p, one draw per sample (mode "row", shape (N, 1, ...)) or one for the batch
// ("batch"); the identity otherwise. p in [0, 1].
class StochasticDepth : public nn::Cloneable<StochasticDepth> {
 public:
  StochasticDepth(double p, std::string mode);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double p;
  std::string mode;
};

// torchvision.ops.Permute: x.permute(dims).
class Permute : public nn::Cloneable<Permute> {
 public:
  explicit Permute(std::vector<int64_t> dims) : dims(std::move(dims)) {}
  Tensor forward(const Tensor& x) override { return x.permute(dims); }
  std::vector<int64_t> dims;
};

// torchvision.ops.MLP with GELU and no norm: for each hidden size but the last, Linear,
// activation, Dropout(dropout); then Linear to the last size and Dropout(dropout). ViT's
// MLPBlock and Swin's MLP: keys "0.weight", "3.weight". (*, in) -> (*, hidden.back()).
std::shared_ptr<nn::Sequential> gelu_mlp(int64_t in_channels, const std::vector<int64_t>& hidden_channels,
                                         double dropout);

}  // namespace tvc::models::detail
