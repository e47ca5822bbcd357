// DenseNet-BC 121/161/169/201 as torchvision's models/densenet.py builds them (growth rate k,
// bn_size 4, drop_rate 0, memory_efficient False).
//
//   x (N, 3, H, W) -> features: conv0 7x7/2 -> norm0 -> relu0 -> pool0 3x3/2     (N, C0, H/4, W/4)
//     -> denseblock1 -> transition1 (/2) -> denseblock2 -> transition2 (/2)
//     -> denseblock3 -> transition3 (/2) -> denseblock4 -> norm5                  (N, C, H/32, W/32)
//     -> relu -> adaptive_avg_pool2d(1) -> flatten -> classifier                  (N, num_classes)
// A dense layer maps the concatenation of all earlier features of its block (N, Cin + i*k, H, W)
// through norm1, relu1, conv1 1x1 (-> 4k channels), norm2, relu2, conv2 3x3 (-> k channels); a
// block of L layers returns its input and every layer's output concatenated (N, Cin + L*k, H, W).
// A transition is norm, relu, conv 1x1 halving the channels, avgpool 2x2/2.
#include <array>
#include <regex>

#include "registry.h"
#include "tvc/autograd.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/init.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"

namespace tvc::models {

namespace {

using nn::BatchNorm2d;
using nn::Conv2d;

class DenseLayer : public nn::Cloneable<DenseLayer> {
 public:
  DenseLayer(int64_t num_input_features, int64_t growth_rate, int64_t bn_size) {
    register_module("norm1", std::make_shared<BatchNorm2d>(num_input_features));
    register_module("relu1", std::make_shared<nn::ReLU>(true));
    register_module("conv1", std::make_shared<Conv2d>(num_input_features, bn_size * growth_rate, 1,
                                                      nn::ConvOptions{.stride = 1, .bias = false}));
    register_module("norm2", std::make_shared<BatchNorm2d>(bn_size * growth_rate));
    register_module("relu2", std::make_shared<nn::ReLU>(true));
    register_module("conv2", std::make_shared<Conv2d>(bn_size * growth_rate, growth_rate, 3,
                                                      nn::ConvOptions{.stride = 1, .padding = 1, .bias = false}));
  }

  using Module::operator();
  // The new features (N, k, H, W) from the block's earlier ones, each (N, *, H, W), through the
  // module call (hooks see the list, as torchvision's layer(features) does).
  Tensor operator()(const std::vector<Tensor>& prev_features) {
    return call(prev_features,
                [this](const nn::TensorList& features) { return nn::TensorList{features_of(features)}; })[0];
  }
  Tensor forward(const Tensor& x) override { return features_of({x}); }

 private:
  Tensor features_of(const std::vector<Tensor>& prev_features) const {
    Tensor normed = nn::concat_norm_activation(child("norm1"), &child("relu1"), prev_features);
    return child("conv2")(nn::conv_norm_activation(child("conv1"), child("norm2"), &child("relu2"), normed));
  }
};

class DenseBlock : public nn::Cloneable<DenseBlock> {
 public:
  DenseBlock(int64_t num_layers, int64_t num_input_features, int64_t bn_size, int64_t growth_rate) {
    for (int64_t i = 0; i < num_layers; ++i)
      register_module("denselayer" + std::to_string(i + 1),
                      std::make_shared<DenseLayer>(num_input_features + i * growth_rate, growth_rate, bn_size));
  }

  // (N, Cin, H, W) -> (N, Cin + L*k, H, W). Where nothing records gradients and the input is
  // NCHW-contiguous, the features are kept in the result itself, each layer's copied into its
  // channels as it comes: every layer's list is then adjacent channel slices of one tensor (their
  // norm and ReLU one pass, nn::concat_norm_activation) and no concatenation is left at the end
  // (a layer whose output does not fit its place ends that: the rest as before). The values are
  // the concatenation's either way.
  Tensor forward(const Tensor& init_features) override {
    std::vector<Tensor> features = {init_features};
    Tensor all = kept_features(init_features);
    if (all.defined()) features[0] = all.narrow(1, 0, init_features.size(1)).copy_(init_features);
    int64_t first = init_features.size(1);
    for (const auto& [name, layer] : named_children()) {
      DenseLayer& dense = child_as<DenseLayer>(name);
      // Kept features are adjacent channels of `all`: a layer without hooks (none to see the list)
      // takes them as the one slice they make, the same values, rather than a list that grows
      // with the block and is checked and joined again by every layer's norm.
      const Tensor y = all.defined() && !dense.has_call_hooks() ? dense({all.narrow(1, 0, first)}) : dense(features);
      if (all.defined() && y.dim() == 4 && y.size(0) == all.size(0) && y.size(2) == all.size(2) &&
          y.size(3) == all.size(3) && y.dtype() == all.dtype() && y.device() == all.device() &&
          first + y.size(1) <= all.size(1)) {
        features.push_back(all.narrow(1, first, y.size(1)).copy_(y));
        first += y.size(1);
        continue;
      }
      all = Tensor();
      features.push_back(y);
    }
    return all.defined() && first == all.size(1) ? all : cat(features, 1);
  }

 private:
  // The block's result to fill in place (see forward), or undefined where it is not taken: a
  // gradient to record, an input that is not NCHW-contiguous, a layer without its 3x3 Conv2d.
  Tensor kept_features(const Tensor& x) const {
    if (x.dim() != 4 || !x.is_contiguous()) return Tensor();
    if (is_grad_enabled()) {
      if (x.requires_grad()) return Tensor();
      for (const Tensor& p : parameters())
        if (p.requires_grad()) return Tensor();
    }
    int64_t channels = x.size(1);
    for (const auto& [name, layer] : named_children()) {
      const auto* conv = dynamic_cast<const Conv2d*>(&layer->child("conv2"));
      if (!conv) return Tensor();
      channels += conv->out_channels;
    }
    return empty({x.size(0), channels, x.size(2), x.size(3)}, {.dtype = x.dtype(), .device = x.device()});
  }
};

// torchvision's _Transition: a Sequential of norm, relu, conv, pool whose norm and ReLU run as one
// pass (nn::concat_norm_activation, which calls them as modules where that cannot be fused: hooks,
// a replaced child, training), then conv and pool, or in inference pool and conv where those are
// the same function (pools_first). DenseNet-121's three at batch 1, Sapphire Rapids, 2 threads:
// the ReLU's separate pass was 0.11, 0.05 and 0.03 ms, the convolutions 0.73-0.85 ms each.
class Transition : public nn::Cloneable<Transition, nn::Sequential> {
 public:
  Transition(int64_t num_input_features, int64_t num_output_features)
      : Cloneable(std::vector<std::pair<std::string, nn::ModulePtr>>{
            {"norm", std::make_shared<BatchNorm2d>(num_input_features)},
            {"relu", std::make_shared<nn::ReLU>(true)},
            {"conv", std::make_shared<Conv2d>(num_input_features, num_output_features, 1,
                                              nn::ConvOptions{.stride = 1, .bias = false})},
            {"pool", std::make_shared<nn::AvgPool2d>(2, nn::AvgPool2dOptions{.stride = 2})},
        }) {}

  // (N, Cin, H, W) -> (N, Cout, H/2, W/2); a Sequential's forward once its children are not these four.
  Tensor forward(const Tensor& x) override {
    const std::vector<std::string> names = {"norm", "relu", "conv", "pool"};
    std::vector<std::string> children;
    for (const auto& [name, module] : named_children()) children.push_back(name);
    if (children != names) return Sequential::forward(x);
    const Tensor y = nn::concat_norm_activation(child("norm"), &child("relu"), {x});
    return pools_first() ? child("conv")(child("pool")(y)) : child("pool")(child("conv")(y));
  }

 private:
  // A 1x1 convolution of stride 1 without padding and an average pool without padding, ceil mode
  // or divisor (every window whole) commute: each output is the same weighted sum of the same
  // inputs, in another order (a rounding-level difference), and pooling first leaves the
  // convolution a quarter of the positions. Taken in inference (nothing recorded) where neither
  // has hooks (they would see the other order's tensors).
  bool pools_first() const {
    if (is_grad_enabled()) return false;
    const nn::Module& conv_child = child("conv");
    const nn::Module& pool_child = child("pool");
    if (conv_child.has_call_hooks() || pool_child.has_call_hooks()) return false;
    if (typeid(conv_child) != typeid(Conv2d) || typeid(pool_child) != typeid(nn::AvgPool2d)) return false;
    const auto& conv = static_cast<const Conv2d&>(conv_child);
    const auto& pool = static_cast<const nn::AvgPool2d&>(pool_child);
    const std::vector<int64_t> ones = {1, 1}, zeros = {0, 0};
    const std::vector<int64_t> pool_padding = pool.padding.expand(2, "AvgPool2d");
    return conv.kernel_size == ones && conv.stride == ones && conv.dilation == ones && conv.padding == zeros &&
           conv.padding_str.empty() && conv.groups == 1 && pool_padding == zeros && !pool.ceil_mode &&
           !pool.divisor_override;
  }
};

std::shared_ptr<nn::Sequential> transition(int64_t num_input_features, int64_t num_output_features) {
  return std::make_shared<Transition>(num_input_features, num_output_features);
}

// torchvision's _load_state_dict: old weight files name a dense layer's tensors "norm.1.weight",
// "conv.2.weight", ...; these load as "norm1.weight", "conv2.weight".
void rename_old_dense_layer_keys(nn::StateDict& state_dict, const std::string& prefix) {
  static const std::regex pattern(
      R"(^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var))$)");
  nn::StateDict renamed;
  for (const auto& [key, value] : state_dict) {
    std::smatch match;
    if (key.compare(0, prefix.size(), prefix) == 0 && std::regex_match(key, match, pattern))
      renamed.insert(match[1].str() + match[2].str(), value);
    else
      renamed.insert(key, value);
  }
  state_dict = std::move(renamed);
}

struct DenseNetConfig {
  int64_t growth_rate;
  std::array<int64_t, 4> block_config;
  int64_t num_init_features;
};

class DenseNet : public nn::Cloneable<DenseNet, Backbone> {
 public:
  DenseNet(std::string name, const DenseNetConfig& config, int64_t num_classes) : Cloneable(std::move(name)) {
    constexpr int64_t bn_size = 4;
    auto features = std::make_shared<nn::Sequential>(std::vector<std::pair<std::string, nn::ModulePtr>>{
        {"conv0", std::make_shared<Conv2d>(3, config.num_init_features, 7,
                                           nn::ConvOptions{.stride = 2, .padding = 3, .bias = false})},
        {"norm0", std::make_shared<BatchNorm2d>(config.num_init_features)},
        {"relu0", std::make_shared<nn::ReLU>(true)},
        {"pool0", std::make_shared<nn::MaxPool2d>(3, nn::MaxPool2dOptions{.stride = 2, .padding = 1})},
    });
    int64_t num_features = config.num_init_features;
    for (size_t i = 0; i < config.block_config.size(); ++i) {
      int64_t num_layers = config.block_config[i];
      features->register_module("denseblock" + std::to_string(i + 1),
                                std::make_shared<DenseBlock>(num_layers, num_features, bn_size, config.growth_rate));
      num_features += num_layers * config.growth_rate;
      if (i + 1 != config.block_config.size()) {
        features->register_module("transition" + std::to_string(i + 1), transition(num_features, num_features / 2));
        num_features /= 2;
      }
    }
    features->register_module("norm5", std::make_shared<BatchNorm2d>(num_features));
    register_module("features", features);
    register_module("classifier", std::make_shared<nn::Linear>(num_features, num_classes));
    // torchvision: convolutions kaiming_normal_ (fan_in, leaky_relu with slope 0: gain sqrt(2)),
    // BatchNorm weight 1 and bias 0, Linear bias 0 (its weight keeps Linear's own initialisation).
    for (const auto& m : modules()) {
      if (auto* conv = dynamic_cast<Conv2d*>(m.get())) {
        nn::init::kaiming_normal_(conv->weight());
      } else if (auto* bn = dynamic_cast<BatchNorm2d*>(m.get())) {
        nn::init::constant_(bn->weight(), 1);
        nn::init::constant_(bn->bias(), 0);
      } else if (auto* linear = dynamic_cast<nn::Linear*>(m.get())) {
        nn::init::constant_(linear->bias(), 0);
      }
    }
    register_load_state_dict_pre_hook(
        [](Module&, nn::StateDict& state_dict, const std::string& prefix, bool, std::vector<std::string>&,
           std::vector<std::string>&, std::vector<std::string>&) { rename_old_dense_layer_keys(state_dict, prefix); });
  }

  // torchvision applies this ReLU and the pooling as functions (DenseNet has no modules for them).
  Tensor forward(const Tensor& x) override {
    Tensor out = relu(child("features")(x));
    out = adaptive_avg_pool2d(out, {1, 1}).flatten(1);
    return child("classifier")(out);
  }

  // The child of features before each stride-2 change and the last one: features.relu0 (H/2),
  // features.denseblock1 (H/4), .denseblock2 (H/8), .denseblock3 (H/16), .norm5 (H/32).
  std::vector<std::string> stage_nodes() const override {
    return {"features.relu0", "features.denseblock1", "features.denseblock2", "features.denseblock3", "features.norm5"};
  }
};

detail::ModelSpec densenet(const std::string& name, const DenseNetConfig& config) {
  return {.name = name,
          .make = [name, config](const Options& o) -> BackbonePtr {
            return std::make_shared<DenseNet>(name, config, *o.num_classes);
          },
          .classifier = "classifier"};
}

}  // namespace

namespace detail {

// torchvision's DenseNet has no dropout before its classifier (its drop_rate, default 0, is
// dropout after every dense layer), so Options::dropout does not apply.
std::vector<ModelSpec> densenet_models() {
  return {
      densenet("densenet121", {.growth_rate = 32, .block_config = {6, 12, 24, 16}, .num_init_features = 64}),
      densenet("densenet161", {.growth_rate = 48, .block_config = {6, 12, 36, 24}, .num_init_features = 96}),
      densenet("densenet169", {.growth_rate = 32, .block_config = {6, 12, 32, 32}, .num_init_features = 64}),
      densenet("densenet201", {.growth_rate = 32, .block_config = {6, 12, 48, 32}, .num_init_features = 64}),
  };
}

}  // namespace detail

}  // namespace tvc::models
