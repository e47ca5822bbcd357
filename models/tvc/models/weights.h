// torchvision's pretrained weights: tags, where their files are looked for, their preprocessing,
// and loading them into a model.
//
//   auto model = tvc::models::create("resnet50");
//   tvc::models::LoadReport r = tvc::models::load_weights(*model, "IMAGENET1K_V2");
//   const auto& prep = tvc::models::weights_tag("resnet50", "DEFAULT").preprocessing;
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tvc/models/models.h"

namespace tvc::models {

// The filter of a resize: torchvision's InterpolationMode, applied to PIL images as PIL's
// Image.BILINEAR (triangle, support 1) or Image.BICUBIC (Keys cubic with a = -0.5, support 2).
enum class Interpolation { Bilinear, Bicubic };

// torchvision's name of an interpolation (InterpolationMode.value): "bilinear", "bicubic".
const char* interpolation_name(Interpolation interpolation);

// torchvision's ImageClassification transform: resize the shorter side to resize_size
// (antialiased, with interpolation's filter), center-crop crop_size, scale to [0, 1], normalise
// with mean and std.
struct Preprocessing {
  int64_t resize_size{};
  int64_t crop_size{};
  std::array<double, 3> mean{};
  std::array<double, 3> std{};
  Interpolation interpolation = Interpolation::Bilinear;
};

// One of torchvision's weights for a model.
struct WeightsTag {
  std::string model{};      // "resnet50"
  std::string tag{};        // "IMAGENET1K_V2"
  bool is_default{};        // what "DEFAULT" names
  std::string file_name{};  // torchvision's file, "resnet50-11ad3fa6.pth"
  Preprocessing preprocessing{};
};

// The tags of model ("IMAGENET1K_V1", ...), in torchvision's order. The table holds torchvision's
// tags of every model tvc knows, including those not registered (yet): a tag needs no model,
// only create() and loading do. A name neither in the table nor registered is an error
// suggesting the closest model.
std::vector<std::string> weights_tags(const std::string& model);
// model's tag; "DEFAULT" gives the default one. Throws listing the model's tags when absent.
const WeightsTag& weights_tag(const std::string& model, const std::string& tag);

// The folders searched for a tag's file, in order: $TVC_WEIGHTS, $TORCH_HOME/hub/checkpoints,
// ~/.cache/torch/hub/checkpoints (those whose variable is set).
std::vector<std::string> weights_search_path();
// The file of model's tag: in each folder of the search path, torchvision's file name, then the
// same stem with .safetensors. Throws listing every path tried and the expected name.
std::string find_weights(const std::string& model, const std::string& tag);

// Whether weights names a tag ("DEFAULT", "IMAGENET1K_V1", ...) rather than a file.
bool is_weights_tag(const std::string& weights);
// The file weights names for model: find_weights(model, weights) for a tag, else weights itself.
std::string weights_file(const std::string& model, const std::string& weights);

// Loads weights (a tag, or a path to a .pth/.safetensors file) into model. Every tensor must
// fit, except the classifier's when the model has another num_classes than the file: those
// keep their initial values and are listed as skipped. A file that does not fit is an error
// naming the keys that differ, and leaves the model unchanged. read: how the file is read
// (io::ReadOptions, e.g. opaque_objects for a whole-model save).
LoadReport load_weights(Backbone& model, const std::string& weights, const io::ReadOptions& read = {});

// The 1000 ImageNet class names, in class-index order.
const std::vector<std::string>& imagenet_categories();

}  // namespace tvc::models
