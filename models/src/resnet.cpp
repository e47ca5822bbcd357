// ResNet, ResNeXt and Wide ResNet, as torchvision's models/resnet.py builds them.
//
//   x (N, 3, H, W) -> conv1 7x7/2 -> bn1 -> relu -> maxpool 3x3/2        (N, 64, H/4, W/4)
//     -> layer1 (stride 1) -> layer2 (/2) -> layer3 (/2) -> layer4 (/2)  (N, 512*e, H/32, W/32)
//     -> avgpool (1x1) -> flatten -> fc                                   (N, num_classes)
// with blocks BasicBlock (two 3x3 convolutions, expansion e = 1) or Bottleneck (1x1, 3x3 with
// the stride and groups, 1x1; e = 4), each adding its input (through `downsample`, a 1x1
// convolution and BatchNorm, where the shape changes) before the last ReLU.
#include <cmath>

#include "registry.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/init.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"

namespace tvc::models {

namespace {

using nn::BatchNorm2d;
using nn::Conv2d;

std::shared_ptr<Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride = 1, int64_t groups = 1) {
  return std::make_shared<Conv2d>(in, out, 3,
                                  nn::ConvOptions{.stride = stride, .padding = 1, .groups = groups, .bias = false});
}

std::shared_ptr<Conv2d> conv1x1(int64_t in, int64_t out, int64_t stride = 1) {
  return std::make_shared<Conv2d>(in, out, 1, nn::ConvOptions{.stride = stride, .bias = false});
}

// relu(norm(conv(out)) + identity), identity = downsample(x) where the block has one, else x:
// the last convolution of both blocks with the residual connection and final ReLU (the block's
// `relu` child), fused in evaluation mode (nn::conv_norm_activation).
Tensor add_identity(const nn::Module& block, const std::string& conv, const std::string& norm, const Tensor& x,
                    const Tensor& out) {
  Tensor identity = block.has_child("downsample") ? block.child("downsample")(x) : x;
  return nn::conv_norm_activation(block.child(conv), block.child(norm), &block.child("relu"), out, identity);
}

class BasicBlock : public nn::Cloneable<BasicBlock> {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, nn::ModulePtr downsample, int64_t groups,
             int64_t base_width) {
    TVC_CHECK(groups == 1 && base_width == 64, "BasicBlock only supports groups=1 and base_width=64");
    register_module("conv1", conv3x3(inplanes, planes, stride));
    register_module("bn1", std::make_shared<BatchNorm2d>(planes));
    register_module("relu", std::make_shared<nn::ReLU>());
    register_module("conv2", conv3x3(planes, planes));
    register_module("bn2", std::make_shared<BatchNorm2d>(planes));
    if (downsample) register_module("downsample", downsample);
  }
  Tensor forward(const Tensor& x) override {
    Tensor out = nn::conv_norm_activation(child("conv1"), child("bn1"), &child("relu"), x);
    return add_identity(*this, "conv2", "bn2", x, out);
  }
};

class Bottleneck : public nn::Cloneable<Bottleneck> {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, nn::ModulePtr downsample, int64_t groups,
             int64_t base_width) {
    int64_t width =
        static_cast<int64_t>(static_cast<double>(planes) * (static_cast<double>(base_width) / 64.0)) * groups;
    register_module("conv1", conv1x1(inplanes, width));
    register_module("bn1", std::make_shared<BatchNorm2d>(width));
    register_module("conv2", conv3x3(width, width, stride, groups));
    register_module("bn2", std::make_shared<BatchNorm2d>(width));
    register_module("conv3", conv1x1(width, planes * kExpansion));
    register_module("bn3", std::make_shared<BatchNorm2d>(planes * kExpansion));
    register_module("relu", std::make_shared<nn::ReLU>());
    if (downsample) register_module("downsample", downsample);
  }
  Tensor forward(const Tensor& x) override {
    Tensor out = nn::conv_norm_activation(child("conv1"), child("bn1"), &child("relu"), x);
    out = nn::conv_norm_activation(child("conv2"), child("bn2"), &child("relu"), out);
    return add_identity(*this, "conv3", "bn3", x, out);
  }
};

struct ResNetConfig {
  bool bottleneck;
  std::array<int64_t, 4> layers;
  int64_t groups = 1;
  int64_t width_per_group = 64;
};

class ResNet : public nn::Cloneable<ResNet, Backbone> {
 public:
  ResNet(std::string name, const ResNetConfig& config, int64_t num_classes) : Cloneable(std::move(name)) {
    register_module("conv1",
                    std::make_shared<Conv2d>(3, 64, 7, nn::ConvOptions{.stride = 2, .padding = 3, .bias = false}));
    register_module("bn1", std::make_shared<BatchNorm2d>(64));
    register_module("relu", std::make_shared<nn::ReLU>());
    register_module("maxpool", std::make_shared<nn::MaxPool2d>(3, nn::MaxPool2dOptions{.stride = 2, .padding = 1}));
    int64_t inplanes = 64;
    int64_t expansion = config.bottleneck ? Bottleneck::kExpansion : BasicBlock::kExpansion;
    const int64_t planes[4] = {64, 128, 256, 512};
    for (int i = 0; i < 4; ++i) {
      int64_t stride = i == 0 ? 1 : 2;
      auto layer = std::make_shared<nn::Sequential>();
      for (int64_t b = 0; b < config.layers[i]; ++b) {
        nn::ModulePtr downsample;
        if (b == 0 && (stride != 1 || inplanes != planes[i] * expansion))
          downsample = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
              conv1x1(inplanes, planes[i] * expansion, stride), std::make_shared<BatchNorm2d>(planes[i] * expansion)});
        int64_t block_stride = b == 0 ? stride : 1;
        if (config.bottleneck)
          layer->append(std::make_shared<Bottleneck>(inplanes, planes[i], block_stride, downsample, config.groups,
                                                     config.width_per_group));
        else
          layer->append(std::make_shared<BasicBlock>(inplanes, planes[i], block_stride, downsample, config.groups,
                                                     config.width_per_group));
        inplanes = planes[i] * expansion;
      }
      register_module("layer" + std::to_string(i + 1), layer);
    }
    register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
    register_module("fc", std::make_shared<nn::Linear>(512 * expansion, num_classes));
    // torchvision: kaiming_normal_(fan_out, relu) for convolutions, BatchNorm weight 1, bias 0.
    for (const auto& m : modules())
      if (auto* conv = dynamic_cast<Conv2d*>(m.get()))
        nn::init::kaiming_normal_(conv->weight(), 0, FanMode::FanOut, Nonlinearity::Relu);
  }

  Tensor forward(const Tensor& x) override {
    Tensor out = nn::conv_norm_activation_max_pool(child("conv1"), child("bn1"), &child("relu"), child("maxpool"), x);
    for (const char* layer : {"layer1", "layer2", "layer3", "layer4"}) out = child(layer)(out);
    out = child("avgpool")(out).flatten(1);
    return child("fc")(out);
  }

  std::vector<std::string> stage_nodes() const override { return {"relu", "layer1", "layer2", "layer3", "layer4"}; }
};

detail::ModelSpec resnet(const std::string& name, const ResNetConfig& config) {
  return {.name = name,
          .make = [name, config](const Options& o) -> BackbonePtr {
            return std::make_shared<ResNet>(name, config, *o.num_classes);
          },
          .classifier = "fc"};
}

}  // namespace

namespace detail {

std::vector<ModelSpec> resnet_models() {
  return {
      resnet("resnet18", {.bottleneck = false, .layers = {2, 2, 2, 2}}),
      resnet("resnet34", {.bottleneck = false, .layers = {3, 4, 6, 3}}),
      resnet("resnet50", {.bottleneck = true, .layers = {3, 4, 6, 3}}),
      resnet("resnet101", {.bottleneck = true, .layers = {3, 4, 23, 3}}),
      resnet("resnet152", {.bottleneck = true, .layers = {3, 8, 36, 3}}),
      resnet("resnext50_32x4d", {.bottleneck = true, .layers = {3, 4, 6, 3}, .groups = 32, .width_per_group = 4}),
      resnet("resnext101_32x8d", {.bottleneck = true, .layers = {3, 4, 23, 3}, .groups = 32, .width_per_group = 8}),
      resnet("resnext101_64x4d", {.bottleneck = true, .layers = {3, 4, 23, 3}, .groups = 64, .width_per_group = 4}),
      resnet("wide_resnet50_2", {.bottleneck = true, .layers = {3, 4, 6, 3}, .width_per_group = 128}),
      resnet("wide_resnet101_2", {.bottleneck = true, .layers = {3, 4, 23, 3}, .width_per_group = 128}),
  };
}

}  // namespace detail

}  // namespace tvc::models
