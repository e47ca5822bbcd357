// nn::init: PyTorch's parameter initialisers, built from tvc ops (trunc_normal_: one loop over its draws).
#include "tvc/nn/init.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "tvc/autograd.h"

namespace tvc::nn::init {

namespace {

void check_random_target(const Tensor& t, const char* fn) {
  TVC_CHECK(t.defined(), fn, ": the tensor is undefined");
  TVC_CHECK(is_floating(t.dtype()), fn, ": needs a floating tensor, got ", dtype_name(t.dtype()), " of shape ",
            t.shape());
}

// Writes value (float64, t's shape) into t without recording autograd.
Tensor assign(Tensor t, const Tensor& value) {
  NoGradGuard no_grad;
  t.copy_(value);
  return t;
}

double fan(const Tensor& t, FanMode mode) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return static_cast<double>(mode == FanMode::FanIn ? fan_in : fan_out);
}

// Polynomial p(w) = c[0] w^(n-1) + ... + c[n-1] by Horner's rule.
double horner(double w, std::initializer_list<double> c) {
  double p = 0;
  for (double ci : c) p = p * w + ci;
  return p;
}

// erfinv(y) for y in (-1, 1): Giles (2010) single-precision approximation, then two Newton
// steps on erf(x) = y (each roughly squares the relative error).
double erfinv(double y) {
  const double w = -std::log((1.0 - y) * (1.0 + y));
  double x = w < 5.0
                 ? horner(w - 2.5, {2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                                    -0.00125372503, -0.00417768164, 0.246640727, 1.50140941})
                 : horner(std::sqrt(w) - 3.0, {-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                                               0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682});
  x *= y;
  const double two_over_sqrt_pi = 2.0 / std::sqrt(std::numbers::pi);
  for (int i = 0; i < 2; ++i) x -= (std::erf(x) - y) / (std::exp(-x * x) * two_over_sqrt_pi);
  return x;
}

double norm_cdf(double x) { return (1.0 + std::erf(x / std::sqrt(2.0))) / 2.0; }

}  // namespace

double calculate_gain(Nonlinearity nonlinearity, std::optional<double> param) {
  switch (nonlinearity) {
    case Nonlinearity::Tanh:
      return 5.0 / 3;
    case Nonlinearity::Relu:
      return std::sqrt(2.0);
    case Nonlinearity::LeakyRelu: {
      double slope = param.value_or(0.01);
      return std::sqrt(2.0 / (1 + slope * slope));
    }
    case Nonlinearity::Selu:
      return 3.0 / 4;
    default:  // the linear ones and sigmoid
      return 1;
  }
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  TVC_CHECK(t.dim() >= 2,
            "calculate_fan_in_and_fan_out: fan in and fan out can not be computed for "
            "a tensor with fewer than 2 dimensions, got shape ",
            t.shape());
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.shape()[d];
  return {t.shape()[1] * receptive, t.shape()[0] * receptive};
}

Tensor uniform_(Tensor t, double a, double b, Generator* gen) {
  check_random_target(t, "uniform_");
  TVC_CHECK(a <= b, "uniform_: a ", a, " must not exceed b ", b);
  NoGradGuard no_grad;
  t.uniform_(a, b, gen);  // a + (b - a) * u in float64, rounded to t's dtype
  return t;
}

Tensor normal_(Tensor t, double mean, double std, Generator* gen) {
  check_random_target(t, "normal_");
  TVC_CHECK(std >= 0, "normal_: std must be non-negative, got ", std);
  NoGradGuard no_grad;
  t.normal_(mean, std, gen);  // mean + std * z in float64, rounded to t's dtype
  return t;
}

Tensor trunc_normal_(Tensor t, double mean, double std, double a, double b, Generator* gen) {
  check_random_target(t, "trunc_normal_");
  TVC_CHECK(a < b && std > 0, "trunc_normal_: needs a < b and std > 0, got a=", a, " b=", b, " std=", std);
  NoGradGuard no_grad;
  // Kept inside (-1, 1), where erfinv is finite, for bounds far out in the tails.
  double lo = std::max(2 * norm_cdf((a - mean) / std) - 1, std::nextafter(-1.0, 0.0));
  double hi = std::min(2 * norm_cdf((b - mean) / std) - 1, std::nextafter(1.0, 0.0));
  // One pass over the uniform draws (the same stream as rand()), element by element.
  Tensor x = rand(t.shape(), {.dtype = DType::Float64}, gen).contiguous();
  double* p = x.data_ptr<double>();
  const int64_t n = x.numel();
  const double scale = std * std::sqrt(2.0);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) p[i] = std::clamp(erfinv(p[i] * (hi - lo) + lo) * scale + mean, a, b);
  return assign(t, x);
}

Tensor constant_(Tensor t, double value) {
  NoGradGuard no_grad;
  t.fill_(value);
  return t;
}

Tensor zeros_(Tensor t) { return constant_(t, 0); }
Tensor ones_(Tensor t) { return constant_(t, 1); }

Tensor xavier_uniform_(Tensor t, double gain, Generator* gen) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  double r = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(t, -r, r, gen);
}

Tensor xavier_normal_(Tensor t, double gain, Generator* gen) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return normal_(t, 0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), gen);
}

Tensor kaiming_uniform_(Tensor t, double a, FanMode mode, Nonlinearity nonlinearity, Generator* gen) {
  if (t.defined() && t.numel() == 0) return t;
  double r = std::sqrt(3.0) * calculate_gain(nonlinearity, a) / std::sqrt(fan(t, mode));
  return uniform_(t, -r, r, gen);
}

Tensor kaiming_normal_(Tensor t, double a, FanMode mode, Nonlinearity nonlinearity, Generator* gen) {
  if (t.defined() && t.numel() == 0) return t;
  return normal_(t, 0, calculate_gain(nonlinearity, a) / std::sqrt(fan(t, mode)), gen);
}

}  // namespace tvc::nn::init
