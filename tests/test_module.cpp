// nn::Module, containers, layers and init against PyTorch (tests/torch_golden.h): registration
// and naming, state_dict keys/shapes and repr of a nested model, load_state_dict (strict,
// non-strict, assign, messages, nothing written on failure), hooks, dtype conversion keeping
// identity, deep clone, layer outputs and gradients with the same weights, default init.
// err = ||a - b|| / ||b|| <= 1e-5 in float32.
#include <gtest/gtest.h>

#include <cmath>

#include "compare.h"
#include "torch_golden.h"
#include "tvc/autograd.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/init.h"
#include "tvc/nn/layers.h"
#include "tvc/profiler.h"

namespace tvc::test {
namespace {

using namespace tvc::nn;
using std::make_shared;

Tensor randn_of(const Shape& shape, uint64_t seed, DType dtype = DType::Float32) {
  Generator gen(seed);
  return randn(shape, {.dtype = dtype}, &gen);
}

template <typename P>
std::vector<std::string> names_of(const std::vector<std::pair<std::string, P>>& items) {
  std::vector<std::string> out;
  for (const auto& [n, v] : items) out.push_back(n);
  return out;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// Python statements that load m's state_dict into the torch module named var.
std::string py_load(const std::string& var, const Module& m) {
  std::string s = var + ".load_state_dict({";
  for (const auto& [k, t] : m.state_dict()) s += "'" + k + "': " + py_tensor(t) + ",\n";
  return s + "})\n";
}

// A module with a parameter, a persistent and a non-persistent buffer, and a None parameter.
class Custom : public Cloneable<Custom> {
 public:
  Custom() {
    register_parameter("scale", ones({3}));
    register_parameter("unused", Tensor());
    register_buffer("count", zeros({1}));
    register_buffer("cache", zeros({2}), false);
  }
  Tensor forward(const Tensor& x) override { return x * parameter("scale"); }
};

// ---------------------------------------------------------------- registration and naming

TEST(Module, RegistrationAndNaming) {
  Custom c;
  EXPECT_EQ(names_of(c.named_parameters()), (std::vector<std::string>{"scale"}));
  EXPECT_EQ(names_of(c.named_buffers()), (std::vector<std::string>{"count", "cache"}));
  EXPECT_EQ(c.state_dict().keys(), (std::vector<std::string>{"scale", "count"}));
  EXPECT_TRUE(c.parameter("scale").requires_grad());
  EXPECT_FALSE(c.parameter("unused").defined());
  // Replacing keeps the position.
  c.register_parameter("scale", full({3}, 2.0));
  c.register_parameter("extra", ones({1}));
  EXPECT_EQ(names_of(c.named_parameters()), (std::vector<std::string>{"scale", "extra"}));
  EXPECT_NE(error_of([&] { c.register_buffer("scale", ones({1})); }).find("attribute 'scale' already exists"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.register_parameter("a.b", ones({1})); }).find("can't contain \".\""), std::string::npos);
  EXPECT_NE(error_of([&] { c.register_module("", make_shared<Identity>()); }).find("can't be empty"),
            std::string::npos);
  Tensor non_leaf = ones({2}).requires_grad_() * 2.0;
  EXPECT_NE(error_of([&] { c.register_parameter("p", non_leaf); }).find("non-leaf"), std::string::npos);
  EXPECT_EQ(c.type_name(), "Custom");
  // state_dict gives detached aliases unless keep_vars; persistence can be toggled.
  EXPECT_FALSE(c.state_dict().at("scale").requires_grad());
  EXPECT_EQ(c.state_dict().at("scale").storage(), c.parameter("scale").storage());
  EXPECT_TRUE(c.state_dict("p.", true).at("p.scale").is_same(c.parameter("scale")));
  c.register_buffer("cache", zeros({2}));
  EXPECT_EQ(c.state_dict().keys(), (std::vector<std::string>{"scale", "extra", "count", "cache"}));
}

TEST(Module, NamedMembersWithSharing) {
  auto l = make_shared<Linear>(2, 3);
  auto seq = make_shared<Sequential>(std::initializer_list<ModulePtr>{l, l, make_shared<BatchNorm1d>(3)});
  EXPECT_EQ(names_of(seq->named_parameters()), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(names_of(seq->named_parameters("net", true, false)),
            (std::vector<std::string>{"net.0.weight", "net.0.bias", "net.1.weight", "net.1.bias", "net.2.weight",
                                      "net.2.bias"}));
  EXPECT_TRUE(seq->named_parameters("", false).empty());
  EXPECT_EQ(names_of(seq->named_buffers("m")),
            (std::vector<std::string>{"m.2.running_mean", "m.2.running_var", "m.2.num_batches_tracked"}));
  EXPECT_EQ(names_of(seq->named_modules()), (std::vector<std::string>{"", "0", "2"}));
  EXPECT_EQ(names_of(seq->named_modules("", false)), (std::vector<std::string>{"", "0", "1", "2"}));
  EXPECT_EQ(names_of(seq->named_children()), (std::vector<std::string>{"0", "2"}));
  EXPECT_EQ(seq->modules().size(), 3u);
  EXPECT_EQ(seq->parameters().size(), 4u);
  // state_dict lists a shared module under every name, as PyTorch.
  EXPECT_EQ(seq->state_dict().size(), 9u);
  EXPECT_TRUE(seq->modules()[0].get() == seq.get());
}

TEST(Module, Paths) {
  auto inner = make_shared<Sequential>(std::initializer_list<ModulePtr>{make_shared<Linear>(2, 2)});
  auto root = make_shared<Module>();
  root->register_module("block", inner);
  root->register_module("none", ModulePtr());
  EXPECT_EQ(root->get_submodule("block.0")->type_name(), "Linear");
  EXPECT_TRUE(root->get_parameter("block.0.weight").is_same(inner->at<Linear>(0)->weight()));
  EXPECT_EQ(error_of([&] { root->get_submodule("block.1"); }),
            "get_submodule('block.1'): Sequential at 'block' has no attribute '1'");
  EXPECT_NE(error_of([&] { root->get_submodule("none.x"); }).find("is None"), std::string::npos);
  EXPECT_NE(error_of([&] { root->get_buffer("block.0.weight"); }).find("'weight' of Linear is not a buffer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { root->get_parameter("block.0.foo"); }).find("Linear has no attribute 'foo'"),
            std::string::npos);
  root->set_submodule("block.0", make_shared<Identity>(), true);
  EXPECT_EQ(inner->at<Identity>(0)->type_name(), "Identity");
  EXPECT_NE(error_of([&] { root->set_submodule("block.5", make_shared<Identity>(), true); }).find("strict"),
            std::string::npos);
  root->set_submodule("block.extra", make_shared<ReLU>());
  EXPECT_EQ(inner->size(), 2u);
  EXPECT_EQ(root->repr(),
            "Module(\n  (block): Sequential(\n    (0): Identity()\n    (extra): ReLU()\n  )\n"
            "  (none): None\n)");
}

TEST(Module, Containers) {
  Sequential seq{make_shared<Linear>(4, 3), make_shared<ReLU>()};
  seq.push_back(make_shared<Linear>(3, 2));
  seq.insert(1, make_shared<Tanh>());
  EXPECT_EQ(seq[1]->type_name(), "Tanh");
  EXPECT_EQ(seq[-1]->type_name(), "Linear");
  EXPECT_EQ(names_of(seq.named_children()), (std::vector<std::string>{"0", "1", "2", "3"}));
  EXPECT_EQ(seq.pop(1)->type_name(), "Tanh");
  EXPECT_EQ(seq.state_dict().keys(), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_NE(error_of([&] { (void)seq[3]; }).find("Sequential[]: index 3 is out of range for 3 modules"),
            std::string::npos);
  Tensor x = randn_of({5, 4}, 1);
  Tensor want = seq.at<Linear>(2)->forward(relu(seq.at<Linear>(0)->forward(x)));
  EXPECT_LT(relative_error(seq(x), want), 1e-7);

  ModuleDict d({{"b", make_shared<Identity>()}, {"a", make_shared<ReLU>()}});
  d.insert("b", make_shared<Sigmoid>());
  EXPECT_EQ(d.keys(), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(d["b"]->type_name(), "Sigmoid");
  EXPECT_EQ(d.pop("b")->type_name(), "Sigmoid");
  EXPECT_FALSE(d.contains("b"));
  ModuleList list{make_shared<ReLU>()};
  EXPECT_EQ(error_of([&] { list(x); }), "Module [ModuleList] is missing the required \"forward\" function");
}

// ---------------------------------------------------------------- state dict and repr vs PyTorch

ModulePtr nested_model() {
  auto seq = make_shared<Sequential>(std::initializer_list<ModulePtr>{
      make_shared<Conv2d>(3, 8, 3, ConvOptions{.stride = 2, .padding = 1, .bias = false}), make_shared<BatchNorm2d>(8),
      make_shared<ReLU>(true),
      make_shared<Sequential>(std::initializer_list<ModulePtr>{
          make_shared<Conv2d>(
              8, 8, Sizes{3, 1},
              ConvOptions{.padding = "same", .dilation = 2, .groups = 4, .padding_mode = PaddingMode::Reflect}),
          make_shared<MaxPool2d>(2), make_shared<AvgPool2d>(3, AvgPool2dOptions{.stride = 1, .padding = 1}),
          make_shared<AdaptiveAvgPool2d>(Sizes{1, 1}), make_shared<Flatten>(), make_shared<Linear>(8, 4),
          make_shared<Dropout>(0.25)}),
      make_shared<ModuleDict>(std::vector<std::pair<std::string, ModulePtr>>{
          {"norm", make_shared<LayerNorm>(4, 1e-6)},
          {"act", make_shared<GELU>(GeluApproximate::Tanh)},
          {"bn", make_shared<BatchNorm1d>(4, BatchNormOptions{.eps = 1e-3, .momentum = std::nullopt})}}),
      make_shared<ModuleList>(std::initializer_list<ModulePtr>{
          make_shared<GroupNorm>(2, 4), make_shared<Identity>(),
          make_shared<Conv1d>(2, 3, 3, ConvOptions{.bias = false}), make_shared<LeakyReLU>(0.2), make_shared<SiLU>(),
          make_shared<Hardswish>(), make_shared<Hardsigmoid>(), make_shared<ReLU6>(), make_shared<Sigmoid>(),
          make_shared<Tanh>(), make_shared<Softplus>(), make_shared<Mish>(), make_shared<AdaptiveMaxPool2d>(7),
          make_shared<BatchNorm2d>(3, BatchNormOptions{.affine = false, .track_running_stats = false})})});
  return seq;
}

const char* kNestedModelPy = R"PY(
import torch.nn as nn
from collections import OrderedDict
m = nn.Sequential(
    nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False),
    nn.BatchNorm2d(8),
    nn.ReLU(inplace=True),
    nn.Sequential(
        nn.Conv2d(8, 8, (3, 1), padding='same', dilation=2, groups=4, padding_mode='reflect'),
        nn.MaxPool2d(2), nn.AvgPool2d(3, stride=1, padding=1), nn.AdaptiveAvgPool2d((1, 1)),
        nn.Flatten(), nn.Linear(8, 4), nn.Dropout(0.25)),
    nn.ModuleDict(OrderedDict([('norm', nn.LayerNorm(4, 1e-6)), ('act', nn.GELU('tanh')),
                               ('bn', nn.BatchNorm1d(4, eps=1e-3, momentum=None))])),
    nn.ModuleList([nn.GroupNorm(2, 4), nn.Identity(), nn.Conv1d(2, 3, 3, bias=False),
                   nn.LeakyReLU(0.2), nn.SiLU(), nn.Hardswish(), nn.Hardsigmoid(), nn.ReLU6(),
                   nn.Sigmoid(), nn.Tanh(), nn.Softplus(), nn.Mish(), nn.AdaptiveMaxPool2d(7),
                   nn.BatchNorm2d(3, affine=False, track_running_stats=False)]))
sd = m.state_dict()
print(json.dumps({"keys": list(sd.keys()), "shapes": [list(v.shape) for v in sd.values()],
                  "dtypes": [str(v.dtype) for v in sd.values()], "repr": str(m),
                  "params": [n for n, _ in m.named_parameters()],
                  "modules": [n for n, _ in m.named_modules()]}))
)PY";

TEST(Module, StateDictKeysAndReprMatchPyTorch) {
  nlohmann::json j = torch_json(kNestedModelPy);
  ASSERT_FALSE(j.is_null());
  ModulePtr m = nested_model();
  StateDict sd = m->state_dict();
  EXPECT_EQ(sd.keys(), j["keys"].get<std::vector<std::string>>());
  std::vector<Shape> shapes;
  std::vector<std::string> dtypes;
  for (const auto& [k, t] : sd)
    shapes.push_back(t.shape()), dtypes.push_back(std::string("torch.") + dtype_name(t.dtype()));
  EXPECT_EQ(shapes, j["shapes"].get<std::vector<Shape>>());
  EXPECT_EQ(dtypes, j["dtypes"].get<std::vector<std::string>>());
  EXPECT_EQ(names_of(m->named_parameters()), j["params"].get<std::vector<std::string>>());
  EXPECT_EQ(names_of(m->named_modules()), j["modules"].get<std::vector<std::string>>());
  EXPECT_EQ(m->repr(), j["repr"].get<std::string>());
}

TEST(Module, PyFloatRepr) {
  EXPECT_EQ(py_float_repr(1e-5), "1e-05");
  EXPECT_EQ(py_float_repr(0.1), "0.1");
  EXPECT_EQ(py_float_repr(3.0), "3.0");
  EXPECT_EQ(py_float_repr(1e16), "1e+16");
  EXPECT_EQ(py_float_repr(0.0001), "0.0001");
  EXPECT_EQ(py_float_repr(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(py_float_repr(-1.5e-7), "-1.5e-07");
  EXPECT_EQ(py_float_repr(120.5), "120.5");
  EXPECT_EQ(py_repr(Scalar(0)), "0");
}

// ---------------------------------------------------------------- load_state_dict

// A BatchNorm state saved before num_batches_tracked existed loads with the counter at 0.
TEST(Module, BatchNormLoadsStatesWithoutNumBatchesTracked) {
  nn::BatchNorm2d source(3), target(3);
  source.running_mean().fill_(0.5);
  target.num_batches_tracked().fill_(7);
  nn::StateDict sd = source.state_dict();
  sd.erase("num_batches_tracked");
  nn::IncompatibleKeys keys = target.load_state_dict(sd);
  EXPECT_TRUE(keys.missing_keys.empty());
  EXPECT_EQ(target.num_batches_tracked().item<int64_t>(), 0);
  EXPECT_EQ(target.running_mean()[1].item<double>(), 0.5);
  // Without running statistics in the dict, the key is still missing.
  nn::StateDict params;
  params.insert("weight", source.weight());
  params.insert("bias", source.bias());
  EXPECT_EQ(target.load_state_dict(params, false).missing_keys,
            (std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"}));
}

TEST(Module, LoadStateDictStrictNonStrictAssign) {
  auto make = [] {
    return make_shared<Sequential>(
        std::initializer_list<ModulePtr>{make_shared<Linear>(2, 3), make_shared<BatchNorm1d>(3)});
  };
  auto src = make(), dst = make();
  StateDict before = dst->state_dict();
  for (auto& [k, t] : before) before.insert(k, t.clone());
  StateDict sd = src->state_dict();
  sd.insert("foo", zeros({1}));
  sd.insert("0.foo", zeros({1}));
  sd.erase("1.bias");
  auto unchanged = [&] {
    for (const auto& [k, t] : dst->state_dict())
      if (relative_error(t, before.at(k)) != 0) return false;
    return true;
  };
  // The exact text of PyTorch 1.13 (shapes printed [a, b] instead of torch.Size([a, b])).
  EXPECT_EQ(error_of([&] { dst->load_state_dict(sd); }),
            "Error(s) in loading state_dict for Sequential:\n\tMissing key(s) in state_dict: \"1.bias\". \n"
            "\tUnexpected key(s) in state_dict: \"foo\", \"0.foo\". ");
  EXPECT_TRUE(unchanged());
  StateDict bad = src->state_dict();
  bad.insert("0.weight", zeros({4, 2}));
  EXPECT_EQ(error_of([&] { dst->load_state_dict(bad, false); }),
            "Error(s) in loading state_dict for Sequential:\n\tsize mismatch for 0.weight: copying a param with "
            "shape [4, 2] from checkpoint, the shape in current model is [3, 2].");
  EXPECT_TRUE(unchanged());

  IncompatibleKeys keys = dst->load_state_dict(sd, false);
  EXPECT_EQ(keys.missing_keys, (std::vector<std::string>{"1.bias"}));
  EXPECT_EQ(keys.unexpected_keys, (std::vector<std::string>{"foo", "0.foo"}));
  EXPECT_EQ(relative_error(dst->get_parameter("0.weight"), src->get_parameter("0.weight")), 0);
  EXPECT_EQ(relative_error(dst->get_parameter("1.bias"), before.at("1.bias")), 0);

  // Copy keeps the module's tensors; assign replaces them, keeping requires_grad.
  Tensor w = dst->get_parameter("0.weight");
  StateDict f64;
  for (const auto& [k, t] : src->state_dict()) f64.insert(k, is_floating(t.dtype()) ? t.to(DType::Float64) : t);
  dst->load_state_dict(f64);
  EXPECT_TRUE(dst->get_parameter("0.weight").is_same(w));
  EXPECT_EQ(w.dtype(), DType::Float32);
  dst->load_state_dict(f64, true, true);
  Tensor w2 = dst->get_parameter("0.weight");
  EXPECT_FALSE(w2.is_same(w));
  EXPECT_EQ(w2.dtype(), DType::Float64);
  EXPECT_TRUE(w2.requires_grad());
  EXPECT_EQ(w2.storage(), f64.at("0.weight").storage());
  EXPECT_TRUE(dst->get_buffer("1.running_mean").is_same(f64.at("1.running_mean")));
}

class WithExtraState : public Cloneable<WithExtraState> {
 public:
  Tensor state = tensor<double>({1, 2});
  Tensor get_extra_state() const override { return state; }
  void set_extra_state(const Tensor& s) override { state = s.clone(); }
};

TEST(Module, ExtraState) {
  auto root = make_shared<Module>();
  auto child = root->register_module("child", make_shared<WithExtraState>());
  StateDict sd = root->state_dict();
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"child._extra_state"}));
  sd.insert("child._extra_state", tensor<double>({5}));
  root->load_state_dict(sd);
  EXPECT_EQ(child->state.to_vector(), (std::vector<double>{5}));
  sd.erase("child._extra_state");
  EXPECT_NE(error_of([&] { root->load_state_dict(sd); }).find("\"child._extra_state\""), std::string::npos);
}

// ---------------------------------------------------------------- hooks

TEST(Module, ForwardHooks) {
  auto lin = make_shared<Linear>(3, 2);
  Tensor x = randn_of({4, 3}, 2);
  std::vector<std::string> order;
  auto h1 = lin->register_forward_pre_hook([&](Module&, const TensorList& args) -> std::optional<TensorList> {
    order.push_back("pre");
    return TensorList{args[0] * 2.0};
  });
  lin->register_forward_hook([&](Module&, const TensorList&, const TensorList&) -> std::optional<TensorList> {
    order.push_back("second");
    return std::nullopt;
  });
  auto h3 = lin->register_forward_hook(
      [&](Module& m, const TensorList& args, const TensorList& out) -> std::optional<TensorList> {
        order.push_back("first");
        EXPECT_EQ(&m, lin.get());
        EXPECT_LT(relative_error(args[0], x * 2.0), 1e-7);
        return TensorList{out[0] + 1.0};
      },
      true);
  Tensor y = (*lin)(x);
  EXPECT_EQ(order, (std::vector<std::string>{"pre", "first", "second"}));
  EXPECT_LT(relative_error(y, lin->forward(x * 2.0) + 1.0), 1e-7);
  h1.remove();
  h3.remove();
  EXPECT_LT(relative_error((*lin)(x), lin->forward(x)), 1e-7);

  // always_call hooks run when forward throws.
  bool ran = false;
  lin->register_forward_hook(
      [&](Module&, const TensorList&, const TensorList& out) -> std::optional<TensorList> {
        ran = true;
        EXPECT_TRUE(out.empty());
        return std::nullopt;
      },
      false, true);
  EXPECT_THROW((*lin)(randn_of({4, 5}, 3)), Error);
  EXPECT_TRUE(ran);
}

TEST(Module, FullBackwardHooks) {
  auto lin = make_shared<Linear>(3, 2);
  Tensor x = randn_of({4, 3}, 4).requires_grad_();
  Tensor g = randn_of({4, 2}, 5);
  TensorList seen_in, seen_out;
  lin->register_full_backward_pre_hook([&](Module&, const TensorList& gout) -> std::optional<TensorList> {
    return TensorList{gout[0] * 3.0};  // scales what the module (and its parameters) receive
  });
  lin->register_full_backward_hook(
      [&](Module&, const TensorList& gin, const TensorList& gout) -> std::optional<TensorList> {
        seen_in = gin, seen_out = gout;
        return TensorList{gin[0] * 0.5};
      });
  Tensor y = (*lin)(x);
  (y * g).sum().backward();
  Tensor w = lin->weight().detach();
  ASSERT_EQ(seen_out.size(), 1u);
  EXPECT_LT(relative_error(seen_out[0], g * 3.0), 1e-6);
  EXPECT_LT(relative_error(seen_in[0], matmul(g * 3.0, w)), 1e-6);
  EXPECT_LT(relative_error(x.grad(), matmul(g * 1.5, w)), 1e-6);
  EXPECT_LT(relative_error(lin->weight().grad(), matmul((g * 3.0).t(), x.detach())), 1e-6);

  // No input needs a gradient: the hook fires with grad_input = (None,).
  auto lin2 = make_shared<Linear>(3, 2);
  int calls = 0;
  lin2->register_full_backward_hook(
      [&](Module&, const TensorList& gin, const TensorList& gout) -> std::optional<TensorList> {
        ++calls;
        EXPECT_FALSE(gin[0].defined());
        EXPECT_TRUE(gout[0].defined());
        return std::nullopt;
      });
  (*lin2)(x.detach()).sum().backward();
  EXPECT_EQ(calls, 1);
}

TEST(Module, StateDictAndLoadHooks) {
  auto lin = make_shared<Linear>(2, 2);
  auto root = make_shared<Module>();
  root->register_module("fc", lin);
  std::vector<std::string> prefixes;
  lin->register_state_dict_pre_hook([&](Module&, const std::string& prefix, bool) { prefixes.push_back(prefix); });
  lin->register_state_dict_post_hook(
      [](Module&, StateDict& sd, const std::string& prefix) { sd.insert(prefix + "note", ones({1})); });
  StateDict sd = root->state_dict();
  EXPECT_EQ(prefixes, (std::vector<std::string>{"fc."}));
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"fc.weight", "fc.bias", "fc.note"}));

  // A load pre-hook renames an old key; a post-hook forgives the key it left unexpected.
  StateDict old;
  old.insert("fc.w_old", full({2, 2}, 7.0));
  old.insert("fc.bias", zeros({2}));
  lin->register_load_state_dict_pre_hook([](Module&, StateDict& d, const std::string& prefix, bool,
                                            std::vector<std::string>&, std::vector<std::string>&,
                                            std::vector<std::string>&) {
    if (const Tensor* t = d.find(prefix + "w_old")) d.insert(prefix + "weight", *t);
  });
  EXPECT_NE(error_of([&] { root->load_state_dict(old); }).find("Unexpected key(s) in state_dict: \"fc.w_old\""),
            std::string::npos);
  lin->register_load_state_dict_post_hook([](Module&, IncompatibleKeys& keys) { keys.unexpected_keys.clear(); });
  IncompatibleKeys keys = root->load_state_dict(old);
  EXPECT_TRUE(keys.unexpected_keys.empty());
  EXPECT_EQ(lin->weight().to_vector(), std::vector<double>(4, 7.0));
}

// ---------------------------------------------------------------- modes and conversions

TEST(Module, TrainEvalRequiresGradZeroGradApply) {
  ModulePtr m = nested_model();
  m->eval();
  for (auto& sub : m->modules()) EXPECT_FALSE(sub->is_training());
  m->train();
  EXPECT_TRUE(m->get_submodule("3.6")->is_training());
  m->requires_grad_(false);
  for (auto& p : m->parameters()) EXPECT_FALSE(p.requires_grad());
  m->requires_grad_();
  auto lin = make_shared<Linear>(2, 2);
  lin->forward(randn_of({3, 2}, 6)).sum().backward();
  EXPECT_TRUE(lin->weight().grad().defined());
  lin->zero_grad(false);
  EXPECT_EQ(lin->weight().grad().to_vector(), std::vector<double>(4, 0.0));
  lin->zero_grad();
  EXPECT_FALSE(lin->weight().grad().defined());
  std::vector<std::string> visited;
  m->get_submodule("4")->apply([&](Module& mod) { visited.push_back(mod.type_name()); });
  EXPECT_EQ(visited, (std::vector<std::string>{"LayerNorm", "GELU", "BatchNorm1d", "ModuleDict"}));
}

TEST(Module, ToDtypeKeepsIdentity) {
  auto seq = make_shared<Sequential>(
      std::initializer_list<ModulePtr>{make_shared<Conv2d>(2, 3, 3), make_shared<BatchNorm2d>(3)});
  Tensor w = seq->get_parameter("0.weight");
  TensorImpl* impl = w.impl();
  std::vector<double> values = w.to_vector();
  w.set_grad(ones_like(w));
  seq->to(DType::Float64);
  EXPECT_EQ(seq->get_parameter("0.weight").impl(), impl);
  EXPECT_EQ(w.dtype(), DType::Float64);
  EXPECT_EQ(w.grad().dtype(), DType::Float64);
  EXPECT_EQ(w.to_vector(), values);
  EXPECT_TRUE(w.requires_grad());
  EXPECT_EQ(seq->get_buffer("1.num_batches_tracked").dtype(), DType::Int64);
  seq->half();
  EXPECT_EQ(w.dtype(), DType::Float16);
  seq->float_();
  seq->to(MemoryFormat::ChannelsLast);
  EXPECT_TRUE(w.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_EQ(w.impl(), impl);
  EXPECT_NE(error_of([&] { seq->to(DType::Int64); }).find("only accepts floating point dtypes"), std::string::npos);
  seq->type(DType::Float64);
  EXPECT_EQ(seq->get_buffer("1.num_batches_tracked").dtype(), DType::Float64);
  seq->cpu().to_empty(Device::CPU);
  EXPECT_EQ(w.impl(), impl);
  EXPECT_EQ(w.shape(), (Shape{3, 2, 3, 3}));
  EXPECT_NE(error_of([&] { seq->to(ones({1}, {.dtype = DType::Int32})); }).find("only accepts floating point"),
            std::string::npos);
}

TEST(Module, CloneIsDeep) {
  auto shared_lin = make_shared<Linear>(3, 3);
  auto seq = make_shared<Sequential>(
      std::initializer_list<ModulePtr>{shared_lin, make_shared<ReLU>(), shared_lin, make_shared<BatchNorm1d>(3)});
  seq->eval();
  int hook_calls = 0;
  seq->register_forward_hook([&](Module&, const TensorList&, const TensorList&) -> std::optional<TensorList> {
    ++hook_calls;
    return std::nullopt;
  });
  auto copy = std::dynamic_pointer_cast<Sequential>(seq->clone());
  ASSERT_TRUE(copy);
  EXPECT_FALSE(copy->is_training());
  EXPECT_EQ((*copy)[0].get(), (*copy)[2].get());
  EXPECT_NE((*copy)[0].get(), shared_lin.get());
  Tensor cw = copy->get_parameter("0.weight");
  EXPECT_FALSE(cw.is_same(shared_lin->weight()));
  EXPECT_EQ(relative_error(cw, shared_lin->weight()), 0);
  EXPECT_TRUE(cw.requires_grad() && cw.is_leaf());
  EXPECT_EQ(copy->state_dict().keys(), seq->state_dict().keys());
  Tensor x = randn_of({2, 3}, 7);
  EXPECT_EQ(relative_error((*copy)(x), (*seq)(x)), 0);
  EXPECT_EQ(hook_calls, 2);
  {
    NoGradGuard no_grad;
    cw.fill_(0.0);
  }
  EXPECT_NE(relative_error(shared_lin->weight(), cw), 0);
  EXPECT_EQ(relative_error(copy->get_parameter("2.weight"), cw), 0);

  class NotCloneable : public Module {};
  auto bad = make_shared<Module>();
  bad->register_module("x", make_shared<NotCloneable>());
  EXPECT_NE(error_of([&] { bad->clone(); }).find("must derive from nn::Cloneable<NotCloneable>"), std::string::npos);
}

// The pattern of docs/modules.md: children and tensors reached through the registry, so that
// set_submodule and clone act on what forward uses.
class Block : public Cloneable<Block> {
 public:
  explicit Block(int64_t c) {
    register_module("conv1", make_shared<Conv2d>(c, c, 3, ConvOptions{.padding = 1, .bias = false}));
    register_module("bn1", make_shared<BatchNorm2d>(c));
    register_parameter("gamma", full({c, 1, 1}, 0.5));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = child("bn1")(child("conv1")(x));
    return x + relu(y) * parameter("gamma");
  }
};

TEST(Module, UserModuleFollowsRegistry) {
  auto model = make_shared<Sequential>(std::initializer_list<ModulePtr>{
      make_shared<Block>(4), make_shared<AdaptiveAvgPool2d>(1), make_shared<Flatten>(), make_shared<Linear>(4, 3)});
  EXPECT_EQ(model->state_dict().keys(),
            (std::vector<std::string>{"0.gamma", "0.conv1.weight", "0.bn1.weight", "0.bn1.bias", "0.bn1.running_mean",
                                      "0.bn1.running_var", "0.bn1.num_batches_tracked", "3.weight", "3.bias"}));
  model->eval();
  Tensor x = randn_of({2, 4, 5, 5}, 12);
  Tensor y = (*model)(x);
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  auto copy = model->clone();
  EXPECT_EQ(relative_error((*copy)(x), y), 0);
  // Replacing the block's conv changes the original's forward only.
  model->set_submodule("0.conv1", make_shared<Identity>());
  Tensor block_in = x;
  Tensor want = x + relu(model->get_submodule("0.bn1")->forward(x)) * 0.5;
  EXPECT_LT(relative_error(model->get_submodule("0")->forward(block_in), want), 1e-6);
  EXPECT_EQ(relative_error((*copy)(x), y), 0);
}

// ---------------------------------------------------------------- layers vs PyTorch

struct LayerCase {
  std::string py;  // the same layer in PyTorch
  ModulePtr m;
  Shape input;
  bool train = true;
};

TEST(Layers, OutputsAndGradientsMatchPyTorch) {
  manual_seed(11);
  std::vector<LayerCase> cases = {
      {"nn.Linear(5, 3)", make_shared<Linear>(5, 3), {4, 5}},
      {"nn.Linear(5, 3, bias=False)", make_shared<Linear>(5, 3, false), {2, 3, 5}},
      {"nn.ReLU()", make_shared<ReLU>(), {3, 7}},
      {"nn.ReLU6()", make_shared<ReLU6>(), {3, 7}},
      {"nn.LeakyReLU(0.2)", make_shared<LeakyReLU>(0.2), {3, 7}},
      {"nn.GELU()", make_shared<GELU>(), {3, 7}},
      {"nn.GELU('tanh')", make_shared<GELU>(GeluApproximate::Tanh), {3, 7}},
      {"nn.SiLU()", make_shared<SiLU>(), {3, 7}},
      {"nn.Sigmoid()", make_shared<Sigmoid>(), {3, 7}},
      {"nn.Hardsigmoid()", make_shared<Hardsigmoid>(), {3, 7}},
      {"nn.Hardswish()", make_shared<Hardswish>(), {3, 7}},
      {"nn.Tanh()", make_shared<Tanh>(), {3, 7}},
      {"nn.Softplus(0.5, 2.0)", make_shared<Softplus>(0.5, 2.0), {3, 7}},
      {"nn.Mish()", make_shared<Mish>(), {3, 7}},
      {"nn.Identity()", make_shared<Identity>(), {3, 7}},
      {"nn.Flatten()", make_shared<Flatten>(), {2, 3, 4}},
      {"nn.Dropout(0.3)", make_shared<Dropout>(0.3), {3, 7}, false},
      {"nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False)",
       make_shared<Conv2d>(4, 6, 3, ConvOptions{.stride = 2, .padding = 1, .bias = false}),
       {2, 4, 9, 9}},
      {"nn.Conv2d(4, 6, (2, 3), padding='same', dilation=(1, 2), groups=2)",
       make_shared<Conv2d>(4, 6, Sizes{2, 3}, ConvOptions{.padding = "same", .dilation = {1, 2}, .groups = 2}),
       {2, 4, 7, 8}},
      {"nn.Conv2d(3, 4, 3, padding=(1, 2), padding_mode='reflect')",
       make_shared<Conv2d>(3, 4, 3, ConvOptions{.padding = {1, 2}, .padding_mode = PaddingMode::Reflect}),
       {1, 3, 6, 7}},
      {"nn.Conv1d(3, 4, 3, stride=2, padding=1)",
       make_shared<Conv1d>(3, 4, 3, ConvOptions{.stride = 2, .padding = 1}),
       {2, 3, 10}},
      {"nn.BatchNorm2d(3)", make_shared<BatchNorm2d>(3), {4, 3, 5, 5}},
      {"nn.BatchNorm2d(3)", make_shared<BatchNorm2d>(3), {4, 3, 5, 5}, false},
      {"nn.BatchNorm1d(3, momentum=None)",
       make_shared<BatchNorm1d>(3, BatchNormOptions{.momentum = std::nullopt}),
       {6, 3}},
      {"nn.BatchNorm1d(3, affine=False, track_running_stats=False)",
       make_shared<BatchNorm1d>(3, BatchNormOptions{.affine = false, .track_running_stats = false}),
       {6, 3, 4}},
      {"nn.LayerNorm([3, 4])", make_shared<LayerNorm>(Shape{3, 4}), {2, 3, 4}},
      {"nn.GroupNorm(2, 4)", make_shared<GroupNorm>(2, 4), {3, 4, 5}},
      {"nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True)",
       make_shared<MaxPool2d>(3, MaxPool2dOptions{.stride = 2, .padding = 1, .ceil_mode = true}),
       {2, 3, 8, 8}},
      {"nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)",
       make_shared<AvgPool2d>(3, AvgPool2dOptions{.stride = 2, .padding = 1, .count_include_pad = false}),
       {2, 3, 8, 8}},
      {"nn.AdaptiveAvgPool2d((2, 3))", make_shared<AdaptiveAvgPool2d>(Sizes{2, 3}), {2, 3, 7, 8}},
      {"nn.AdaptiveMaxPool2d(3)", make_shared<AdaptiveMaxPool2d>(3), {2, 3, 7, 8}},
  };
  // Give the norm layers non-trivial affine parameters and running stats.
  for (auto& c : cases)
    for (auto& [name, t] : c.m->named_parameters()) init::uniform_(t, 0.5, 1.5);
  for (auto& c : cases)
    for (auto& [name, t] : c.m->named_buffers())
      if (name != "num_batches_tracked") init::uniform_(t, 0.5, 1.5);
  std::string code;
  std::vector<std::vector<Tensor>> ours;
  for (size_t i = 0; i < cases.size(); ++i) {
    LayerCase& c = cases[i];
    Tensor x = randn_of(c.input, 100 + i);
    Tensor g;
    code += "m = " + c.py + "\n" + py_load("m", *c.m);
    code += std::string("m.train(") + (c.train ? "True" : "False") + ")\n";
    code += "x = " + py_tensor(x) + ".requires_grad_()\n";
    c.m->train(c.train);
    std::vector<Tensor> r;
    // Two calls so that running statistics are updated twice; the second output is compared.
    for (int call = 0; call < 2; ++call) {
      Tensor xi = x.detach().requires_grad_();
      Tensor y = (*c.m)(xi);
      if (call == 0) {
        g = randn_of(y.shape(), 200 + i);
        code += "g = " + py_tensor(g) + "\n";
        code += "m.zero_grad()\ny = m(x)\n";
        continue;
      }
      c.m->zero_grad();
      (y * g).sum().backward();
      r.push_back(y);
      r.push_back(xi.grad());
      for (auto& p : c.m->parameters()) r.push_back(p.grad());
      for (auto& b : c.m->buffers()) r.push_back(b);
    }
    code += "x.grad = None\ny = m(x)\n(y * g).sum().backward()\n";
    code += "res.append([_t(v) for v in [y, x.grad] + [p.grad for p in m.parameters()] + list(m.buffers())])\n";
    ours.push_back(r);
  }
  nlohmann::json j = torch_json("import torch.nn as nn\nres = []\n" + code + "print(json.dumps(res))\n");
  ASSERT_EQ(j.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_EQ(j[i].size(), ours[i].size()) << cases[i].py;
    for (size_t k = 0; k < ours[i].size(); ++k) {
      Tensor want = tensor_from_json(j[i][k]);
      EXPECT_EQ(ours[i][k].shape(), want.shape()) << cases[i].py << " tensor " << k;
      EXPECT_LE(relative_error(ours[i][k], want), 1e-5) << cases[i].py << " tensor " << k;
    }
  }
}

// inplace=True activations write into their input: without autograd in one kernel pass (the same
// memory, a view's other elements untouched), with it through the recorded path; both give the
// out-of-place values, and the gradients of the out-of-place modules.
TEST(Layers, InplaceActivationsWriteIntoTheirInput) {
  const std::vector<std::pair<ModulePtr, ModulePtr>> pairs = {
      {make_shared<ReLU>(true), make_shared<ReLU>()},
      {make_shared<ReLU6>(true), make_shared<ReLU6>()},
      {make_shared<SiLU>(true), make_shared<SiLU>()},
      {make_shared<Hardsigmoid>(true), make_shared<Hardsigmoid>()},
      {make_shared<Hardswish>(true), make_shared<Hardswish>()},
  };
  for (const auto& [inplace, plain] : pairs) {
    const std::string name = plain->type_name();
    Tensor big = randn_of({6, 70000}, 3) * 4.0;  // long rows: the vector and threaded paths
    Tensor view = big.slice(0, 1, 5).slice(1, 0, 69999, 2);
    const Tensor want = (*plain)(view);  // the same strided path
    const Tensor untouched = big.select(0, 0).clone();
    {
      NoGradGuard no_grad;
      const uint64_t version = big.storage()->version();
      Tensor out = (*inplace)(view);
      EXPECT_TRUE(out.is_same(view)) << name;
      EXPECT_GT(big.storage()->version(), version) << name;
    }
    EXPECT_EQ(relative_error(view, want), 0) << name;
    EXPECT_EQ(relative_error(big.select(0, 0), untouched), 0) << name;
    Tensor dense = randn_of({3, 70001}, 6) * 4.0;  // dense: the vector kernels write into their input
    const Tensor dense_want = (*plain)(dense);
    {
      NoGradGuard no_grad;
      (*inplace)(dense);
    }
    EXPECT_EQ(relative_error(dense, dense_want), 0) << name;

    Tensor leaf = randn_of({3, 40}, 4).requires_grad_(), leaf2 = leaf.detach().clone().requires_grad_();
    Tensor g = randn_of({3, 40}, 5);
    Tensor y = (*inplace)(leaf * 3.0);
    (y * g).sum().backward();
    (((*plain)(leaf2 * 3.0)) * g).sum().backward();
    EXPECT_LT(relative_error(leaf.grad(), leaf2.grad()), 1e-7) << name;
  }
  Tensor ints = tensor<int64_t>({-2, 3});
  EXPECT_NE(error_of([&] { ints.silu_(); }).find("silu_"), std::string::npos);
}

// The kernel ops a call ran (KernelProfiler), by name.
std::vector<std::string> kernels_of(const std::function<void()>& call) {
  KernelProfiler profiler;
  call();
  std::vector<std::string> ops;
  for (const KernelRecord& r : profiler.records()) ops.push_back(r.op);
  return ops;
}
bool ran(const std::vector<std::string>& ops, const std::string& op) {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

// Conv2d, BatchNorm2d and an activation: one fused kernel in evaluation mode without autograd,
// the modules one by one (same values) whenever fusing would change what the caller sees: hooks,
// training mode (running statistics updated), autograd recording, an activation it does not fuse.
TEST(Layers, ConvNormActivationFusesOnlyWhereNothingChanges) {
  auto conv = make_shared<Conv2d>(4, 6, 3, ConvOptions{.padding = 1});
  auto bn = make_shared<BatchNorm2d>(6, BatchNormOptions{.eps = 1e-3});
  {
    NoGradGuard no_grad;
    bn->running_mean().copy_(randn_of({6}, 1));
    bn->running_var().copy_(rand({6}) + 0.5);
    bn->weight().copy_(randn_of({6}, 2));
    bn->bias().copy_(randn_of({6}, 3));
  }
  auto act = make_shared<SiLU>();
  Sequential seq({conv, bn, act});
  seq.eval();
  const Tensor x = randn_of({2, 4, 9, 7}, 4) * 2.0, residual = randn_of({2, 6, 9, 7}, 5);
  Tensor want, want_residual;
  {
    NoGradGuard no_grad;
    want = (*act)((*bn)((*conv)(x)));
    want_residual = relu((*bn)((*conv)(x)) + residual);
  }
  {
    NoGradGuard no_grad;
    Tensor y;
    std::vector<std::string> ops = kernels_of([&] { y = seq(x); });
    EXPECT_TRUE(ran(ops, "conv2d_epilogue"));
    EXPECT_FALSE(ran(ops, "conv2d") || ran(ops, "channel_affine") || ran(ops, "silu"));
    EXPECT_LE(relative_error(y, want), 1e-6);
    ReLU relu_module;
    ops = kernels_of([&] { y = conv_norm_activation(*conv, *bn, &relu_module, x, residual); });
    EXPECT_TRUE(ran(ops, "conv2d_epilogue"));
    EXPECT_LE(relative_error(y, want_residual), 1e-6);
    const Tensor x_cl = x.contiguous(MemoryFormat::ChannelsLast);
    y = seq(x_cl);
    EXPECT_EQ(y.suggest_memory_format(), MemoryFormat::ChannelsLast);
    EXPECT_LE(relative_error(y, want), 1e-6);
  }
  {  // a hook on any of the three: every module runs, the hook sees the norm's output
    NoGradGuard no_grad;
    int calls = 0;
    auto handle = bn->register_forward_hook([&](Module&, const TensorList&, const TensorList&) {
      ++calls;
      return std::optional<TensorList>();
    });
    Tensor y;
    std::vector<std::string> ops = kernels_of([&] { y = seq(x); });
    handle.remove();
    EXPECT_EQ(calls, 1);
    EXPECT_FALSE(ran(ops, "conv2d_epilogue"));
    EXPECT_EQ(relative_error(y, want), 0);
  }
  {  // autograd recording: the separate ops, with gradients
    Tensor y = seq(x);
    ASSERT_TRUE(y.requires_grad());
    y.sum().backward();
    EXPECT_TRUE(conv->weight().grad().defined());
    EXPECT_TRUE(bn->weight().grad().defined());
    EXPECT_EQ(relative_error(y.detach(), want), 0);
    seq.zero_grad();
  }
  {  // an activation it does not fuse, and no activation with a max pool after (conv2d_epilogue_max_pool2d)
    NoGradGuard no_grad;
    auto leaky = make_shared<LeakyReLU>(0.2);
    Sequential with_leaky({conv, bn, leaky}), with_pool({conv, bn, make_shared<MaxPool2d>(2)});
    with_leaky.eval(), with_pool.eval();
    Tensor y;
    std::vector<std::string> ops = kernels_of([&] { y = with_leaky(x); });
    EXPECT_FALSE(ran(ops, "conv2d_epilogue"));
    EXPECT_EQ(relative_error(y, (*leaky)((*bn)((*conv)(x)))), 0);
    ops = kernels_of([&] { y = with_pool(x); });
    EXPECT_TRUE(ran(ops, "conv2d_epilogue_max_pool2d"));
    EXPECT_LE(relative_error(y, max_pool2d((*bn)((*conv)(x)), {2, 2})), 1e-6);
  }
  {  // training mode: batch statistics, running statistics updated
    NoGradGuard no_grad;
    seq.train();
    const Tensor before = bn->running_mean().clone();
    Tensor y;
    std::vector<std::string> ops = kernels_of([&] { y = seq(x); });
    EXPECT_FALSE(ran(ops, "conv2d_epilogue"));
    EXPECT_GT(relative_error(bn->running_mean(), before), 0);
    EXPECT_EQ(bn->num_batches_tracked().item<int64_t>(), 1);
  }
}

// The fused path keeps its folded batch norm (scale and shift) between calls: the second call
// gives the first one's bits, and after any change to what it was folded from (an in-place
// write to the running statistics, the norm's weight or bias or the convolution's bias, eps, a
// replaced parameter) the next call folds again, matching the modules one by one; with keeping
// off (set_keep_derived_data) it folds on every call.
TEST(Layers, ConvNormActivationFoldsAgainAfterAnyChange) {
  auto conv = make_shared<Conv2d>(3, 5, 3, ConvOptions{.padding = 1, .bias = true});
  auto bn = make_shared<BatchNorm2d>(5);
  auto act = make_shared<ReLU6>();
  NoGradGuard no_grad;
  bn->running_mean().copy_(randn_of({5}, 11));
  bn->running_var().copy_(rand({5}) + 0.5);
  bn->weight().copy_(randn_of({5}, 12));
  bn->bias().copy_(randn_of({5}, 13));
  Sequential seq({conv, bn, act});
  seq.eval();
  const Tensor x = randn_of({2, 3, 6, 7}, 14) * 3.0;
  auto check = [&](const std::string& after) {
    const Tensor want = (*act)((*bn)((*conv)(x)));
    Tensor y;
    EXPECT_TRUE(ran(kernels_of([&] { y = seq(x); }), "conv2d_epilogue")) << after;
    EXPECT_LE(relative_error(y, want), 1e-6) << after;
    EXPECT_EQ(relative_error(seq(x), y), 0) << after << ": the kept fold";
  };
  check("the first call");
  bn->weight().mul_(scalar_like(-2.0, DType::Float32));
  check("the norm's weight times -2");
  bn->bias().add_(scalar_like(1.5, DType::Float32));
  check("the norm's bias plus 1.5");
  bn->running_mean().copy_(randn_of({5}, 15));
  check("a new running mean");
  bn->running_var().mul_(scalar_like(4.0, DType::Float32));
  check("the running variance times 4");
  conv->bias().sub_(scalar_like(0.75, DType::Float32));
  check("the convolution's bias minus 0.75");
  bn->eps = 0.5;
  check("eps 0.5");
  bn->register_parameter("weight", randn_of({5}, 16));
  check("a replaced weight");
  set_keep_derived_data(false);
  bn->bias().add_(scalar_like(1.0, DType::Float32));
  check("keeping off");
  set_keep_derived_data(true);
}

// concat_norm_activation keeps its batch norm's scale between calls likewise: the second call
// gives the first one's bits, and after a change to the running variance, the weight (in place or
// replaced) or eps the next call makes it again, matching the modules one by one.
TEST(Layers, ConcatNormActivationMakesItsScaleAgainAfterAnyChange) {
  auto bn = make_shared<BatchNorm2d>(7);
  auto act = make_shared<ReLU>();
  NoGradGuard no_grad;
  bn->running_mean().copy_(randn_of({7}, 21));
  bn->running_var().copy_(rand({7}) + 0.5);
  bn->weight().copy_(randn_of({7}, 22));
  bn->bias().copy_(randn_of({7}, 23));
  bn->eval();
  const std::vector<Tensor> inputs{randn_of({2, 3, 5, 4}, 24), randn_of({2, 4, 5, 4}, 25)};
  auto check = [&](const std::string& after) {
    const Tensor want = (*act)((*bn)(cat(inputs, 1)));
    Tensor y;
    EXPECT_TRUE(ran(kernels_of([&] { y = concat_norm_activation(*bn, act.get(), inputs); }), "channel_affine"))
        << after;
    EXPECT_EQ(relative_error(y, want), 0) << after;
    EXPECT_EQ(relative_error(concat_norm_activation(*bn, act.get(), inputs), y), 0) << after << ": the kept scale";
  };
  check("the first call");
  bn->weight().mul_(scalar_like(-2.0, DType::Float32));
  check("the norm's weight times -2");
  bn->running_var().mul_(scalar_like(4.0, DType::Float32));
  check("the running variance times 4");
  bn->eps = 0.5;
  check("eps 0.5");
  bn->register_parameter("weight", randn_of({7}, 26));
  check("a replaced weight");
  set_keep_derived_data(false);
  bn->running_var().add_(scalar_like(1.0, DType::Float32));
  check("keeping off");
  set_keep_derived_data(true);
}

// BatchNorm2d in training mode followed by a ReLU, through conv_norm_activation and
// concat_norm_activation (DenseNet's layers, ResNet's stems): batch_norm_relu's fused pass and
// gradient (no relu or clamp_backward kernel), the modules one by one's output, running statistics
// and gradients bit for bit; a hook on the ReLU or a residual before it: the modules one by one.
TEST(Layers, NormActivationInTrainingFusesTheRelu) {
  auto bits = [](const Tensor& t) { return t.to(DType::Float64).to_vector(); };
  for (bool concat : {false, true}) {
    const std::string where = concat ? "concat_norm_activation" : "conv_norm_activation";
    auto make = [] {
      auto conv = make_shared<Conv2d>(3, 5, 3, ConvOptions{.padding = 1, .bias = false});
      auto bn = make_shared<BatchNorm2d>(5);
      {
        NoGradGuard no_grad;
        conv->weight().copy_(randn_of({5, 3, 3, 3}, 1));
        bn->weight().copy_(randn_of({5}, 2));
        bn->bias().copy_(randn_of({5}, 3));
      }
      return std::make_pair(conv, bn);
    };
    // (Pairs, not structured bindings, which clang 14's lambdas cannot capture.)
    const auto a = make(), b = make();
    Conv2d &conv_a = *a.first, &conv_b = *b.first;
    BatchNorm2d &bn_a = *a.second, &bn_b = *b.second;
    ReLU relu_a(true), relu_b(true);
    const Tensor x = randn_of({2, 3, 9, 7}, 4), g = randn_of({2, 5, 9, 7}, 5);
    auto through = [&](Conv2d& conv, BatchNorm2d& bn, ReLU& relu_module, bool helper) {
      if (!helper) return relu_module(bn(conv(x)));
      if (!concat) return conv_norm_activation(conv, bn, &relu_module, x);
      const Tensor z = conv(x);
      return concat_norm_activation(bn, &relu_module, {z.narrow(1, 0, 2), z.narrow(1, 2, 3)});
    };
    Tensor fused;
    const std::vector<std::string> ops = kernels_of([&] {
      fused = through(conv_a, bn_a, relu_a, true);
      fused.backward(g);
    });
    EXPECT_FALSE(ran(ops, "relu") || ran(ops, "clamp_backward")) << where;
    EXPECT_TRUE(ran(ops, "batch_norm_backward")) << where;
    const Tensor separate = through(conv_b, bn_b, relu_b, false);
    separate.backward(g);
    EXPECT_EQ(bits(fused), bits(separate)) << where;
    EXPECT_EQ(bits(conv_a.weight().grad()), bits(conv_b.weight().grad())) << where;
    EXPECT_EQ(bits(bn_a.weight().grad()), bits(bn_b.weight().grad())) << where;
    EXPECT_EQ(bits(bn_a.bias().grad()), bits(bn_b.bias().grad())) << where;
    EXPECT_EQ(bits(bn_a.running_mean()), bits(bn_b.running_mean())) << where;
    EXPECT_EQ(bits(bn_a.running_var()), bits(bn_b.running_var())) << where;
    EXPECT_EQ(bn_a.num_batches_tracked().item<int64_t>(), 1) << where;
    // A hook on the ReLU: the modules one by one.
    int calls = 0;
    auto handle = relu_a.register_forward_hook([&](Module&, const TensorList&, const TensorList&) {
      ++calls;
      return std::optional<TensorList>();
    });
    EXPECT_TRUE(ran(kernels_of([&] { through(conv_a, bn_a, relu_a, true); }), "relu")) << where;
    handle.remove();
    EXPECT_EQ(calls, 1) << where;
  }
  // A residual before the activation: batch norm, the addition, then the ReLU.
  auto conv = make_shared<Conv2d>(3, 5, 1);
  auto bn = make_shared<BatchNorm2d>(5);
  ReLU relu_module;
  const Tensor x = randn_of({2, 3, 4, 4}, 6);
  EXPECT_TRUE(ran(kernels_of([&] {
                    conv_norm_activation(*conv, *bn, &relu_module, x, randn_of({2, 5, 4, 4}, 7));
                  }),
                  "relu"));
}

// BatchNorm2d and ReLU over a concatenation (DenseNet's pre-activation): in evaluation mode
// without autograd one channel_affine kernel per input writing its channels of the result, the
// separate cat, batch norm and relu values bit for bit (float32 and float64, NaNs included);
// the modules one by one with a hook, in training mode, or with an input requiring grad.
TEST(Layers, ConcatNormActivationFusesOnlyWhereNothingChanges) {
  auto same_bits = [](const Tensor& a, const Tensor& b) {
    const std::vector<double> u = a.to_vector(), v = b.to_vector();
    if (a.shape() != b.shape()) return false;
    for (size_t i = 0; i < u.size(); ++i)
      if (!(u[i] == v[i] && std::signbit(u[i]) == std::signbit(v[i])) && !(std::isnan(u[i]) && std::isnan(v[i])))
        return false;
    return true;
  };
  for (DType dt : {DType::Float32, DType::Float64}) {
    auto bn = make_shared<BatchNorm2d>(9, BatchNormOptions{.eps = 1e-3});
    {
      NoGradGuard no_grad;
      bn->running_mean().copy_(randn_of({9}, 1));
      bn->running_var().copy_(rand({9}) + 0.5);
      bn->weight().copy_(randn_of({9}, 2));
      bn->bias().copy_(randn_of({9}, 3));
    }
    bn->to(dt);
    bn->eval();
    auto relu_module = make_shared<ReLU>(true);
    std::vector<Tensor> inputs = {randn_of({2, 4, 5, 3}, 4, dt), randn_of({2, 3, 5, 3}, 5, dt),
                                  randn_of({2, 2, 5, 3}, 6, dt)};
    {
      NoGradGuard no_grad;
      inputs[1].select(0, 1).select(0, 2).select(0, 4).fill_(std::nan(""));
    }
    NoGradGuard no_grad;
    const Tensor want = relu((*bn)(cat(inputs, 1))), want_plain = (*bn)(cat(inputs, 1));
    Tensor y;
    std::vector<std::string> ops = kernels_of([&] { y = concat_norm_activation(*bn, relu_module.get(), inputs); });
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "channel_affine"), 3) << dtype_name(dt);
    EXPECT_FALSE(ran(ops, "copy") || ran(ops, "cat") || ran(ops, "relu")) << dtype_name(dt);
    EXPECT_TRUE(same_bits(y, want)) << dtype_name(dt);
    EXPECT_TRUE(same_bits(concat_norm_activation(*bn, nullptr, inputs), want_plain)) << dtype_name(dt);
    // A hook on the ReLU: the modules one by one, the hook sees the ReLU's output.
    int calls = 0;
    auto handle = relu_module->register_forward_hook([&](Module&, const TensorList&, const TensorList&) {
      ++calls;
      return std::optional<TensorList>();
    });
    ops = kernels_of([&] { y = concat_norm_activation(*bn, relu_module.get(), inputs); });
    handle.remove();
    EXPECT_EQ(calls, 1);
    EXPECT_TRUE(ran(ops, "relu"));
    EXPECT_TRUE(same_bits(y, want)) << dtype_name(dt);
    // Training mode: batch statistics, running statistics updated, as the modules do.
    bn->train();
    ops = kernels_of([&] { y = concat_norm_activation(*bn, relu_module.get(), inputs); });
    EXPECT_TRUE(ran(ops, "batch_norm_stats"));
    bn->eval();
  }
  // A float32 norm over float64 inputs: not fused (the kernel takes its operands in one dtype),
  // the modules' own result, which takes the norm's parameters in float64: that of the same norm
  // converted to float64.
  {
    NoGradGuard no_grad;
    auto bn32 = make_shared<BatchNorm2d>(5);
    bn32->weight().copy_(randn_of({5}, 11));
    bn32->bias().copy_(randn_of({5}, 12));
    bn32->running_mean().copy_(randn_of({5}, 13));
    bn32->running_var().copy_(randn_of({5}, 14).abs() + 0.5);
    bn32->eval();
    const std::vector<Tensor> wide = {randn_of({1, 2, 3, 3}, 9, DType::Float64),
                                      randn_of({1, 3, 3, 3}, 10, DType::Float64)};
    Tensor y;
    std::vector<std::string> ops = kernels_of([&] { y = concat_norm_activation(*bn32, nullptr, wide); });
    EXPECT_TRUE(ran(ops, "cat") || ran(ops, "copy"));
    auto bn64 = make_shared<BatchNorm2d>(5);
    bn64->load_state_dict(bn32->state_dict());
    bn64->to(DType::Float64);
    bn64->eval();
    EXPECT_EQ(y.dtype(), DType::Float64);
    EXPECT_TRUE(same_bits(y, (*bn64)(cat(wide, 1))));
    bn32->train();
    bn64->train();
    EXPECT_TRUE(same_bits((*bn32)(cat(wide, 1)), (*bn64)(cat(wide, 1))));
  }
  // An input requiring grad: the separate ops, with gradients.
  auto bn = make_shared<BatchNorm2d>(5);
  bn->eval();
  ReLU relu_module;
  const Tensor a = randn_of({1, 2, 3, 3}, 7).requires_grad_(), b = randn_of({1, 3, 3, 3}, 8);
  Tensor y = concat_norm_activation(*bn, &relu_module, {a, b});
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  EXPECT_TRUE(a.grad().defined());
}

// KernelProfiler: one record per kernel on the profiling thread, with the innermost module being
// called, the path the kernel says it took, its output shape and a time; the innermost of nested
// profilers records; nothing is recorded without one.
TEST(Profiler, RecordsKernelsWithTheirModuleAndPath) {
  auto conv = make_shared<Conv2d>(3, 4, 3), pointwise = make_shared<Conv2d>(4, 5, 1);
  Sequential seq({conv, pointwise});
  NoGradGuard no_grad;
  const Tensor x = randn_of({1, 3, 8, 8}, 1);
  KernelProfiler outer;
  Tensor y = relu(x);
  {
    KernelProfiler inner;
    seq(x);
    ASSERT_EQ(inner.records().size(), 2u);
    const KernelRecord& a = inner.records()[0];
    const KernelRecord& b = inner.records()[1];
    EXPECT_EQ(a.op, "conv2d");
    EXPECT_EQ(a.path, "im2col+gemm");
    EXPECT_EQ(a.module, conv.get());
    EXPECT_EQ(a.shape, (Shape{1, 4, 6, 6}));
    EXPECT_GE(a.seconds, 0);
    EXPECT_EQ(b.path, "pointwise gemm");
    EXPECT_EQ(b.module, pointwise.get());
  }
  ASSERT_EQ(outer.records().size(), 1u);  // relu only: the inner profiler took the convolutions
  EXPECT_EQ(outer.records()[0].module, nullptr);
  EXPECT_EQ(outer.records()[0].path, "");
  outer.clear();
  EXPECT_TRUE(outer.records().empty());
}

TEST(Layers, InplaceActivationsAndDropout) {
  Tensor leaf = randn_of({3, 4}, 8).requires_grad_();
  Tensor x = leaf * 1.0;
  Tensor y = ReLU(true).forward(x);
  EXPECT_TRUE(y.is_same(x));
  Tensor g = randn_of({3, 4}, 9);
  (y * g).sum().backward();
  EXPECT_LT(relative_error(leaf.grad(), g * (leaf > 0.0).to(DType::Float32)), 1e-7);
  EXPECT_NE(error_of([&] { SiLU(true).forward(leaf); }).find("leaf"), std::string::npos);

  Dropout drop(0.5);
  Tensor ones_in = ones({1000});
  Tensor d = drop(ones_in);
  double kept = sum((d > 0.0).to(DType::Float64)).item_double();
  EXPECT_GT(kept, 400);
  EXPECT_LT(kept, 600);
  EXPECT_EQ(amax(d).item_double(), 2.0);
  drop.eval();
  EXPECT_TRUE(drop(ones_in).is_same(ones_in));
  EXPECT_NE(error_of([] { Dropout(1.5); }).find("between 0 and 1, but got 1.5"), std::string::npos);
  EXPECT_NE(error_of([] {
              BatchNorm2d(3).forward(ones({3, 4}));
            }).find("expected 4D input (got 2D input"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              Conv2d(3, 4, 3, ConvOptions{.stride = 2, .padding = "same"});
            }).find("padding='same' is not supported for strided convolutions"),
            std::string::npos);
}

// ---------------------------------------------------------------- init

// mean, standard deviation, min and max of t.
std::array<double, 4> stats(const Tensor& t) {
  Tensor d = t.detach().to(DType::Float64);
  return {mean(d).item_double(), std::sqrt(var(d, {}, 0).item_double()), min(d).item_double(), max(d).item_double()};
}

TEST(Init, DefaultLayerInitialisation) {
  manual_seed(3);
  Linear lin(50, 400);
  double bound = 1 / std::sqrt(50.0);
  auto [m, s, lo, hi] = stats(lin.weight());
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_GT(hi, 0.99 * bound);
  EXPECT_NEAR(s, bound / std::sqrt(3.0), 0.02 * bound);  // U(-b, b) has std b/sqrt(3)
  EXPECT_NEAR(m, 0, 0.02 * bound);
  auto bs = stats(lin.bias());
  EXPECT_GE(bs[2], -bound);
  EXPECT_LE(bs[3], bound);
  Conv2d conv(8, 16, 3, ConvOptions{.groups = 2});
  double cb = 1 / std::sqrt(4.0 * 9);
  auto cs = stats(conv.weight());
  EXPECT_LE(std::max(-cs[2], cs[3]), cb);
  EXPECT_GT(std::max(-cs[2], cs[3]), 0.95 * cb);
  BatchNorm2d bn(5);
  EXPECT_EQ(bn.weight().to_vector(), std::vector<double>(5, 1.0));
  EXPECT_EQ(bn.bias().to_vector(), std::vector<double>(5, 0.0));
  EXPECT_EQ(bn.running_var().to_vector(), std::vector<double>(5, 1.0));
  EXPECT_EQ(bn.num_batches_tracked().dtype(), DType::Int64);
}

TEST(Init, InitialisersFollowPyTorchRules) {
  EXPECT_DOUBLE_EQ(init::calculate_gain(Nonlinearity::Relu), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(init::calculate_gain(Nonlinearity::Tanh), 5.0 / 3);
  EXPECT_DOUBLE_EQ(init::calculate_gain(Nonlinearity::LeakyRelu, 0.2), std::sqrt(2.0 / 1.04));
  EXPECT_DOUBLE_EQ(init::calculate_gain(Nonlinearity::Conv2d), 1.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain(parse_mode<Nonlinearity>("leaky_relu")), std::sqrt(2.0 / 1.0001));
  EXPECT_EQ(error_of([] { parse_mode<Nonlinearity>("cube"); }),
            "nonlinearity: 'cube' is not one of 'linear', 'conv1d', 'conv2d', 'conv3d', 'conv_transpose1d', "
            "'conv_transpose2d', 'conv_transpose3d', 'sigmoid', 'tanh', 'relu', 'leaky_relu', 'selu'");
  EXPECT_EQ(error_of([] { parse_mode<Reduction>("meen\x1b[2J"); }),
            "reduction: 'meen\\x1b[2J' is not one of 'none', 'mean', 'sum'");
  EXPECT_STREQ(to_string(PaddingMode::Circular), "circular");
  EXPECT_EQ(parse_mode<PadMode>(to_string(PadMode::Replicate)), PadMode::Replicate);
  Tensor w = empty({64, 32, 3, 3});
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(w), (std::pair<int64_t, int64_t>{288, 576}));
  EXPECT_NE(error_of([] { init::calculate_fan_in_and_fan_out(empty({3})); }).find("fewer than 2 dimensions"),
            std::string::npos);
  EXPECT_EQ(error_of([] { parse_mode<FanMode>("fan_avg"); }), "mode: 'fan_avg' is not one of 'fan_in', 'fan_out'");
  Generator gen(5);
  init::kaiming_normal_(w, 0, FanMode::FanOut, Nonlinearity::Relu, &gen);
  EXPECT_NEAR(stats(w)[1], std::sqrt(2.0 / 576), 0.03 * std::sqrt(2.0 / 576));
  init::xavier_uniform_(w, 2.0, &gen);
  double xb = 2.0 * std::sqrt(6.0 / (288 + 576));
  EXPECT_LE(std::max(-stats(w)[2], stats(w)[3]), xb * (1 + 1e-6));
  EXPECT_NEAR(stats(w)[1], xb / std::sqrt(3.0), 0.02 * xb);
  init::xavier_normal_(w, 1.0, &gen);
  EXPECT_NEAR(stats(w)[1], std::sqrt(2.0 / 864), 0.03 * std::sqrt(2.0 / 864));
  // N(0,1) truncated to [-2, 2] has std 0.8796; the draws stay within the bounds.
  Tensor t = empty({200000}, {.dtype = DType::Float64});
  init::trunc_normal_(t, 0, 1, -2, 2, &gen);
  auto ts = stats(t);
  EXPECT_NEAR(ts[0], 0, 0.01);
  EXPECT_NEAR(ts[1], 0.87963, 0.008);
  EXPECT_GE(ts[2], -2);
  EXPECT_LE(ts[3], 2);
  // Wide bounds: a standard normal; P(x < 1) = 0.841345.
  init::trunc_normal_(t, 1.0, 2.0, -30, 30, &gen);
  double below = mean(lt(t, scalar_like(3.0, DType::Float64)).to(DType::Float64)).item_double();
  EXPECT_NEAR(below, 0.841345, 0.005);
  EXPECT_NEAR(stats(t)[1], 2.0, 0.02);
  init::constant_(t, 0.25);
  EXPECT_EQ(stats(t)[2], 0.25);
  Tensor p = ones({3}).requires_grad_();
  init::zeros_(p);
  EXPECT_EQ(p.to_vector(), std::vector<double>(3, 0.0));
}

}  // namespace
}  // namespace tvc::test
