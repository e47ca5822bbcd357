// Direct checks of the trickiest shape and loss ops against PyTorch: interpolate (every mode,
// align_corners, antialias, size vs scale_factor), pad (every mode, negative pads), cross_entropy
// (weights, ignore_index, label smoothing, dense targets), the other losses, and their errors.
// Each case compares the forward result and the gradient of sum(out * R) w.r.t. the input x,
// err = ||a - b|| / ||b||: <= 1e-5 in float32 and <= 1e-10 in float64.
#include <gtest/gtest.h>

#include <functional>
#include <sstream>

#include "compare.h"
#include "torch_golden.h"
#include "tvc/autograd.h"
#include "tvc/ops.h"

namespace tvc::test {
namespace {

struct Case {
  std::string name;
  Shape x_shape;  // the differentiated input x
  std::function<Tensor(const Tensor& x, const Tensor& t)> fn;
  std::string torch;    // Python expression over x (and t)
  Tensor t = Tensor();  // optional second input (targets), passed as is
};

std::string fmt_double(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// Runs every case with tvc and with PyTorch in dtype and compares output and input gradient.
void check_against_torch(const std::vector<Case>& cases, DType dtype) {
  double tol = dtype == DType::Float32 ? 1e-5 : 1e-10;
  std::ostringstream py;
  py << "import torch.nn.functional as F\nres = []\n";
  struct Ours {
    Tensor out, grad;
  };
  std::vector<Ours> ours;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    Generator gen(1000 + i);
    Tensor x = randn(c.x_shape, {.dtype = DType::Float64}, &gen).to(dtype);
    x.requires_grad_(true);
    Tensor out = c.fn(x, c.t);
    Generator rgen(5000 + i);
    Tensor r = randn(out.shape(), {.dtype = DType::Float64}, &rgen).to(dtype);
    Tensor g = grad({sum(mul(out, r))}, {x}, {}, false, true)[0];
    if (!g.defined()) g = zeros_like(x);
    ours.push_back({out, g});
    py << "x = " << py_tensor(x.detach()) << ".requires_grad_()\n";
    if (c.t.defined()) py << "t = " << py_tensor(c.t) << "\n";
    py << "out = " << c.torch << "\n";
    py << "(out * " << py_tensor(r) << ").sum().backward()\n";
    py << "res += [out, x.grad if x.grad is not None else torch.zeros_like(x)]\n";
  }
  py << "print(json_tensors(res))\n";
  nlohmann::json j = torch_json(py.str());
  ASSERT_TRUE(j.is_array()) << "no PyTorch result";
  ASSERT_EQ(j.size(), 2 * cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string name = cases[i].name + " (" + dtype_name(dtype) + ")";
    Tensor ref_out = tensor_from_json(j[2 * i]), ref_grad = tensor_from_json(j[2 * i + 1]);
    EXPECT_EQ(ours[i].out.shape(), ref_out.shape()) << name;
    EXPECT_LE(relative_error(ours[i].out, ref_out), tol) << name << ": forward";
    EXPECT_LE(relative_error(ours[i].grad, ref_grad), tol) << name << ": gradient";
  }
}

void check_both(const std::vector<Case>& cases) {
  check_against_torch(cases, DType::Float32);
  check_against_torch(cases, DType::Float64);
}

// ---------------------------------------------------------------- interpolate

std::vector<Case> interpolate_cases() {
  std::vector<Case> cases;
  const Shape in{2, 3, 7, 9};
  struct Target {
    std::optional<std::array<int64_t, 2>> size;
    std::optional<std::array<double, 2>> scale;
  };
  std::vector<Target> targets = {
      {std::array<int64_t, 2>{13, 20}, std::nullopt},    // up
      {std::array<int64_t, 2>{3, 4}, std::nullopt},      // down
      {std::array<int64_t, 2>{7, 5}, std::nullopt},      // one axis unchanged
      {std::array<int64_t, 2>{1, 1}, std::nullopt},      // to one pixel
      {std::nullopt, std::array<double, 2>{1.7, 2.0}},   // scale_factor up (scale != in/out)
      {std::nullopt, std::array<double, 2>{0.6, 0.45}},  // scale_factor down
      {std::nullopt, std::array<double, 2>{1.1, 0.5}},   // floor(7 * 1.1) = 7: same size, other scale
  };
  struct Mode {
    std::string mode;
    bool align_corners, antialias;
  };
  std::vector<Mode> modes = {{"nearest", false, false}, {"bilinear", false, false}, {"bilinear", true, false},
                             {"bicubic", false, false}, {"bicubic", true, false},   {"bilinear", false, true},
                             {"bicubic", false, true},  {"bilinear", true, true},   {"bicubic", true, true}};
  for (const Mode& m : modes) {
    for (const Target& tg : targets) {
      // PyTorch 1.13's NCHW nearest forward maps an unchanged axis with the given scale
      // (floor(dst / 1.1)) but its backward copies it straight, so its gradient is not the
      // adjoint of its forward there; ours is. Nothing to compare against for that one case.
      if (m.mode == "nearest" && tg.scale && (*tg.scale)[0] == 1.1) continue;
      std::ostringstream name, expr;
      name << "interpolate " << m.mode << " align_corners=" << m.align_corners << " antialias=" << m.antialias;
      expr << "F.interpolate(x, ";
      if (tg.size) {
        name << " size " << (*tg.size)[0] << "x" << (*tg.size)[1];
        expr << "size=(" << (*tg.size)[0] << ", " << (*tg.size)[1] << ")";
      } else {
        name << " scale " << (*tg.scale)[0] << "x" << (*tg.scale)[1];
        expr << "scale_factor=(" << fmt_double((*tg.scale)[0]) << ", " << fmt_double((*tg.scale)[1]) << ")";
      }
      expr << ", mode='" << m.mode << "'";
      if (m.mode != "nearest") expr << ", align_corners=" << (m.align_corners ? "True" : "False");
      if (m.antialias) expr << ", antialias=True";
      expr << ")";
      cases.push_back({name.str(), in,
                       [m, tg](const Tensor& x, const Tensor&) {
                         return interpolate(x, tg.size, tg.scale, parse_mode<InterpolateMode>(m.mode), m.align_corners,
                                            m.antialias);
                       },
                       expr.str()});
    }
  }
  cases.push_back({"interpolate bicubic channels-last", in,
                   [](const Tensor& x, const Tensor&) {
                     return interpolate(x.contiguous(MemoryFormat::ChannelsLast), std::array<int64_t, 2>{5, 11},
                                        std::nullopt, InterpolateMode::Bicubic);
                   },
                   "F.interpolate(x.contiguous(memory_format=torch.channels_last), size=(5, 11), mode='bicubic')"});
  return cases;
}

TEST(ShapeOps, InterpolateMatchesPyTorch) { check_both(interpolate_cases()); }

TEST(ShapeOps, InterpolateKeepsChannelsLast) {
  Tensor x = randn({1, 3, 4, 5}).contiguous(MemoryFormat::ChannelsLast);
  Tensor y = interpolate(x, std::array<int64_t, 2>{6, 7}, std::nullopt, InterpolateMode::Bilinear);
  EXPECT_EQ(y.suggest_memory_format(), MemoryFormat::ChannelsLast);
}

TEST(ShapeOps, InterpolateRejectsBadArguments) {
  Tensor x = randn({1, 2, 4, 4});
  EXPECT_THROW(interpolate(randn({2, 4, 4}), std::array<int64_t, 2>{2, 2}), Error);
  EXPECT_THROW(interpolate(x, std::nullopt, std::nullopt), Error);
  EXPECT_THROW(interpolate(x, std::array<int64_t, 2>{0, 2}), Error);
  EXPECT_THROW(interpolate(x, std::array<int64_t, 2>{2, 2}, std::nullopt, InterpolateMode::Nearest, true), Error);
  EXPECT_THROW(parse_mode<InterpolateMode>("area"), Error);
}

// ---------------------------------------------------------------- pad, roll, cat

TEST(ShapeOps, PadMatchesPyTorch) {
  std::vector<Case> cases;
  struct P {
    std::vector<int64_t> pads;
    std::string mode;
    Shape shape;
  };
  std::vector<P> ps = {
      {{2, 3, 1, 2}, "reflect", {2, 3, 5, 6}},
      {{-1, 2, 3, -2}, "reflect", {2, 3, 5, 6}},
      {{4, 0}, "reflect", {3, 5}},
      {{2, 3, 1, 2}, "circular", {2, 3, 5, 6}},
      {{-1, 2, 2, -1}, "circular", {2, 3, 5, 6}},
      {{5, 5}, "circular", {2, 3, 5}},
      {{2, 3, 1, 2}, "replicate", {2, 3, 5, 6}},
      {{-2, 1, 4, -1}, "replicate", {1, 5, 6}},
      {{1, 2, 0, 1, 2, 0}, "reflect", {1, 2, 3, 4, 5}},
      {{1, 2, 3, 4}, "constant", {2, 3, 5, 6}},
      {{-1, 2, 0, -3, 1, 1}, "constant", {2, 3, 5, 6}},
      {{-3, -2}, "constant", {4, 6}},
  };
  for (const P& p : ps) {
    std::ostringstream name, expr;
    name << "pad " << p.mode << " " << shape_str(p.pads) << " of " << shape_str(p.shape);
    expr << "F.pad(x, [";
    for (size_t i = 0; i < p.pads.size(); ++i) expr << (i ? ", " : "") << p.pads[i];
    expr << "], mode='" << p.mode << "'" << (p.mode == "constant" ? ", value=0.75" : "") << ")";
    double value = p.mode == "constant" ? 0.75 : 0.0;
    cases.push_back(
        {name.str(), p.shape,
         [p, value](const Tensor& x, const Tensor&) { return pad(x, p.pads, parse_mode<PadMode>(p.mode), value); },
         expr.str()});
  }
  cases.push_back({"pad reflect non-contiguous",
                   {3, 4, 5},
                   [](const Tensor& x, const Tensor&) {
                     return pad(x.transpose(1, 2), {2, 1}, PadMode::Reflect);
                   },
                   "F.pad(x.transpose(1, 2), [2, 1], mode='reflect')"});
  cases.push_back({"roll two dims",
                   {3, 4, 5},
                   [](const Tensor& x, const Tensor&) {
                     return roll(x, {2, -7}, {0, 2});
                   },
                   "torch.roll(x, [2, -7], [0, 2])"});
  cases.push_back({"roll flattened",
                   {3, 4, 5},
                   [](const Tensor& x, const Tensor&) { return roll(x.transpose(0, 2), {13}, {}); },
                   "torch.roll(x.transpose(0, 2), 13)"});
  check_both(cases);
}

TEST(ShapeOps, PadRejectsBadArguments) {
  Tensor x = randn({1, 2, 3, 4});
  EXPECT_THROW(pad(x, {1, 2, 3}), Error);                            // odd length
  EXPECT_THROW(pad(x, {4, 0}, PadMode::Reflect), Error);             // reflect pad >= size
  EXPECT_THROW(pad(x, {5, 0}, PadMode::Circular), Error);            // wraps more than once
  EXPECT_THROW(pad(x, {1, 1}, PadMode::Reflect), Error);             // 4-d input needs 2 or 3 pairs
  EXPECT_THROW(pad(x, {1, 1, 1, 1}, PadMode::Reflect, 1.0), Error);  // value with a non-constant mode
  EXPECT_THROW(pad(x, {-3, -2}), Error);                             // negative size
  EXPECT_THROW(parse_mode<PadMode>("wrap"), Error);
}

TEST(ShapeOps, CatStackSplitChunk) {
  Tensor a = randn({2, 3}), b = randn({2, 5}, {.dtype = DType::Float64});
  Tensor c = cat({a, b, empty({0})}, 1);
  EXPECT_EQ(c.shape(), Shape({2, 8}));
  EXPECT_EQ(c.dtype(), DType::Float64);  // promoted as torch.cat
  EXPECT_EQ(relative_error(c.narrow(1, 3, 5), b), 0.0);
  EXPECT_THROW(cat({a, randn({3, 3})}, 1), Error);
  EXPECT_THROW(cat({}, 0), Error);
  EXPECT_THROW(stack({a, b}), Error);
  EXPECT_EQ(stack({a, a, a}, -1).shape(), Shape({2, 3, 3}));
  // torch.chunk: pieces of ceil(n / chunks), so 6 rows in 4 chunks give 3 pieces of 2.
  EXPECT_EQ(chunk(randn({6, 2}), 4).size(), 3u);
  EXPECT_EQ(chunk(randn({0, 2}), 3).size(), 3u);
  auto pieces = split(randn({7}), 3);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[2].shape(), Shape({1}));
  EXPECT_THROW(split(randn({7}), std::vector<int64_t>{3, 3}), Error);
}

// ---------------------------------------------------------------- losses

Tensor int64_tensor(const std::vector<int64_t>& v, const Shape& shape) { return tensor<int64_t>(v, shape); }

TEST(ShapeOps, LossesMatchPyTorch) {
  std::vector<Case> cases;
  // (N,K) = (6,5) with two ignored targets; (N,K,d) = (3,4,5).
  Tensor t2 = int64_tensor({0, 4, -100, 2, 3, -100}, {6});
  Tensor t3 = int64_tensor({0, 1, 2, 3, 3, 7, 0, 1, 1, 2, 2, 2, 0, 7, 3}, {3, 5});
  std::vector<double> w5 = {0.5, 2.0, 1.5, 0.25, 1.0}, w4 = {1.5, 0.5, 2.0, 0.75};
  Tensor weight5 = tensor<double>(w5), weight4 = tensor<double>(w4);
  std::string pw5 = "torch.tensor([0.5, 2.0, 1.5, 0.25, 1.0], dtype=x.dtype)";
  std::string pw4 = "torch.tensor([1.5, 0.5, 2.0, 0.75], dtype=x.dtype)";
  for (std::string red : {"mean", "sum", "none"}) {
    for (double ls : {0.0, 0.2}) {
      std::string sls = fmt_double(ls);
      cases.push_back({"cross_entropy weight ignore " + red + " ls " + sls,
                       {6, 5},
                       [=](const Tensor& x, const Tensor& t) {
                         return cross_entropy(x, t, weight5.to(x.dtype()), -100, parse_mode<Reduction>(red), ls);
                       },
                       "F.cross_entropy(x, t, weight=" + pw5 + ", ignore_index=-100, reduction='" + red +
                           "', label_smoothing=" + sls + ")",
                       t2});
      cases.push_back({"cross_entropy (N,K,d) weight ignore 7 " + red + " ls " + sls,
                       {3, 4, 5},
                       [=](const Tensor& x, const Tensor& t) {
                         return cross_entropy(x, t, weight4.to(x.dtype()), 7, parse_mode<Reduction>(red), ls);
                       },
                       "F.cross_entropy(x, t, weight=" + pw4 + ", ignore_index=7, reduction='" + red +
                           "', label_smoothing=" + sls + ")",
                       t3});
      cases.push_back({"cross_entropy no weight " + red + " ls " + sls,
                       {6, 5},
                       [=](const Tensor& x, const Tensor& t) {
                         return cross_entropy(x, t, Tensor(), -100, parse_mode<Reduction>(red), ls);
                       },
                       "F.cross_entropy(x, t, reduction='" + red + "', label_smoothing=" + sls + ")",
                       t2});
      cases.push_back(
          {"cross_entropy probabilities " + red + " ls " + sls,
           {6, 5},
           [=](const Tensor& x, const Tensor&) {
             Tensor p = softmax(mul(arange(30, {.dtype = x.dtype()}).reshape({6, 5}), scalar_like(0.1, x.dtype())), 1);
             return cross_entropy(x, p, weight5.to(x.dtype()), -100, parse_mode<Reduction>(red), ls);
           },
           "F.cross_entropy(x, torch.softmax(torch.arange(30, dtype=x.dtype).reshape(6, 5) * 0.1, 1), "
           "weight=" +
               pw5 + ", reduction='" + red + "', label_smoothing=" + sls + ")"});
    }
    cases.push_back({"nll_loss weight ignore " + red,
                     {6, 5},
                     [=](const Tensor& x, const Tensor& t) {
                       return nll_loss(x, t, weight5.to(x.dtype()), -100, parse_mode<Reduction>(red));
                     },
                     "F.nll_loss(x, t, weight=" + pw5 + ", reduction='" + red + "')",
                     t2});
    cases.push_back({"mse_loss " + red,
                     {4, 7},
                     [=](const Tensor& x, const Tensor&) {
                       return mse_loss(
                           x, mul(arange(28, {.dtype = x.dtype()}).reshape({4, 7}), scalar_like(0.1, x.dtype())),
                           parse_mode<Reduction>(red));
                     },
                     "F.mse_loss(x, torch.arange(28, dtype=x.dtype).reshape(4, 7) * 0.1, reduction='" + red + "')"});
    cases.push_back(
        {"bce_with_logits weight pos_weight " + red,
         {4, 5},
         [=](const Tensor& x, const Tensor&) {
           Tensor xs = mul(x, scalar_like(30, x.dtype()));  // large logits: checks stability
           Tensor target = div(arange(20, {.dtype = x.dtype()}).reshape({4, 5}), scalar_like(19, x.dtype()));
           Tensor weight = tensor<double>({0.5, 1.0, 1.5, 2.0}, Shape{4, 1}).to(x.dtype());
           return binary_cross_entropy_with_logits(xs, target, weight, parse_mode<Reduction>(red),
                                                   weight5.to(x.dtype()));
         },
         "F.binary_cross_entropy_with_logits(x * 30, torch.arange(20, dtype=x.dtype).reshape(4, 5) / 19, "
         "weight=torch.tensor([[0.5], [1.0], [1.5], [2.0]], dtype=x.dtype), reduction='" +
             red + "', pos_weight=" + pw5 + ")"});
  }
  check_both(cases);
}

TEST(ShapeOps, LossesRejectBadTargets) {
  Tensor x = randn({4, 3});
  EXPECT_THROW(cross_entropy(x, int64_tensor({0, 1, 3, 2}, {4})), Error);             // class 3 of 3
  EXPECT_THROW(cross_entropy(x, int64_tensor({0, 1, -1, 2}, {4})), Error);            // negative, not ignored
  EXPECT_THROW(cross_entropy(x, tensor<int32_t>({0, 1, 1, 2})), Error);               // not int64
  EXPECT_THROW(cross_entropy(x, int64_tensor({0, 1, 1}, {3})), Error);                // shape
  EXPECT_THROW(cross_entropy(x, int64_tensor({0, 1, 1, 2}, {4}), ones({4})), Error);  // weight (K)
  EXPECT_THROW(parse_mode<Reduction>("avg"), Error);
  EXPECT_THROW(cross_entropy(x, softmax(randn({4, 3}), 1), Tensor(), 2), Error);  // ignore_index, probabilities
  EXPECT_THROW(binary_cross_entropy_with_logits(x, randn({4})), Error);
  try {
    cross_entropy(x, int64_tensor({0, 1, 5, 2}, {4}));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("cross_entropy"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 3]"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace tvc::test
