// Weight averaging (swa/) against PyTorch: AveragedModel with every averaging function, the EMA
// warm-ups, update_every, bfloat16 models averaged in float32, update_bn, SWALR (alone and in
// SequentialLR), state_dict round trips with torch's AveragedModel, `tvc average`, and the
// errors that must leave the average unchanged. Goldens: tools/swa_goldens.py (torch 1.13 and
// the documented formulas in float64), generated into the golden cache at test time.
// err = ||a - b||2 / ||b||2 per tensor: <= 1e-12 in float64, <= 1e-6 in float32.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "compare.h"
#include "test_helpers.h"
#include "torch_golden.h"
#include "tvc/autograd.h"
#include "tvc/lr_scheduler.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"
#include "tvc/optim.h"
#include "tvc/serialize.h"
#include "tvc/swa/average_files.h"
#include "tvc/swa/averaged_model.h"
#include "tvc/swa/swalr.h"
#include "tvc/swa/update_bn.h"

using namespace tvc;
using namespace tvc::swa;
using tvc::test::error_of;
using tvc::test::relative_error;
using tvc::test::TempDir;

namespace {

constexpr int kStates = 10;

std::string goldens() { return test::python_golden_folder(TVC_SOURCE_ROOT "/tools/swa_goldens.py", {}); }

std::string state_path(int k, const char* ext = "pth") {
  return goldens() + "/states/state_" + std::to_string(k) + "." + ext;
}

// The model of tools/swa_goldens.py, in dtype.
std::shared_ptr<nn::Sequential> make_model(DType dtype = DType::Float64) {
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Conv2d>(3, 4, 3, nn::ConvOptions{.padding = 1}));
  net->push_back(std::make_shared<nn::BatchNorm2d>(4));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Flatten>());
  net->push_back(std::make_shared<nn::Linear>(100, 6));
  net->push_back(std::make_shared<nn::BatchNorm1d>(6));
  net->to(dtype);
  return net;
}

void load_state(nn::Module& model, int k) { io::load_into(model, state_path(k)); }

std::vector<std::string> sorted_keys(const nn::StateDict& sd) {
  std::vector<std::string> keys = sd.keys();
  std::sort(keys.begin(), keys.end());
  return keys;
}

// Every entry of expected (an AveragedModel state_dict file) against actual, by name (the order
// of a dict made from a safetensors file is the file's sorted one).
void expect_state(const nn::StateDict& actual, const std::string& expected_path, double tol, const std::string& what) {
  nn::StateDict expected = io::load_state_dict(expected_path);
  ASSERT_EQ(sorted_keys(actual), sorted_keys(expected)) << what;
  for (const auto& [name, e] : expected) {
    const Tensor& a = actual.at(name);
    ASSERT_EQ(a.shape(), e.shape()) << what << " " << name;
    if (!is_floating(e.dtype())) {
      EXPECT_EQ(a.dtype(), e.dtype()) << what << " " << name;
      EXPECT_EQ(a.to_vector(), e.to_vector()) << what << " " << name;
    } else {
      EXPECT_LE(relative_error(a, e), tol) << what << " " << name;
    }
  }
}

std::string expected(const std::string& name) { return goldens() + "/expected/" + name + ".pth"; }

// AveragedModel over the ten states in dtype, with options; checked against expected/CASE.
std::shared_ptr<AveragedModel> average_states(AveragedModelOptions options, DType dtype = DType::Float64) {
  auto model = make_model(dtype);
  auto averaged = std::make_shared<AveragedModel>(*model, std::move(options));
  for (int k = 0; k < kStates; ++k) {
    load_state(*model, k);
    averaged->update_parameters(*model);
  }
  return averaged;
}

void check_case(const std::string& golden, AveragedModelOptions options, DType dtype = DType::Float64) {
  if (goldens().empty()) return;
  auto averaged = average_states(std::move(options), dtype);
  expect_state(averaged->state_dict(), expected(golden), dtype == DType::Float64 ? 1e-12 : 1e-6,
               golden + " in " + dtype_name(dtype));
}

}  // namespace

// ---------------------------------------------------------------- AveragedModel

TEST(AveragedModel, SwaByDefaultAndByEveryHelperMatchesTorch) {
  check_case("swa", {});
  if (!goldens().empty()) {  // the keys in torch's order too
    EXPECT_EQ(average_states({})->state_dict().keys(), io::load_state_dict(expected("swa")).keys());
  }
  check_case("swa", {}, DType::Float32);
  check_case("formula_swa", {.multi_avg_fn = get_swa_multi_avg_fn()});
  check_case("formula_swa", {.avg_fn = get_swa_avg_fn()});
}

TEST(AveragedModel, EmaHelpersMatchTorch) {
  check_case("ema0999", {.multi_avg_fn = get_ema_multi_avg_fn(0.999)});
  check_case("ema0999", {.avg_fn = get_ema_avg_fn(0.999)});
  check_case("ema09", {.avg_fn = get_ema_avg_fn(0.9)});
  check_case("formula_ema09", {.multi_avg_fn = get_ema_multi_avg_fn(0.9)});
  check_case("formula_ema09", {.multi_avg_fn = get_ema_multi_avg_fn(0.9)}, DType::Float32);
}

TEST(AveragedModel, UseBuffersAveragesFloatingBuffersAndCopiesIntegerOnes) {
  check_case("ema09_buffers", {.avg_fn = get_ema_avg_fn(0.9), .use_buffers = true});
  check_case("formula_ema09_buffers", {.multi_avg_fn = get_ema_multi_avg_fn(0.9), .use_buffers = true});
}

TEST(AveragedModel, UserFunctionsOfEitherKind) {
  auto custom = [](const Tensor& a, const Tensor& x, int64_t n) {
    return add(a, div(mul(sub(x, a), scalar_like(2.0, a.dtype())), scalar_like(static_cast<double>(n + 2), a.dtype())));
  };
  check_case("custom", {.avg_fn = custom});
  // The same rule as a multi-tensor function, writing in place.
  check_case("custom",
             {.multi_avg_fn = [custom](const std::vector<Tensor>& avg, const std::vector<Tensor>& cur, int64_t n) {
               for (size_t i = 0; i < avg.size(); ++i) Tensor(avg[i]).copy_(custom(avg[i], cur[i], n));
             }});
}

TEST(AveragedModel, MultiFunctionGetsEveryTensorOfADtypeInOneCall) {
  auto model = make_model();
  model->get_submodule("4")->to(DType::Float32);  // a second dtype: Linear's weight and bias
  std::vector<std::pair<std::string, size_t>> calls;
  AveragedModel averaged(*model,
                         {.multi_avg_fn = [&](const std::vector<Tensor>& avg, const std::vector<Tensor>&,
                                              int64_t) { calls.emplace_back(dtype_name(avg[0].dtype()), avg.size()); },
                          .use_buffers = true});
  averaged.update_parameters(*model);  // the first call copies
  EXPECT_TRUE(calls.empty());
  averaged.update_parameters(*model);
  // Parameters and floating buffers: 10 float64 (conv, two BatchNorms with their statistics),
  // 2 float32 (Linear); num_batches_tracked is copied.
  std::vector<std::pair<std::string, size_t>> want = {{"float64", 10}, {"float32", 2}};
  EXPECT_EQ(calls, want);
}

TEST(AveragedModel, EmaWarmupsFollowTimmAndTensorFlow) {
  if (goldens().empty()) return;
  nlohmann::json g = nlohmann::json::parse(test::read_file(goldens() + "/goldens.json"));
  EmaWarmup timm{.kind = EmaWarmup::Kind::timm, .min_decay = g["timm_warmup"]["min_decay"]};
  const auto& timm_table = g["timm_warmup"]["table"];
  // t = 0 is the first update, which copies; timm's table starts its warm-up at t = 1.
  for (size_t t = 1; t < timm_table.size(); ++t)
    EXPECT_NEAR(ema_decay(g["timm_warmup"]["decay"], timm, static_cast<int64_t>(t)), timm_table[t].get<double>(), 1e-15)
        << t;
  const auto& tf_table = g["tf_warmup"]["table"];
  for (size_t t = 0; t < tf_table.size(); ++t)
    EXPECT_NEAR(ema_decay(g["tf_warmup"]["decay"], {.kind = EmaWarmup::Kind::tensorflow}, static_cast<int64_t>(t)),
                tf_table[t].get<double>(), 1e-15)
        << t;
  EXPECT_EQ(ema_decay(0.99, {}, 3), 0.99);
  check_case("warmup_timm", {.multi_avg_fn = get_ema_multi_avg_fn(0.99, timm), .use_buffers = true});
  check_case("warmup_timm", {.avg_fn = get_ema_avg_fn(0.99, timm), .use_buffers = true});
  EXPECT_NE(error_of([] { get_ema_multi_avg_fn(1.5); }).find("decay must be in [0, 1]"), std::string::npos);
}

TEST(AveragedModel, UpdateEveryKUpdatesExactlyOnTheKthCalls) {
  if (goldens().empty()) return;
  auto model = make_model();
  AveragedModel averaged(*model, {.update_every = 3});
  std::vector<int64_t> n_after_call;
  for (int k = 0; k < kStates; ++k) {
    load_state(*model, k);
    averaged.update_parameters(*model);
    n_after_call.push_back(averaged.n_averaged());
  }
  EXPECT_EQ(n_after_call, (std::vector<int64_t>{0, 0, 1, 1, 1, 2, 2, 2, 3, 3}));
  EXPECT_EQ(averaged.update_calls(), 10);
  expect_state(averaged.state_dict(), expected("every3"), 1e-12, "every3");
  EXPECT_NE(error_of([&] { AveragedModel(*model, {.update_every = 0}); }).find("update_every"), std::string::npos);
}

TEST(AveragedModel, Bfloat16ModelIsAveragedInFloat32OrOnRequestInFloat64) {
  if (goldens().empty()) return;
  for (auto [dtype, tol] :
       {std::pair{std::optional<DType>(), 1e-6}, std::pair{std::optional<DType>(DType::Float64), 1e-12}}) {
    auto model = make_model(DType::BFloat16);
    AveragedModel averaged(*model, {.dtype = dtype});
    EXPECT_EQ(averaged.module().get_parameter("0.weight").dtype(), dtype.value_or(DType::Float32));
    EXPECT_EQ(averaged.module().get_buffer("1.running_var").dtype(), dtype.value_or(DType::Float32));
    EXPECT_EQ(averaged.module().get_buffer("1.num_batches_tracked").dtype(), DType::Int64);
    for (int k = 0; k < kStates; ++k) {
      load_state(*model, k);
      averaged.update_parameters(*model);
    }
    expect_state(averaged.state_dict(), expected("bf16"), tol, "bf16");
  }
}

TEST(AveragedModel, IsAModuleWithPyTorchsStateDictNames) {
  auto model = make_model();
  AveragedModel averaged(*model);
  nn::StateDict sd = averaged.state_dict();
  // PyTorch's order: the AveragedModel's own buffer, then the copy's state.
  EXPECT_EQ(sd.keys().front(), "n_averaged");
  EXPECT_EQ(sd.keys()[1], "module.0.weight");
  EXPECT_EQ(sd.size(), model->state_dict().size() + 1);
  EXPECT_EQ(sd.at("n_averaged").dim(), 0);
  EXPECT_EQ(sd.at("n_averaged").dtype(), DType::Int64);
  // A deep copy: its own storage, requires_grad kept.
  Tensor w = model->get_parameter("0.weight");
  Tensor aw = averaged.get_parameter("module.0.weight");
  EXPECT_NE(w.storage(), aw.storage());
  EXPECT_TRUE(aw.requires_grad());
  averaged.update_parameters(*model);
  EXPECT_EQ(test::tensor_bytes(aw), test::tensor_bytes(w));
  // forward runs the averaged copy, through its hooks.
  model->eval();
  averaged.eval();
  Tensor x = randn({2, 3, 5, 5}, {.dtype = DType::Float64});
  EXPECT_EQ(relative_error(averaged(x), (*model)(x)), 0);
  int calls = 0;
  averaged.module().register_forward_hook([&](nn::Module&, const nn::TensorList&, const nn::TensorList&) {
    ++calls;
    return std::nullopt;
  });
  averaged(x);
  EXPECT_EQ(calls, 1);
  nn::ModulePtr copy = averaged.clone();
  EXPECT_EQ(copy->state_dict().keys(), sd.keys());
  EXPECT_NE(copy->get_parameter("module.0.weight").storage(), aw.storage());
}

TEST(AveragedModel, MismatchedModelsRaiseNamedErrorsAndChangeNothing) {
  auto model = make_model();
  AveragedModel averaged(*model, {.avg_fn = get_swa_avg_fn()});
  averaged.update_parameters(*model);
  nn::StateDict before;
  for (const auto& [k, t] : averaged.state_dict()) before.insert(k, t.clone());
  auto unchanged = [&](const std::string& what) {
    for (const auto& [k, t] : averaged.state_dict())
      EXPECT_EQ(test::tensor_bytes(t), test::tensor_bytes(before.at(k))) << what << ": " << k << " changed";
  };

  auto other_width = make_model();
  other_width->set_submodule("4", std::make_shared<nn::Linear>(100, 7));
  other_width->set_submodule("5", std::make_shared<nn::BatchNorm1d>(7));
  other_width->to(DType::Float64);
  std::string e = error_of([&] { averaged.update_parameters(*other_width); });
  EXPECT_NE(e.find("parameter '4.weight' has shape [7, 100] in the model but [6, 100]"), std::string::npos) << e;
  unchanged("shape");

  auto fewer = std::make_shared<nn::Sequential>();
  fewer->push_back(std::make_shared<nn::Conv2d>(3, 4, 3, nn::ConvOptions{.padding = 1}));
  fewer->to(DType::Float64);
  e = error_of([&] { averaged.update_parameters(*fewer); });
  EXPECT_NE(e.find("the model lacks parameter '1.weight'"), std::string::npos) << e;
  unchanged("structure");

  auto as_float32 = make_model(DType::Float32);
  e = error_of([&] { averaged.update_parameters(*as_float32); });
  EXPECT_NE(e.find("parameter '0.weight' is float32 in the model but the averaged copy was made from float64"),
            std::string::npos)
      << e;
  unchanged("dtype");

  AveragedModel bad_fn(*model, {.avg_fn = [](const Tensor& a, const Tensor&, int64_t) { return a.flatten(); }});
  bad_fn.update_parameters(*model);
  e = error_of([&] { bad_fn.update_parameters(*model); });
  EXPECT_NE(e.find("avg_fn returned shape [108] for '0.weight' of shape [4, 3, 3, 3]"), std::string::npos) << e;
  EXPECT_EQ(bad_fn.n_averaged(), 1);
  EXPECT_EQ(averaged.n_averaged(), 1);
}

TEST(AveragedModel, StateDictRoundTripsWithTorchsAveragedModel) {
  if (goldens().empty()) return;
  TempDir dir;
  auto averaged = average_states({});
  io::save_pth(dir / "tvc.pth", io::Value(averaged->state_dict()));
  // torch loads ours strictly, checks it against its own average, updates once more and saves.
  std::string out = test::torch_run_uncached(R"(
import sys
from torch.optim.swa_utils import AveragedModel
sys.path.insert(0, ")" TVC_SOURCE_ROOT R"(/tools")
from swa_goldens import make_model
torch.set_default_dtype(torch.float64)
model = make_model()
averaged = AveragedModel(model)
averaged.load_state_dict(torch.load(")" + (dir / "tvc.pth") +
                                             R"(", weights_only=True))
expected = torch.load(")" + expected("swa") + R"(")
err = max(float((averaged.state_dict()[k].double() - v.double()).norm() / v.double().norm().clamp_min(1e-300)) for k, v in expected.items())
model.load_state_dict(torch.load(")" + state_path(0) +
                                             R"("))
averaged.update_parameters(model)
torch.save(averaged.state_dict(), ")" + (dir / "torch.pth") +
                                             R"(")
print(err, int(averaged.n_averaged))
)");
  double err = -1;
  int64_t n = -1;
  std::istringstream(out) >> err >> n;
  EXPECT_LE(err, 1e-12) << out;
  EXPECT_EQ(n, 11);
  // And back: torch's dict loads strictly into ours.
  auto back = std::make_shared<AveragedModel>(*make_model());
  back->load_state_dict(io::load_state_dict(dir / "torch.pth"));
  EXPECT_EQ(back->n_averaged(), 11);
  nn::StateDict theirs = io::load_state_dict(dir / "torch.pth");
  for (const auto& [k, t] : back->state_dict()) EXPECT_EQ(test::tensor_bytes(t), test::tensor_bytes(theirs.at(k))) << k;
}

// ---------------------------------------------------------------- update_bn

TEST(UpdateBn, RecomputesStatisticsAsTorchFromTensorsOrPairs) {
  if (goldens().empty()) return;
  io::Value batch_list = io::load_pth(goldens() + "/batches.pth");
  std::vector<Tensor> inputs;
  std::vector<std::pair<Tensor, Tensor>> pairs;
  for (const io::Value& v : batch_list.elements()) {
    inputs.push_back(v.to_tensor());
    pairs.emplace_back(v.to_tensor(), zeros({6}, {.dtype = DType::Int64}));
  }
  auto check = [&](nn::Module& owner, const std::string& prefix, const std::string& what) {
    nn::StateDict expected_bn = io::load_state_dict(goldens() + "/update_bn.pth");
    nn::StateDict sd = owner.state_dict();
    for (const auto& [k, t] : expected_bn) {
      if (k.find("running") == std::string::npos && k.find("num_batches") == std::string::npos) continue;
      if (is_floating(t.dtype()))
        EXPECT_LE(relative_error(sd.at(prefix + k), t), 1e-12) << what << " " << k;
      else
        EXPECT_EQ(sd.at(prefix + k).item<int64_t>(), t.item<int64_t>()) << what << " " << k;
    }
  };

  auto model = make_model();
  load_state(*model, 0);
  model->eval();
  EXPECT_EQ(update_bn(inputs, *model), 4);
  check(*model, "", "tensors");
  EXPECT_FALSE(model->is_training());
  EXPECT_EQ(model->child_as<nn::BatchNorm>("1").momentum->to_double(), 0.1);

  auto again = make_model();
  load_state(*again, 0);
  update_bn(pairs, *again);
  check(*again, "", "pairs");
  EXPECT_TRUE(again->is_training());

  // On an AveragedModel: the averaged copy's statistics.
  AveragedModel averaged(*again);
  averaged.update_parameters(*again);
  update_bn(inputs, averaged);
  check(averaged, "module.", "AveragedModel");

  // A model without BatchNorm reads no batch.
  nn::Sequential plain;
  plain.push_back(std::make_shared<nn::ReLU>());
  EXPECT_EQ(update_bn(inputs, plain), 0);
}

// ---------------------------------------------------------------- SWALR

namespace {

struct TwoGroups {
  Tensor a = zeros({2}).requires_grad_(), b = zeros({3}).requires_grad_();
  optim::SGD opt{std::vector<optim::ParamGroup>{{{a}, {{"lr", 0.5}}}, {{b}, {{"lr", 0.1}}}}, {.lr = 0.3}};
};

void expect_lrs(const nlohmann::json& expected, const std::vector<std::vector<double>>& actual,
                const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t s = 0; s < actual.size(); ++s)
    for (size_t g = 0; g < actual[s].size(); ++g)
      EXPECT_NEAR(actual[s][g], expected[s][g].get<double>(), 1e-12 * std::abs(expected[s][g].get<double>()))
          << what << " step " << s << " group " << g;
}

}  // namespace

TEST(SWALR, LearningRatesPerStepMatchTorch) {
  if (goldens().empty()) return;
  nlohmann::json g = nlohmann::json::parse(test::read_file(goldens() + "/goldens.json"));
  for (auto [name, strategy] : {std::pair{"cos", AnnealStrategy::cos}, std::pair{"linear", AnnealStrategy::linear}})
    for (int64_t epochs : {4, 0}) {
      TwoGroups p;
      SWALR sched(p.opt, std::vector<double>{0.05, 0.02}, epochs, strategy);
      std::vector<std::vector<double>> lrs = {sched.get_last_lr()};
      for (int s = 0; s < 10; ++s) {
        sched.step();
        lrs.push_back(sched.get_last_lr());
      }
      expect_lrs(g["swalr"][std::string(name) + "_" + std::to_string(epochs)], lrs, name);
      EXPECT_EQ(p.opt.param_groups()[1].options.get_double("swa_lr"), 0.02);
    }
}

TEST(SWALR, ComposesInSequentialLR) {
  if (goldens().empty()) return;
  nlohmann::json g = nlohmann::json::parse(test::read_file(goldens() + "/goldens.json"));
  TwoGroups p;
  auto cosine = std::make_shared<optim::lr_scheduler::CosineAnnealingLR>(p.opt, 5);
  auto swa_sched = std::make_shared<SWALR>(p.opt, 0.05, 3, AnnealStrategy::linear);
  optim::lr_scheduler::SequentialLR sched(p.opt, {cosine, swa_sched}, {5});
  std::vector<std::vector<double>> lrs = {sched.get_last_lr()};
  for (int s = 0; s < 12; ++s) {
    sched.step();
    lrs.push_back(sched.get_last_lr());
  }
  expect_lrs(g["sequential"], lrs, "SequentialLR(CosineAnnealingLR, SWALR)");
}

TEST(SWALR, RejectsBadArguments) {
  TwoGroups p;
  EXPECT_NE(error_of([&] {
              SWALR(p.opt, std::vector<double>{0.1, 0.2, 0.3});
            }).find("3 swa_lr values for 2 parameter groups"),
            std::string::npos);
  EXPECT_NE(error_of([&] { SWALR(p.opt, 0.1, -1); }).find("anneal_epochs must be >= 0"), std::string::npos);
}

// ---------------------------------------------------------------- averaging files

TEST(AverageFiles, MatchesAveragedModelOverTheSameTorchFiles) {
  if (goldens().empty()) return;
  TempDir dir;
  std::vector<std::string> pth;
  for (int k = 0; k < kStates; ++k) pth.push_back(state_path(k));
  AverageFilesReport r = average_weight_files(pth, dir / "swa.pth");
  EXPECT_EQ(r.files, 10);
  EXPECT_EQ(r.averaged, 8);  // parameters
  EXPECT_EQ(r.copied, 6);    // buffers, the last file's
  expect_state(io::load_state_dict(dir / "swa.pth"), expected("swa"), 1e-12, "tvc average");

  // Any mix of formats and wrapped checkpoints, the model's own state_dict.
  std::vector<std::string> mixed;
  for (int k = 0; k < kStates; ++k)
    mixed.push_back(k == 3 ? goldens() + "/states/ckpt_3.pth" : state_path(k, k % 2 ? "safetensors" : "pth"));
  average_weight_files(mixed, dir / "plain.safetensors", {.plain = true});
  nn::StateDict plain = io::load_state_dict(dir / "plain.safetensors");
  nn::StateDict want = io::load_state_dict(expected("swa"));
  EXPECT_EQ(plain.size() + 1, want.size());
  for (const auto& [k, t] : plain) EXPECT_LE(relative_error(t, want.at("module." + k)), 1e-12) << k;

  average_weight_files(pth, dir / "ema.pth",
                       {.method = AverageFilesOptions::Method::ema, .ema_decay = 0.9, .use_buffers = true});
  expect_state(io::load_state_dict(dir / "ema.pth"), expected("ema09_buffers"), 1e-12, "tvc average --ema");
}

TEST(AverageFiles, FilesThatDifferAreNamedAndNothingIsWritten) {
  if (goldens().empty()) return;
  TempDir dir;
  nn::StateDict sd = io::load_state_dict(state_path(1));
  sd.insert("4.weight", randn({7, 100}, {.dtype = DType::Float64}));
  io::save_pth(dir / "wide.pth", io::Value(sd));
  std::string e = error_of([&] { average_weight_files({state_path(0), dir / "wide.pth"}, dir / "out.pth"); });
  EXPECT_NE(e.find("'" + (dir / "wide.pth") + "': '4.weight' has shape [7, 100] but [6, 100]"), std::string::npos) << e;
  sd = io::load_state_dict(state_path(1));
  sd.erase("5.running_var");
  io::save_safetensors(dir / "missing.safetensors", sd);
  e = error_of([&] {
    average_weight_files({state_path(0), state_path(2), dir / "missing.safetensors"}, dir / "out.pth");
  });
  EXPECT_NE(e.find("missing.safetensors': lacks '5.running_var'"), std::string::npos) << e;
  sd = io::load_state_dict(state_path(1));
  sd.insert("extra.weight", randn({2}));
  io::save_pth(dir / "extra.pth", io::Value(sd));
  e = error_of([&] { average_weight_files({state_path(0), dir / "extra.pth"}, dir / "out.pth"); });
  EXPECT_NE(e.find("extra.pth': has 'extra.weight'"), std::string::npos) << e;
  EXPECT_FALSE(std::filesystem::exists(dir / "out.pth"));
  e = error_of([&] { average_weight_files({state_path(0)}, dir / "out.bin"); });
  EXPECT_NE(e.find("unknown output format '.bin'"), std::string::npos) << e;
}

TEST(AverageFiles, TheCommandLine) {
  if (goldens().empty()) return;
  TempDir dir;
  std::string files;
  for (int k = 0; k < kStates; ++k) files.append(" ").append(state_path(k, k % 3 ? "pth" : "safetensors"));
  test::TvcRun run =
      test::run_tvc(dir, "average --out " + (dir / "ema.safetensors") + " --ema 0.9 --use-buffers" + files);
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.out.find("EMA (decay 0.9) of 10 files, 12 tensors averaged, 2 buffers from the last file"),
            std::string::npos)
      << run.out;
  expect_state(io::load_state_dict(dir / "ema.safetensors"), expected("ema09_buffers"), 1e-12, "tvc average --ema");

  run = test::run_tvc(dir, "average --out " + (dir / "swa.pth") + " --swa" + files);
  EXPECT_EQ(run.status, 0) << run.err;
  expect_state(io::load_state_dict(dir / "swa.pth"), expected("swa"), 1e-12, "tvc average --swa");

  test::write_file(dir / "junk.pth", "not a weight file at all");
  run = test::run_tvc(dir, "average --out " + (dir / "bad.pth") + files + " " + (dir / "junk.pth"));
  EXPECT_EQ(run.status, 1);
  EXPECT_NE(run.err.find("error: '" + (dir / "junk.pth") + "'"), std::string::npos) << run.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "bad.pth"));
  run = test::run_tvc(dir, "average --out " + (dir / "x.pth") + " --swa --ema 0.9" + files);
  EXPECT_EQ(run.status, 2) << run.err;
  run = test::run_tvc(dir, "average --out " + (dir / "x.pth") + " --ema 1.5" + files);
  EXPECT_EQ(run.status, 2) << run.err;
}
