// The hybrid layer's blocks (hybrid/) against PyTorch references of the library's classes
// (tools/hybrid_blocks.py, goldens by tools/hybrid_block_goldens.py, generated into the golden
// cache at test time): for every case, make_block with the case's name, params, channels and
// layout, the torch state_dict loaded strictly (identical keys, in the same order), then
//   float32 eval output                         err <= 1e-5
//   float64 eval output, input and parameter gradients, train-mode output and buffers
//                                               err <= 1e-10
// err = ||a - b||2 / ||b||2 per tensor. Then the registry's lookups and errors, user block
// types, layouts, and DropPath's training behaviour.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "compare.h"
#include "test_helpers.h"
#include "torch_golden.h"
#include "tvc/hybrid/block_modules.h"
#include "tvc/hybrid/blocks.h"
#include "tvc/ops.h"
#include "tvc/serialize.h"

using namespace tvc;
using namespace tvc::hybrid;
using ::testing::HasSubstr;
using tvc::test::error_of;
using tvc::test::relative_error;

namespace {

std::string goldens() {
  static const std::string key =
      std::to_string(std::hash<std::string>{}(test::read_file(TVC_SOURCE_ROOT "/tools/hybrid_blocks.py")));
  return test::python_golden_folder(TVC_SOURCE_ROOT "/tools/hybrid_block_goldens.py", {"--key", key});
}

struct Case {
  std::string id, block;
  BlockParams params{};
  InferredChannels channels{};
  bool train = false;
};

ParamValue param_from_json(const nlohmann::json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) return v.get<double>();
  return v.get<std::string>();
}

Layout layout_from(const std::string& name) {
  if (name == "NHWC") return Layout::NHWC;
  if (name == "tokens") return Layout::Tokens;
  return Layout::NCHW;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  if (goldens().empty()) return out;
  nlohmann::json j = nlohmann::json::parse(test::read_file(goldens() + "/cases.json"));
  for (const auto& c : j) {
    Case k{.id = c["id"], .block = c["block"], .train = c["train"]};
    for (const auto& [name, value] : c["params"].items()) k.params[name] = param_from_json(value);
    k.channels = {.in_channels = c["in_channels"].get<int64_t>(),
                  .out_channels = c["out_channels"].get<int64_t>(),
                  .layout = layout_from(c["layout"])};
    out.push_back(std::move(k));
  }
  return out;
}

// relative_error, or the absolute ||a - b||2 where the expected gradient is zero in exact
// arithmetic and torch's holds rounding noise (MultiHeadAttention's k_proj.bias: softmax is
// shift invariant, so a bias added to every key changes nothing).
double gradient_error(const Tensor& a, const Tensor& b) {
  double norm = std::sqrt((b.to(DType::Float64) * b.to(DType::Float64)).sum().item_double());
  if (norm > 1e-12) return relative_error(a, b);
  Tensor d = a.to(DType::Float64) - b.to(DType::Float64);
  return std::sqrt((d * d).sum().item_double());
}

std::string case_path(const Case& c, const std::string& file) { return goldens() + "/" + c.id + "/" + file; }

// The case's block in dtype with the golden state loaded strictly.
nn::ModulePtr golden_block(const Case& c, DType dtype) {
  nn::ModulePtr block = make_block(c.block, c.params, c.channels);
  block->to(dtype);
  block->load_state_dict(case_path(c, "state.pth"), /*strict=*/true);
  block->eval();
  return block;
}

}  // namespace

// ---------------------------------------------------------------- against PyTorch

TEST(HybridBlockGoldens, EveryBlockTypeHasACase) {
  std::set<std::string> covered, registered;
  for (const Case& c : cases()) covered.insert(find_block(c.block).name);
  for (const BlockType* t : block_types()) registered.insert(t->name);
  ASSERT_FALSE(covered.empty());
  EXPECT_EQ(covered, registered);
}

TEST(HybridBlockGoldens, KeysAreTheLibrarysInItsOrder) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.id);
    nn::StateDict expected = io::load_state_dict(case_path(c, "state.pth"));
    nn::ModulePtr block = make_block(c.block, c.params, c.channels);
    nn::StateDict actual = block->state_dict();
    EXPECT_EQ(actual.keys(), expected.keys());
    for (const auto& [name, t] : expected) {
      if (actual.contains(name)) {
        EXPECT_EQ(actual.at(name).shape(), t.shape()) << name;
      }
    }
  }
}

TEST(HybridBlockGoldens, Float32EvalOutput) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.id);
    nn::StateDict g = io::load_state_dict(case_path(c, "tensors.safetensors"));
    nn::ModulePtr block = golden_block(c, DType::Float32);
    Tensor y = (*block)(g.at("input").to(DType::Float32));
    EXPECT_EQ(y.dtype(), DType::Float32);
    EXPECT_LE(relative_error(y, g.at("output")), 1e-5);
  }
}

TEST(HybridBlockGoldens, Float64OutputAndGradients) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.id);
    nn::StateDict g = io::load_state_dict(case_path(c, "tensors.safetensors"));
    nn::ModulePtr block = golden_block(c, DType::Float64);
    Tensor x = g.at("input").clone().requires_grad_(true);
    Tensor y = (*block)(x);
    EXPECT_LE(relative_error(y, g.at("output")), 1e-10);
    (y * g.at("grad.cotangent")).sum().backward();
    EXPECT_LE(relative_error(x.grad(), g.at("grad.input")), 1e-10) << "input";
    size_t grads = 0;
    for (const auto& [name, p] : block->named_parameters()) {
      ASSERT_TRUE(g.contains("grad." + name)) << name;
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_LE(gradient_error(p.grad(), g.at("grad." + name)), 1e-10) << name;
      ++grads;
    }
    EXPECT_EQ(grads + 2, static_cast<size_t>(std::count_if(
                             g.begin(), g.end(), [](const auto& item) { return item.first.rfind("grad.", 0) == 0; })))
        << "a parameter torch has a gradient for is missing";
  }
}

TEST(HybridBlockGoldens, TrainModeOutputAndBuffers) {
  int trained = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.id);
    if (!c.train) continue;
    ++trained;
    nn::StateDict g = io::load_state_dict(case_path(c, "tensors.safetensors"));
    nn::ModulePtr block = golden_block(c, DType::Float64);
    block->train();
    Tensor y = (*block)(g.at("input"));
    EXPECT_LE(relative_error(y, g.at("train.output")), 1e-10);
    for (const auto& [name, b] : block->named_buffers()) {
      const Tensor& e = g.at("train.state." + name);
      if (is_floating(e.dtype())) {
        EXPECT_LE(relative_error(b, e), 1e-10) << name;
      } else {
        EXPECT_EQ(b.to_vector(), e.to_vector()) << name;
      }
    }
  }
  EXPECT_GE(trained, 15);
}

// ---------------------------------------------------------------- the registry

TEST(HybridRegistry, EveryNameAndAliasResolves) {
  const std::map<std::string, std::vector<std::string>> names = {
      {"conv", {"conv2d", "convblock"}},
      {"residual", {"res", "resblock"}},
      {"se", {"squeeze_excitation", "seblock", "SEBlock"}},
      {"depthwise", {"dw", "depthwise_separable"}},
      {"inception", {"inception_module"}},
      {"dense", {"dense_block", "densenet"}},
      {"bottleneck", {}},
      {"wide_bottleneck", {}},
      {"grouped_bottleneck", {}},
      {"coord_conv", {"CoordConv"}},
      {"conv_bn_act", {"ConvBNAct"}},
      {"mbconv", {"MBConv", "inverted_residual"}},
      {"fused_mbconv", {"FusedMBConv"}},
      {"channel_attention", {"ca"}},
      {"spatial_attention", {"sa"}},
      {"cbam", {"channel_spatial"}},
      {"cbam_block", {"CBAMBlock", "cbam_attention"}},
      {"eca", {"eca_block", "ECABlock", "efficient_channel"}},
      {"se_enhanced", {"squeeze_excite", "se_v2"}},
      {"multihead_attention", {"mha"}},
      {"attention_block", {}},
      {"drop_path", {"stochastic_depth", "DropPath"}},
      {"layer_scale", {}},
      {"mish", {}},
      {"gem", {"GeM"}},
  };
  for (const auto& [canonical, aliases] : names) {
    EXPECT_EQ(find_block(canonical).name, canonical);
    for (const std::string& alias : aliases) EXPECT_EQ(find_block(alias).name, canonical) << alias;
  }
  // The SEBlock alias the library forgot builds an SEBlock.
  nn::ModulePtr se = make_block("SEBlock", {{"reduction", int64_t{4}}}, {.in_channels = 16, .out_channels = 16});
  EXPECT_EQ(se->type_name(), "SEBlock");
  EXPECT_EQ(se->get_parameter("excitation.0.weight").shape(), (Shape{4, 16}));
}

TEST(HybridRegistry, CategoriesAndClassNames) {
  EXPECT_EQ(find_block("se").category, "block");
  EXPECT_EQ(find_block("cbam").class_name, "ChannelSpatialAttention");
  EXPECT_EQ(find_block("se_enhanced").class_name, "SqueezeExcitation");
  EXPECT_EQ(find_block("mha").category, "attention");
  EXPECT_EQ(find_block("gem").category, "other");
  std::vector<const BlockType*> types = block_types();
  EXPECT_TRUE(std::is_sorted(types.begin(), types.end(),
                             [](const BlockType* a, const BlockType* b) { return a->name < b->name; }));
  for (const BlockType* t : types) EXPECT_FALSE(t->description.empty()) << t->name;
}

TEST(HybridRegistry, LookupIsExact) {
  EXPECT_THAT(error_of([] { find_block("Se"); }), HasSubstr("unknown block 'Se'"));
  EXPECT_THAT(error_of([] { find_block("seblock "); }), HasSubstr("unknown block"));
}

TEST(HybridRegistry, UnknownNameListsTheCanonicalNames) {
  std::string message = error_of([] { make_block("squeeze", {}, {.out_channels = 8}); });
  EXPECT_THAT(message, HasSubstr("unknown block 'squeeze'"));
  std::string names;
  for (const BlockType* t : block_types()) names += (names.empty() ? "" : ", ") + t->name;
  EXPECT_THAT(message, HasSubstr("known blocks: " + names));
  EXPECT_THAT(names, HasSubstr("attention_block, bottleneck, cbam, cbam_block, channel_attention, conv"));
}

TEST(HybridRegistry, ParameterErrors) {
  InferredChannels c16{.in_channels = 16, .out_channels = 16};
  EXPECT_THAT(error_of([&] {
                make_block("se", {{"reductio", int64_t{8}}}, c16);
              }),
              HasSubstr("block 'se' (SEBlock) has no parameter 'reductio'; it accepts: channels, reduction, "
                        "activation"));
  EXPECT_THAT(error_of([&] {
                make_block("mish", {{"inplace", true}}, c16);
              }),
              HasSubstr("block 'mish' (Mish) has no parameter 'inplace'; it accepts: none"));
  EXPECT_THAT(error_of([&] {
                make_block("se", {{"reduction", std::string("8")}}, c16);
              }),
              HasSubstr("block 'se' (SEBlock): parameter 'reduction' must be an int, got the string \"8\""));
  EXPECT_THAT(error_of([&] {
                make_block("se", {{"reduction", 2.5}}, c16);
              }),
              HasSubstr("parameter 'reduction' must be an int, got the number 2.5"));
  EXPECT_THAT(error_of([&] {
                make_block("gem", {{"learnable", int64_t{1}}}, c16);
              }),
              HasSubstr("parameter 'learnable' must be a bool, got the int 1"));
  EXPECT_THAT(error_of([&] {
                make_block("se", {{"activation", std::string("swsh")}}, c16);
              }),
              HasSubstr("parameter 'activation' must be one of relu, leaky_relu, prelu, gelu, silu, sigmoid, tanh, "
                        "elu, selu; got \"swsh\""));
  EXPECT_THAT(error_of([&] {
                make_block("se", {{"channels", int64_t{0}}}, c16);
              }),
              HasSubstr("parameter 'channels' must be a positive channel count, got 0"));
  EXPECT_THAT(error_of([&] {
                make_block("inception", {{"out_3x3", int64_t{4}}, {"out_5x5", int64_t{2}}}, c16);
              }),
              HasSubstr("block 'inception' (InceptionModule): parameter 'out_1x1' (an int) is required"));
  EXPECT_THAT(error_of([&] { make_block("mha", {{"batch_first", false}}, c16); }), HasSubstr("batch_first=false"));
  // An int given for a number converts.
  auto gem = make_block("gem", {{"p", int64_t{2}}}, c16);
  EXPECT_EQ(gem->get_parameter("p").item_double(), 2.0);
}

TEST(HybridRegistry, ChannelsAreInferredOrGiven) {
  EXPECT_THAT(error_of([] { make_block("se", {}, {}); }),
              HasSubstr("block 'se' (SEBlock): the channels of the target could not be inferred for parameter "
                        "'channels' (the target's output channels); the patch may give it"));
  EXPECT_THAT(error_of([] { make_block("conv", {}, {.out_channels = 8}); }),
              HasSubstr("could not be inferred for parameter 'in_channels' (the target's input channels)"));
  // Given channels need no inference; given ones win over inferred ones.
  auto se = std::dynamic_pointer_cast<Block>(make_block("se", {{"channels", int64_t{8}}}, {}));
  EXPECT_EQ(se->output_channels(), 8);
  auto conv = std::dynamic_pointer_cast<Block>(
      make_block("conv", {{"out_channels", int64_t{6}}}, {.in_channels = 3, .out_channels = 12}));
  EXPECT_EQ(conv->output_channels(), 6);
  EXPECT_EQ(conv->get_parameter("conv.weight").shape(), (Shape{6, 3, 3, 3}));
}

TEST(HybridRegistry, OutputChannels) {
  InferredChannels c{.in_channels = 8, .out_channels = 16};
  auto out = [&](const std::string& name, const BlockParams& params = {}) {
    return std::dynamic_pointer_cast<Block>(make_block(name, params, c))->output_channels();
  };
  EXPECT_EQ(out("residual"), 16);
  EXPECT_EQ(out("dense", {{"num_layers", int64_t{3}}, {"growth_rate", int64_t{4}}}), 8 + 3 * 4);
  EXPECT_EQ(out("inception", {{"out_1x1", int64_t{4}}, {"out_3x3", int64_t{6}}, {"out_5x5", int64_t{2}}}),
            4 + 6 + 2 + 2);
  EXPECT_EQ(out("cbam_block"), 16);
  EXPECT_EQ(out("layer_scale"), 16);
  EXPECT_EQ(out("gem"), std::nullopt);
  EXPECT_EQ(out("mish"), std::nullopt);
  EXPECT_EQ(out("sa"), std::nullopt);
}

TEST(HybridRegistry, LayoutsAreChecked) {
  InferredChannels tokens{.in_channels = 16, .out_channels = 16, .layout = Layout::Tokens};
  EXPECT_THAT(error_of([&] { make_block("GeM", {}, tokens); }),
              HasSubstr("block 'gem' (GeM) cannot take the target's output laid out (N, L, C); it takes "
                        "(N, C, H, W), (N, H, W, C)"));
  EXPECT_THAT(error_of([&] { make_block("se", {}, tokens); }), HasSubstr("block 'se' (SEBlock) cannot take"));
  for (const char* name : {"mish", "drop_path", "layer_scale", "mha"}) EXPECT_NO_THROW(make_block(name, {}, tokens));
  EXPECT_EQ(std::string(layout_name(Layout::NHWC)), "(N, H, W, C)");
  // A map block given a tensor of the wrong rank says what it expected.
  auto se = make_block("se", {}, {.out_channels = 16, .layout = Layout::NHWC});
  EXPECT_THAT(error_of([&] {
                (*se)(randn({2, 16}));
              }),
              HasSubstr("SEBlock: expected a feature map (N, H, W, C), got shape [2, 16]"));
}

TEST(HybridRegistry, UserBlockTypes) {
  int made = 0;
  BlockType type{.name = "test_scale",
                 .aliases = {"TestScale"},
                 .category = "other",
                 .class_name = "LayerScale",
                 .description = "a user block",
                 .params = {{.name = "dim", .kind = ParamKind::Channels},
                            {.name = "init", .kind = ParamKind::Float, .default_value = 0.5}},
                 .layouts = {Layout::Tokens},
                 .make = [&made](const BlockArgs& a) -> nn::ModulePtr {
                   ++made;
                   return std::make_shared<LayerScale>(a.get_int("dim"), a.get_float("init"), a.layout());
                 }};
  register_block(type);
  nn::ModulePtr block = make_block("TestScale", {}, {.out_channels = 5, .layout = Layout::Tokens});
  EXPECT_EQ(made, 1);
  EXPECT_EQ(block->get_parameter("gamma").to_vector(), std::vector<double>(5, 0.5));
  EXPECT_EQ(find_block("test_scale").aliases, std::vector<std::string>{"TestScale"});
  EXPECT_THAT(error_of([&] { register_block(type); }),
              HasSubstr("register_block: the name 'test_scale' of block 'test_scale' is taken by block 'test_scale'"));
  BlockType clash = type;
  clash.name = "my_se";
  clash.aliases = {"SEBlock"};
  EXPECT_THAT(error_of([&] { register_block(clash); }),
              HasSubstr("the name 'SEBlock' of block 'my_se' is taken by block 'se' (SEBlock)"));
  EXPECT_THAT(error_of([] { find_block("my_se"); }), HasSubstr("unknown block 'my_se'"));  // nothing added
  BlockType nameless = type;
  nameless.name = "";
  EXPECT_THAT(error_of([&] { register_block(nameless); }), HasSubstr("needs a name"));
}

// ---------------------------------------------------------------- module behaviour

TEST(HybridBlocks, DropPathDropsWholeSamplesInTraining) {
  manual_seed(7);
  Tensor x = randn({64, 3, 4}) + 5;  // no zeros
  for (bool scale : {true, false}) {
    auto block = make_block("drop_path", {{"drop_prob", 0.25}, {"scale_by_keep", scale}},
                            {.out_channels = 4, .layout = Layout::Tokens});
    Tensor y = (*block)(x);
    double factor = scale ? 1 / 0.75 : 1;
    int dropped = 0, kept = 0;
    for (int64_t i = 0; i < x.size(0); ++i) {
      std::vector<double> yi = y[i].to_vector(), xi = x[i].to_vector();
      bool zero = std::all_of(yi.begin(), yi.end(), [](double v) { return v == 0; });
      if (zero) {
        ++dropped;
        continue;
      }
      ++kept;
      EXPECT_LE(relative_error(y[i], x[i] * factor), 1e-7) << "sample " << i;
    }
    EXPECT_GT(dropped, 4);
    EXPECT_GT(kept, 30);
    block->eval();
    EXPECT_TRUE((*block)(x).is_same(x));
  }
  auto off = make_block("drop_path", {}, {.out_channels = 4});
  EXPECT_TRUE((*off)(x).is_same(x));  // drop_prob 0: the identity in training too
}

TEST(HybridBlocks, LayerScaleScalesTheChannelDimOfItsLayout) {
  Tensor x = randn({2, 3, 4, 5});
  auto nchw = make_block("layer_scale", {{"init_value", 2.0}}, {.out_channels = 3});
  auto nhwc = make_block("layer_scale", {{"init_value", 2.0}}, {.out_channels = 5, .layout = Layout::NHWC});
  EXPECT_LE(relative_error((*nchw)(x), x * 2), 1e-7);
  EXPECT_LE(relative_error((*nhwc)(x), x * 2), 1e-7);
  EXPECT_THAT(error_of([&] { (*nchw)(randn({2, 5, 4, 3})); }), HasSubstr("LayerScale(3): expected (N, C, H, W)"));
}

TEST(HybridBlocks, ForwardGoesThroughRegisteredChildren) {
  auto se = make_block("se", {{"reduction", int64_t{4}}}, {.out_channels = 8});
  int calls = 0;
  se->get_submodule("excitation.1")
      ->register_forward_hook(
          [&](nn::Module&, const nn::TensorList&, const nn::TensorList&) -> std::optional<nn::TensorList> {
            ++calls;
            return std::nullopt;
          });
  Tensor x = randn({2, 8, 3, 3});
  (*se)(x);
  EXPECT_EQ(calls, 1);
  // Replacing the gate by Identity changes the output to x * (excitation before the sigmoid).
  se->set_submodule("excitation.3", std::make_shared<nn::Identity>());
  Tensor s = (*se->get_submodule("excitation"))(mean(x, {2, 3}));
  EXPECT_LE(relative_error((*se)(x), x * s.reshape({2, 8, 1, 1})), 1e-6);
}

TEST(HybridBlocks, CloneCopiesTheBlock) {
  for (const char* name : {"cbam_block", "mbconv", "residual", "mha", "gem"}) {
    auto block = make_block(name, {}, {.in_channels = 16, .out_channels = 16});
    block->eval();
    nn::ModulePtr copy = block->clone();
    Tensor x = rand({2, 16, 4, 4}) + 0.1;
    EXPECT_LE(relative_error((*copy)(x), (*block)(x)), 1e-7) << name;
    EXPECT_EQ(copy->type_name(), block->type_name());
  }
}

TEST(HybridBlocks, ReprAsTheLibrarys) {
  EXPECT_EQ(make_block("gem", {}, {})->repr(), "GeM(p=3.00, eps=1e-06)");
  EXPECT_EQ(make_block("drop_path", {{"drop_prob", 0.1}}, {})->repr(), "DropPath(drop_prob=0.1)");
  std::string se = make_block("se", {{"activation", std::string("prelu")}}, {.out_channels = 32})->repr();
  EXPECT_THAT(se, HasSubstr("(excitation): Sequential(\n    (0): Linear(in_features=32, out_features=2, bias=True)\n"
                            "    (1): PReLU(num_parameters=1)"));
}
