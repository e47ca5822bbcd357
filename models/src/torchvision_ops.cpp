// torchvision.ops building blocks (see torchvision_ops.h).
#include "torchvision_ops.h"

#include <algorithm>

#include "tvc/ops.h"

namespace tvc::models::detail {

int64_t make_divisible(double v, int64_t divisor) {
  int64_t rounded = std::max(divisor, static_cast<int64_t>(v + static_cast<double>(divisor) / 2) / divisor * divisor);
  return static_cast<double>(rounded) < 0.9 * v ? rounded + divisor : rounded;
}

Conv2dNormActivation::Conv2dNormActivation(int64_t in, int64_t out, Conv conv, const nn::BatchNormOptions& norm,
                                           nn::ModulePtr activation)
    : Conv2dNormActivation(in, out, conv, std::make_shared<nn::BatchNorm2d>(out, norm), std::move(activation)) {}

Conv2dNormActivation::Conv2dNormActivation(int64_t in, int64_t out, Conv conv, nn::ModulePtr norm,
                                           nn::ModulePtr activation) {
  append(std::make_shared<nn::Conv2d>(in, out, conv.kernel,
                                      nn::ConvOptions{.stride = conv.stride,
                                                      .padding = conv.padding.value_or((conv.kernel - 1) / 2),
                                                      .groups = conv.groups,
                                                      .bias = conv.bias}));
  append(std::move(norm));
  if (activation) append(std::move(activation));
}

std::vector<std::string> stride_stage_nodes(const std::vector<int64_t>& strides) {
  std::vector<std::string> nodes;
  for (size_t i = 1; i < strides.size(); ++i)
    if (strides[i] > 1) nodes.push_back("features." + std::to_string(i - 1));
  nodes.push_back("features." + std::to_string(strides.size() - 1));
  return nodes;
}

SqueezeExcitation::SqueezeExcitation(int64_t input_channels, int64_t squeeze_channels, nn::ModulePtr activation,
                                     nn::ModulePtr scale_activation) {
  register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  register_module("fc1", std::make_shared<nn::Conv2d>(input_channels, squeeze_channels, 1));
  register_module("fc2", std::make_shared<nn::Conv2d>(squeeze_channels, input_channels, 1));
  register_module("activation", std::move(activation));
  register_module("scale_activation", std::move(scale_activation));
}

Tensor SqueezeExcitation::forward(const Tensor& x) { return scale(x) * x; }

Tensor SqueezeExcitation::scale(const Tensor& x) {
  Tensor s = child("avgpool")(x);                     // (N, C, 1, 1)
  s = child("activation")(child("fc1")(s));           // (N, S, 1, 1)
  return child("scale_activation")(child("fc2")(s));  // (N, C, 1, 1)
}

Tensor run_inverted_residual_body(nn::Module& module, const Tensor& x) {
  if (typeid(module) != typeid(nn::Sequential)) return module(x);
  auto& body = static_cast<nn::Sequential&>(module);
  // The child at i when it is a SqueezeExcitation without hooks followed by a
  // Conv2dNormActivation without hooks, else null.
  auto folding_pair = [&body](size_t i) -> SqueezeExcitation* {
    if (i + 1 >= body.size()) return nullptr;
    nn::Module &m = *body[i], &next = *body[i + 1];
    if (typeid(m) != typeid(SqueezeExcitation) || typeid(next) != typeid(Conv2dNormActivation)) return nullptr;
    if (m.has_call_hooks() || next.has_call_hooks() || static_cast<nn::Sequential&>(next).size() < 2) return nullptr;
    return static_cast<SqueezeExcitation*>(&m);
  };
  bool any = false;
  for (size_t i = 0; i < body.size(); ++i) any |= folding_pair(i) != nullptr;
  if (!any || body.has_call_hooks()) return body(x);
  Tensor y = x;
  for (size_t i = 0; i < body.size(); ++i) {
    if (SqueezeExcitation* se = folding_pair(i)) {
      const nn::ModulePtr layer_owner = body[i + 1];  // held while it runs
      auto& layer = static_cast<nn::Sequential&>(*layer_owner);
      nn::Module* activation = layer.size() > 2 ? layer[2].get() : nullptr;
      y = nn::conv_norm_activation(*layer[0], *layer[1], activation, y, Tensor(), se->scale(y));
      ++i;
      continue;
    }
    y = (*body[i])(y);
  }
  return y;
}

StochasticDepth::StochasticDepth(double p, std::string mode) : p(p), mode(std::move(mode)) {
  TVC_CHECK(p >= 0 && p <= 1, "StochasticDepth: drop probability has to be between 0 and 1, but got ", p);
  TVC_CHECK(this->mode == "row" || this->mode == "batch",
            "StochasticDepth: mode has to be either 'batch' or 'row', but got ", this->mode);
}

Tensor StochasticDepth::forward(const Tensor& x) {
  if (!is_training() || p == 0) return x;
  const double survival = 1 - p;
  Shape size(static_cast<size_t>(x.dim()), 1);
  if (mode == "row") size[0] = x.size(0);
  Tensor noise = bernoulli(full(size, survival, {.dtype = x.dtype(), .device = x.device()}));
  if (survival > 0) noise = noise / survival;
  return x * noise;
}

std::string StochasticDepth::extra_repr() const { return "p=" + nn::py_float_repr(p) + ", mode=" + mode; }

std::shared_ptr<nn::Sequential> gelu_mlp(int64_t in_channels, const std::vector<int64_t>& hidden_channels,
                                         double dropout) {
  auto mlp = std::make_shared<nn::Sequential>();
  int64_t in = in_channels;
  for (size_t i = 0; i + 1 < hidden_channels.size(); ++i) {
    mlp->append(std::make_shared<nn::Linear>(in, hidden_channels[i]));
    mlp->append(std::make_shared<nn::GELU>());
    mlp->append(std::make_shared<nn::Dropout>(dropout));
    in = hidden_channels[i];
  }
  mlp->append(std::make_shared<nn::Linear>(in, hidden_channels.back()));
  mlp->append(std::make_shared<nn::Dropout>(dropout));
  return mlp;
}

}  // namespace tvc::models::detail
