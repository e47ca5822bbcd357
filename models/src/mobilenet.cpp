// MobileNet v2 and v3, as torchvision's models/mobilenetv2.py and models/mobilenetv3.py build them.
//
//   x (N, 3, H, W) -> features.0: 3x3/2 convolution + BatchNorm + activation   (N, 32 | 16, H/2, W/2)
//     -> features.1..n: inverted residual blocks (table below; stride 2 halves H and W)
//     -> features.last: 1x1 convolution + BatchNorm + activation              (N, C, H/32, W/32)
//     -> average pool (1x1) -> flatten -> classifier                          (N, num_classes)
// with C = 1280 (v2), 576 (v3 small), 960 (v3 large) and classifier
//   v2: Dropout(p) -> Linear(1280, num_classes)
//   v3: Linear(C, 1024 | 1280) -> Hardswish -> Dropout(p) -> Linear(1024 | 1280, num_classes).
// An inverted residual block maps (N, in, H, W) to (N, out, H/s, W/s): 1x1 expansion to
// `expanded` channels (absent when expanded == in), depthwise kxk convolution with stride s
// (groups = channels), [v3: squeeze-and-excitation], 1x1 linear projection to `out` channels
// (no activation), plus the input when s == 1 and in == out. Its layers are the Sequential
// "conv" (v2) or "block" (v3): state_dict keys "features.2.conv.0.0.weight" (v2),
// "features.4.block.2.fc1.weight" (v3).
//
// torchvision's width_mult is 1 for every registered model, so the channel counts are the tables'
// (its _make_divisible(c * 1.0, 8) leaves them as they are); _make_divisible still shapes the
// squeeze channels of v3's squeeze-and-excitation. v3 is built with torchvision's defaults
// reduced_tail=False and dilated=False (dilation 1 everywhere).
#include <algorithm>
#include <cstdint>

#include "registry.h"
#include "torchvision_ops.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/init.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"

namespace tvc::models {

namespace {

using nn::BatchNorm2d;
using nn::BatchNormOptions;
using nn::Conv2d;

using detail::Conv2dNormActivation;
using detail::make_divisible;

// Both versions' InvertedResidual: the layers under body_name ("conv" in v2, "block" in v3),
// plus the input when the block keeps the shape (stride 1, in == out).
class InvertedResidual : public nn::Cloneable<InvertedResidual> {
 public:
  InvertedResidual(std::string body_name, std::shared_ptr<nn::Sequential> body, bool use_res_connect)
      : body_name_(std::move(body_name)), use_res_connect_(use_res_connect) {
    register_module(body_name_, std::move(body));
  }
  Tensor forward(const Tensor& x) override {
    return detail::run_inverted_residual_body(child(body_name_), x, use_res_connect_ ? x : Tensor());
  }

 private:
  std::string body_name_;
  bool use_res_connect_;
};

// What both versions share: `features`, pooling, `classifier`, torchvision's initialisation and
// the stage nodes. Each version's constructor registers the children, then calls finish().
class MobileNet : public Backbone {
 public:
  Tensor forward(const Tensor& x) override {
    Tensor out = child("features")(x);  // (N, C, H/32, W/32)
    // v2 pools with adaptive_avg_pool2d(x, (1, 1)), v3 with its `avgpool` module.
    out = has_child("avgpool") ? child("avgpool")(out) : adaptive_avg_pool2d(out, {1, 1});
    return child("classifier")(out.flatten(1));  // (N, C) -> (N, num_classes)
  }

  // The children of `features` before each child of stride 2 (but the stem) and the last one:
  // features.1, .3, .6, .13, .18 (v2), .0, .1, .3, .8, .12 (v3 small), .1, .3, .6, .12, .16
  // (v3 large), at H/2, H/4, H/8, H/16, H/32 -- torchvision's own stage split (blocks marked
  // _is_cn start a stage) named as create_feature_extractor names the blocks' outputs.
  std::vector<std::string> stage_nodes() const override { return stages_; }

 protected:
  explicit MobileNet(std::string name) : Backbone(std::move(name)) {}

  // strides: of each child of `features`, in order.
  void finish(const std::vector<int64_t>& strides) {
    stages_ = detail::stride_stage_nodes(strides);
    // torchvision (both versions): kaiming_normal_(fan_out) for convolutions and zero biases,
    // BatchNorm weight 1 and bias 0, Linear weight N(0, 0.01) and bias 0.
    for (const auto& m : modules()) {
      if (auto* conv = dynamic_cast<Conv2d*>(m.get())) {
        nn::init::kaiming_normal_(conv->weight(), 0, FanMode::FanOut);
        if (conv->bias().defined()) nn::init::zeros_(conv->bias());
      } else if (auto* bn = dynamic_cast<BatchNorm2d*>(m.get())) {
        nn::init::ones_(bn->weight());
        nn::init::zeros_(bn->bias());
      } else if (auto* linear = dynamic_cast<nn::Linear*>(m.get())) {
        nn::init::normal_(linear->weight(), 0, 0.01);
        nn::init::zeros_(linear->bias());
      }
    }
  }

 private:
  std::vector<std::string> stages_;  // stage node names, "features.K"
};

// ---------------------------------------------------------------- v2

class MobileNetV2 : public nn::Cloneable<MobileNetV2, MobileNet> {
 public:
  MobileNetV2(std::string name, int64_t num_classes, double dropout) : Cloneable(std::move(name)) {
    struct Stage {
      int64_t t, c, n, s;  // expansion ratio, output channels, blocks, stride of the first
    };
    const Stage setting[] = {{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                             {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
    const int64_t last_channel = 1280;
    int64_t input_channel = 32;
    auto features = std::make_shared<nn::Sequential>();
    std::vector<int64_t> strides;
    features->append(relu6_block(3, input_channel, {.stride = 2}));
    strides.push_back(2);
    for (const Stage& st : setting) {
      for (int64_t i = 0; i < st.n; ++i) {
        int64_t stride = i == 0 ? st.s : 1;
        features->append(inverted_residual(input_channel, st.c, stride, st.t));
        strides.push_back(stride);
        input_channel = st.c;
      }
    }
    features->append(relu6_block(input_channel, last_channel, {.kernel = 1}));
    strides.push_back(1);
    register_module("features", features);
    register_module("classifier", std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                                      std::make_shared<nn::Dropout>(dropout),
                                      std::make_shared<nn::Linear>(last_channel, num_classes)}));
    finish(strides);
  }

 private:
  static std::shared_ptr<Conv2dNormActivation> relu6_block(int64_t in, int64_t out, Conv2dNormActivation::Conv conv) {
    return std::make_shared<Conv2dNormActivation>(in, out, conv, BatchNormOptions{}, std::make_shared<nn::ReLU6>());
  }

  // conv: [0 expand 1x1 (t != 1)], depthwise 3x3 with the stride, 1x1 Conv2d, BatchNorm2d.
  static std::shared_ptr<InvertedResidual> inverted_residual(int64_t inp, int64_t oup, int64_t stride,
                                                             int64_t expand_ratio) {
    int64_t hidden = inp * expand_ratio;
    auto conv = std::make_shared<nn::Sequential>();
    if (expand_ratio != 1) conv->append(relu6_block(inp, hidden, {.kernel = 1}));
    conv->append(relu6_block(hidden, hidden, {.stride = stride, .groups = hidden}));
    conv->append(std::make_shared<Conv2d>(hidden, oup, 1, nn::ConvOptions{.bias = false}));
    conv->append(std::make_shared<BatchNorm2d>(oup));
    return std::make_shared<InvertedResidual>("conv", conv, stride == 1 && inp == oup);
  }
};

// ---------------------------------------------------------------- v3

// A row of torchvision's InvertedResidualConfig table (dilation 1).
struct BlockConfig {
  int64_t input_channels, kernel, expanded_channels, out_channels;
  bool use_se;
  bool use_hs;  // Hardswish ("HS") or ReLU ("RE")
  int64_t stride;
};

struct MobileNetV3Config {
  std::vector<BlockConfig> blocks;
  int64_t last_channel;
};

class MobileNetV3 : public nn::Cloneable<MobileNetV3, MobileNet> {
 public:
  MobileNetV3(std::string name, const MobileNetV3Config& config, int64_t num_classes, double dropout)
      : Cloneable(std::move(name)) {
    const BatchNormOptions norm{.eps = 0.001, .momentum = 0.01};
    auto features = std::make_shared<nn::Sequential>();
    std::vector<int64_t> strides;
    features->append(std::make_shared<Conv2dNormActivation>(3, config.blocks.front().input_channels,
                                                            Conv2dNormActivation::Conv{.stride = 2}, norm,
                                                            std::make_shared<nn::Hardswish>()));
    strides.push_back(2);
    for (const BlockConfig& cnf : config.blocks) {
      features->append(inverted_residual(cnf, norm));
      strides.push_back(cnf.stride);
    }
    int64_t lastconv_input = config.blocks.back().out_channels;
    int64_t lastconv_output = 6 * lastconv_input;
    features->append(std::make_shared<Conv2dNormActivation>(lastconv_input, lastconv_output,
                                                            Conv2dNormActivation::Conv{.kernel = 1}, norm,
                                                            std::make_shared<nn::Hardswish>()));
    strides.push_back(1);
    register_module("features", features);
    register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
    register_module("classifier", std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                                      std::make_shared<nn::Linear>(lastconv_output, config.last_channel),
                                      std::make_shared<nn::Hardswish>(), std::make_shared<nn::Dropout>(dropout),
                                      std::make_shared<nn::Linear>(config.last_channel, num_classes)}));
    finish(strides);
  }

 private:
  // block: [expand 1x1 (expanded != in)], depthwise kxk with the stride, [SqueezeExcitation],
  // project 1x1 (Conv2dNormActivation without activation).
  static std::shared_ptr<InvertedResidual> inverted_residual(const BlockConfig& cnf, const BatchNormOptions& norm) {
    auto activation = [&]() -> nn::ModulePtr {
      if (cnf.use_hs) return std::make_shared<nn::Hardswish>();
      return std::make_shared<nn::ReLU>();
    };
    int64_t expanded = cnf.expanded_channels;
    auto block = std::make_shared<nn::Sequential>();
    if (expanded != cnf.input_channels)
      block->append(std::make_shared<Conv2dNormActivation>(
          cnf.input_channels, expanded, Conv2dNormActivation::Conv{.kernel = 1}, norm, activation()));
    block->append(std::make_shared<Conv2dNormActivation>(
        expanded, expanded, Conv2dNormActivation::Conv{.kernel = cnf.kernel, .stride = cnf.stride, .groups = expanded},
        norm, activation()));
    if (cnf.use_se)
      block->append(std::make_shared<detail::SqueezeExcitation>(expanded, make_divisible(expanded / 4, 8),
                                                                std::make_shared<nn::ReLU>(),
                                                                std::make_shared<nn::Hardsigmoid>()));
    block->append(std::make_shared<Conv2dNormActivation>(expanded, cnf.out_channels,
                                                         Conv2dNormActivation::Conv{.kernel = 1}, norm, nullptr));
    return std::make_shared<InvertedResidual>("block", block,
                                              cnf.stride == 1 && cnf.input_channels == cnf.out_channels);
  }
};

// torchvision's _mobilenet_v3_conf tables: in, kernel, expanded, out, SE, HS, stride.
const MobileNetV3Config kV3Large = {
    .blocks = {{16, 3, 16, 16, false, false, 1},
               {16, 3, 64, 24, false, false, 2},  // C1
               {24, 3, 72, 24, false, false, 1},
               {24, 5, 72, 40, true, false, 2},  // C2
               {40, 5, 120, 40, true, false, 1},
               {40, 5, 120, 40, true, false, 1},
               {40, 3, 240, 80, false, true, 2},  // C3
               {80, 3, 200, 80, false, true, 1},
               {80, 3, 184, 80, false, true, 1},
               {80, 3, 184, 80, false, true, 1},
               {80, 3, 480, 112, true, true, 1},
               {112, 3, 672, 112, true, true, 1},
               {112, 5, 672, 160, true, true, 2},  // C4
               {160, 5, 960, 160, true, true, 1},
               {160, 5, 960, 160, true, true, 1}},
    .last_channel = 1280,  // C5
};

const MobileNetV3Config kV3Small = {
    .blocks = {{16, 3, 16, 16, true, false, 2},   // C1
               {16, 3, 72, 24, false, false, 2},  // C2
               {24, 3, 88, 24, false, false, 1},
               {24, 5, 96, 40, true, true, 2},  // C3
               {40, 5, 240, 40, true, true, 1},
               {40, 5, 240, 40, true, true, 1},
               {40, 5, 120, 48, true, true, 1},
               {48, 5, 144, 48, true, true, 1},
               {48, 5, 288, 96, true, true, 2},  // C4
               {96, 5, 576, 96, true, true, 1},
               {96, 5, 576, 96, true, true, 1}},
    .last_channel = 1024,  // C5
};

detail::ModelSpec mobilenet_v3(const std::string& name, const MobileNetV3Config& config) {
  return {.name = name,
          .make = [name, config](const Options& o) -> BackbonePtr {
            return std::make_shared<MobileNetV3>(name, config, *o.num_classes, *o.dropout);
          },
          .has_dropout = true,
          .default_dropout = 0.2,
          .classifier = "classifier.3"};
}

}  // namespace

namespace detail {

std::vector<ModelSpec> mobilenet_models() {
  return {
      {.name = "mobilenet_v2",
       .make = [](const Options& o) -> BackbonePtr {
         return std::make_shared<MobileNetV2>("mobilenet_v2", *o.num_classes, *o.dropout);
       },
       .has_dropout = true,
       .default_dropout = 0.2,
       .classifier = "classifier.1"},
      mobilenet_v3("mobilenet_v3_large", kV3Large),
      mobilenet_v3("mobilenet_v3_small", kV3Small),
  };
}

}  // namespace detail

}  // namespace tvc::models
