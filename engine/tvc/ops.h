// tvc's ops, as free functions (the op list is tvc/op_list.h).
//
// All ops are differentiable where PyTorch's are, broadcast and promote types as PyTorch does,
// and raise tvc::Error naming the op, the argument and the shapes on bad input.
// Shape legend: N batch, C channels, H,W height and width, L length, K classes.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tvc/tensor.h"

namespace tvc {

// ---- random numbers ----
// A counter-based (Philox 4x32-10) generator: element i of a draw depends only on (seed,
// offset + i), so results do not depend on the thread count, and the state is two numbers.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  struct State {
    uint64_t seed = 0, offset = 0;
  };
  State state() const { return {seed_, offset_}; }
  void set_state(const State& s) { seed_ = s.seed, offset_ = s.offset; }
  void manual_seed(uint64_t seed) { seed_ = seed, offset_ = 0; }
  uint64_t seed() const { return seed_; }
  // Reserves n counters and returns the first.
  uint64_t advance(uint64_t n) {
    uint64_t first = offset_;
    offset_ += n;
    return first;
  }

 private:
  uint64_t seed_ = 0, offset_ = 0;
};
Generator& default_generator();
void manual_seed(uint64_t seed);

Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);   // U[0,1)
Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);  // N(0,1)
Tensor randint(int64_t low, int64_t high, const Shape& shape,
               TensorOptions options = {.dtype = DType::Int64}, Generator* gen = nullptr);
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
// approximate: "none" (erf) or "tanh".
Tensor gelu(const Tensor& t, const std::string& approximate = "none");
Tensor silu(const Tensor& t);
Tensor sigmoid(const Tensor& t);
Tensor hardsigmoid(const Tensor& t);
Tensor hardswish(const Tensor& t);
Tensor tanh(const Tensor& t);
Tensor softplus(const Tensor& t, double beta = 1, double threshold = 20);
Tensor mish(const Tensor& t);

// ---- reductions (dims empty = all dims) ----
Tensor sum(const Tensor& t, const Shape& dims = {}, bool keepdim = false,
           std::optional<DType> dtype = std::nullopt);
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
std::pair<Tensor, Tensor> topk(const Tensor& t, int64_t k, int64_t dim = -1, bool largest = true,
                               bool sorted = true);

// ---- linear algebra ----
Tensor bmm(const Tensor& a, const Tensor& b);     // (B,M,K) @ (B,K,N) -> (B,M,N)
Tensor matmul(const Tensor& a, const Tensor& b);  // torch.matmul rules, batch dims broadcast
// x (*,in) @ weight (out,in)^T + bias (out) -> (*,out)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- convolution and pooling ----
// input (N,C,H,W), weight (O,C/groups,kh,kw), bias (O) -> (N,O,Ho,Wo). Unbatched (C,H,W) input
// is accepted as PyTorch does. The output is channels-last when the input is.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
              std::array<int64_t, 2> stride = {1, 1}, std::array<int64_t, 2> padding = {0, 0},
              std::array<int64_t, 2> dilation = {1, 1}, int64_t groups = 1);
// input (N,C,L), weight (O,C/groups,k), bias (O) -> (N,O,Lo).
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
              int64_t stride = 1, int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1);
// stride empty = kernel size.
Tensor max_pool2d(const Tensor& input, std::array<int64_t, 2> kernel,
                  std::optional<std::array<int64_t, 2>> stride = std::nullopt,
                  std::array<int64_t, 2> padding = {0, 0}, std::array<int64_t, 2> dilation = {1, 1},
                  bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& input, std::array<int64_t, 2> kernel,
                  std::optional<std::array<int64_t, 2>> stride = std::nullopt,
                  std::array<int64_t, 2> padding = {0, 0}, bool ceil_mode = false,
                  bool count_include_pad = true, std::optional<int64_t> divisor_override = std::nullopt);
Tensor adaptive_avg_pool2d(const Tensor& input, std::array<int64_t, 2> output_size);
Tensor adaptive_max_pool2d(const Tensor& input, std::array<int64_t, 2> output_size);

// ---- normalisation ----
// input (N,C,*). In training mode (or without running stats) normalises with batch statistics
// and, when running stats are given, updates them in place with momentum (nullopt: cumulative
// moving average, using num_batches_tracked which must then be given and is incremented).
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training,
                  std::optional<double> momentum = 0.1, double eps = 1e-5,
                  const Tensor& num_batches_tracked = Tensor());
// Normalises over the trailing dims given by normalized_shape.
Tensor layer_norm(const Tensor& input, const Shape& normalized_shape,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), double eps = 1e-5);
// input (N,C,*), C divisible by num_groups.
Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor softmax(const Tensor& t, int64_t dim);
Tensor log_softmax(const Tensor& t, int64_t dim);
Tensor dropout(const Tensor& t, double p, bool training, Generator* gen = nullptr);

// ---- shape and indexing ----
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& t, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim = 0);
Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& t, int64_t dim, const Tensor& index);
// pad: pairs from the last dim backwards (left, right, top, bottom, ...), as F.pad.
// mode: "constant", "reflect", "replicate", "circular".
Tensor pad(const Tensor& t, const std::vector<int64_t>& pad, const std::string& mode = "constant",
           double value = 0);
Tensor roll(const Tensor& t, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims);
// input (N,C,H,W); mode "nearest", "bilinear", "bicubic". Give size or scale_factor.
Tensor interpolate(const Tensor& input, std::optional<std::array<int64_t, 2>> size,
                   std::optional<std::array<double, 2>> scale_factor = std::nullopt,
                   const std::string& mode = "nearest", bool align_corners = false,
                   bool antialias = false);

// ---- losses (reduction: "mean", "sum" or "none") ----
// input (N,K) or (N,K,d1,...) logits, target int64 (N) or (N,d1,...) class indices;
// weight (K) optional.
Tensor cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight = Tensor(),
                     int64_t ignore_index = -100, const std::string& reduction = "mean",
                     double label_smoothing = 0.0);
Tensor nll_loss(const Tensor& input, const Tensor& target, const Tensor& weight = Tensor(),
                int64_t ignore_index = -100, const std::string& reduction = "mean");
Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean");
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const Tensor& weight = Tensor(),
                                        const std::string& reduction = "mean",
                                        const Tensor& pos_weight = Tensor());

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
// Threads used by kernels (OpenMP pool). Results do not depend on it.
void set_num_threads(int n);
int get_num_threads();
// True when every element of a and b is close: |a-b| <= atol + rtol*|b|.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

}  // namespace tvc
