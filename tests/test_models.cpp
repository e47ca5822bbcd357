// The model registry and the conformance of each backbone with torchvision (model_conformance.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <regex>
#include <tuple>
#include <utility>

#include "compare.h"
#include "model_conformance.h"
#include "test_helpers.h"
#include "torch_golden.h"
#include "tvc/autograd.h"
#include "tvc/internal/kernel.h"
#include "tvc/models/models.h"
#include "tvc/models/weights.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"
#include "tvc/profiler.h"
#include "tvc/serialize.h"

namespace tvc {
namespace {

using ::testing::HasSubstr;

TEST(ModelRegistry, UnknownNamesSuggestTheClosest) {
  std::string msg = test::error_of([] { models::create("resnet5"); });
  EXPECT_THAT(msg, HasSubstr("unknown model 'resnet5'"));
  EXPECT_THAT(msg, HasSubstr("did you mean 'resnet50'"));
}

TEST(ModelRegistry, OptionsAreChecked) {
  EXPECT_THAT(test::error_of([] { models::create("resnet18", {.dropout = 0.3}); }), HasSubstr("no dropout option"));
  EXPECT_THAT(test::error_of([] { models::create("resnet18", {.num_classes = 0}); }), HasSubstr("num_classes"));
}

using test::ScopedEnv;

bool same_state(const nn::Module& a, const nn::Module& b) {
  nn::StateDict sa = a.state_dict(), sb = b.state_dict();
  if (sa.keys() != sb.keys()) return false;
  for (const auto& [name, t] : sa)
    if (test::tensor_bytes(t) != test::tensor_bytes(sb.at(name))) return false;
  return true;
}

TEST(ModelWeights, TagsResolveToTorchvisionFiles) {
  EXPECT_EQ(models::weights_tag("resnet50", "DEFAULT").file_name, "resnet50-11ad3fa6.pth");
  EXPECT_EQ(models::weights_tag("resnet50", "DEFAULT").preprocessing.resize_size, 232);
  EXPECT_EQ(models::weights_tag("resnet50", "IMAGENET1K_V1").file_name, "resnet50-0676ba61.pth");
  EXPECT_EQ(models::weights_tag("vgg16", "DEFAULT").file_name, "vgg16-397923af.pth");
  EXPECT_THAT(test::error_of([] { models::weights_tag("resnet18", "IMAGENET1K_V2"); }),
              HasSubstr("resnet18 has no weights tagged 'IMAGENET1K_V2' (its tags: DEFAULT, IMAGENET1K_V1)"));
  EXPECT_EQ(models::imagenet_categories().size(), 1000u);
  EXPECT_EQ(models::imagenet_categories()[1], "goldfish");
  for (const auto& name : models::list()) EXPECT_FALSE(models::weights_tags(name).empty()) << name;
}

// Files found in $TVC_WEIGHTS, then $TORCH_HOME/hub/checkpoints, as .pth or .safetensors.
TEST(ModelWeights, TagFilesAreFoundInTheSearchPath) {
  test::TempDir dir;
  ScopedEnv torch_home("TORCH_HOME", dir / "torch");
  ScopedEnv tvc_weights("TVC_WEIGHTS", dir / "tvc");
  ScopedEnv home("HOME", dir / "home");
  std::string missing = test::error_of([] { models::create("resnet18", {.weights = "DEFAULT"}); });
  EXPECT_THAT(missing, HasSubstr("no file named resnet18-f37072fd.pth"));
  EXPECT_THAT(missing, HasSubstr(dir / "tvc/resnet18-f37072fd.pth"));
  EXPECT_THAT(missing, HasSubstr(dir / "torch/hub/checkpoints/resnet18-f37072fd.safetensors"));
  EXPECT_THAT(missing, HasSubstr(dir / "home/.cache/torch/hub/checkpoints/resnet18-f37072fd.pth"));

  manual_seed(7);
  models::BackbonePtr source = models::create("resnet18");
  std::filesystem::create_directories(dir / "torch/hub/checkpoints");
  io::save_pth(dir / "torch/hub/checkpoints/resnet18-f37072fd.pth", io::Value(source->state_dict()));
  models::BackbonePtr loaded = models::create("resnet18", {.weights = "DEFAULT"});
  EXPECT_TRUE(same_state(*loaded, *source));

  // $TVC_WEIGHTS comes first; a .safetensors file under torchvision's stem is found too.
  manual_seed(8);
  models::BackbonePtr other = models::create("resnet18");
  std::filesystem::create_directories(dir / "tvc");
  io::save_safetensors(dir / "tvc/resnet18-f37072fd.safetensors", other->state_dict());
  models::BackbonePtr preferred = models::create("resnet18");
  models::LoadReport report = models::load_weights(*preferred, "IMAGENET1K_V1");
  EXPECT_EQ(report.file, dir / "tvc/resnet18-f37072fd.safetensors");
  EXPECT_TRUE(same_state(*preferred, *other));
}

// 1000-class weights into a 10-class model: everything but the classifier loads.
TEST(ModelWeights, OtherNumClassesSkipsOnlyTheClassifier) {
  test::TempDir dir;
  manual_seed(9);
  models::BackbonePtr source = models::create("resnet18");
  io::save_safetensors(dir / "w.safetensors", source->state_dict());
  models::BackbonePtr small = models::create("resnet18", {.num_classes = 10});
  Tensor fc_before = small->state_dict().at("fc.weight").clone();
  models::LoadReport report = models::load_weights(*small, dir / "w.safetensors");
  EXPECT_EQ(report.skipped, (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_EQ(test::tensor_bytes(small->state_dict().at("fc.weight")), test::tensor_bytes(fc_before));
  EXPECT_EQ(test::tensor_bytes(small->state_dict().at("layer4.1.bn2.running_var")),
            test::tensor_bytes(source->state_dict().at("layer4.1.bn2.running_var")));
}

// create() with weights and no num_classes takes the weights' class count (nothing skipped);
// with another num_classes the report lists the classifier's tensors, never silently.
TEST(ModelWeights, CreateTakesTheClassCountOfTheWeights) {
  test::TempDir dir;
  manual_seed(10);
  models::BackbonePtr source = models::create("mobilenet_v3_small", {.num_classes = 7});
  io::save_safetensors(dir / "w7.safetensors", source->state_dict());
  models::LoadReport report;
  models::BackbonePtr loaded = models::create("mobilenet_v3_small", {.weights = dir / "w7.safetensors"}, &report);
  EXPECT_EQ(report.file, dir / "w7.safetensors");
  EXPECT_TRUE(report.skipped.empty());
  EXPECT_TRUE(same_state(*loaded, *source));
  models::BackbonePtr other =
      models::create("mobilenet_v3_small", {.num_classes = 3, .weights = dir / "w7.safetensors"}, &report);
  EXPECT_EQ(report.skipped, (std::vector<std::string>{"classifier.3.weight", "classifier.3.bias"}));
  EXPECT_EQ(other->state_dict().at("classifier.3.weight").shape(), (Shape{3, 1024}));
  EXPECT_EQ(models::create("mobilenet_v3_small")->state_dict().at("classifier.3.bias").shape(), (Shape{1000}));
  EXPECT_EQ(models::classifier_path("mobilenet_v3_small"), "classifier.3");
}

// resnet50's weights do not fit resnet101: an error naming the keys, the model unchanged.
TEST(ModelWeights, WeightsThatDoNotFitLeaveTheModelUnchanged) {
  test::TempDir dir;
  io::save_safetensors(dir / "r50.safetensors", models::create("resnet50")->state_dict());
  models::BackbonePtr model = models::create("resnet101");
  nn::ModulePtr before = model->clone();
  std::string msg = test::error_of([&] { models::load_weights(*model, dir / "r50.safetensors"); });
  EXPECT_THAT(msg, HasSubstr("resnet101: the weights in '" + (dir / "r50.safetensors") + "' do not fit"));
  EXPECT_THAT(msg, HasSubstr("Missing key(s) in state_dict: \"layer3.6.conv1.weight\""));
  EXPECT_TRUE(same_state(*model, *before));
}

// tvc run on the goldens' weights and inputs, in eval and train mode, with the stage tensors.
TEST(ModelCli, RunMatchesTorchvision) {
  test::ModelCheck check{.model = "resnet18", .num_classes = 10};
  std::string golden = test::golden_folder(check);
  ASSERT_FALSE(golden.empty());
  io::SafetensorsFile goldens = io::SafetensorsFile::open(golden + "/goldens.safetensors");
  test::TempDir dir;
  io::save_safetensors(dir / "eval.safetensors", {{"input", goldens.tensor("eval.1.input")}});
  io::save_safetensors(dir / "train.safetensors", {{"input", goldens.tensor("train.input")}});
  std::string common = "run resnet18 --num-classes 10 --weights " + golden + "/weights.pth ";

  test::TvcRun eval = test::run_tvc(
      dir, common + "--input " + (dir / "eval.safetensors") + " --output " + (dir / "out.safetensors") + " --features");
  ASSERT_EQ(eval.status, 0) << eval.err;
  EXPECT_THAT(eval.out, HasSubstr("output [1, 10] and 5 stage tensors"));
  io::SafetensorsFile out = io::SafetensorsFile::open(dir / "out.safetensors");
  EXPECT_LE(test::relative_error(out.tensor("output"), goldens.tensor("eval.1.output")), 1e-4);
  std::vector<std::string> names;
  for (const auto& e : out.entries()) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"layer1", "layer2", "layer3", "layer4", "output", "relu"}));

  test::TvcRun train = test::run_tvc(dir, common + "--train-mode --input " + (dir / "train.safetensors") +
                                              " --output " + (dir / "train_out.safetensors"));
  ASSERT_EQ(train.status, 0) << train.err;
  EXPECT_LE(test::relative_error(io::SafetensorsFile::open(dir / "train_out.safetensors").tensor("output"),
                                 goldens.tensor("train.output")),
            1e-3);

  test::TvcRun bad = test::run_tvc(dir, common + "--input " + (dir / "absent.safetensors") + " --output x.safetensors");
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("absent.safetensors"));
  test::TvcRun listed = test::run_tvc(dir, "list");
  EXPECT_EQ(listed.status, 0);
  EXPECT_THAT(listed.out, HasSubstr("\nresnet50\n"));
}

// "key (shape) dtype" of each state_dict entry, in order.
std::vector<std::string> state_entries(const nn::StateDict& state) {
  std::vector<std::string> out;
  for (const auto& [key, t] : state) {
    std::string shape;
    for (int64_t d : t.shape()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    out.push_back(key + " (" + shape + ") " + dtype_name(t.dtype()));
  }
  return out;
}

// Each (model, num_classes)'s state_dict against torchvision's: keys, order, shapes, dtypes
// (torchvision's side is one cached Python call for every model with 1000 and 10 classes).
// Python that turns torch.nn.init's initialisers into no-ops, for the checks that need only a
// model's structure (names, shapes, dtypes, rates): initialising is most of the time torchvision
// takes to build a big model.
const std::string kTorchInitOff = R"(
import torch
for _f in dir(torch.nn.init):
    if _f.endswith("_") and not _f.startswith("_"):
        setattr(torch.nn.init, _f, lambda tensor, *args, **kwargs: tensor)
)";

void expect_torchvision_state_dicts(const std::vector<std::pair<std::string, int64_t>>& cases) {
  std::string names;
  for (const auto& [name, classes] : cases)
    if (names.find(" " + name + " ") == std::string::npos) names += " " + name + " ";
  nlohmann::json want = test::torch_json(kTorchInitOff + R"(
import json, torchvision
out = {}
for name in ")" + names + R"(".split():
    for classes in (1000, 10):
        state = torchvision.models.__dict__[name](num_classes=classes).state_dict()
        out[f"{name}/{classes}"] = [
            f"{k} ({', '.join(map(str, v.shape))}) {str(v.dtype)[len('torch.'):]}" for k, v in state.items()]
print(json.dumps(out))
)");
  if (want.is_null()) return;  // torch is missing: torch_json recorded the failure
  for (const auto& [name, classes] : cases)
    EXPECT_EQ(state_entries(models::create(name, {.num_classes = classes})->state_dict()),
              want.at(name + "/" + std::to_string(classes)).get<std::vector<std::string>>())
        << name << " with " << classes << " classes";
}

// Creating the big models takes seconds each (initialising up to 144M parameters), so CI checks
// each family with both class counts ...
TEST(ModelZoo, StateDictsAreTorchvisions) {
  expect_torchvision_state_dicts({{"resnet18", 10},
                                  {"resnet50", 1000},
                                  {"resnext50_32x4d", 1000},
                                  {"wide_resnet50_2", 1000},
                                  {"vgg11", 1000},
                                  {"vgg11_bn", 10},
                                  {"densenet121", 1000},
                                  {"densenet121", 10},
                                  {"densenet161", 1000},
                                  {"mobilenet_v2", 1000},
                                  {"mobilenet_v2", 10},
                                  {"mobilenet_v3_small", 1000},
                                  {"mobilenet_v3_large", 10},
                                  {"efficientnet_b0", 1000},
                                  {"efficientnet_b3", 10},
                                  {"efficientnet_v2_s", 1000},
                                  {"convnext_tiny", 1000},
                                  {"convnext_tiny", 10},
                                  {"vit_b_16", 1000},
                                  {"vit_b_32", 10},
                                  {"swin_t", 1000},
                                  {"swin_t", 10}});
}
// ... and this every model with both.
TEST(ModelConformanceFull, StateDictsAreTorchvisions) {
  std::vector<std::pair<std::string, int64_t>> cases;
  for (const auto& name : models::list())
    for (int64_t classes : {1000, 10}) cases.emplace_back(name, classes);
  expect_torchvision_state_dicts(cases);
}

// The p of each Dropout of a model, in order.
std::vector<double> dropout_probabilities(const models::BackbonePtr& model) {
  std::vector<double> ps;
  for (const auto& m : model->modules())
    if (auto* d = dynamic_cast<nn::Dropout*>(m.get())) ps.push_back(d->p.to_double());
  return ps;
}

// torchvision's initialisation rules of a family.
enum class ConvInit {
  kaiming_fan_out,
  kaiming_fan_in,
  trunc_normal_002,
  uniform_in  // Conv2d's own U(-1/sqrt(fan_in), 1/sqrt(fan_in)), bias too (Swin)
};
enum class LinearInit {
  normal_001,       // N(0, 0.01^2), bias 0
  uniform_in,       // Linear's own U(-1/sqrt(in), 1/sqrt(in))
  uniform_out,      // U(-1/sqrt(out), 1/sqrt(out)), bias 0 (EfficientNet)
  trunc_normal_002  // trunc_normal(std 0.02), bias 0 (ConvNeXt)
};
struct InitRules {
  ConvInit conv;  // kaiming: N(0, 2 / fan) with fan = fan_out or fan_in; bias 0 but for uniform_in
  LinearInit linear;
};

// Every layer's initial values against the family's rules (BatchNorm and LayerNorm: weight 1,
// bias 0; Swin's relative-position tables trunc_normal(std 0.02)); the spread of a weight within
// 30% of the rule's (loose enough for small layers).
void expect_torchvision_init(const std::string& name, InitRules rules) {
  auto rms = [](const Tensor& t) { return std::sqrt(t.to(DType::Float64).pow(2).mean().item<double>()); };
  auto max_abs = [](const Tensor& t) { return max(t.to(DType::Float64).abs()).item<double>(); };
  models::BackbonePtr model = models::create(name);
  for (const auto& [path, m] : model->named_modules()) {
    SCOPED_TRACE(name + " " + path);
    if (auto* conv = dynamic_cast<nn::Conv2d*>(m.get())) {
      int64_t channels =
          rules.conv == ConvInit::kaiming_fan_out ? conv->out_channels : conv->in_channels / conv->groups;
      double fan = static_cast<double>(channels * conv->kernel_size[0] * conv->kernel_size[1]);
      // trunc_normal(0, 0.02) on [-2, 2] is N(0, 0.02^2) to 1e-300.
      double want = rules.conv == ConvInit::trunc_normal_002 ? 0.02
                    : rules.conv == ConvInit::uniform_in     ? 1 / std::sqrt(3 * fan)
                                                             : std::sqrt(2 / fan);
      EXPECT_NEAR(rms(conv->weight()) / want, 1, 0.3);
      if (conv->bias().defined()) {
        EXPECT_LE(max_abs(conv->bias()), rules.conv == ConvInit::uniform_in ? 1 / std::sqrt(fan) : 0);
      }
    } else if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(m.get())) {
      EXPECT_EQ(max_abs(bn->weight() - 1), 0);
      EXPECT_EQ(max_abs(bn->bias()), 0);
    } else if (auto* ln = dynamic_cast<nn::LayerNorm*>(m.get())) {
      EXPECT_EQ(max_abs(ln->weight() - 1), 0);
      EXPECT_EQ(max_abs(ln->bias()), 0);
    } else if (auto* linear = dynamic_cast<nn::Linear*>(m.get())) {
      const double in = static_cast<double>(linear->in_features), out = static_cast<double>(linear->out_features);
      double want = rules.linear == LinearInit::normal_001    ? 0.01
                    : rules.linear == LinearInit::uniform_in  ? 1 / std::sqrt(3.0 * in)
                    : rules.linear == LinearInit::uniform_out ? 1 / std::sqrt(3.0 * out)
                                                              : 0.02;
      EXPECT_NEAR(rms(linear->weight()) / want, 1, 0.3);
      if (rules.linear != LinearInit::uniform_in && linear->bias().defined()) {
        EXPECT_EQ(max_abs(linear->bias()), 0);
      }
    } else if (m->has_parameter("relative_position_bias_table")) {
      EXPECT_NEAR(rms(m->parameter("relative_position_bias_table")) / 0.02, 1, 0.3);
    }
  }
}

TEST(ModelZoo, InitialisationIsTorchvisions) {
  manual_seed(11);
  expect_torchvision_init("resnet50", {ConvInit::kaiming_fan_out, LinearInit::uniform_in});
  expect_torchvision_init("vgg11_bn", {ConvInit::kaiming_fan_out, LinearInit::normal_001});
  expect_torchvision_init("densenet121", {ConvInit::kaiming_fan_in, LinearInit::uniform_in});
  for (const char* name : {"mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large"})
    expect_torchvision_init(name, {ConvInit::kaiming_fan_out, LinearInit::normal_001});
  for (const char* name : {"efficientnet_b0", "efficientnet_v2_s"})
    expect_torchvision_init(name, {ConvInit::kaiming_fan_out, LinearInit::uniform_out});
  expect_torchvision_init("convnext_tiny", {ConvInit::trunc_normal_002, LinearInit::trunc_normal_002});
  expect_torchvision_init("swin_t", {ConvInit::uniform_in, LinearInit::trunc_normal_002});
}

TEST(ModelStages, Resnet50) { test::check_stages("resnet50", {"relu", "layer1", "layer2", "layer3", "layer4"}); }
TEST(ModelConformance, Resnext50_32x4d) { test::check_model({.model = "resnext50_32x4d"}); }
TEST(ModelConformance, Resnet18With10Classes) { test::check_model({.model = "resnet18", .num_classes = 10}); }
// Mutation test of the float32 gradient criterion (ours within 3x of PyTorch's own float32
// error, both runs pinned to the float64 run's ReLU and max-pool decisions): it must fail a
// convolution that works in bfloat16. The mutated kernels run the real ones and round every
// float32 result to bfloat16 (round to nearest even), the least error a kernel accumulating in
// bfloat16 makes: its final sum is a bfloat16 number too. They are added to the kernel table as
// a backend, active only while a RoundConvolutionsToBfloat16 lives.
std::atomic<bool> g_round_convolutions{false};
constexpr Op kConvOps[] = {Op::conv2d, Op::conv2d_backward_input, Op::conv2d_backward_weight};
KernelFn g_exact_convolutions[std::size(kConvOps)];

template <size_t I>
void conv_rounded_to_bfloat16(const KernelArgs& args) {
  g_exact_convolutions[I](args);
  if (!g_round_convolutions.load()) return;
  for (const Tensor& t : args.out) {
    if (t.dtype() != DType::Float32) continue;
    ASSERT_TRUE(t.is_contiguous() || t.is_contiguous(MemoryFormat::ChannelsLast));  // dense: numel values
    auto* values = static_cast<float*>(t.raw_data());
    for (int64_t i = 0; i < t.numel(); ++i) values[i] = BFloat16(values[i]);
  }
}

void add_rounded_convolutions(KernelRegistry& registry) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    ((g_exact_convolutions[I] = registry.get(kConvOps[I], Device::CPU),
      registry.set(kConvOps[I], Device::CPU, conv_rounded_to_bfloat16<I>)),
     ...);
  }
  (std::make_index_sequence<std::size(kConvOps)>());
}

struct RoundConvolutionsToBfloat16 {
  RoundConvolutionsToBfloat16() {
    add_backend(add_rounded_convolutions);
    g_round_convolutions = true;
  }
  ~RoundConvolutionsToBfloat16() { g_round_convolutions = false; }
};

TEST(ModelConformance, Float32GradientCriterionFailsABfloat16Convolution) {
  const test::ModelCheck check{.model = "resnet18", .num_classes = 10};  // Resnet18With10Classes' goldens
  test::ModelErrors exact = test::gradient_errors(check);
  EXPECT_LE(exact.grad32_ratio, 3.0) << "the real kernels: our error " << exact.grad32;
  test::ModelErrors rounded;
  {
    RoundConvolutionsToBfloat16 mutation;
    rounded = test::gradient_errors(check);
  }
  EXPECT_GT(rounded.grad32_ratio, 3.0) << "bfloat16 convolutions: our error " << rounded.grad32 << ", PyTorch's "
                                       << rounded.grad32_torch;
  EXPECT_LE(rounded.grad64, 1e-8) << "float64 runs are not mutated";
  std::printf("float32 gradient criterion: real kernels %.2fx PyTorch's own error, bfloat16 convolutions %.0fx\n",
              exact.grad32_ratio, rounded.grad32_ratio);
}

TEST(ModelConformanceFull, ResNet) {
  for (const char* name : {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext101_32x8d",
                           "resnext101_64x4d", "wide_resnet50_2", "wide_resnet101_2"})
    test::check_model({.model = name});
}

// ---------------------------------------------------------------- MobileNet v2 and v3 (mobilenet.cpp)

TEST(ModelConformance, MobilenetV2) { test::check_model({.model = "mobilenet_v2"}); }
TEST(ModelConformance, MobilenetV3Small) { test::check_model({.model = "mobilenet_v3_small"}); }
TEST(ModelConformanceFull, MobilenetV3Large) { test::check_model({.model = "mobilenet_v3_large"}); }

TEST(ModelStages, MobileNet) {
  test::check_stages("mobilenet_v2", {"features.1", "features.3", "features.6", "features.13", "features.18"});
  test::check_stages("mobilenet_v3_small", {"features.0", "features.1", "features.3", "features.8", "features.12"});
  test::check_stages("mobilenet_v3_large", {"features.1", "features.3", "features.6", "features.12", "features.16"});
}

const char* const kMobileNets[] = {"mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large"};

// The classifier's Dropout: p = 0.2 by default (torchvision's), or Options::dropout.
TEST(MobileNet, DropoutIsAnOption) {
  for (const char* name : kMobileNets) {
    EXPECT_EQ(dropout_probabilities(models::create(name)), std::vector<double>{0.2}) << name;
    EXPECT_EQ(dropout_probabilities(models::create(name, {.dropout = 0.5})), std::vector<double>{0.5}) << name;
  }
}

// ---------------------------------------------------------------- VGG and DenseNet (vgg.cpp, densenet.cpp)

TEST(ModelConformance, Densenet121) { test::check_model({.model = "densenet121"}); }

// The rest of both families, slow (half a minute per VGG): excluded from the `models` meson
// test, run by tools/conformance.sh (results in docs/conformance.md).
TEST(ModelConformanceFull, Vgg) {
  for (const char* name : {"vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn"})
    test::check_model({.model = name});
  test::check_model({.model = "vgg11", .num_classes = 10});
}
TEST(ModelConformanceFull, DenseNet) {
  for (const char* name : {"densenet161", "densenet169", "densenet201"}) test::check_model({.model = name});
  test::check_model({.model = "densenet121", .num_classes = 10});
}

const std::vector<std::string> kDenseNetNodes = {"features.relu0", "features.denseblock1", "features.denseblock2",
                                                 "features.denseblock3", "features.norm5"};

TEST(ModelStages, VggAndDenseNet) {
  test::check_stages("vgg11_bn",
                     {"features.2", "features.6", "features.13", "features.20", "features.27", "features.28"});
  test::check_stages("densenet121", kDenseNetNodes);
}

// VGG's stage nodes from torchvision's layer configuration (convolution widths, 0 for a max
// pool): features is conv, [bn,] relu per convolution and one module per pool; a stage ends at
// the ReLU before each pool, and the last pool closes the last one.
std::vector<std::string> vgg_nodes(const std::vector<int>& config, bool batch_norm) {
  std::vector<std::string> nodes;
  int index = 0;
  for (int width : config) {
    if (width == 0) nodes.push_back("features." + std::to_string(index - 1));
    index += width == 0 ? 1 : (batch_norm ? 3 : 2);
  }
  nodes.push_back("features." + std::to_string(index - 1));
  return nodes;
}

// Every model not in the stage checks above (run by tools/conformance.sh).
TEST(ModelStagesFull, AllOtherModels) {
  for (const char* name : {"resnet18", "resnet34", "resnet101", "resnet152", "resnext50_32x4d", "resnext101_32x8d",
                           "resnext101_64x4d", "wide_resnet50_2", "wide_resnet101_2"})
    test::check_stages(name, {"relu", "layer1", "layer2", "layer3", "layer4"});
  const std::vector<int> a = {64, 0, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512, 0};
  const std::vector<int> b = {64, 64, 0, 128, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512, 0};
  const std::vector<int> d = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0};
  const std::vector<int> e = {64,  64,  0,   128, 128, 0,   256, 256, 256, 256, 0,
                              512, 512, 512, 512, 0,   512, 512, 512, 512, 0};
  EXPECT_EQ(vgg_nodes(d, false), (std::vector<std::string>{"features.3", "features.8", "features.15", "features.22",
                                                           "features.29", "features.30"}));
  for (const auto& [name, config, bn] : {std::tuple{"vgg11", a, false},
                                         {"vgg13", b, false},
                                         {"vgg16", d, false},
                                         {"vgg19", e, false},
                                         {"vgg13_bn", b, true},
                                         {"vgg16_bn", d, true},
                                         {"vgg19_bn", e, true}})
    test::check_stages(name, vgg_nodes(config, bn));
  for (const char* name : {"densenet161", "densenet169", "densenet201"}) test::check_stages(name, kDenseNetNodes);
}

// ---------------------------------------------------------------- EfficientNet and ConvNeXt (efficientnet.cpp,
// convnext.cpp)

TEST(ModelConformance, EfficientnetB0) { test::check_model({.model = "efficientnet_b0"}); }
TEST(ModelConformance, EfficientnetV2S) { test::check_model({.model = "efficientnet_v2_s"}); }
TEST(ModelConformance, ConvnextTiny) { test::check_model({.model = "convnext_tiny"}); }
// In inference a squeeze-excitation's scale goes into the projection convolution's weights, one
// per sample, where the map has more than 196 positions (128x128 input: the 64x64, 32x32 and
// 16x16 stages), instead of a multiplication over the map: the same values as the separate ops
// (what autograd records), no map-sized mul kernel there, a per-sample weight-sized one instead; a
// hook on a squeeze-excitation brings its own multiplication back. 14x14 maps are not folded (the
// shared weight's kept panels win there).
TEST(EfficientNet, SqueezeExcitationFoldsIntoTheProjectionInInference) {
  for (const char* name : {"efficientnet_b0", "mobilenet_v3_large"}) {
    models::BackbonePtr model = models::create(name, {.num_classes = 10});
    model->eval();
    Generator gen(7);
    const Tensor x = randn({2, 3, 128, 128}, {}, &gen);
    const Tensor separate = model->forward(x.detach().requires_grad_()).detach();
    // (map-sized mul kernels over more than 196 positions, per-sample weight mul kernels)
    auto muls = [](const KernelProfiler& profiler) {
      std::pair<int, int> counts{0, 0};
      for (const KernelRecord& r : profiler.records()) {
        if (r.op != "mul") continue;
        if (r.shape.size() == 4 && r.shape[2] * r.shape[3] > 196) ++counts.first;
        if (r.shape.size() == 3) ++counts.second;
      }
      return counts;
    };
    Tensor folded;
    std::pair<int, int> counts;
    {
      NoGradGuard no_grad;
      KernelProfiler profiler;
      folded = model->forward(x);
      counts = muls(profiler);
    }
    EXPECT_LE(test::relative_error(folded, separate), 1e-5) << name;
    EXPECT_EQ(counts.first, 0) << name;
    EXPECT_GT(counts.second, 0) << name;
    // A hook on the first squeeze-excitation: its map-sized multiplication runs again.
    nn::ModulePtr se;
    for (const auto& [path, m] : model->named_modules())
      if (!se && path.ends_with(".fc1")) se = model->get_submodule(path.substr(0, path.size() - 4));
    ASSERT_TRUE(se) << name;
    auto handle = se->register_forward_hook(
        [](nn::Module&, const nn::TensorList&, const nn::TensorList&) { return std::optional<nn::TensorList>(); });
    {
      NoGradGuard no_grad;
      KernelProfiler profiler;
      EXPECT_LE(test::relative_error(model->forward(x), separate), 1e-5) << name;
      EXPECT_EQ(muls(profiler).first, 1) << name;
    }
    handle.remove();
    // 14x14 maps (112x112 input: the 28x28 stage's) keep the shared weight: the scale multiplies
    // the map.
    const Tensor small = randn({2, 3, 112, 112}, {}, &gen);
    NoGradGuard no_grad;
    KernelProfiler profiler;
    model->forward(small);
    int scaled_maps = 0;
    for (const KernelRecord& r : profiler.records())
      scaled_maps += r.op == "mul" && r.shape.size() == 4 && r.shape[2] * r.shape[3] == 196;
    EXPECT_GT(scaled_maps, 0) << name;
  }
}

// How many kernels of model's inference forward of x (autograd not recording) `counted` picks;
// its output checked against `separate`, the output of the recorded path (separate ops).
int inference_kernels(nn::Module& model, const Tensor& x, const Tensor& separate,
                      const std::function<bool(const KernelRecord&)>& counted) {
  NoGradGuard no_grad;
  KernelProfiler profiler;
  EXPECT_LE(test::relative_error(model.forward(x), separate), 1e-5);
  int count = 0;
  for (const KernelRecord& r : profiler.records()) count += counted(r);
  return count;
}

// An inverted residual block's identity is added inside its projection's fused kernel in
// inference: no map-sized add, the output of the recorded path (separate ops); a hook on one
// block's body or stochastic depth brings that block's add back.
TEST(InvertedResidual, TheIdentityIsAddedInTheProjectionInInference) {
  const std::pair<const char*, const char*> cases[] = {{"mobilenet_v2", "features.3.conv"},
                                                       {"mobilenet_v3_large", "features.1.block"},
                                                       {"efficientnet_b0", "features.2.1.stochastic_depth"}};
  auto is_map_add = [](const KernelRecord& r) { return r.op == "add" && r.shape.size() == 4; };
  for (const auto& [name, hooked] : cases) {
    SCOPED_TRACE(name);
    models::BackbonePtr model = models::create(name, {.num_classes = 10});
    model->eval();
    Generator gen(9);
    const Tensor x = randn({2, 3, 96, 96}, {}, &gen);
    const Tensor separate = model->forward(x.detach().requires_grad_()).detach();
    EXPECT_EQ(inference_kernels(*model, x, separate, is_map_add), 0);
    auto handle = model->get_submodule(hooked)->register_forward_hook(
        [](nn::Module&, const nn::TensorList&, const nn::TensorList&) { return std::optional<nn::TensorList>(); });
    EXPECT_EQ(inference_kernels(*model, x, separate, is_map_add), 1);
    handle.remove();
  }
}

// Model `name` (10 classes) in inference on a random (2, 3, size, size) input runs `blocks`
// kernels `op` (each block's fused layers), with the output of the recorded path (separate ops);
// a hook on the module `hooked` (of one block) runs that block's layers one by one, and the hook
// once.
void expect_fused_blocks(const char* name, int64_t size, const char* op, int blocks, const char* hooked) {
  SCOPED_TRACE(name);
  models::BackbonePtr model = models::create(name, {.num_classes = 10});
  model->eval();
  Generator gen(11);
  const Tensor x = randn({2, 3, size, size}, {}, &gen);
  const Tensor separate = model->forward(x.detach().requires_grad_()).detach();
  auto is_block = [op](const KernelRecord& r) { return r.op == op; };
  EXPECT_EQ(inference_kernels(*model, x, separate, is_block), blocks);
  int calls = 0;
  auto handle = model->get_submodule(hooked)->register_forward_hook(
      [&calls](nn::Module&, const nn::TensorList&, const nn::TensorList&) {
        ++calls;
        return std::optional<nn::TensorList>();
      });
  EXPECT_EQ(inference_kernels(*model, x, separate, is_block), blocks - 1);
  EXPECT_EQ(calls, 1);
  handle.remove();
}

// In inference each inverted residual block's expansion, depthwise layer and projection (the
// expansion and depthwise layer where a squeeze-excitation follows) run as one kernel
// (inverted_residual), the hook on one block's depthwise convolution.
TEST(InvertedResidual, BlocksRunAsOneKernelInInference) {
  expect_fused_blocks("mobilenet_v2", 96, "inverted_residual", 17, "features.2.conv.1.0");
  expect_fused_blocks("mobilenet_v3_large", 96, "inverted_residual", 15, "features.2.block.1.0");
  expect_fused_blocks("efficientnet_b0", 96, "inverted_residual", 16, "features.2.0.block.1.0");
}

// In inference each MLP of Swin's and ConvNeXt's blocks (Linear, GELU[, Dropout], Linear) runs as
// one kernel (linear_gelu_linear), the hook on one block's second Linear.
TEST(TransformerMlp, BlocksRunAsOneKernelInInference) {
  expect_fused_blocks("swin_t", 64, "linear_gelu_linear", 12, "features.3.1.mlp.3");
  expect_fused_blocks("convnext_tiny", 64, "linear_gelu_linear", 18, "features.5.4.block.5");
}

// In inference the stems of ResNet (its forward) and DenseNet (its features Sequential) run their
// convolution, batch norm, ReLU and max pool as one kernel (conv2d_epilogue_max_pool2d), the hook
// on the max pool.
TEST(Stem, RunsAsOneKernelInInference) {
  expect_fused_blocks("resnet18", 64, "conv2d_epilogue_max_pool2d", 1, "maxpool");
  expect_fused_blocks("resnext50_32x4d", 64, "conv2d_epilogue_max_pool2d", 1, "maxpool");
  expect_fused_blocks("densenet121", 64, "conv2d_epilogue_max_pool2d", 1, "features.pool0");
}

TEST(ModelConformanceFull, EfficientNet) {
  for (const char* name :
       {"efficientnet_b1", "efficientnet_b2", "efficientnet_b3", "efficientnet_b4", "efficientnet_b5",
        "efficientnet_b6", "efficientnet_b7", "efficientnet_v2_m", "efficientnet_v2_l"})
    test::check_model({.model = name});
}
TEST(ModelConformanceFull, ConvNeXt) {
  for (const char* name : {"convnext_small", "convnext_base", "convnext_large"}) test::check_model({.model = name});
}

// ConvNeXt's and Swin's: the blocks of each of their four stages.
const std::vector<std::string> kConvNeXtNodes = {"features.1", "features.3", "features.5", "features.7"};

TEST(ModelStages, EfficientNetAndConvNeXt) {
  test::check_stages("efficientnet_b0", {"features.1", "features.2", "features.3", "features.5", "features.8"});
  test::check_stages("efficientnet_v2_s", {"features.1", "features.2", "features.3", "features.5", "features.7"});
  test::check_stages("convnext_tiny", kConvNeXtNodes);
}
TEST(ModelStagesFull, EfficientNetAndConvNeXt) {
  for (const char* name : {"efficientnet_b1", "efficientnet_b2", "efficientnet_b3", "efficientnet_b4",
                           "efficientnet_b5", "efficientnet_b6", "efficientnet_b7"})
    test::check_stages(name, {"features.1", "features.2", "features.3", "features.5", "features.8"});
  test::check_stages("efficientnet_v2_m", {"features.1", "features.2", "features.3", "features.5", "features.8"});
  test::check_stages("efficientnet_v2_l", {"features.1", "features.2", "features.3", "features.5", "features.8"});
  for (const char* name : {"convnext_small", "convnext_base", "convnext_large"})
    test::check_stages(name, kConvNeXtNodes);
}

// Each model's stochastic-depth rates (torchvision's StochasticDepth modules, in order) and
// classifier dropout against torchvision's.
TEST(ModelZoo, StochasticDepthRatesAndDropoutAreTorchvisions) {
  const std::vector<std::string> names = {
      "efficientnet_b0", "efficientnet_b4", "efficientnet_v2_s", "convnext_tiny", "convnext_small", "swin_t", "swin_b"};
  std::string joined;
  for (const auto& n : names) joined += n + " ";
  nlohmann::json want = test::torch_json(kTorchInitOff + R"(
import json, torchvision
out = {}
for name in ")" + joined + R"(".split():
    m = torchvision.models.__dict__[name]()
    out[name] = {"sd": [x.p for x in m.modules() if isinstance(x, torchvision.ops.StochasticDepth)],
                 "dropout": [x.p for x in m.modules() if isinstance(x, torch.nn.Dropout)]}
print(json.dumps(out))
)");
  if (want.is_null()) return;
  for (const auto& name : names) {
    models::BackbonePtr model = models::create(name);
    std::vector<double> sd;
    for (const auto& m : model->modules())
      if (m->type_name() == "StochasticDepth") sd.push_back(std::stod(m->extra_repr().substr(2)));
    std::vector<double> want_sd = want[name]["sd"].get<std::vector<double>>();
    ASSERT_EQ(sd.size(), want_sd.size()) << name;
    for (size_t i = 0; i < sd.size(); ++i) EXPECT_NEAR(sd[i], want_sd[i], 1e-15) << name << " block " << i;
    EXPECT_EQ(dropout_probabilities(model), want[name]["dropout"].get<std::vector<double>>()) << name;
  }
  EXPECT_EQ(dropout_probabilities(models::create("efficientnet_b0", {.dropout = 0.1})), std::vector<double>{0.1});
  EXPECT_THAT(test::error_of([] { models::create("swin_t", {.dropout = 0.1}); }), HasSubstr("no dropout option"));
}

// Stochastic depth drops whole samples in training with the block's rate, scaling the kept ones
// by 1 / (1 - p), and is the identity in eval mode: on the last block of convnext_tiny (NCHW,
// 0.1 * 17 / 17) and of swin_t (NHWC, 0.2 * 11 / 11).
TEST(ModelZoo, StochasticDepthDropsWholeSamples) {
  for (const auto& [name, node, p] : {std::tuple{"convnext_tiny", "features.7.2.stochastic_depth", 0.1},
                                      {"swin_t", "features.7.1.stochastic_depth", 0.2}}) {
    SCOPED_TRACE(name);
    nn::ModulePtr last = models::create(name)->get_submodule(node);
    EXPECT_EQ(last->extra_repr(), "p=" + nn::py_float_repr(p) + ", mode=row");
    manual_seed(5);
    const int64_t n = 4000;
    Tensor x = rand({n, 3, 2, 2}) + 1.0;
    last->train();
    Tensor y = (*last)(x);
    Tensor ratio = (y / x).flatten(1);  // each row: all 0 or all 1 / (1 - p)
    Tensor dropped = eq(amax(ratio, {1}), scalar_like(0.0, DType::Float32));
    EXPECT_TRUE(allclose(amin(ratio, {1}), amax(ratio, {1})));
    double rate = mean(dropped.to(DType::Float64)).item<double>();
    EXPECT_NEAR(rate, p, 3 * std::sqrt(p * (1 - p) / n));  // 3 standard deviations
    EXPECT_NEAR(max(ratio).item<double>(), 1 / (1 - p), 1e-6);
    last->eval();
    EXPECT_TRUE((*last)(x).is_same(x));
  }
}

// VGG's classifier has two Dropouts: p = 0.5 by default (torchvision's), or Options::dropout.
// torchvision's DenseNet has no dropout before its classifier: the option is an error.
TEST(VggDenseNet, DropoutIsAnOptionOfVggOnly) {
  EXPECT_EQ(dropout_probabilities(models::create("vgg11")), (std::vector<double>{0.5, 0.5}));
  EXPECT_EQ(dropout_probabilities(models::create("vgg11_bn", {.dropout = 0.2})), (std::vector<double>{0.2, 0.2}));
  EXPECT_THAT(test::error_of([] { models::create("densenet121", {.dropout = 0.2}); }), HasSubstr("no dropout option"));
  EXPECT_TRUE(dropout_probabilities(models::create("densenet121")).empty());
}

// Old torchvision DenseNet files name a dense layer's tensors "norm.1.weight", "conv.2.weight", ...
// A load_state_dict pre-hook renames them (torchvision's _load_state_dict: weight, bias,
// running_mean, running_var), also when the model is a submodule.
TEST(VggDenseNet, DenseNetLoadsOldKeyNames) {
  manual_seed(13);
  models::BackbonePtr source = models::create("densenet121");
  auto old_style = [](const nn::StateDict& state, const std::string& prefix) {
    nn::StateDict old;
    std::regex layer_key(R"((.*denselayer\d+\.(?:norm|conv))([12])\.(weight|bias|running_mean|running_var))");
    for (const auto& [key, t] : state) old.insert(prefix + std::regex_replace(key, layer_key, "$1.$2.$3"), t);
    return old;
  };
  nn::StateDict old = old_style(source->state_dict(), "");
  ASSERT_TRUE(old.contains("features.denseblock1.denselayer1.norm.1.running_var"));
  ASSERT_TRUE(old.contains("features.denseblock4.denselayer16.conv.2.weight"));
  ASSERT_FALSE(old.contains("features.denseblock1.denselayer1.norm1.weight"));

  manual_seed(14);
  models::BackbonePtr model = models::create("densenet121");
  ASSERT_FALSE(same_state(*model, *source));
  nn::IncompatibleKeys keys = model->load_state_dict(old);
  EXPECT_TRUE(keys.missing_keys.empty() && keys.unexpected_keys.empty());
  EXPECT_TRUE(same_state(*model, *source));

  manual_seed(15);
  nn::Sequential wrapper{models::create("densenet121")};
  wrapper.load_state_dict(old_style(source->state_dict(), "0."));
  EXPECT_TRUE(same_state(*wrapper[0], *source));
}

// In inference a dense block keeps its features in its result, each layer's copied in as it
// comes: the layers' lists are adjacent channel slices of one tensor (a pre-hook sees them share
// a storage) and the output is the concatenation's, against the same block recording gradients
// (the features concatenated, the separate norm and ReLU ops); a hook that returns other tensors
// and a layer output that does not fit leave the values right.
TEST(VggDenseNet, DenseBlockKeepsItsFeaturesInOneTensorInInference) {
  manual_seed(21);
  models::BackbonePtr model = models::create("densenet121");
  model->eval();
  nn::ModulePtr block = model->get_submodule("features.denseblock2");
  const Tensor x = randn({2, 128, 9, 7});
  const Tensor want = (*block)(x).detach();  // parameters require grad: the recording path
  bool shared = false;
  auto handle =
      model->get_submodule("features.denseblock2.denselayer3")
          ->register_forward_pre_hook([&](nn::Module&, const nn::TensorList& args) -> std::optional<nn::TensorList> {
            shared = args.size() == 3 && args[0].storage() == args[2].storage();
            return std::nullopt;
          });
  {
    NoGradGuard no_grad;
    const Tensor kept = (*block)(x);
    EXPECT_TRUE(shared);
    EXPECT_EQ(kept.shape(), want.shape());
    EXPECT_LE(test::relative_error(kept, want), 1e-6);
  }
  handle.remove();
  // A pre-hook that hands a layer copies of its features: the same values.
  model->get_submodule("features.denseblock2.denselayer5")
      ->register_forward_pre_hook([](nn::Module&, const nn::TensorList& args) -> std::optional<nn::TensorList> {
        nn::TensorList copies;
        for (const Tensor& t : args) copies.push_back(t.clone());
        return copies;
      });
  {
    NoGradGuard no_grad;
    EXPECT_LE(test::relative_error((*block)(x), want), 1e-6);
  }
  // A forward hook that keeps half of the last layer's output: the block's result is short of its place,
  // and its features are concatenated as the recording path does.
  model->get_submodule("features.denseblock2.denselayer12")
      ->register_forward_hook(
          [](nn::Module&, const nn::TensorList&, const nn::TensorList& out) -> std::optional<nn::TensorList> {
            return nn::TensorList{out[0].narrow(1, 0, 16)};
          });
  const Tensor want_short = (*block)(x).detach();
  ASSERT_EQ(want_short.size(1), want.size(1) - 16);
  NoGradGuard no_grad;
  EXPECT_LE(test::relative_error((*block)(x), want_short), 1e-6);
}

// A transition in inference pools before its 1x1 convolution (the same function, in a quarter of
// the positions): within rounding of the recording path's order (conv, then pool), its kernels run
// pool first, and a hook on the convolution (which would see the other order's input) or a
// replaced pool keeps torchvision's order.
TEST(VggDenseNet, TransitionPoolsBeforeItsConvolutionInInference) {
  manual_seed(22);
  models::BackbonePtr model = models::create("densenet121");
  model->eval();
  nn::ModulePtr transition = model->get_submodule("features.transition1");
  const Tensor x = randn({2, 256, 10, 12});
  const Tensor want = (*transition)(x).detach();  // parameters require grad: conv, then pool
  auto kernels = [&] {
    NoGradGuard no_grad;
    KernelProfiler profiler;
    const Tensor y = (*transition)(x);
    EXPECT_LE(test::relative_error(y, want), 1e-6);
    EXPECT_EQ(y.shape(), want.shape());
    std::vector<std::string> ops;
    for (const KernelRecord& r : profiler.records())
      if (r.op == "conv2d" || r.op == "avg_pool2d") ops.push_back(r.op);
    return ops;
  };
  EXPECT_EQ(kernels(), (std::vector<std::string>{"avg_pool2d", "conv2d"}));
  int64_t seen = 0;
  auto handle = transition->get_submodule("conv")->register_forward_hook(
      [&](nn::Module&, const nn::TensorList& in, const nn::TensorList&) -> std::optional<nn::TensorList> {
        seen = in[0].size(2);
        return std::nullopt;
      });
  EXPECT_EQ(kernels(), (std::vector<std::string>{"conv2d", "avg_pool2d"}));
  EXPECT_EQ(seen, 10);
  handle.remove();
  transition->register_module("pool",
                              std::make_shared<nn::AvgPool2d>(2, nn::AvgPool2dOptions{.stride = 2, .ceil_mode = true}));
  EXPECT_EQ(kernels(), (std::vector<std::string>{"conv2d", "avg_pool2d"}));
}

// ---------------------------------------------------------------- Vision Transformer (vit.cpp)

// torchvision's ViT only takes the image size it is built for: eval and train mode at 224 px,
// then every check, gradients included, on the model built for 64 px (a 4x4 or 2x2 grid).
void check_vit_at_224(const std::string& name) {
  test::check_model({.model = name, .eval_shapes = "2x224", .grad_size = 0});
}
void check_vit_at_64(const std::string& name) {
  test::check_model({.model = name, .eval_shapes = "2x64", .grad_size = 64, .image_size = 64});
}

// CI's: vit_b_32 at 64 px (at 160 px below, its stages at 224 px in ModelStages.Vit).
TEST(ModelConformance, VitB32) { check_vit_at_64("vit_b_32"); }
TEST(ModelConformanceFull, Vit) {
  check_vit_at_224("vit_b_32");
  for (const char* name : {"vit_b_16", "vit_l_16", "vit_l_32"}) {
    check_vit_at_224(name);
    check_vit_at_64(name);
  }
}

// Weights for 224 px in a model built for 160 px: the position embedding (1, 50, D) becomes
// (1, 26, D) as torchvision's interpolate_embeddings makes it, on load (load_state_dict, or
// create with Options::weights).
TEST(ModelConformance, VitB32At160WithWeightsFor224) {
  test::ModelCheck check{
      .model = "vit_b_32", .eval_shapes = "2x160", .grad_size = 0, .image_size = 160, .weights_image_size = 224};
  test::check_model(check);
  std::string golden = test::golden_folder(check);
  ASSERT_FALSE(golden.empty());
  io::SafetensorsFile goldens = io::SafetensorsFile::open(golden + "/goldens.safetensors");
  models::BackbonePtr model = models::create("vit_b_32", {.image_size = 160, .weights = golden + "/weights.pth"});
  model->eval();
  NoGradGuard no_grad;
  Tensor out = model->forward(goldens.tensor("eval.0.input"));
  EXPECT_LE(test::relative_error(out, goldens.tensor("eval.0.output")), 1e-4);
}

const std::vector<std::string> kVitBaseNodes = {"encoder.layers.encoder_layer_2", "encoder.layers.encoder_layer_5",
                                                "encoder.layers.encoder_layer_8", "encoder.ln"};
const std::vector<std::string> kVitLargeNodes = {"encoder.layers.encoder_layer_5", "encoder.layers.encoder_layer_11",
                                                 "encoder.layers.encoder_layer_17", "encoder.ln"};

TEST(ModelStages, Vit) { test::check_stages("vit_b_32", kVitBaseNodes); }
TEST(ModelStagesFull, Vit) {
  test::check_stages("vit_b_16", kVitBaseNodes);
  test::check_stages("vit_l_16", kVitLargeNodes);
  test::check_stages("vit_l_32", kVitLargeNodes);
}

// Options::image_size: ViT only, a multiple of the patch size, the one input size; Options::dropout
// is torchvision's ViT dropout (every Dropout of the encoder, default 0).
TEST(Vit, ImageSizeAndDropoutOptions) {
  EXPECT_THAT(test::error_of([] { models::create("resnet18", {.image_size = 160}); }),
              HasSubstr("resnet18 has no image_size option"));
  EXPECT_THAT(test::error_of([] { models::create("vit_b_32", {.image_size = 100}); }),
              HasSubstr("vit_b_32: image_size must be a positive multiple of the patch size 32, got 100"));
  models::BackbonePtr model = models::create("vit_b_32", {.num_classes = 10, .dropout = 0.1, .image_size = 96});
  EXPECT_EQ(model->state_dict().at("encoder.pos_embedding").shape(), (Shape{1, 10, 768}));
  EXPECT_EQ(dropout_probabilities(model), std::vector<double>(1 + 12 * 3, 0.1));
  EXPECT_EQ(model->forward(zeros({1, 3, 96, 96})).shape(), (Shape{1, 10}));
  EXPECT_THAT(test::error_of([&] {
                model->forward(zeros({1, 3, 224, 224}));
              }),
              HasSubstr("vit_b_32 is built for 96x96 images (Options::image_size), got 224x224"));
  EXPECT_EQ(dropout_probabilities(models::create("vit_b_32")), std::vector<double>(1 + 12 * 3, 0.0));
}

// torchvision's ViT initialisation: conv_proj truncated normal with std sqrt(1 / fan_in) and zero
// bias, class token 0, position embedding N(0, 0.02^2), MLP Linears xavier_uniform_ with
// N(0, 1e-6^2) biases, attention in_proj xavier_uniform_ with zero biases, head 0, LayerNorms 1, 0.
// A ViT loaded by tag is built for the tag's image size, as torchvision's: the SWAG end-to-end
// weights of vit_b_16 are for 384 px.
TEST(Vit, ImageSizeFollowsTheWeightsTag) {
  test::TempDir dir;
  ScopedEnv tvc_weights("TVC_WEIGHTS", dir.path().string());
  const models::WeightsTag& tag = models::weights_tag("vit_b_16", "IMAGENET1K_SWAG_E2E_V1");
  EXPECT_EQ(tag.preprocessing.crop_size, 384);
  manual_seed(14);
  models::BackbonePtr source = models::create("vit_b_16", {.image_size = 384});
  io::save_safetensors(dir / (std::filesystem::path(tag.file_name).stem().string() + ".safetensors"),
                       source->state_dict());
  models::BackbonePtr loaded = models::create("vit_b_16", {.weights = "IMAGENET1K_SWAG_E2E_V1"});
  EXPECT_EQ(loaded->get_parameter("encoder.pos_embedding").shape(), (Shape{1, 577, 768}));
  EXPECT_TRUE(same_state(*loaded, *source));
}

TEST(Vit, InitialisationIsTorchvisions) {
  manual_seed(12);
  models::BackbonePtr model = models::create("vit_b_32");
  auto rms = [](const Tensor& t) { return std::sqrt(t.to(DType::Float64).pow(2).mean().item<double>()); };
  auto max_abs = [](const Tensor& t) { return max(t.to(DType::Float64).abs()).item<double>(); };
  nn::StateDict sd = model->state_dict();
  EXPECT_NEAR(rms(sd.at("conv_proj.weight")) / std::sqrt(1.0 / (3 * 32 * 32)), 1, 0.02);
  EXPECT_EQ(max_abs(sd.at("conv_proj.bias")), 0);
  EXPECT_EQ(max_abs(sd.at("class_token")), 0);
  EXPECT_NEAR(rms(sd.at("encoder.pos_embedding")) / 0.02, 1, 0.05);
  EXPECT_NEAR(rms(sd.at("encoder.layers.encoder_layer_3.mlp.0.weight")) / std::sqrt(2.0 / (768 + 3072)), 1, 0.02);
  EXPECT_LT(max_abs(sd.at("encoder.layers.encoder_layer_3.mlp.3.bias")), 1e-5);
  EXPECT_GT(max_abs(sd.at("encoder.layers.encoder_layer_3.mlp.3.bias")), 0);
  EXPECT_NEAR(
      rms(sd.at("encoder.layers.encoder_layer_0.self_attention.in_proj_weight")) / std::sqrt(2.0 / (768 + 3 * 768)), 1,
      0.02);
  EXPECT_EQ(max_abs(sd.at("encoder.layers.encoder_layer_0.self_attention.in_proj_bias")), 0);
  EXPECT_EQ(max_abs(sd.at("encoder.layers.encoder_layer_0.self_attention.out_proj.bias")), 0);
  EXPECT_EQ(max_abs(sd.at("encoder.ln.weight") - 1), 0);
  EXPECT_EQ(max_abs(sd.at("heads.head.weight")), 0);
  EXPECT_EQ(max_abs(sd.at("heads.head.bias")), 0);
}

// Old torchvision files name the MLP's Linears mlp.linear_1 and mlp.linear_2; they load as
// mlp.0 and mlp.3 (torchvision's MLPBlock._load_from_state_dict).
TEST(Vit, LoadsOldMlpKeyNames) {
  manual_seed(13);
  models::BackbonePtr source = models::create("vit_b_32", {.image_size = 64});
  nn::StateDict old;
  std::regex mlp_key(R"((.*\.mlp\.)([03])\.(weight|bias))");
  for (const auto& [key, t] : source->state_dict()) {
    std::smatch m;
    old.insert(
        std::regex_match(key, m, mlp_key) ? m[1].str() + (m[2] == "0" ? "linear_1." : "linear_2.") + m[3].str() : key,
        t);
  }
  ASSERT_TRUE(old.contains("encoder.layers.encoder_layer_11.mlp.linear_2.bias"));
  manual_seed(14);
  models::BackbonePtr model = models::create("vit_b_32", {.image_size = 64});
  nn::IncompatibleKeys keys = model->load_state_dict(old);
  EXPECT_TRUE(keys.missing_keys.empty() && keys.unexpected_keys.empty());
  EXPECT_TRUE(same_state(*model, *source));
}

// ---------------------------------------------------------------- Swin (swin.cpp)

// 224 px: 56, 28, 14, 7 tokens per side, multiples of the 7x7 window (no shift at 7, a single
// window). 201 px (not a multiple of 32, nor of the 4x4 patch): 50, 25, 13, 7 tokens, so windows
// are padded (50 -> 56, 25 -> 28, 13 -> 14) under shifted windows and their mask, and two
// merges are of odd sizes (25, 13). The gradient check's 64 px (16, 8, 4, 2 tokens) pads every
// stage and drops the shift where the padded grid is one window (4 and 2 -> 7).
TEST(ModelConformance, SwinT) { test::check_model({.model = "swin_t", .eval_shapes = "2x224,1x201"}); }
TEST(ModelConformanceFull, Swin) {
  for (const char* name : {"swin_s", "swin_b"}) test::check_model({.model = name, .eval_shapes = "2x224,1x201"});
  test::check_model({.model = "swin_t", .num_classes = 10});
}
TEST(ModelStages, SwinT) { test::check_stages("swin_t", kConvNeXtNodes); }
TEST(ModelStagesFull, Swin) {
  for (const char* name : {"swin_s", "swin_b"}) test::check_stages(name, kConvNeXtNodes);
}

// ---------------------------------------------------------------- bfloat16 inference

// A model of the zoo prepared for bfloat16 inference (nn::convert_weights_to_bfloat16: the
// convolutions' and linear layers' weights bfloat16, the products summed in float32, activations
// float32) against the same model in float32 on the same 224 x 224 input: the logits within 1e-2
// relative error (measured: 4.3e-3 resnet50 to 9.3e-3 efficientnet_b0; at 64 x 64 the latter is
// 1.06e-2), and the same top-1 class for every image whose two best float32 logits differ by more
// than 1e-2 of its largest |logit| (torchvision's initialisation, which for ViT zeroes the head:
// it is drawn at random here).
void check_bfloat16_inference(const std::string& name, int64_t size) {
  SCOPED_TRACE(name);
  constexpr int64_t kBatch = 3;
  manual_seed(1);
  models::Options options;
  if (name.rfind("vit", 0) == 0) options.image_size = size;
  models::BackbonePtr model = models::create(name, options);
  model->eval();
  NoGradGuard no_grad;
  for (auto& [key, p] : model->named_parameters())
    if (key.rfind("heads.", 0) == 0) p.copy_(randn(p.shape()) * 0.05);
  const Tensor x = randn({kBatch, 3, size, size});
  const Tensor want = (*model)(x);
  EXPECT_GT(nn::convert_weights_to_bfloat16(*model), 0);
  const Tensor got = (*model)(x);
  ASSERT_EQ(got.dtype(), DType::Float32);
  EXPECT_LT(test::relative_error(got, want), 1e-2);
  EXPECT_GT(test::relative_error(got, want), 0);  // it did run in bfloat16
  const int64_t classes = want.shape()[1];
  const std::vector<double> w = want.to_vector(), g = got.to_vector();
  int checked = 0;
  for (int64_t n = 0; n < kBatch; ++n) {
    const double* row = w.data() + n * classes;
    const double* got_row = g.data() + n * classes;
    std::vector<double> sorted(row, row + classes);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    double largest = 0;
    for (int64_t c = 0; c < classes; ++c) largest = std::max(largest, std::abs(row[c]));
    if (sorted[0] - sorted[1] <= 1e-2 * largest) continue;
    ++checked;
    EXPECT_EQ(std::max_element(got_row, got_row + classes) - got_row, std::max_element(row, row + classes) - row)
        << "image " << n;
  }
  EXPECT_GT(checked, 0);  // margins of random models are wide enough for some images
}

TEST(BFloat16Inference, MatchesFloat32) {
  for (const char* name :
       {"resnet50", "mobilenet_v3_large", "efficientnet_b0", "densenet121", "convnext_tiny", "swin_t", "vit_b_16"})
    check_bfloat16_inference(name, 224);
}

}  // namespace
}  // namespace tvc
