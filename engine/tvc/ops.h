// tvc's ops, as free functions.
//
// All ops are differentiable where PyTorch's are, broadcast and promote types as PyTorch does,
// and raise tvc::Error naming the op, the argument and the shapes on bad input.
// Shape legend: N batch, C channels, H,W height and width, L length, K classes.
#pragma once

#include <array>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tvc/modes.h"
#include "tvc/tensor.h"

namespace tvc {

// ---- random numbers ----
// A counter-based (Philox 4x32-10) generator: element i of a draw depends only on (seed,
// offset + i), so results do not depend on the thread count, and the state is two numbers.
// Thread-safe: draws from several threads at once reserve disjoint counters.
class Generator {
 public:
  struct State {
    uint64_t seed = 0, offset = 0;
  };
  explicit Generator(uint64_t seed = 0) : state_{seed, 0} {}
  Generator(const Generator& other) : state_(other.state()) {}
  Generator& operator=(const Generator& other) {
    set_state(other.state());
    return *this;
  }
  State state() const {
    std::lock_guard lock(mutex_);
    return state_;
  }
  void set_state(const State& s) {
    std::lock_guard lock(mutex_);
    state_ = s;
  }
  void manual_seed(uint64_t seed) { set_state({seed, 0}); }
  uint64_t seed() const { return state().seed; }
  // Reserves n counters: returns the seed and the first of them, as one step.
  State advance(uint64_t n) {
    std::lock_guard lock(mutex_);
    State reserved = state_;
    state_.offset += n;
    return reserved;
  }

 private:
  mutable std::mutex mutex_;
  State state_;
};
Generator& default_generator();
void manual_seed(uint64_t seed);

Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);   // U[0,1)
Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);  // N(0,1)
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options = {.dtype = DType::Int64},
               Generator* gen = nullptr);
Tensor bernoulli(const Tensor& p, Generator* gen = nullptr);  // 1 with probability p
Tensor rand_like(const Tensor& t, Generator* gen = nullptr);
Tensor randn_like(const Tensor& t, Generator* gen = nullptr);
// Random permutation of 0..n-1 (int64).
Tensor randperm(int64_t n, Generator* gen = nullptr);

// ---- elementwise ----
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha = 1);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha = 1);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  // true division
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, Scalar exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);  // comparisons give bool tensors
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& t, const Tensor& mask, Scalar value);
// start + weight * (end - start) with PyTorch's formula (for |weight| >= 0.5 it computes
// end - (end - start) * (1 - weight), exact at weight 1); start and end broadcast.
Tensor lerp(const Tensor& start, const Tensor& end, double weight);
// The multi-tensor form (torch._foreach_lerp_): selves[i] = lerp(selves[i], ends[i], weight) in
// place for every i, in one kernel call over all the tensors (one pass, not one op per tensor).
// selves share one floating dtype and device; ends[i] has the shape of selves[i] and is
// converted to the selves' dtype. Records no autograd: with grad mode on, no self may require
// grad (pass detached aliases, as PyTorch's swa_utils does).
void foreach_lerp_(const std::vector<Tensor>& selves, const std::vector<Tensor>& ends, double weight);
// SGD's step with momentum (no Nesterov) over many parameters in place, in one kernel call (one
// pass over each parameter, buffer and gradient instead of four ops): for every i,
//   buffers[i] = momentum * buffers[i] + (1 - dampening) * grads[i];  params[i] -= lr * buffers[i]
// with the values of those ops one by one (buffers[i].mul_(momentum).add_(grads[i], 1 - dampening),
// params[i].add_(buffers[i], -lr)). params, buffers and grads share one floating dtype and device,
// and each triple one shape and dense layout (contiguous or channels-last, the same strides).
// Records no autograd: with grad mode on, no param may require grad (run it under NoGradGuard,
// as optim::SGD does).
void foreach_sgd_momentum_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                           const std::vector<Tensor>& buffers, double lr, double momentum, double dampening);

Tensor neg(const Tensor& t);
Tensor abs(const Tensor& t);
Tensor sign(const Tensor& t);
Tensor exp(const Tensor& t);
Tensor log(const Tensor& t);
Tensor sqrt(const Tensor& t);
Tensor rsqrt(const Tensor& t);
Tensor erf(const Tensor& t);
Tensor clamp(const Tensor& t, std::optional<double> min, std::optional<double> max);

// ---- activations ----
Tensor relu(const Tensor& t);
Tensor relu6(const Tensor& t);
Tensor leaky_relu(const Tensor& t, double negative_slope = 0.01);
Tensor gelu(const Tensor& t, GeluApproximate approximate = GeluApproximate::None);
Tensor silu(const Tensor& t);
Tensor sigmoid(const Tensor& t);
Tensor hardsigmoid(const Tensor& t);
Tensor hardswish(const Tensor& t);
Tensor tanh(const Tensor& t);
Tensor softplus(const Tensor& t, double beta = 1, double threshold = 20);
Tensor mish(const Tensor& t);

// ---- reductions (dims empty = all dims) ----
Tensor sum(const Tensor& t, const Shape& dims = {}, bool keepdim = false, std::optional<DType> dtype = std::nullopt);
Tensor mean(const Tensor& t, const Shape& dims = {}, bool keepdim = false);
// correction 1 = unbiased (Bessel), as torch.var's default.
Tensor var(const Tensor& t, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor std(const Tensor& t, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor amax(const Tensor& t, const Shape& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& t, const Shape& dims = {}, bool keepdim = false);
Tensor max(const Tensor& t);  // over all elements
Tensor min(const Tensor& t);
// (values, int64 indices) along dim.
std::pair<Tensor, Tensor> max(const Tensor& t, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& t, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& t, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor argmin(const Tensor& t, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
// (values, int64 indices) of the k largest (or smallest) along dim.
std::pair<Tensor, Tensor> topk(const Tensor& t, int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true);

// ---- linear algebra ----
Tensor bmm(const Tensor& a, const Tensor& b);     // (B,M,K) @ (B,K,N) -> (B,M,N)
Tensor matmul(const Tensor& a, const Tensor& b);  // torch.matmul rules, batch dims broadcast
// Attention over the last two dims, its (L, S) weights never kept: softmax(q @ k^T + bias + mask,
// -1) @ v, with q (*, L, D), k (*, S, D), v (*, S, Dv) of one floating dtype and the same batch
// dims *, and bias and mask (optional, q's dtype) broadcastable to (*, L, S), added in that order.
// q comes scaled (by 1/sqrt(D) for scaled dot-product attention). -> (*, L, Dv), its memory
// ordered as q's dims are (heads split from (N, L, H * D) as the view (N, H, L, D) give an
// (N, L, H, Dv) memory, so merging them back is a view too). Its gradient (where a device has the
// kernel, the CPU: one kernel that makes the weights again) is the composed ops' up to rounding.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias = Tensor(),
                 const Tensor& mask = Tensor());
// x (*,in) @ weight (out,in)^T + bias (out) -> (*,out)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// gelu(linear(x, weight, bias)), gelu's erf form, bias (out) required: when autograd does not
// record it (no grad mode, or no input that requires grad), x, weight and bias are float32 or
// float64 of one dtype and the device has the kernel, one kernel that adds the bias and applies
// the GELU to each block of the product while in cache; otherwise the two ops, with their
// gradients. An MLP's Linear then GELU (Sequential, nn::linear_activation) runs it in inference.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);
// linear(linear_gelu(x, w1, b1), w2, b2), an MLP's two layers: x (*, C), w1 (H, C), b1 (H),
// w2 (O, H), b2 (O) -> (*, O). When autograd does not record it, all five are float32 or float64
// of one dtype and device and the device has the kernel, one kernel with the bits of the two ops:
// on the CPU it runs bands of rows each on one thread with their hidden rows in cache, where
// that pays (C no more than a band's rows: Swin's and ConvNeXt's first two stages),
// else the two layers one after the other. Otherwise the two ops, with their gradients. An MLP's
// Linear, GELU and Linear (Sequential, nn::linear_activation_linear) runs it in inference.
Tensor linear_gelu_linear(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2);

// ---- convolution and pooling ----
// input (N,C,H,W), weight (O,C/groups,kh,kw), bias (O) -> (N,O,Ho,Wo). Unbatched (C,H,W) input
// is accepted as PyTorch does. The output is channels-last when the input is.
// Layout rule of conv2d and the 2-d pooling ops: when the input's suggest_memory_format() is
// ChannelsLast the output and the input's gradient are channels-last, else NCHW-contiguous
// (the weight's layout does not matter). groups == C with weight (k*C,1,kh,kw) is depthwise.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
              std::array<int64_t, 2> stride = {1, 1}, std::array<int64_t, 2> padding = {0, 0},
              std::array<int64_t, 2> dilation = {1, 1}, int64_t groups = 1);
// A convolution with its epilogue fused: input (N,C,H,W), weight (O,C/groups,kh,kw), scale and
// shift (O), residual undefined or of the output's shape (N,O,Ho,Wo) ->
//   activation(conv2d(input, weight) * scale[o] + shift[o] + residual)
// with the output's layout as conv2d's. An eval-mode BatchNorm after the convolution folds into
// scale = weight / sqrt(running_var + eps), shift = bias - running_mean * scale (plus the
// convolution's bias times scale). When autograd does not record it (no grad mode, or no input
// that requires grad) and the device has the kernel, it is one kernel that applies the epilogue
// to the output where the convolution leaves it, instead of up to four more passes and
// allocations; otherwise the separate ops, with their gradients.
Tensor conv2d_epilogue(const Tensor& input, const Tensor& weight, const Tensor& scale, const Tensor& shift,
                       const Tensor& residual, EpilogueActivation activation, std::array<int64_t, 2> stride = {1, 1},
                       std::array<int64_t, 2> padding = {0, 0}, std::array<int64_t, 2> dilation = {1, 1},
                       int64_t groups = 1);
// One convolution of inverted_residual with its folded epilogue: weight, scale and shift (one
// per output channel) and activation, as conv2d_epilogue takes them. An undefined weight: no
// such layer.
struct ConvEpilogueLayer {
  Tensor weight, scale, shift;
  EpilogueActivation activation = EpilogueActivation::None;
};
// An inverted residual block's convolutions (MobileNet v2/v3, EfficientNet) in evaluation, input
// (N,C,H,W) ->
//   expand:    a 1x1 convolution, weight (E,C,1,1)                         -> (N,E,H,W)
//   depthwise: a kh x kw convolution of groups E, weight (E,1,kh,kw), with
//              stride and padding                                          -> (N,E,Ho,Wo)
//   project:   a 1x1 convolution, weight (O,E,1,1), plus the input when
//              add_input (before its activation; then O == C, Ho == H, Wo == W) -> (N,O,Ho,Wo)
// each with its epilogue (conv2d_epilogue's); without expand E = C, without project the result
// is the depthwise layer's (N,E,Ho,Wo) and add_input must be false. The values are the
// conv2d_epilogue calls' one after the other (the same sums). When autograd does not record, the
// input is float32, dense NCHW, on a device with the kernel (the CPU): one kernel that runs the
// layers over bands of a sample's output rows (or groups of small maps side by side), each on one
// thread, so that the expanded maps stay in the cores' caches instead of going to memory and
// back; otherwise those calls.
Tensor inverted_residual(const Tensor& input, const ConvEpilogueLayer& expand, const ConvEpilogueLayer& depthwise,
                         std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                         const ConvEpilogueLayer& project, bool add_input);
// max_pool2d(conv2d_epilogue(input, conv.weight, conv.scale, conv.shift, no residual,
// conv.activation, stride, padding, dilation, groups), pool_kernel, pool_stride, pool_padding,
// pool_dilation, ceil_mode): a network's stem (ResNet's and DenseNet's 7x7 convolution, batch norm
// and ReLU, then their 3x3 stride-2 max pool), input (N,C,H,W) -> (N,O,Hp,Wp), the values of those
// two calls. When autograd does not record and input, weight, scale and shift are float32, the
// input dense NCHW on a device with the kernel (the CPU): one kernel, which for an input of few
// channels (at most 4) pools each output row as soon as the convolution rows its windows need are
// made, so that the convolution's output stays in the cores' caches instead of going to memory and
// back; otherwise those two calls.
Tensor conv2d_epilogue_max_pool2d(const Tensor& input, const ConvEpilogueLayer& conv, std::array<int64_t, 2> stride,
                                  std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups,
                                  std::array<int64_t, 2> pool_kernel,
                                  std::optional<std::array<int64_t, 2>> pool_stride = std::nullopt,
                                  std::array<int64_t, 2> pool_padding = {0, 0},
                                  std::array<int64_t, 2> pool_dilation = {1, 1}, bool ceil_mode = false);
// input (N,C,L), weight (O,C/groups,k), bias (O) -> (N,O,Lo).
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), int64_t stride = 1,
              int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1);
// stride empty = kernel size.
Tensor max_pool2d(const Tensor& input, std::array<int64_t, 2> kernel,
                  std::optional<std::array<int64_t, 2>> stride = std::nullopt, std::array<int64_t, 2> padding = {0, 0},
                  std::array<int64_t, 2> dilation = {1, 1}, bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& input, std::array<int64_t, 2> kernel,
                  std::optional<std::array<int64_t, 2>> stride = std::nullopt, std::array<int64_t, 2> padding = {0, 0},
                  bool ceil_mode = false, bool count_include_pad = true,
                  std::optional<int64_t> divisor_override = std::nullopt);
Tensor adaptive_avg_pool2d(const Tensor& input, std::array<int64_t, 2> output_size);
Tensor adaptive_max_pool2d(const Tensor& input, std::array<int64_t, 2> output_size);

// ---- normalisation ----
// input (N,C,*). In training mode (or without running stats) normalises with batch statistics
// and, when running stats are given, updates them in place with momentum (nullopt: cumulative
// moving average, using num_batches_tracked which must then be given and is incremented).
// Details: normalising uses the biased batch variance, running_var is updated with the
// unbiased one: running = (1 - m) * running + m * batch, where m = momentum or, for nullopt,
// 1 / num_batches_tracked after the increment. num_batches_tracked (an int64 0-d tensor) is
// incremented by the op itself in every training call that has running stats (PyTorch does it
// in the module). Evaluation mode with running stats uses them and updates nothing.
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, std::optional<double> momentum = 0.1, double eps = 1e-5,
                  const Tensor& num_batches_tracked = Tensor());
// relu(batch_norm(...)) with batch_norm's arguments and running-statistics updates. In training
// on a device with batch norm's fused kernels (the CPU) the ReLU is made in batch norm's
// normalising pass and its gradient in batch norm's backward pass (one node,
// NativeBatchNormReluBackward), the values and gradients the two ops' bit for bit; otherwise the
// two ops. nn::BatchNorm::forward_relu calls it.
Tensor batch_norm_relu(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, std::optional<double> momentum = 0.1, double eps = 1e-5,
                       const Tensor& num_batches_tracked = Tensor());
// Normalises over the trailing dims given by normalized_shape.
Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// input (N,C,*), C divisible by num_groups.
Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor softmax(const Tensor& t, int64_t dim);
Tensor log_softmax(const Tensor& t, int64_t dim);
Tensor dropout(const Tensor& t, double p, bool training, Generator* gen = nullptr);

// ---- shape and indexing ----
// cat: shapes equal except in dim, dtypes promoted as torch.cat; 1-d tensors of size 0 are
// skipped (PyTorch's legacy rule). The result is channels-last when every input is.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);  // equal shapes
// split and chunk return views. split: pieces of split_size, the last possibly smaller.
// chunk: pieces of ceil(n / chunks), so fewer than chunks may come back (as torch.chunk).
std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& t, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim = 0);
Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& t, int64_t dim, const Tensor& index);
// pad: pairs from the last dim backwards (left, right, top, bottom, ...), as F.pad; negative
// pads crop. mode: Constant (any input), Reflect and Replicate (input with one or two more dims
// than padded pairs: (C,*) or (N,C,*)), Circular ((N,C,*) only).
Tensor pad(const Tensor& t, const std::vector<int64_t>& pad, PadMode mode = PadMode::Constant, double value = 0);
// roll: dims empty rolls the flattened tensor by shifts[0] (as torch.roll).
Tensor roll(const Tensor& t, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims);
// input (N,C,H,W) -> (N,C,Ho,Wo); mode Nearest (PyTorch's legacy nearest), Bilinear, Bicubic
// (A = -0.75). Give size or scale_factor (Ho = floor(H * scale); the kernels then use
// 1/scale, as F.interpolate with recompute_scale_factor unset). antialias (bilinear, bicubic)
// follows PyTorch's separable antialiased filters. The result keeps the input's memory format.
Tensor interpolate(const Tensor& input, std::optional<std::array<int64_t, 2>> size,
                   std::optional<std::array<double, 2>> scale_factor = std::nullopt,
                   InterpolateMode mode = InterpolateMode::Nearest, bool align_corners = false, bool antialias = false);

// ---- losses ----
// input (N,K) or (N,K,d1,...) logits (or (K) with a 0-d target), target int64 (N) or (N,d1,...)
// class indices, or floating class probabilities shaped as input; weight (K) optional. As
// PyTorch 1.13: the weighted mean divides by the summed weights of non-ignored targets, and
// label_smoothing eps gives (1 - eps) * nll + eps / K * (-sum_k w_k log p_k), reduced alike.
// A class index outside [0, K) other than ignore_index raises.
Tensor cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight = Tensor(),
                     int64_t ignore_index = -100, Reduction reduction = Reduction::Mean, double label_smoothing = 0.0);
Tensor nll_loss(const Tensor& input, const Tensor& target, const Tensor& weight = Tensor(), int64_t ignore_index = -100,
                Reduction reduction = Reduction::Mean);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
// target shaped as input; weight broadcasts to the input, pos_weight along the last dim (K).
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target, const Tensor& weight = Tensor(),
                                        Reduction reduction = Reduction::Mean, const Tensor& pos_weight = Tensor());

// ---- operators ----
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator/(Scalar a, const Tensor& b);
Tensor operator-(const Tensor& t);
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator!=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, Scalar b);
Tensor operator<(const Tensor& a, Scalar b);

// ---- helpers ----
// The broadcast shape of two shapes; throws naming op and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Sums t down to shape (undoes broadcasting), used by backward rules.
Tensor sum_to(const Tensor& t, const Shape& shape);
// A 0-d tensor of dtype holding value.
Tensor scalar_like(Scalar value, DType dtype);
// The dtype of a result of op on a and b (tensor-tensor and tensor-scalar rules of PyTorch).
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, Scalar b);
// Threads used by the kernels of every thread's ops from now on (an OpenMP team per calling
// thread); safe to call while other threads run ops. Results do not depend on it. Until it is
// called, OpenMP's default (OMP_NUM_THREADS, else the cores).
void set_num_threads(int n);
int get_num_threads();
// The instruction set of the CPU kernels: "avx512_bf16" (AVX-512 with AVX512_BF16's bfloat16
// dot products), "avx512", "avx2" or "generic" (the best the CPU has, or the environment
// variable TVC_ISA).
std::string cpu_isa();
// True when the CPU kernels multiply bfloat16 matrices with the CPU's own bfloat16 instructions
// (cpu_isa() "avx512_bf16"); elsewhere bfloat16 tensors still compute, converted to float32.
bool cpu_has_native_bfloat16();
// The fp32 peak of `threads` threads (0: get_num_threads()) in GFLOP/s, measured now: every
// thread runs the FMA loop of cpu_isa() (independent vector multiply-adds in registers) at once;
// the best of 5 runs of about seconds / 5 each. The yardstick of "% of peak" figures: machines of
// one kind differ (docs/benchmarks.md), so each measures its own.
double measure_fp32_peak_gflops(int threads = 0, double seconds = 0.25);
// The same for bfloat16 products with float32 sums: the loop of vdpbf16ps where
// cpu_has_native_bfloat16(), else the fp32 FMA loop (bfloat16 is multiplied by FMAs there).
double measure_bf16_peak_gflops(int threads = 0, double seconds = 0.25);
// True when every element of a and b is close: |a-b| <= atol + rtol*|b|.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

}  // namespace tvc
