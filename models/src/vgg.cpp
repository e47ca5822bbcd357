// VGG 11/13/16/19 (configurations A, B, D, E), with or without BatchNorm, as torchvision's
// models/vgg.py builds them.
//
//   x (N, 3, H, W) -> features: for each configuration entry, a 3x3 convolution (padding 1,
//                     bias) [-> BatchNorm] -> ReLU, or "M": max pooling 2x2/2   (N, 512, H/32, W/32)
//     -> avgpool (adaptive, 7x7) -> flatten                                    (N, 512*7*7)
//     -> classifier: Linear(25088, 4096) ReLU Dropout Linear(4096, 4096) ReLU Dropout
//                    Linear(4096, num_classes)                                  (N, num_classes)
// features is a Sequential numbered as torchvision's (vgg11: 0 conv, 1 relu, 2 pool, 3 conv...).
#include "registry.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/init.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"

namespace tvc::models {

namespace {

constexpr int64_t M = 0;  // a configuration entry for max pooling; the others are channel counts
using VggConfig = std::vector<int64_t>;

class VGG : public nn::Cloneable<VGG, Backbone> {
 public:
  VGG(std::string name, const VggConfig& config, bool batch_norm, int64_t num_classes, double dropout)
      : Cloneable(std::move(name)) {
    // torchvision's make_layers.
    std::vector<nn::ModulePtr> layers;
    int64_t in_channels = 3;
    for (int64_t v : config) {
      if (v == M) {
        // forward_stages: the child before each pooling, which halves the resolution.
        stages_.push_back("features." + std::to_string(layers.size() - 1));
        layers.push_back(std::make_shared<nn::MaxPool2d>(2, nn::MaxPool2dOptions{.stride = 2}));
        continue;
      }
      layers.push_back(std::make_shared<nn::Conv2d>(in_channels, v, 3, nn::ConvOptions{.padding = 1}));
      if (batch_norm) layers.push_back(std::make_shared<nn::BatchNorm2d>(v));
      layers.push_back(std::make_shared<nn::ReLU>(true));
      in_channels = v;
    }
    // ... and the last child (the final pooling, at H/32).
    stages_.push_back("features." + std::to_string(layers.size() - 1));
    register_module("features", std::make_shared<nn::Sequential>(layers));
    register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(7));
    register_module("classifier", std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                                      std::make_shared<nn::Linear>(512 * 7 * 7, 4096),
                                      std::make_shared<nn::ReLU>(true),
                                      std::make_shared<nn::Dropout>(dropout),
                                      std::make_shared<nn::Linear>(4096, 4096),
                                      std::make_shared<nn::ReLU>(true),
                                      std::make_shared<nn::Dropout>(dropout),
                                      std::make_shared<nn::Linear>(4096, num_classes),
                                  }));
    // torchvision: convolutions kaiming_normal_(fan_out, relu) with zero bias, BatchNorm weight 1
    // and bias 0, Linear N(0, 0.01) with zero bias.
    for (const auto& m : modules()) {
      if (auto* conv = dynamic_cast<nn::Conv2d*>(m.get())) {
        nn::init::kaiming_normal_(conv->weight(), 0, FanMode::FanOut, Nonlinearity::Relu);
        nn::init::constant_(conv->bias(), 0);
      } else if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(m.get())) {
        nn::init::constant_(bn->weight(), 1);
        nn::init::constant_(bn->bias(), 0);
      } else if (auto* linear = dynamic_cast<nn::Linear*>(m.get())) {
        nn::init::normal_(linear->weight(), 0, 0.01);
        nn::init::constant_(linear->bias(), 0);
      }
    }
  }

  Tensor forward(const Tensor& x) override {
    Tensor out = child("avgpool")(child("features")(x)).flatten(1);
    return child("classifier")(out);
  }

  // "features.K" for the child before each max pooling (H, H/2, ..., H/16) and the last pooling
  // (H/32); vgg11: features.1, .4, .9, .14, .19, .20.
  std::vector<std::string> stage_nodes() const override { return stages_; }

 private:
  std::vector<std::string> stages_;
};

detail::ModelSpec vgg(const std::string& name, const VggConfig& config, bool batch_norm) {
  return {.name = name,
          .make = [name, config, batch_norm](const Options& o) -> BackbonePtr {
            return std::make_shared<VGG>(name, config, batch_norm, *o.num_classes, *o.dropout);
          },
          .has_dropout = true,
          .default_dropout = 0.5,
          .classifier = "classifier.6"};
}

}  // namespace

namespace detail {

std::vector<ModelSpec> vgg_models() {
  // torchvision's cfgs "A", "B", "D", "E".
  const VggConfig a = {64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M};
  const VggConfig b = {64, 64, M, 128, 128, M, 256, 256, M, 512, 512, M, 512, 512, M};
  const VggConfig d = {64, 64, M, 128, 128, M, 256, 256, 256, M, 512, 512, 512, M, 512, 512, 512, M};
  const VggConfig e = {64, 64, M, 128, 128, M, 256, 256, 256, 256, M, 512, 512, 512, 512, M, 512, 512, 512, 512, M};
  return {
      vgg("vgg11", a, false), vgg("vgg11_bn", a, true), vgg("vgg13", b, false), vgg("vgg13_bn", b, true),
      vgg("vgg16", d, false), vgg("vgg16_bn", d, true), vgg("vgg19", e, false), vgg("vgg19_bn", e, true),
  };
}

}  // namespace detail

}  // namespace tvc::models
