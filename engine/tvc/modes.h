// The options PyTorch takes as strings, as enums: GELU's approximation, F.pad's mode, a
// convolution's padding_mode, interpolate's mode, a loss's reduction, and init's fan mode and
// nonlinearity. Text (recipes, configuration files, command lines) becomes an enum through
// parse_mode<E>("mean"), which names the option and the accepted values when the text is none
// of them; to_string(e) gives PyTorch's spelling back.
//
//   tvc::cross_entropy(logits, target, {}, -100, tvc::Reduction::Sum);
//   auto mode = tvc::parse_mode<tvc::PadMode>(config["mode"]);   // "reflect" -> PadMode::Reflect
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace tvc {

// gelu(x): None is x * Phi(x) with the exact erf, Tanh PyTorch's tanh approximation.
enum class GeluApproximate { None, Tanh };
// pad(): Constant fills with a value; Reflect mirrors without repeating the edge, Replicate
// repeats it, Circular wraps around.
enum class PadMode { Constant, Reflect, Replicate, Circular };
// Conv1d/Conv2d's padding_mode: Zeros pads with zeros, the others as PadMode.
enum class PaddingMode { Zeros, Reflect, Replicate, Circular };
// interpolate(): Nearest is PyTorch's legacy "nearest"; Bicubic uses A = -0.75.
enum class InterpolateMode { Nearest, Bilinear, Bicubic };
// A loss's reduction over its elements.
enum class Reduction { None, Mean, Sum };
// kaiming_*: the fan that keeps the variance of the forward (FanIn) or backward (FanOut) pass.
enum class FanMode { FanIn, FanOut };
// The activation a fused convolution applies after its affine map (conv2d_epilogue in ops.h).
enum class EpilogueActivation { None, ReLU, ReLU6, SiLU, Hardswish };
// calculate_gain's nonlinearity (and kaiming_*'s).
enum class Nonlinearity {
  Linear,
  Conv1d,
  Conv2d,
  Conv3d,
  ConvTranspose1d,
  ConvTranspose2d,
  ConvTranspose3d,
  Sigmoid,
  Tanh,
  Relu,
  LeakyRelu,
  Selu
};

// For each enum: the option's name (in errors) and PyTorch's spelling of each value, in the
// enum's order.
template <typename E>
struct ModeNames;
template <>
struct ModeNames<GeluApproximate> {
  static constexpr const char* option = "approximate";
  static constexpr std::array<const char*, 2> names{"none", "tanh"};
};
template <>
struct ModeNames<PadMode> {
  static constexpr const char* option = "pad mode";
  static constexpr std::array<const char*, 4> names{"constant", "reflect", "replicate", "circular"};
};
template <>
struct ModeNames<PaddingMode> {
  static constexpr const char* option = "padding_mode";
  static constexpr std::array<const char*, 4> names{"zeros", "reflect", "replicate", "circular"};
};
template <>
struct ModeNames<InterpolateMode> {
  static constexpr const char* option = "interpolate mode";
  static constexpr std::array<const char*, 3> names{"nearest", "bilinear", "bicubic"};
};
template <>
struct ModeNames<Reduction> {
  static constexpr const char* option = "reduction";
  static constexpr std::array<const char*, 3> names{"none", "mean", "sum"};
};
template <>
struct ModeNames<EpilogueActivation> {
  static constexpr const char* option = "epilogue activation";
  static constexpr std::array<const char*, 5> names{"none", "relu", "relu6", "silu", "hardswish"};
};
template <>
struct ModeNames<FanMode> {
  static constexpr const char* option = "mode";
  static constexpr std::array<const char*, 2> names{"fan_in", "fan_out"};
};
template <>
struct ModeNames<Nonlinearity> {
  static constexpr const char* option = "nonlinearity";
  static constexpr std::array<const char*, 12> names{
      "linear",           "conv1d",  "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
      "conv_transpose3d", "sigmoid", "tanh",   "relu",   "leaky_relu",       "selu"};
};

template <typename E>
concept Mode = requires {
  ModeNames<E>::names;
};

namespace detail {
// Throws tvc::Error: "<option>: '<text>' is not one of 'a', 'b', ..." (text escaped).
[[noreturn]] void throw_unknown_mode(const char* option, std::string_view text, const char* const* names, size_t count);
[[noreturn]] void throw_invalid_mode(const char* option, int value);
}  // namespace detail

// PyTorch's spelling of mode ("mean"); an out-of-range value is an error.
template <Mode E>
const char* to_string(E mode) {
  const auto& names = ModeNames<E>::names;
  auto index = static_cast<size_t>(mode);
  if (index >= names.size()) detail::throw_invalid_mode(ModeNames<E>::option, static_cast<int>(mode));
  return names[index];
}

// The enum value spelled text ("mean" -> Reduction::Mean); any other text is an error naming
// the option and the accepted values.
template <Mode E>
E parse_mode(std::string_view text) {
  const auto& names = ModeNames<E>::names;
  for (size_t i = 0; i < names.size(); ++i)
    if (text == names[i]) return static_cast<E>(i);
  detail::throw_unknown_mode(ModeNames<E>::option, text, names.data(), names.size());
}

}  // namespace tvc
