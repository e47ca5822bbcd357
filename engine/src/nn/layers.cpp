// torch.nn layers over tvc's functional ops (tvc/ops.h).
#include "tvc/nn/layers.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <typeinfo>

#include "../internal.h"
#include "tvc/autograd.h"
#include "tvc/internal/autograd.h"
#include "tvc/internal/kernel.h"
#include "tvc/nn/attention.h"
#include "tvc/nn/init.h"

namespace tvc::nn {

namespace {

const char* py_bool(bool b) { return b ? "True" : "False"; }

// Python's tuple repr: (3, 2) or (3,).
std::string py_tuple(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

// PyTorch's Linear/_ConvNd reset_parameters: kaiming_uniform_(a=sqrt(5)) for the weight,
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias.
void init_weight_and_bias(const Tensor& weight, const Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (!bias.defined()) return;
  int64_t fan_in = init::calculate_fan_in_and_fan_out(weight).first;
  double bound = fan_in > 0 ? 1 / std::sqrt(static_cast<double>(fan_in)) : 0;
  init::uniform_(bias, -bound, bound);
}

// fn(x) written into x (inplace=True). The op gets a copy of x when autograd may save it,
// since x is overwritten.
Tensor compute_inplace(const Tensor& x, const std::function<Tensor(const Tensor&)>& fn) {
  Tensor src = autograd::any_requires_grad({x}) ? x.clone() : x;
  Tensor y = x;
  y.copy_(fn(src));
  return y;
}

}  // namespace

// ---------------------------------------------------------------- Sizes

std::vector<int64_t> Sizes::expand(size_t n, const std::string& who) const {
  if (scalar) return std::vector<int64_t>(n, values[0]);
  TVC_CHECK(values.size() == n, who, ": expected ", n, " values, got ", py_tuple(values));
  return values;
}

std::array<int64_t, 2> Sizes::pair(const std::string& who) const {
  std::vector<int64_t> v = expand(2, who);
  return {v[0], v[1]};
}

std::string Sizes::str() const { return scalar ? std::to_string(values[0]) : py_tuple(values); }

// ---------------------------------------------------------------- Linear, Flatten

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_features(in_features), out_features(out_features) {
  TVC_CHECK(in_features >= 0 && out_features >= 0,
            "Linear: in_features and out_features must be "
            "non-negative, got ",
            in_features, " and ", out_features);
  register_parameter("weight", empty({out_features, in_features}));
  register_parameter("bias", bias ? empty({out_features}) : Tensor());
  reset_parameters();
}

void Linear::reset_parameters() { init_weight_and_bias(weight(), bias()); }

Tensor Linear::forward(const Tensor& x) { return linear(x, weight(), bias()); }

std::string Linear::extra_repr() const {
  return cat_str("in_features=", in_features, ", out_features=", out_features, ", bias=", py_bool(bias().defined()));
}

std::string Flatten::extra_repr() const { return cat_str("start_dim=", start_dim, ", end_dim=", end_dim); }

// ---------------------------------------------------------------- convolution

ConvNd::ConvNd(size_t dims, const std::string& name, int64_t in_channels, int64_t out_channels,
               const Sizes& kernel_size_, const ConvOptions& o)
    : in_channels(in_channels), out_channels(out_channels), groups(o.groups), padding_mode(o.padding_mode) {
  TVC_CHECK(o.groups > 0, name, ": groups must be a positive integer, got ", o.groups);
  TVC_CHECK(in_channels > 0 && in_channels % o.groups == 0, name, ": in_channels (", in_channels,
            ") must be positive and divisible by groups (", o.groups, ")");
  TVC_CHECK(out_channels > 0 && out_channels % o.groups == 0, name, ": out_channels (", out_channels,
            ") must be positive and divisible by groups (", o.groups, ")");
  kernel_size = kernel_size_.expand(dims, name + " kernel_size");
  stride = o.stride.expand(dims, name + " stride");
  dilation = o.dilation.expand(dims, name + " dilation");
  padding = o.padding.sizes.expand(dims, name + " padding");
  padding_str = o.padding.mode;
  TVC_CHECK(padding_str.empty() || padding_str == "same" || padding_str == "valid", name, ": invalid padding string '",
            padding_str, "', should be one of 'valid', 'same'");
  for (size_t i = 0; i < dims; ++i) {
    TVC_CHECK(kernel_size[i] > 0 && stride[i] > 0 && dilation[i] > 0 && padding[i] >= 0, name, ": kernel_size ",
              py_tuple(kernel_size), ", stride ", py_tuple(stride), " and dilation ", py_tuple(dilation),
              " must be positive and padding ", py_tuple(padding), " non-negative");
    TVC_CHECK(padding_str != "same" || stride[i] == 1, name,
              ": padding='same' is not supported for strided convolutions");
  }
  Shape wshape{out_channels, in_channels / o.groups};
  wshape.insert(wshape.end(), kernel_size.begin(), kernel_size.end());
  register_parameter("weight", empty(wshape));
  register_parameter("bias", o.bias ? empty({out_channels}) : Tensor());
  reset_parameters();
}

void ConvNd::reset_parameters() { init_weight_and_bias(weight(), bias()); }

std::string ConvNd::extra_repr() const {
  std::string s =
      cat_str(in_channels, ", ", out_channels, ", kernel_size=", py_tuple(kernel_size), ", stride=", py_tuple(stride));
  if (!padding_str.empty())
    s += ", padding=" + padding_str;
  else if (std::any_of(padding.begin(), padding.end(), [](int64_t p) { return p != 0; }))
    s += ", padding=" + py_tuple(padding);
  if (std::any_of(dilation.begin(), dilation.end(), [](int64_t d) { return d != 1; }))
    s += ", dilation=" + py_tuple(dilation);
  if (groups != 1) s += cat_str(", groups=", groups);
  if (!bias().defined()) s += ", bias=False";
  if (padding_mode != PaddingMode::Zeros) s += cat_str(", padding_mode=", to_string(padding_mode));
  return s;
}

std::pair<Tensor, std::vector<int64_t>> ConvNd::padded_input(const Tensor& x) const {
  size_t n = kernel_size.size();
  std::vector<int64_t> conv_padding(n), pads(2 * n);  // pads: last dim first, as tvc::pad
  bool asymmetric = false;
  for (size_t i = 0; i < n; ++i) {
    int64_t left = padding[i], right = padding[i];
    if (padding_str == "same") {
      int64_t total = dilation[i] * (kernel_size[i] - 1);
      left = total / 2, right = total - left;  // the odd one goes at the end, as PyTorch
      asymmetric |= left != right;
    }
    conv_padding[i] = left;
    pads[2 * (n - 1 - i)] = left, pads[2 * (n - 1 - i) + 1] = right;
  }
  if (padding_mode == PaddingMode::Zeros && !asymmetric) return {x, conv_padding};
  PadMode mode = padding_mode == PaddingMode::Reflect     ? PadMode::Reflect
                 : padding_mode == PaddingMode::Replicate ? PadMode::Replicate
                 : padding_mode == PaddingMode::Circular  ? PadMode::Circular
                                                          : PadMode::Constant;
  return {pad(x, pads, mode), std::vector<int64_t>(n, 0)};
}

Tensor Conv1d::forward(const Tensor& x) {
  auto [input, p] = padded_input(x);
  return conv1d(input, weight(), bias(), stride[0], p[0], dilation[0], groups);
}

Tensor Conv2d::forward(const Tensor& x) {
  auto [input, p] = padded_input(x);
  return conv2d(input, weight(), bias(), {stride[0], stride[1]}, {p[0], p[1]}, {dilation[0], dilation[1]}, groups);
}

Tensor Conv2d::forward_epilogue(const Tensor& x, const Tensor& scale, const Tensor& shift, const Tensor& residual,
                                EpilogueActivation activation) {
  auto [input, p] = padded_input(x);
  return conv2d_epilogue(input, weight(), scale, shift, residual, activation, {stride[0], stride[1]}, {p[0], p[1]},
                         {dilation[0], dilation[1]}, groups);
}

Tensor Conv2d::forward_epilogue_max_pool(const Tensor& x, const Tensor& scale, const Tensor& shift,
                                         EpilogueActivation activation, const MaxPool2d& pool) {
  auto [input, p] = padded_input(x);
  return conv2d_epilogue_max_pool2d(input, {weight(), scale, shift, activation}, {stride[0], stride[1]}, {p[0], p[1]},
                                    {dilation[0], dilation[1]}, groups, pool.kernel_size.pair("MaxPool2d kernel_size"),
                                    pool.stride.pair("MaxPool2d stride"), pool.padding.pair("MaxPool2d padding"),
                                    pool.dilation.pair("MaxPool2d dilation"), pool.ceil_mode);
}

// ---------------------------------------------------------------- fused inference

namespace {

// The epilogue activation module m is (None for no module); nullopt when conv_norm_activation
// does not fuse it.
std::optional<EpilogueActivation> epilogue_activation(const Module* m) {
  if (!m) return EpilogueActivation::None;
  const std::type_info& t = typeid(*m);
  if (t == typeid(ReLU)) return EpilogueActivation::ReLU;
  if (t == typeid(ReLU6)) return EpilogueActivation::ReLU6;
  if (t == typeid(SiLU)) return EpilogueActivation::SiLU;
  if (t == typeid(Hardswish)) return EpilogueActivation::Hardswish;
  return std::nullopt;
}

// The values of a per-channel tensor t (n of them; fill where t is undefined) as double, read in
// place when it is a dense CPU float32/float64 tensor (no kernel, no copy: this runs per layer).
std::vector<double> channel_values(const Tensor& t, size_t n, double fill) {
  if (!t.defined()) return std::vector<double>(n, fill);
  if (t.device() == Device::CPU && t.is_contiguous()) {
    if (t.dtype() == DType::Float32) return {t.data_ptr<float>(), t.data_ptr<float>() + t.numel()};
    if (t.dtype() == DType::Float64) return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
  }
  return t.to_vector();
}

// An evaluation-mode batch norm after conv as the per-channel (scale, shift) of conv2d_epilogue,
// in dtype on device, computed in double.
std::pair<Tensor, Tensor> fold_batch_norm(const Conv2d& conv, const BatchNorm& bn, DType dtype, Device device) {
  NoGradGuard no_grad;
  const size_t C = static_cast<size_t>(bn.num_features);
  const std::vector<double> mean = channel_values(bn.running_mean(), C, 0),
                            var = channel_values(bn.running_var(), C, 1), weight = channel_values(bn.weight(), C, 1),
                            bias = channel_values(bn.bias(), C, 0), conv_bias = channel_values(conv.bias(), C, 0);
  const double eps = bn.eps.to_double();
  // Written straight in dtype where it is float32 or float64 (no conversion kernels).
  const DType direct = dtype == DType::Float32 ? DType::Float32 : DType::Float64;
  Tensor scale = empty({bn.num_features}, {.dtype = direct}), shift = empty_like(scale);
  auto fill = [&]<typename T>(T* sp, T* hp) {
    for (size_t c = 0; c < C; ++c) {
      const double sc = weight[c] / std::sqrt(var[c] + eps);
      sp[c] = static_cast<T>(sc);
      hp[c] = static_cast<T>(bias[c] + (conv_bias[c] - mean[c]) * sc);
    }
  };
  if (direct == DType::Float32)
    fill(scale.data_ptr<float>(), shift.data_ptr<float>());
  else
    fill(scale.data_ptr<double>(), shift.data_ptr<double>());
  return {scale.to(dtype).to(device), shift.to(dtype).to(device)};
}

// Per-channel tensors made from a batch norm (by make: a pair, the second maybe undefined) kept
// with its running variance's storage (Storage::derived, under the key {key, the variance's offset,
// dtype, device}) with what else they were made from: the sources, each as its storage (held, so
// that no other storage takes its address), offset and version, and eps. A later call whose
// sources all match reuses them; any in-place write to one of them (the variance's included) bumps
// its version, and a replaced tensor has another storage or offset, so they are made again.
struct KeptPerChannel {
  struct Source {
    std::shared_ptr<Storage> storage;  // null for an undefined tensor
    int64_t offset;
    uint64_t version;
    bool operator==(const Source&) const = default;
  };
  std::vector<Source> sources;
  double eps;
  std::pair<Tensor, Tensor> tensors;
};
template <typename Make>
std::pair<Tensor, Tensor> kept_per_channel(const BatchNorm& bn, int64_t key, std::initializer_list<Tensor> from,
                                           DType dtype, Device device, Make make) {
  const Tensor var = bn.running_var();
  std::vector<KeptPerChannel::Source> sources;
  bool keep = var.storage()->keeps_derived();
  for (const Tensor& t : from) {
    if (!t.defined()) {
      sources.push_back({nullptr, 0, 0});
      continue;
    }
    keep = keep && t.storage()->keeps_derived();
    sources.push_back({t.storage(), t.storage_offset(), t.version()});
  }
  const double eps = bn.eps.to_double();
  if (!keep) return make();
  const Storage::DerivedKey derived_key{key, var.storage_offset(), static_cast<int64_t>(dtype),
                                        static_cast<int64_t>(device)};
  if (auto kept = std::static_pointer_cast<const KeptPerChannel>(var.storage()->derived(derived_key));
      kept && kept->sources == sources && kept->eps == eps)
    return kept->tensors;
  std::pair<Tensor, Tensor> tensors = make();
  var.storage()->set_derived(derived_key,
                             std::make_shared<const KeptPerChannel>(KeptPerChannel{sources, eps, tensors}));
  return tensors;
}

// fold_batch_norm's (scale, shift), kept (kept_per_channel).
constexpr int64_t kFoldedBatchNormKey = 0x466f6c64;  // "Fold": not a kernel's weight form
std::pair<Tensor, Tensor> folded_batch_norm(const Conv2d& conv, const BatchNorm& bn, DType dtype, Device device) {
  return kept_per_channel(bn, kFoldedBatchNormKey, {bn.running_mean(), bn.weight(), bn.bias(), conv.bias()}, dtype,
                          device, [&] { return fold_batch_norm(conv, bn, dtype, device); });
}

// An evaluation-mode batch norm's scale, rsqrt(running_var + eps) * weight in dtype, by
// batch_norm's own ops (so its values), kept (kept_per_channel): DenseNet's 120 batch norms made it
// by three small ops each on every forward (DenseNet-121 at batch 1, Sapphire Rapids, 2 threads,
// alternating: 30.8 -> 30.1 ms).
constexpr int64_t kBatchNormScaleKey = 0x5363616c;  // "Scal"
Tensor batch_norm_scale(const BatchNorm& bn, DType dtype) {
  auto make = [&] {
    NoGradGuard no_grad;
    Tensor scale = rsqrt(bn.running_var().to(dtype) + bn.eps.to_double());
    if (bn.weight().defined()) scale = mul(scale, bn.weight());
    return std::pair{scale, Tensor()};
  };
  return kept_per_channel(bn, kBatchNormScaleKey, {bn.weight()}, dtype, bn.running_var().device(), make).first;
}

// Maps of more positions than this take a squeeze-excitation's scale folded into a pointwise
// convolution's weights, one (O, C) weight per sample (a grouped convolution of groups N). Below
// it the convolution would have done several samples' maps in one GEMM with the shared weight,
// which the per-sample weights prevent: measured on Zen 4 at batch 8, 2 threads, the folded form
// is 1.1-1.6x faster from 28x28 maps up, 1.3x slower at 7x7. At 14x14 the shared weight now reads
// its kept A panels (weight_form.h), which the per-sample weights cannot keep: on Zen 3 (AVX2, 2
// threads, the two forms alternating) x times the scale and the shared weight take 0.86-0.92x the
// folded form's time at batch 8 and 0.93x at batch 1 (MobileNet v3's and EfficientNet's 480 and
// 672 -> 80-160); at 28x28 the folded form stays 0.92-0.97x, at 56x56 0.77x.
constexpr int64_t kFoldedInputScalePositions = 14 * 14;

// Whether conv (a 1x1 convolution without padding, stride or groups) of x (N, C, H, W), dense
// NCHW, takes input_scale (N, C, 1, 1) into its weights (same dtype, float32 or float64).
bool folds_input_scale(const Conv2d& conv, const Tensor& x, const Tensor& input_scale, const Tensor& residual) {
  const Tensor& w = conv.weight();
  return conv.kernel_size == std::vector<int64_t>{1, 1} && conv.stride == std::vector<int64_t>{1, 1} &&
         conv.padding == std::vector<int64_t>{0, 0} && conv.groups == 1 && x.is_contiguous() &&
         (x.dtype() == DType::Float32 || x.dtype() == DType::Float64) && w.dtype() == x.dtype() &&
         input_scale.dtype() == x.dtype() && input_scale.shape() == Shape{x.size(0), x.size(1), 1, 1} &&
         x.size(2) * x.size(3) > kFoldedInputScalePositions && (!residual.defined() || residual.is_contiguous());
}

// norm as the BatchNorm2d whose forward_relu may stand for norm then activation (calls without
// hooks): norm a BatchNorm2d in training mode and activation a ReLU (those exact classes), neither
// with hooks; else null. (In evaluation mode the folded forms above take them.)
BatchNorm* relu_after_batch_norm(Module& norm, Module* activation) {
  if (typeid(norm) != typeid(BatchNorm2d) || !activation || typeid(*activation) != typeid(ReLU) ||
      norm.has_call_hooks() || activation->has_call_hooks())
    return nullptr;
  auto* bn = static_cast<BatchNorm*>(&norm);
  return bn->is_training() ? bn : nullptr;
}

// conv, norm and activation as one convolution with its epilogue (the norm folded into scale and
// shift) for input x, with the other tensors of the call: where conv is a Conv2d, norm a
// BatchNorm2d in evaluation mode with running statistics, activation null or one that
// epilogue_activation names, none of them has hooks, x is (N, C, H, W) on a device with the fused
// kernel and autograd does not record; else nullopt.
std::optional<ConvEpilogueLayer> folded_layer(Module& conv, Module& norm, Module* activation, const Tensor& x,
                                              std::initializer_list<Tensor> others) {
  const std::optional<EpilogueActivation> act = epilogue_activation(activation);
  auto* conv2d = typeid(conv) == typeid(Conv2d) ? static_cast<Conv2d*>(&conv) : nullptr;
  auto* bn = typeid(norm) == typeid(BatchNorm2d) ? static_cast<BatchNorm*>(&norm) : nullptr;
  std::vector<Tensor> inputs(others);
  if (conv2d && bn) inputs.insert(inputs.end(), {x, conv2d->weight(), conv2d->bias(), bn->weight(), bn->bias()});
  const bool fuse = act && conv2d && bn && !bn->is_training() && bn->running_mean().defined() && x.dim() == 4 &&
                    !conv.has_call_hooks() && !norm.has_call_hooks() && !(activation && activation->has_call_hooks()) &&
                    !autograd::any_requires_grad(inputs) && bn->num_features == conv2d->out_channels &&
                    kernel_registry().supports(Op::conv2d_epilogue, x.device());
  if (!fuse) return std::nullopt;
  const auto [scale, shift] = folded_batch_norm(*conv2d, *bn, x.dtype(), x.device());
  return ConvEpilogueLayer{conv2d->weight(), scale, shift, *act};
}

}  // namespace

Tensor conv_norm_activation(Module& conv, Module& norm, Module* activation, const Tensor& x, const Tensor& residual,
                            const Tensor& input_scale) {
  const std::optional<ConvEpilogueLayer> layer = folded_layer(conv, norm, activation, x, {residual, input_scale});
  if (!layer) {
    const Tensor z = conv(input_scale.defined() ? x * input_scale : x);
    if (!residual.defined())
      if (BatchNorm* with_relu = relu_after_batch_norm(norm, activation)) return with_relu->forward_relu(z);
    Tensor y = norm(z);
    if (residual.defined()) y = y + residual;
    return activation ? (*activation)(y) : y;
  }
  auto* conv2d = static_cast<Conv2d*>(&conv);
  const Tensor &scale = layer->scale, &shift = layer->shift;
  const EpilogueActivation act = layer->activation;
  if (!input_scale.defined() || !folds_input_scale(*conv2d, x, input_scale, residual))
    return conv2d->forward_epilogue(input_scale.defined() ? x * input_scale : x, scale, shift, residual, act);
  // conv(x * s) = conv with the weight times s, per sample: sample n's channels are group n of
  // one (1, N * C, H, W) input, its weight W * s[n] (O, C), its epilogue the same.
  NoGradGuard no_grad;
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), O = conv2d->out_channels;
  const Tensor weights =
      (conv2d->weight().reshape({1, O, C}) * input_scale.reshape({N, 1, C})).reshape({N * O, C, 1, 1});
  auto per_sample = [&](const Tensor& t) { return t.reshape({1, O}).expand({N, O}).reshape({N * O}); };
  const Tensor y = conv2d_epilogue(x.reshape({1, N * C, H, W}), weights, per_sample(scale), per_sample(shift),
                                   residual.defined() ? residual.reshape({1, N * O, H, W}) : Tensor(), act, {1, 1},
                                   {0, 0}, {1, 1}, N);
  return y.reshape({N, O, H, W});
}

Tensor conv_norm_activation_max_pool(Module& conv, Module& norm, Module* activation, Module& pool, const Tensor& x) {
  const std::optional<ConvEpilogueLayer> layer = folded_layer(conv, norm, activation, x, {});
  if (!layer || typeid(pool) != typeid(MaxPool2d) || pool.has_call_hooks())
    return pool(conv_norm_activation(conv, norm, activation, x));
  return static_cast<Conv2d&>(conv).forward_epilogue_max_pool(x, layer->scale, layer->shift, layer->activation,
                                                              static_cast<const MaxPool2d&>(pool));
}

namespace {

// Whether conv is a Conv2d that inverted_residual can take as the layer kind says: 1x1 without
// stride, padding or groups (pointwise), or depthwise (groups = channels in = channels out), with
// zero padding on both sides; neither dilated.
bool inverted_residual_conv(const Module& conv, bool pointwise) {
  if (typeid(conv) != typeid(Conv2d)) return false;
  const auto& c = static_cast<const Conv2d&>(conv);
  const bool plain =
      c.dilation == std::vector<int64_t>{1, 1} && c.padding_mode == PaddingMode::Zeros && c.padding_str != "same";
  if (pointwise)
    return plain && c.kernel_size == std::vector<int64_t>{1, 1} && c.stride == std::vector<int64_t>{1, 1} &&
           c.padding == std::vector<int64_t>{0, 0} && c.groups == 1;
  return plain && c.groups == c.in_channels && c.groups == c.out_channels;
}

}  // namespace

Tensor inverted_residual_layers(const ConvNormActivationRefs& expand, const ConvNormActivationRefs& depthwise,
                                const ConvNormActivationRefs& project, const Tensor& x, bool add_input) {
  TVC_CHECK(depthwise.conv && depthwise.norm && (!add_input || project.conv),
            "inverted_residual_layers: needs a depthwise convolution and norm, and a projection to add the input to");
  auto folded = [&x](const ConvNormActivationRefs& layer, bool pointwise) -> std::optional<ConvEpilogueLayer> {
    if (!layer.conv) return ConvEpilogueLayer{};
    if (!inverted_residual_conv(*layer.conv, pointwise)) return std::nullopt;
    return folded_layer(*layer.conv, *layer.norm, layer.activation, x, {});
  };
  const std::optional<ConvEpilogueLayer> e = folded(expand, true), d = folded(depthwise, false),
                                         p = folded(project, true);
  if (e && d && p && x.dim() == 4) {
    const auto& dw = static_cast<const Conv2d&>(*depthwise.conv);
    return inverted_residual(x, *e, *d, {dw.stride[0], dw.stride[1]}, {dw.padding[0], dw.padding[1]}, *p, add_input);
  }
  Tensor y = expand.conv ? conv_norm_activation(*expand.conv, *expand.norm, expand.activation, x) : x;
  y = conv_norm_activation(*depthwise.conv, *depthwise.norm, depthwise.activation, y);
  if (!project.conv) return y;
  return conv_norm_activation(*project.conv, *project.norm, project.activation, y, add_input ? x : Tensor());
}

namespace {

// The inputs (N, C_i, H, W) with each run of adjacent channel slices of one tensor (same storage
// and strides, each starting where the one before ends) as the one view they make.
std::vector<Tensor> adjacent_channels_joined(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> joined;
  for (const Tensor& x : inputs) {
    if (!joined.empty()) {
      const Tensor& last = joined.back();
      if (x.storage() == last.storage() && x.strides() == last.strides() && x.size(0) == last.size(0) &&
          x.size(2) == last.size(2) && x.size(3) == last.size(3) &&
          x.storage_offset() == last.storage_offset() + last.size(1) * last.stride(1)) {
        joined.back() = last.as_strided({x.size(0), last.size(1) + x.size(1), x.size(2), x.size(3)}, x.strides(),
                                        last.storage_offset());
        continue;
      }
    }
    joined.push_back(x);
  }
  return joined;
}

}  // namespace

Tensor concat_norm_activation(Module& norm, Module* activation, const std::vector<Tensor>& inputs) {
  auto* bn = typeid(norm) == typeid(BatchNorm2d) ? static_cast<BatchNorm*>(&norm) : nullptr;
  const bool relu = activation && typeid(*activation) == typeid(ReLU);
  bool fuse = bn && !bn->is_training() && bn->running_mean().defined() && (!activation || relu) && !inputs.empty() &&
              !norm.has_call_hooks() && !(activation && activation->has_call_hooks()) &&
              !autograd::any_requires_grad({bn->weight(), bn->bias()}) &&
              kernel_registry().supports(Op::channel_affine, inputs[0].device());
  // The per-channel tensors go to the kernel as they are: they must be of the inputs' dtype.
  if (fuse)
    for (const Tensor& t : {bn->weight(), bn->bias()}) fuse = fuse && (!t.defined() || t.dtype() == inputs[0].dtype());
  int64_t channels = 0;
  for (const Tensor& x : inputs) {
    fuse = fuse && x.dim() == 4 && x.stride(3) == 1 && x.stride(2) == x.size(3) &&
           x.stride(1) == x.size(2) * x.size(3) && x.dtype() == inputs[0].dtype() &&
           (x.dtype() == DType::Float32 || x.dtype() == DType::Float64) && x.device() == inputs[0].device() &&
           x.size(0) == inputs[0].size(0) && x.size(2) == inputs[0].size(2) && x.size(3) == inputs[0].size(3) &&
           !x.requires_grad();
    if (fuse) channels += x.size(1);
  }
  if (!fuse || channels != bn->num_features) {
    const Tensor x = inputs.size() == 1 ? inputs[0] : cat(inputs, 1);
    if (BatchNorm* with_relu = relu_after_batch_norm(norm, activation)) return with_relu->forward_relu(x);
    Tensor y = norm(x);
    return activation ? (*activation)(y) : y;
  }
  // batch_norm's evaluation-mode scale and shift, by the same ops (so the same values), then
  // each input's channels through channel_affine straight into its channels of the result.
  NoGradGuard no_grad;
  const DType dtype = inputs[0].dtype();
  const Tensor scale = batch_norm_scale(*bn, dtype);
  const Tensor shift =
      bn->bias().defined() ? bn->bias() : zeros({channels}, {.dtype = dtype, .device = inputs[0].device()});
  const Tensor mean = bn->running_mean().to(dtype);
  const Tensor out = detail::empty_with_format({inputs[0].size(0), channels, inputs[0].size(2), inputs[0].size(3)},
                                               dtype, MemoryFormat::Contiguous);
  const ChannelAffineParams params{.relu = relu};
  int64_t first = 0;
  for (const Tensor& x : adjacent_channels_joined(inputs)) {
    const int64_t c = x.size(1);
    // t's channels [first, first + c) broadcast to x's shape, as one view (not a narrow, a reshape
    // and an expand, each a view of its own: this runs for every norm of a dense block).
    auto per_channel = [&](const Tensor& t) {
      return t.as_strided(x.shape(), {0, t.stride(0), 0, 0}, t.storage_offset() + first * t.stride(0));
    };
    detail::run(Op::channel_affine, {x, per_channel(mean), per_channel(scale), per_channel(shift)},
                {out.narrow(1, first, c)}, &params);
    first += c;
  }
  return out;
}

Tensor linear_activation(Module& linear, Module& activation, const Tensor& x) {
  auto* fc = typeid(linear) == typeid(Linear) ? static_cast<Linear*>(&linear) : nullptr;
  auto* gelu = typeid(activation) == typeid(GELU) ? static_cast<GELU*>(&activation) : nullptr;
  if (fc && gelu && gelu->approximate == GeluApproximate::None && fc->bias().defined() && !linear.has_call_hooks() &&
      !activation.has_call_hooks())
    return linear_gelu(x, fc->weight(), fc->bias());
  return activation(linear(x));
}

Tensor linear_activation_linear(Module& linear1, Module& activation, Module& linear2, const Tensor& x) {
  auto* fc1 = typeid(linear1) == typeid(Linear) ? static_cast<Linear*>(&linear1) : nullptr;
  auto* fc2 = typeid(linear2) == typeid(Linear) ? static_cast<Linear*>(&linear2) : nullptr;
  auto* gelu = typeid(activation) == typeid(GELU) ? static_cast<GELU*>(&activation) : nullptr;
  if (fc1 && fc2 && gelu && gelu->approximate == GeluApproximate::None && fc1->bias().defined() &&
      fc2->bias().defined() && !linear1.has_call_hooks() && !activation.has_call_hooks() && !linear2.has_call_hooks())
    return linear_gelu_linear(x, fc1->weight(), fc1->bias(), fc2->weight(), fc2->bias());
  return linear2(linear_activation(linear1, activation, x));
}

// ---------------------------------------------------------------- bfloat16 inference

int64_t convert_weights_to_bfloat16(Module& model) {
  int64_t converted = 0;
  for (const std::shared_ptr<Module>& m : model.modules()) {
    Tensor weight;
    if (dynamic_cast<Conv2d*>(m.get()) || dynamic_cast<Linear*>(m.get())) weight = m->parameter("weight");
    if (dynamic_cast<MultiheadAttention*>(m.get())) weight = m->parameter("in_proj_weight");
    if (!weight.defined() || weight.dtype() != DType::Float32) continue;
    m->convert_tensors([&](const Tensor& t) { return t.is_same(weight) ? t.to(DType::BFloat16) : t; });
    ++converted;
  }
  return converted;
}

// ---------------------------------------------------------------- normalisation

BatchNorm::BatchNorm(int64_t num_features, const BatchNormOptions& o)
    : num_features(num_features),
      eps(o.eps),
      momentum(o.momentum),
      affine(o.affine),
      track_running_stats(o.track_running_stats) {
  TVC_CHECK(num_features > 0, "BatchNorm: num_features must be positive, got ", num_features);
  register_parameter("weight", affine ? empty({num_features}) : Tensor());
  register_parameter("bias", affine ? empty({num_features}) : Tensor());
  register_buffer("running_mean", track_running_stats ? zeros({num_features}) : Tensor());
  register_buffer("running_var", track_running_stats ? ones({num_features}) : Tensor());
  register_buffer("num_batches_tracked", track_running_stats ? zeros({}, {.dtype = DType::Int64}) : Tensor());
  reset_parameters();
  // Files saved before BatchNorm had num_batches_tracked (torch < 0.4.1, which made some of
  // torchvision's weight files) lack it, and PyTorch loads 0 for it. PyTorch decides by the
  // file's version metadata, which tvc does not keep: here a dict with this module's
  // running_mean but no num_batches_tracked gets 0.
  register_load_state_dict_pre_hook([](Module& m, StateDict& sd, const std::string& prefix, bool,
                                       std::vector<std::string>&, std::vector<std::string>&,
                                       std::vector<std::string>&) {
    if (static_cast<BatchNorm&>(m).track_running_stats && sd.contains(prefix + "running_mean") &&
        !sd.contains(prefix + "num_batches_tracked"))
      sd.insert(prefix + "num_batches_tracked", zeros({}, {.dtype = DType::Int64}));
  });
}

void BatchNorm::reset_running_stats() {
  if (!track_running_stats) return;
  init::zeros_(running_mean());
  init::ones_(running_var());
  init::zeros_(num_batches_tracked());
}

void BatchNorm::reset_parameters() {
  reset_running_stats();
  if (!affine) return;
  init::ones_(weight());
  init::zeros_(bias());
}

Tensor BatchNorm::forward(const Tensor& x) { return normalised(x, false); }

Tensor BatchNorm::forward_relu(const Tensor& x) { return normalised(x, true); }

Tensor BatchNorm::normalised(const Tensor& x, bool then_relu) {
  check_input_dim(x);
  // Batch statistics in training, or when there are no running ones; the running stats are
  // updated (and batches counted) in training when tracked.
  bool use_batch_stats = training_ || !running_mean().defined();
  bool use_running = !training_ || track_running_stats;
  std::optional<double> m;
  if (momentum) m = momentum->to_double();
  return (then_relu ? batch_norm_relu : batch_norm)(
      x, use_running ? running_mean() : Tensor(), use_running ? running_var() : Tensor(), weight(), bias(),
      use_batch_stats, m, eps.to_double(), training_ && track_running_stats ? num_batches_tracked() : Tensor());
}

std::string BatchNorm::extra_repr() const {
  return cat_str(num_features, ", eps=", py_repr(eps), ", momentum=", momentum ? py_repr(*momentum) : "None",
                 ", affine=", py_bool(affine), ", track_running_stats=", py_bool(track_running_stats));
}

void BatchNorm1d::check_input_dim(const Tensor& x) const {
  TVC_CHECK(x.dim() == 2 || x.dim() == 3, "BatchNorm1d: expected 2D or 3D input (got ", x.dim(), "D input of shape ",
            x.shape(), ")");
}

void BatchNorm2d::check_input_dim(const Tensor& x) const {
  TVC_CHECK(x.dim() == 4, "BatchNorm2d: expected 4D input (got ", x.dim(), "D input of shape ", x.shape(), ")");
}

LayerNorm::LayerNorm(Shape normalized_shape, Scalar eps, bool elementwise_affine)
    : normalized_shape(std::move(normalized_shape)), eps(eps), elementwise_affine(elementwise_affine) {
  register_parameter("weight", elementwise_affine ? empty(this->normalized_shape) : Tensor());
  register_parameter("bias", elementwise_affine ? empty(this->normalized_shape) : Tensor());
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (!elementwise_affine) return;
  init::ones_(weight());
  init::zeros_(bias());
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, normalized_shape, weight(), bias(), eps.to_double());
}

std::string LayerNorm::extra_repr() const {
  return cat_str(py_tuple(normalized_shape), ", eps=", py_repr(eps),
                 ", elementwise_affine=", py_bool(elementwise_affine));
}

GroupNorm::GroupNorm(int64_t num_groups, int64_t num_channels, Scalar eps, bool affine)
    : num_groups(num_groups), num_channels(num_channels), eps(eps), affine(affine) {
  TVC_CHECK(num_groups > 0 && num_channels % num_groups == 0, "GroupNorm: num_channels (", num_channels,
            ") must be divisible by num_groups (", num_groups, ")");
  register_parameter("weight", affine ? empty({num_channels}) : Tensor());
  register_parameter("bias", affine ? empty({num_channels}) : Tensor());
  reset_parameters();
}

void GroupNorm::reset_parameters() {
  if (!affine) return;
  init::ones_(weight());
  init::zeros_(bias());
}

Tensor GroupNorm::forward(const Tensor& x) { return group_norm(x, num_groups, weight(), bias(), eps.to_double()); }

std::string GroupNorm::extra_repr() const {
  return cat_str(num_groups, ", ", num_channels, ", eps=", py_repr(eps), ", affine=", py_bool(affine));
}

Dropout::Dropout(Scalar p, bool inplace) : p(p), inplace(inplace) {
  TVC_CHECK(p.to_double() >= 0 && p.to_double() <= 1,
            "Dropout: dropout probability has to be between 0 and 1, but got ", py_repr(p));
}

Tensor Dropout::forward(const Tensor& x) {
  auto fn = [this](const Tensor& t) { return dropout(t, p.to_double(), training_); };
  return inplace && training_ ? compute_inplace(x, fn) : fn(x);
}

std::string Dropout::extra_repr() const { return "p=" + py_repr(p) + ", inplace=" + py_bool(inplace); }

// ---------------------------------------------------------------- activations

Tensor Activation::forward(const Tensor& x) {
  if (!inplace) return function(x);
  Tensor y = x;
  function_(y);
  return y;
}

void Activation::function_(Tensor& x) const {
  compute_inplace(x, [this](const Tensor& t) { return function(t); });
}

std::string LeakyReLU::extra_repr() const {
  return "negative_slope=" + py_repr(negative_slope) + (inplace ? ", inplace=True" : "");
}

std::string Softplus::extra_repr() const { return "beta=" + py_repr(beta) + ", threshold=" + py_repr(threshold); }

// ---------------------------------------------------------------- pooling

MaxPool2d::MaxPool2d(Sizes kernel_size, MaxPool2dOptions o)
    : kernel_size(kernel_size),
      stride(o.stride.value_or(kernel_size)),
      padding(o.padding),
      dilation(o.dilation),
      ceil_mode(o.ceil_mode) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, kernel_size.pair("MaxPool2d kernel_size"), stride.pair("MaxPool2d stride"),
                    padding.pair("MaxPool2d padding"), dilation.pair("MaxPool2d dilation"), ceil_mode);
}

std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + kernel_size.str() + ", stride=" + stride.str() + ", padding=" + padding.str() +
         ", dilation=" + dilation.str() + ", ceil_mode=" + py_bool(ceil_mode);
}

AvgPool2d::AvgPool2d(Sizes kernel_size, AvgPool2dOptions o)
    : kernel_size(kernel_size),
      stride(o.stride.value_or(kernel_size)),
      padding(o.padding),
      ceil_mode(o.ceil_mode),
      count_include_pad(o.count_include_pad),
      divisor_override(o.divisor_override) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, kernel_size.pair("AvgPool2d kernel_size"), stride.pair("AvgPool2d stride"),
                    padding.pair("AvgPool2d padding"), ceil_mode, count_include_pad, divisor_override);
}

std::string AvgPool2d::extra_repr() const {
  return "kernel_size=" + kernel_size.str() + ", stride=" + stride.str() + ", padding=" + padding.str();
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  return adaptive_avg_pool2d(x, output_size.pair("AdaptiveAvgPool2d output_size"));
}

Tensor AdaptiveMaxPool2d::forward(const Tensor& x) {
  return adaptive_max_pool2d(x, output_size.pair("AdaptiveMaxPool2d output_size"));
}

}  // namespace tvc::nn
