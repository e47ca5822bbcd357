// The examples of docs/hybrid.md, compiled by the build (tools/check_doc_examples.py).
#include "tvc/hybrid/hybrid.h"

#include <iostream>
#include <memory>
#include <vector>

#include "tvc/hybrid/blocks.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"

void build_hybrid(const tvc::Tensor& images);
void register_gated_block();

// The options laid out as the document shows them.
void build_hybrid(const tvc::Tensor& images) {
  // clang-format off
  // [doc]
  tvc::hybrid::HybridBuilder builder;
  auto model = builder.from_torchvision("resnet50", {
      .weights = "IMAGENET1K_V2",                     // a tag, a file, or "" (random)
      .patches = tvc::hybrid::parse_patches(R"({
          "layer3": {"wrap": "se"},
          "layer4.2": {"wrap": {"type": "cbam_block", "params": {"reduction": 8}}}})"),
      .num_classes = 100,
      .dropout = 0.3,
      .freeze_backbone = true, .unfreeze_stages = {3}});
  tvc::Tensor logits = (*model)(images);                          // (N, 100)
  std::vector<tvc::Tensor> maps = model->get_stage_outputs(images);  // stem, C2, C3, C4, C5
  model->unfreeze_all();
  std::cout << model->explain() << "\n";
  // [end doc]
  // clang-format on
}

// x * sigmoid(conv1x1(x)): (N, C, H, W) -> (N, C, H, W).
class GatedBlock : public tvc::nn::Cloneable<GatedBlock> {
 public:
  explicit GatedBlock(int64_t channels) {
    register_module("conv", std::make_shared<tvc::nn::Conv2d>(channels, channels, 1));
  }
  tvc::Tensor forward(const tvc::Tensor& x) override { return x * tvc::sigmoid(child("conv")(x)); }
};

void register_gated_block() {
  // [doc]
  tvc::hybrid::register_block({.name = "gated",
                               .aliases = {"GatedBlock"},
                               .category = "custom",
                               .class_name = "GatedBlock",
                               .description = "x * sigmoid(conv1x1(x))",
                               .params = {{.name = "channels", .kind = tvc::hybrid::ParamKind::Channels}},
                               .make = [](const tvc::hybrid::BlockArgs& a) -> tvc::nn::ModulePtr {
                                 return std::make_shared<GatedBlock>(a.get_int("channels"));
                               }});
  // [end doc]
}
