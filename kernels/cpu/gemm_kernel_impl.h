// The GEMM micro-kernel, written once with GCC vector extensions and compiled by each
// gemm_kernel_<isa>.cpp for its instruction set (vector width W lanes).
//
// Included only by those files. Everything here has internal linkage (anonymous namespace), so
// each instruction set gets its own copy and none can be merged with another's by the linker;
// for the same reason it includes no header beyond gemm_kernels.h.
#pragma once

#include <cstdint>

#include "gemm_kernels.h"

namespace tvc::cpu {
namespace {

// C = acc + beta * C for the top-left m x n part of an MR x (NV * W) tile (see
// GemmMicroKernelF32), through a row buffer when the tile is partial or C's columns strided;
// either way each element gets the same arithmetic.
template <typename T, int W, int MR, int NV, typename V>
void store_tile(const V (&acc)[MR][NV], T beta, T* __restrict c, int64_t c_rs, int64_t c_cs, int64_t m, int64_t n) {
  constexpr int NR = NV * W;
  bool direct = n == NR && c_cs == 1;
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i) {
    if (i >= m) break;
    T* crow = c + i * c_rs;
    T buf[NR] = {};
    T* dst = direct ? crow : buf;
    if (!direct && beta != T(0))
      for (int64_t j = 0; j < n; ++j) buf[j] = crow[j * c_cs];
#pragma GCC unroll 64
    for (int v = 0; v < NV; ++v) {
      V r = acc[i][v];
      if (beta != T(0)) {
        V old;
        __builtin_memcpy(&old, dst + v * W, sizeof(V));
        r += beta * old;
      }
      __builtin_memcpy(dst + v * W, &r, sizeof(V));
    }
    if (!direct)
      for (int64_t j = 0; j < n; ++j) crow[j * c_cs] = buf[j];
  }
}

// Fetches the C tile (m rows of n elements) while the k loop runs.
template <typename T>
void prefetch_tile(const T* c, int64_t c_rs, int64_t c_cs, int64_t m, int64_t n) {
  if (c_cs == 1)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; j += 64 / sizeof(T)) __builtin_prefetch(c + i * c_rs + j, 1);
}

// The micro-kernel (GemmMicroKernelF32/F64/BF16): MR elements of an A panel are broadcast, NR =
// NV * W columns of B are held in NV vectors of W lanes, the MR x NV accumulators (of T) stay in
// registers over the kn steps of k, each acc = Step::step(acc, a's element, b vector). P is the
// panels' element: T itself, or a pair of bfloat16 in 32 bits.
template <typename P, typename T, int W, int MR, int NV, typename Step>
void micro_kernel(int64_t kn, const P* __restrict a, const P* __restrict b, int64_t b_rs, T beta, T* __restrict c,
                  int64_t c_rs, int64_t c_cs, int64_t m, int64_t n) {
  typedef T V __attribute__((vector_size(W * sizeof(T))));
  typedef P PV __attribute__((vector_size(W * sizeof(P))));
  prefetch_tile(c, c_rs, c_cs, m, n);
  V acc[MR][NV];
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 64
    for (int v = 0; v < NV; ++v) acc[i][v] = V{};
#pragma GCC unroll 2
  for (int64_t k = 0; k < kn; ++k) {
    PV bv[NV];
#pragma GCC unroll 64
    for (int v = 0; v < NV; ++v) __builtin_memcpy(&bv[v], b + k * b_rs + v * W, sizeof(PV));
#pragma GCC unroll 64
    for (int i = 0; i < MR; ++i) {
      const P ai = a[k * MR + i];
#pragma GCC unroll 64
      for (int v = 0; v < NV; ++v) acc[i][v] = Step::step(acc[i][v], ai, bv[v]);
    }
  }
  store_tile<T, W, MR, NV>(acc, beta, c, c_rs, c_cs, m, n);
}

// acc + a * b (one FMA where the instruction set has them).
struct FmaStep {
  template <typename T, typename V>
  static V step(V acc, T a, V b) {
    return acc + a * b;
  }
};

// See GemmMicroKernelF32.
template <typename T, int W, int MR, int NV>
void gemm_micro_kernel(int64_t kc, const T* __restrict a, const T* __restrict b, int64_t b_rs, T beta, T* __restrict c,
                       int64_t c_rs, int64_t c_cs, int64_t m, int64_t n) {
  micro_kernel<T, T, W, MR, NV, FmaStep>(kc, a, b, b_rs, beta, c, c_rs, c_cs, m, n);
}

// One step of a bfloat16 dot product in W float lanes, as AVX512_BF16's vdpbf16ps does it: each
// 32-bit lane of a and b holds a pair of bfloat16 (the even k in the low half), and
//   acc += a_odd * b_odd, then acc += a_even * b_even,
// each product exact in float32 (8-bit significands), each sum rounded. This is the portable
// form (two FMAs); gemm_kernel_avx512_bf16.cpp passes the instruction instead.
template <int W>
struct PairDotEmulated {
  typedef float V __attribute__((vector_size(W * sizeof(float))));
  typedef uint32_t U __attribute__((vector_size(W * sizeof(uint32_t))));
  static V as_float(U bits) {
    V v;
    __builtin_memcpy(&v, &bits, sizeof(V));
    return v;
  }
  static V step(V acc, uint32_t a, U b) {  // the high halves by shifts: GCC 12 fails on a vector constant here
    acc += as_float(U{} + (a >> 16 << 16)) * as_float(b >> 16 << 16);
    return acc + as_float(U{} + (a << 16)) * as_float(b << 16);
  }
};

// See GemmMicroKernelBF16: kp pairs of k, Dot a PairDotEmulated or the instruction.
template <int W, int MR, int NV, typename Dot>
void gemm_micro_kernel_bf16(int64_t kp, const uint32_t* __restrict a, const uint32_t* __restrict b, int64_t b_rs,
                            float beta, float* __restrict c, int64_t c_rs, int64_t c_cs, int64_t m, int64_t n) {
  micro_kernel<uint32_t, float, W, MR, NV, Dot>(kp, a, b, b_rs, beta, c, c_rs, c_cs, m, n);
}

template <int W>
struct FloatVector {
  typedef float type __attribute__((vector_size(W * sizeof(float))));
};
template <int W>
struct IntVector {
  typedef int32_t type __attribute__((vector_size(W * sizeof(int32_t))));
};

// The even lanes of the 2W floats lo, hi.
template <int W>
typename FloatVector<W>::type even_lanes(typename FloatVector<W>::type lo, typename FloatVector<W>::type hi) {
  if constexpr (W == 4)
    return __builtin_shufflevector(lo, hi, 0, 2, 4, 6);
  else if constexpr (W == 8)
    return __builtin_shufflevector(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14);
  else
    return __builtin_shufflevector(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
}

// The lane indices 0..N-1 as a pack (no <utility> here: see the file comment).
template <int... J>
struct Lanes {};
template <int N, int... J>
struct MakeLanes : MakeLanes<N - 1, N - 1, J...> {};
template <int... J>
struct MakeLanes<0, J...> {
  using type = Lanes<J...>;
};

// Rows a (bit B of its index clear) and b (= the row B further on) exchange their off-diagonal
// B x B blocks: a takes b's lanes j - B at its lanes j with bit B set, b takes a's lanes j + B at
// its lanes with bit B clear. Constant shuffles (__builtin_shufflevector: GCC and clang).
template <int W, int B, int... J>
void swap_blocks(typename FloatVector<W>::type& a, typename FloatVector<W>::type& b, Lanes<J...>) {
  const typename FloatVector<W>::type lo = __builtin_shufflevector(a, b, ((J & B) ? W + J - B : J)...);
  const typename FloatVector<W>::type hi = __builtin_shufflevector(a, b, ((J & B) ? W + J : J + B)...);
  a = lo, b = hi;
}

// The W x W block in r (r[i] = row i) transposed in place by swapping off-diagonal blocks of
// B x B lanes for B = W/2, ..., 1 (swap_blocks on every row pair i, i + B with bit B of i clear).
template <int W, int B>
void transpose_rows(typename FloatVector<W>::type* r) {
  if constexpr (B >= 1) {
#pragma GCC unroll 16
    for (int i = 0; i < W; ++i)
      if (!(i & B)) swap_blocks<W, B>(r[i], r[i + B], typename MakeLanes<W>::type{});
    transpose_rows<W, B / 2>(r);
  }
}

// See PackTransposedF32: W x W blocks through registers; a block cut by the edges (fewer than W
// columns, as a GEMM panel of MR < W rows, or fewer than W values of k) is loaded zero-padded and
// only its part stored.
template <int W>
void pack_transposed(int64_t k_n, int64_t cols, const float* src, int64_t src_ld, float* dst, int64_t dst_ld) {
  typedef typename FloatVector<W>::type V;
  for (int64_t j0 = 0; j0 < cols; j0 += W) {
    const int64_t w = cols - j0 < W ? cols - j0 : W;
    for (int64_t k0 = 0; k0 < k_n; k0 += W) {
      const int64_t kt = k_n - k0 < W ? k_n - k0 : W;
      V r[W];
      if (w == W && kt == W) {
#pragma GCC unroll 16
        for (int i = 0; i < W; ++i) __builtin_memcpy(&r[i], src + (j0 + i) * src_ld + k0, sizeof(V));
        transpose_rows<W, W / 2>(r);
#pragma GCC unroll 16
        for (int k = 0; k < W; ++k) __builtin_memcpy(dst + (k0 + k) * dst_ld + j0, &r[k], sizeof(V));
        continue;
      }
      for (int i = 0; i < W; ++i) {
        r[i] = V{};
        if (i < w) __builtin_memcpy(&r[i], src + (j0 + i) * src_ld + k0, kt * sizeof(float));
      }
      transpose_rows<W, W / 2>(r);
      for (int64_t k = 0; k < kt; ++k) __builtin_memcpy(dst + (k0 + k) * dst_ld + j0, &r[k], w * sizeof(float));
    }
  }
}

// See DepthwiseRowF32: U vectors of W outputs stay in registers over the taps.
template <int W>
void depthwise_row(int64_t n, int64_t taps, const float* const* rows, const float* w, int64_t stride, float bias,
                   float* y) {
  typedef typename FloatVector<W>::type V;
  constexpr int U = 4;
  // With stride 2 a vector of outputs loads 2W inputs, the last one past the last input used:
  // the loops stop one output early so that it is still inside the row.
  const int64_t end = stride == 2 ? n - 1 : n;
  int64_t ow = 0;
  for (; ow + U * W <= end; ow += U * W) {
    V acc[U];
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) acc[u] = V{} + bias;
    for (int64_t t = 0; t < taps; ++t) {
      const float* x = rows[t] + ow * stride;
      const V wv = V{} + w[t];
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        V xv;
        if (stride == 1) {
          __builtin_memcpy(&xv, x + u * W, sizeof(V));
        } else {  // stride 2: the even lanes of two vectors
          V lo, hi;
          __builtin_memcpy(&lo, x + 2 * u * W, sizeof(V));
          __builtin_memcpy(&hi, x + 2 * u * W + W, sizeof(V));
          xv = even_lanes<W>(lo, hi);
        }
        acc[u] += wv * xv;
      }
    }
    __builtin_memcpy(y + ow, acc, sizeof(acc));
  }
  for (; ow + W <= end; ow += W) {  // one vector at a time
    V acc = V{} + bias;
    for (int64_t t = 0; t < taps; ++t) {
      const float* x = rows[t] + ow * stride;
      V xv;
      if (stride == 1) {
        __builtin_memcpy(&xv, x, sizeof(V));
      } else {
        V lo, hi;
        __builtin_memcpy(&lo, x, sizeof(V));
        __builtin_memcpy(&hi, x + W, sizeof(V));
        xv = even_lanes<W>(lo, hi);
      }
      acc += (V{} + w[t]) * xv;
    }
    __builtin_memcpy(y + ow, &acc, sizeof(acc));
  }
  for (; ow < n; ++ow) {
    float s = bias;
    for (int64_t t = 0; t < taps; ++t) s += w[t] * rows[t][ow * stride];
    y[ow] = s;
  }
}

// See DotF32: 4 vector accumulators of W lanes, added pairwise, then the lanes, then the tail.
template <int W>
float dot(int64_t n, const float* a, const float* b) {
  typedef typename FloatVector<W>::type V;
  V acc[4] = {};
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W)
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      V av, bv;
      __builtin_memcpy(&av, a + i + u * W, sizeof(V));
      __builtin_memcpy(&bv, b + i + u * W, sizeof(V));
      acc[u] += av * bv;
    }
  for (; i + W <= n; i += W) {
    V av, bv;
    __builtin_memcpy(&av, a + i, sizeof(V));
    __builtin_memcpy(&bv, b + i, sizeof(V));
    acc[0] += av * bv;
  }
  V total = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  float sum = 0;
  for (int lane = 0; lane < W; ++lane) sum += total[lane];
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// e^x of W floats, within 2 ulp: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is
// exact), e^r by Cephes' degree-6 polynomial, times 2^n as two powers of two built in the exponent
// bits (so that n from -150 to 128 scales without overflow and denormal results round once).
// inf above 88.72284 (the largest finite result), 0 below -103.97208; NaN stays NaN.
template <int W>
typename FloatVector<W>::type exp_lanes(typename FloatVector<W>::type x) {
  typedef typename FloatVector<W>::type V;
  typedef typename IntVector<W>::type I;
  const V hi = V{} + 88.72283935546875f, lo = V{} - 103.972084045410f;
  V xc = x > hi ? hi : x;  // comparisons with NaN are false: NaN passes through
  xc = xc < lo ? lo : xc;
  const V shifter = V{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const V n = (xc * 1.44269504088896341f + shifter) - shifter;
  V r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const V e = p * (r * r) + r + 1.0f;
  const I ni = __builtin_convertvector(n, I);
  const I half = ni >> 1;
  const I bits1 = (half + 127) << 23, bits2 = (ni - half + 127) << 23;
  V scale1, scale2;
  __builtin_memcpy(&scale1, &bits1, sizeof(V));
  __builtin_memcpy(&scale2, &bits2, sizeof(V));
  V y = e * scale1 * scale2;
  y = x > hi ? V{} + __builtin_inff() : y;
  y = x < lo ? V{} : y;
  return y;
}

// See UnaryF32: whole vectors, then the tail through a zero-padded vector.
template <int W, typename F>
void map_lanes(int64_t n, const float* x, float* y, F f) {
  typedef typename FloatVector<W>::type V;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    V v;
    __builtin_memcpy(&v, x + i, sizeof(V));
    v = f(v);
    __builtin_memcpy(y + i, &v, sizeof(V));
  }
  if (i < n) {
    float buf[W] = {};
    for (int64_t k = i; k < n; ++k) buf[k - i] = x[k];
    V v;
    __builtin_memcpy(&v, buf, sizeof(V));
    v = f(v);
    __builtin_memcpy(buf, &v, sizeof(V));
    for (int64_t k = i; k < n; ++k) y[k] = buf[k - i];
  }
}

template <int W>
void exp_f32(int64_t n, const float* x, float* y) {
  map_lanes<W>(n, x, y, [](auto v) { return exp_lanes<W>(v); });
}

// sigmoid(x) = 1 / (1 + z) for x >= 0 and z / (1 + z) below, with z = e^-|x|: z never overflows,
// so the tiny results of very negative x keep their precision.
template <int W>
typename FloatVector<W>::type sigmoid_lanes(typename FloatVector<W>::type x) {
  typedef typename FloatVector<W>::type V;
  const V z = exp_lanes<W>(x < 0 ? x : -x);  // NaN stays NaN
  return (x < 0 ? z : V{} + 1.0f) / (1.0f + z);
}

template <int W>
void sigmoid_f32(int64_t n, const float* x, float* y) {
  map_lanes<W>(n, x, y, [](auto v) { return sigmoid_lanes<W>(v); });
}

template <int W>
void silu_f32(int64_t n, const float* x, float* y) {
  map_lanes<W>(n, x, y, [](auto v) { return v * sigmoid_lanes<W>(v); });
}

// Phi(x) = P(X <= x) for a standard normal X: with z = |x| / sqrt(2) and t = 1 / (1 + z / 2),
// erfc(z) = t * exp(-z^2 + P(t)), P the degree-9 Chebyshev fit of Numerical Recipes (section 6.2,
// fractional error below 1.2e-7 for every z), and Phi = erfc(z) / 2 below 0, 1 - erfc(z) / 2
// above: relative precision in the negative tail, where 1 + erf(x / sqrt(2)) cancels. The
// exponent -x^2 / 2 + P(t) is carried as a float pair (x split into 12-bit halves, so x^2 is an
// exact sum; the sum with P by Fast2Sum), since its rounding alone, times e^..., would cost z^2
// ulps. x is clamped to [-20, 20], where Phi is 0 and 1 in float.
template <int W>
typename FloatVector<W>::type normal_cdf_lanes(typename FloatVector<W>::type x) {
  typedef typename FloatVector<W>::type V;
  typedef typename IntVector<W>::type I;
  V xc = x > 20.0f ? V{} + 20.0f : x;  // NaN stays NaN
  xc = xc < -20.0f ? V{} - 20.0f : xc;
  const V z = (xc < 0 ? -xc : xc) * 0.707106781186547524f;
  const V t = 1.0f / (1.0f + 0.5f * z);
  V p = V{} + 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  I bits;
  __builtin_memcpy(&bits, &xc, sizeof(V));
  bits &= static_cast<int32_t>(0xfffff000u);
  V high;
  __builtin_memcpy(&high, &bits, sizeof(V));
  const V low = xc - high;
  const V a = -0.5f * (high * high);                       // exact
  const V b = p - 0.5f * (2.0f * high * low + low * low);  // -x^2 / 2 = a + (b - p), nearly exactly
  const V sum = a + b, rest = b - (sum - a);  // a + b exactly where |a| >= |b| (large |x|, where it matters)
  const V half_erfc = 0.5f * t * exp_lanes<W>(sum) * (1.0f + rest);
  return xc < 0 ? half_erfc : 1.0f - half_erfc;
}

template <int W>
void gelu_f32(int64_t n, const float* x, float* y) {
  map_lanes<W>(n, x, y, [](auto v) { return v * normal_cdf_lanes<W>(v); });
}

template <int W, int Chains>
float fma_peak_loop(int64_t iterations) {
  typedef float V __attribute__((vector_size(W * sizeof(float))));
  V acc[Chains];
  const V x = V{} + 0.999999f, y = V{} + 1e-6f;
#pragma GCC unroll 64
  for (int i = 0; i < Chains; ++i) acc[i] = V{} + static_cast<float>(i);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 64
    for (int i = 0; i < Chains; ++i) acc[i] = acc[i] * x + y;
  }
  float sum = 0;
  for (int i = 0; i < Chains; ++i)
    for (int lane = 0; lane < W; ++lane) sum += acc[i][lane];
  return sum;
}

}  // namespace
}  // namespace tvc::cpu
