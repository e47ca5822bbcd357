// The block bases, the layers tvc::nn lacks (ELU, SELU, PReLU, InstanceNorm2d, Dropout2d), the
// library's activation and normalisation factories, and the "other" blocks: DropPath,
// LayerScale, Mish, GeM (see tvc/hybrid/block_modules.h).
#include <cmath>

#include "block_types.h"
#include "tvc/hybrid/block_modules.h"
#include "tvc/ops.h"

namespace tvc::hybrid {

// ---------------------------------------------------------------- bases

Tensor MapBlock::forward(const Tensor& x) {
  TVC_CHECK(layout_ != Layout::Tokens, type_name(), ": a block on feature maps cannot take tokens (N, L, C)");
  TVC_CHECK(x.dim() == 4, type_name(), ": expected a feature map ", layout_name(layout_), ", got shape ", x.shape());
  if (layout_ == Layout::NCHW) return forward_map(x);
  return forward_map(x.permute({0, 3, 1, 2})).permute({0, 2, 3, 1});
}

// ---------------------------------------------------------------- layers tvc::nn lacks

namespace {
// alpha * (exp(x) - 1) where x <= 0, else x; exp of min(x, 0) so that large x give no inf
// (whose gradient, times the zero of the unselected branch, would be NaN).
Tensor elu(const Tensor& x, double alpha) {
  Tensor negative = (exp(clamp(x, std::nullopt, 0.0)) - 1) * alpha;
  return where(x > 0, x, negative);
}
}  // namespace

Tensor ELU::forward(const Tensor& x) { return elu(x, alpha); }

Tensor SELU::forward(const Tensor& x) {
  constexpr double kAlpha = 1.6732632423543772848170429916717;
  constexpr double kScale = 1.0507009873554804934193349852946;
  return elu(x, kAlpha) * kScale;
}

PReLU::PReLU(int64_t num_parameters, double init) : num_parameters(num_parameters) {
  TVC_CHECK(num_parameters >= 1, "PReLU: num_parameters must be positive, got ", num_parameters);
  register_parameter("weight", full({num_parameters}, init));
}

Tensor PReLU::forward(const Tensor& x) {
  Tensor w = parameter("weight");
  if (num_parameters > 1) {
    TVC_CHECK(x.dim() >= 2 && x.size(1) == num_parameters, "PReLU: ", num_parameters,
              " parameters need an input with as many channels (dim 1), got shape ", x.shape());
    Shape shape(static_cast<size_t>(x.dim() - 1), 1);
    shape[0] = num_parameters;
    w = w.view(shape);
  }
  return relu(x) - w * relu(-x);
}

Tensor InstanceNorm2d::forward(const Tensor& x) {
  TVC_CHECK(x.dim() == 4 && x.size(1) == num_features, "InstanceNorm2d(", num_features, "): expected (N, ",
            num_features, ", H, W), got shape ", x.shape());
  return group_norm(x, num_features, Tensor(), Tensor(), 1e-5);
}

std::string InstanceNorm2d::extra_repr() const {
  return std::to_string(num_features) + ", eps=1e-05, momentum=0.1, affine=False, track_running_stats=False";
}

Dropout2d::Dropout2d(double p) : p(p) {
  TVC_CHECK(p >= 0 && p <= 1, "Dropout2d: dropout probability has to be between 0 and 1, but got ", p);
}

Tensor Dropout2d::forward(const Tensor& x) {
  if (!is_training() || p == 0) return x;
  TVC_CHECK(x.dim() == 4, "Dropout2d: expected (N, C, H, W), got shape ", x.shape());
  if (p == 1) return x * 0;
  Tensor keep = bernoulli(full({x.size(0), x.size(1), 1, 1}, 1 - p, {.dtype = x.dtype()}));
  return x * (keep / (1 - p));
}

nn::ModulePtr make_activation(const std::string& name) {
  if (name == "relu") return std::make_shared<nn::ReLU>();
  if (name == "leaky_relu") return std::make_shared<nn::LeakyReLU>(0.01);
  if (name == "prelu") return std::make_shared<PReLU>(1);
  if (name == "gelu") return std::make_shared<nn::GELU>();
  if (name == "silu") return std::make_shared<nn::SiLU>();
  if (name == "sigmoid") return std::make_shared<nn::Sigmoid>();
  if (name == "tanh") return std::make_shared<nn::Tanh>();
  if (name == "elu") return std::make_shared<ELU>(1.0);
  if (name == "selu") return std::make_shared<SELU>();
  TVC_CHECK(false, "unsupported activation function '", name,
            "'; supported activations: elu, gelu, leaky_relu, prelu, relu, selu, sigmoid, silu, tanh");
  return nullptr;
}

nn::ModulePtr make_normalization(const std::string& norm_type, int64_t channels) {
  if (norm_type == "batch") return std::make_shared<nn::BatchNorm2d>(channels);
  if (norm_type == "group") return std::make_shared<nn::GroupNorm>(32, channels);
  if (norm_type == "instance") return std::make_shared<InstanceNorm2d>(channels);
  if (norm_type == "layer") return std::make_shared<nn::LayerNorm>(channels);
  if (norm_type == "none") return std::make_shared<nn::Identity>();
  TVC_CHECK(false, "unsupported normalization type '", norm_type,
            "'; supported types: batch, group, instance, layer, none");
  return nullptr;
}

// ---------------------------------------------------------------- other blocks

DropPath::DropPath(double drop_prob, bool scale_by_keep, Layout layout)
    : Cloneable(layout, std::nullopt), drop_prob(drop_prob), scale_by_keep(scale_by_keep) {
  TVC_CHECK(drop_prob >= 0 && drop_prob <= 1, "DropPath: drop_prob must be in [0, 1], got ", drop_prob);
}

Tensor DropPath::forward(const Tensor& x) {
  if (drop_prob == 0 || !is_training()) return x;
  double keep = 1 - drop_prob;
  Shape shape(static_cast<size_t>(x.dim()), 1);
  shape[0] = x.size(0);
  Tensor mask = bernoulli(full(shape, keep, {.dtype = x.dtype()}));
  // keep = 0 leaves the zero mask as it is (the library divides by 0 and gives NaN).
  if (scale_by_keep && keep > 0) mask = mask / keep;
  return x * mask;
}

LayerScale::LayerScale(int64_t dim, double init_value, Layout layout) : Cloneable(layout, dim) {
  register_parameter("gamma", full({dim}, init_value));
}

Tensor LayerScale::forward(const Tensor& x) {
  Tensor gamma = parameter("gamma");
  int64_t dim = gamma.size(0);
  int64_t channel_dim = layout_ == Layout::NCHW ? 1 : x.dim() - 1;
  TVC_CHECK(x.dim() >= 2 && x.size(channel_dim) == dim, "LayerScale(", dim, "): expected ", layout_name(layout_),
            " with ", dim, " channels, got shape ", x.shape());
  if (layout_ != Layout::NCHW) return x * gamma;
  Shape shape(static_cast<size_t>(x.dim() - 1), 1);
  shape[0] = dim;
  return x * gamma.view(shape);
}

Tensor Mish::forward(const Tensor& x) { return mish(x); }

GeM::GeM(double p, double eps, bool learnable, Layout layout) : Cloneable(layout, std::nullopt), eps(eps) {
  if (learnable)
    register_parameter("p", full({1}, p));
  else
    register_buffer("p", full({1}, p));
}

Tensor GeM::forward_map(const Tensor& x) {
  Tensor p = has_parameter("p") ? parameter("p") : buffer("p");
  Tensor pooled = adaptive_avg_pool2d(pow(clamp(x, eps, std::nullopt), p), {1, 1});
  return pow(pooled, 1.0 / p);
}

std::string GeM::extra_repr() const {
  Tensor p = has_parameter("p") ? parameter("p") : buffer("p");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", p.item_double());
  return std::string("p=") + buf + ", eps=" + nn::py_float_repr(eps);
}

namespace detail {

std::vector<BlockType> other_block_types() {
  const std::vector<Layout> any = {Layout::NCHW, Layout::NHWC, Layout::Tokens};
  return {
      {.name = "drop_path",
       .aliases = {"stochastic_depth", "DropPath"},
       .category = "other",
       .class_name = "DropPath",
       .description = "stochastic depth: drops whole samples in training, scaled by 1/keep",
       .params = {float_param("drop_prob", 0.0), bool_param("scale_by_keep", true)},
       .layouts = any,
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return std::make_shared<DropPath>(a.get_float("drop_prob"), a.get_bool("scale_by_keep"), a.layout());
       }},
      {.name = "layer_scale",
       .category = "other",
       .class_name = "LayerScale",
       .description = "learnable per-channel scale gamma, initialised small",
       .params = {channels_param("dim", ChannelRole::Out), float_param("init_value", 1e-5)},
       .layouts = any,
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return std::make_shared<LayerScale>(a.get_int("dim"), a.get_float("init_value"), a.layout());
       }},
      {.name = "mish",
       .category = "other",
       .class_name = "Mish",
       .description = "Mish activation x * tanh(softplus(x))",
       .layouts = any,
       .make = [](const BlockArgs& a) -> nn::ModulePtr { return std::make_shared<Mish>(a.layout()); }},
      {.name = "gem",
       .aliases = {"GeM"},
       .category = "other",
       .class_name = "GeM",
       .description = "generalized mean pooling to 1x1 with a learnable power p",
       .params = {float_param("p", 3.0), float_param("eps", 1e-6), bool_param("learnable", true)},
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return std::make_shared<GeM>(a.get_float("p"), a.get_float("eps"), a.get_bool("learnable"), a.layout());
       }},
  };
}

}  // namespace detail

}  // namespace tvc::hybrid
