// How model families join the registry (models/src/registry.cpp): each family file defines one
// function listing its models, and registry.cpp calls them all.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tvc/models/models.h"
#include "tvc/models/weights.h"

namespace tvc::models::detail {

struct ModelSpec {
  std::string name;  // torchvision's name ("resnet50")
  // A randomly initialised model (torchvision's initialisation) for num_classes, dropout and
  // image_size (each unset when the family has no such option; options.weights is ignored here).
  std::function<BackbonePtr(const Options& options)> make;
  bool has_dropout = false;    // whether Options::dropout applies
  double default_dropout = 0;  // torchvision's default, where has_dropout
  // The state_dict prefix of the final classifier layer ("fc", "classifier.6"): these tensors
  // are skipped when weights for 1000 classes load into a model with another num_classes.
  std::string classifier;
  // torchvision's default image_size, for the models built for one input size (ViT: 224);
  // unset: Options::image_size does not apply.
  std::optional<int64_t> default_image_size{};
};

// Loads state (from report.file) into model as load_weights does: a classifier of another size
// keeps its initial values and is listed in report.skipped; anything else that does not fit is
// an error naming the file, and leaves the model unchanged.
void load_state(Backbone& model, nn::StateDict state, LoadReport& report);

std::vector<ModelSpec> resnet_models();        // resnet.cpp: ResNet, ResNeXt, Wide ResNet
std::vector<ModelSpec> vgg_models();           // vgg.cpp
std::vector<ModelSpec> densenet_models();      // densenet.cpp
std::vector<ModelSpec> mobilenet_models();     // mobilenet.cpp: MobileNet v2 and v3
std::vector<ModelSpec> efficientnet_models();  // efficientnet.cpp: EfficientNet B0-B7, V2 S/M/L
std::vector<ModelSpec> convnext_models();      // convnext.cpp
std::vector<ModelSpec> vit_models();           // vit.cpp: Vision Transformer
std::vector<ModelSpec> swin_models();          // swin.cpp: Swin Transformer (v1)

// The registered model called name; throws naming the closest one when there is none.
const ModelSpec& spec(const std::string& name);

// torchvision's weight tags of every model (models/src/weight_tags.cpp, generated).
const std::vector<WeightsTag>& weight_tags();

}  // namespace tvc::models::detail
