// Optimizers, gradient clipping and lr schedulers against PyTorch 1.13.
//
// Optimizer trajectories: a least-squares linear model y = x W^T + b with fixed random data,
// two parameter groups (W and b) with different lrs, 20 steps in tvc and in PyTorch from the same
// start, every parameter compared after every step (float64: err <= 1e-12).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>

#include "torch_golden.h"
#include "tvc/autograd.h"
#include "tvc/lr_scheduler.h"
#include "tvc/ops.h"
#include "tvc/optim.h"

using namespace tvc;
using namespace tvc::optim;
using namespace tvc::optim::lr_scheduler;
using tvc::test::py_tensor;
using tvc::test::tensor_from_json;
using tvc::test::torch_json;

namespace {

double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::sqrt(den);
}

double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  return rel_err(a.to_vector(), b.to_vector());
}

// Expects fn to throw a tvc::Error whose message contains part.
void expect_error(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "expected a tvc::Error containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "message '" << e.what() << "' lacks '" << part << "'";
  }
}

// ---------------------------------------------------------------- the problem

struct Problem {
  Tensor X, Y, W, b;
};

Problem make_problem(DType dtype) {
  Generator gen(20240611);
  TensorOptions o{.dtype = dtype};
  Problem p;
  p.X = randn({8, 5}, o, &gen);
  p.Y = randn({8, 3}, o, &gen);
  p.W = randn({3, 5}, o, &gen).requires_grad_();
  p.b = randn({3}, o, &gen).requires_grad_();
  return p;
}

Tensor loss_of(const Problem& p) { return mse_loss(linear(p.X, p.W, p.b), p.Y); }

void train_step(Optimizer& opt, const Problem& p) {
  opt.zero_grad();
  loss_of(p).backward();
  opt.step();
}

// Python: the problem's tensors, then `opt = make_opt`, `steps` steps; prints W, b after each.
std::string py_trajectory(const Problem& p, const std::string& make_opt, int steps) {
  std::ostringstream py;
  py << "X = " << py_tensor(p.X) << "\nY = " << py_tensor(p.Y) << "\n"
     << "W = " << py_tensor(p.W.detach()) << ".requires_grad_()\n"
     << "b = " << py_tensor(p.b.detach()) << ".requires_grad_()\n"
     << "opt = " << make_opt << "\n"
     << "out = []\n"
     << "for i in range(" << steps << "):\n"
     << "    opt.zero_grad()\n"
     << "    torch.nn.functional.mse_loss(torch.nn.functional.linear(X, W, b), Y).backward()\n"
     << "    opt.step()\n"
     << "    out += [W.detach().clone(), b.detach().clone()]\n"
     << "print(json_tensors(out))\n";
  return py.str();
}

// ---------------------------------------------------------------- trajectories

struct OptCase {
  std::string name;
  std::string py;  // builds the optimizer from W and b
  std::function<std::unique_ptr<Optimizer>(const Tensor& W, const Tensor& b)> make;
};

std::vector<OptCase> optimizer_cases() {
  return {
      {"SGD", "torch.optim.SGD([{'params': [W]}, {'params': [b], 'lr': 0.05}], lr=0.1)",
       [](const Tensor& W, const Tensor& b) {
         return std::make_unique<SGD>(std::vector<ParamGroup>{{{W}, {}}, {{b}, {{"lr", 0.05}}}}, SGDOptions{.lr = 0.1});
       }},
      {"SGDMomentumDampening",
       "torch.optim.SGD([{'params': [W]}, {'params': [b], 'lr': 0.05, 'momentum': 0.5}], lr=0.1, "
       "momentum=0.9, dampening=0.3)",
       [](const Tensor& W, const Tensor& b) {
         return std::make_unique<SGD>(std::vector<ParamGroup>{{{W}, {}}, {{b}, {{"lr", 0.05}, {"momentum", 0.5}}}},
                                      SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.3});
       }},
      {"SGDNesterovWeightDecay",
       "torch.optim.SGD([{'params': [W]}, {'params': [b], 'lr': 0.03}], lr=0.08, momentum=0.8, "
       "nesterov=True, weight_decay=0.05)",
       [](const Tensor& W, const Tensor& b) {
         return std::make_unique<SGD>(std::vector<ParamGroup>{{{W}, {}}, {{b}, {{"lr", 0.03}}}},
                                      SGDOptions{.lr = 0.08, .momentum = 0.8, .weight_decay = 0.05, .nesterov = true});
       }},
      {"SGDWeightDecayMaximize",
       "torch.optim.SGD([{'params': [W]}, {'params': [b], 'lr': 0.004}], lr=0.01, "
       "weight_decay=0.2, maximize=True)",
       [](const Tensor& W, const Tensor& b) {
         return std::make_unique<SGD>(std::vector<ParamGroup>{{{W}, {}}, {{b}, {{"lr", 0.004}}}},
                                      SGDOptions{.lr = 0.01, .weight_decay = 0.2, .maximize = true});
       }},
      {"Adam", "torch.optim.Adam([{'params': [W]}, {'params': [b], 'lr': 0.02}], lr=0.05)",
       [](const Tensor& W, const Tensor& b) {
         return std::make_unique<Adam>(std::vector<ParamGroup>{{{W}, {}}, {{b}, {{"lr", 0.02}}}},
                                       AdamOptions{.lr = 0.05});
       }},
      {"AdamAmsgradWeightDecay",
       "torch.optim.Adam([{'params': [W]}, {'params': [b], 'lr': 0.02, 'betas': (0.7, 0.9)}], "
       "lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, amsgrad=True)",
       [](const Tensor& W, const Tensor& b) {
         return std::make_unique<Adam>(
             std::vector<ParamGroup>{{{W}, {}}, {{b}, {{"lr", 0.02}, {"betas", std::vector<double>{0.7, 0.9}}}}},
             AdamOptions{.lr = 0.05, .betas = {0.8, 0.99}, .eps = 1e-6, .weight_decay = 0.1, .amsgrad = true});
       }},
      {"AdamW",
       "torch.optim.AdamW([{'params': [W]}, {'params': [b], 'lr': 0.02, 'weight_decay': 0.0}], "
       "lr=0.05, weight_decay=0.1)",
       [](const Tensor& W, const Tensor& b) {
         return std::make_unique<AdamW>(
             std::vector<ParamGroup>{{{W}, {}}, {{b}, {{"lr", 0.02}, {"weight_decay", 0.0}}}},
             AdamWOptions{.lr = 0.05, .weight_decay = 0.1});
       }},
      {"AdamWAmsgradMaximize",
       "torch.optim.AdamW([{'params': [W]}, {'params': [b], 'lr': 0.01}], lr=0.03, "
       "amsgrad=True, maximize=True)",
       [](const Tensor& W, const Tensor& b) {
         return std::make_unique<AdamW>(std::vector<ParamGroup>{{{W}, {}}, {{b}, {{"lr", 0.01}}}},
                                        AdamWOptions{.lr = 0.03, .amsgrad = true, .maximize = true});
       }},
  };
}

void PrintTo(const OptCase& c, std::ostream* os) { *os << c.name; }

class OptimizerTrajectory : public ::testing::TestWithParam<OptCase> {};

TEST_P(OptimizerTrajectory, MatchesTorchFloat64) {
  const OptCase& c = GetParam();
  Problem p = make_problem(DType::Float64);
  nlohmann::json golden = torch_json(py_trajectory(p, c.py, 20));
  ASSERT_EQ(golden.size(), 40u);
  auto opt = c.make(p.W, p.b);
  double worst = 0;
  for (int i = 0; i < 20; ++i) {
    train_step(*opt, p);
    const double ew = rel_err(p.W, tensor_from_json(golden[2 * i]));
    const double eb = rel_err(p.b, tensor_from_json(golden[2 * i + 1]));
    EXPECT_LE(ew, 1e-12) << "W after step " << i + 1;
    EXPECT_LE(eb, 1e-12) << "b after step " << i + 1;
    worst = std::max({worst, ew, eb});
  }
  std::cout << c.name << ": worst err over 20 steps " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(Optim, OptimizerTrajectory, ::testing::ValuesIn(optimizer_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(Optim, Float32ParamsFollowTorch) {
  for (const OptCase& c : optimizer_cases()) {
    if (c.name != "SGDNesterovWeightDecay" && c.name != "AdamAmsgradWeightDecay") continue;
    Problem p = make_problem(DType::Float32);
    nlohmann::json golden = torch_json(py_trajectory(p, c.py, 20));
    ASSERT_EQ(golden.size(), 40u);
    auto opt = c.make(p.W, p.b);
    for (int i = 0; i < 20; ++i) train_step(*opt, p);
    EXPECT_EQ(p.W.dtype(), DType::Float32);
    EXPECT_EQ(opt->state(p.W).at(c.name[0] == 'S' ? "momentum_buffer" : "exp_avg").dtype(), DType::Float32);
    EXPECT_LE(rel_err(p.W, tensor_from_json(golden[38])), 1e-5) << c.name;
    EXPECT_LE(rel_err(p.b, tensor_from_json(golden[39])), 1e-5) << c.name;
  }
}

// SGD with momentum updates the parameters that have a buffer in one foreach_sgd_momentum_ call
// with the bits of the ops one by one (buffer.mul_(m).add_(d_p, 1 - dampening), then
// param.add_(buffer, -lr)): float32 parameters of several shapes (one channels-last, one whose
// gradient is strided and so goes the ops' way) and a float64 one, with and without dampening
// and weight decay, three steps.
TEST(Optim, SGDMomentumInOnePassGivesTheBitsOfTheOps) {
  for (const auto& [dampening, weight_decay] : {std::pair{0.0, 0.0}, std::pair{0.25, 0.01}}) {
    std::vector<Tensor> params{randn({3, 5}), randn({7}), randn({2, 3, 4, 5}).contiguous(MemoryFormat::ChannelsLast),
                               randn({4, 6}), randn({5}).to(DType::Float64)};
    std::vector<Tensor> mirror, buffers(params.size());
    for (Tensor& p : params) {
      mirror.push_back(p.clone());
      p.requires_grad_();
    }
    optim::SGD opt(
        params, optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = dampening, .weight_decay = weight_decay});
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < params.size(); ++i) {
        Tensor g = randn(params[i].shape()).to(params[i].dtype());
        if (params[i].dim() == 4) g = g.contiguous(MemoryFormat::ChannelsLast);
        if (i == 3) g = randn({6, 4}).t();  // strided
        params[i].set_grad(g);
        NoGradGuard no_grad;
        Tensor d_p = weight_decay != 0 ? add(g, mirror[i], weight_decay) : g;
        if (!buffers[i].defined())
          buffers[i] = d_p.clone();
        else
          buffers[i].mul_(0.9).add_(d_p, 1 - dampening);
        mirror[i].add_(buffers[i], -0.05);
      }
      opt.step();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(params[i].to_vector(), mirror[i].to_vector()) << "parameter " << i << ", step " << step;
        EXPECT_EQ(opt.state(params[i]).at("momentum_buffer").to_vector(), buffers[i].to_vector()) << i;
      }
    }
  }
}

TEST(Optim, ParamsWithoutGradAreSkipped) {
  Tensor w = tensor<double>({1.5, -2.0}).requires_grad_();
  Tensor frozen = tensor<double>({3.0, 4.0}).requires_grad_();
  Adam opt({w, frozen}, {.lr = 0.1});
  sum(w * w).backward();
  opt.step();
  EXPECT_EQ(frozen.to_vector(), (std::vector<double>{3.0, 4.0}));
  EXPECT_TRUE(opt.state(frozen).empty());
  EXPECT_EQ(opt.state(w).at("step").item_double(), 1.0);
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  sum(w * w).backward();
  opt.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{0.0, 0.0}));
}

TEST(Optim, StepRunsClosure) {
  Problem p = make_problem(DType::Float64);
  SGD opt({p.W, p.b}, {.lr = 0.1});
  const double before = loss_of(p).item_double();
  Tensor loss = opt.step([&] {
    opt.zero_grad();
    Tensor l = loss_of(p);
    l.backward();
    return l;
  });
  EXPECT_EQ(loss.item_double(), before);
  EXPECT_LT(loss_of(p).item_double(), before);
}

// ---------------------------------------------------------------- state_dict

// Resuming from a state_dict continues exactly the uninterrupted run, which matches PyTorch.
void check_resume(const OptCase& c) {
  Problem p = make_problem(DType::Float64);
  nlohmann::json golden = torch_json(py_trajectory(p, c.py, 20));
  ASSERT_EQ(golden.size(), 40u);
  auto opt = c.make(p.W, p.b);
  for (int i = 0; i < 10; ++i) train_step(*opt, p);
  OptimizerStateDict saved = opt->state_dict();
  const std::string first_key = c.name.rfind("SGD", 0) == 0 ? "momentum_buffer" : "exp_avg";
  const std::vector<double> saved_first = saved.state.at(0).at(first_key).to_vector();

  Problem q = p;  // same data, new parameters with the values after 10 steps
  q.W = p.W.detach().clone().requires_grad_();
  q.b = p.b.detach().clone().requires_grad_();
  auto resumed = c.make(q.W, q.b);
  resumed->load_state_dict(saved);
  for (int i = 10; i < 20; ++i) {
    train_step(*opt, p);
    train_step(*resumed, q);
    EXPECT_EQ(q.W.to_vector(), p.W.to_vector()) << c.name << " step " << i + 1;
    EXPECT_EQ(q.b.to_vector(), p.b.to_vector()) << c.name << " step " << i + 1;
    EXPECT_LE(rel_err(q.W, tensor_from_json(golden[2 * i])), 1e-12) << c.name;
  }
  // The saved dict is a copy: the later steps did not change it.
  EXPECT_EQ(saved.state.at(0).at(first_key).to_vector(), saved_first) << c.name;
}

TEST(OptimStateDict, ResumeSGDAndAdam) {
  for (const OptCase& c : optimizer_cases())
    if (c.name == "SGDMomentumDampening" || c.name == "AdamAmsgradWeightDecay" || c.name == "AdamW") check_resume(c);
}

TEST(OptimStateDict, LayoutMatchesTorch) {
  const OptCase c = optimizer_cases()[5];  // AdamAmsgradWeightDecay
  ASSERT_EQ(c.name, "AdamAmsgradWeightDecay");
  Problem p = make_problem(DType::Float64);
  std::string py = py_trajectory(p, c.py, 3);
  py += R"PY(
sd = opt.state_dict()
print(json.dumps({
  "state_keys": {str(k): sorted(v.keys()) for k, v in sd["state"].items()},
  "steps": [float(sd["state"][i]["step"]) for i in (0, 1)],
  "step_dtype": str(sd["state"][0]["step"].dtype),
  "exp_avg_sq_W": [float(v) for v in sd["state"][0]["exp_avg_sq"].reshape(-1)],
  "max_exp_avg_sq_b": [float(v) for v in sd["state"][1]["max_exp_avg_sq"].reshape(-1)],
  "groups": [{"params": g["params"], "lr": g["lr"], "betas": list(g["betas"]),
              "amsgrad": g["amsgrad"]} for g in sd["param_groups"]],
}))
)PY";
  // The golden prints two lines: the trajectory, then the state dict.
  std::string out = tvc::test::torch_run(py);
  nlohmann::json golden = nlohmann::json::parse(out.substr(out.find('\n') + 1));
  auto opt = c.make(p.W, p.b);
  for (int i = 0; i < 3; ++i) train_step(*opt, p);
  OptimizerStateDict sd = opt->state_dict();
  ASSERT_EQ(sd.state.size(), 2u);
  for (int64_t i = 0; i < 2; ++i) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : sd.state.at(i)) keys.push_back(k);
    EXPECT_EQ(keys, golden["state_keys"][std::to_string(i)].get<std::vector<std::string>>());
    EXPECT_EQ(sd.state.at(i).at("step").item_double(), golden["steps"][i].get<double>());
    EXPECT_EQ(sd.state.at(i).at("step").dtype(), DType::Float32);
  }
  EXPECT_EQ(golden["step_dtype"], "torch.float32");
  EXPECT_LE(rel_err(sd.state.at(0).at("exp_avg_sq").to_vector(), golden["exp_avg_sq_W"].get<std::vector<double>>()),
            1e-12);
  EXPECT_LE(
      rel_err(sd.state.at(1).at("max_exp_avg_sq").to_vector(), golden["max_exp_avg_sq_b"].get<std::vector<double>>()),
      1e-12);
  ASSERT_EQ(sd.param_groups.size(), 2u);
  for (size_t g = 0; g < 2; ++g) {
    const auto& gg = golden["groups"][g];
    EXPECT_EQ(sd.param_groups[g].params, gg["params"].get<std::vector<int64_t>>());
    EXPECT_EQ(sd.param_groups[g].options.get_double("lr"), gg["lr"].get<double>());
    EXPECT_EQ(sd.param_groups[g].options.get_list("betas"), gg["betas"].get<std::vector<double>>());
    EXPECT_EQ(sd.param_groups[g].options.get_bool("amsgrad"), gg["amsgrad"].get<bool>());
  }
}

TEST(OptimStateDict, MismatchIsRejectedWholesale) {
  Problem p = make_problem(DType::Float64);
  auto make = optimizer_cases()[1].make;  // SGD with momentum, two groups
  auto opt = make(p.W, p.b);
  for (int i = 0; i < 2; ++i) train_step(*opt, p);
  const OptimizerStateDict good = opt->state_dict();
  const std::vector<double> buf_before = opt->state(p.W).at("momentum_buffer").to_vector();

  OptimizerStateDict one_group = good;
  one_group.param_groups.pop_back();
  expect_error([&] { opt->load_state_dict(one_group); }, "the state dict has 1 parameter groups, the optimizer has 2");

  OptimizerStateDict sizes = good;
  sizes.param_groups[1].params.push_back(7);
  expect_error([&] { opt->load_state_dict(sizes); },
               "parameter group 1 of the state dict has 2 parameters, the optimizer's has 1");

  OptimizerStateDict shape = good;
  shape.state.at(1).at("momentum_buffer") = zeros({4}, {.dtype = DType::Float64});
  shape.state.at(0).at("momentum_buffer") = zeros({3, 5}, {.dtype = DType::Float64});
  shape.param_groups[0].options.set("lr", 0.5);
  expect_error([&] { opt->load_state_dict(shape); },
               "state 'momentum_buffer' of parameter 1 has shape [4], the parameter has shape [3]");

  OptimizerStateDict stray = good;
  stray.state[9] = stray.state.at(0);
  expect_error([&] { opt->load_state_dict(stray); }, "parameter index 9");

  OptimizerStateDict missing = good;
  missing.param_groups[0].options = Options{{"lr", 0.1}};
  expect_error([&] { opt->load_state_dict(missing); }, "lacks hyper-parameter 'momentum'");

  OptimizerStateDict bad_lr = good;
  bad_lr.param_groups[1].options.set("lr", -1.0);
  expect_error([&] { opt->load_state_dict(bad_lr); }, "invalid learning rate -1");

  // Nothing was half-loaded.
  EXPECT_EQ(opt->state(p.W).at("momentum_buffer").to_vector(), buf_before);
  EXPECT_EQ(opt->param_groups()[0].options.get_double("lr"), 0.1);

  // Another optimizer's state (Adam's) lacks SGD's hyper-parameters.
  Adam adam(std::vector<ParamGroup>{{{p.W}, {}}, {{p.b}, {}}});
  expect_error([&] { opt->load_state_dict(adam.state_dict()); }, "lacks hyper-parameter 'momentum'");
}

// ---------------------------------------------------------------- construction errors

TEST(OptimErrors, BadHyperParameters) {
  Tensor w = randn({2, 2}, {.dtype = DType::Float64}).requires_grad_();
  expect_error([&] { SGD({w}, {.lr = -0.1}); }, "SGD: invalid learning rate -0.1");
  expect_error([&] { SGD({w}, {.lr = 0.1, .momentum = -1}); }, "SGD: invalid momentum -1");
  expect_error([&] { SGD({w}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}); },
               "nesterov momentum requires momentum > 0 and dampening 0");
  expect_error([&] { Adam({w}, {.betas = {1.0, 0.999}}); }, "Adam: invalid beta parameter at index 0: 1");
  expect_error([&] { AdamW({w}, {.betas = {0.9, -0.1}}); }, "AdamW: invalid beta parameter at index 1: -0.1");
  expect_error([&] { Adam({w}, {.eps = -1e-8}); }, "Adam: invalid eps");
  expect_error([&] { AdamW({w}, {.weight_decay = -0.01}); }, "AdamW: invalid weight_decay -0.01");
  expect_error([&] { SGD(std::vector<ParamGroup>{{{w}, {{"lr", -2.0}}}}); }, "SGD: invalid learning rate -2");
  expect_error(
      [&] {
        SGD(std::vector<ParamGroup>{{{w}, {{"lr", true}}}});
      },
      "hyper-parameter 'lr' of group 0 must be a number, got a flag");
  expect_error(
      [&] {
        Adam(std::vector<ParamGroup>{{{w}, {{"betas", std::vector<double>{0.9}}}}});
      },
      "betas must hold 2 values, got 1");
}

TEST(OptimErrors, BadParameters) {
  Tensor w = randn({2, 2}, {.dtype = DType::Float64}).requires_grad_();
  expect_error([&] { SGD(std::vector<Tensor>{}); }, "SGD: got an empty parameter list");
  expect_error([&] { SGD({w, w}); }, "appears more than once");
  expect_error([&] { SGD({w * 2.0}); }, "is not a leaf tensor");
  expect_error([&] { Adam({arange(4)}); }, "has dtype int64; only floating tensors");
  SGD opt({w});
  expect_error([&] { opt.add_param_group({{w}, {}}); }, "appears more than once");
  Tensor v = randn({3}, {.dtype = DType::Float64}).requires_grad_();
  opt.add_param_group({{v}, {{"momentum", 0.9}}});
  ASSERT_EQ(opt.param_groups().size(), 2u);
  EXPECT_EQ(opt.param_groups()[1].options.get_double("momentum"), 0.9);
  EXPECT_EQ(opt.param_groups()[1].options.get_double("lr"), 1e-3);  // from the defaults
}

// ---------------------------------------------------------------- clip_grad_norm_

TEST(ClipGradNorm, MatchesTorch) {
  Generator gen(77);
  TensorOptions f64{.dtype = DType::Float64};
  std::vector<Tensor> params;
  std::vector<Tensor> grads = {randn({4, 3}, f64, &gen), randn({5}, f64, &gen), randn({2, 2, 2}, f64, &gen)};
  for (const Tensor& g : grads) params.push_back(zeros(g.shape(), f64).requires_grad_());
  Tensor no_grad_param = zeros({3}, f64).requires_grad_();  // has no gradient: ignored
  params.push_back(no_grad_param);
  for (double norm_type : {2.0, std::numeric_limits<double>::infinity(), 1.0, 3.0}) {
    for (double max_norm : {0.7, 100.0}) {
      std::ostringstream py;
      py.precision(17);
      py << "ps = []\n";
      for (const Tensor& g : grads)
        py << "p = torch.zeros(" << shape_str(g.shape()) << ", dtype=torch.float64, requires_grad=True)\n"
           << "p.grad = " << py_tensor(g) << "\nps.append(p)\n";
      py << "ps.append(torch.zeros(3, dtype=torch.float64, requires_grad=True))\n"
         << "total = torch.nn.utils.clip_grad_norm_(ps, " << max_norm << ", "
         << (std::isinf(norm_type) ? std::string("float('inf')") : std::to_string(norm_type)) << ")\n"
         << "print(json_tensors([total] + [p.grad for p in ps[:3]]))\n";
      nlohmann::json golden = torch_json(py.str());
      ASSERT_EQ(golden.size(), 4u);
      for (size_t i = 0; i < grads.size(); ++i) params[i].set_grad(grads[i].clone());
      Tensor total = clip_grad_norm_(params, max_norm, norm_type);
      EXPECT_EQ(total.dim(), 0);
      EXPECT_LE(rel_err(total, tensor_from_json(golden[0]).reshape({})), 1e-14) << "norm_type " << norm_type;
      for (size_t i = 0; i < grads.size(); ++i)
        EXPECT_LE(rel_err(params[i].grad(), tensor_from_json(golden[i + 1])), 1e-14)
            << "norm_type " << norm_type << " max_norm " << max_norm << " grad " << i;
      if (max_norm == 100.0) {  // no clipping: coefficient exactly 1
        EXPECT_EQ(params[0].grad().to_vector(), grads[0].to_vector());
      }
    }
  }
  EXPECT_FALSE(no_grad_param.grad().defined());
}

TEST(ClipGradNorm, EdgeCases) {
  Tensor w = zeros({2}, {.dtype = DType::Float64}).requires_grad_();
  EXPECT_EQ(clip_grad_norm_({w}, 1.0).item_double(), 0.0);  // no gradients
  w.set_grad(tensor<double>({INFINITY, 1.0}));
  expect_error([&] { clip_grad_norm_({w}, 1.0, 2.0, /*error_if_nonfinite=*/true); },
               "clip_grad_norm_: the total norm of order 2 of the gradients is inf");
  EXPECT_TRUE(std::isinf(clip_grad_norm_({w}, 1.0).item_double()));
  expect_error([&] { clip_grad_norm_({w}, 1.0, -1.0); }, "norm_type must be > 0");
}

// ---------------------------------------------------------------- schedulers

struct SchedCase {
  std::string name;
  std::string opt_py;    // optimizer over W, b
  std::string sched_py;  // scheduler over opt
  bool adam;             // Adam (betas) instead of SGD (momentum)
  std::function<std::shared_ptr<LRScheduler>(Optimizer&)> make;
};

std::unique_ptr<Optimizer> sched_optimizer(bool adam, const Tensor& W, const Tensor& b) {
  if (adam)
    return std::make_unique<Adam>(std::vector<ParamGroup>{{{W}, {}}, {{b}, {{"lr", 0.05}}}}, AdamOptions{.lr = 0.1});
  return std::make_unique<SGD>(std::vector<ParamGroup>{{{W}, {}}, {{b}, {{"lr", 0.05}}}},
                               SGDOptions{.lr = 0.1, .momentum = 0.9});
}

const char* kSgdPy = "torch.optim.SGD([{'params': [W]}, {'params': [b], 'lr': 0.05}], lr=0.1, momentum=0.9)";
const char* kAdamPy = "torch.optim.Adam([{'params': [W]}, {'params': [b], 'lr': 0.05}], lr=0.1)";

std::vector<SchedCase> scheduler_cases() {
  using S = std::shared_ptr<LRScheduler>;
  return {
      {"StepLR", kSgdPy, "S.StepLR(opt, step_size=7, gamma=0.5)", false,
       [](Optimizer& o) -> S { return std::make_shared<StepLR>(o, 7, 0.5); }},
      {"MultiStepLR", kSgdPy, "S.MultiStepLR(opt, milestones=[12, 5, 20, 12], gamma=0.3)", false,
       [](Optimizer& o) -> S {
         return std::make_shared<MultiStepLR>(o, std::vector<int64_t>{12, 5, 20, 12}, 0.3);
       }},
      {"LinearLR", kSgdPy, "S.LinearLR(opt, start_factor=0.25, end_factor=0.9, total_iters=10)", false,
       [](Optimizer& o) -> S { return std::make_shared<LinearLR>(o, 0.25, 0.9, 10); }},
      {"CosineAnnealingLR", kSgdPy, "S.CosineAnnealingLR(opt, T_max=10, eta_min=0.001)", false,
       [](Optimizer& o) -> S { return std::make_shared<CosineAnnealingLR>(o, 10, 0.001); }},
      {"OneCycleCos", kSgdPy, "S.OneCycleLR(opt, max_lr=[0.5, 0.2], total_steps=31)", false,
       [](Optimizer& o) -> S {
         return std::make_shared<OneCycleLR>(o, OneCycleLROptions{.max_lr = {0.5, 0.2}, .total_steps = 31});
       }},
      {"OneCycleLinearThreePhaseAdam", kAdamPy,
       "S.OneCycleLR(opt, max_lr=0.3, epochs=4, steps_per_epoch=8, pct_start=0.25, "
       "anneal_strategy='linear', three_phase=True, base_momentum=[0.8, 0.7], div_factor=10.0)",
       true,
       [](Optimizer& o) -> S {
         return std::make_shared<OneCycleLR>(o, OneCycleLROptions{.max_lr = {0.3},
                                                                  .epochs = 4,
                                                                  .steps_per_epoch = 8,
                                                                  .pct_start = 0.25,
                                                                  .anneal_strategy = "linear",
                                                                  .base_momentum = {0.8, 0.7},
                                                                  .div_factor = 10,
                                                                  .three_phase = true});
       }},
      {"SequentialLinearCosine", kSgdPy,
       "S.SequentialLR(opt, [S.LinearLR(opt, start_factor=0.1, total_iters=5), "
       "S.CosineAnnealingLR(opt, T_max=12, eta_min=0.002)], milestones=[5])",
       false,
       [](Optimizer& o) -> S {
         auto warm = std::make_shared<LinearLR>(o, 0.1, 1.0, 5);
         auto cos = std::make_shared<CosineAnnealingLR>(o, 12, 0.002);
         return std::make_shared<SequentialLR>(o, std::vector<S>{warm, cos}, std::vector<int64_t>{5});
       }},
      {"SequentialThree", kAdamPy,
       "S.SequentialLR(opt, [S.LinearLR(opt, start_factor=0.2, total_iters=4), "
       "S.StepLR(opt, step_size=3, gamma=0.5), S.MultiStepLR(opt, milestones=[2, 6], gamma=0.1)], "
       "milestones=[4, 15])",
       true,
       [](Optimizer& o) -> S {
         auto a = std::make_shared<LinearLR>(o, 0.2, 1.0, 4);
         auto b = std::make_shared<StepLR>(o, 3, 0.5);
         auto c = std::make_shared<MultiStepLR>(o, std::vector<int64_t>{2, 6}, 0.1);
         return std::make_shared<SequentialLR>(o, std::vector<S>{a, b, c}, std::vector<int64_t>{4, 15});
       }},
  };
}

// Per step: the lr of both groups, then their momentum (SGD) or beta1 (Adam).
std::vector<double> lr_row(const Optimizer& opt, bool adam) {
  std::vector<double> row;
  for (const ParamGroup& g : opt.param_groups()) row.push_back(g.options.get_double("lr"));
  for (const ParamGroup& g : opt.param_groups())
    row.push_back(adam ? g.options.get_list("betas")[0] : g.options.get_double("momentum"));
  return row;
}

constexpr int kSchedSteps = 30;

std::string py_schedule(const SchedCase& c) {
  std::ostringstream py;
  py << "import torch.optim.lr_scheduler as S\n"
     << "W = torch.zeros(3, 5, dtype=torch.float64, requires_grad=True)\n"
     << "b = torch.zeros(3, dtype=torch.float64, requires_grad=True)\n"
     << "opt = " << c.opt_py << "\nsched = " << c.sched_py << "\n"
     << "def row():\n"
     << "    return [g['lr'] for g in opt.param_groups] + "
     << (c.adam ? "[g['betas'][0] for g in opt.param_groups]\n" : "[g['momentum'] for g in opt.param_groups]\n")
     << "out = [row()]\n"
     << "for i in range(" << kSchedSteps << "):\n"
     << "    opt.step()\n    sched.step()\n"
     << "    assert sched.get_last_lr() == [g['lr'] for g in opt.param_groups]\n"
     << "    out.append(row())\n"
     << "print(json.dumps(out))\n";
  return py.str();
}

void PrintTo(const SchedCase& c, std::ostream* os) { *os << c.name; }

class SchedulerSequence : public ::testing::TestWithParam<SchedCase> {};

TEST_P(SchedulerSequence, MatchesTorch) {
  const SchedCase& c = GetParam();
  nlohmann::json golden = torch_json(py_schedule(c));
  ASSERT_EQ(golden.size(), kSchedSteps + 1u);
  Tensor W = zeros({3, 5}, {.dtype = DType::Float64}).requires_grad_();
  Tensor b = zeros({3}, {.dtype = DType::Float64}).requires_grad_();
  auto opt = sched_optimizer(c.adam, W, b);
  auto sched = c.make(*opt);
  double worst = 0;
  for (int i = 0; i <= kSchedSteps; ++i) {
    if (i > 0) {
      opt->step();
      sched->step();
    }
    EXPECT_EQ(sched->last_epoch(), i);
    const std::vector<double> row = lr_row(*opt, c.adam);
    EXPECT_EQ(sched->get_last_lr(), std::vector<double>(row.begin(), row.begin() + 2));
    const double e = rel_err(row, golden[i].get<std::vector<double>>());
    EXPECT_LE(e, 1e-12) << "after " << i << " steps";
    worst = std::max(worst, e);
  }
  std::cout << c.name << ": worst err over " << kSchedSteps << " steps " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(LRScheduler, SchedulerSequence, ::testing::ValuesIn(scheduler_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(LRSchedulerState, ResumeContinuesIdentically) {
  for (const SchedCase& c : scheduler_cases()) {
    if (c.name != "CosineAnnealingLR" && c.name != "SequentialLinearCosine" && c.name != "OneCycleCos") continue;
    Tensor W = zeros({2}, {.dtype = DType::Float64}).requires_grad_();
    Tensor b = zeros({1}, {.dtype = DType::Float64}).requires_grad_();
    auto opt = sched_optimizer(c.adam, W, b);
    auto sched = c.make(*opt);
    for (int i = 0; i < 8; ++i) sched->step();
    const OptimizerStateDict opt_state = opt->state_dict();
    const SchedulerStateDict sched_state = sched->state_dict();

    Tensor W2 = zeros({2}, {.dtype = DType::Float64}).requires_grad_();
    Tensor b2 = zeros({1}, {.dtype = DType::Float64}).requires_grad_();
    auto opt2 = sched_optimizer(c.adam, W2, b2);
    auto sched2 = c.make(*opt2);
    opt2->load_state_dict(opt_state);
    sched2->load_state_dict(sched_state);
    EXPECT_EQ(sched2->last_epoch(), 8) << c.name;
    for (int i = 8; i < 20; ++i) {
      sched->step();
      sched2->step();
      EXPECT_EQ(lr_row(*opt2, c.adam), lr_row(*opt, c.adam)) << c.name << " step " << i + 1;
    }
  }
}

TEST(LRSchedulerState, SetsInitialLrAndResumes) {
  Tensor w = zeros({2}, {.dtype = DType::Float64}).requires_grad_();
  SGD opt({w}, {.lr = 0.4});
  expect_error([&] { StepLR(opt, 3, 0.5, /*last_epoch=*/5); },
               "param_groups[0] has no 'initial_lr', needed to resume at last_epoch 5");
  StepLR sched(opt, 3, 0.5);
  EXPECT_EQ(opt.param_groups()[0].options.get_double("initial_lr"), 0.4);
  EXPECT_EQ(sched.last_epoch(), 0);
  EXPECT_EQ(sched.base_lrs(), std::vector<double>{0.4});
  // A scheduler resumed at epoch 7 (CosineAnnealingLR's first step then uses the closed form).
  opt.param_groups()[0].options.set("lr", 0.123);
  CosineAnnealingLR cos(opt, 10, 0.0, /*last_epoch=*/6);
  EXPECT_EQ(cos.last_epoch(), 7);
  EXPECT_DOUBLE_EQ(cos.get_last_lr()[0], 0.4 * (1 + std::cos(M_PI * 7 / 10)) / 2);

  SchedulerStateDict bad = sched.state_dict();
  bad.base_lrs.push_back(1.0);
  expect_error([&] { sched.load_state_dict(bad); }, "the optimizer has 1 parameter groups");
}

TEST(LRSchedulerErrors, BadArguments) {
  Tensor w = zeros({2}, {.dtype = DType::Float64}).requires_grad_();
  SGD opt({w}, {.lr = 0.1});
  expect_error([&] { StepLR(opt, 0); }, "StepLR: step_size must be positive, got 0");
  expect_error([&] { LinearLR(opt, 0.0); }, "LinearLR: start_factor must be in (0, 1], got 0");
  expect_error([&] { LinearLR(opt, 0.5, 1.5); }, "LinearLR: end_factor must be in [0, 1], got 1.5");
  expect_error([&] { CosineAnnealingLR(opt, 0); }, "CosineAnnealingLR: T_max must be positive");
  expect_error([&] { OneCycleLR(opt, {.max_lr = {0.1}}); },
               "OneCycleLR: give total_steps, or epochs and steps_per_epoch");
  expect_error(
      [&] {
        OneCycleLR(opt, {.max_lr = {0.1, 0.2}, .total_steps = 10});
      },
      "OneCycleLR: expected 1 or 1 values for max_lr");
  expect_error([&] { OneCycleLR(opt, {.max_lr = {0.1}, .total_steps = 10, .anneal_strategy = "exp"}); },
               "anneal_strategy must be 'cos' or 'linear', got 'exp'");
  expect_error([&] { OneCycleLR(opt, {.max_lr = {0.1}, .total_steps = 10, .pct_start = 1.5}); },
               "pct_start must be in [0, 1], got 1.5");

  OneCycleLR one(opt, {.max_lr = {0.1}, .total_steps = 4});
  for (int i = 0; i < 4; ++i) one.step();
  expect_error([&] { one.step(); }, "OneCycleLR: tried to step 6 times; the specified number of total steps is 4");

  StepLR before_new_group(opt, 2);
  opt.add_param_group({{zeros({1}, {.dtype = DType::Float64}).requires_grad_()}, {}});
  expect_error([&] { before_new_group.step(); },
               "lr scheduler step: the SGD optimizer has 2 parameter groups, the scheduler was "
               "made for 1");
  opt.param_groups().pop_back();

  auto s1 = std::make_shared<StepLR>(opt, 2);
  expect_error([&] { SequentialLR(opt, {s1}, {3}); },
               "SequentialLR: expected 0 milestones (one fewer than the 1 schedulers), got 1");
  SGD other({zeros({1}, {.dtype = DType::Float64}).requires_grad_()});
  auto foreign = std::make_shared<StepLR>(other, 2);
  expect_error(
      [&] {
        SequentialLR(opt, {s1, foreign}, {3});
      },
      "SequentialLR: scheduler 1 does not act on the optimizer");
}

}  // namespace
