// The kernel registry: for each KERNEL op of tvc/internal/op_list.h and each device, one function.
//
// Ops in engine/src allocate their outputs, then call run_kernel(op, inputs, outputs, params).
// Backends fill the registry explicitly (no static initialisers, which a static library drops):
// kernels/cpu/register.cpp defines register_cpu_kernels(); the CUDA backend, a library of its
// own (tvc-cuda), is added by tvc::cuda::enable() through add_backend. A missing
// kernel is a clear error naming the op and device; a kernel that does not support a dtype
// raises naming the op, dtype and device.
//
// Contract for kernels: outputs are allocated by the caller with their final shape; elementwise
// inputs arrive already broadcast (expanded) to the output shape and converted to one dtype.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tvc/internal/op_list.h"
#include "tvc/modes.h"
#include "tvc/tensor.h"

namespace tvc {

// The calling thread's floating-point mode: on x86 its MXCSR (rounding, flush-to-zero,
// denormals-are-zero). The CPU kernels' parallel regions run their workers in the mode of the
// thread that starts them, so a kernel computes alike on any number of threads.
inline unsigned float_mode() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_ia32_stmxcsr();
#else
  return 0;
#endif
}
// Sets this thread's floating-point mode while in scope, then restores its own.
class FloatModeScope {
 public:
  explicit FloatModeScope(unsigned mode) : saved_(float_mode()) { set(mode); }
  ~FloatModeScope() { set(saved_); }
  FloatModeScope(const FloatModeScope&) = delete;
  FloatModeScope& operator=(const FloatModeScope&) = delete;

 private:
  static void set([[maybe_unused]] unsigned mode) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_ldmxcsr(mode);
#endif
  }
  unsigned saved_;
};
// Denormal floats read and made as zeros by this thread, and by the kernels' threads it starts,
// while in scope (x86: MXCSR's DAZ and FTZ flags). For attention, whose weights of masked pairs
// (a score of -100 below the row's maximum: e^-100 ~ 4e-44) are denormals: every multiply of one
// took a microcode assist (Swin's shifted windows took 5x the time of the others on Sapphire
// Rapids). A weight under 2^-126 times a value adds less than a unit in the last place of any sum
// of normal weights times values, so the results keep their bits but where a whole sum lies in
// the denormal range.
class DenormalsAsZero : public FloatModeScope {
 public:
#if defined(__x86_64__) || defined(__i386__)
  DenormalsAsZero() : FloatModeScope(float_mode() | kFlushToZero | kDenormalsAreZero) {}

 private:
  static constexpr unsigned kFlushToZero = 1u << 15, kDenormalsAreZero = 1u << 6;
#else
  DenormalsAsZero() : FloatModeScope(float_mode()) {}
#endif
};

struct KernelArgs {
  std::span<const Tensor> in;
  std::span<Tensor> out;
  const void* params = nullptr;
  template <typename P>
  const P& p() const {
    return *static_cast<const P*>(params);
  }
};
using KernelFn = void (*)(const KernelArgs& args);

// CPU instruction-set paths. The library is built for baseline x86-64; the AVX2 and AVX-512
// kernels live in their own files and are chosen at run time by CPUID, or forced with the
// environment variable TVC_ISA=generic|avx2|avx512|avx512_bf16.
// avx512_bf16: AVX-512's kernels with AVX512_BF16's bfloat16 GEMM.
enum class Isa : uint8_t { generic, avx2, avx512, avx512_bf16 };
const char* isa_name(Isa isa);
std::vector<Isa> available_isas();  // the paths this machine can run, generic first
Isa active_isa();
void set_isa(Isa isa);  // re-registers the CPU kernels for isa; throws if the CPU lacks it

// The memory functions of a device other than the CPU, given by its backend with its kernels.
// Storage::allocate and Tensor::to(Device) reach device memory only through these; each
// function raises tvc::Error with the backend's message when the device call fails.
struct DeviceMemory {
  void* (*allocate)(size_t nbytes) = nullptr;  // nbytes > 0
  void (*release)(void* data) = nullptr;       // never throws
  // Copies nbytes from src (on src_device) to dst (on dst_device); one side may be the CPU.
  void (*copy)(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) = nullptr;
};

class KernelRegistry {
 public:
  void set(Op op, Device device, KernelFn fn);
  KernelFn get(Op op, Device device) const;  // null when absent
  bool supports(Op op, Device device) const { return get(op, device) != nullptr; }
  void set_memory(Device device, const DeviceMemory& memory);
  // The memory functions of device, or null when no backend in this build provides them.
  const DeviceMemory* memory(Device device) const;

 private:
  KernelFn table_[kNumOps][2] = {};
  DeviceMemory memory_[2] = {};
};

// The registry, filled on first use. set_isa and add_backend publish a new table atomically:
// a lookup sees the old table or the new one, and every table stays valid until exit.
const KernelRegistry& kernel_registry();

// A backend's registration function, which sets its kernels and memory in a table.
using BackendRegistration = void (*)(KernelRegistry& registry);
// Adds a backend (e.g. tvc::cuda::enable(), tvc/cuda.h) to every table from now on, once.
// op_list_hash is the backend's kOpListHash (the default, taken where it is called); a backend
// built against another op list is refused with an error saying to rebuild it.
void add_backend(BackendRegistration registration, uint64_t op_list_hash = kOpListHash);

// The memory functions of a device other than the CPU; throws naming op when its backend is not
// enabled (tvc::cuda::enable()).
const DeviceMemory& device_memory(Device device, const char* op);

// Runs op's kernel for the device of the first input (or output).
void run_kernel(Op op, std::span<const Tensor> in, std::span<Tensor> out, const void* params = nullptr);

// Makes the calling thread's OpenMP thread count the one set_num_threads set (run_kernel calls
// it before every kernel, so a setting made on any thread reaches every thread).
void apply_num_threads();

// Called by a kernel, on the thread that runs it, to say which way it computes this call (a
// string literal, e.g. "im2col+gemm"), for KernelProfiler's records (tvc/profiler.h); does
// nothing without an active profiler.
void note_kernel_path(const char* path);

// Raised by kernels for a dtype they do not implement.
[[noreturn]] void unsupported_dtype(Op op, DType dtype, Device device);

// The CPU backend's entry point (every table has it).
void register_cpu_kernels(KernelRegistry& registry, Isa isa);

// ---- parameters of kernels that take any ----

// Unary ops with constants: leaky_relu (a = slope), clamp (a = min, b = max, has_a/has_b),
// softplus (a = beta, b = threshold), gelu (approximate_tanh), pow_scalar (a = exponent).
// clamp_backward: in = (grad, x) -> out = grad * (1 where a <= x <= b, else 0), a bound left out
// when has_a / has_b is false; NaN x gives grad * 0.
// gelu_backward: in = (grad, x) -> out = grad * (Phi(x) + x * phi(x)) (gelu's erf form; no
// parameters), phi the standard normal density and Phi its distribution function.
struct UnaryParams {
  double a = 0, b = 0;
  bool has_a = true, has_b = true;
  bool approximate_tanh = false;
};

// fill (value a; an integer value also in `integer`, exact for integer dtypes), uniform
// (a = from, b = to), normal (a = mean, b = std), randint ([low, high), exact for any int64
// range), arange (a = start, b = step): the random ones read seed and counter offset.
struct FillParams {
  double a = 0, b = 0;
  uint64_t seed = 0, offset = 0;
  std::optional<int64_t> integer{};
  int64_t low = 0, high = 0;
};

// bmm: out[b] = in0[b] @ in1[b], shapes (B,M,K) (B,K,N) -> (B,M,N), any strides.
// attention: in = (q (..., L, D), k (..., S, D), v (..., S, Dv), then bias and mask (..., L, S)
// where params say so), one floating dtype (float32 or float64), the same batch dims (...), any
// strides (bias and mask broadcast through zero strides) -> out (..., L, Dv), any strides: per
// batch element, out = softmax(q @ k^T + bias + mask) @ v, the scores summed as bmm's, the
// additions in that order and each row's softmax as the softmax kernel's, without the (L, S)
// weights leaving the thread that made them.
// attention_backward: in = (dout (..., L, Dv), then attention's inputs) -> out = (dq, dk, dv[, ds]),
// any strides, ds (..., L, S) where given: per batch element the gradients of out = softmax(s) @ v
// with s = q @ k^T + bias + mask, the weights P made again as the forward makes them:
// dS = P * (dP - rowsum(dP * P)) with dP = dout @ v^T, dq = dS @ k, dk = dS^T @ q,
// dv = P^T @ dout, ds = dS (the gradient of bias and mask before their broadcast is summed).
struct AttentionParams {
  bool bias = false, mask = false;
};
// linear: in = (x (M,K), weight (N,K), both any strides[, bias (N)]), float32 or float64, K >= 1 ->
// out (M,N) contiguous = x @ weight^T + bias: the bias (where given) added to each finished block
// of the product (rounded as the separate add rounds it), then with params.gelu the GELU (erf
// form) of each element, as the gelu kernel computes it.
struct LinearParams {
  bool gelu = false;
  // Whether the kernel may keep a form of the weight (its packed panels) with the weight's
  // storage for later calls (Storage::derived): set by the op where the weight is not being
  // trained (detail::may_keep_weight_forms).
  bool keep_weight_forms = false;
};
// linear_gelu_linear: in = (x (M,C), w1 (H,C), b1 (H), w2 (O,H), b2 (O)), x and the weights any
// strides, one dtype (float32 or float64), C >= 1 -> out (M,O) contiguous =
// linear(gelu(linear(x, w1, b1)), w2, b2), each linear as the linear kernel computes it (the same bits).
// Reductions (sum, amax, amin, argmax, argmin): the output is given in keepdim form; dims where
// the output has extent 1 and the input does not are reduced.
struct TopkParams {
  int64_t k, dim;
  bool largest, sorted;
};

// conv2d: in = (input N,C,H,W; weight O,C/g,kh,kw[; bias O]) -> out (N,O,Ho,Wo).
// Operands may have any strides, except that outputs and grad_out must be NCHW- or NHWC-dense
// with (H,W) flattening to one stride (as freshly allocated tensors are).
// conv2d_backward_input: in = (grad_out, weight) -> out (grad_input, shape of input).
// conv2d_backward_weight: in = (grad_out, input) -> out (grad_weight).
struct Conv2dParams {
  int64_t stride[2], padding[2], dilation[2], groups;
  // conv2d and conv2d_epilogue: whether the kernel may keep a form of the weight (Winograd's
  // transform, packed panels) with the weight's storage for later calls, as LinearParams'.
  bool keep_weight_forms = false;
};

// conv2d_epilogue: in = (input, weight, scale (O), shift (O)[, residual (the output's shape, any
// strides)]) -> out = activation(conv2d(input, weight) * scale + shift + residual), per output
// channel o of scale and shift, in one pass over the output (ops.h, conv2d_epilogue).
struct Conv2dEpilogueParams {
  Conv2dParams conv;
  EpilogueActivation activation;
};

// inverted_residual: in = (input (N,C,H,W)[, expand weight (E,C,1,1), scale, shift], depthwise
// weight (E,1,kh,kw), scale, shift[, project weight (O,E,1,1), scale, shift]) -> out (N,O,Ho,Wo),
// or (N,E,Ho,Wo) without project (ops.h, inverted_residual); float32, input and output dense NCHW.
struct InvertedResidualParams {
  bool expand, project, add_input;
  EpilogueActivation expand_activation, depthwise_activation, project_activation;
  int64_t stride[2], padding[2];
};

// max_pool2d: in = (input) -> out (values, int64 indices into H*W of each plane).
// max_pool2d_backward: in = (grad_out, indices) -> out (grad_input, zero-filled by the kernel).
// avg_pool2d(_backward): in = (input | grad_out) -> out.
struct Pool2dParams {
  int64_t kernel[2], stride[2], padding[2], dilation[2];
  bool ceil_mode = false, count_include_pad = true;
  int64_t divisor_override = 0;  // 0: none
};

// conv2d_epilogue_max_pool2d: in = (input (N,C,H,W), weight, scale (O), shift (O)) -> out =
// max_pool2d(conv2d_epilogue(input, weight, scale, shift), pool) (values), (N,O,Hp,Wp) (ops.h,
// conv2d_epilogue_max_pool2d); float32, input and output dense NCHW. conv_height and conv_width:
// the convolution's output size (the pool's input).
struct Conv2dEpilogueMaxPoolParams {
  Conv2dEpilogueParams conv;
  Pool2dParams pool;
  int64_t conv_height, conv_width;
};

// channel_affine: in = (x, mean, scale, bias), all of out's shape (the last three broadcast
// views; out any strides) -> out = (x - mean) * scale + bias, each step rounded to the dtype as
// the separate sub, mul and add ops round it (eval-mode batch norm in one pass); with
// params.relu (params optional), then max(out, 0) with NaN kept, as the relu kernel computes it.
struct ChannelAffineParams {
  bool relu = false;
};

// batch_norm_stats: in = (x (N, C, *), dense: contiguous or channels-last) -> out = (mean (C),
// var (C)), each channel's statistics over N and *, var biased, summed in double.
// batch_norm_backward: in = (grad_out, x, mean, invstd, weight), grad_out and x (N, C, *) dense in
// the same layout, the rest (C) -> out = (grad_x (x's shape and layout), sum_dy_xhat (C), sum_dy
// (C)): with xhat = (x - mean) * invstd and means over N and *,
//   grad_x = weight * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)),
// sum_dy_xhat = Σ dy * xhat (the weight's gradient), sum_dy = Σ dy (the bias's); sums in double.
// With a sixth input y (x's shape and layout: the ReLU of batch norm's output), dy is first
// ReLU's gradient at y, grad_out * (y >= the dtype's smallest positive value) as relu's backward
// (clamp_backward) computes it, in the same pass.

// layer_norm: in = (x, contiguous, float32 or float64, seen as (R, D) rows; weight (D); bias (D),
// both x's dtype) -> out = (y (x's shape, contiguous), mean (R), rstd (R)): per row the mean and
// rstd = 1 / sqrt(var + eps), var biased (two passes; float32 rows summed in float32 lanes, as
// PyTorch's kernel), and y = (x - mean) * rstd * weight + bias.
struct LayerNormParams {
  double eps;
};
// layer_norm_backward: in = (grad_out, x (both contiguous (R, D) rows), mean (R), rstd (R), weight
// (D)) -> out = (grad_x (x's shape, contiguous), sum_dy_xhat (D), sum_dy (D)): with xhat = (x -
// mean) * rstd and g = grad_out * weight, per row
//   grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat)),
// sum_dy_xhat = Σ_rows grad_out * xhat (the weight's gradient), sum_dy = Σ_rows grad_out (the
// bias's), summed in blocks of rows of a fixed size, then over blocks in double (so independent
// of the thread count).

// softmax: in = (x, contiguous, floating) -> out (x's shape, contiguous): along dim, e^(x - max)
// over the slice's sum of them (float16/bfloat16 computed in float32).
struct SoftmaxParams {
  int64_t dim;
};

// lerp: in = (start_0..start_{n-1}, end_0..end_{n-1}) -> out (out_0..out_{n-1}), n >= 1 pairs of
// one floating dtype; out_i has the shape of start_i and end_i and may be start_i itself (in
// place); out_i = lerp(start_i, end_i, weight).
struct LerpParams {
  double weight;
};

// sgd_momentum: in = (param_0..param_{n-1}, buffer_0.., grad_0..) -> out (param_0.., buffer_0..),
// n >= 1 triples of one floating dtype and shape each, out the params and buffers themselves (in
// place). Per element, each step rounded to the dtype as the ops SGD ran one by one compute it
// (the scalars as tensors of the dtype: momentum m, 1 - dampening d, -lr l):
//   buffer = buffer * m;  buffer = buffer + (d == 1 ? grad : grad * d);  param = param + buffer * l.
struct SgdMomentumParams {
  double lr, momentum, dampening;
};

// index_select: in = (input, int64 index) -> out; gather: in = (input, int64 index) -> out.
// index_add / scatter_add: in = (grad, index) -> out (zero-filled by the caller, accumulated).
struct IndexParams {
  int64_t dim;
};

}  // namespace tvc
