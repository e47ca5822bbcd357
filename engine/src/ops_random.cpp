// Random tensors from the counter-based generator (see Generator in tvc/ops.h), and dropout.
#include "internal.h"

namespace tvc {

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

namespace {

// Fills t (made contiguous first) by op from gen with params p (their seed and offset set here).
Tensor& random_fill(Tensor& t, Op op, FillParams p, Generator* gen) {
  autograd::check_inplace(t, op_name(op));
  Generator& g = gen ? *gen : default_generator();
  Tensor target = t.is_contiguous() ? t : empty(t.shape(), {.dtype = t.dtype()});
  Generator::State reserved = g.advance(static_cast<uint64_t>(t.numel()));
  p.seed = reserved.seed;
  p.offset = reserved.offset;
  detail::run(op, {}, {target}, &p);
  if (!target.is_same(t)) {
    NoGradGuard no_grad;
    t.copy_(target);
  }
  t.storage()->bump_version();
  return t;
}

}  // namespace

Tensor& Tensor::uniform_(double from, double to, Generator* gen) {
  TVC_CHECK(is_floating(dtype()), "uniform_: needs a floating tensor, got ", dtype_name(dtype()));
  TVC_CHECK(from <= to, "uniform_: from ", from, " must not exceed to ", to);
  return random_fill(*this, Op::uniform, {.a = from, .b = to}, gen);
}

Tensor& Tensor::normal_(double mean, double std, Generator* gen) {
  TVC_CHECK(is_floating(dtype()), "normal_: needs a floating tensor, got ", dtype_name(dtype()));
  TVC_CHECK(std >= 0, "normal_: std must be non-negative, got ", std);
  return random_fill(*this, Op::normal, {.a = mean, .b = std}, gen);
}

namespace {

// A new floating tensor of shape drawn by op (uniform or normal) with parameters a, b.
Tensor random_floating(const char* name, Op op, double a, double b, const Shape& shape, TensorOptions options,
                       Generator* gen) {
  TVC_CHECK(is_floating(options.dtype), name, ": needs a floating dtype, got ", dtype_name(options.dtype));
  Tensor t = empty(shape, {.dtype = options.dtype});
  random_fill(t, op, {.a = a, .b = b}, gen);
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}

}  // namespace

Tensor rand(const Shape& shape, TensorOptions options, Generator* gen) {
  return random_floating("rand", Op::uniform, 0, 1, shape, options, gen);
}

Tensor randn(const Shape& shape, TensorOptions options, Generator* gen) {
  return random_floating("randn", Op::normal, 0, 1, shape, options, gen);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options, Generator* gen) {
  TVC_CHECK(low < high, "randint: low ", low, " must be less than high ", high);
  Tensor t = empty(shape, {.dtype = options.dtype});
  return random_fill(t, Op::randint, {.low = low, .high = high}, gen);
}

Tensor rand_like(const Tensor& t, Generator* gen) { return rand(t.shape(), {.dtype = t.dtype()}, gen); }
Tensor randn_like(const Tensor& t, Generator* gen) { return randn(t.shape(), {.dtype = t.dtype()}, gen); }

Tensor bernoulli(const Tensor& p, Generator* gen) {
  TVC_CHECK(is_floating(p.dtype()), "bernoulli: p must be floating, got ", dtype_name(p.dtype()));
  NoGradGuard no_grad;
  return lt(rand(p.shape(), {.dtype = p.dtype()}, gen), p).to(p.dtype());
}

Tensor randperm(int64_t n, Generator* gen) {
  TVC_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  // Sorting random keys gives a uniform permutation; ties are broken by position.
  Tensor keys = randint(0, int64_t{1} << 62, {n}, {.dtype = DType::Int64}, gen);
  return topk(keys, n, 0, false, true).second;
}

Tensor dropout(const Tensor& t, double p, bool training, Generator* gen) {
  TVC_CHECK(p >= 0 && p <= 1, "dropout: probability must be in [0, 1], got ", p);
  if (!training || p == 0) return t;
  if (p == 1) return mul(t, zeros_like(t));
  Tensor mask = bernoulli(full(t.shape(), 1 - p, {.dtype = t.dtype()}), gen);
  return mul(t, mul(mask, scalar_like(1 / (1 - p), t.dtype())));
}

}  // namespace tvc
