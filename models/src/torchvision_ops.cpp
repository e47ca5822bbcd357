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

Tensor run_inverted_residual_body(nn::Module& module, const Tensor& x, const Tensor& residual) {
  auto plus_residual = [&residual](const Tensor& y) { return residual.defined() ? y + residual : y; };
  if (typeid(module) != typeid(nn::Sequential) || module.has_call_hooks()) return plus_residual(module(x));
  auto& body = static_cast<nn::Sequential&>(module);
  const size_t n = body.size();
  // The child at i when it is a Conv2dNormActivation without hooks, else null.
  auto layer_at = [&body, n](size_t i) -> nn::Sequential* {
    if (i >= n) return nullptr;
    nn::Module& m = *body[i];
    if (typeid(m) != typeid(Conv2dNormActivation) || m.has_call_hooks() || static_cast<nn::Sequential&>(m).size() < 2)
      return nullptr;
    return static_cast<nn::Sequential*>(&m);
  };
  // Such a layer at i whose convolution is depthwise (groups = channels in), else null.
  auto depthwise_at = [&layer_at](size_t i) -> nn::Sequential* {
    nn::Sequential* layer = layer_at(i);
    const auto* conv = layer ? dynamic_cast<const nn::Conv2d*>((*layer)[0].get()) : nullptr;
    return conv && conv->groups > 1 && conv->groups == conv->in_channels ? layer : nullptr;
  };
  auto refs = [](nn::Sequential& layer) {
    return nn::ConvNormActivationRefs{layer[0].get(), layer[1].get(), layer.size() > 2 ? layer[2].get() : nullptr};
  };
  // Whether the children from i are the body's last two, a Conv2d and a BatchNorm2d (v2's projection).
  auto ends_with_conv_and_norm = [&body, n](size_t i) {
    if (i + 2 != n) return false;
    const nn::Module& conv = *body[i];
    const nn::Module& norm = *body[i + 1];
    return typeid(conv) == typeid(nn::Conv2d) && typeid(norm) == typeid(nn::BatchNorm2d);
  };
  // The child at i when it is a SqueezeExcitation without hooks followed by such a layer, else null.
  auto folding_pair = [&body, &layer_at, n](size_t i) -> SqueezeExcitation* {
    if (i + 1 >= n) return nullptr;
    const nn::Module& m = *body[i];
    if (typeid(m) != typeid(SqueezeExcitation) || m.has_call_hooks()) return nullptr;
    return layer_at(i + 1) ? static_cast<SqueezeExcitation*>(body[i].get()) : nullptr;
  };
  // The expansion (where the body has one), the depthwise layer and the projection (v2: a Conv2d
  // and a BatchNorm2d ending the body; v3, EfficientNet: a layer of a convolution and norm ending
  // it) through nn::inverted_residual_layers, the residual (the input) added there; with a
  // squeeze-excitation after the depthwise layer, the expansion and depthwise layer alone.
  Tensor y = x;
  size_t start = 0;  // the first child the loop below runs
  const bool expands = layer_at(0) && !depthwise_at(0) && depthwise_at(1);
  const size_t dw_at = expands ? 1 : 0;
  if (depthwise_at(dw_at) && (!residual.defined() || residual.is_same(x))) {
    const nn::ConvNormActivationRefs expand = expands ? refs(*layer_at(0)) : nn::ConvNormActivationRefs{};
    const nn::ConvNormActivationRefs depthwise = refs(*depthwise_at(dw_at));
    const size_t i = dw_at + 1;
    nn::ConvNormActivationRefs project{};
    if (ends_with_conv_and_norm(i))
      project = {body[i].get(), body[i + 1].get(), nullptr};
    else if (i + 1 == n && layer_at(i) && layer_at(i)->size() == 2)
      project = refs(*layer_at(i));
    if (project.conv) return nn::inverted_residual_layers(expand, depthwise, project, x, residual.defined());
    if (folding_pair(i)) {
      y = nn::inverted_residual_layers(expand, depthwise, {}, x, false);
      start = i;
    }
  }
  // Whether the last child is a layer that can take the residual: a convolution and norm alone
  // (the residual goes in before an activation).
  const bool last_takes_residual = n > 0 && layer_at(n - 1) && layer_at(n - 1)->size() == 2;
  bool any = residual.defined() || start > 0;
  for (size_t i = start; i < n; ++i) any |= folding_pair(i) != nullptr;
  if (!any) return body(x);
  for (size_t i = start; i < n; ++i) {
    // v2's projection: a Conv2d and a BatchNorm2d end the body.
    if (residual.defined() && ends_with_conv_and_norm(i))
      return nn::conv_norm_activation(*body[i], *body[i + 1], nullptr, y, residual);
    SqueezeExcitation* se = folding_pair(i);
    const size_t at = se ? i + 1 : i;  // the layer that takes the scale or the residual
    const bool takes_residual = residual.defined() && at + 1 == n && last_takes_residual;
    if (se || takes_residual) {
      const nn::ModulePtr layer_owner = body[at];  // held while it runs
      auto& layer = static_cast<nn::Sequential&>(*layer_owner);
      nn::Module* activation = layer.size() > 2 ? layer[2].get() : nullptr;
      y = nn::conv_norm_activation(*layer[0], *layer[1], activation, y, takes_residual ? residual : Tensor(),
                                   se ? se->scale(y) : Tensor());
      if (takes_residual) return y;
      i = at;
      continue;
    }
    y = (*body[i])(y);
  }
  return plus_residual(y);
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
