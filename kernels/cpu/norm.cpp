// CPU kernels: training-mode batch norm's statistics and its backward, layer norm and its
// backward, and softmax (kernel.h).
//
// Shape legend: x is (N, C, *), seen as (N, C, S) with S the product of the trailing dims, n = N*S
// values per channel; it is dense either as (N, C, S) (contiguous) or with C innermost
// (channels-last): the op layer makes it one of the two. Sums run in double per channel, with
// the work split over channels, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_kernels.h"
#include "gemm.h"
#include "loops.h"

namespace tvc::cpu {

// Layer norm's rows in float64, as the float32 kernels of gemm.h (gemm_kernels.h, LayerNormRowF32
// and LayerNormBackwardRowF32) compute them, in scalar code.
static void layer_norm_row(int64_t n, const double* x, const double* w, const double* b, double eps, double* y,
                           double* mean_out, double* rstd_out) {
  const double mean = sum_in_lanes<double>(n, [&](int64_t i) { return x[i]; }) / static_cast<double>(n);
  const double var =
      sum_in_lanes<double>(n, [&](int64_t i) { return (x[i] - mean) * (x[i] - mean); }) / static_cast<double>(n);
  const double rstd = 1.0 / std::sqrt(var + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * rstd * w[i] + b[i];
  *mean_out = mean;
  *rstd_out = rstd;
}

static void layer_norm_backward_row(int64_t n, const double* dy, const double* x, double mean, double rstd,
                                    const double* w, double* dx, double* sum_dy_xhat, double* sum_dy) {
  double s_g = 0, s_gx = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double xhat = (x[i] - mean) * rstd, g = dy[i] * w[i];
    s_g += g;
    s_gx += g * xhat;
    sum_dy_xhat[i] += dy[i] * xhat;
    sum_dy[i] += dy[i];
  }
  const double mean_g = s_g / static_cast<double>(n), mean_gx = s_gx / static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) dx[i] = rstd * (dy[i] * w[i] - mean_g - (x[i] - mean) * rstd * mean_gx);
}

namespace {

// The dims of a (N, C, S) view of x and whether C is innermost.
struct ChannelView {
  int64_t N, C, S;
  bool channels_last;
};

ChannelView channel_view(const Tensor& x) {
  ChannelView v{x.shape()[0], x.shape()[1], 1, false};
  for (int64_t d = 2; d < x.dim(); ++d) v.S *= x.shape()[d];
  v.channels_last = !x.is_contiguous();
  return v;
}

// in = (x) -> out = (mean, var): biased statistics per channel.
void batch_norm_stats_kernel(const KernelArgs& args) {
  const Tensor& x = args.in[0];
  dispatch_floating(x.dtype(), Op::batch_norm_stats, [&]<typename T>() {
    using C = compute_t<T>;
    const ChannelView v = channel_view(x);
    const T* xp = x.data_ptr<T>();
    T* mean = args.out[0].data_ptr<T>();
    T* var = args.out[1].data_ptr<T>();
    const double n = static_cast<double>(v.N * v.S);
    auto value = [](T t) { return static_cast<double>(static_cast<C>(t)); };
    if (!v.channels_last) {
      // A channel's sums over its N rows: float32's by the instruction set's kernels, the same
      // bits as these (gemm_kernels.h, BatchNormRowsF32).
      const int64_t rs = v.C * v.S;
      auto channel_sum = [&](const T* x0) {
        if constexpr (std::is_same_v<T, float>) return batch_norm_rows().sum(v.N, v.S, rs, x0);
        double sum = 0;
        for (int64_t i = 0; i < v.N; ++i)
          sum += sum_in_lanes<double>(v.S, [&](int64_t s) { return value(x0[i * rs + s]); });
        return sum;
      };
      auto channel_squares = [&](const T* x0, double m) {
        if constexpr (std::is_same_v<T, float>) return batch_norm_rows().squares(v.N, v.S, rs, x0, m);
        double squares = 0;
        for (int64_t i = 0; i < v.N; ++i)
          squares += sum_in_lanes<double>(v.S, [&](int64_t s) {
            const double d = value(x0[i * rs + s]) - m;
            return d * d;
          });
        return squares;
      };
      parallel_for(v.C, v.N * v.S, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) {
          const double m = channel_sum(xp + c * v.S) / n, squares = channel_squares(xp + c * v.S, m);
          mean[c] = static_cast<T>(m);
          var[c] = static_cast<T>(squares / n);
        }
      });
      return;
    }
    // Channels-last: rows of C values; each thread takes a block of channels over every row.
    const int64_t rows = v.N * v.S;
    parallel_for(v.C, rows, [&](int64_t b, int64_t e) {
      std::vector<double> sum(e - b, 0.0), squares(e - b, 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = b; c < e; ++c) sum[c - b] += value(xp[r * v.C + c]);
      for (int64_t c = b; c < e; ++c) sum[c - b] /= n;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = b; c < e; ++c) {
          const double d = value(xp[r * v.C + c]) - sum[c - b];
          squares[c - b] += d * d;
        }
      for (int64_t c = b; c < e; ++c) {
        mean[c] = static_cast<T>(sum[c - b]);
        var[c] = static_cast<T>(squares[c - b] / n);
      }
    });
  });
}

// in = (grad_out, x, mean, invstd, weight[, relu_y]) -> out = (grad_x, sum_dy_xhat, sum_dy) (kernel.h).
void batch_norm_backward_kernel(const KernelArgs& args) {
  const Tensor& dy = args.in[0];
  const Tensor& x = args.in[1];
  dispatch_floating(x.dtype(), Op::batch_norm_backward, [&]<typename T>() {
    using C = compute_t<T>;
    const ChannelView v = channel_view(x);
    const T* dyp = dy.data_ptr<T>();
    const T* xp = x.data_ptr<T>();
    const T* mean = args.in[2].data_ptr<T>();
    const T* invstd = args.in[3].data_ptr<T>();
    const T* weight = args.in[4].data_ptr<T>();
    T* dx = args.out[0].data_ptr<T>();
    T* sum_dy_xhat = args.out[1].data_ptr<T>();
    T* sum_dy = args.out[2].data_ptr<T>();
    const T* relu_y = args.in.size() > 5 ? args.in[5].data_ptr<T>() : nullptr;
    const double n = static_cast<double>(v.N * v.S);
    auto value = [](T t) { return static_cast<double>(static_cast<C>(t)); };
    // The gradient at element i: grad_out, or with relu_y ReLU's backward of it (relu_backward's
    // clamp_backward: 1 or 0 in the compute type, from the smallest positive value up).
    auto dy_at = [&](int64_t i) {
      if (!relu_y) return dyp[i];
      const C lo = std::numeric_limits<C>::denorm_min();
      return static_cast<T>(static_cast<C>(dyp[i]) * static_cast<C>(static_cast<C>(relu_y[i]) >= lo));
    };
    // dx = w * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)), xhat = (x - mean) * invstd, as
    // a * dy + b * (x - mean) + d per channel.
    struct Coefficients {
      C a, b, d;
    };
    auto coefficients = [&](int64_t c, double s_dy, double s_dy_xc) {
      const double inv = value(invstd[c]), w = value(weight[c]);
      sum_dy[c] = static_cast<T>(s_dy);
      sum_dy_xhat[c] = static_cast<T>(s_dy_xc * inv);
      return Coefficients{static_cast<C>(w * inv), static_cast<C>(-w * inv * inv * inv * s_dy_xc / n),
                          static_cast<C>(-w * inv * s_dy / n)};
    };
    auto grad = [](const Coefficients& k, T g, T xv, C m) {
      return static_cast<T>(k.a * static_cast<C>(g) + k.b * (static_cast<C>(xv) - m) + k.d);
    };
    if (!v.channels_last) {
      // A channel's sums and gradient over its N rows: float32's by the instruction set's kernels,
      // the same bits as these (gemm_kernels.h, BatchNormRowsF32).
      const int64_t rs = v.C * v.S;
      auto channel_sums = [&](int64_t at, double m, double* s_dy, double* s_dy_xc) {
        if constexpr (std::is_same_v<T, float>)
          return batch_norm_rows().grad_sums(v.N, v.S, rs, dyp + at, relu_y ? relu_y + at : nullptr, xp + at, m, s_dy,
                                             s_dy_xc);
        *s_dy = 0, *s_dy_xc = 0;
        for (int64_t i = 0; i < v.N; ++i) {
          const int64_t r = at + i * rs;
          *s_dy += sum_in_lanes<double>(v.S, [&](int64_t s) { return value(dy_at(r + s)); });
          *s_dy_xc +=
              sum_in_lanes<double>(v.S, [&](int64_t s) { return value(dy_at(r + s)) * (value(xp[r + s]) - m); });
        }
      };
      auto channel_grad = [&](int64_t at, const Coefficients& k, C mc) {
        if constexpr (std::is_same_v<T, float>)
          return batch_norm_rows().grad(v.N, v.S, rs, dyp + at, relu_y ? relu_y + at : nullptr, xp + at, k.a, k.b, k.d,
                                        mc, dx + at);
        for (int64_t i = 0; i < v.N; ++i)
          for (int64_t s = 0; s < v.S; ++s)
            dx[at + i * rs + s] = grad(k, dy_at(at + i * rs + s), xp[at + i * rs + s], mc);
      };
      parallel_for(v.C, v.N * v.S, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) {
          double s_dy, s_dy_xc;
          channel_sums(c * v.S, value(mean[c]), &s_dy, &s_dy_xc);
          channel_grad(c * v.S, coefficients(c, s_dy, s_dy_xc), static_cast<C>(mean[c]));
        }
      });
      return;
    }
    const int64_t rows = v.N * v.S;
    parallel_for(v.C, rows, [&](int64_t b, int64_t e) {
      std::vector<double> s_dy(e - b, 0.0), s_dy_xc(e - b, 0.0), m(e - b);
      for (int64_t c = b; c < e; ++c) m[c - b] = value(mean[c]);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = b; c < e; ++c) {
          const double g = value(dy_at(r * v.C + c));
          s_dy[c - b] += g;
          s_dy_xc[c - b] += g * (value(xp[r * v.C + c]) - m[c - b]);
        }
      std::vector<Coefficients> k;
      std::vector<C> mc;
      for (int64_t c = b; c < e; ++c) {
        k.push_back(coefficients(c, s_dy[c - b], s_dy_xc[c - b]));
        mc.push_back(static_cast<C>(mean[c]));
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = b; c < e; ++c)
          dx[r * v.C + c] = grad(k[c - b], dy_at(r * v.C + c), xp[r * v.C + c], mc[c - b]);
    });
  });
}

// Calls f.template operator()<T>() for float32 or float64, the dtypes of the layer norm kernels.
template <typename F>
void dispatch_float_or_double(DType dtype, Op op, F&& f) {
  if (dtype == DType::Float32) return f.template operator()<float>();
  if (dtype == DType::Float64) return f.template operator()<double>();
  unsupported_dtype(op, dtype, Device::CPU);
}

// in = (x, weight, bias) -> out = (y, mean, rstd) (kernel.h): one row kernel call per row.
void layer_norm_kernel(const KernelArgs& args) {
  const Tensor& x = args.in[0];
  const int64_t D = args.in[1].numel(), R = D == 0 ? 0 : x.numel() / D;
  const double eps = args.p<LayerNormParams>().eps;
  dispatch_float_or_double(x.dtype(), Op::layer_norm, [&]<typename T>() {
    const T *xp = x.data_ptr<T>(), *w = args.in[1].data_ptr<T>(), *b = args.in[2].data_ptr<T>();
    T *y = args.out[0].data_ptr<T>(), *mean = args.out[1].data_ptr<T>(), *rstd = args.out[2].data_ptr<T>();
    parallel_for(R, 4 * D, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        layer_norm_row(D, xp + r * D, w, b, static_cast<T>(eps), y + r * D, mean + r, rstd + r);
    });
  });
}

// Rows per block of layer norm's backward: each block gathers the weight's and the bias's
// gradients over its rows in its own sums, which are then added over blocks in order.
constexpr int64_t kLayerNormBlockRows = 64;

// in = (grad_out, x, mean, rstd, weight) -> out = (grad_x, sum_dy_xhat, sum_dy) (kernel.h).
void layer_norm_backward_kernel(const KernelArgs& args) {
  const Tensor& x = args.in[1];
  const int64_t D = args.in[4].numel(), R = D == 0 ? 0 : x.numel() / D;
  const int64_t blocks = (R + kLayerNormBlockRows - 1) / kLayerNormBlockRows;
  dispatch_float_or_double(x.dtype(), Op::layer_norm_backward, [&]<typename T>() {
    const T *dy = args.in[0].data_ptr<T>(), *xp = x.data_ptr<T>(), *mean = args.in[2].data_ptr<T>(),
            *rstd = args.in[3].data_ptr<T>(), *w = args.in[4].data_ptr<T>();
    T *dx = args.out[0].data_ptr<T>(), *sum_dy_xhat = args.out[1].data_ptr<T>(), *sum_dy = args.out[2].data_ptr<T>();
    // Per block: D sums of dy * xhat, then D of dy.
    std::vector<T> partial(static_cast<size_t>(2 * blocks * D), T(0));
    parallel_for(blocks, kLayerNormBlockRows * 4 * D, [&](int64_t begin, int64_t end) {
      for (int64_t blk = begin; blk < end; ++blk) {
        T* sums = partial.data() + 2 * blk * D;
        for (int64_t r = blk * kLayerNormBlockRows; r < std::min(R, (blk + 1) * kLayerNormBlockRows); ++r)
          layer_norm_backward_row(D, dy + r * D, xp + r * D, mean[r], rstd[r], w, dx + r * D, sums, sums + D);
      }
    });
    parallel_for(D, 2 * blocks, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        double s_w = 0, s_b = 0;
        for (int64_t blk = 0; blk < blocks; ++blk) {
          s_w += static_cast<double>(partial[2 * blk * D + j]);
          s_b += static_cast<double>(partial[(2 * blk + 1) * D + j]);
        }
        sum_dy_xhat[j] = static_cast<T>(s_w);
        sum_dy[j] = static_cast<T>(s_b);
      }
    });
  });
}

}  // namespace

void softmax_rows(int64_t rows, int64_t n, const double* x, double* y) {
  for (int64_t r = 0; r < rows; ++r, x += n, y += n) {
    double m = x[0];
    for (int64_t i = 1; i < n; ++i) m = x[i] > m || x[i] != x[i] ? x[i] : m;
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
    for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - m) / s;
  }
}

namespace {

// in = (x) -> out: softmax along params.dim of the contiguous x, seen as (outer, n, inner). Float32
// rows (inner == 1, as attention's) through the vector e^x and a sum in double; other slices
// element by element in the compute type. A slice holding NaN gives NaN everywhere.
void softmax_kernel(const KernelArgs& args) {
  const Tensor& x = args.in[0];
  const Tensor& y = args.out[0];
  const int64_t dim = args.p<SoftmaxParams>().dim, n = x.shape()[dim];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.shape()[d];
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.shape()[d];
  dispatch_floating(x.dtype(), Op::softmax, [&]<typename T>() {
    using C = compute_t<T>;
    const T* xp = x.data_ptr<T>();
    T* yp = y.data_ptr<T>();
    if constexpr (std::is_same_v<T, float>) {
      if (inner == 1) {
        parallel_for(outer, 8 * n, [&](int64_t b, int64_t e) { softmax_rows(e - b, n, xp + b * n, yp + b * n); });
        return;
      }
    }
    parallel_for(outer * inner, 8 * n, [&](int64_t b, int64_t e) {
      for (int64_t it = b; it < e; ++it) {
        const int64_t base = it / inner * n * inner + it % inner;
        auto value = [&](int64_t i) { return static_cast<C>(xp[base + i * inner]); };
        C m = value(0);
        for (int64_t i = 1; i < n; ++i) m = value(i) > m || value(i) != value(i) ? value(i) : m;
        C s = 0;
        for (int64_t i = 0; i < n; ++i) s += std::exp(value(i) - m);
        for (int64_t i = 0; i < n; ++i) yp[base + i * inner] = static_cast<T>(std::exp(value(i) - m) / s);
      }
    });
  });
}

}  // namespace

void register_norm_kernels(KernelRegistry& r) {
  const Device cpu = Device::CPU;
  r.set(Op::softmax, cpu, softmax_kernel);
  r.set(Op::batch_norm_stats, cpu, batch_norm_stats_kernel);
  r.set(Op::batch_norm_backward, cpu, batch_norm_backward_kernel);
  r.set(Op::layer_norm, cpu, layer_norm_kernel);
  r.set(Op::layer_norm_backward, cpu, layer_norm_backward_kernel);
}

}  // namespace tvc::cpu
