// Op table rows: elementwise ops, reductions and creation ops.
#include <cmath>

#include "op_table.h"

namespace tvc::test {
namespace {

using In = const std::vector<Tensor>&;

OpRow unary(Op op, std::function<Tensor(const Tensor&)> f, std::string torch,
            std::function<Tensor(const Shape&, uint64_t)> make = nullptr, bool grad = true) {
  return OpRow{op, [make] { return unary_samples(make); }, [f](In x) { return f(x[0]); }, std::move(torch),
               grad ? std::vector<int>{0} : std::vector<int>{}};
}

OpRow binary(Op op, std::function<Tensor(const Tensor&, const Tensor&)> f, std::string torch, bool grad = true,
             std::function<Tensor(const Shape&, uint64_t)> make_a = nullptr,
             std::function<Tensor(const Shape&, uint64_t)> make_b = nullptr) {
  return OpRow{op, [make_a, make_b] { return binary_samples(make_a, make_b); }, [f](In x) { return f(x[0], x[1]); },
               std::move(torch), grad ? std::vector<int>{0, 1} : std::vector<int>{}};
}

Tensor positive(const Shape& s, uint64_t seed) { return sample_uniform(s, 0.5, 2.5, seed); }
// Values away from the kinks of piecewise ops (|x| >= 0.05), spread over [-4, 4].
Tensor spread(const Shape& s, uint64_t seed) {
  Tensor u = sample_uniform(s, 0.05, 4.0, seed);
  Tensor sign = sub(mul(gt(sample_uniform(s, 0, 1, seed + 7), scalar_like(0.5, DType::Float64)).to(DType::Float64),
                        scalar_like(2, DType::Float64)),
                    scalar_like(1, DType::Float64));
  return mul(u, sign);
}
// Integer-valued float samples for comparisons (so equal elements occur).
Tensor small_ints(const Shape& s, uint64_t seed) {
  Generator gen(seed);
  return randint(-2, 3, s, {.dtype = DType::Int64}, &gen).to(DType::Float64);
}

std::vector<OpSample> where_samples() {
  std::vector<OpSample> out;
  for (const OpSample& s : binary_samples()) {
    Shape shape = broadcast_shapes(s.inputs[0].shape(), s.inputs[1].shape(), "where");
    Tensor cond = gt(sample_randn(shape, 77 + shape.size()), scalar_like(0, DType::Float64));
    out.push_back({s.label, {cond, s.inputs[0], s.inputs[1]}});
  }
  return out;
}

// Reduction samples: one input and a list of dims (encoded in the label's case).
struct ReduceCase {
  std::string label;
  Shape shape;
  Shape dims;
  bool keepdim;
  bool non_contiguous = false;
  bool channels_last = false;
};

const std::vector<ReduceCase>& reduce_cases() {
  static const std::vector<ReduceCase> cases = {
      {"all of 1-d 17", {17}, {}, false},
      {"all of 2-d", {3, 5}, {}, false},
      {"dim 0", {4, 5}, {0}, false},
      {"dim 1 keepdim", {4, 5}, {1}, true},
      {"dim -1 of 3-d", {2, 3, 7}, {-1}, false},
      {"dims 0,2 of 3-d", {3, 4, 5}, {0, 2}, false},
      {"dims 0,1 of 3-d (a bias's gradient)", {3, 4, 5}, {0, 1}, false},
      {"dims 0,1 of 600 columns (two column blocks)", {2, 3, 600}, {0, 1}, false},
      {"dims 0,2,3 keepdim (batch norm)", {2, 3, 4, 5}, {0, 2, 3}, true},
      {"non-contiguous dim 1", {6, 5}, {1}, false, true},
      {"channels-last dims 2,3", {2, 3, 4, 5}, {2, 3}, true, false, true},
      {"size-1 dim", {3, 1, 4}, {1}, false},
      {"0-d", {}, {}, false},
  };
  return cases;
}

std::vector<OpSample> reduce_samples(const std::vector<ReduceCase>& cases) {
  std::vector<OpSample> out;
  for (size_t i = 0; i < cases.size(); ++i) {
    Tensor t = sample_randn(cases[i].shape, 500 + i);
    if (cases[i].non_contiguous) t = non_contiguous(t);
    if (cases[i].channels_last) t = t.contiguous(MemoryFormat::ChannelsLast);
    out.push_back({cases[i].label, {t}});
  }
  return out;
}

std::string py_dims(const Shape& dims) {
  if (dims.empty()) return "";
  std::string s = "(";
  for (int64_t d : dims) s += std::to_string(d) + ",";
  return s + ")";
}

}  // namespace

std::vector<OpRow> elementwise_rows() {
  std::vector<OpRow> rows = {
      unary(
          Op::neg, [](const Tensor& x) { return neg(x); }, "torch.neg(a)"),
      unary(
          Op::abs, [](const Tensor& x) { return abs(x); }, "torch.abs(a)", spread),
      unary(
          Op::sign, [](const Tensor& x) { return sign(x); }, "torch.sign(a)", spread),
      unary(
          Op::exp, [](const Tensor& x) { return exp(x); }, "torch.exp(a)"),
      unary(
          Op::log, [](const Tensor& x) { return log(x); }, "torch.log(a)", positive),
      unary(
          Op::sqrt, [](const Tensor& x) { return sqrt(x); }, "torch.sqrt(a)", positive),
      unary(
          Op::rsqrt, [](const Tensor& x) { return rsqrt(x); }, "torch.rsqrt(a)", positive),
      unary(
          Op::erf, [](const Tensor& x) { return erf(x); }, "torch.erf(a)"),
      unary(
          Op::relu, [](const Tensor& x) { return relu(x); }, "torch.relu(a)", spread),
      unary(
          Op::relu6, [](const Tensor& x) { return relu6(x); }, "F.relu6(a)",
          [](const Shape& s, uint64_t seed) { return mul(spread(s, seed), scalar_like(2.2, DType::Float64)); }),
      unary(
          Op::leaky_relu, [](const Tensor& x) { return leaky_relu(x, 0.07); }, "F.leaky_relu(a, 0.07)", spread),
      unary(
          Op::gelu, [](const Tensor& x) { return gelu(x); }, "F.gelu(a)"),
      unary(
          Op::gelu, [](const Tensor& x) { return gelu(x, GeluApproximate::Tanh); }, "F.gelu(a, approximate='tanh')"),
      unary(
          Op::silu, [](const Tensor& x) { return silu(x); }, "F.silu(a)"),
      unary(
          Op::sigmoid, [](const Tensor& x) { return sigmoid(x); }, "torch.sigmoid(a)"),
      unary(
          Op::hardsigmoid, [](const Tensor& x) { return hardsigmoid(x); }, "F.hardsigmoid(a)", spread),
      unary(
          Op::hardswish, [](const Tensor& x) { return hardswish(x); }, "F.hardswish(a)", spread),
      unary(
          Op::tanh, [](const Tensor& x) { return tanh(x); }, "torch.tanh(a)"),
      unary(
          Op::softplus, [](const Tensor& x) { return softplus(x); }, "F.softplus(a)"),
      unary(
          Op::softplus, [](const Tensor& x) { return softplus(x, 2.0, 3.0); }, "F.softplus(a, 2.0, 3.0)", spread),
      unary(
          Op::mish, [](const Tensor& x) { return mish(x); }, "F.mish(a)"),
      unary(
          Op::clamp, [](const Tensor& x) { return clamp(x, -0.5, 0.7); }, "torch.clamp(a, -0.5, 0.7)", spread),
      unary(
          Op::clamp, [](const Tensor& x) { return clamp(x, std::nullopt, 0.3); }, "torch.clamp(a, max=0.3)", spread),
      unary(
          Op::pow_scalar, [](const Tensor& x) { return pow(x, 2); }, "torch.pow(a, 2)"),
      unary(
          Op::pow_scalar, [](const Tensor& x) { return pow(x, 2.5); }, "torch.pow(a, 2.5)", positive),
      unary(
          Op::pow_scalar, [](const Tensor& x) { return pow(x, -1.5); }, "torch.pow(a, -1.5)", positive),
      binary(
          Op::add, [](const Tensor& a, const Tensor& b) { return add(a, b); }, "torch.add(a, b)"),
      binary(
          Op::add, [](const Tensor& a, const Tensor& b) { return add(a, b, 0.5); }, "torch.add(a, b, alpha=0.5)"),
      binary(
          Op::sub, [](const Tensor& a, const Tensor& b) { return sub(a, b); }, "torch.sub(a, b)"),
      binary(
          Op::mul, [](const Tensor& a, const Tensor& b) { return mul(a, b); }, "torch.mul(a, b)"),
      binary(
          Op::div, [](const Tensor& a, const Tensor& b) { return div(a, b); }, "torch.div(a, b)", true, nullptr,
          spread),
      binary(
          Op::pow, [](const Tensor& a, const Tensor& b) { return pow(a, b); }, "torch.pow(a, b)", true, positive),
      binary(
          Op::maximum, [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, "torch.maximum(a, b)"),
      binary(
          Op::minimum, [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, "torch.minimum(a, b)"),
      binary(
          Op::eq, [](const Tensor& a, const Tensor& b) { return eq(a, b); }, "torch.eq(a, b)", false, small_ints),
      binary(
          Op::ne, [](const Tensor& a, const Tensor& b) { return ne(a, b); }, "torch.ne(a, b)", false, small_ints),
      binary(
          Op::lt, [](const Tensor& a, const Tensor& b) { return lt(a, b); }, "torch.lt(a, b)", false, small_ints),
      binary(
          Op::le, [](const Tensor& a, const Tensor& b) { return le(a, b); }, "torch.le(a, b)", false, small_ints),
      binary(
          Op::gt, [](const Tensor& a, const Tensor& b) { return gt(a, b); }, "torch.gt(a, b)", false, small_ints),
      binary(
          Op::ge, [](const Tensor& a, const Tensor& b) { return ge(a, b); }, "torch.ge(a, b)", false, small_ints),
      OpRow{Op::where, where_samples, [](In x) { return where(x[0], x[1], x[2]); }, "torch.where(a, b, c)", {1, 2}},
      OpRow{Op::masked_fill,
            [] {
              std::vector<OpSample> out;
              for (const OpSample& s : unary_samples())
                out.push_back(
                    {s.label,
                     {s.inputs[0], gt(sample_randn(s.inputs[0].shape(), 9), scalar_like(0.3, DType::Float64))}});
              return out;
            },
            [](In x) { return masked_fill(x[0], x[1], -2.5); },
            "a.masked_fill(b, -2.5)",
            {0}},
      binary(
          Op::lerp, [](const Tensor& a, const Tensor& b) { return lerp(a, b, 0.3); }, "torch.lerp(a, b, 0.3)"),
      binary(
          Op::lerp, [](const Tensor& a, const Tensor& b) { return lerp(a, b, 0.75); }, "torch.lerp(a, b, 0.75)"),
      OpRow{Op::lerp,
            [] {
              std::vector<OpSample> out;
              for (const OpSample& s : unary_samples())
                out.push_back({s.label, {s.inputs[0], sample_randn(s.inputs[0].shape(), 31 + s.inputs[0].numel())}});
              return out;
            },
            [](In x) {
              // Two pairs in one call, each weight form once: 0.2 < 0.5 <= 0.8.
              std::vector<Tensor> selves{x[0].clone(), x[1].clone()};
              foreach_lerp_(selves, {x[1], x[0]}, 0.2);
              Tensor first = selves[0].clone();
              foreach_lerp_(selves, {x[1], x[0]}, 0.8);
              return add(first, mul(selves[1], scalar_like(2.0, selves[1].dtype())));
            },
            "torch.lerp(a, b, 0.2) + 2 * torch.lerp(torch.lerp(b, a, 0.2), a, 0.8)",
            {},
            1e-5,
            "foreach_lerp_, the in-place multi-tensor form (no autograd; gradients checked by the lerp rows)"},
      OpRow{Op::sgd_momentum,
            [] {
              std::vector<OpSample> out;
              for (const OpSample& s : unary_samples()) {
                const Shape& shape = s.inputs[0].shape();
                out.push_back({s.label,
                               {s.inputs[0], sample_randn(shape, 41 + s.inputs[0].numel()),
                                sample_randn(shape, 43 + s.inputs[0].numel())}});
              }
              return out;
            },
            [](In x) {
              // Two triples in one call, then a damped call: param a, gradient b, buffer c.
              std::vector<Tensor> params{x[0].contiguous().clone(), x[2].contiguous().clone()};
              std::vector<Tensor> buffers{x[2].contiguous().clone(), x[0].contiguous().clone()};
              const std::vector<Tensor> grads{x[1].contiguous().clone(), x[1].contiguous().clone()};
              foreach_sgd_momentum_(params, grads, buffers, 0.1, 0.9, 0);
              foreach_sgd_momentum_({params[1]}, {grads[1]}, {buffers[1]}, 0.5, 0.8, 0.25);
              const Tensor two = scalar_like(2.0, params[0].dtype());
              return add(add(params[0], mul(buffers[0], two)), mul(add(params[1], mul(buffers[1], two)), two));
            },
            "(a - 0.1 * (0.9 * c + b)) + 2 * (0.9 * c + b)"
            " + 2 * ((c - 0.1 * (0.9 * a + b) - 0.5 * (0.8 * (0.9 * a + b) + 0.75 * b))"
            " + 2 * (0.8 * (0.9 * a + b) + 0.75 * b))",
            {},
            1e-5,
            "foreach_sgd_momentum_, SGD's step with momentum over several parameters (no autograd)"},
  };
  return rows;
}

std::vector<OpRow> reduction_rows() {
  // One row per reduction and case, so each PyTorch expression carries its dims.
  std::vector<OpRow> rows;
  struct Spec {
    Op op;
    std::function<Tensor(const Tensor&, const Shape&, bool)> f;
    std::string torch;  // with {dims} and {keepdim} filled per case
    bool grad = true;
  };
  std::vector<Spec> specs = {
      {Op::sum, [](const Tensor& x, const Shape& d, bool k) { return sum(x, d, k); }, "torch.sum(a{dims}{keepdim})"},
      {Op::mean, [](const Tensor& x, const Shape& d, bool k) { return mean(x, d, k); }, "torch.mean(a{dims}{keepdim})"},
      {Op::var, [](const Tensor& x, const Shape& d, bool k) { return var(x, d, 1, k); }, "torch.var(a{dims}{keepdim})"},
      {Op::var, [](const Tensor& x, const Shape& d, bool k) { return var(x, d, 0, k); },
       "torch.var(a{dims}, unbiased=False{keepdim})"},
      {Op::std, [](const Tensor& x, const Shape& d, bool k) { return tvc::std(x, d, 1, k); },
       "torch.std(a{dims}{keepdim})"},
      {Op::amax, [](const Tensor& x, const Shape& d, bool k) { return amax(x, d, k); }, "torch.amax(a{dims}{keepdim})"},
      {Op::amin, [](const Tensor& x, const Shape& d, bool k) { return amin(x, d, k); }, "torch.amin(a{dims}{keepdim})"},
  };
  for (const Spec& spec : specs) {
    for (const ReduceCase& c : reduce_cases()) {
      if (spec.op == Op::var || spec.op == Op::std) {
        int64_t n = 1;
        for (int64_t d : c.dims) n *= c.shape[d < 0 ? d + c.shape.size() : d];
        if (c.dims.empty()) n = shape_numel(c.shape);
        if (n < 2) continue;  // unbiased estimate needs 2 elements
      }
      std::string dims, keep;
      if (!c.dims.empty()) dims = ", dim=" + py_dims(c.dims);
      if (c.keepdim) keep = ", keepdim=True";
      std::string expr = spec.torch;
      expr.replace(expr.find("{dims}"), 6, dims);
      expr.replace(expr.find("{keepdim}"), 9, keep);
      if (c.dims.empty() && (spec.op == Op::amax || spec.op == Op::amin) && !c.shape.empty()) {
        Shape all;
        for (size_t d = 0; d < c.shape.size(); ++d) all.push_back(static_cast<int64_t>(d));
        expr =
            spec.op == Op::amax ? "torch.amax(a, dim=" + py_dims(all) + ")" : "torch.amin(a, dim=" + py_dims(all) + ")";
      }
      ReduceCase cc = c;
      auto f = spec.f;
      rows.push_back(OpRow{spec.op,
                           [cc] {
                             std::vector<ReduceCase> one{cc};
                             return reduce_samples(one);
                           },
                           [f, cc](In x) { return f(x[0], cc.dims, cc.keepdim); }, expr,
                           spec.grad ? std::vector<int>{0} : std::vector<int>{}});
      rows.back().note = c.label;
    }
  }
  auto with_dim = [](const Shape& shape) {
    return [shape] {
      return std::vector<OpSample>{{"3-d", {sample_randn(shape, 901)}},
                                   {"non-contiguous", {non_contiguous(sample_randn(shape, 902))}}};
    };
  };
  rows.push_back(
      OpRow{Op::max, with_dim({3, 4, 5}), [](In x) { return max(x[0], 1, false).first; }, "torch.max(a, 1)[0]", {0}});
  rows.push_back(OpRow{Op::max, with_dim({3, 4, 5}), [](In x) { return max(x[0]); }, "torch.max(a)", {0}});
  rows.push_back(OpRow{Op::min,
                       with_dim({3, 4, 5}),
                       [](In x) { return min(x[0], -1, true).first; },
                       "torch.min(a, -1, keepdim=True)[0]",
                       {0}});
  rows.push_back(OpRow{Op::min, with_dim({3, 4, 5}), [](In x) { return min(x[0]); }, "torch.min(a)", {0}});
  rows.push_back(
      OpRow{Op::argmax, with_dim({3, 4, 5}), [](In x) { return argmax(x[0], 2); }, "torch.argmax(a, 2)", {}});
  rows.push_back(OpRow{Op::argmax, with_dim({3, 4, 5}), [](In x) { return argmax(x[0]); }, "torch.argmax(a)", {}});
  rows.push_back(OpRow{Op::argmin,
                       with_dim({3, 4, 5}),
                       [](In x) { return argmin(x[0], 0, true); },
                       "torch.argmin(a, 0, keepdim=True)",
                       {}});
  rows.push_back(
      OpRow{Op::topk, with_dim({3, 4, 17}), [](In x) { return topk(x[0], 5).first; }, "torch.topk(a, 5)[0]", {0}});
  rows.push_back(OpRow{Op::topk,
                       with_dim({3, 4, 17}),
                       [](In x) { return topk(x[0], 2, 1, false).first; },
                       "torch.topk(a, 2, 1, largest=False)[0]",
                       {0}});
  rows.push_back(OpRow{
      Op::topk, with_dim({3, 4, 17}), [](In x) { return topk(x[0], 3, 2).second; }, "torch.topk(a, 3, 2)[1]", {}});
  return rows;
}

std::vector<OpRow> creation_rows() {
  auto none = [] { return std::vector<OpSample>{{"no inputs", {}}}; };
  auto one = [] { return unary_samples(); };
  std::vector<OpRow> rows = {
      OpRow{Op::copy, one, [](In x) { return x[0].clone(MemoryFormat::Contiguous); }, "a.clone()", {0}},
      OpRow{Op::copy,
            one,
            [](In x) { return x[0].to(DType::Float16).to(x[0].dtype()); },
            "a.to(torch.float16).to(a.dtype)",
            {},
            1e-3,
            "float16 rounding: relative error up to 2^-11"},
      OpRow{Op::copy,
            one,
            [](In x) { return x[0].to(DType::BFloat16).to(x[0].dtype()); },
            "a.to(torch.bfloat16).to(a.dtype)",
            {},
            4e-3,
            "bfloat16 rounding: relative error up to 2^-8"},
      OpRow{Op::fill,
            none,
            [](In) {
              return full({3, 17}, 2.5);
            },
            "torch.full((3, 17), 2.5)",
            {}},
      OpRow{Op::arange,
            none,
            [](In) { return arange(-3, 7.5, 0.5, {.dtype = DType::Float32}); },
            "torch.arange(-3, 7.5, 0.5)",
            {}},
      OpRow{Op::arange, none, [](In) { return arange(17); }, "torch.arange(17)", {}},
      OpRow{Op::linspace, none, [](In) { return linspace(-2, 3, 17); }, "torch.linspace(-2, 3, 17)", {}},
      OpRow{Op::linspace, none, [](In) { return linspace(0, 1, 1); }, "torch.linspace(0, 1, 1)", {}},
      OpRow{Op::uniform,
            none,
            [](In) {
              return rand({4, 17});
            },
            "torch.rand(4, 17)",
            {},
            1e-5,
            "generators differ from PyTorch: shape only; statistics in test_random.cpp",
            true},
      OpRow{Op::normal,
            none,
            [](In) {
              return randn({4, 17});
            },
            "torch.randn(4, 17)",
            {},
            1e-5,
            "generators differ from PyTorch: shape only; statistics in test_random.cpp",
            true},
      OpRow{Op::randint,
            none,
            [](In) {
              return randint(-3, 9, {4, 17});
            },
            "torch.randint(-3, 9, (4, 17))",
            {},
            1e-5,
            "generators differ from PyTorch: shape only; statistics in test_random.cpp",
            true},
      OpRow{Op::bernoulli,
            one,
            [](In x) { return bernoulli(sigmoid(x[0])); },
            "torch.bernoulli(torch.sigmoid(a))",
            {},
            1e-5,
            "generators differ from PyTorch: shape only; statistics in test_random.cpp",
            true},
  };
  return rows;
}

}  // namespace tvc::test
