// Hybrid models (hybrid/) against the same networks built in PyTorch (tools/hybrid_goldens.py):
// for every family, patches of each operation; the state_dict keys (and their order) identical,
// eval output err <= 1e-4 in float32, float64 output, stage outputs and parameter gradients
// <= 1e-8; freezing, explain(), patch errors.
// err = ||a - b||2 / ||b||2 per tensor (tests/compare.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "compare.h"
#include "test_helpers.h"
#include "torch_golden.h"
#include "tvc/autograd.h"
#include "tvc/hybrid/backbone.h"
#include "tvc/hybrid/hybrid.h"
#include "tvc/hybrid/weights.h"
#include "tvc/models/models.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"
#include "tvc/optim.h"
#include "tvc/serialize.h"

using namespace tvc;
using namespace tvc::hybrid;
using tvc::test::error_of;
using tvc::test::relative_error;

namespace {

struct HybridCase {
  std::string backbone;
  std::string patches;  // JSON
  int64_t num_classes = 10;
  double dropout = 0;
  int64_t size = 64;
};

void PrintTo(const HybridCase& c, std::ostream* os) { *os << c.backbone << " " << c.patches; }

HybridModelPtr build(const HybridCase& c) {
  BuildOptions options{.weights = "",
                       .patches = parse_patches(c.patches),
                       .num_classes = c.num_classes,
                       .dropout = c.dropout,
                       .verbose = false};
  if (c.backbone.rfind("vit", 0) == 0) options.image_size = c.size;
  return HybridBuilder().from_torchvision(c.backbone, options);
}

// The fingerprint of the Python files the goldens script imports (they key its cache too).
std::string deps_fingerprint() {
  std::string text = test::read_file(TVC_SOURCE_ROOT "/tools/hybrid_blocks.py") +
                     test::read_file(TVC_SOURCE_ROOT "/tools/model_goldens.py");
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  return std::to_string(h);
}

std::string goldens(const HybridCase& c, const HybridModel& model) {
  nlohmann::json j = {{"backbone", c.backbone},
                      {"patches", nlohmann::json::parse(c.patches)},
                      {"num_classes", c.num_classes},
                      {"dropout", c.dropout},
                      {"size", c.size},
                      {"nodes", model.layout().stage_nodes}};
  return test::python_golden_folder(TVC_SOURCE_ROOT "/tools/hybrid_goldens.py", {j.dump(), deps_fingerprint()});
}

// Builds c in tvc and in PyTorch and compares; prints the errors measured.
void check_against_pytorch(const HybridCase& c) {
  HybridModelPtr model = build(c);
  const std::string dir = goldens(c, *model);
  ASSERT_FALSE(dir.empty());
  const nn::StateDict weights = io::load_state_dict(dir + "/weights.pth");
  // The same names in the same order as the PyTorch network's state_dict.
  EXPECT_EQ(model->state_dict().keys(), weights.keys());
  model->to(DType::Float64);
  model->load_state_dict(weights);
  model->eval();
  const io::SafetensorsFile g = io::SafetensorsFile::open(dir + "/goldens.safetensors");
  const Tensor input = g.tensor("input"), expected = g.tensor("output");

  // float64: output, stage outputs, gradients.
  Tensor output = (*model)(input);
  const double err64 = relative_error(output, expected);
  EXPECT_LE(err64, 1e-10) << "float64 output";
  const std::vector<Tensor> stages = model->get_stage_outputs(input);
  ASSERT_EQ(stages.size(), model->layout().stage_nodes.size() + 1);
  double stage_err = 0, grad_err = 0;
  for (size_t k = 0; k < stages.size(); ++k) {
    const double e = relative_error(stages[k], g.tensor("stage." + std::to_string(k)));
    EXPECT_LE(e, 1e-10) << "stage " << k;
    stage_err = std::max(stage_err, e);
  }
  model->zero_grad();
  (output * g.tensor("cotangent")).sum().backward();
  // A gradient that is zero in exact arithmetic (a key bias of attention: softmax ignores a
  // shift of every key) is torch's rounding noise: compared absolutely, against all gradients.
  double total = 0;
  auto norm = [](const Tensor& t) { return std::sqrt((t * t).sum().item<double>()); };
  for (const auto& [name, p] : model->named_parameters()) total += std::pow(norm(g.tensor("grad." + name)), 2);
  total = std::sqrt(total);
  for (const auto& [name, p] : model->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    const Tensor expected_grad = g.tensor("grad." + name);
    const double e = norm(expected_grad) < 1e-12 * total ? norm(p.grad() - expected_grad) / total
                                                         : relative_error(p.grad(), expected_grad);
    EXPECT_LE(e, 1e-8) << "grad " << name;
    grad_err = std::max(grad_err, e);
  }

  // float32 eval output.
  model->to(DType::Float32);
  Tensor output32;
  {
    NoGradGuard no_grad;
    output32 = (*model)(input.to(DType::Float32));
  }
  const double err32 = relative_error(output32, expected);
  EXPECT_LE(err32, 1e-4) << "float32 output";
  std::string patches;  // on one line: every run of whitespace as one space
  for (char ch : c.patches) {
    if (!std::isspace(static_cast<unsigned char>(ch)))
      patches += ch;
    else if (!patches.empty() && patches.back() != ' ')
      patches += ' ';
  }
  std::printf("hybrid %s %s: eval32 %.2e, eval64 %.2e, stages64 %.2e, grad64 %.2e\n", c.backbone.c_str(),
              patches.c_str(), err32, err64, stage_err, grad_err);
}

class HybridConformance : public ::testing::TestWithParam<HybridCase> {};
TEST_P(HybridConformance, MatchesPyTorch) { check_against_pytorch(GetParam()); }
// Larger backbones of each family (bash tools/conformance.sh runs them).
class HybridConformanceFull : public ::testing::TestWithParam<HybridCase> {};
TEST_P(HybridConformanceFull, MatchesPyTorch) { check_against_pytorch(GetParam()); }

std::string case_name(const ::testing::TestParamInfo<HybridCase>& info) {
  return info.param.backbone + "_" + std::to_string(info.index);
}

// The CI set: each family with each operation (wrap, inject, replace), top-level and nested
// targets, NCHW maps, Swin's NHWC stages and ViT's tokens.
INSTANTIATE_TEST_SUITE_P(
    Families, HybridConformance,
    ::testing::Values(
        HybridCase{"resnet18", R"({"layer3": {"wrap": "se"}, "layer2.1": {"inject": {"type": "eca"}},
                                 "layer4.1": {"replace": {"type": "conv_bn_act", "params": {"kernel_size": 3}}}})",
                   10, 0.3},
        HybridCase{"resnet18", "{}", 7, 0},
        HybridCase{"efficientnet_b0", R"({"features.5": {"wrap": {"type": "cbam_block", "params": {"reduction": 8}}},
                                        "features.1.0.block.1": {"replace": {"type": "conv_bn_act", "params": {"kernel_size": 1}}}})"},
        HybridCase{"mobilenet_v3_small", R"({"features.4": {"wrap": "SEBlock"},
                                           "features.9": {"inject": {"type": "se_enhanced", "params": {"gate_activation": "hardsigmoid"}}}})"},
        HybridCase{"mobilenet_v2", R"({"features.17": {"inject": "eca_block"}, "features.5": {"replace": "mbconv"}})",
                   5, 0.2},
        HybridCase{"densenet121", R"({"features.denseblock2": {"wrap": "cbam"},
                                    "features.transition1.conv": {"replace": {"type": "coord_conv", "params": {"kernel_size": 1, "with_r": true}}}})"},
        HybridCase{
            "convnext_tiny",
            R"({"features.3": {"wrap": "layer_scale"}, "features.5.2": {"wrap": "se"}, "features.1.2": {"inject": "eca"},
                                      "features.4": {"replace": {"type": "conv_bn_act", "params": {"stride": 2}}}})"},
        HybridCase{
            "swin_t",
            R"({"features.3": {"wrap": "se"}, "features.5.1": {"wrap": "mish"}, "features.7.1": {"inject": "drop_path"},
                               "features.2": {"replace": {"type": "conv_bn_act", "params": {"stride": 2}}}})"},
        HybridCase{"vit_b_32",
                   R"({"encoder.layers.encoder_layer_3": {"wrap": "layer_scale"}, "conv_proj": {"wrap": "se"},
                                 "encoder.layers.encoder_layer_1": {"replace": {"type": "mha", "params": {"num_heads": 4}}}})",
                   10, 0.1, 64}),
    case_name);

// Every block of the registry inside a network (resnet18), by wrap, inject or replace.
INSTANTIATE_TEST_SUITE_P(
    Blocks, HybridConformance,
    ::testing::Values(
        HybridCase{"resnet18", R"({"layer1.0": {"wrap": "channel_attention"}, "layer1.1": {"wrap": "spatial_attention"},
                                 "layer2.0": {"wrap": {"type": "se_enhanced", "params": {"use_bn": true, "activation": "swish"}}},
                                 "layer2.1": {"inject": "attention_block"}})"},
        HybridCase{
            "resnet18",
            R"({"layer4.0": {"wrap": {"type": "mha", "params": {"num_heads": 4}}}, "layer4.1": {"wrap": "drop_path"},
                                 "avgpool": {"replace": "gem"}, "layer3.0": {"wrap": "mish"}})"},
        HybridCase{"resnet18", R"({"layer1.1": {"replace": "conv"}, "layer2.1": {"replace": "residual"},
                                 "layer3.1": {"replace": "depthwise"}, "layer4.1": {"replace": {"type": "coord_conv", "params": {"padding": 1}}}})"},
        HybridCase{
            "resnet18",
            R"({"layer3.1": {"replace": {"type": "inception", "params": {"out_1x1": 64, "out_3x3": 64, "out_5x5": 64, "out_pool": 64}}},
                                 "layer4": {"replace": {"type": "dense", "params": {"num_layers": 8, "growth_rate": 32}}}})"},
        HybridCase{
            "resnet18",
            R"({"layer1.0": {"replace": "fused_mbconv"}, "layer1.1": {"replace": "mbconv"}, "layer2.1": {"replace": "bottleneck"},
                                 "layer3.1": {"replace": "wide_bottleneck"}, "layer4.1": {"replace": "grouped_bottleneck"}})"}),
    case_name);

INSTANTIATE_TEST_SUITE_P(
    Families, HybridConformanceFull,
    ::testing::Values(
        HybridCase{"vgg11_bn", R"({"features.10": {"wrap": "cbam_block"}, "features.14": {"replace": "conv_bn_act"}})",
                   10, 0.5},
        HybridCase{"resnext50_32x4d", R"({"layer3": {"wrap": "se"}})"},
        HybridCase{"wide_resnet50_2", R"({"layer2.3": {"inject": "eca"}})"},
        HybridCase{"efficientnet_v2_s", R"({"features.4": {"wrap": "cbam"}})"},
        HybridCase{"mobilenet_v3_large", R"({"features.12": {"wrap": "se"}})"},
        HybridCase{"convnext_small", R"({"features.5.20": {"inject": "layer_scale"}})"},
        HybridCase{"swin_s", R"({"features.5.10": {"wrap": "eca"}})"},
        HybridCase{"vit_b_16", R"({"encoder.layers.encoder_layer_11": {"inject": "drop_path"}})", 10, 0, 64}),
    case_name);

TEST(Hybrid, StateDictNamesOfThePythonLibrary) {
  // resnet50 with dropout 0.3: head.3 is the Linear (NOTES section 1); layer3.5 wrapped: its
  // original keys under .0, the SE block's under .1.
  HybridModelPtr m =
      HybridBuilder().from_torchvision("resnet50", {.weights = "",
                                                    .patches = parse_patches(R"({"layer3.5": {"wrap": "se"}})"),
                                                    .num_classes = 10,
                                                    .dropout = 0.3,
                                                    .verbose = false});
  const nn::StateDict sd = m->state_dict();
  for (const char* key : {"stem.0.weight", "stem.1.running_mean", "stages.0.0.conv1.weight",
                          "stages.0.0.downsample.0.weight", "stages.2.5.0.conv1.weight",
                          "stages.2.5.1.excitation.0.weight", "stages.2.5.1.excitation.2.bias", "head.3.weight"})
    EXPECT_TRUE(sd.contains(key)) << key;
  EXPECT_EQ(sd.at("head.3.weight").shape(), (Shape{10, 2048}));
  // A top-level target is wrapped like a nested one.
  HybridModelPtr top = HybridBuilder().from_torchvision(
      "resnet18", {.weights = "", .patches = parse_patches(R"({"layer3": {"wrap": "se"}})"), .verbose = false});
  EXPECT_TRUE(top->state_dict().contains("stages.2.0.0.conv1.weight"));
  EXPECT_TRUE(top->state_dict().contains("stages.2.1.excitation.0.weight"));
  EXPECT_TRUE(top->state_dict().contains("head.2.weight"));
}

TEST(Hybrid, TorchvisionNamesLoadIntoTheTorchvisionModelStrictly) {
  // Families whose heads tvc restructures (densenet, mobilenet_v2, vgg, convnext) and a plain one:
  // every torchvision key, in torchvision's order, holding the hybrid's tensor; back again.
  for (const char* backbone : {"resnet18", "densenet121", "mobilenet_v2", "convnext_tiny"}) {
    SCOPED_TRACE(backbone);
    HybridModelPtr m =
        HybridBuilder().from_torchvision(backbone, {.weights = "", .num_classes = 7, .dropout = 0.2, .verbose = false});
    const nn::StateDict own = m->state_dict();
    const nn::StateDict tv = m->to_torchvision_names(own);
    models::BackbonePtr reference = models::create(backbone, {.num_classes = 7});
    const nn::StateDict expected = reference->state_dict();
    ASSERT_EQ(tv.size(), expected.size());
    auto e = expected.begin();
    for (const auto& [key, t] : tv) {
      EXPECT_EQ(key, e->first);
      EXPECT_EQ(t.shape(), e->second.shape()) << key;
      ++e;
    }
    EXPECT_TRUE(reference->load_state_dict(tv, /*strict=*/true).missing_keys.empty());
    const nn::StateDict back = m->from_torchvision_names(tv);
    ASSERT_EQ(back.size(), own.size());
    for (const auto& [key, t] : own) EXPECT_TRUE(back.at(key).is_same(t)) << key;
  }
  HybridModelPtr patched = HybridBuilder().from_torchvision(
      "resnet18", {.weights = "", .patches = parse_patches(R"({"layer3": {"wrap": "se"}})"), .verbose = false});
  EXPECT_THROW(patched->to_torchvision_names(patched->state_dict()), Error);
}

TEST(Hybrid, HeadWidthIsTheBackbonesOutputNotABlocksConv) {
  // The Python library reads the CBAM block's 1-channel conv here and builds Linear(1, ...).
  HybridModelPtr m =
      HybridBuilder().from_torchvision("resnet18", {.weights = "",
                                                    .patches = parse_patches(R"({"layer4.1": {"wrap": "cbam_block"}})"),
                                                    .num_classes = 3,
                                                    .verbose = false});
  EXPECT_EQ(m->state_dict().at("head.2.weight").shape(), (Shape{3, 512}));
  m->eval();
  Generator gen(3);
  EXPECT_EQ((*m)(randn({2, 3, 64, 64}, {}, &gen)).shape(), (Shape{2, 3}));
}

TEST(Hybrid, FreezeBackboneTrainsExactlyTheUnfrozenStagesAndHead) {
  HybridModelPtr m = HybridBuilder().from_torchvision("resnet18", {.weights = "", .num_classes = 4, .verbose = false});
  m->freeze_backbone({3}, /*batchnorm_eval=*/true);
  nn::StateDict before = m->state_dict();
  std::map<std::string, Tensor> initial;
  for (const auto& [name, t] : before) initial[name] = t.clone();
  optim::SGD sgd(m->parameters(), {.lr = 0.1});
  m->train();
  Generator gen(4);
  Tensor x = randn({2, 3, 64, 64}, {}, &gen);
  sgd.zero_grad();
  (*m)(x).sum().backward();
  sgd.step();
  for (const auto& [name, t] : m->named_parameters()) {
    const bool trainable = name.rfind("stages.3.", 0) == 0 || name.rfind("head.", 0) == 0;
    EXPECT_EQ(t.requires_grad(), trainable) << name;
    EXPECT_EQ(t.grad().defined(), trainable) << name;
    EXPECT_EQ(relative_error(t, initial[name]) > 0, trainable) << name;
  }
  // Frozen BatchNorms kept their statistics; the trainable stage's moved.
  EXPECT_EQ(relative_error(m->state_dict().at("stem.1.running_mean"), initial["stem.1.running_mean"]), 0);
  EXPECT_EQ(relative_error(m->state_dict().at("stages.1.0.bn1.running_var"), initial["stages.1.0.bn1.running_var"]), 0);
  EXPECT_GT(relative_error(m->state_dict().at("stages.3.0.bn1.running_mean"), initial["stages.3.0.bn1.running_mean"]),
            0);
  EXPECT_EQ(m->count_parameters(true), [&] {
    int64_t n = 0;
    for (const auto& [name, t] : m->named_parameters())
      if (name.rfind("stages.3.", 0) == 0 || name.rfind("head.", 0) == 0) n += t.numel();
    return n;
  }());
  m->unfreeze_all();
  EXPECT_EQ(m->count_parameters(true), m->count_parameters());
  EXPECT_TRUE(m->get_submodule("stem.1")->is_training());
  EXPECT_NE(error_of([&] { m->freeze_backbone({4}); }).find("stage 4 does not exist"), std::string::npos);
}

TEST(Hybrid, FreezeByResolutionStageInAFeaturesFamily) {
  // efficientnet_b0 keeps `features` as one stage; its resolution stages freeze separately.
  HybridModelPtr m = HybridBuilder().from_torchvision("efficientnet_b0", {.weights = "", .verbose = false});
  ASSERT_EQ(m->num_stages(), 5);
  m->freeze_backbone({4});
  for (const auto& [name, t] : m->named_parameters()) {
    const bool trainable = name.rfind("stages.0.6.", 0) == 0 || name.rfind("stages.0.7.", 0) == 0 ||
                           name.rfind("stages.0.8.", 0) == 0 || name.rfind("head.", 0) == 0;
    EXPECT_EQ(t.requires_grad(), trainable) << name;
  }
}

TEST(Hybrid, ExplainInThePythonLibrarysFormat) {
  HybridModelPtr m = HybridBuilder().from_torchvision(
      "resnet50",
      {.weights = "", .patches = parse_patches(R"({"layer3": {"wrap": "se"}})"), .num_classes = 100, .verbose = false});
  m->freeze_backbone({3});
  const std::string expected =
      "+============================================================+\n"
      "|                   HybridModel (resnet50)                   |\n"
      "+============================================================+\n"
      "| Stem: 9,536 params                                         |\n"
      "| Stages:                                                    |\n"
      "|   Stage 1: 215,808 params                                  |\n"
      "|   Stage 2: 1,219,584 params                                |\n"
      "|   Stage 3: 7,230,528 params                                |\n"
      "|   Stage 4: 14,964,736 params                               |\n"
      "| Head: 204,900 params                                       |\n"
      "+------------------------------------------------------------+\n"
      "| Modifications:                                             |\n"
      "|   - Wrapped layer3 with se                                 |\n"
      "+------------------------------------------------------------+\n"
      "| Total: 23,845,092 | Trainable: 15,169,636                  |\n"
      "+============================================================+";
  EXPECT_EQ(m->explain(), expected);
}

TEST(Hybrid, PatchErrorsNameTheFaultAndLeaveNothingBuilt) {
  auto build_with = [](const std::string& backbone, const std::string& patches) {
    return error_of([&] {
      HybridBuilder().from_torchvision(backbone, {.weights = "", .patches = parse_patches(patches), .verbose = false});
    });
  };
  std::string e = build_with("resnet18", R"({"layer5": {"wrap": "se"}})");
  EXPECT_NE(e.find("no module 'layer5'"), std::string::npos) << e;
  EXPECT_NE(e.find("'layer1'"), std::string::npos) << e;  // the nearest paths
  e = build_with("resnet18", R"({"layer3": {"wrap": "squeeze"}})");
  EXPECT_NE(e.find("squeeze"), std::string::npos) << e;
  EXPECT_NE(e.find("cbam_block"), std::string::npos) << e;  // lists the known names
  e = build_with("resnet18", R"({"layer3": {"wrap": {"type": "se", "params": {"ratio": 4}}}})");
  EXPECT_NE(e.find("ratio"), std::string::npos) << e;
  e = build_with("resnet18", R"({"fc": {"wrap": "mish"}})");
  EXPECT_NE(e.find("does not keep 'fc'"), std::string::npos) << e;
  e = build_with("resnet18", R"({"layer3": {"replace": "se"}, "layer3.1": {"wrap": "se"}})");
  EXPECT_NE(e.find("inside 'layer3'"), std::string::npos) << e;
  e = error_of([] { parse_patches(R"({"layer3": {"wrap": "se", "replace": "se"}})"); });
  EXPECT_NE(e.find("one operation per patch"), std::string::npos) << e;
  e = error_of([] { parse_patches(R"({"layer3": {"warp": "se"}})"); });
  EXPECT_NE(e.find("unknown operation 'warp'"), std::string::npos) << e;
  e = error_of([] { parse_patches(R"({"layer3": {"wrap": {"type": "se", "parms": {}}}})"); });
  EXPECT_NE(e.find("unknown key 'parms'"), std::string::npos) << e;
  e = error_of([] { HybridBuilder().from_torchvision("resnet51", {.weights = "", .verbose = false}); });
  EXPECT_NE(e.find("did you mean 'resnet50'"), std::string::npos) << e;
}

TEST(Hybrid, ExplainAndSummaryOfEfficientNetAndSwin) {
  HybridModelPtr effnet = HybridBuilder().from_torchvision(
      "efficientnet_b0", {.weights = "",
                          .patches = parse_patches(R"({"features.5": {"wrap": "se"}})"),
                          .num_classes = 10,
                          .dropout = 0.2,
                          .verbose = false});
  EXPECT_EQ(effnet->explain(),
            "+============================================================+\n"
            "|               HybridModel (efficientnet_b0)                |\n"
            "+============================================================+\n"
            "| Stem: 0 params                                             |\n"
            "| Stages:                                                    |\n"
            "|   Stage 1: 4,009,235 params                                |\n"
            "| Head: 12,810 params                                        |\n"
            "+------------------------------------------------------------+\n"
            "| Modifications:                                             |\n"
            "|   - Wrapped features.5 with se                             |\n"
            "+------------------------------------------------------------+\n"
            "| Total: 4,022,045 | Trainable: 4,022,045                    |\n"
            "+============================================================+");
  HybridModelPtr swin =
      HybridBuilder().from_torchvision("swin_t", {.weights = "", .num_classes = 10, .verbose = false});
  EXPECT_EQ(swin->explain(),
            "+============================================================+\n"
            "|                    HybridModel (swin_t)                    |\n"
            "+============================================================+\n"
            "| Stem: 0 params                                             |\n"
            "| Stages:                                                    |\n"
            "|   Stage 1: 27,517,818 params                               |\n"
            "| Head: 9,226 params                                         |\n"
            "+------------------------------------------------------------+\n"
            "| Total: 27,527,044 | Trainable: 27,527,044                  |\n"
            "+============================================================+");

  auto summary = [](const std::string& name) { return get_backbone_info(*models::create(name)).summary(); };
  EXPECT_EQ(summary("resnet50"),
            "Backbone: resnet50\n----------------------------------------\nStem:   conv1, bn1, relu, maxpool\n"
            "Stages: layer1, layer2, layer3, layer4\nHead:   avgpool, fc\n----------------------------------------\n"
            "Parameters: 25,557,032\nStage Channels: [256, 512, 1024, 2048]");
  EXPECT_EQ(summary("efficientnet_b0"),
            "Backbone: efficientnet_b0\n----------------------------------------\nStem:   N/A\n"
            "Stages: features\nHead:   avgpool, classifier\n----------------------------------------\n"
            "Parameters: 5,288,548\nStage Channels: [16, 24, 40, 112, 1280]");
  EXPECT_EQ(
      summary("swin_t"),
      "Backbone: swin_t\n----------------------------------------\nStem:   N/A\n"
      "Stages: features\nHead:   norm, permute, avgpool, flatten, head\n----------------------------------------\n"
      "Parameters: 28,288,354\nStage Channels: [96, 192, 384, 768]");
}

TEST(Hybrid, ExtractTiersReproducesTheModelsForward) {
  for (const char* name : {"resnet18", "mobilenet_v2", "densenet121", "efficientnet_b0", "swin_t", "vit_b_32"}) {
    models::Options options;
    if (std::string(name) == "vit_b_32") options.image_size = 64;
    models::BackbonePtr model = models::create(name, options);
    model->eval();
    Tiers t = extract_tiers(*model);
    Generator gen(5);
    Tensor x = randn({2, 3, 64, 64}, {}, &gen);
    NoGradGuard no_grad;
    Tensor y = (*t.stem)(x);
    for (const auto& stage : t.stages) y = (*stage)(y);
    EXPECT_EQ(relative_error((*t.head)(y), (*model)(x)), 0) << name;
  }
}

// A small model for the weight utilities: conv (3->4), bn, fc (16->5).
std::shared_ptr<nn::Sequential> small_model() {
  return std::make_shared<nn::Sequential>(
      std::vector<std::pair<std::string, nn::ModulePtr>>{{"conv", std::make_shared<nn::Conv2d>(3, 4, 3)},
                                                         {"bn", std::make_shared<nn::BatchNorm2d>(4)},
                                                         {"pool", std::make_shared<nn::AdaptiveAvgPool2d>(2)},
                                                         {"flatten", std::make_shared<nn::Flatten>(1)},
                                                         {"fc", std::make_shared<nn::Linear>(16, 5)}});
}

TEST(HybridWeights, PartialLoadReportsEveryKeyAndInitialisesOnlyNewLayers) {
  auto source = small_model(), model = small_model();
  nn::StateDict sd;
  for (const auto& [k, t] : source->state_dict()) sd.insert(k, t.clone());
  sd.erase("conv.bias");                       // absent from a layer that is there
  sd.at("bn.weight") = randn({5});             // another shape
  sd.erase("fc.weight"), sd.erase("fc.bias");  // a layer absent from the source: new
  sd.insert("extra.weight", randn({2}));       // unexpected
  const Tensor conv_bias = model->get_parameter("conv.bias").clone();
  const WeightLoadingReport r = partial_load(*model, sd, {.verbose = false});
  EXPECT_EQ(r.loaded, (std::vector<std::string>{"conv.weight", "bn.bias", "bn.running_mean", "bn.running_var",
                                                "bn.num_batches_tracked"}));
  ASSERT_EQ(r.skipped_shape_mismatch.size(), 1u);
  EXPECT_EQ(r.skipped_shape_mismatch[0].name, "bn.weight");
  EXPECT_EQ(r.skipped_shape_mismatch[0].source, (Shape{5}));
  EXPECT_EQ(r.skipped_shape_mismatch[0].target, (Shape{4}));
  EXPECT_EQ(r.skipped_missing, (std::vector<std::string>{"conv.bias", "fc.weight", "fc.bias"}));
  EXPECT_EQ(r.skipped_unexpected, (std::vector<std::string>{"extra.weight"}));
  EXPECT_EQ(r.newly_initialized, (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_EQ(r.total_loaded(), 5);
  EXPECT_EQ(r.total_skipped(), 5);
  EXPECT_DOUBLE_EQ(r.load_ratio(), 0.5);
  EXPECT_EQ(relative_error(model->get_parameter("conv.weight"), source->get_parameter("conv.weight")), 0);
  EXPECT_EQ(relative_error(model->get_parameter("conv.bias"), conv_bias), 0);  // kept, not re-initialised
  EXPECT_EQ(model->get_parameter("fc.bias").abs().sum().item<double>(), 0);    // kaiming: zero bias
  EXPECT_EQ(r.summary(),
            "============================================================\n"
            "Weight Loading Report\n"
            "============================================================\n"
            "Loaded:           5 parameters\n"
            "Shape Mismatch:   1 parameters\n"
            "Missing (target): 3 parameters\n"
            "Unexpected:       1 parameters\n"
            "Newly Initialized:2 parameters\n"
            "------------------------------------------------------------\n"
            "Load Ratio:       50.0%\n"
            "============================================================\n"
            "\n"
            "Shape Mismatches:\n"
            "  bn.weight: (5,) -> (4,)");
  // Errors come before any write.
  auto untouched = small_model();
  const Tensor w = untouched->get_parameter("conv.weight").clone();
  std::string e = error_of([&] { partial_load(*untouched, sd, {.strict = true, .verbose = false}); });
  EXPECT_NE(e.find("bn.weight"), std::string::npos) << e;
  e = error_of([&] { partial_load(*untouched, sd, {.ignore_mismatch = false, .verbose = false}); });
  EXPECT_NE(e.find("shape mismatch for 'bn.weight'"), std::string::npos) << e;
  EXPECT_EQ(relative_error(untouched->get_parameter("conv.weight"), w), 0);
  EXPECT_NE(error_of([] { init_method("he"); }).find("kaiming, xavier, zero, none"), std::string::npos);
}

TEST(HybridWeights, TransferWeightsFiltersAndRenames) {
  auto source = small_model(), target = small_model();
  const Tensor fc = target->get_parameter("fc.weight").clone();
  WeightLoadingReport r = transfer_weights(*source, *target, {.exclude_patterns = {"^fc"}});
  EXPECT_EQ(r.total_loaded(), 7);
  EXPECT_EQ(relative_error(target->get_parameter("fc.weight"), fc), 0);  // kept
  EXPECT_EQ(relative_error(target->get_parameter("conv.weight"), source->get_parameter("conv.weight")), 0);
  auto renamed = small_model();
  r = transfer_weights(*source, *renamed,
                       {.layer_mapping = {{"bn.weight", "bn.bias"}}, .include_patterns = {"bn\\.weight"}});
  EXPECT_EQ(r.loaded, std::vector<std::string>{"bn.bias"});
  EXPECT_EQ(relative_error(renamed->get_parameter("bn.bias"), source->get_parameter("bn.weight")), 0);
  EXPECT_NE(error_of([&] { transfer_weights(*source, *renamed, {.include_patterns = {"(fc"}}); }).find("'(fc'"),
            std::string::npos);
}

TEST(HybridWeights, FromCheckpointReadsHybridTorchvisionAndLibraryNames) {
  test::TempDir dir;
  Generator gen(6);
  const Tensor x = randn({2, 3, 64, 64}, {}, &gen);
  auto output = [&x](nn::Module& m) {
    m.eval();
    NoGradGuard no_grad;
    return m(x);
  };
  const std::string patches = R"({"layer3": {"wrap": "se"}})";
  // tvc's own names, in a training checkpoint with DataParallel prefixes.
  HybridModelPtr trained = HybridBuilder().from_torchvision(
      "resnet18", {.weights = "", .patches = parse_patches(patches), .num_classes = 10, .verbose = false});
  io::Value::Items prefixed;
  for (const auto& [k, t] : trained->state_dict()) prefixed.emplace_back(io::Value("module." + k), io::Value(t));
  io::save_pth(dir / "ckpt.pth", io::Value::dict({{io::Value("state_dict"), io::Value::dict(prefixed, true)},
                                                  {io::Value("epoch"), io::Value(3)}}));
  HybridModelPtr loaded = HybridBuilder().from_checkpoint(
      dir / "ckpt.pth", "resnet18",
      {.patches = parse_patches(patches), .num_classes = 10, .strict = true, .verbose = false});
  EXPECT_EQ(relative_error(output(*loaded), output(*trained)), 0);

  // A plain torchvision state_dict: every tensor maps (the classifier to the new Linear).
  models::BackbonePtr tv = models::create("resnet18", {.num_classes = 10});
  io::save_safetensors(dir / "tv.safetensors", tv->state_dict());
  WeightLoadingReport report;
  HybridModelPtr from_tv = HybridBuilder().from_checkpoint(dir / "tv.safetensors", "resnet18",
                                                           {.num_classes = 10, .verbose = false, .report = &report});
  EXPECT_EQ(report.total_loaded(), static_cast<int64_t>(tv->state_dict().size()));
  EXPECT_EQ(report.total_skipped(), 0);
  EXPECT_EQ(relative_error(output(*from_tv), output(*tv)), 0);

  // The Python library's densenet head (Flatten, Linear: head.1) moves to tvc's head.3.
  HybridModelPtr dense =
      HybridBuilder().from_torchvision("densenet121", {.weights = "", .num_classes = 4, .verbose = false});
  nn::StateDict library;
  for (const auto& [k, t] : dense->state_dict())
    library.insert(k.rfind("head.3.", 0) == 0 ? "head.1." + k.substr(7) : k, t);
  io::save_safetensors(dir / "lib.safetensors", library);
  HybridModelPtr from_lib = HybridBuilder().from_checkpoint(dir / "lib.safetensors", "densenet121",
                                                            {.num_classes = 4, .strict = true, .verbose = false});
  EXPECT_EQ(relative_error(output(*from_lib), output(*dense)), 0);
}

// text as one double-quoted word inside run_tvc's single-quoted bash -c command.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

TEST(HybridCli, BackbonesBlocksInfoExplainAndRun) {
  test::TempDir dir;
  test::TvcRun run = test::run_tvc(dir, "backbones");
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(std::count(run.out.begin(), run.out.end(), '\n'), 47);
  run = test::run_tvc(dir, "blocks");
  EXPECT_EQ(run.status, 0) << run.err;
  for (const char* name : {"SEBlock", "cbam_block", "eca", "gem", "fused_mbconv", "multihead_attention"})
    EXPECT_NE(run.out.find(name), std::string::npos) << name;
  run = test::run_tvc(dir, "info resnet50");
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.out.find("Stage Channels: [256, 512, 1024, 2048]"), std::string::npos) << run.out;
  run = test::run_tvc(dir,
                      "explain resnet50 --patches " + quoted(R"({"layer3": {"wrap": "se"}})") + " --num-classes 100");
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.out.find("| Total: 23,845,092 | Trainable: 23,845,092"), std::string::npos) << run.out;
  run = test::run_tvc(dir, "explain resnet50 --patches " + quoted(R"({"layer9": {"wrap": "se"}})"));
  EXPECT_EQ(run.status, 1);
  EXPECT_NE(run.err.find("error: patch 'layer9'"), std::string::npos) << run.err;

  // run --hybrid on a checkpoint of tvc's names: the output and stage maps of the C++ model.
  const std::string patches = R"({"layer2": {"wrap": "eca"}})";
  HybridModelPtr model = HybridBuilder().from_torchvision(
      "resnet18", {.weights = "", .patches = parse_patches(patches), .num_classes = 6, .verbose = false});
  io::save_safetensors(dir / "hybrid.safetensors", model->state_dict());
  Generator gen(7);
  const Tensor x = randn({1, 3, 64, 64}, {}, &gen);
  io::save_safetensors(dir / "in.safetensors", std::vector<std::pair<std::string, Tensor>>{{"input", x}});
  run = test::run_tvc(dir, "run resnet18 --hybrid --patches " + quoted(patches) + " --num-classes 6 --weights " +
                               (dir / "hybrid.safetensors") + " --input " + (dir / "in.safetensors") + " --output " +
                               (dir / "out.safetensors") + " --features");
  ASSERT_EQ(run.status, 0) << run.err;
  model->eval();
  NoGradGuard no_grad;
  const io::SafetensorsFile out = io::SafetensorsFile::open(dir / "out.safetensors");
  EXPECT_EQ(relative_error(out.tensor("output"), (*model)(x)), 0);
  const std::vector<Tensor> stages = model->get_stage_outputs(x);
  for (size_t k = 0; k < stages.size(); ++k)
    EXPECT_EQ(relative_error(out.tensor("stage." + std::to_string(k)), stages[k]), 0) << k;
}

TEST(Hybrid, VerboseSaysWhatWasLoadedPatchedAndInitialised) {
  ::testing::internal::CaptureStdout();
  HybridBuilder().from_torchvision(
      "resnet18",
      {.weights = "", .patches = parse_patches(R"({"layer3": {"wrap": "se"}})"), .num_classes = 10, .dropout = 0.2});
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("Loaded resnet18 (random initialization)"), std::string::npos) << out;
  EXPECT_NE(out.find("Wrapped layer3 with se: SEBlock at stages.2.1, 8464 new parameters initialised"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("Head: Dropout(p=0.2), Linear(512, 10) at head.3, initialised"), std::string::npos) << out;
}

TEST(Hybrid, CloneIsADeepCopyAndViTChecksTheInputSize) {
  HybridModelPtr vit = HybridBuilder().from_torchvision(
      "vit_b_32", {.weights = "", .num_classes = 4, .verbose = false, .image_size = 64});
  auto copy = std::dynamic_pointer_cast<HybridModel>(vit->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->backbone_name(), "vit_b_32");
  EXPECT_FALSE(copy->get_parameter("stem.class_token").is_same(vit->get_parameter("stem.class_token")));
  vit->eval(), copy->eval();
  Generator gen(8);
  const Tensor x = randn({1, 3, 64, 64}, {}, &gen);
  NoGradGuard no_grad;
  EXPECT_EQ(relative_error((*copy)(x), (*vit)(x)), 0);
  EXPECT_EQ(copy->get_stage_outputs(x).back().shape(), (Shape{1, 768, 2, 2}));
  const std::string e = error_of([&] { (*vit)(randn({1, 3, 96, 96}, {}, &gen)); });
  EXPECT_NE(e.find("built for 64x64 images"), std::string::npos) << e;
  EXPECT_NE(e.find("[1, 3, 96, 96]"), std::string::npos) << e;
}

// All 47 backbones (bash tools/conformance.sh runs it): the hybrid builds, runs, gives one NCHW
// map per resolution stage after the stem, with the channels get_backbone_info measures, and
// freezes by stage.
TEST(HybridConformanceAll, EveryBackbone) {
  for (const std::string& name : HybridBuilder::list_backbones()) {
    SCOPED_TRACE(name);
    const bool vit = name.rfind("vit", 0) == 0;
    const int64_t size = vit ? 224 : 64;
    HybridModelPtr model = HybridBuilder().from_torchvision(name, {.weights = "", .num_classes = 3, .verbose = false});
    const std::vector<int64_t> channels = get_backbone_info(*models::create(name)).stage_channels;
    model->eval();
    Generator gen(9);
    const Tensor x = randn({1, 3, size, size}, {}, &gen);
    NoGradGuard no_grad;
    EXPECT_EQ((*model)(x).shape(), (Shape{1, 3}));
    const std::vector<Tensor> stages = model->get_stage_outputs(x);
    ASSERT_EQ(stages.size(), channels.size() + 1);
    for (size_t k = 1; k < stages.size(); ++k) {
      ASSERT_EQ(stages[k].dim(), 4);
      EXPECT_EQ(stages[k].size(1), channels[k - 1]) << "stage " << k;
      EXPECT_LE(stages[k].size(2), stages[k - 1].size(2)) << "stage " << k;
    }
    model->freeze_backbone({model->num_stages() - 1});
    EXPECT_LT(model->count_parameters(true), model->count_parameters());
    std::printf("every backbone %s: stage channels", name.c_str());
    for (int64_t c : channels) std::printf(" %lld", static_cast<long long>(c));
    std::printf("\n");
  }
}

TEST(Hybrid, ListsTheFortySevenBackbones) {
  const std::vector<std::string> all = HybridBuilder::list_backbones();
  EXPECT_EQ(all.size(), 47u);
  EXPECT_EQ(all.front(), "resnet18");
  EXPECT_EQ(all.back(), "swin_b");
}

}  // namespace
