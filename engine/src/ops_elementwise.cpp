// Elementwise ops: arithmetic, comparisons, unary math, activations, their in-place forms, and
// their backward rules. Shapes broadcast as in PyTorch; the result is channels-last when an
// input is (detail::result_format).
#include <cmath>
#include <limits>

#include "internal.h"

namespace tvc {

using autograd::GradList;
using autograd::SavedTensor;

// ---------------------------------------------------------------- helpers

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    TVC_CHECK(x == y || x == 1 || y == 1, op, ": shapes ", a, " and ", b, " cannot be broadcast together");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

Tensor sum_to(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  int64_t lead = t.dim() - static_cast<int64_t>(shape.size());
  Shape dims;
  for (int64_t i = 0; i < t.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && t.shape()[i] != 1)) dims.push_back(i);
  Tensor r = dims.empty() ? t : sum(t, dims, true);
  return r.reshape(shape);
}

Tensor scalar_like(Scalar value, DType dtype) {
  Tensor t = empty({}, {.dtype = dtype});
  FillParams p{.a = value.to_double()};
  if (value.kind() != Scalar::Kind::Float) p.integer = value.to_int();
  detail::run(Op::fill, {}, {t}, &p);
  return t;
}

namespace {
int category(DType d) { return d == DType::Bool ? 0 : is_floating(d) ? 2 : 1; }
}  // namespace

DType result_type(const Tensor& a, const Tensor& b) {
  bool a0 = a.dim() == 0, b0 = b.dim() == 0;
  if (a0 == b0) return promote_types(a.dtype(), b.dtype());
  const Tensor& dimmed = a0 ? b : a;
  const Tensor& zero_d = a0 ? a : b;
  int cd = category(dimmed.dtype()), cz = category(zero_d.dtype());
  if (cz <= cd) return dimmed.dtype();
  return cz == 2 ? DType::Float32 : DType::Int64;
}

DType result_type(const Tensor& a, Scalar b) {
  int cs = b.kind() == Scalar::Kind::Float ? 2 : b.kind() == Scalar::Kind::Int ? 1 : 0;
  int ca = category(a.dtype());
  if (cs <= ca) return a.dtype();
  return cs == 2 ? DType::Float32 : DType::Int64;
}

namespace {

Tensor as_tensor(Scalar s, const Tensor& like) { return scalar_like(s, result_type(like, s)); }

// Runs op's kernel on a and b broadcast and converted to compute, into a new out_dtype tensor.
Tensor binary_forward(Op op, const Tensor& a, const Tensor& b, DType compute, DType out_dtype) {
  NoGradGuard no_grad;
  TVC_CHECK(a.defined() && b.defined(), op_name(op), ": undefined input tensor");
  Shape shape = broadcast_shapes(a.shape(), b.shape(), op_name(op));
  Tensor out = detail::empty_with_format(shape, out_dtype, detail::result_format({a, b}));
  detail::run(op, {a.to(compute).expand(shape), b.to(compute).expand(shape)}, {out});
  return out;
}

Tensor unary_forward(Op op, const Tensor& t, DType dtype, const UnaryParams* params = nullptr) {
  NoGradGuard no_grad;
  TVC_CHECK(t.defined(), op_name(op), ": undefined input tensor");
  Tensor out = empty_like(t.to(dtype));
  detail::run(op, {t.to(dtype)}, {out}, params);
  return out;
}

// Floating dtype for ops that produce floats from any input (exp of an int tensor is float32).
DType float_dtype(const Tensor& t) { return is_floating(t.dtype()) ? t.dtype() : DType::Float32; }

// Records a unary op's backward: fn(grad, saved input, saved output) -> grad input.
Tensor record_unary(const char* name, const Tensor& in, Tensor out,
                    std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)> fn) {
  if (!autograd::any_requires_grad({in})) return out;
  SavedTensor sin(in), sout(out);
  std::string nm = name;
  autograd::record(name, {in}, {out}, [sin, sout, fn, nm](const GradList& g) -> GradList {
    return {fn(g[0], sin.unpack(nm), sout.unpack(nm))};
  });
  return out;
}

}  // namespace

// ---------------------------------------------------------------- binary arithmetic

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (alpha.to_double() != 1) return add(a, mul(b, as_tensor(alpha, b)));
  DType dt = result_type(a, b);
  Tensor out = binary_forward(Op::add, a, b, dt, dt);
  Shape sa = a.shape(), sb = b.shape();
  autograd::record("AddBackward0", {a, b}, {out}, [sa, sb](const GradList& g) -> GradList {
    return {sum_to(g[0], sa), sum_to(g[0], sb)};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (alpha.to_double() != 1) return sub(a, mul(b, as_tensor(alpha, b)));
  DType dt = result_type(a, b);
  TVC_CHECK(dt != DType::Bool, "sub: subtraction of bool tensors is not supported; use logical ops");
  Tensor out = binary_forward(Op::sub, a, b, dt, dt);
  Shape sa = a.shape(), sb = b.shape();
  autograd::record("SubBackward0", {a, b}, {out}, [sa, sb](const GradList& g) -> GradList {
    return {sum_to(g[0], sa), neg(sum_to(g[0], sb))};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  DType dt = result_type(a, b);
  Tensor out = binary_forward(Op::mul, a, b, dt, dt);
  if (!autograd::any_requires_grad({a, b})) return out;
  bool ga = a.requires_grad(), gb = b.requires_grad();
  SavedTensor sa(gb ? a : Tensor()), sb(ga ? b : Tensor());
  Shape sha = a.shape(), shb = b.shape();
  autograd::record("MulBackward0", {a, b}, {out}, [=](const GradList& g) -> GradList {
    return {ga ? sum_to(mul(g[0], sb.unpack("MulBackward0")), sha) : Tensor(),
            gb ? sum_to(mul(g[0], sa.unpack("MulBackward0")), shb) : Tensor()};
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  DType dt = result_type(a, b);
  if (!is_floating(dt)) dt = DType::Float32;
  Tensor out = binary_forward(Op::div, a, b, dt, dt);
  if (!autograd::any_requires_grad({a, b})) return out;
  SavedTensor sb(b), sout(out);
  Shape sha = a.shape(), shb = b.shape();
  bool gb = b.requires_grad();
  autograd::record("DivBackward0", {a, b}, {out}, [=](const GradList& g) -> GradList {
    Tensor bv = sb.unpack("DivBackward0");
    Tensor ga = div(g[0], bv);
    return {sum_to(ga, sha), gb ? sum_to(neg(mul(ga, sout.unpack("DivBackward0"))), shb) : Tensor()};
  });
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  DType dt = result_type(a, b);
  if (!is_floating(dt)) dt = DType::Float32;
  Tensor out = binary_forward(Op::pow, a, b, dt, dt);
  if (!autograd::any_requires_grad({a, b})) return out;
  SavedTensor sa(a), sb(b), sout(out);
  Shape sha = a.shape(), shb = b.shape();
  autograd::record("PowBackward1", {a, b}, {out}, [=](const GradList& g) -> GradList {
    Tensor av = sa.unpack("PowBackward1"), bv = sb.unpack("PowBackward1");
    Tensor ga = mul(g[0], mul(bv, pow(av, sub(bv, scalar_like(1, bv.dtype())))));
    // d/db a^b = a^b log a, taken as 0 where a == 0 and b >= 0 (as PyTorch).
    Tensor lg = mul(sout.unpack("PowBackward1"), log(av));
    Tensor zero_base =
        mul(eq(av, scalar_like(0, av.dtype())).to(lg.dtype()), ge(bv, scalar_like(0, bv.dtype())).to(lg.dtype()));
    lg = where(zero_base.to(DType::Bool), zeros_like(lg), lg);
    return {sum_to(ga, sha), sum_to(mul(g[0], lg), shb)};
  });
  return out;
}

Tensor pow(const Tensor& a, Scalar exponent) {
  UnaryParams p{.a = exponent.to_double()};
  DType dt = exponent.kind() == Scalar::Kind::Float ? float_dtype(a) : a.dtype();
  Tensor out = unary_forward(Op::pow_scalar, a, dt, &p);
  double e = exponent.to_double();
  return record_unary("PowBackward0", a, out, [e](const Tensor& g, const Tensor& x, const Tensor&) {
    if (e == 0) return zeros_like(g);
    return mul(g, mul(scalar_like(e, x.dtype()), pow(x, e - 1)));
  });
}

namespace {
Tensor extremum(Op op, const char* name, const Tensor& a, const Tensor& b) {
  DType dt = result_type(a, b);
  Tensor out = binary_forward(op, a, b, dt, dt);
  if (!autograd::any_requires_grad({a, b})) return out;
  SavedTensor sa(a), sb(b);
  Shape sha = a.shape(), shb = b.shape();
  bool is_max = op == Op::maximum;
  std::string nm = name;
  autograd::record(name, {a, b}, {out}, [=](const GradList& g) -> GradList {
    Tensor av = sa.unpack(nm), bv = sb.unpack(nm);
    // Ties split the gradient evenly, as PyTorch.
    Tensor a_wins = (is_max ? gt(av, bv) : lt(av, bv)).to(g[0].dtype());
    Tensor tie = eq(av, bv).to(g[0].dtype());
    Tensor wa = add(a_wins, mul(tie, scalar_like(0.5, g[0].dtype())));
    Tensor wb = sub(ones_like(wa), wa);
    return {sum_to(mul(g[0], wa), sha), sum_to(mul(g[0], wb), shb)};
  });
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum(Op::maximum, "MaximumBackward0", a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum(Op::minimum, "MinimumBackward0", a, b); }

#define TVC_COMPARISON(name)                                               \
  Tensor name(const Tensor& a, const Tensor& b) {                          \
    return binary_forward(Op::name, a, b, result_type(a, b), DType::Bool); \
  }
TVC_COMPARISON(eq)
TVC_COMPARISON(ne)
TVC_COMPARISON(lt)
TVC_COMPARISON(le)
TVC_COMPARISON(gt)
TVC_COMPARISON(ge)
#undef TVC_COMPARISON

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  TVC_CHECK(condition.dtype() == DType::Bool, "where: condition must be a bool tensor, got ",
            dtype_name(condition.dtype()));
  DType dt = result_type(a, b);
  Tensor out;
  {
    NoGradGuard no_grad;
    Shape shape = broadcast_shapes(broadcast_shapes(condition.shape(), a.shape(), "where"), b.shape(), "where");
    out = detail::empty_with_format(shape, dt, detail::result_format({a, b}));
    detail::run(Op::where, {condition.expand(shape), a.to(dt).expand(shape), b.to(dt).expand(shape)}, {out});
  }
  if (!autograd::any_requires_grad({a, b})) return out;
  SavedTensor sc(condition);
  Shape sha = a.shape(), shb = b.shape();
  autograd::record("WhereBackward0", {a, b}, {out}, [=](const GradList& g) -> GradList {
    Tensor c = sc.unpack("WhereBackward0");
    Tensor z = zeros_like(g[0]);
    return {sum_to(where(c, g[0], z), sha), sum_to(where(c, z, g[0]), shb)};
  });
  return out;
}

Tensor masked_fill(const Tensor& t, const Tensor& mask, Scalar value) {
  TVC_CHECK(mask.dtype() == DType::Bool, "masked_fill: mask must be a bool tensor, got ", dtype_name(mask.dtype()));
  Shape shape = broadcast_shapes(t.shape(), mask.shape(), "masked_fill");
  TVC_CHECK(shape == t.shape(), "masked_fill: mask of shape ", mask.shape(),
            " does not broadcast to the tensor's shape ", t.shape());
  return where(mask, scalar_like(value, t.dtype()), t);
}

// ---------------------------------------------------------------- unary math

Tensor neg(const Tensor& t) {
  TVC_CHECK(t.dtype() != DType::Bool, "neg: negation of a bool tensor is not supported");
  Tensor out = unary_forward(Op::neg, t, t.dtype());
  return record_unary("NegBackward0", t, out, [](const Tensor& g, const Tensor&, const Tensor&) { return neg(g); });
}

Tensor abs(const Tensor& t) {
  Tensor out = unary_forward(Op::abs, t, t.dtype());
  return record_unary("AbsBackward0", t, out,
                      [](const Tensor& g, const Tensor& x, const Tensor&) { return mul(g, sign(x)); });
}

Tensor sign(const Tensor& t) {
  Tensor out = unary_forward(Op::sign, t, t.dtype());
  return record_unary("SignBackward0", t, out,
                      [](const Tensor& g, const Tensor&, const Tensor&) { return zeros_like(g); });
}

Tensor exp(const Tensor& t) {
  Tensor out = unary_forward(Op::exp, t, float_dtype(t));
  return record_unary("ExpBackward0", t, out,
                      [](const Tensor& g, const Tensor&, const Tensor& y) { return mul(g, y); });
}

Tensor log(const Tensor& t) {
  Tensor out = unary_forward(Op::log, t, float_dtype(t));
  return record_unary("LogBackward0", t, out,
                      [](const Tensor& g, const Tensor& x, const Tensor&) { return div(g, x); });
}

Tensor sqrt(const Tensor& t) {
  Tensor out = unary_forward(Op::sqrt, t, float_dtype(t));
  return record_unary("SqrtBackward0", t, out, [](const Tensor& g, const Tensor&, const Tensor& y) {
    return div(g, mul(y, scalar_like(2, y.dtype())));
  });
}

Tensor rsqrt(const Tensor& t) {
  Tensor out = unary_forward(Op::rsqrt, t, float_dtype(t));
  return record_unary("RsqrtBackward0", t, out, [](const Tensor& g, const Tensor&, const Tensor& y) {
    return mul(g, mul(pow(y, 3), scalar_like(-0.5, y.dtype())));
  });
}

Tensor erf(const Tensor& t) {
  Tensor out = unary_forward(Op::erf, t, float_dtype(t));
  return record_unary("ErfBackward0", t, out, [](const Tensor& g, const Tensor& x, const Tensor&) {
    return mul(g, mul(exp(neg(mul(x, x))), scalar_like(1.1283791670955126, x.dtype())));
  });
}

namespace {

// clamp's kernel parameters; at least one bound must be given.
UnaryParams clamp_params(const char* op, std::optional<double> min, std::optional<double> max) {
  TVC_CHECK(min || max, op, ": at least one of min and max must be given");
  return {.a = min.value_or(0), .b = max.value_or(0), .has_a = min.has_value(), .has_b = max.has_value()};
}

// grad * (1 where the bounds of p hold for x, else 0): one pass with the kernel, on a device
// without it the comparisons and products as ops. Allocated like x.
Tensor clamp_backward(const Tensor& g, const Tensor& x, const UnaryParams& p) {
  if (!kernel_registry().supports(Op::clamp_backward, g.device())) {
    Tensor keep = ones_like(g);
    if (p.has_a) keep = mul(keep, ge(x, scalar_like(p.a, x.dtype())).to(g.dtype()));
    if (p.has_b) keep = mul(keep, le(x, scalar_like(p.b, x.dtype())).to(g.dtype()));
    return mul(g, keep);
  }
  Tensor out = detail::empty_with_format(x.shape(), g.dtype(), x.suggest_memory_format());
  detail::run(Op::clamp_backward, {g, x}, {out}, &p);
  return out;
}

}  // namespace

Tensor clamp(const Tensor& t, std::optional<double> min, std::optional<double> max) {
  const UnaryParams p = clamp_params("clamp", min, max);
  Tensor out = unary_forward(Op::clamp, t, t.dtype(), &p);
  return record_unary("ClampBackward1", t, out,
                      [p](const Tensor& g, const Tensor& x, const Tensor&) { return clamp_backward(g, x, p); });
}

// ---------------------------------------------------------------- activations

namespace {

// ReLU's gradient from its result y: grad where y > 0, that is y >= the smallest positive value
// of y's compute type (float for the 16-bit types).
Tensor relu_backward(const Tensor& grad, const Tensor& y) {
  const double smallest = y.dtype() == DType::Float64 ? std::numeric_limits<double>::denorm_min()
                                                      : std::numeric_limits<float>::denorm_min();
  return clamp_backward(grad, y, {.a = smallest, .has_b = false});
}

}  // namespace

Tensor relu(const Tensor& t) {
  Tensor out = unary_forward(Op::relu, t, t.dtype());
  return record_unary("ReluBackward0", t, out,
                      [](const Tensor& g, const Tensor&, const Tensor& y) { return relu_backward(g, y); });
}

Tensor relu6(const Tensor& t) { return clamp(t, 0.0, 6.0); }

Tensor leaky_relu(const Tensor& t, double slope) {
  UnaryParams p{.a = slope};
  Tensor out = unary_forward(Op::leaky_relu, t, float_dtype(t), &p);
  return record_unary("LeakyReluBackward0", t, out, [slope](const Tensor& g, const Tensor& x, const Tensor&) {
    Tensor pos = gt(x, scalar_like(0, x.dtype()));
    return mul(g, where(pos, ones_like(g), full_like(g, slope)));
  });
}

Tensor gelu(const Tensor& t, GeluApproximate approximate) {
  bool use_tanh = approximate == GeluApproximate::Tanh;
  UnaryParams p{.approximate_tanh = use_tanh};
  Tensor out = unary_forward(Op::gelu, t, float_dtype(t), &p);
  return record_unary("GeluBackward0", t, out, [use_tanh](const Tensor& g, const Tensor& x, const Tensor&) {
    DType d = x.dtype();
    if (use_tanh) {
      const double k = 0.7978845608028654, c = 0.044715;
      Tensor x2 = mul(x, x);
      Tensor inner = mul(scalar_like(k, d), add(x, mul(scalar_like(c, d), mul(x2, x))));
      Tensor th = tanh(inner);
      Tensor left = mul(scalar_like(0.5, d), add(th, scalar_like(1, d)));
      Tensor dinner = mul(scalar_like(k, d), add(scalar_like(1, d), mul(scalar_like(3 * c, d), x2)));
      Tensor right = mul(mul(scalar_like(0.5, d), x), mul(sub(scalar_like(1, d), mul(th, th)), dinner));
      return mul(g, add(left, right));
    }
    if (kernel_registry().supports(Op::gelu_backward, g.device())) {
      Tensor out = detail::empty_with_format(x.shape(), g.dtype(), x.suggest_memory_format());
      detail::run(Op::gelu_backward, {g, x}, {out});
      return out;
    }
    Tensor cdf = mul(scalar_like(0.5, d), add(scalar_like(1, d), erf(mul(x, scalar_like(0.7071067811865476, d)))));
    Tensor pdf = mul(scalar_like(0.3989422804014327, d), exp(mul(scalar_like(-0.5, d), mul(x, x))));
    return mul(g, add(cdf, mul(x, pdf)));
  });
}

Tensor sigmoid(const Tensor& t) {
  Tensor out = unary_forward(Op::sigmoid, t, float_dtype(t));
  return record_unary("SigmoidBackward0", t, out, [](const Tensor& g, const Tensor&, const Tensor& y) {
    return mul(g, mul(y, sub(scalar_like(1, y.dtype()), y)));
  });
}

Tensor silu(const Tensor& t) {
  Tensor out = unary_forward(Op::silu, t, float_dtype(t));
  return record_unary("SiluBackward0", t, out, [](const Tensor& g, const Tensor& x, const Tensor&) {
    Tensor s = sigmoid(x);
    DType d = x.dtype();
    return mul(g, mul(s, add(scalar_like(1, d), mul(x, sub(scalar_like(1, d), s)))));
  });
}

Tensor hardsigmoid(const Tensor& t) {
  Tensor out = unary_forward(Op::hardsigmoid, t, float_dtype(t));
  return record_unary("HardsigmoidBackward0", t, out, [](const Tensor& g, const Tensor& x, const Tensor&) {
    DType d = x.dtype();
    Tensor inside = mul(gt(x, scalar_like(-3, d)).to(d), lt(x, scalar_like(3, d)).to(d));
    // PyTorch's hardsigmoid_backward uses 1/6 rounded to float32 in every dtype; so do we, so
    // that float64 gradients agree with PyTorch's (relative difference otherwise 3e-8).
    return mul(g, mul(inside, scalar_like(static_cast<double>(1.0f / 6.0f), d)));
  });
}

Tensor hardswish(const Tensor& t) {
  Tensor out = unary_forward(Op::hardswish, t, float_dtype(t));
  return record_unary("HardswishBackward0", t, out, [](const Tensor& g, const Tensor& x, const Tensor&) {
    DType d = x.dtype();
    // 0 below -3, (2x + 3) / 6 up to 3, 1 above (as PyTorch).
    Tensor mid = add(mul(x, scalar_like(1.0 / 3.0, d)), scalar_like(0.5, d));
    Tensor slope = where(lt(x, scalar_like(-3, d)), zeros_like(x), where(le(x, scalar_like(3, d)), mid, ones_like(x)));
    return mul(g, slope);
  });
}

Tensor tanh(const Tensor& t) {
  Tensor out = unary_forward(Op::tanh, t, float_dtype(t));
  return record_unary("TanhBackward0", t, out, [](const Tensor& g, const Tensor&, const Tensor& y) {
    return mul(g, sub(scalar_like(1, y.dtype()), mul(y, y)));
  });
}

Tensor softplus(const Tensor& t, double beta, double threshold) {
  UnaryParams p{.a = beta, .b = threshold};
  Tensor out = unary_forward(Op::softplus, t, float_dtype(t), &p);
  return record_unary("SoftplusBackward0", t, out, [beta, threshold](const Tensor& g, const Tensor& x, const Tensor&) {
    DType d = x.dtype();
    Tensor bx = mul(x, scalar_like(beta, d));
    return mul(g, where(gt(bx, scalar_like(threshold, d)), ones_like(x), sigmoid(bx)));
  });
}

Tensor mish(const Tensor& t) { return mul(t, tanh(softplus(t))); }

// ---------------------------------------------------------------- operators

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, as_tensor(b, a)); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, as_tensor(b, a)); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, as_tensor(b, a)); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, as_tensor(b, a)); }
Tensor operator+(Scalar a, const Tensor& b) { return add(as_tensor(a, b), b); }
Tensor operator-(Scalar a, const Tensor& b) { return sub(as_tensor(a, b), b); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(as_tensor(a, b), b); }
Tensor operator/(Scalar a, const Tensor& b) { return div(as_tensor(a, b), b); }
Tensor operator-(const Tensor& t) { return neg(t); }
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator>(const Tensor& a, Scalar b) { return gt(a, as_tensor(b, a)); }
Tensor operator<(const Tensor& a, Scalar b) { return lt(a, as_tensor(b, a)); }

// ---------------------------------------------------------------- in-place

namespace {

Tensor add_two(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor sub_two(const Tensor& a, const Tensor& b) { return sub(a, b); }

void check_writable(const Tensor& self, const char* op) {
  for (int64_t d = 0; d < self.dim(); ++d)
    TVC_CHECK(self.strides()[d] != 0 || self.shape()[d] <= 1, op, ": the written-to tensor (shape ", self.shape(),
              ", strides ", self.strides(), ") has elements sharing one memory location; clone it first");
}

// Makes self take over result's values and history (the path used when autograd is needed).
void adopt(Tensor& self, const Tensor& result) {
  {
    NoGradGuard no_grad;
    detail::run(Op::copy, {result}, {self});
  }
  self.storage()->bump_version();
  self.impl()->grad_fn = result.grad_fn();
  self.impl()->output_nr = result.impl()->output_nr;
  self.impl()->requires_grad = result.requires_grad();
}

// An in-place binary op: self = op(self, other), computed in self's dtype.
Tensor& binary_inplace(Tensor& self, Op op, const Tensor& other, Tensor (*out_of_place)(const Tensor&, const Tensor&)) {
  autograd::check_inplace(self, op_name(op));
  check_writable(self, op_name(op));
  Shape shape = broadcast_shapes(self.shape(), other.shape(), op_name(op));
  TVC_CHECK(shape == self.shape(), op_name(op), "_: the result of shape ", shape,
            " does not fit the written-to tensor of shape ", self.shape());
  if (autograd::any_requires_grad({self, other})) {
    adopt(self, out_of_place(self.clone(), other).to(self.dtype()));
    return self;
  }
  {
    NoGradGuard no_grad;
    Tensor o = other.to(self.dtype());
    if (o.storage() == self.storage()) o = o.clone();
    detail::run(op, {self, o.expand(self.shape())}, {self});
  }
  self.storage()->bump_version();
  return self;
}

// An in-place unary op: self = op(self). When autograd does not record it and the op's result
// has self's dtype, the kernel writes into self (one pass); otherwise f computes the result aside
// (from a copy of self when autograd records it) and self adopts it with its history.
Tensor& unary_inplace(Tensor& self, const char* name, Op op, DType result_dtype, const UnaryParams* params,
                      const std::function<Tensor(const Tensor&)>& f) {
  autograd::check_inplace(self, name);
  check_writable(self, name);
  TVC_CHECK(is_floating(self.dtype()) || result_dtype == self.dtype(), name, ": the result of dtype ",
            dtype_name(result_dtype), " cannot be written into a tensor of dtype ", dtype_name(self.dtype()));
  const bool recorded = autograd::any_requires_grad({self});
  if (!recorded && result_dtype == self.dtype()) {
    {
      NoGradGuard no_grad;
      detail::run(op, {self}, {self}, params);
    }
    self.storage()->bump_version();
    return self;
  }
  Tensor r = f(recorded ? self.clone() : self);
  adopt(self, r.to(self.dtype()));
  return self;
}

// unary_inplace for an activation with a floating result and no parameters.
Tensor& float_unary_inplace(Tensor& self, const char* name, Op op, Tensor (*out_of_place)(const Tensor&)) {
  return unary_inplace(self, name, op, float_dtype(self), nullptr, out_of_place);
}

}  // namespace

Tensor& Tensor::add_(const Tensor& other, Scalar alpha) {
  if (alpha.to_double() != 1) return binary_inplace(*this, Op::add, tvc::mul(other, as_tensor(alpha, other)), add_two);
  return binary_inplace(*this, Op::add, other, add_two);
}
Tensor& Tensor::add_(Scalar other) { return add_(as_tensor(other, *this)); }
Tensor& Tensor::sub_(const Tensor& other, Scalar alpha) {
  if (alpha.to_double() != 1) return binary_inplace(*this, Op::sub, tvc::mul(other, as_tensor(alpha, other)), sub_two);
  return binary_inplace(*this, Op::sub, other, sub_two);
}
Tensor& Tensor::mul_(const Tensor& other) { return binary_inplace(*this, Op::mul, other, tvc::mul); }
Tensor& Tensor::mul_(Scalar other) { return mul_(as_tensor(other, *this)); }
Tensor& Tensor::div_(const Tensor& other) {
  TVC_CHECK(is_floating(dtype()), "div_: in-place true division needs a floating tensor, got ", dtype_name(dtype()));
  return binary_inplace(*this, Op::div, other, tvc::div);
}
Tensor& Tensor::div_(Scalar other) { return div_(as_tensor(other, *this)); }

Tensor& Tensor::clamp_(std::optional<double> min, std::optional<double> max) {
  const UnaryParams p = clamp_params("clamp_", min, max);
  return unary_inplace(*this, "clamp_", Op::clamp, dtype(), &p,
                       [&](const Tensor& t) { return tvc::clamp(t, min, max); });
}
Tensor& Tensor::relu_() {
  if (!autograd::any_requires_grad({*this}) || !is_floating(dtype()))
    return unary_inplace(*this, "relu_", Op::relu, dtype(), nullptr, [](const Tensor& t) { return tvc::relu(t); });
  // Recorded, still in place (PyTorch's in-place ReLU): the gradient needs only the result, so
  // self is overwritten and saved as it, with no copy of its old values (two passes over every
  // activation of a training step's inplace ReLUs).
  autograd::check_inplace(*this, "relu_");
  check_writable(*this, "relu_");
  {
    NoGradGuard no_grad;
    detail::run(Op::relu, {*this}, {*this});
  }
  auto result = std::make_shared<SavedTensor>();
  autograd::record_inplace("ReluBackward0", *this, {}, [result](const GradList& g) -> GradList {
    return {relu_backward(g[0], result->unpack("ReluBackward0"))};
  });
  *result = SavedTensor(*this);  // at the version record_inplace left
  return *this;
}
Tensor& Tensor::sigmoid_() { return float_unary_inplace(*this, "sigmoid_", Op::sigmoid, tvc::sigmoid); }
Tensor& Tensor::silu_() { return float_unary_inplace(*this, "silu_", Op::silu, tvc::silu); }
Tensor& Tensor::hardsigmoid_() { return float_unary_inplace(*this, "hardsigmoid_", Op::hardsigmoid, tvc::hardsigmoid); }
Tensor& Tensor::hardswish_() { return float_unary_inplace(*this, "hardswish_", Op::hardswish, tvc::hardswish); }
Tensor& Tensor::masked_fill_(const Tensor& mask, Scalar value) {
  autograd::check_inplace(*this, "masked_fill_");
  check_writable(*this, "masked_fill_");
  Tensor r = masked_fill(autograd::any_requires_grad({*this}) ? clone() : *this, mask, value);
  adopt(*this, r.to(dtype()));
  return *this;
}

Tensor& Tensor::fill_(Scalar value) {
  autograd::check_inplace(*this, "fill_");
  check_writable(*this, "fill_");
  FillParams p{.a = value.to_double()};
  if (value.kind() != Scalar::Kind::Float) p.integer = value.to_int();
  detail::run(Op::fill, {}, {*this}, &p);
  autograd::record_inplace("FillBackward0", *this, {},
                           [](const GradList& g) -> GradList { return {zeros_like(g[0])}; });
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0); }

Tensor& Tensor::copy_(const Tensor& src) {
  autograd::check_inplace(*this, "copy_");
  check_writable(*this, "copy_");
  Shape shape = broadcast_shapes(this->shape(), src.shape(), "copy_");
  TVC_CHECK(shape == this->shape(), "copy_: source of shape ", src.shape(),
            " does not broadcast to the destination's shape ", this->shape());
  {
    NoGradGuard no_grad;
    Tensor s = src.storage() == storage() && !src.is_same(*this) ? src.clone() : src;
    detail::run(Op::copy, {s.expand(this->shape())}, {*this});
  }
  Shape src_shape = src.shape();
  autograd::record_inplace("CopyBackwards", *this, {src}, [src_shape](const GradList& g) -> GradList {
    return {zeros_like(g[0]), sum_to(g[0], src_shape)};
  });
  return *this;
}

// ---------------------------------------------------------------- lerp

Tensor lerp(const Tensor& start, const Tensor& end, double weight) {
  TVC_CHECK(start.defined() && end.defined(), "lerp: undefined input tensor");
  DType dt = result_type(start, end);
  TVC_CHECK(is_floating(dt), "lerp: needs floating tensors, got ", dtype_name(start.dtype()), " and ",
            dtype_name(end.dtype()));
  Tensor out;
  {
    NoGradGuard no_grad;
    Shape shape = broadcast_shapes(start.shape(), end.shape(), "lerp");
    out = detail::empty_with_format(shape, dt, detail::result_format({start, end}));
    LerpParams p{weight};
    detail::run(Op::lerp, {start.to(dt).expand(shape), end.to(dt).expand(shape)}, {out}, &p);
  }
  Shape s_start = start.shape(), s_end = end.shape();
  autograd::record("LerpBackward0", {start, end}, {out}, [=](const GradList& g) -> GradList {
    DType gd = g[0].dtype();
    return {sum_to(mul(g[0], scalar_like(1 - weight, gd)), s_start), sum_to(mul(g[0], scalar_like(weight, gd)), s_end)};
  });
  return out;
}

void foreach_lerp_(const std::vector<Tensor>& selves, const std::vector<Tensor>& ends, double weight) {
  TVC_CHECK(selves.size() == ends.size(), "foreach_lerp_: ", selves.size(), " tensors to update but ", ends.size(),
            " end tensors");
  if (selves.empty()) return;
  const DType dt = selves[0].dtype();
  const Device dev = selves[0].device();
  TVC_CHECK(is_floating(dt), "foreach_lerp_: needs floating tensors, got ", dtype_name(dt));
  std::vector<Tensor> in(2 * selves.size());
  for (size_t i = 0; i < selves.size(); ++i) {
    const Tensor& s = selves[i];
    TVC_CHECK(s.dtype() == dt && s.device() == dev, "foreach_lerp_: tensor ", i, " is ", dtype_name(s.dtype()), " on ",
              device_name(s.device()), ", tensor 0 is ", dtype_name(dt), " on ", device_name(dev),
              " (one call takes tensors of one dtype and device)");
    TVC_CHECK(ends[i].shape() == s.shape(), "foreach_lerp_: tensor ", i, " has shape ", s.shape(), ", its end tensor ",
              ends[i].shape());
    autograd::check_inplace(s, "foreach_lerp_");
    check_writable(s, "foreach_lerp_");
    in[i] = s;
    Tensor e = ends[i].to(dt);
    in[selves.size() + i] = e.storage() == s.storage() && !e.is_same(s) ? e.clone() : e;
  }
  {
    NoGradGuard no_grad;
    LerpParams p{weight};
    detail::run(Op::lerp, in, selves, &p);
  }
  for (const Tensor& s : selves) s.storage()->bump_version();
}

void foreach_sgd_momentum_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                           const std::vector<Tensor>& buffers, double lr, double momentum, double dampening) {
  const size_t n = params.size();
  TVC_CHECK(grads.size() == n && buffers.size() == n, "foreach_sgd_momentum_: ", n, " parameters but ", grads.size(),
            " gradients and ", buffers.size(), " momentum buffers");
  if (n == 0) return;
  const DType dt = params[0].dtype();
  const Device dev = params[0].device();
  TVC_CHECK(is_floating(dt), "foreach_sgd_momentum_: needs floating tensors, got ", dtype_name(dt));
  std::vector<Tensor> in(3 * n), out(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const Tensor &p = params[i], &g = grads[i], &b = buffers[i];
    const bool dense = p.is_contiguous() || p.is_contiguous(MemoryFormat::ChannelsLast);
    for (const Tensor* t : {&p, &g, &b})
      TVC_CHECK(
          t->dtype() == dt && t->device() == dev && t->shape() == p.shape() && t->strides() == p.strides() && dense,
          "foreach_sgd_momentum_: parameter ", i, " (", dtype_name(p.dtype()), " ", p.shape(), "), its gradient (",
          dtype_name(g.dtype()), " ", g.shape(), ") and its buffer (", dtype_name(b.dtype()), " ", b.shape(),
          ") must share parameter 0's dtype ", dtype_name(dt), ", its device, one shape and ", "one dense layout");
    TVC_CHECK(p.storage() != b.storage() && p.storage() != g.storage() && b.storage() != g.storage(),
              "foreach_sgd_momentum_: parameter ", i, ", its gradient and its buffer must not share memory");
    for (const Tensor* t : {&p, &b}) {
      autograd::check_inplace(*t, "foreach_sgd_momentum_");
      check_writable(*t, "foreach_sgd_momentum_");
    }
    in[i] = out[i] = p;
    in[n + i] = out[n + i] = b;
    in[2 * n + i] = g;
  }
  {
    NoGradGuard no_grad;
    SgdMomentumParams q{lr, momentum, dampening};
    detail::run(Op::sgd_momentum, in, out, &q);
  }
  for (const Tensor& t : out) t.storage()->bump_version();
}

// ---------------------------------------------------------------- methods

Tensor Tensor::pow(Scalar e) const { return tvc::pow(*this, e); }
Tensor Tensor::sqrt() const { return tvc::sqrt(*this); }
Tensor Tensor::exp() const { return tvc::exp(*this); }
Tensor Tensor::log() const { return tvc::log(*this); }
Tensor Tensor::abs() const { return tvc::abs(*this); }
Tensor Tensor::neg() const { return tvc::neg(*this); }
Tensor Tensor::relu() const { return tvc::relu(*this); }
Tensor Tensor::sigmoid() const { return tvc::sigmoid(*this); }
Tensor Tensor::tanh() const { return tvc::tanh(*this); }
Tensor Tensor::add(const Tensor& other, Scalar alpha) const { return tvc::add(*this, other, alpha); }
Tensor Tensor::sub(const Tensor& other, Scalar alpha) const { return tvc::sub(*this, other, alpha); }
Tensor Tensor::mul(const Tensor& other) const { return tvc::mul(*this, other); }
Tensor Tensor::div(const Tensor& other) const { return tvc::div(*this, other); }
Tensor Tensor::clamp(std::optional<double> min, std::optional<double> max) const { return tvc::clamp(*this, min, max); }

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  NoGradGuard no_grad;
  Tensor a64 = a.to(DType::Float64), b64 = b.to(DType::Float64);
  Tensor diff = abs(sub(a64, b64));
  Tensor tol = add(mul(abs(b64), scalar_like(rtol, DType::Float64)), scalar_like(atol, DType::Float64));
  return sum(gt(diff, tol).to(DType::Int64)).item<int64_t>() == 0;
}

}  // namespace tvc
