// The hybrid layer: a torchvision backbone with its real weights, customised by patches (blocks
// wrapped around, injected after or replacing any module), split into stem, stages and head, with
// a new classifier. The C++ form of torchvision-customizer 2.1's HybridBuilder and HybridModel,
// without that library's defects (see docs/hybrid.md).
//
//   tvc::hybrid::HybridBuilder builder;
//   auto model = builder.from_torchvision("resnet50", {
//       .weights = "IMAGENET1K_V2",
//       .patches = tvc::hybrid::parse_patches(R"({"layer3": {"wrap": "se"}})"),
//       .num_classes = 100, .dropout = 0.3});
//   tvc::Tensor logits = (*model)(images);                 // (N, 100)
//   std::vector<tvc::Tensor> c = model->get_stage_outputs(images);  // stem, C2..C5 (NCHW)
//   model->freeze_backbone({3});                           // train layer4 and the head only
//   std::cout << model->explain();
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tvc/hybrid/blocks.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/module.h"
#include "tvc/serialize.h"
#include "tvc/tensor.h"

namespace tvc::hybrid {

struct WeightLoadingReport;  // tvc/hybrid/weights.h

// ---------------------------------------------------------------- patches

// wrap: Sequential(original, block) at the path (the block takes the original's output
// channels); inject: the same as wrap (as the Python library does, so checkpoints keep their
// names); replace: the block alone at the path (in_channels = the original's input channels,
// out_channels = its output channels).
enum class PatchOp { Wrap, Inject, Replace };
const char* patch_op_name(PatchOp op);  // "wrap", "inject", "replace"

struct Patch {
  std::string target{};  // a dotted module path of the torchvision model: "layer3", "features.5"
  PatchOp op = PatchOp::Wrap;
  std::string block{};   // a block name or alias of the registry (blocks.h)
  BlockParams params{};  // the block's parameters; channels not given are inferred
};

// Patches from JSON text, in the text's order:
//   {"layer3": {"wrap": "se"},
//    "features.5": {"wrap": {"type": "cbam_block", "params": {"reduction": 8}}}}
// Operations "wrap", "inject" (also "inject_after"), "replace"; "block" is accepted for "type".
// Anything else (another key, two operations, a non-scalar parameter) is an error naming it.
std::vector<Patch> parse_patches(const std::string& json);

// ---------------------------------------------------------------- the model

// How a family's hybrid is laid out, beyond its modules (filled by the builder).
struct HybridLayout {
  // The family: "resnet" (also ResNeXt, Wide ResNet), "efficientnet", "vgg", "densenet",
  // "mobilenet_v2", "mobilenet_v3", "convnext", "vit", "swin".
  std::string family{};
  // The module of each resolution stage's output, as a path in the hybrid ("stages.2",
  // "stages.0.5", "stages.0.layers.encoder_layer_5").
  std::vector<std::string> stage_nodes{};
  // The parameter-name prefixes of each resolution stage (for freeze_backbone), and of the stem.
  std::vector<std::vector<std::string>> stage_prefixes{};
  std::vector<std::string> stem_prefixes{};
  // The layout of the stem's and stages' outputs (converted to NCHW by get_stage_outputs).
  Layout stem_layout = Layout::NCHW;
  Layout stage_layout = Layout::NCHW;
  // Each key of the torchvision model's state_dict (before patches) -> the hybrid's key of the
  // same tensor, in torchvision's order; the classifier's keys -> the new Linear's.
  std::vector<std::pair<std::string, std::string>> torchvision_names{};
};

// stem -> stages -> head, each a registered child ("stem", "stages", "head"), so the state_dict
// is stem.*, stages.N.*, head.* (docs/hybrid.md lists each family's names).
class HybridModel : public nn::Cloneable<HybridModel> {
 public:
  HybridModel(nn::ModulePtr stem, std::shared_ptr<nn::ModuleList> stages, nn::ModulePtr head, std::string backbone_name,
              std::vector<std::string> modifications, HybridLayout layout);

  // images (N, 3, H, W) -> logits (N, num_classes)
  Tensor forward(const Tensor& x) override;
  // The head's input: stages(stem(x)). NCHW maps for the CNNs; Swin's (N, H, W, C) and ViT's
  // tokens (N, 1 + L, C) as torchvision carries them (get_stage_outputs gives maps).
  Tensor forward_features(const Tensor& x);
  // The stem's output, then one output per resolution stage (C2..C5 for the CNNs), every one an
  // NCHW map: Swin's NHWC maps permuted; ViT's tokens at 1/4, 2/4, 3/4 and 4/4 of the encoder's
  // depth (and the stem's) without the class token, reshaped to (N, C, H/patch, W/patch).
  std::vector<Tensor> get_stage_outputs(const Tensor& x);

  // Freezes the stem and every resolution stage (the indices of get_stage_outputs' stages:
  // 0 = the first stage after the stem) but those in unfreeze_stages; the head stays trainable.
  // With batchnorm_eval, the frozen parts' BatchNorms also stay in eval mode through train()
  // (their running statistics stay as loaded). A later call replaces an earlier one. An index
  // out of range is an error (model unchanged).
  HybridModel& freeze_backbone(const std::vector<int64_t>& unfreeze_stages = {}, bool batchnorm_eval = false);
  // Every parameter trainable again, every BatchNorm following train()/eval() again.
  HybridModel& unfreeze_all();
  // The number of parameter elements (those requiring grad when trainable_only).
  int64_t count_parameters(bool trainable_only = false) const;
  // The 62-column box of the Python library: stem, each entry of stages, head, up to five
  // modifications, totals.
  std::string explain() const;

  // state (this model's keys, e.g. its state_dict or its AveragedModel copy's) under torchvision's
  // names, in torchvision's order: it loads into torchvision's model built with this head's
  // num_classes with strict=True. Only for a hybrid without patches (a patched module has no
  // torchvision name) and with every key of the model in state; throws naming the fault.
  nn::StateDict to_torchvision_names(const nn::StateDict& state) const;
  // The inverse: a state_dict under torchvision's names with this model's keys (keys torchvision
  // does not have are kept as they are).
  nn::StateDict from_torchvision_names(const nn::StateDict& state) const;

  // Module::train, keeping frozen BatchNorms in eval mode when freeze_backbone asked for it.
  Module& train(bool mode = true) override;

  const std::string& backbone_name() const { return backbone_name_; }
  const std::vector<std::string>& modifications() const { return modifications_; }
  const HybridLayout& layout() const { return layout_; }
  int64_t num_stages() const { return static_cast<int64_t>(layout_.stage_nodes.size()); }
  std::string type_name() const override { return "HybridModel"; }

 private:
  std::string backbone_name_;
  std::vector<std::string> modifications_;
  HybridLayout layout_;
  // With freeze_backbone(..., batchnorm_eval): the frozen parameter-name prefixes, whose
  // BatchNorms train() leaves in eval mode.
  std::vector<std::string> frozen_batchnorm_prefixes_;
};
using HybridModelPtr = std::shared_ptr<HybridModel>;

// ---------------------------------------------------------------- the builder

struct BuildOptions {
  // A torchvision tag ("DEFAULT", "IMAGENET1K_V1", ...), a .pth/.safetensors file of the
  // torchvision model, or "" for torchvision's random initialisation.
  std::string weights = "DEFAULT";
  std::vector<Patch> patches{};
  int64_t num_classes = 1000;
  double dropout = 0;  // before the new classifier (a Dropout only when > 0)
  bool freeze_backbone = false;
  std::vector<int64_t> unfreeze_stages{};  // with freeze_backbone: stages kept trainable
  bool freeze_batchnorm = false;           // with freeze_backbone: frozen BatchNorms stay in eval
  bool verbose = true;                     // print what was loaded, patched and initialised
  std::optional<int64_t> image_size{};     // ViT only: the input size it is built for (224)
  io::ReadOptions read{};                  // how a weights file is read (opaque_objects...)
};

struct CheckpointOptions {
  std::vector<Patch> patches{};
  int64_t num_classes = 1000;
  double dropout = 0;
  // Every tensor of the model must come from the file with its shape, and every tensor of the
  // file must be used; otherwise a mismatch is reported and the rest loads.
  bool strict = false;
  bool verbose = true;
  std::optional<int64_t> image_size{};
  // When set, receives partial_load's report of the checkpoint.
  WeightLoadingReport* report = nullptr;
  io::ReadOptions read{};  // how the file is read (opaque_objects for whole-model saves...)
};

class HybridBuilder {
 public:
  // The backbone (a name of list_backbones()) with weights, patches applied (every one, or an
  // error naming the patch: unknown path with the nearest paths, unknown block with the known
  // names, bad parameter, channels that cannot be inferred, a target the hybrid does not keep),
  // split, a new head for num_classes. Nothing is printed on error.
  HybridModelPtr from_torchvision(const std::string& backbone, const BuildOptions& options = {}) const;
  // The hybrid built without weights, then loaded from a checkpoint: HybridModel names (tvc's
  // or the Python library's, mapped), or a plain torchvision state_dict (mapped); training
  // wrappers ({"state_dict": ...}, {"model": ...}) and "module." prefixes are taken off.
  HybridModelPtr from_checkpoint(const std::string& path, const std::string& backbone,
                                 const CheckpointOptions& options = {}) const;
  // The 47 supported backbones, in the Python library's order.
  static std::vector<std::string> list_backbones();
  std::vector<std::string> supported_backbones() const { return list_backbones(); }
};

}  // namespace tvc::hybrid
