// Convolution, pooling, normalisation and softmax ops, and their backward rules.
//
// Shape legend: N batch, C input channels, O output channels, H,W input size, Ho,Wo output
// size, kh,kw kernel size, L length. conv2d and the pooling ops are KERNEL ops (kernels in
// kernels/cpu/conv.cpp and pool.cpp); conv1d, the normalisations and softmax are composed from
// other ops, so their gradients come from those ops' rules.
//
// Layout rule: conv2d and the pooling ops return a channels-last result (and gradient) when the
// input is channels-last (Tensor::suggest_memory_format), else an NCHW-contiguous one.
#include <cmath>

#include "internal.h"

namespace tvc {

using autograd::GradList;
using autograd::SavedTensor;

namespace {

using Pair = std::array<int64_t, 2>;

Shape shape_of(Pair p) { return {p[0], p[1]}; }

// t itself when it is NCHW- or NHWC-dense with (H,W) flattening to one stride (what the conv
// kernels need of a gradient; size-1 dims may carry any stride), else an NCHW copy.
Tensor dense(const Tensor& t) {
  bool flat_hw = t.strides()[2] == t.shape()[3] * t.strides()[3];
  if (flat_hw && (t.is_contiguous() || t.is_contiguous(MemoryFormat::ChannelsLast))) return t;
  return t.clone(MemoryFormat::Contiguous);
}

// Runs f on a batched view of a 3-d (unbatched) input and drops the batch dim again.
template <typename F>
Tensor batched(const Tensor& input, F&& f) {
  if (input.dim() == 3) return f(input.unsqueeze(0)).squeeze(0);
  return f(input);
}

void check_floating_input(const char* op, const Tensor& input) {
  TVC_CHECK(input.defined(), op, ": input is undefined");
  TVC_CHECK(is_floating(input.dtype()), op, ": input must be floating, got ", dtype_name(input.dtype()), " (shape ",
            input.shape(), ")");
}

// ---------------------------------------------------------------- convolution

// A float32 input with a bfloat16 weight (nn::convert_weights_to_bfloat16).
bool bf16_weight(const Tensor& input, const Tensor& weight) {
  return input.dtype() == DType::Float32 && weight.dtype() == DType::BFloat16;
}

// Whether such a convolution runs in the bfloat16 GEMM: on the CPU, not depthwise, with at
// least one input channel, autograd not recording (others: the weight converted to float32).
bool bf16_weight_gemm(const Tensor& input, const Tensor& weight, int64_t groups, const std::vector<Tensor>& others) {
  std::vector<Tensor> all = others;
  all.insert(all.end(), {input, weight});
  return bf16_weight(input, weight) && input.device() == Device::CPU && !(weight.shape()[1] == 1 && groups > 1) &&
         input.shape()[1] > 0 && !autograd::any_requires_grad(all);
}

// Op (conv2d or conv2d_epilogue) on the input rounded to bfloat16 and the bfloat16 weight, then
// operands, into a new float32 output of out_shape laid out like the input.
Tensor conv_bf16_weight(Op op, const Tensor& input, const Tensor& weight, const std::vector<Tensor>& operands,
                        const Shape& out_shape, const void* params) {
  NoGradGuard no_grad;
  Tensor y = detail::empty_with_format(out_shape, DType::Float32, input.suggest_memory_format());
  if (y.numel() == 0) return y;
  std::vector<Tensor> in{input.to(DType::BFloat16), weight};
  in.insert(in.end(), operands.begin(), operands.end());
  detail::run(op, in, {y}, params);
  return y;
}

// Checks conv arguments whose input and weight have spatial dims of the same count (1 or 2).
void check_conv(const char* op, const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t groups,
                int64_t spatial) {
  check_floating_input(op, input);
  TVC_CHECK(weight.defined(), op, ": weight is undefined");
  TVC_CHECK(input.dim() == spatial + 1 || input.dim() == spatial + 2, op, ": input must have ", spatial + 2,
            " dims (batched) or ", spatial + 1, " (unbatched), got shape ", input.shape());
  TVC_CHECK(weight.dim() == spatial + 2, op, ": weight must have ", spatial + 2,
            " dims (O, C/groups, kernel...), got shape ", weight.shape());
  TVC_CHECK(weight.dtype() == input.dtype() || bf16_weight(input, weight), op, ": input (", dtype_name(input.dtype()),
            ") and weight (", dtype_name(weight.dtype()),
            ") dtypes differ (the one mix allowed is a float32 input "
            "with a bfloat16 weight)");
  TVC_CHECK(groups >= 1, op, ": groups must be positive, got ", groups);
  int64_t C = input.shape()[input.dim() - spatial - 1], O = weight.shape()[0];
  TVC_CHECK(weight.shape()[1] * groups == C, op, ": weight of shape ", weight.shape(), " with groups = ", groups,
            " expects ", weight.shape()[1] * groups, " input channels, but input of shape ", input.shape(), " has ", C);
  TVC_CHECK(O % groups == 0, op, ": weight of shape ", weight.shape(), " has ", O,
            " output channels, not divisible by groups = ", groups);
  if (bias.defined()) {
    TVC_CHECK(bias.dim() == 1 && bias.shape()[0] == O, op, ": bias of shape ", bias.shape(), " does not match the ", O,
              " output channels of weight shape ", weight.shape());
    TVC_CHECK(bias.dtype() == input.dtype(), op, ": bias dtype ", dtype_name(bias.dtype()),
              " differs from input dtype ", dtype_name(input.dtype()));
  }
}

// The (N, O, Ho, Wo) output shape of a batched conv2d, its options checked.
Shape conv2d_output_shape(const Tensor& input, const Tensor& weight, Pair stride, Pair padding, Pair dilation) {
  for (int i = 0; i < 2; ++i) {
    TVC_CHECK(stride[i] >= 1, "conv2d: stride must be positive, got ", shape_of(stride));
    TVC_CHECK(padding[i] >= 0, "conv2d: padding must be non-negative, got ", shape_of(padding));
    TVC_CHECK(dilation[i] >= 1, "conv2d: dilation must be positive, got ", shape_of(dilation));
  }
  const Shape& xs = input.shape();
  const Shape& ws = weight.shape();
  Shape out_hw(2);
  for (int i = 0; i < 2; ++i)
    out_hw[i] = (xs[2 + i] + 2 * padding[i] - dilation[i] * (ws[2 + i] - 1) - 1) / stride[i] + 1;
  TVC_CHECK(out_hw[0] >= 1 && out_hw[1] >= 1 && xs[2] + 2 * padding[0] >= dilation[0] * (ws[2] - 1) + 1 &&
                xs[3] + 2 * padding[1] >= dilation[1] * (ws[3] - 1) + 1,
            "conv2d: input of shape ", xs, " padded by ", shape_of(padding),
            " is smaller than the kernel of weight shape ", ws, " dilated by ", shape_of(dilation));
  return {xs[0], ws[0], out_hw[0], out_hw[1]};
}

Tensor conv2d_batched(const Tensor& input, const Tensor& weight_in, const Tensor& bias, Pair stride, Pair padding,
                      Pair dilation, int64_t groups) {
  if (bf16_weight_gemm(input, weight_in, groups, {bias})) {
    Conv2dParams p{{stride[0], stride[1]},
                   {padding[0], padding[1]},
                   {dilation[0], dilation[1]},
                   groups,
                   detail::may_keep_weight_forms(weight_in)};
    std::vector<Tensor> operands;
    if (bias.defined()) operands.push_back(bias);
    return conv_bf16_weight(Op::conv2d, input, weight_in, operands,
                            conv2d_output_shape(input, weight_in, stride, padding, dilation), &p);
  }
  // A bfloat16 weight elsewhere: in float32 (exact), with its gradient.
  const Tensor weight = bf16_weight(input, weight_in) ? weight_in.to(DType::Float32) : weight_in;
  const Shape& xs = input.shape();
  const Shape& ws = weight.shape();
  const int64_t O = ws[0];
  MemoryFormat fmt = input.suggest_memory_format();
  Conv2dParams p{{stride[0], stride[1]},
                 {padding[0], padding[1]},
                 {dilation[0], dilation[1]},
                 groups,
                 detail::may_keep_weight_forms(weight)};
  Tensor out =
      detail::empty_with_format(conv2d_output_shape(input, weight, stride, padding, dilation), input.dtype(), fmt);
  {
    NoGradGuard no_grad;
    if (out.numel() > 0) {
      std::vector<Tensor> in{input, weight};
      if (bias.defined()) in.push_back(bias);
      if (xs[1] == 0) {
        out.zero_();
        if (bias.defined()) out.add_(bias.view({1, O, 1, 1}));
      } else {
        detail::run(Op::conv2d, in, {out}, &p);
      }
    }
  }
  if (!autograd::any_requires_grad({input, weight, bias})) return out;
  bool gx = input.requires_grad(), gw = weight.requires_grad();
  bool gb = bias.defined() && bias.requires_grad();
  SavedTensor sx(gw ? input : Tensor()), sw(gx ? weight : Tensor());
  // Depthwise gradients run over whole NCHW planes (the kernels' fast paths): channels-last
  // operands (ConvNeXt's blocks hand them over) are made NCHW first, one pass each, instead of
  // being read with a stride per tap.
  const bool depthwise = ws[1] == 1 && groups > 1;
  autograd::record("ConvolutionBackward0", {input, weight, bias}, {out}, [=](const GradList& g) -> GradList {
    Tensor dy = depthwise ? dense(g[0]).contiguous() : dense(g[0]);
    Tensor dx, dw, db;
    if (gx) {
      dx = detail::empty_with_format(xs, dy.dtype(), depthwise ? MemoryFormat::Contiguous : fmt);
      if (dx.numel() > 0) detail::run(Op::conv2d_backward_input, {dy, sw.unpack("ConvolutionBackward0")}, {dx}, &p);
    }
    if (gw) {
      dw = empty(ws, {.dtype = dy.dtype()});
      const Tensor x = sx.unpack("ConvolutionBackward0");
      if (dw.numel() > 0) detail::run(Op::conv2d_backward_weight, {dy, depthwise ? x.contiguous() : x}, {dw}, &p);
    }
    if (gb) db = sum(dy, {0, 2, 3});
    return {dx, dw, db};
  });
  return out;
}

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, Pair stride, Pair padding, Pair dilation,
              int64_t groups) {
  check_conv("conv2d", input, weight, bias, groups, 2);
  return batched(input,
                 [&](const Tensor& x) { return conv2d_batched(x, weight, bias, stride, padding, dilation, groups); });
}

namespace {

// conv2d_epilogue's checks of its input, weight, scale and shift (op: the caller's name); its
// output shape.
Shape check_conv_epilogue(const char* op, const Tensor& input, const Tensor& weight, const Tensor& scale,
                          const Tensor& shift, int64_t groups, Pair stride, Pair padding, Pair dilation) {
  check_conv(op, input, weight, Tensor(), groups, 2);
  TVC_CHECK(input.dim() == 4, op, ": input must be (N, C, H, W), got shape ", input.shape());
  const int64_t O = weight.shape()[0];
  for (const auto& [name, t] : {std::pair{"scale", &scale}, std::pair{"shift", &shift}}) {
    TVC_CHECK(t->defined() && t->dim() == 1 && t->shape()[0] == O, op, ": ", name, " must be (", O, ") for the ", O,
              " output channels of weight shape ", weight.shape(), ", got ",
              t->defined() ? cat_str(t->shape()) : std::string("an undefined tensor"));
    TVC_CHECK(t->dtype() == input.dtype(), op, ": ", name, " dtype ", dtype_name(t->dtype()),
              " differs from input dtype ", dtype_name(input.dtype()));
  }
  return conv2d_output_shape(input, weight, stride, padding, dilation);
}

}  // namespace

Tensor conv2d_epilogue(const Tensor& input, const Tensor& weight, const Tensor& scale, const Tensor& shift,
                       const Tensor& residual, EpilogueActivation activation, Pair stride, Pair padding, Pair dilation,
                       int64_t groups) {
  const Shape out_shape =
      check_conv_epilogue("conv2d_epilogue", input, weight, scale, shift, groups, stride, padding, dilation);
  if (residual.defined()) {
    TVC_CHECK(residual.shape() == out_shape, "conv2d_epilogue: residual of shape ", residual.shape(),
              " does not match the output shape ", out_shape);
    TVC_CHECK(residual.dtype() == input.dtype(), "conv2d_epilogue: residual dtype ", dtype_name(residual.dtype()),
              " differs from input dtype ", dtype_name(input.dtype()));
  }
  Conv2dEpilogueParams p{{{stride[0], stride[1]},
                          {padding[0], padding[1]},
                          {dilation[0], dilation[1]},
                          groups,
                          detail::may_keep_weight_forms(weight)},
                         activation};
  if (bf16_weight_gemm(input, weight, groups, {scale, shift, residual})) {
    std::vector<Tensor> operands{scale, shift};
    if (residual.defined()) operands.push_back(residual);
    return conv_bf16_weight(Op::conv2d_epilogue, input, weight, operands, out_shape, &p);
  }
  if (bf16_weight(input, weight))  // a depthwise kernel, or autograd recording: in float32 (exact)
    return conv2d_epilogue(input, weight.to(DType::Float32), scale, shift, residual, activation, stride, padding,
                           dilation, groups);
  if (!autograd::any_requires_grad({input, weight, scale, shift, residual}) &&
      kernel_registry().supports(Op::conv2d_epilogue, input.device()) && input.shape()[1] > 0) {
    NoGradGuard no_grad;
    Tensor y = detail::empty_with_format(out_shape, input.dtype(), input.suggest_memory_format());
    if (y.numel() == 0) return y;
    std::vector<Tensor> in{input, weight, scale, shift};
    if (residual.defined()) in.push_back(residual);
    detail::run(Op::conv2d_epilogue, in, {y}, &p);
    return y;
  }
  const Shape cshape{1, weight.shape()[0], 1, 1};
  Tensor y = add(mul(conv2d_batched(input, weight, Tensor(), stride, padding, dilation, groups), scale.view(cshape)),
                 shift.view(cshape));
  if (residual.defined()) y = add(y, residual);
  switch (activation) {
    case EpilogueActivation::None:
      return y;
    case EpilogueActivation::ReLU:
      return relu(y);
    case EpilogueActivation::ReLU6:
      return relu6(y);
    case EpilogueActivation::SiLU:
      return silu(y);
    case EpilogueActivation::Hardswish:
      return hardswish(y);
  }
  return y;
}

Tensor inverted_residual(const Tensor& input, const ConvEpilogueLayer& expand, const ConvEpilogueLayer& depthwise,
                         Pair stride, Pair padding, const ConvEpilogueLayer& project, bool add_input) {
  TVC_CHECK(input.defined() && input.dim() == 4, "inverted_residual: input must be (N, C, H, W), got ",
            input.defined() ? cat_str(input.shape()) : std::string("an undefined tensor"));
  const int64_t C = input.shape()[1];
  // Each layer's weight (out, in, kh, kw) with in as the layer before leaves it; its epilogue is
  // checked by conv2d_epilogue or below.
  auto check_weight = [](const char* layer, const Tensor& w, int64_t in, bool pointwise) {
    TVC_CHECK(w.defined() && w.dim() == 4 && w.shape()[1] == (pointwise ? in : 1) &&
                  (!pointwise || (w.shape()[2] == 1 && w.shape()[3] == 1)) && (pointwise || w.shape()[0] == in),
              "inverted_residual: ", layer, " weight must be ",
              pointwise ? cat_str("(out, ", in, ", 1, 1)") : cat_str("(", in, ", 1, kh, kw)"), " for ", in,
              " channels in, got ", w.defined() ? cat_str(w.shape()) : std::string("an undefined tensor"));
  };
  if (expand.weight.defined()) check_weight("expand", expand.weight, C, true);
  const int64_t E = expand.weight.defined() ? expand.weight.shape()[0] : C;
  check_weight("depthwise", depthwise.weight, E, false);
  if (project.weight.defined()) check_weight("project", project.weight, E, true);
  TVC_CHECK(!add_input || project.weight.defined(), "inverted_residual: add_input needs a project layer");
  const Shape dw_shape = conv2d_output_shape(input, depthwise.weight, stride, padding, {1, 1});  // (H, W) its input's
  const int64_t O = project.weight.defined() ? project.weight.shape()[0] : E;
  const Shape out_shape{input.shape()[0], O, dw_shape[2], dw_shape[3]};
  TVC_CHECK(!add_input || out_shape == input.shape(), "inverted_residual: add_input needs the output shape ", out_shape,
            " to be the input's, got ", input.shape());
  std::vector<Tensor> in{input};
  for (const ConvEpilogueLayer* layer : {&expand, &depthwise, &project}) {
    if (!layer->weight.defined()) continue;
    const int64_t channels = layer->weight.shape()[0];
    for (const auto& [name, t] : {std::pair{"scale", &layer->scale}, std::pair{"shift", &layer->shift}})
      TVC_CHECK(t->defined() && t->dim() == 1 && t->shape()[0] == channels && t->dtype() == input.dtype(),
                "inverted_residual: ", name, " must be (", channels, ") of dtype ", dtype_name(input.dtype()),
                " for weight shape ", layer->weight.shape(), ", got ",
                t->defined() ? cat_str(t->shape(), " ", dtype_name(t->dtype())) : std::string("an undefined tensor"));
    in.insert(in.end(), {layer->weight, layer->scale, layer->shift});
  }
  bool one_kernel = input.dtype() == DType::Float32 && input.is_contiguous() && input.numel() > 0 &&
                    kernel_registry().supports(Op::inverted_residual, input.device()) &&
                    !autograd::any_requires_grad(in);
  for (const Tensor& t : in) one_kernel = one_kernel && t.dtype() == DType::Float32 && t.device() == input.device();
  if (one_kernel) {
    NoGradGuard no_grad;
    Tensor y = empty(out_shape, {.dtype = input.dtype(), .device = input.device()});
    InvertedResidualParams p{expand.weight.defined(), project.weight.defined(), add_input,
                             expand.activation,       depthwise.activation,     project.activation,
                             {stride[0], stride[1]},  {padding[0], padding[1]}};
    detail::run(Op::inverted_residual, in, {y}, &p);
    return y;
  }
  Tensor y = input;
  if (expand.weight.defined())
    y = conv2d_epilogue(y, expand.weight, expand.scale, expand.shift, Tensor(), expand.activation);
  y = conv2d_epilogue(y, depthwise.weight, depthwise.scale, depthwise.shift, Tensor(), depthwise.activation, stride,
                      padding, {1, 1}, E);
  if (project.weight.defined())
    y = conv2d_epilogue(y, project.weight, project.scale, project.shift, add_input ? input : Tensor(),
                        project.activation);
  return y;
}

Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding,
              int64_t dilation, int64_t groups) {
  check_conv("conv1d", input, weight, bias, groups, 1);
  TVC_CHECK(stride >= 1 && padding >= 0 && dilation >= 1, "conv1d: needs stride >= 1, padding >= 0, ",
            "dilation >= 1, got ", stride, ", ", padding, ", ", dilation);
  int64_t L = input.shape().back(), k = weight.shape()[2];
  TVC_CHECK(L + 2 * padding >= dilation * (k - 1) + 1, "conv1d: input of shape ", input.shape(), " padded by ", padding,
            " is shorter than the kernel of weight shape ", weight.shape(), " dilated by ", dilation);
  // (N,C,L) as (N,C,1,L).
  Tensor x = input.unsqueeze(-2);
  return conv2d(x, weight.unsqueeze(2), bias, {1, stride}, {0, padding}, {1, dilation}, groups).squeeze(-2);
}

// ---------------------------------------------------------------- pooling

namespace {

// PyTorch's pooling_output_shape: floor or ceil division, and a last window under ceil_mode
// must start inside the input or its left padding.
int64_t pool_out_size(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t d, bool ceil_mode) {
  int64_t num = in + 2 * pad - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  int64_t out = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  if (ceil_mode && (out - 1) * s >= in + pad) --out;
  return out;
}

struct PoolSetup {
  Pool2dParams params;
  Shape out_shape;
};

PoolSetup pool_setup(const char* op, const Shape& xs, Pair kernel, std::optional<Pair> stride_opt, Pair padding,
                     Pair dilation, bool ceil_mode) {
  Pair stride = stride_opt ? *stride_opt : kernel;
  PoolSetup s;
  Pool2dParams& p = s.params;
  for (int i = 0; i < 2; ++i) {
    TVC_CHECK(kernel[i] >= 1, op, ": kernel size must be positive, got ", shape_of(kernel));
    TVC_CHECK(stride[i] >= 1, op, ": stride must be positive, got ", shape_of(stride));
    TVC_CHECK(dilation[i] >= 1, op, ": dilation must be positive, got ", shape_of(dilation));
    TVC_CHECK(padding[i] >= 0 && padding[i] <= kernel[i] / 2, op, ": padding ", shape_of(padding),
              " must be between 0 and half the kernel size ", shape_of(kernel));
    p.kernel[i] = kernel[i], p.stride[i] = stride[i], p.padding[i] = padding[i], p.dilation[i] = dilation[i];
  }
  p.ceil_mode = ceil_mode;
  int64_t ho = pool_out_size(xs[2], kernel[0], stride[0], padding[0], dilation[0], ceil_mode);
  int64_t wo = pool_out_size(xs[3], kernel[1], stride[1], padding[1], dilation[1], ceil_mode);
  TVC_CHECK(ho >= 1 && wo >= 1, op, ": output size ", Shape{ho, wo}, " is too small for input of shape ", xs,
            " (kernel ", shape_of(kernel), ", stride ", shape_of(stride), ", padding ", shape_of(padding),
            ", dilation ", shape_of(dilation), ")");
  s.out_shape = {xs[0], xs[1], ho, wo};
  return s;
}

void check_pool_input(const char* op, const Tensor& input) {
  check_floating_input(op, input);
  TVC_CHECK(input.dim() == 3 || input.dim() == 4, op, ": input must be (N,C,H,W) or (C,H,W), got shape ",
            input.shape());
}

// Runs a pooling kernel with an optional indices output and records its backward, which runs
// backward_op on (grad_out[, indices]).
Tensor pool_forward(Op op, Op backward_op, const char* node_name, const Tensor& x, const Shape& out_shape,
                    const Pool2dParams& p, bool with_indices) {
  MemoryFormat fmt = x.suggest_memory_format();
  Tensor out = detail::empty_with_format(out_shape, x.dtype(), fmt);
  Tensor indices = with_indices ? detail::empty_with_format(out_shape, DType::Int64, fmt) : Tensor();
  {
    NoGradGuard no_grad;
    std::vector<Tensor> outs{out};
    if (with_indices) outs.push_back(indices);
    detail::run(op, {x}, outs, &p);
  }
  Shape xs = x.shape();
  autograd::record(node_name, {x}, {out}, [=](const GradList& g) -> GradList {
    Tensor dx = detail::empty_with_format(xs, g[0].dtype(), fmt);
    std::vector<Tensor> in{g[0]};
    if (with_indices) in.push_back(indices);
    detail::run(backward_op, in, {dx}, &p);
    return {dx};
  });
  return out;
}

PoolSetup adaptive_setup(const char* op, const Tensor& x, Pair output_size) {
  TVC_CHECK(output_size[0] >= 1 && output_size[1] >= 1, op, ": output size must be positive, got ",
            shape_of(output_size));
  TVC_CHECK(x.shape()[2] >= 1 && x.shape()[3] >= 1, op, ": input of shape ", x.shape(), " has an empty spatial dim");
  return {Pool2dParams{}, {x.shape()[0], x.shape()[1], output_size[0], output_size[1]}};
}

}  // namespace

Tensor max_pool2d(const Tensor& input, Pair kernel, std::optional<Pair> stride, Pair padding, Pair dilation,
                  bool ceil_mode) {
  check_pool_input("max_pool2d", input);
  return batched(input, [&](const Tensor& x) {
    PoolSetup s = pool_setup("max_pool2d", x.shape(), kernel, stride, padding, dilation, ceil_mode);
    // The indices serve only the backward: inference skips them.
    bool with_indices = is_grad_enabled() && x.requires_grad();
    return pool_forward(Op::max_pool2d, Op::max_pool2d_backward, "MaxPool2DWithIndicesBackward0", x, s.out_shape,
                        s.params, with_indices);
  });
}

Tensor conv2d_epilogue_max_pool2d(const Tensor& input, const ConvEpilogueLayer& conv, Pair stride, Pair padding,
                                  Pair dilation, int64_t groups, Pair pool_kernel, std::optional<Pair> pool_stride,
                                  Pair pool_padding, Pair pool_dilation, bool ceil_mode) {
  const char* op = "conv2d_epilogue_max_pool2d";
  const Shape conv_shape =
      check_conv_epilogue(op, input, conv.weight, conv.scale, conv.shift, groups, stride, padding, dilation);
  const PoolSetup s = pool_setup(op, conv_shape, pool_kernel, pool_stride, pool_padding, pool_dilation, ceil_mode);
  bool one_kernel = input.is_contiguous() && input.numel() > 0 && input.shape()[1] > 0 &&
                    kernel_registry().supports(Op::conv2d_epilogue_max_pool2d, input.device()) &&
                    !autograd::any_requires_grad({input, conv.weight, conv.scale, conv.shift});
  for (const Tensor& t : {input, conv.weight, conv.scale, conv.shift})
    one_kernel = one_kernel && t.dtype() == DType::Float32 && t.device() == input.device();
  if (!one_kernel)
    return max_pool2d(conv2d_epilogue(input, conv.weight, conv.scale, conv.shift, Tensor(), conv.activation, stride,
                                      padding, dilation, groups),
                      pool_kernel, pool_stride, pool_padding, pool_dilation, ceil_mode);
  NoGradGuard no_grad;
  Tensor y = empty(s.out_shape, {.dtype = input.dtype(), .device = input.device()});
  if (y.numel() == 0) return y;
  const Conv2dEpilogueMaxPoolParams p{{{{stride[0], stride[1]},
                                        {padding[0], padding[1]},
                                        {dilation[0], dilation[1]},
                                        groups,
                                        detail::may_keep_weight_forms(conv.weight)},
                                       conv.activation},
                                      s.params,
                                      conv_shape[2],
                                      conv_shape[3]};
  detail::run(Op::conv2d_epilogue_max_pool2d, {input, conv.weight, conv.scale, conv.shift}, {y}, &p);
  return y;
}

Tensor avg_pool2d(const Tensor& input, Pair kernel, std::optional<Pair> stride, Pair padding, bool ceil_mode,
                  bool count_include_pad, std::optional<int64_t> divisor_override) {
  check_pool_input("avg_pool2d", input);
  TVC_CHECK(!divisor_override || *divisor_override != 0, "avg_pool2d: divisor_override must not be zero");
  return batched(input, [&](const Tensor& x) {
    PoolSetup s = pool_setup("avg_pool2d", x.shape(), kernel, stride, padding, {1, 1}, ceil_mode);
    s.params.count_include_pad = count_include_pad;
    s.params.divisor_override = divisor_override.value_or(0);
    return pool_forward(Op::avg_pool2d, Op::avg_pool2d_backward, "AvgPool2DBackward0", x, s.out_shape, s.params, false);
  });
}

Tensor adaptive_avg_pool2d(const Tensor& input, Pair output_size) {
  check_pool_input("adaptive_avg_pool2d", input);
  return batched(input, [&](const Tensor& x) {
    PoolSetup s = adaptive_setup("adaptive_avg_pool2d", x, output_size);
    return pool_forward(Op::adaptive_avg_pool2d, Op::adaptive_avg_pool2d_backward, "AdaptiveAvgPool2DBackward0", x,
                        s.out_shape, s.params, false);
  });
}

Tensor adaptive_max_pool2d(const Tensor& input, Pair output_size) {
  check_pool_input("adaptive_max_pool2d", input);
  return batched(input, [&](const Tensor& x) {
    PoolSetup s = adaptive_setup("adaptive_max_pool2d", x, output_size);
    return pool_forward(Op::adaptive_max_pool2d, Op::adaptive_max_pool2d_backward, "AdaptiveMaxPool2DBackward0", x,
                        s.out_shape, s.params, true);
  });
}

// ---------------------------------------------------------------- normalisation

namespace {

// (1, C, 1, ...) for broadcasting a per-channel (C) tensor against an (N, C, *) input.
Shape channel_shape(const Tensor& input) {
  Shape s(input.dim(), 1);
  s[1] = input.shape()[1];
  return s;
}

void check_per_channel(const char* op, const char* name, const Tensor& t, const Tensor& input) {
  if (!t.defined()) return;
  int64_t C = input.shape()[1];
  TVC_CHECK(t.dim() == 1 && t.shape()[0] == C, op, ": ", name, " of shape ", t.shape(), " does not match the ", C,
            " channels of input shape ", input.shape());
}

// x * weight + bias with the optional per-element affine parameters broadcast as shape.
Tensor affine(Tensor x, const Tensor& weight, const Tensor& bias, const Shape& shape) {
  if (weight.defined()) x = mul(x, weight.reshape(shape));
  if (bias.defined()) x = add(x, bias.reshape(shape));
  return x;
}

// x - mean and the biased variance over dims (kept), the variance from the centered values.
struct Moments {
  Tensor mean, centered, var;
};
Moments moments(const Tensor& x, const Shape& dims) {
  Tensor m = mean(x, dims, true);
  Tensor xc = sub(x, m);
  return {m, xc, mean(mul(xc, xc), dims, true)};
}

// (x - mean) / sqrt(var + eps) with biased statistics over dims.
Tensor normalize(const Tensor& x, const Shape& dims, double eps) {
  Moments mo = moments(x, dims);
  return mul(mo.centered, rsqrt(mo.var + eps));
}

}  // namespace

namespace {

// (x - mean) * scale + bias in one pass, mean, scale and bias per channel (of shape cshape),
// rounded as the three separate ops would round it: eval-mode batch norm's normalisation. The
// per-channel tensors are taken in x's dtype (the kernel reads all operands in one dtype), so the
// result is of x's dtype. On a device without the kernel, the three ops. With params' relu (for
// batch_norm_fused, which records no gradient through it) also the ReLU in the same pass.
Tensor channel_affine(const Tensor& x, const Tensor& mean_in, const Tensor& scale_in, const Tensor& bias_in,
                      const ChannelAffineParams& params = {}) {
  const Tensor mean = mean_in.to(x.dtype()), scale = scale_in.to(x.dtype()), bias = bias_in.to(x.dtype());
  if (!kernel_registry().supports(Op::channel_affine, x.device())) return add(mul(sub(x, mean), scale), bias);
  Tensor out;
  {
    NoGradGuard no_grad;
    const Shape& s = x.shape();
    out = detail::empty_with_format(s, x.dtype(), x.suggest_memory_format());
    detail::run(Op::channel_affine, {x, mean.expand(s), scale.expand(s), bias.expand(s)}, {out}, &params);
  }
  if (!autograd::any_requires_grad({x, mean, scale, bias})) return out;
  bool g_mean = mean.requires_grad(), g_scale = scale.requires_grad(), g_bias = bias.requires_grad();
  SavedTensor sx(g_scale ? x : Tensor()), smean(g_scale ? mean : Tensor()), sscale(scale);
  Shape cshape = mean.shape();
  autograd::record("ChannelAffineBackward", {x, mean, scale, bias}, {out}, [=](const GradList& g) -> GradList {
    const char* node = "ChannelAffineBackward";
    Tensor gx = mul(g[0], sscale.unpack(node));
    Tensor gs = g_scale ? sum_to(mul(g[0], sub(sx.unpack(node), smean.unpack(node))), cshape) : Tensor();
    return {gx, g_mean ? sum_to(neg(gx), cshape) : Tensor(), gs, g_bias ? sum_to(g[0], cshape) : Tensor()};
  });
  return out;
}

// Batch norm with the batch's statistics through the statistics kernel, channel_affine and the
// fused backward kernel: y and the batch's biased mean and var (C). In training each of these
// is one pass over x where the ops they replace (moments, the affine, their backward rules) are
// a dozen. With relu, y is the ReLU of the normalised values, made in channel_affine's pass, and
// the backward kernel takes ReLU's gradient from y in its own.
struct BatchNormed {
  Tensor y, mean, var;
};
BatchNormed batch_norm_fused(const Tensor& input, const Tensor& weight, const Tensor& bias, double eps, bool relu) {
  const int64_t C = input.shape()[1];
  const Shape cshape = channel_shape(input);
  const TensorOptions per_channel{.dtype = input.dtype(), .device = input.device()};
  const MemoryFormat format = input.suggest_memory_format();
  Tensor x, mean = empty({C}, per_channel), var = empty({C}, per_channel), invstd, y;
  {
    NoGradGuard no_grad;
    x = input.detach().contiguous(format);
    detail::run(Op::batch_norm_stats, {x}, {mean, var});
    invstd = rsqrt(var + eps);
    Tensor scale = weight.defined() ? mul(invstd, weight.detach()) : invstd;
    Tensor shift = bias.defined() ? bias.detach() : zeros({C}, per_channel);
    y = channel_affine(x, mean.reshape(cshape), scale.reshape(cshape), shift.reshape(cshape), {.relu = relu});
  }
  if (!autograd::any_requires_grad({input, weight, bias})) return {y, mean, var};
  const bool g_weight = weight.defined() && weight.requires_grad(), g_bias = bias.defined() && bias.requires_grad();
  SavedTensor sx(x), sweight(weight.defined() ? weight : ones({C}, per_channel)), sy(relu ? y : Tensor());
  const char* node = relu ? "NativeBatchNormReluBackward" : "NativeBatchNormBackward0";
  autograd::record(node, {input, weight, bias}, {y}, [=](const GradList& g) -> GradList {
    const Tensor xs = sx.unpack(node);
    Tensor dx = detail::empty_with_format(xs.shape(), xs.dtype(), format), sum_dy_xhat = empty({C}, per_channel),
           sum_dy = empty({C}, per_channel);
    std::vector<Tensor> in = {g[0].contiguous(format), xs, mean, invstd, sweight.unpack(node).detach().to(xs.dtype())};
    if (relu) in.push_back(sy.unpack(node).detach());
    detail::run(Op::batch_norm_backward, in, {dx, sum_dy_xhat, sum_dy});
    return {dx, g_weight ? sum_dy_xhat : Tensor(), g_bias ? sum_dy : Tensor()};
  });
  return {y, mean, var};
}

// batch_norm, followed by a ReLU where then_relu is set (batch_norm_relu).
Tensor batch_norm_then(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, std::optional<double> momentum, double eps,
                       const Tensor& num_batches_tracked, bool then_relu) {
  auto activated = [then_relu](const Tensor& y) { return then_relu ? relu(y) : y; };
  check_floating_input("batch_norm", input);
  TVC_CHECK(input.dim() >= 2, "batch_norm: input must be (N,C) or (N,C,*), got shape ", input.shape());
  TVC_CHECK(running_mean.defined() == running_var.defined(),
            "batch_norm: running_mean and running_var must be given together");
  check_per_channel("batch_norm", "running_mean", running_mean, input);
  check_per_channel("batch_norm", "running_var", running_var, input);
  check_per_channel("batch_norm", "weight", weight, input);
  check_per_channel("batch_norm", "bias", bias, input);
  Shape cshape = channel_shape(input);
  Shape dims;
  for (int64_t d = 0; d < input.dim(); ++d)
    if (d != 1) dims.push_back(d);
  // y = (x - mean) * scale + bias with the per-channel scale = weight / sqrt(var + eps), so
  // only two full-size ops follow the statistics.
  Tensor centered, scale;
  if (training || !running_mean.defined()) {
    int64_t C = input.shape()[1];
    int64_t n = C == 0 ? 0 : input.numel() / C;
    TVC_CHECK(!training || n > 1, "batch_norm: expected more than 1 value per channel when training, ",
              "got input of shape ", input.shape());
    const bool fused = input.numel() > 0 && kernel_registry().supports(Op::batch_norm_stats, input.device()) &&
                       kernel_registry().supports(Op::batch_norm_backward, input.device()) &&
                       kernel_registry().supports(Op::channel_affine, input.device());
    Tensor y, batch_mean, batch_var;
    if (fused) {
      BatchNormed b = batch_norm_fused(input, weight, bias, eps, then_relu);
      y = b.y, batch_mean = b.mean, batch_var = b.var;
    } else {
      Moments mo = moments(input, dims);
      centered = mo.centered;
      scale = rsqrt(mo.var + eps);
      batch_mean = mo.mean.detach().reshape({C});
      batch_var = mo.var.detach().reshape({C});
    }
    if (training && running_mean.defined()) {
      NoGradGuard no_grad;
      TVC_CHECK(momentum || num_batches_tracked.defined(),
                "batch_norm: momentum = None (cumulative average) needs num_batches_tracked");
      if (num_batches_tracked.defined()) num_batches_tracked.detach().add_(1);
      double f = momentum ? *momentum : 1.0 / num_batches_tracked.item_double();
      // The running variance is unbiased (Bessel's correction), as PyTorch.
      Tensor unbiased = batch_var * (static_cast<double>(n) / static_cast<double>(n - 1));
      Tensor rm = running_mean.detach(), rv = running_var.detach();
      rm.copy_(add(rm * (1 - f), batch_mean.to(rm.dtype()) * f));
      rv.copy_(add(rv * (1 - f), unbiased.to(rv.dtype()) * f));
    }
    if (fused) return y;
  } else {
    scale = rsqrt(running_var.to(input.dtype()).reshape(cshape) + eps);
    if (weight.defined()) scale = mul(scale, weight.reshape(cshape));
    Tensor shift =
        bias.defined() ? bias.reshape(cshape) : zeros(cshape, {.dtype = input.dtype(), .device = input.device()});
    return activated(channel_affine(input, running_mean.to(input.dtype()).reshape(cshape), scale, shift));
  }
  if (weight.defined()) scale = mul(scale, weight.reshape(cshape));
  Tensor y = mul(centered, scale);
  return activated(bias.defined() ? add(y, bias.reshape(cshape)) : y);
}

}  // namespace

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, std::optional<double> momentum, double eps,
                  const Tensor& num_batches_tracked) {
  return batch_norm_then(input, running_mean, running_var, weight, bias, training, momentum, eps, num_batches_tracked,
                         false);
}

Tensor batch_norm_relu(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, std::optional<double> momentum, double eps,
                       const Tensor& num_batches_tracked) {
  return batch_norm_then(input, running_mean, running_var, weight, bias, training, momentum, eps, num_batches_tracked,
                         true);
}

namespace {

// Whether t is undefined or of x's dtype and device.
bool same_dtype_and_device(const Tensor& x, const Tensor& t) {
  return !t.defined() || (t.dtype() == x.dtype() && t.device() == x.device());
}

// Layer norm over the trailing dims `normalized_shape` (checked) as one layer_norm kernel over
// rows, the backward as one layer_norm_backward kernel (not differentiable again, as batch
// norm's). A missing weight or bias is ones or zeros of the row's length.
Tensor layer_norm_fused(const Tensor& input, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                        double eps) {
  const int64_t D = shape_numel(normalized_shape), R = input.numel() / D;
  const TensorOptions options{.dtype = input.dtype(), .device = input.device()};
  Tensor x, w, y, mean = empty({R}, options), rstd = empty({R}, options);
  {
    NoGradGuard no_grad;
    x = input.detach().contiguous();
    w = weight.defined() ? weight.detach().contiguous().reshape({D}) : ones({D}, options);
    const Tensor b = bias.defined() ? bias.detach().contiguous().reshape({D}) : zeros({D}, options);
    y = empty(x.shape(), options);
    const LayerNormParams p{eps};
    detail::run(Op::layer_norm, {x, w, b}, {y, mean, rstd}, &p);
  }
  if (!autograd::any_requires_grad({input, weight, bias})) return y;
  const bool g_weight = weight.defined() && weight.requires_grad(), g_bias = bias.defined() && bias.requires_grad();
  SavedTensor sx(x);
  autograd::record("NativeLayerNormBackward0", {input, weight, bias}, {y}, [=](const GradList& g) -> GradList {
    const Tensor xs = sx.unpack("NativeLayerNormBackward0");
    Tensor dx = empty(xs.shape(), options), sum_dy_xhat = empty({D}, options), sum_dy = empty({D}, options);
    detail::run(Op::layer_norm_backward, {g[0].contiguous(), xs, mean, rstd, w}, {dx, sum_dy_xhat, sum_dy});
    return {dx, g_weight ? sum_dy_xhat.reshape(normalized_shape) : Tensor(),
            g_bias ? sum_dy.reshape(normalized_shape) : Tensor()};
  });
  return y;
}

}  // namespace

Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  check_floating_input("layer_norm", input);
  int64_t k = static_cast<int64_t>(normalized_shape.size());
  bool ok = k >= 1 && input.dim() >= k;
  for (int64_t i = 0; ok && i < k; ++i) ok = input.shape()[input.dim() - k + i] == normalized_shape[i];
  TVC_CHECK(ok, "layer_norm: normalized_shape ", normalized_shape, " does not match the trailing dims of input shape ",
            input.shape());
  for (const Tensor* t : {&weight, &bias})
    TVC_CHECK(!t->defined() || t->shape() == normalized_shape, "layer_norm: ", t == &weight ? "weight" : "bias",
              " of shape ", t->shape(), " does not match normalized_shape ", normalized_shape);
  const bool fused = input.numel() > 0 && (input.dtype() == DType::Float32 || input.dtype() == DType::Float64) &&
                     kernel_registry().supports(Op::layer_norm, input.device()) &&
                     kernel_registry().supports(Op::layer_norm_backward, input.device()) &&
                     same_dtype_and_device(input, weight) && same_dtype_and_device(input, bias);
  if (fused) return layer_norm_fused(input, normalized_shape, weight, bias, eps);
  Shape dims;
  for (int64_t i = 0; i < k; ++i) dims.push_back(input.dim() - k + i);
  return affine(normalize(input, dims, eps), weight, bias, normalized_shape);
}

Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight, const Tensor& bias, double eps) {
  check_floating_input("group_norm", input);
  TVC_CHECK(input.dim() >= 2, "group_norm: input must be (N,C,*), got shape ", input.shape());
  int64_t N = input.shape()[0], C = input.shape()[1];
  TVC_CHECK(num_groups >= 1 && C % num_groups == 0, "group_norm: ", C, " channels of input shape ", input.shape(),
            " are not divisible by num_groups = ", num_groups);
  check_per_channel("group_norm", "weight", weight, input);
  check_per_channel("group_norm", "bias", bias, input);
  int64_t per_group = C / num_groups * shape_numel(Shape(input.shape().begin() + 2, input.shape().end()));
  Tensor x = input.reshape({N, num_groups, per_group});
  return affine(normalize(x, {2}, eps).reshape(input.shape()), weight, bias, channel_shape(input));
}

// ---------------------------------------------------------------- softmax

namespace {

// t - max(t, dim), the max taken without gradient (both softmaxes are shift-invariant).
Tensor shifted(const char* op, const Tensor& t, int64_t dim) {
  check_floating_input(op, t);
  Tensor m;
  {
    NoGradGuard no_grad;
    m = amax(t, {dim}, true);
  }
  return sub(t, m);
}

}  // namespace

Tensor softmax(const Tensor& t, int64_t dim) {
  if (t.dim() == 0) return softmax(t.unsqueeze(0), dim).squeeze(0);
  int64_t d = wrap_dim(dim, t.dim(), "softmax");
  if (t.numel() == 0) return t.clone();
  if (!kernel_registry().supports(Op::softmax, t.device())) {
    Tensor e = exp(shifted("softmax", t, d));
    return div(e, sum(e, {d}, true));
  }
  check_floating_input("softmax", t);
  Tensor y;
  {
    NoGradGuard no_grad;
    const Tensor x = t.contiguous();
    y = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
    SoftmaxParams p{d};
    detail::run(Op::softmax, {x}, {y}, &p);
  }
  if (!autograd::any_requires_grad({t})) return y;
  // dx = y * (dy - sum(dy * y)) along d.
  SavedTensor sy(y);
  autograd::record("SoftmaxBackward0", {t}, {y}, [=](const GradList& g) -> GradList {
    const Tensor out = sy.unpack("SoftmaxBackward0");
    return {mul(out, sub(g[0], sum(mul(g[0], out), {d}, true)))};
  });
  return y;
}

Tensor log_softmax(const Tensor& t, int64_t dim) {
  if (t.dim() == 0) return log_softmax(t.unsqueeze(0), dim).squeeze(0);
  int64_t d = wrap_dim(dim, t.dim(), "log_softmax");
  if (t.numel() == 0) return t.clone();
  Tensor s = shifted("log_softmax", t, d);
  return sub(s, log(sum(exp(s), {d}, true)));
}

Tensor Tensor::softmax(int64_t dim) const { return tvc::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return tvc::log_softmax(*this, dim); }

}  // namespace tvc
