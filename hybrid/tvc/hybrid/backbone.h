// Backbone analysis: a torchvision model split into stem, stages and head, and its structure.
//
//   auto model = tvc::models::create("resnet50");
//   tvc::hybrid::Tiers t = tvc::hybrid::extract_tiers(*model);   // stem, 4 stages, head
//   std::cout << tvc::hybrid::get_backbone_info(*model).summary();
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tvc/models/models.h"
#include "tvc/nn/module.h"

namespace tvc::hybrid {

// The tiers of a backbone, sharing its modules: head(stages(stem(x))) is the model's own
// forward (functional steps of torchvision's forward, e.g. DenseNet's final ReLU and pooling, and
// ViT's class-token steps, become modules of the stem and head). Stages: layer1..layer4 for the
// ResNet family, [features] for the CNN families, Swin and ConvNeXt, [encoder] for ViT.
struct Tiers {
  nn::ModulePtr stem{};  // Identity where the family has no stem of its own
  std::vector<nn::ModulePtr> stages{};
  nn::ModulePtr head{};  // a Sequential
};
Tiers extract_tiers(const models::Backbone& model);

// The structure of a backbone (the Python library's BackboneInfo, its stage_channels filled).
struct BackboneInfo {
  std::string name{};
  std::vector<std::string> stem_parts{};   // "conv1", "bn1", "relu", "maxpool"
  std::vector<std::string> stage_parts{};  // "layer1", ..., or "features"
  std::vector<std::string> head_parts{};   // "avgpool", "fc"
  int64_t total_params = 0;
  int64_t trainable_params = 0;
  // The channels of each resolution stage's output (HybridModel::get_stage_outputs' stages),
  // measured by one forward pass: resnet50 [256, 512, 1024, 2048].
  std::vector<int64_t> stage_channels{};
  // The Python library's text:
  //   Backbone: resnet50
  //   ----------------------------------------
  //   Stem:   conv1, bn1, relu, maxpool
  //   Stages: layer1, layer2, layer3, layer4
  //   Head:   avgpool, fc
  //   ----------------------------------------
  //   Parameters: 25,557,032
  //   Stage Channels: [256, 512, 1024, 2048]
  std::string summary() const;
};
BackboneInfo get_backbone_info(models::Backbone& model);

}  // namespace tvc::hybrid
