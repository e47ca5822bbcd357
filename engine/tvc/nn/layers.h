// torch.nn layers: same parameter and buffer names, default initialisation and repr as PyTorch.
//
// Shape legend: N batch, C channels, L length, H,W height and width, * any trailing dims.
// Constructor arguments follow PyTorch's order; optional ones of the larger layers come in an
// options struct meant for designated initialisers:
//   nn::Conv2d(3, 64, 7, {.stride = 2, .padding = 3, .bias = false})
//   nn::BatchNorm2d(64, {.eps = 1e-3, .momentum = std::nullopt})
// Numbers that PyTorch prints as given (Dropout's p, eps, ...) are Scalars, so an int prints
// as an int ("p=0") and a double as Python's float repr ("eps=1e-05").
// Each layer reaches its tensors through the registry (weight(), bias(), ...), see module.h.
#pragma once

#include <array>
#include <concepts>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "tvc/nn/module.h"
#include "tvc/ops.h"

namespace tvc::nn {

// Sizes given as one int (for every spatial dim) or a tuple, printed as given: 2 or (3, 2).
struct Sizes {
  std::vector<int64_t> values{};
  bool scalar = true;
  Sizes(int64_t v) : values{v} {}  // NOLINT: implicit like Python's int
  Sizes(std::initializer_list<int64_t> v) : values(v), scalar(false) {}
  // One value per dim for n spatial dims; throws naming who when a tuple has another length.
  std::vector<int64_t> expand(size_t n, const std::string& who) const;
  std::array<int64_t, 2> pair(const std::string& who) const;
  std::string str() const;  // "2", "(3, 2)", "(3,)"
};

// ---------------------------------------------------------------- linear

// y = x W^T + b. x (*, in_features) -> (*, out_features). weight (out, in), bias (out), both
// U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_(a=sqrt(5)) for the weight).
class Linear : public Cloneable<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  void reset_parameters();
  Tensor weight() const { return parameter("weight"); }
  Tensor bias() const { return parameter("bias"); }

  int64_t in_features, out_features;
};

// Returns x unchanged.
class Identity : public Cloneable<Identity> {
 public:
  Tensor forward(const Tensor& x) override { return x; }
};

// Flattens dims start_dim..end_dim: (N, C, H, W) -> (N, C*H*W) by default.
class Flatten : public Cloneable<Flatten> {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override { return x.flatten(start_dim, end_dim); }
  std::string extra_repr() const override;

  int64_t start_dim, end_dim;
};

// ---------------------------------------------------------------- convolution

// Conv options after kernel_size, in PyTorch's order. padding: int, tuple, "same" (stride 1
// only; odd total padding puts the extra row/column at the end, as PyTorch) or "valid".
struct ConvPadding {
  Sizes sizes = 0;
  std::string mode{};  // "", "same" or "valid"
  template <std::integral I>
  ConvPadding(I v) : sizes(static_cast<int64_t>(v)) {}         // NOLINT
  ConvPadding(std::initializer_list<int64_t> v) : sizes(v) {}  // NOLINT
  ConvPadding(const char* m) : sizes(0), mode(m) {}            // NOLINT
};
struct ConvOptions {
  Sizes stride = 1;
  ConvPadding padding = 0;
  Sizes dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  PaddingMode padding_mode = PaddingMode::Zeros;
};

// Shared by Conv1d and Conv2d (PyTorch's _ConvNd): weight (out, in/groups, *kernel_size),
// bias (out); kaiming_uniform_(a=sqrt(5)) and U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
class ConvNd : public Module {
 public:
  std::string extra_repr() const override;
  void reset_parameters();
  Tensor weight() const { return parameter("weight"); }
  Tensor bias() const { return parameter("bias"); }

  int64_t in_channels, out_channels;
  std::vector<int64_t> kernel_size, stride, padding, dilation;
  std::string padding_str;  // "same" / "valid" when padding was given as a string
  int64_t groups;
  PaddingMode padding_mode;

 protected:
  ConvNd(size_t dims, const std::string& name, int64_t in_channels, int64_t out_channels, const Sizes& kernel_size,
         const ConvOptions& options);
  // The input padded as padding_mode (or asymmetric "same") needs, and the padding left for
  // the convolution itself.
  std::pair<Tensor, std::vector<int64_t>> padded_input(const Tensor& x) const;
};

// x (N, C_in, L) or (C_in, L) -> (N, C_out, L_out).
class Conv1d : public Cloneable<Conv1d, ConvNd> {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, Sizes kernel_size, ConvOptions options = {})
      : Cloneable(1, "Conv1d", in_channels, out_channels, kernel_size, options) {}
  Tensor forward(const Tensor& x) override;
};

class MaxPool2d;

// x (N, C_in, H, W) or (C_in, H, W) -> (N, C_out, H_out, W_out).
class Conv2d : public Cloneable<Conv2d, ConvNd> {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Sizes kernel_size, ConvOptions options = {})
      : Cloneable(2, "Conv2d", in_channels, out_channels, kernel_size, options) {}
  Tensor forward(const Tensor& x) override;
  // x (N, C_in, H, W) -> activation(conv(x) without its bias * scale + shift + residual), scale and
  // shift (C_out), residual undefined or of the output's shape: this convolution (its padding
  // mode included) through tvc::conv2d_epilogue. The caller folds the bias into shift.
  Tensor forward_epilogue(const Tensor& x, const Tensor& scale, const Tensor& shift, const Tensor& residual,
                          EpilogueActivation activation);
  // pool(forward_epilogue(x, scale, shift, no residual, activation)) through
  // tvc::conv2d_epilogue_max_pool2d: x (N, C_in, H, W) -> (N, C_out, Hp, Wp).
  Tensor forward_epilogue_max_pool(const Tensor& x, const Tensor& scale, const Tensor& shift,
                                   EpilogueActivation activation, const MaxPool2d& pool);
};

// ---------------------------------------------------------------- normalisation

// momentum nullopt = cumulative moving average (PyTorch's momentum=None).
struct BatchNormOptions {
  Scalar eps = 1e-5;
  std::optional<Scalar> momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
};

// Shared by BatchNorm1d/2d (PyTorch's _BatchNorm): parameters weight (ones), bias (zeros) when
// affine; buffers running_mean (zeros), running_var (ones), num_batches_tracked (int64 0) when
// track_running_stats (else registered None). Training updates the running stats and counts
// batches; eval normalises with the running stats.
class BatchNorm : public Module {
 public:
  std::string extra_repr() const override;
  Tensor forward(const Tensor& x) override;
  // relu(forward(x)) (the same running-statistics updates) through tvc::batch_norm_relu: in
  // training one pass for both and one for both gradients. conv_norm_activation and
  // concat_norm_activation call it for a BatchNorm2d in training mode followed by a ReLU.
  Tensor forward_relu(const Tensor& x);
  void reset_running_stats();
  void reset_parameters();
  Tensor weight() const { return parameter("weight"); }
  Tensor bias() const { return parameter("bias"); }
  Tensor running_mean() const { return buffer("running_mean"); }
  Tensor running_var() const { return buffer("running_var"); }
  Tensor num_batches_tracked() const { return buffer("num_batches_tracked"); }

  int64_t num_features;
  Scalar eps;
  std::optional<Scalar> momentum;
  bool affine, track_running_stats;

 protected:
  BatchNorm(int64_t num_features, const BatchNormOptions& options);
  virtual void check_input_dim(const Tensor& x) const = 0;

 private:
  // forward's batch norm, then a ReLU where then_relu is set.
  Tensor normalised(const Tensor& x, bool then_relu);
};

// x (N, C) or (N, C, L).
class BatchNorm1d : public Cloneable<BatchNorm1d, BatchNorm> {
 public:
  explicit BatchNorm1d(int64_t num_features, BatchNormOptions options = {}) : Cloneable(num_features, options) {}

 protected:
  void check_input_dim(const Tensor& x) const override;
};

// x (N, C, H, W).
class BatchNorm2d : public Cloneable<BatchNorm2d, BatchNorm> {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions options = {}) : Cloneable(num_features, options) {}

 protected:
  void check_input_dim(const Tensor& x) const override;
};

// Normalises over the trailing normalized_shape dims; weight ones, bias zeros (that shape).
class LayerNorm : public Cloneable<LayerNorm> {
 public:
  explicit LayerNorm(Shape normalized_shape, Scalar eps = 1e-5, bool elementwise_affine = true);
  explicit LayerNorm(int64_t normalized_shape, Scalar eps = 1e-5, bool elementwise_affine = true)
      : LayerNorm(Shape{normalized_shape}, eps, elementwise_affine) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  void reset_parameters();
  Tensor weight() const { return parameter("weight"); }
  Tensor bias() const { return parameter("bias"); }

  Shape normalized_shape;
  Scalar eps;
  bool elementwise_affine;
};

// x (N, C, *) with C = num_channels divisible by num_groups; weight ones, bias zeros (C).
class GroupNorm : public Cloneable<GroupNorm> {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, Scalar eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  void reset_parameters();
  Tensor weight() const { return parameter("weight"); }
  Tensor bias() const { return parameter("bias"); }

  int64_t num_groups, num_channels;
  Scalar eps;
  bool affine;
};

// Zeroes elements with probability p in training (scaling the rest by 1/(1-p)); identity in eval.
class Dropout : public Cloneable<Dropout> {
 public:
  explicit Dropout(Scalar p = 0.5, bool inplace = false);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  Scalar p;
  bool inplace;
};

// ---------------------------------------------------------------- fused inference

// activation(norm(conv(x)) + residual), residual optional (added before the activation, as a
// ResNet block adds its identity), activation optional (null): the modules' forwards one after
// the other, with their hooks; or, when conv is a Conv2d, norm a BatchNorm2d in evaluation mode
// with running statistics, activation null or a ReLU, ReLU6, SiLU or Hardswish (those exact
// classes), none of the three has hooks, x is (N, C, H, W) on a device with the fused kernel
// (the CPU) and autograd does not record, one fused convolution (tvc::conv2d_epilogue) with the norm folded in: scale =
// weight / sqrt(running_var + eps), shift = bias - running_mean * scale (+ the convolution's bias times scale),
// computed in double from the current values on each call. In training mode, with a BatchNorm2d, a ReLU (those exact
// classes), no residual and no hooks on either, the convolution then BatchNorm::forward_relu (batch norm and the ReLU
// in one pass, their gradients in one: tvc::batch_norm_relu). Forwards call it where torchvision's forward runs
// exactly this sequence; Sequential does for its children in order.
// activation(linear(x)) for an MLP's Linear and activation modules: their forwards one after
// the other, with their hooks; or, when linear is a Linear with a bias and activation a GELU of
// the erf form (those exact classes) and neither has hooks, tvc::linear_gelu (one kernel in
// inference). Sequential calls it for a Linear followed by a GELU.
Tensor linear_activation(Module& linear, Module& activation, const Tensor& x);
// linear2(activation(linear1(x))) for an MLP's two Linear layers and the activation between:
// their forwards one after the other, with their hooks (linear_activation for the first two); or,
// when both linears are Linears with biases and activation a GELU of the erf form (those exact
// classes) and none has hooks, tvc::linear_gelu_linear (one kernel in inference). Sequential calls
// it for a Linear, a GELU and a Linear, with a Dropout between that passes its input through
// (evaluation mode or p = 0, no hooks) left out.
Tensor linear_activation_linear(Module& linear1, Module& activation, Module& linear2, const Tensor& x);

// With input_scale (N, C, 1, 1) (a squeeze-excitation's output scale), the same for the input
// x * input_scale; when fused, a 1x1 convolution without padding, stride or groups of a dense NCHW
// float32 or float64 x with more than 196 positions per map folds it into one weight per sample
// instead (W * input_scale[n]: a grouped convolution, no pass over x).
Tensor conv_norm_activation(Module& conv, Module& norm, Module* activation, const Tensor& x,
                            const Tensor& residual = Tensor(), const Tensor& input_scale = Tensor());

// pool(conv_norm_activation(conv, norm, activation, x)) (a network's stem); or, when
// conv_norm_activation fuses the first three (with x) and pool is a MaxPool2d (that exact class)
// without hooks, Conv2d::forward_epilogue_max_pool (tvc::conv2d_epilogue_max_pool2d: one kernel in
// inference, the same values). Sequential calls it for a Conv2d, a BatchNorm2d, an activation
// (optional) and a MaxPool2d.
Tensor conv_norm_activation_max_pool(Module& conv, Module& norm, Module* activation, Module& pool, const Tensor& x);

// A convolution, its norm and its activation (null: none) as conv_norm_activation takes them; a
// null conv: no such layer.
struct ConvNormActivationRefs {
  Module* conv = nullptr;
  Module* norm = nullptr;
  Module* activation = nullptr;
};
// An inverted residual block's layers (MobileNet v2/v3, EfficientNet) over x (N, C, H, W): expand
// (optional: a 1x1 convolution), depthwise, project (optional: a 1x1 convolution), each through
// conv_norm_activation, the input added to the projection's result when add_input (the
// projection needed); or, when each layer is one that conv_norm_activation fuses (with x), the 1x1
// convolutions have no stride, padding or groups, the depthwise one has groups = its channels in
// and out, and none is dilated or pads otherwise than with zeros on both sides, one
// tvc::inverted_residual (the same values): the layers over bands of rows with the expanded maps
// in cache. (N, C, H, W) -> (N, C_out, H_out, W_out).
Tensor inverted_residual_layers(const ConvNormActivationRefs& expand, const ConvNormActivationRefs& depthwise,
                                const ConvNormActivationRefs& project, const Tensor& x, bool add_input);

// activation(norm(cat(inputs, 1))) (DenseNet's pre-activation of its concatenated features, and
// its transitions' of one input), activation optional (null): the concatenation (none for one
// input) and the modules' forwards one after the other, with their hooks; or, when norm is a BatchNorm2d in evaluation
// mode with running statistics, activation null or a ReLU (those exact classes), neither has hooks, the inputs are NCHW
// with dense planes, float32 or float64 (N, C_i, H, W) of one device with the kernel (the CPU) and nothing requires
// grad: each input's channels normalised (and rectified) in one pass straight into their place in the result, with the
// values of the separate ops (bit for bit); inputs that are adjacent channels of one tensor (a dense block's features
// kept together) in one pass for all of them. In training mode, with a BatchNorm2d and a ReLU (those exact classes)
// without hooks, the concatenation then BatchNorm::forward_relu (tvc::batch_norm_relu). Inputs (N, C_i, H, W) ->
// (N, sum of C_i, H, W).
Tensor concat_norm_activation(Module& norm, Module* activation, const std::vector<Tensor>& inputs);

// ---------------------------------------------------------------- bfloat16 inference

// Prepares model for bfloat16 inference: the weight of every Conv2d, Linear (subclasses too) and
// MultiheadAttention's packed input projection is converted to bfloat16 in place, once; biases,
// norms, buffers and the activations between layers stay float32. With a float32 input those
// layers then round their input to bfloat16 and sum the products in float32 (AVX512_BF16's
// vdpbf16ps where tvc::cpu_has_native_bfloat16(), else the same arithmetic by FMAs), their
// outputs float32; depthwise convolutions and anything autograd records run in float32 with the
// weight converted back (exact). Returns how many weights it converted.
int64_t convert_weights_to_bfloat16(Module& model);

// ---------------------------------------------------------------- activations

// An elementwise activation; with inplace the result is written into the input (which must not
// be a leaf that requires grad), as PyTorch's inplace=True.
class Activation : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override { return inplace ? "inplace=True" : ""; }

  bool inplace;

 protected:
  explicit Activation(bool inplace) : inplace(inplace) {}
  virtual Tensor function(const Tensor& x) const = 0;
  // The function written into x; by default computed aside and copied in. Those with an in-place
  // op (Tensor::relu_ and the like) write into x in one pass when autograd does not record them.
  virtual void function_(Tensor& x) const;
};

class ReLU : public Cloneable<ReLU, Activation> {
 public:
  explicit ReLU(bool inplace = false) : Cloneable(inplace) {}

 protected:
  Tensor function(const Tensor& x) const override { return relu(x); }
  void function_(Tensor& x) const override { x.relu_(); }
};

class ReLU6 : public Cloneable<ReLU6, Activation> {
 public:
  explicit ReLU6(bool inplace = false) : Cloneable(inplace) {}

 protected:
  Tensor function(const Tensor& x) const override { return relu6(x); }
  void function_(Tensor& x) const override { x.clamp_(0.0, 6.0); }
};

class LeakyReLU : public Cloneable<LeakyReLU, Activation> {
 public:
  explicit LeakyReLU(Scalar negative_slope = 0.01, bool inplace = false)
      : Cloneable(inplace), negative_slope(negative_slope) {}
  std::string extra_repr() const override;

  Scalar negative_slope;

 protected:
  Tensor function(const Tensor& x) const override { return leaky_relu(x, negative_slope.to_double()); }
};

class SiLU : public Cloneable<SiLU, Activation> {
 public:
  explicit SiLU(bool inplace = false) : Cloneable(inplace) {}

 protected:
  Tensor function(const Tensor& x) const override { return silu(x); }
  void function_(Tensor& x) const override { x.silu_(); }
};

// PyTorch prints Hardsigmoid and Hardswish without their inplace flag.
class Hardsigmoid : public Cloneable<Hardsigmoid, Activation> {
 public:
  explicit Hardsigmoid(bool inplace = false) : Cloneable(inplace) {}
  std::string extra_repr() const override { return ""; }

 protected:
  Tensor function(const Tensor& x) const override { return hardsigmoid(x); }
  void function_(Tensor& x) const override { x.hardsigmoid_(); }
};

class Hardswish : public Cloneable<Hardswish, Activation> {
 public:
  explicit Hardswish(bool inplace = false) : Cloneable(inplace) {}
  std::string extra_repr() const override { return ""; }

 protected:
  Tensor function(const Tensor& x) const override { return hardswish(x); }
  void function_(Tensor& x) const override { x.hardswish_(); }
};

class Mish : public Cloneable<Mish, Activation> {
 public:
  explicit Mish(bool inplace = false) : Cloneable(inplace) {}

 protected:
  Tensor function(const Tensor& x) const override { return mish(x); }
};

class Sigmoid : public Cloneable<Sigmoid> {
 public:
  Tensor forward(const Tensor& x) override { return sigmoid(x); }
};

class Tanh : public Cloneable<Tanh> {
 public:
  Tensor forward(const Tensor& x) override { return tanh(x); }
};

class GELU : public Cloneable<GELU> {
 public:
  explicit GELU(GeluApproximate approximate = GeluApproximate::None) : approximate(approximate) {}
  Tensor forward(const Tensor& x) override { return gelu(x, approximate); }
  std::string extra_repr() const override { return std::string("approximate='") + to_string(approximate) + "'"; }

  GeluApproximate approximate;
};

// log(1 + exp(beta x)) / beta, linear above threshold.
class Softplus : public Cloneable<Softplus> {
 public:
  explicit Softplus(Scalar beta = 1, Scalar threshold = 20) : beta(beta), threshold(threshold) {}
  Tensor forward(const Tensor& x) override { return softplus(x, beta.to_double(), threshold.to_double()); }
  std::string extra_repr() const override;

  Scalar beta, threshold;
};

// ---------------------------------------------------------------- pooling, x (N, C, H, W)

struct MaxPool2dOptions {
  std::optional<Sizes> stride = std::nullopt;  // default: kernel_size
  Sizes padding = 0;
  Sizes dilation = 1;
  bool ceil_mode = false;
};

class MaxPool2d : public Cloneable<MaxPool2d> {
 public:
  explicit MaxPool2d(Sizes kernel_size, MaxPool2dOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  Sizes kernel_size, stride, padding, dilation;
  bool ceil_mode;
};

struct AvgPool2dOptions {
  std::optional<Sizes> stride = std::nullopt;  // default: kernel_size
  Sizes padding = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;
  std::optional<int64_t> divisor_override = std::nullopt;
};

class AvgPool2d : public Cloneable<AvgPool2d> {
 public:
  explicit AvgPool2d(Sizes kernel_size, AvgPool2dOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  Sizes kernel_size, stride, padding;
  bool ceil_mode, count_include_pad;
  std::optional<int64_t> divisor_override = std::nullopt;
};

// -> (N, C, output_size).
class AdaptiveAvgPool2d : public Cloneable<AdaptiveAvgPool2d> {
 public:
  explicit AdaptiveAvgPool2d(Sizes output_size) : output_size(std::move(output_size)) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override { return "output_size=" + output_size.str(); }

  Sizes output_size;
};

class AdaptiveMaxPool2d : public Cloneable<AdaptiveMaxPool2d> {
 public:
  explicit AdaptiveMaxPool2d(Sizes output_size) : output_size(std::move(output_size)) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override { return "output_size=" + output_size.str(); }

  Sizes output_size;
};

}  // namespace tvc::nn
