// ConvNeXt tiny/small/base/large, as torchvision's models/convnext.py builds them.
//
//   x (N, 3, H, W) -> features.0: 4x4/4 convolution (bias) + LayerNorm2d       (N, C1, H/4, W/4)
//     -> features.1: C1 blocks -> features.2: LayerNorm2d + 2x2/2 convolution  (N, C2, H/8, W/8)
//     -> features.3 -> features.4 -> features.5 -> features.6 -> features.7    (N, C4, H/32, W/32)
//     -> avgpool (1x1) -> classifier: LayerNorm2d, Flatten, Linear(C4, num_classes)
// A block (CNBlock) keeps (N, C, H, W): "block" = depthwise 7x7 convolution (bias), permute to
// (N, H, W, C), LayerNorm(C, eps 1e-6), Linear(C, 4C), GELU, Linear(4C, C), permute back; then
// x + stochastic_depth(layer_scale * block(x)), layer_scale a (C, 1, 1) parameter (1e-6 at
// initialisation). LayerNorm2d normalises over C of an NCHW tensor (eps 1e-6). The
// stochastic-depth rate of block i of all N blocks is p * i / (N - 1), p = 0.1 (tiny), 0.4
// (small), 0.5 (base, large).
#include "registry.h"
#include "torchvision_ops.h"
#include "tvc/nn/init.h"
#include "tvc/ops.h"

namespace tvc::models {

namespace {

// LayerNorm over the channels of (N, C, H, W): permuted to NHWC, normalised, permuted back.
class LayerNorm2d : public nn::Cloneable<LayerNorm2d, nn::LayerNorm> {
 public:
  explicit LayerNorm2d(int64_t channels) : Cloneable(channels, 1e-6) {}
  Tensor forward(const Tensor& x) override {
    Tensor y = layer_norm(x.permute({0, 2, 3, 1}), normalized_shape, weight(), bias(), eps.to_double());
    return y.permute({0, 3, 1, 2});
  }
};

class CNBlock : public nn::Cloneable<CNBlock> {
 public:
  CNBlock(int64_t dim, double layer_scale, double stochastic_depth_prob) {
    auto block = std::make_shared<nn::Sequential>();
    block->append(std::make_shared<nn::Conv2d>(dim, dim, 7, nn::ConvOptions{.padding = 3, .groups = dim}));
    block->append(std::make_shared<detail::Permute>(std::vector<int64_t>{0, 2, 3, 1}));
    block->append(std::make_shared<nn::LayerNorm>(dim, 1e-6));
    block->append(std::make_shared<nn::Linear>(dim, 4 * dim));
    block->append(std::make_shared<nn::GELU>());
    block->append(std::make_shared<nn::Linear>(4 * dim, dim));
    block->append(std::make_shared<detail::Permute>(std::vector<int64_t>{0, 3, 1, 2}));
    register_module("block", block);
    register_parameter("layer_scale", full({dim, 1, 1}, layer_scale));
    register_module("stochastic_depth", std::make_shared<detail::StochasticDepth>(stochastic_depth_prob, "row"));
  }

  Tensor forward(const Tensor& x) override {
    Tensor result = parameter("layer_scale") * child("block")(x);
    return child("stochastic_depth")(result) + x;
  }
};

// A stage: channels, and the channels after the downsampling layer that follows (0: none).
struct StageConfig {
  int64_t channels, out_channels, num_layers;
};

class ConvNeXt : public nn::Cloneable<ConvNeXt, Backbone> {
 public:
  ConvNeXt(std::string name, const std::vector<StageConfig>& stages, double stochastic_depth_prob, int64_t num_classes)
      : Cloneable(std::move(name)) {
    constexpr double kLayerScale = 1e-6;
    auto features = std::make_shared<nn::Sequential>();
    std::vector<int64_t> strides;
    const int64_t first = stages.front().channels;
    features->append(std::make_shared<detail::Conv2dNormActivation>(
        3, first, detail::Conv2dNormActivation::Conv{.kernel = 4, .stride = 4, .padding = 0, .bias = true},
        std::make_shared<LayerNorm2d>(first), nullptr));
    strides.push_back(4);
    int64_t total_blocks = 0;
    for (const StageConfig& cnf : stages) total_blocks += cnf.num_layers;
    int64_t block_id = 0;
    for (const StageConfig& cnf : stages) {
      auto stage = std::make_shared<nn::Sequential>();
      for (int64_t i = 0; i < cnf.num_layers; ++i, ++block_id) {
        double sd_prob =
            stochastic_depth_prob * static_cast<double>(block_id) / (static_cast<double>(total_blocks) - 1.0);
        stage->append(std::make_shared<CNBlock>(cnf.channels, kLayerScale, sd_prob));
      }
      features->append(stage);
      strides.push_back(1);
      if (cnf.out_channels > 0) {
        features->append(std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
            std::make_shared<LayerNorm2d>(cnf.channels),
            std::make_shared<nn::Conv2d>(cnf.channels, cnf.out_channels, 2, nn::ConvOptions{.stride = 2})}));
        strides.push_back(2);
      }
    }
    stages_ = detail::stride_stage_nodes(strides);
    const int64_t last = stages.back().out_channels > 0 ? stages.back().out_channels : stages.back().channels;
    register_module("features", features);
    register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
    register_module("classifier", std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                                      std::make_shared<LayerNorm2d>(last), std::make_shared<nn::Flatten>(1),
                                      std::make_shared<nn::Linear>(last, num_classes)}));
    // torchvision: trunc_normal_(std 0.02) for convolution and Linear weights, zero biases.
    for (const auto& m : modules()) {
      Tensor weight, bias;
      if (auto* conv = dynamic_cast<nn::Conv2d*>(m.get()))
        weight = conv->weight(), bias = conv->bias();
      else if (auto* linear = dynamic_cast<nn::Linear*>(m.get()))
        weight = linear->weight(), bias = linear->bias();
      else
        continue;
      nn::init::trunc_normal_(weight, 0, 0.02);
      if (bias.defined()) nn::init::zeros_(bias);
    }
  }

  Tensor forward(const Tensor& x) override {
    Tensor out = child("avgpool")(child("features")(x));  // (N, C4, 1, 1)
    return child("classifier")(out);                      // (N, num_classes)
  }

  // The last block of each resolution stage: features.1 (H/4), .3 (H/8), .5 (H/16), .7 (H/32).
  std::vector<std::string> stage_nodes() const override { return stages_; }

 private:
  std::vector<std::string> stages_;
};

detail::ModelSpec convnext(const std::string& name, std::vector<StageConfig> stages, double stochastic_depth_prob) {
  return {.name = name,
          .make = [name, stages, stochastic_depth_prob](const Options& o) -> BackbonePtr {
            return std::make_shared<ConvNeXt>(name, stages, stochastic_depth_prob, *o.num_classes);
          },
          .classifier = "classifier.2"};
}

}  // namespace

namespace detail {

std::vector<ModelSpec> convnext_models() {
  return {
      convnext("convnext_tiny", {{96, 192, 3}, {192, 384, 3}, {384, 768, 9}, {768, 0, 3}}, 0.1),
      convnext("convnext_small", {{96, 192, 3}, {192, 384, 3}, {384, 768, 27}, {768, 0, 3}}, 0.4),
      convnext("convnext_base", {{128, 256, 3}, {256, 512, 3}, {512, 1024, 27}, {1024, 0, 3}}, 0.5),
      convnext("convnext_large", {{192, 384, 3}, {384, 768, 3}, {768, 1536, 27}, {1536, 0, 3}}, 0.5),
  };
}

}  // namespace detail

}  // namespace tvc::models
