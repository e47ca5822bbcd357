// CPU kernels: copy/cast, fill, arange, unary and binary elementwise ops, where, lerp.
// Shape legend: all operands have the output's shape (inputs pre-broadcast by the op).
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu_kernels.h"
#include "gemm.h"
#include "loops.h"

namespace tvc::cpu {
namespace {

// ---------------------------------------------------------------- copy, fill, arange

void copy_kernel(const KernelArgs& args) {
  const Tensor& src = args.in[0];
  const Tensor& dst = args.out[0];
  if (dst.numel() == 0) return;
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    if (src.raw_data() != dst.raw_data())
      std::memmove(dst.raw_data(), src.raw_data(), src.numel() * src.element_size());
    return;
  }
  dispatch_all(dst.dtype(), Op::copy, [&]<typename TOut>() {
    dispatch_all(src.dtype(), Op::copy, [&]<typename TIn>() {
      using C = compute_t<TIn>;
      map_elements<TOut, TIn, C, 2>({&dst, &src}, [](C v) {
        if constexpr (std::is_same_v<TOut, bool>)
          return v != C(0);
        else if constexpr (std::is_same_v<TOut, Half> || std::is_same_v<TOut, BFloat16>)
          return static_cast<float>(v);
        else
          return v;
      });
    });
  });
}

void fill_kernel(const KernelArgs& args) {
  const Tensor& out = args.out[0];
  const auto& params = args.p<FillParams>();
  dispatch_all(out.dtype(), Op::fill, [&]<typename T>() {
    T v = static_cast<T>(static_cast<compute_t<T>>(params.a));
    if constexpr (std::is_integral_v<T>)
      if (params.integer) v = static_cast<T>(*params.integer);
    for_each_strided<1>({&out}, [&](std::array<char*, 1> p, const std::array<int64_t, 1>& st, int64_t n) {
      if (st[0] == sizeof(T)) {
        T* o = reinterpret_cast<T*>(p[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = v;
      } else {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * st[0]) = v;
      }
    });
  });
}

void arange_kernel(const KernelArgs& args) {
  const Tensor& out = args.out[0];
  const auto& p = args.p<FillParams>();
  dispatch_numeric(out.dtype(), Op::arange, [&]<typename T>() {
    T* o = out.data_ptr<T>();
    int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i)
      o[i] = static_cast<T>(static_cast<compute_t<T>>(p.a + static_cast<double>(i) * p.b));
  });
}

// ---------------------------------------------------------------- unary

template <typename F>
void unary_floating(const KernelArgs& args, Op op, F f) {
  const Tensor& in = args.in[0];
  const Tensor& out = args.out[0];
  dispatch_floating(in.dtype(), op, [&]<typename T>() {
    using C = compute_t<T>;
    map_elements<T, T, C, 2>({&out, &in}, [&](C x) { return f(x); });
  });
}

template <typename F>
void unary_numeric(const KernelArgs& args, Op op, F f) {
  const Tensor& in = args.in[0];
  const Tensor& out = args.out[0];
  dispatch_numeric(in.dtype(), op, [&]<typename T>() {
    using C = compute_t<T>;
    map_elements<T, T, C, 2>({&out, &in}, [&](C x) { return static_cast<C>(f(x)); });
  });
}

// A float32 function of the vector kernels (gemm.h) when input and output are dense in the same
// layout: true when it has been computed.
bool vector_function_dense(const KernelArgs& args, VectorFunction f) {
  const Tensor& in = args.in[0];
  const Tensor& out = args.out[0];
  if (in.dtype() != DType::Float32 || out.dtype() != DType::Float32 || in.strides() != out.strides() ||
      !(in.is_contiguous() || in.is_contiguous(MemoryFormat::ChannelsLast)))
    return false;
  const float* x = in.data_ptr<float>();
  float* y = out.data_ptr<float>();
  parallel_for(in.numel(), 1,
               [&](int64_t begin, int64_t end) { vector_function(f, end - begin, x + begin, y + begin); });
  return true;
}

template <typename C>
C sigmoid_of(C x) {
  return C(1) / (C(1) + std::exp(-x));
}

void neg_kernel(const KernelArgs& a) {
  unary_numeric(a, Op::neg, [](auto x) { return -x; });
}
void abs_kernel(const KernelArgs& a) {
  unary_numeric(a, Op::abs, [](auto x) { return x < 0 ? -x : x; });
}
void sign_kernel(const KernelArgs& a) {
  unary_numeric(a, Op::sign, [](auto x) { return (decltype(x)(0) < x) - (x < decltype(x)(0)); });
}
void exp_kernel(const KernelArgs& a) {
  if (vector_function_dense(a, VectorFunction::exp)) return;
  unary_floating(a, Op::exp, [](auto x) { return std::exp(x); });
}
void log_kernel(const KernelArgs& a) {
  unary_floating(a, Op::log, [](auto x) { return std::log(x); });
}
void sqrt_kernel(const KernelArgs& a) {
  unary_floating(a, Op::sqrt, [](auto x) { return std::sqrt(x); });
}
void rsqrt_kernel(const KernelArgs& a) {
  unary_floating(a, Op::rsqrt, [](auto x) { return decltype(x)(1) / std::sqrt(x); });
}
void erf_kernel(const KernelArgs& a) {
  unary_floating(a, Op::erf, [](auto x) { return std::erf(x); });
}
void relu_kernel(const KernelArgs& a) {
  unary_numeric(a, Op::relu, [](auto x) { return x < decltype(x)(0) ? decltype(x)(0) : x; });
}
void leaky_relu_kernel(const KernelArgs& a) {
  double slope = a.p<UnaryParams>().a;
  unary_floating(a, Op::leaky_relu, [slope](auto x) {
    using C = decltype(x);
    return x > C(0) ? x : x * static_cast<C>(slope);
  });
}
void gelu_kernel(const KernelArgs& a) {
  if (a.p<UnaryParams>().approximate_tanh) {
    unary_floating(a, Op::gelu, [](auto x) {
      using C = decltype(x);
      const C k = static_cast<C>(0.7978845608028654);  // sqrt(2/pi)
      return C(0.5) * x * (C(1) + std::tanh(k * (x + C(0.044715) * x * x * x)));
    });
  } else if (!vector_function_dense(a, VectorFunction::gelu)) {
    unary_floating(a, Op::gelu, [](auto x) {
      using C = decltype(x);
      return x * C(0.5) * (C(1) + std::erf(x * static_cast<C>(0.7071067811865476)));
    });
  }
}
void silu_kernel(const KernelArgs& a) {
  if (vector_function_dense(a, VectorFunction::silu)) return;
  unary_floating(a, Op::silu, [](auto x) { return x * sigmoid_of(x); });
}
void sigmoid_kernel(const KernelArgs& a) {
  if (vector_function_dense(a, VectorFunction::sigmoid)) return;
  unary_floating(a, Op::sigmoid, [](auto x) { return sigmoid_of(x); });
}
void hardsigmoid_kernel(const KernelArgs& a) {
  unary_floating(a, Op::hardsigmoid, [](auto x) {
    using C = decltype(x);
    return std::min(std::max(x + C(3), C(0)), C(6)) / C(6);
  });
}
void hardswish_kernel(const KernelArgs& a) {
  unary_floating(a, Op::hardswish, [](auto x) {
    using C = decltype(x);
    return x * std::min(std::max(x + C(3), C(0)), C(6)) / C(6);
  });
}
void tanh_kernel(const KernelArgs& a) {
  unary_floating(a, Op::tanh, [](auto x) { return std::tanh(x); });
}
void softplus_kernel(const KernelArgs& a) {
  double beta = a.p<UnaryParams>().a, threshold = a.p<UnaryParams>().b;
  unary_floating(a, Op::softplus, [beta, threshold](auto x) {
    using C = decltype(x);
    C bx = x * static_cast<C>(beta);
    return bx > static_cast<C>(threshold) ? x : std::log1p(std::exp(bx)) / static_cast<C>(beta);
  });
}
// clamp's bounds in the compute type C: a missing one is the type's infinity or extreme.
template <typename C>
std::pair<C, C> clamp_bounds(const UnaryParams& p) {
  using limits = std::numeric_limits<C>;
  return {p.has_a                ? static_cast<C>(p.a)
          : limits::has_infinity ? -limits::infinity()
                                 : limits::lowest(),
          p.has_b                ? static_cast<C>(p.b)
          : limits::has_infinity ? limits::infinity()
                                 : limits::max()};
}

void clamp_kernel(const KernelArgs& a) {
  const auto& p = a.p<UnaryParams>();
  // Branch-free (vectorisable); NaN compares false both ways, so it passes through as in PyTorch.
  unary_numeric(a, Op::clamp, [p](auto x) {
    const auto [lo, hi] = clamp_bounds<decltype(x)>(p);
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
  });
}

// in = (grad, x) -> out = grad * (lo <= x <= hi), the mask as 1 or 0 (kernel.h).
void clamp_backward_kernel(const KernelArgs& a) {
  const auto& p = a.p<UnaryParams>();
  const Tensor& out = a.out[0];
  dispatch_floating(out.dtype(), Op::clamp_backward, [&]<typename T>() {
    using C = compute_t<T>;
    const std::pair<C, C> bounds = clamp_bounds<C>(p);
    const C lo = bounds.first, hi = bounds.second;  // (clang 14 cannot capture structured bindings)
    map_elements<T, T, C, 3>({&out, &a.in[0], &a.in[1]},
                             // & rather than &&: no branch per element, so the loop vectorises
                             [lo, hi](C g, C x) { return g * static_cast<C>((x >= lo) & (x <= hi)); });
  });
}
// in = (grad, x) -> out (kernel.h): float32 runs contiguous in all three through the instruction
// set's kernel, the rest element by element in the compute type.
void gelu_backward_kernel(const KernelArgs& a) {
  const Tensor& out = a.out[0];
  auto derivative = [](auto g, auto x) {
    using C = decltype(x);
    const C cdf = C(0.5) * (C(1) + std::erf(x * static_cast<C>(0.7071067811865476)));
    return g * (cdf + x * static_cast<C>(0.3989422804014327) * std::exp(C(-0.5) * x * x));
  };
  if (out.dtype() == DType::Float32 && a.in[0].dtype() == DType::Float32 && a.in[1].dtype() == DType::Float32) {
    for_each_strided<3>(
        {&out, &a.in[0], &a.in[1]}, [&](std::array<char*, 3> p, const std::array<int64_t, 3>& st, int64_t n) {
          if (st[0] == 4 && st[1] == 4 && st[2] == 4) {
            gelu_backward(n, reinterpret_cast<const float*>(p[1]), reinterpret_cast<const float*>(p[2]),
                          reinterpret_cast<float*>(p[0]));
            return;
          }
          for (int64_t i = 0; i < n; ++i)
            *reinterpret_cast<float*>(p[0] + i * st[0]) = derivative(*reinterpret_cast<const float*>(p[1] + i * st[1]),
                                                                     *reinterpret_cast<const float*>(p[2] + i * st[2]));
        });
    return;
  }
  dispatch_floating(out.dtype(), Op::gelu_backward, [&]<typename T>() {
    map_elements<T, T, compute_t<T>, 3>({&out, &a.in[0], &a.in[1]}, derivative);
  });
}
void pow_scalar_kernel(const KernelArgs& a) {
  double e = a.p<UnaryParams>().a;
  if (e == 2) {
    unary_numeric(a, Op::pow_scalar, [](auto x) { return x * x; });
    return;
  }
  unary_floating(a, Op::pow_scalar, [e](auto x) {
    using C = decltype(x);
    return e == 0.5 ? std::sqrt(x) : std::pow(x, static_cast<C>(e));
  });
}

// ---------------------------------------------------------------- binary

template <typename F>
void binary_numeric(const KernelArgs& args, Op op, F f) {
  const Tensor& a = args.in[0];
  const Tensor& b = args.in[1];
  const Tensor& out = args.out[0];
  dispatch_all(a.dtype(), op, [&]<typename T>() {
    using C = compute_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      map_elements<T, T, bool, 3>({&out, &a, &b}, [&](bool x, bool y) { return static_cast<bool>(f(x, y)); });
    } else {
      map_elements<T, T, C, 3>({&out, &a, &b}, [&](C x, C y) { return static_cast<C>(f(x, y)); });
    }
  });
}

template <typename F>
void compare(const KernelArgs& args, Op op, F f) {
  const Tensor& a = args.in[0];
  const Tensor& b = args.in[1];
  const Tensor& out = args.out[0];
  dispatch_all(a.dtype(), op, [&]<typename T>() {
    using C = compute_t<T>;
    map_elements<bool, T, C, 3>({&out, &a, &b}, [&](C x, C y) { return f(x, y); });
  });
}

void add_kernel(const KernelArgs& a) {
  binary_numeric(a, Op::add, [](auto x, auto y) { return x + y; });
}
void sub_kernel(const KernelArgs& a) {
  binary_numeric(a, Op::sub, [](auto x, auto y) { return x - y; });
}
void mul_kernel(const KernelArgs& a) {
  binary_numeric(a, Op::mul, [](auto x, auto y) { return x * y; });
}
void div_kernel(const KernelArgs& a) {
  if (!is_floating(a.in[0].dtype())) unsupported_dtype(Op::div, a.in[0].dtype(), Device::CPU);
  binary_numeric(a, Op::div, [](auto x, auto y) { return x / y; });
}
void pow_kernel(const KernelArgs& a) {
  if (!is_floating(a.in[0].dtype())) unsupported_dtype(Op::pow, a.in[0].dtype(), Device::CPU);
  binary_numeric(a, Op::pow, [](auto x, auto y) { return std::pow(x, y); });
}
template <bool kMax>
void extremum_kernel(const KernelArgs& a) {
  binary_numeric(a, kMax ? Op::maximum : Op::minimum, [](auto x, auto y) {
    using C = decltype(x);
    if constexpr (std::is_floating_point_v<C>) {
      if (std::isnan(x)) return x;
      if (std::isnan(y)) return y;
    }
    return kMax ? (x > y ? x : y) : (x < y ? x : y);
  });
}
void eq_kernel(const KernelArgs& a) {
  compare(a, Op::eq, [](auto x, auto y) { return x == y; });
}
void ne_kernel(const KernelArgs& a) {
  compare(a, Op::ne, [](auto x, auto y) { return x != y; });
}
void lt_kernel(const KernelArgs& a) {
  compare(a, Op::lt, [](auto x, auto y) { return x < y; });
}
void le_kernel(const KernelArgs& a) {
  compare(a, Op::le, [](auto x, auto y) { return x <= y; });
}
void gt_kernel(const KernelArgs& a) {
  compare(a, Op::gt, [](auto x, auto y) { return x > y; });
}
void ge_kernel(const KernelArgs& a) {
  compare(a, Op::ge, [](auto x, auto y) { return x >= y; });
}

// in = (condition bool, a, b) -> out: condition ? a : b.
void where_kernel(const KernelArgs& args) {
  const Tensor& cond = args.in[0];
  const Tensor& a = args.in[1];
  const Tensor& b = args.in[2];
  const Tensor& out = args.out[0];
  TVC_CHECK(cond.dtype() == DType::Bool, "where: condition must be bool, got ", dtype_name(cond.dtype()));
  dispatch_all(a.dtype(), Op::where, [&]<typename T>() {
    for_each_strided<4>({&out, &cond, &a, &b}, [](std::array<char*, 4> p, const std::array<int64_t, 4>& st, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        bool c = *reinterpret_cast<const bool*>(p[1] + i * st[1]);
        *reinterpret_cast<T*>(p[0] + i * st[0]) = *reinterpret_cast<const T*>(p[c ? 2 : 3] + i * st[c ? 2 : 3]);
      }
    });
  });
}

// ---------------------------------------------------------------- channel_affine

// in = (x, mean, scale, bias) broadcast to out -> out = (x - mean) * scale + bias (kernel.h).
void channel_affine_kernel(const KernelArgs& args) {
  const Tensor& out = args.out[0];
  const bool relu = args.params && args.p<ChannelAffineParams>().relu;
  dispatch_floating(out.dtype(), Op::channel_affine, [&]<typename T>() {
    using C = compute_t<T>;
    // Each step rounded to T, as the separate ops: a no-op for float and double. The ReLU as a
    // select (NaN kept).
    auto affine = [relu](C x, C m, C s, C b) {
      C centered = static_cast<C>(static_cast<T>(x - m));
      const T y = static_cast<T>(static_cast<C>(static_cast<T>(centered * s)) + b);
      return relu && static_cast<C>(y) < C(0) ? T(0) : y;
    };
    for_each_strided<5>({&out, &args.in[0], &args.in[1], &args.in[2], &args.in[3]},
                        [&](std::array<char*, 5> p, const std::array<int64_t, 5>& st, int64_t n) {
                          auto at = [&](int k, int64_t i) { return *reinterpret_cast<const T*>(p[k] + i * st[k]); };
                          auto* y = reinterpret_cast<T*>(p[0]);
                          if (st[0] == sizeof(T) && st[1] == sizeof(T) && st[2] == 0 && st[3] == 0 && st[4] == 0) {
                            // a row of one channel (NCHW): the constants hoisted, a loop that vectorises
                            const T* x = reinterpret_cast<const T*>(p[1]);
                            const C m = at(2, 0), s = at(3, 0), b = at(4, 0);
                            for (int64_t i = 0; i < n; ++i) y[i] = affine(x[i], m, s, b);
                          } else {
                            for (int64_t i = 0; i < n; ++i)
                              *reinterpret_cast<T*>(p[0] + i * st[0]) = affine(at(1, i), at(2, i), at(3, i), at(4, i));
                          }
                        });
  });
}

// ---------------------------------------------------------------- lerp

// PyTorch's lerp formula: start + w * (end - start) for |w| < 0.5, else
// end - (end - start) * (1 - w), so that w = 0 gives start and w = 1 gives end exactly.
template <typename C>
C lerp_value(C start, C end, C w, bool small_weight) {
  return small_weight ? start + w * (end - start) : end - (end - start) * (C(1) - w);
}

// Elements per piece of work of the multi-tensor lerp and SGD step.
constexpr int64_t kLerpChunk = 16384;

// n pairs in one call (see LerpParams). Pairs whose output and operands share strides and cover
// their span without gaps (contiguous or channels-last) are cut into pieces of kLerpChunk
// elements, and the pieces of all pairs are split over the threads in one parallel loop; other
// pairs go through the strided loop one after another.
void lerp_kernel(const KernelArgs& args) {
  const size_t n = args.out.size();
  const double weight = args.p<LerpParams>().weight;
  const DType dt = args.out[0].dtype();
  dispatch_floating(dt, Op::lerp, [&]<typename T>() {
    using C = compute_t<T>;
    const C w = static_cast<C>(weight);
    const bool small_weight = std::abs(w) < C(0.5);
    struct Piece {
      T* out;
      const T* start;
      const T* end;
      int64_t count;
    };
    std::vector<Piece> pieces;
    for (size_t i = 0; i < n; ++i) {
      const Tensor& out = args.out[i];
      const Tensor& a = args.in[i];
      const Tensor& b = args.in[n + i];
      if (a.dtype() != dt || b.dtype() != dt || out.dtype() != dt) unsupported_dtype(Op::lerp, a.dtype(), Device::CPU);
      const int64_t count = out.numel();
      if (count == 0) continue;
      bool dense = out.is_contiguous() || out.is_contiguous(MemoryFormat::ChannelsLast);
      if (dense && a.strides() == out.strides() && b.strides() == out.strides()) {
        for (int64_t begin = 0; begin < count; begin += kLerpChunk)
          pieces.push_back({static_cast<T*>(out.raw_data()) + begin, static_cast<const T*>(a.raw_data()) + begin,
                            static_cast<const T*>(b.raw_data()) + begin, std::min(kLerpChunk, count - begin)});
      } else {
        map_elements<T, T, C, 3>({&out, &a, &b},
                                 [w, small_weight](C x, C y) { return lerp_value(x, y, w, small_weight); });
      }
    }
    parallel_for(static_cast<int64_t>(pieces.size()), kLerpChunk, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const Piece& piece = pieces[k];
        for (int64_t j = 0; j < piece.count; ++j)
          piece.out[j] =
              static_cast<T>(lerp_value(static_cast<C>(piece.start[j]), static_cast<C>(piece.end[j]), w, small_weight));
      }
    });
  });
}

// See SgdMomentumParams: the triples' elements cut into pieces of kLerpChunk, the pieces of all
// triples split over the threads in one parallel loop; each step rounded to T as the ops one by
// one round it (the scalars as T, as tensors of the parameters' dtype).
void sgd_momentum_kernel(const KernelArgs& args) {
  const size_t n = args.out.size() / 2;
  const SgdMomentumParams& q = args.p<SgdMomentumParams>();
  const DType dt = args.out[0].dtype();
  dispatch_floating(dt, Op::sgd_momentum, [&]<typename T>() {
    using C = compute_t<T>;
    auto scalar = [](double v) { return static_cast<C>(static_cast<T>(v)); };
    const C m = scalar(q.momentum), d = scalar(1 - q.dampening), l = scalar(-q.lr);
    const bool damped = 1 - q.dampening != 1;
    struct Piece {
      T *param, *buffer;
      const T* grad;
      int64_t count;
    };
    std::vector<Piece> pieces;
    for (size_t i = 0; i < n; ++i) {
      const int64_t count = args.out[i].numel();
      T* param = static_cast<T*>(args.out[i].raw_data());
      T* buffer = static_cast<T*>(args.out[n + i].raw_data());
      const T* grad = static_cast<const T*>(args.in[2 * n + i].raw_data());
      for (int64_t begin = 0; begin < count; begin += kLerpChunk)
        pieces.push_back({param + begin, buffer + begin, grad + begin, std::min(kLerpChunk, count - begin)});
    }
    parallel_for(static_cast<int64_t>(pieces.size()), kLerpChunk, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const Piece& piece = pieces[k];
        for (int64_t j = 0; j < piece.count; ++j) {
          const T momentum_part = static_cast<T>(static_cast<C>(piece.buffer[j]) * m);
          const T grad_part = damped ? static_cast<T>(static_cast<C>(piece.grad[j]) * d) : piece.grad[j];
          const T buffer = static_cast<T>(static_cast<C>(momentum_part) + static_cast<C>(grad_part));
          const T step = static_cast<T>(static_cast<C>(buffer) * l);
          piece.buffer[j] = buffer;
          piece.param[j] = static_cast<T>(static_cast<C>(piece.param[j]) + static_cast<C>(step));
        }
      }
    });
  });
}

}  // namespace

void register_elementwise_kernels(KernelRegistry& r) {
  const Device cpu = Device::CPU;
  r.set(Op::copy, cpu, copy_kernel);
  r.set(Op::fill, cpu, fill_kernel);
  r.set(Op::arange, cpu, arange_kernel);
  r.set(Op::neg, cpu, neg_kernel);
  r.set(Op::abs, cpu, abs_kernel);
  r.set(Op::sign, cpu, sign_kernel);
  r.set(Op::exp, cpu, exp_kernel);
  r.set(Op::log, cpu, log_kernel);
  r.set(Op::sqrt, cpu, sqrt_kernel);
  r.set(Op::rsqrt, cpu, rsqrt_kernel);
  r.set(Op::erf, cpu, erf_kernel);
  r.set(Op::relu, cpu, relu_kernel);
  r.set(Op::leaky_relu, cpu, leaky_relu_kernel);
  r.set(Op::gelu, cpu, gelu_kernel);
  r.set(Op::silu, cpu, silu_kernel);
  r.set(Op::sigmoid, cpu, sigmoid_kernel);
  r.set(Op::hardsigmoid, cpu, hardsigmoid_kernel);
  r.set(Op::hardswish, cpu, hardswish_kernel);
  r.set(Op::tanh, cpu, tanh_kernel);
  r.set(Op::softplus, cpu, softplus_kernel);
  r.set(Op::clamp, cpu, clamp_kernel);
  r.set(Op::clamp_backward, cpu, clamp_backward_kernel);
  r.set(Op::gelu_backward, cpu, gelu_backward_kernel);
  r.set(Op::pow_scalar, cpu, pow_scalar_kernel);
  r.set(Op::add, cpu, add_kernel);
  r.set(Op::sub, cpu, sub_kernel);
  r.set(Op::mul, cpu, mul_kernel);
  r.set(Op::div, cpu, div_kernel);
  r.set(Op::pow, cpu, pow_kernel);
  r.set(Op::maximum, cpu, extremum_kernel<true>);
  r.set(Op::minimum, cpu, extremum_kernel<false>);
  r.set(Op::eq, cpu, eq_kernel);
  r.set(Op::ne, cpu, ne_kernel);
  r.set(Op::lt, cpu, lt_kernel);
  r.set(Op::le, cpu, le_kernel);
  r.set(Op::gt, cpu, gt_kernel);
  r.set(Op::ge, cpu, ge_kernel);
  r.set(Op::where, cpu, where_kernel);
  r.set(Op::lerp, cpu, lerp_kernel);
  r.set(Op::sgd_momentum, cpu, sgd_momentum_kernel);
  r.set(Op::channel_affine, cpu, channel_affine_kernel);
}

}  // namespace tvc::cpu
