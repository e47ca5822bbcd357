// torch.nn.init: in-place initialisers of parameter tensors, with PyTorch's fan and gain rules.
//
// Each fills t in place (under NoGradGuard, so parameters that require grad can be filled) and
// returns it. Random ones draw from gen, or tvc::default_generator() when gen is null; values
// are drawn in float64 and rounded to t's dtype. Fans of a tensor of shape (O, I, *k):
// fan_in = I * prod(k), fan_out = O * prod(k) (at least 2 dims). Zero-element tensors are left
// as they are.
#pragma once

#include <optional>
#include <utility>

#include "tvc/ops.h"

namespace tvc::nn::init {

// The recommended gain for a nonlinearity: Linear, Conv1d/2d/3d, ConvTranspose1d/2d/3d,
// Sigmoid -> 1; Tanh -> 5/3; Relu -> sqrt(2); LeakyRelu -> sqrt(2 / (1 + param^2)) (param =
// negative slope, default 0.01); Selu -> 3/4.
double calculate_gain(Nonlinearity nonlinearity, std::optional<double> param = std::nullopt);
// (fan_in, fan_out) of a tensor with at least 2 dims.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

Tensor uniform_(Tensor t, double a = 0, double b = 1, Generator* gen = nullptr);  // U(a, b)
Tensor normal_(Tensor t, double mean = 0, double std = 1, Generator* gen = nullptr);
// N(mean, std^2) truncated to [a, b], by the inverse CDF as PyTorch: u ~ U(cdf(a), cdf(b)),
// x = mean + std * sqrt(2) * erfinv(2u - 1), clamped to [a, b]. erfinv is computed from tvc
// ops (Giles' approximation refined by two Newton steps on erf), accurate to float64 rounding.
Tensor trunc_normal_(Tensor t, double mean = 0, double std = 1, double a = -2, double b = 2, Generator* gen = nullptr);
Tensor constant_(Tensor t, double value);
Tensor zeros_(Tensor t);
Tensor ones_(Tensor t);
// U(-r, r) with r = gain * sqrt(6 / (fan_in + fan_out)).
Tensor xavier_uniform_(Tensor t, double gain = 1, Generator* gen = nullptr);
// N(0, s^2) with s = gain * sqrt(2 / (fan_in + fan_out)).
Tensor xavier_normal_(Tensor t, double gain = 1, Generator* gen = nullptr);
// U(-r, r) with r = gain * sqrt(3 / fan), gain = calculate_gain(nonlinearity, a),
// fan = fan_in or fan_out by mode.
Tensor kaiming_uniform_(Tensor t, double a = 0, FanMode mode = FanMode::FanIn,
                        Nonlinearity nonlinearity = Nonlinearity::LeakyRelu, Generator* gen = nullptr);
// N(0, s^2) with s = gain / sqrt(fan).
Tensor kaiming_normal_(Tensor t, double a = 0, FanMode mode = FanMode::FanIn,
                       Nonlinearity nonlinearity = Nonlinearity::LeakyRelu, Generator* gen = nullptr);

}  // namespace tvc::nn::init
