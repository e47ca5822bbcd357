// torchvision's classification backbones, built natively: the same structure, the same
// state_dict names, shapes, dtypes and order, the same initialisation, the same outputs.
//
//   auto model = tvc::models::create("resnet50", {.weights = "DEFAULT"});  // torchvision's file
//   model->eval();
//   tvc::Tensor logits = model->forward(images);                          // (N, 1000)
//   for (auto& [node, t] : model->forward_stages(images)) ...             // "relu", "layer1", ...
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tvc/nn/module.h"
#include "tvc/serialize.h"
#include "tvc/tensor.h"

namespace tvc::models {

struct Options {
  // Outputs of the classifier. Unset: the class count of the weights (their classifier's rows),
  // 1000 without weights. Set to another count than the weights', every tensor but the
  // classifier's loads (the load report lists the classifier's keys as skipped).
  std::optional<int64_t> num_classes{};
  // torchvision's dropout argument, for the models that have one: VGG and MobileNet (before the
  // classifier; defaults 0.5, 0.2), ViT (in the encoder and its blocks; default 0). Unset:
  // torchvision's default. An error for the others.
  std::optional<double> dropout{};
  // The one input size (S x S) a ViT is built for (torchvision's image_size): a multiple of the
  // patch size; unset: 224. Weights made for another size load with their position embedding
  // interpolated. An error for the other models (they take any size).
  std::optional<int64_t> image_size{};
  // "" (random initialisation), a torchvision tag ("DEFAULT", "IMAGENET1K_V1", "IMAGENET1K_V2")
  // resolved to torchvision's file name (see weights.h), or a path to a .pth/.safetensors file.
  std::string weights{};
  // How a weights file is read: e.g. opaque_objects for a whole-model save (torch.save(model))
  // or a checkpoint holding other classes; widen for element types tvc lacks.
  io::ReadOptions read{};
};

// A classification backbone: forward maps images (N, 3, H, W) to logits (N, num_classes).
class Backbone : public nn::Module {
 public:
  // torchvision's feature-extraction node names of each resolution stage's output, in order
  // (resnet: "relu", "layer1", ..., "layer4"; the CNNs: the last block before each stride-2
  // change and the last block, e.g. "features.3"; ViT, of one resolution: the encoder blocks at
  // a quarter, half and three quarters of the depth and "encoder.ln"). Each is the dotted path
  // of a submodule.
  virtual std::vector<std::string> stage_nodes() const = 0;
  // The output of each stage node for x (N, 3, H, W), in order: one forward pass with a forward
  // hook on each node's submodule, so a stage is what that submodule returns in the model's own
  // forward, replaced or wrapped submodules included. Throws naming a node that did not run.
  std::vector<std::pair<std::string, Tensor>> forward_stages(const Tensor& x);
  // The registry name ("resnet50").
  const std::string& model_name() const { return name_; }

 protected:
  explicit Backbone(std::string name) : name_(std::move(name)) {}

 private:
  std::string name_;
};
using BackbonePtr = std::shared_ptr<Backbone>;

// Every name create() knows, as torchvision spells them, sorted.
std::vector<std::string> list();

// What create() or load_weights() (tvc/models/weights.h) loaded.
struct LoadReport {
  std::string file{};                  // the file loaded ("" without weights)
  std::vector<std::string> skipped{};  // classifier tensors not loaded (num_classes != the file's)
};

// A new model, initialised as torchvision initialises it, then loaded with options.weights. An
// unknown name is an error naming the closest known one. report, when given, receives what was
// loaded and what was not.
BackbonePtr create(const std::string& name, const Options& options = {}, LoadReport* report = nullptr);

// The state_dict prefix of a model's final classifier layer, torchvision's: "fc" (ResNet),
// "classifier.6" (VGG), "heads.head" (ViT), ...
const std::string& classifier_path(const std::string& name);

// Training mode without randomness: model.train(), then every Dropout and StochasticDepth back in
// eval mode (the identity), so BatchNorm uses and updates batch statistics and the output is
// deterministic (tvc run --train-mode, the conformance tests).
void train_without_dropout(nn::Module& model);

}  // namespace tvc::models
