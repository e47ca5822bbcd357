// EfficientNet B0-B7 and V2 S/M/L, as torchvision's models/efficientnet.py builds them.
//
//   x (N, 3, H, W) -> features.0: 3x3/2 convolution + BatchNorm + SiLU        (N, C0, H/2, W/2)
//     -> features.1..S: one Sequential of blocks per row of the variant's table (the first
//        block of a row has the row's stride and channels, the others stride 1)
//     -> features.S+1: 1x1 convolution + BatchNorm + SiLU                    (N, L, H/32, W/32)
//     -> avgpool (1x1) -> flatten -> classifier: Dropout(p) -> Linear(L, num_classes)
// with L = 4 * the last row's channels (v1) or 1280 (v2). Blocks (children "block" and
// "stochastic_depth"), each (N, in, H, W) -> (N, out, H/s, W/s):
//   MBConv:      [1x1 expansion + BN + SiLU], depthwise kxk/s + BN + SiLU, squeeze-excitation
//                (SiLU, sigmoid; squeeze channels max(1, in / 4)), 1x1 projection + BN;
//   FusedMBConv: kxk/s expansion + BN + SiLU then 1x1 projection + BN, or (expansion 1) one
//                kxk/s convolution + BN + SiLU;
// plus the input, through stochastic depth, when s == 1 and in == out. The stochastic-depth
// rate of block i of all N blocks is 0.2 * i / N (identity in eval mode, per-sample drop in
// training). v1 scales channels by width_mult (rounded to multiples of 8) and block counts by
// depth_mult (rounded up); BatchNorm is PyTorch's default except eps 1e-3, momentum 0.01 for
// B5-B7 and eps 1e-3 for V2.
#include <cmath>

#include "registry.h"
#include "torchvision_ops.h"
#include "tvc/nn/init.h"

namespace tvc::models {

namespace {

using detail::Conv2dNormActivation;
using detail::make_divisible;

// A row of torchvision's table: expansion ratio, kernel, stride of the first block, input and
// output channels (already width-adjusted), blocks (already depth-adjusted), block type.
struct StageConfig {
  double expand_ratio;
  int64_t kernel, stride, input_channels, out_channels, num_layers;
  bool fused;
};

struct EfficientNetConfig {
  std::vector<StageConfig> stages;
  double dropout;
  std::optional<int64_t> last_channel;  // default 4 * the last row's output channels
  nn::BatchNormOptions norm;
};

std::shared_ptr<nn::SiLU> silu() { return std::make_shared<nn::SiLU>(); }

// MBConv or FusedMBConv.
class MBConv : public nn::Cloneable<MBConv> {
 public:
  MBConv(const StageConfig& cnf, double stochastic_depth_prob, const nn::BatchNormOptions& norm)
      : use_res_connect_(cnf.stride == 1 && cnf.input_channels == cnf.out_channels) {
    TVC_CHECK(cnf.stride == 1 || cnf.stride == 2, "MBConv: illegal stride value ", cnf.stride);
    const int64_t expanded = make_divisible(static_cast<double>(cnf.input_channels) * cnf.expand_ratio, 8);
    auto block = std::make_shared<nn::Sequential>();
    using Conv = Conv2dNormActivation::Conv;
    if (cnf.fused) {
      if (expanded != cnf.input_channels) {
        block->append(std::make_shared<Conv2dNormActivation>(
            cnf.input_channels, expanded, Conv{.kernel = cnf.kernel, .stride = cnf.stride}, norm, silu()));
        block->append(
            std::make_shared<Conv2dNormActivation>(expanded, cnf.out_channels, Conv{.kernel = 1}, norm, nullptr));
      } else {
        block->append(std::make_shared<Conv2dNormActivation>(
            cnf.input_channels, cnf.out_channels, Conv{.kernel = cnf.kernel, .stride = cnf.stride}, norm, silu()));
      }
    } else {
      if (expanded != cnf.input_channels)
        block->append(
            std::make_shared<Conv2dNormActivation>(cnf.input_channels, expanded, Conv{.kernel = 1}, norm, silu()));
      block->append(std::make_shared<Conv2dNormActivation>(
          expanded, expanded, Conv{.kernel = cnf.kernel, .stride = cnf.stride, .groups = expanded}, norm, silu()));
      block->append(std::make_shared<detail::SqueezeExcitation>(expanded, std::max<int64_t>(1, cnf.input_channels / 4),
                                                                std::make_shared<nn::SiLU>(true),
                                                                std::make_shared<nn::Sigmoid>()));
      block->append(
          std::make_shared<Conv2dNormActivation>(expanded, cnf.out_channels, Conv{.kernel = 1}, norm, nullptr));
    }
    register_module("block", block);
    register_module("stochastic_depth", std::make_shared<detail::StochasticDepth>(stochastic_depth_prob, "row"));
  }

  Tensor forward(const Tensor& x) override {
    // In evaluation mode (or with p = 0) stochastic depth is the identity, and the residual goes
    // into the block's last convolution.
    auto& depth = static_cast<detail::StochasticDepth&>(child("stochastic_depth"));
    if (use_res_connect_ && (!depth.is_training() || depth.p == 0) && !depth.has_call_hooks())
      return detail::run_inverted_residual_body(child("block"), x, x);
    Tensor result = detail::run_inverted_residual_body(child("block"), x);
    if (use_res_connect_) result = depth(result) + x;
    return result;
  }

 private:
  bool use_res_connect_;
};

class EfficientNet : public nn::Cloneable<EfficientNet, Backbone> {
 public:
  EfficientNet(std::string name, const EfficientNetConfig& config, int64_t num_classes, double dropout)
      : Cloneable(std::move(name)) {
    constexpr double kStochasticDepthProb = 0.2;
    const nn::BatchNormOptions& norm = config.norm;
    auto features = std::make_shared<nn::Sequential>();
    std::vector<int64_t> strides;
    features->append(std::make_shared<Conv2dNormActivation>(3, config.stages.front().input_channels,
                                                            Conv2dNormActivation::Conv{.stride = 2}, norm, silu()));
    strides.push_back(2);
    int64_t total_blocks = 0;
    for (const StageConfig& cnf : config.stages) total_blocks += cnf.num_layers;
    int64_t block_id = 0;
    for (const StageConfig& cnf : config.stages) {
      auto stage = std::make_shared<nn::Sequential>();
      for (int64_t i = 0; i < cnf.num_layers; ++i, ++block_id) {
        StageConfig block = cnf;
        if (i > 0) block.input_channels = block.out_channels, block.stride = 1;
        double sd_prob = kStochasticDepthProb * static_cast<double>(block_id) / static_cast<double>(total_blocks);
        stage->append(std::make_shared<MBConv>(block, sd_prob, norm));
      }
      features->append(stage);
      strides.push_back(cnf.stride);
    }
    const int64_t last_in = config.stages.back().out_channels;
    const int64_t last_out = config.last_channel.value_or(4 * last_in);
    features->append(std::make_shared<Conv2dNormActivation>(last_in, last_out, Conv2dNormActivation::Conv{.kernel = 1},
                                                            norm, silu()));
    strides.push_back(1);
    stages_ = detail::stride_stage_nodes(strides);
    register_module("features", features);
    register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
    register_module("classifier", std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                                      std::make_shared<nn::Dropout>(dropout, true),
                                      std::make_shared<nn::Linear>(last_out, num_classes)}));
    // torchvision: kaiming_normal_(fan_out) for convolutions and zero biases, BatchNorm weight 1
    // and bias 0, Linear U(-1/sqrt(out), 1/sqrt(out)) and bias 0.
    for (const auto& m : modules()) {
      if (auto* conv = dynamic_cast<nn::Conv2d*>(m.get())) {
        nn::init::kaiming_normal_(conv->weight(), 0, FanMode::FanOut);
        if (conv->bias().defined()) nn::init::zeros_(conv->bias());
      } else if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(m.get())) {
        nn::init::ones_(bn->weight());
        nn::init::zeros_(bn->bias());
      } else if (auto* linear = dynamic_cast<nn::Linear*>(m.get())) {
        double range = 1.0 / std::sqrt(static_cast<double>(linear->out_features));
        nn::init::uniform_(linear->weight(), -range, range);
        nn::init::zeros_(linear->bias());
      }
    }
  }

  Tensor forward(const Tensor& x) override {
    Tensor out = child("avgpool")(child("features")(x)).flatten(1);  // (N, L)
    return child("classifier")(out);                                 // (N, num_classes)
  }

  // The last block of each resolution stage (H/2 ... H/32), e.g. efficientnet_b0: features.1,
  // .2, .3, .5, .8.
  std::vector<std::string> stage_nodes() const override { return stages_; }

 private:
  std::vector<std::string> stages_;
};

// v1's table scaled by width_mult (channels) and depth_mult (blocks).
std::vector<StageConfig> v1_stages(double width_mult, double depth_mult) {
  struct Row {
    double expand_ratio;
    int64_t kernel, stride, input_channels, out_channels, num_layers;
  };
  const Row rows[] = {{1, 3, 1, 32, 16, 1},  {6, 3, 2, 16, 24, 2},   {6, 5, 2, 24, 40, 2},  {6, 3, 2, 40, 80, 3},
                      {6, 5, 1, 80, 112, 3}, {6, 5, 2, 112, 192, 4}, {6, 3, 1, 192, 320, 1}};
  auto width = [width_mult](int64_t c) { return make_divisible(static_cast<double>(c) * width_mult, 8); };
  std::vector<StageConfig> stages;
  for (const Row& r : rows)
    stages.push_back({r.expand_ratio, r.kernel, r.stride, width(r.input_channels), width(r.out_channels),
                      static_cast<int64_t>(std::ceil(static_cast<double>(r.num_layers) * depth_mult)), false});
  return stages;
}

detail::ModelSpec efficientnet(const std::string& name, const EfficientNetConfig& config) {
  return {.name = name,
          .make = [name, config](const Options& o) -> BackbonePtr {
            return std::make_shared<EfficientNet>(name, config, *o.num_classes, o.dropout.value_or(config.dropout));
          },
          .has_dropout = true,
          .default_dropout = config.dropout,
          .classifier = "classifier.1"};
}

detail::ModelSpec efficientnet_v1(const std::string& name, double width_mult, double depth_mult, double dropout,
                                  nn::BatchNormOptions norm = {}) {
  return efficientnet(name, {v1_stages(width_mult, depth_mult), dropout, std::nullopt, norm});
}

detail::ModelSpec efficientnet_v2(const std::string& name, std::vector<StageConfig> stages, double dropout) {
  return efficientnet(name, {std::move(stages), dropout, 1280, {.eps = 1e-3}});
}

}  // namespace

namespace detail {

std::vector<ModelSpec> efficientnet_models() {
  const nn::BatchNormOptions b5_to_b7_norm{.eps = 1e-3, .momentum = 0.01};
  // V2 rows: expansion, kernel, stride, in, out, blocks, fused.
  return {
      efficientnet_v1("efficientnet_b0", 1.0, 1.0, 0.2),
      efficientnet_v1("efficientnet_b1", 1.0, 1.1, 0.2),
      efficientnet_v1("efficientnet_b2", 1.1, 1.2, 0.3),
      efficientnet_v1("efficientnet_b3", 1.2, 1.4, 0.3),
      efficientnet_v1("efficientnet_b4", 1.4, 1.8, 0.4),
      efficientnet_v1("efficientnet_b5", 1.6, 2.2, 0.4, b5_to_b7_norm),
      efficientnet_v1("efficientnet_b6", 1.8, 2.6, 0.5, b5_to_b7_norm),
      efficientnet_v1("efficientnet_b7", 2.0, 3.1, 0.5, b5_to_b7_norm),
      efficientnet_v2("efficientnet_v2_s",
                      {{1, 3, 1, 24, 24, 2, true},
                       {4, 3, 2, 24, 48, 4, true},
                       {4, 3, 2, 48, 64, 4, true},
                       {4, 3, 2, 64, 128, 6, false},
                       {6, 3, 1, 128, 160, 9, false},
                       {6, 3, 2, 160, 256, 15, false}},
                      0.2),
      efficientnet_v2("efficientnet_v2_m",
                      {{1, 3, 1, 24, 24, 3, true},
                       {4, 3, 2, 24, 48, 5, true},
                       {4, 3, 2, 48, 80, 5, true},
                       {4, 3, 2, 80, 160, 7, false},
                       {6, 3, 1, 160, 176, 14, false},
                       {6, 3, 2, 176, 304, 18, false},
                       {6, 3, 1, 304, 512, 5, false}},
                      0.3),
      efficientnet_v2("efficientnet_v2_l",
                      {{1, 3, 1, 32, 32, 4, true},
                       {4, 3, 2, 32, 64, 7, true},
                       {4, 3, 2, 64, 96, 7, true},
                       {4, 3, 2, 96, 192, 10, false},
                       {6, 3, 1, 192, 224, 19, false},
                       {6, 3, 2, 224, 384, 25, false},
                       {6, 3, 1, 384, 640, 7, false}},
                      0.4),
  };
}

}  // namespace detail

}  // namespace tvc::models
