// The GEMM micro-kernel, written once with GCC vector extensions and compiled by each
// gemm_kernel_<isa>.cpp for its instruction set (vector width W lanes).
//
// Included only by those files. Everything here has internal linkage (anonymous namespace), so
// each instruction set gets its own copy and none can be merged with another's by the linker;
// for the same reason it includes no header beyond gemm_kernels.h and the compiler's intrinsics
// (always inlined, never emitted as functions of their own).
#pragma once

#include <cstdint>
#include <limits>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "gemm_kernels.h"

namespace tvc::cpu {
namespace {

// C = acc + beta * C for the top-left m x n part of an MR x (NV * W) tile (see
// GemmMicroKernelF32), through a row buffer when the tile is partial or C's columns strided;
// either way each element gets the same arithmetic.
template <typename T, int W, int MR, int NV, typename V>
__attribute__((always_inline)) inline void store_tile(const V (&acc)[MR][NV], T beta, T* __restrict c, int64_t c_rs,
                                                      int64_t c_cs, int64_t m, int64_t n) {
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

// Where a micro-kernel reads its A panel's element [k][i] (P: the panels' element type): packed
// or A's columns (a[k * a_ks + i]), A's rows (a[i * a_ks + k]), or a convolution's input through
// per-k offsets (a[k_offsets[k] + i * step], GemmMicroKernelOffsetsF32).
// Read down A's columns, ahead(k) is the cache line after the one step k reads (k's elements of
// the next rows), which the 7-row kernels and AVX-512's 12-row kernel ask into L2: for a 1x1
// convolution's input or Winograd's transformed weights read in place, one not in cache would
// otherwise cost a miss per step of k, which no prefetcher follows across the rows of K (Winograd
// 128 -> 128 at 28x28 with its weights out of cache, Sapphire Rapids, 2 threads: 0.66-0.67 ->
// 0.53-0.55 ms). The others have none (through offsets: a convolution's padded copy of its input,
// just written).
constexpr int64_t kLineFloats = 16;
template <typename P>
struct AColumns {
  const P* __restrict a;
  int64_t a_ks;
  P operator()(int64_t k, int i) const { return a[k * a_ks + i]; }
  const P* ahead(int64_t k) const { return a + k * a_ks + kLineFloats; }
};
template <typename P>
struct ARowsOf {
  const P* __restrict a;
  int64_t a_ks;
  P operator()(int64_t k, int i) const { return a[i * a_ks + k]; }
};
struct AOffsets {
  const float* __restrict a;
  const int64_t* __restrict k_offsets;
  int64_t step;
  float operator()(int64_t k, int i) const { return a[k_offsets[k] + i * step]; }
};
// The same with step 1 (a stride-1 convolution's positions), known when compiled: the rows are
// fixed displacements from one address per k rather than a chain of additions.
struct AOffsetsUnitStep {
  const float* __restrict a;
  const int64_t* __restrict k_offsets;
  float operator()(int64_t k, int i) const { return a[k_offsets[k] + i]; }
};
// Two tiles' positions (GemmMicroKernelOffsetsPairF32): rows 0-6 from a0, 7-13 from a1.
template <bool UnitStep>
struct AOffsetsPair {
  const float* __restrict a0;
  const float* __restrict a1;
  const int64_t* __restrict k_offsets;
  int64_t step;
  float operator()(int64_t k, int i) const {
    const int64_t at = k_offsets[k] + (i % 7) * (UnitStep ? 1 : step);
    return i < 7 ? a0[at] : a1[at];
  }
};

// The micro-kernel (GemmMicroKernelF32/F64/BF16, GemmMicroKernelOffsetsF32): MR elements of an A
// panel are broadcast (read through the accessor A), NR = NV * W columns of B are held in NV
// vectors of W lanes, the MR x NV accumulators (of T) stay in registers over the kn steps of k,
// each acc = Step::step(acc, a's element, b vector). P is the panels' element: T itself, or a
// pair of bfloat16 in 32 bits. With Ahead, each step of k also asks for one cache line of `ahead`
// (its k-th) to be brought into L2, for a later call (else `ahead` is ignored), and for A's next
// line (a.ahead(k), where there is one). With PackB (GemmMicroKernelPackF32), B's values of each
// step of k are also stored at b_packed, and the lines of that row of B kPackAheadPanels panels
// on are asked into L2 instead of `ahead`'s.
// Measured on Sapphire Rapids, 2 threads, MobileNet v2's projections at batch 1: 4 panels on with
// all their lines 5-20% faster than the next panel's first line only.
constexpr int kPackAheadPanels = 4;
// The sums of a tile (micro_kernel's loop over k) into acc.
template <typename P, typename T, int W, int MR, int NV, typename Step, bool Ahead, typename A, bool PackB, typename V>
__attribute__((always_inline)) inline void micro_kernel_sums(int64_t kn, A a, const P* __restrict b, int64_t b_rs,
                                                             const P* ahead, P* __restrict b_packed, V (&acc)[MR][NV]) {
  typedef P PV __attribute__((vector_size(W * sizeof(P))));
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 64
    for (int v = 0; v < NV; ++v) acc[i][v] = V{};
#pragma GCC unroll 2
  for (int64_t k = 0; k < kn; ++k) {
    if constexpr (PackB) {
      const P* on = b + k * b_rs + kPackAheadPanels * NV * W;
      for (int j = 0; j < NV * W; j += 64 / sizeof(P)) __builtin_prefetch(on + j, 0, 2);
    } else if constexpr (Ahead)
      __builtin_prefetch(ahead + k * (64 / sizeof(P)), 0, 2);
    if constexpr (Ahead && requires { a.ahead(k); }) __builtin_prefetch(a.ahead(k), 0, 2);
    PV bv[NV];
#pragma GCC unroll 64
    for (int v = 0; v < NV; ++v) __builtin_memcpy(&bv[v], b + k * b_rs + v * W, sizeof(PV));
    if constexpr (PackB)
#pragma GCC unroll 64
      for (int v = 0; v < NV; ++v) __builtin_memcpy(b_packed + k * (NV * W) + v * W, &bv[v], sizeof(PV));
#pragma GCC unroll 64
    for (int i = 0; i < MR; ++i) {
      const P ai = a(k, i);
#pragma GCC unroll 64
      for (int v = 0; v < NV; ++v) acc[i][v] = Step::step(acc[i][v], ai, bv[v]);
    }
  }
}
template <typename P, typename T, int W, int MR, int NV, typename Step, bool Ahead, typename A, bool PackB = false>
void micro_kernel(int64_t kn, A a, const P* __restrict b, int64_t b_rs, T beta, T* __restrict c, int64_t c_rs,
                  int64_t c_cs, int64_t m, int64_t n, const P* ahead, P* __restrict b_packed = nullptr) {
  typedef T V __attribute__((vector_size(W * sizeof(T))));
  prefetch_tile(c, c_rs, c_cs, m, n);
  V acc[MR][NV];
  micro_kernel_sums<P, T, W, MR, NV, Step, Ahead, A, PackB>(kn, a, b, b_rs, ahead, b_packed, acc);
  store_tile<T, W, MR, NV>(acc, beta, c, c_rs, c_cs, m, n);
}

// The micro-kernel over a panel of A read along its rows (ARows) or not.
template <typename P, typename T, int W, int MR, int NV, typename Step, bool ARows, bool Ahead, bool PackB = false>
void micro_kernel_panel(int64_t kn, const P* __restrict a, int64_t a_ks, const P* __restrict b, int64_t b_rs, T beta,
                        T* __restrict c, int64_t c_rs, int64_t c_cs, int64_t m, int64_t n, const P* ahead,
                        P* b_packed = nullptr) {
  if constexpr (ARows)
    micro_kernel<P, T, W, MR, NV, Step, Ahead, ARowsOf<P>, PackB>(kn, ARowsOf<P>{a, a_ks}, b, b_rs, beta, c, c_rs, c_cs,
                                                                  m, n, ahead, b_packed);
  else
    micro_kernel<P, T, W, MR, NV, Step, Ahead, AColumns<P>, PackB>(kn, AColumns<P>{a, a_ks}, b, b_rs, beta, c, c_rs,
                                                                   c_cs, m, n, ahead, b_packed);
}

// acc + a * b (one FMA where the instruction set has them).
struct FmaStep {
  template <typename T, typename V>
  static V step(V acc, T a, V b) {
    return acc + a * b;
  }
};

// See GemmMicroKernelF32 (Ahead: the 7-row kernels').
template <typename T, int W, int MR, int NV, bool ARows = false, bool Ahead = false>
void gemm_micro_kernel(int64_t kc, const T* __restrict a, int64_t a_ks, const T* __restrict b, int64_t b_rs, T beta,
                       T* __restrict c, int64_t c_rs, int64_t c_cs, int64_t m, int64_t n, const T* __restrict ahead) {
  micro_kernel_panel<T, T, W, MR, NV, FmaStep, ARows, Ahead>(kc, a, a_ks, b, b_rs, beta, c, c_rs, c_cs, m, n, ahead);
}

// See GemmMicroKernelPackF32 (Ahead: as gemm_micro_kernel's, for A's next line only).
template <int W, int MR, int NV, bool ARows = false, bool Ahead = false>
void gemm_micro_kernel_pack_b(int64_t kc, const float* __restrict a, int64_t a_ks, const float* __restrict b,
                              int64_t b_rs, float beta, float* __restrict c, int64_t c_rs, int64_t c_cs, int64_t m,
                              int64_t n, float* __restrict b_packed) {
  micro_kernel_panel<float, float, W, MR, NV, FmaStep, ARows, Ahead, true>(kc, a, a_ks, b, b_rs, beta, c, c_rs, c_cs, m,
                                                                           n, b, b_packed);
}

// See GemmMicroKernelOffsetsF32.
template <int W, int MR, int NV>
void gemm_micro_kernel_offsets(int64_t kc, const float* __restrict a, const int64_t* __restrict k_offsets, int64_t step,
                               const float* __restrict b, int64_t b_rs, float beta, float* __restrict c, int64_t c_rs,
                               int64_t c_cs, int64_t m, int64_t n, const float* ahead) {
  if (step == 1)
    return micro_kernel<float, float, W, MR, NV, FmaStep, true>(kc, AOffsetsUnitStep{a, k_offsets}, b, b_rs, beta, c,
                                                                c_rs, c_cs, m, n, ahead);
  micro_kernel<float, float, W, MR, NV, FmaStep, true>(kc, AOffsets{a, k_offsets, step}, b, b_rs, beta, c, c_rs, c_cs,
                                                       m, n, ahead);
}

// See GemmMicroKernelOffsetsPairF32 (7-row tiles).
template <int W, int NV>
void gemm_micro_kernel_offsets_pair(int64_t kc, const float* __restrict a0, const float* __restrict a1,
                                    const int64_t* __restrict k_offsets, int64_t step, const float* __restrict b,
                                    int64_t b_rs, float beta, float* __restrict c, int64_t c_rs, int64_t c_cs,
                                    int64_t n, const float* ahead) {
  if (step == 1)
    return micro_kernel<float, float, W, 14, NV, FmaStep, true>(kc, AOffsetsPair<true>{a0, a1, k_offsets, 1}, b, b_rs,
                                                                beta, c, c_rs, c_cs, 14, n, ahead);
  micro_kernel<float, float, W, 14, NV, FmaStep, true>(kc, AOffsetsPair<false>{a0, a1, k_offsets, step}, b, b_rs, beta,
                                                       c, c_rs, c_cs, 14, n, ahead);
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
template <int W, int MR, int NV, typename Dot, bool ARows = false>
void gemm_micro_kernel_bf16(int64_t kp, const uint32_t* __restrict a, int64_t a_ks, const uint32_t* __restrict b,
                            int64_t b_rs, float beta, float* __restrict c, int64_t c_rs, int64_t c_cs, int64_t m,
                            int64_t n, const uint32_t* __restrict ahead) {
  micro_kernel_panel<uint32_t, float, W, MR, NV, Dot, ARows, false>(kp, a, a_ks, b, b_rs, beta, c, c_rs, c_cs, m, n,
                                                                    ahead);
}

template <int W>
struct FloatVector {
  typedef float type __attribute__((vector_size(W * sizeof(float))));
};
template <int W>
struct IntVector {
  typedef int32_t type __attribute__((vector_size(W * sizeof(int32_t))));
};

// W floats from p (any alignment); the sum of v's lanes in order.
template <int W>
typename FloatVector<W>::type load_lanes(const float* p) {
  typename FloatVector<W>::type v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

// The first n floats from p in the first lanes, zeros in the others (n < W: one masked load on
// AVX-512; p[n..W) are not read).
template <int W>
typename FloatVector<W>::type load_first_lanes(const float* p, int64_t n) {
  if (n >= W) return load_lanes<W>(p);
#ifdef __AVX512F__
  if constexpr (W == 16)
    return __builtin_ia32_loadups512_mask(p, typename FloatVector<W>::type{},
                                          static_cast<unsigned short>((1u << n) - 1));
#endif
  typename FloatVector<W>::type v{};
#pragma GCC unroll 16
  for (int i = 0; i < W; ++i)
    if (i < n) v[i] = p[i];
  return v;
}

template <int W>
float lane_total(typename FloatVector<W>::type v) {
  float s = 0;
  for (int lane = 0; lane < W; ++lane) s += v[lane];
  return s;
}

// Stores the first n lanes of x at p. A partial store is one masked store on AVX-512; a loop over
// n became a call of memcpy (GCC's loop idioms), which cost the Winograd input transform of a
// 14-tile row (36 partial stores per row) a fifth of its convolution's time.
template <int W>
void store_lanes(typename FloatVector<W>::type x, int64_t n, float* p) {
  if (n >= W) {
    __builtin_memcpy(p, &x, sizeof(x));
    return;
  }
#ifdef __AVX512F__
  if constexpr (W == 16) {
    __builtin_ia32_storeups512_mask(p, x, static_cast<unsigned short>((1u << n) - 1));
    return;
  }
#endif
#pragma GCC unroll 16
  for (int i = 0; i < W; ++i)
    if (i < n) p[i] = x[i];
}

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
// Always inlined: as a call, the block went through memory (a sixth of a depthwise layer's time).
template <int W, int B>
[[gnu::always_inline]] inline void transpose_rows(typename FloatVector<W>::type* r) {
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
// See EvenCopyF32: whole vectors while their 2W reads stay below src[2n - 1], then one by one.
template <int W>
void even_copy(int64_t n, const float* src, float* dst) {
  int64_t i = 0;
  for (; i + W < n; i += W) {
    const typename FloatVector<W>::type e = even_lanes<W>(load_lanes<W>(src + 2 * i), load_lanes<W>(src + 2 * i + W));
    __builtin_memcpy(dst + i, &e, sizeof(e));
  }
  for (; i < n; ++i) dst[i] = src[2 * i];
}

// Where stream_rows stores its whole vectors: each instruction set's file passes its stores that
// bypass the caches (its intrinsics: this header includes none) with their fence; these are the
// plain ones (baseline vector extensions have no such store).
struct CachedStores {
  static constexpr bool kAligned = false;  // whether store needs a vector-aligned address
  template <typename V>
  static void store(float* p, V v) {
    __builtin_memcpy(p, &v, sizeof(V));
  }
  static void fence() {}
};

// See StreamRowsF32: each row's whole vectors through Stores (from a vector-aligned address where
// they need one, the floats before it stored as usual), the rest as usual, then Stores' fence.
template <int W, typename Stores>
void stream_rows(int64_t rows, int64_t n, const float* src, int64_t src_rs, float* dst, int64_t dst_rs) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* s = src + i * src_rs;
    float* d = dst + i * dst_rs;
    int64_t j = 0;
    if constexpr (Stores::kAligned) {
      const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(d) / sizeof(float) % W);
      for (const int64_t head = misaligned ? W - misaligned : 0; j < head && j < n; ++j) d[j] = s[j];
    }
    for (; j + W <= n; j += W) Stores::store(d + j, load_lanes<W>(s + j));
    for (; j < n; ++j) d[j] = s[j];
  }
  Stores::fence();
}

// See MaxIntoF32.
template <int W>
void max_into(int64_t n, const float* src, int64_t stride, float* dst) {
  typedef typename FloatVector<W>::type V;
  auto take = [](V acc, V v) { return ((v > acc) | (v != v)) ? v : acc; };
  int64_t i = 0;
  if (stride == 1) {
    for (; i + W <= n; i += W) {
      const V r = take(load_lanes<W>(dst + i), load_lanes<W>(src + i));
      __builtin_memcpy(dst + i, &r, sizeof(r));
    }
    if (i < n)
      store_lanes<W>(take(load_first_lanes<W>(dst + i, n - i), load_first_lanes<W>(src + i, n - i)), n - i, dst + i);
    return;
  }
  if (stride == 2) {
    for (; i + W < n; i += W) {  // the last vector's odd lane 2W - 1 is at most 2n - 3
      const V r =
          take(load_lanes<W>(dst + i), even_lanes<W>(load_lanes<W>(src + 2 * i), load_lanes<W>(src + 2 * i + W)));
      __builtin_memcpy(dst + i, &r, sizeof(r));
    }
    if (i < n) {  // the last n - i outputs (a masked vector, not a scalar loop): src[2 i .. 2 n - 2] read
      const int64_t reads = 2 * (n - i) - 1;
      const V lo = load_first_lanes<W>(src + 2 * i, reads),
              hi = reads > W ? load_first_lanes<W>(src + 2 * i + W, reads - W) : V{};
      store_lanes<W>(take(load_first_lanes<W>(dst + i, n - i), even_lanes<W>(lo, hi)), n - i, dst + i);
    }
    return;
  }
  for (; i < n; ++i) {
    const float v = src[i * stride];
    dst[i] = v > dst[i] || v != v ? v : dst[i];
  }
}

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
#pragma GCC unroll 16
      for (int i = 0; i < W; ++i) r[i] = i < w ? load_first_lanes<W>(src + (j0 + i) * src_ld + k0, kt) : V{};
      transpose_rows<W, W / 2>(r);
      // With one block of columns (an A panel of MR < W rows), whole vectors are stored: the lanes
      // past w spill into the next row's first W - dst_ld, which its own store then overwrites;
      // the last row of all is stored element by element.
      const bool spill = j0 == 0 && cols <= W && dst_ld >= w && dst_ld + w >= W;
      for (int64_t k = 0; k < kt; ++k) {
        float* d = dst + (k0 + k) * dst_ld + j0;
        store_lanes<W>(r[k], spill && k0 + k + 1 < k_n ? W : w, d);
      }
    }
  }
}

// U vectors of depthwise outputs from ow (see DepthwiseRowF32), in registers over the taps; the
// first `count` outputs are stored (the last vector may be partial: computed whole, its loads
// reading into the caller's slack). The stride is the template's and each sum is stored as its
// own vector: with the stride a run-time value both loops shared one register allocation, and the
// array stored whole kept its sums in memory; on Zen 3 (AVX2, 2 threads) three of the eight sums
// went through the stack at every tap, and MobileNet v3's 3x3 layers of 16 and 72 channels at
// 112x112 and 56x56 (batch 8, inverted residual blocks) took 0.81x and 0.85x the time this way,
// a 3x3 of 72 channels at 56x56 alone 0.68x. The same sums.
template <int W, int U, int Stride>
void depthwise_vectors(int64_t ow, int64_t count, int64_t taps, const float* const* rows, const float* w, float bias,
                       float* y) {
  typedef typename FloatVector<W>::type V;
  V acc[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) acc[u] = V{} + bias;
  for (int64_t t = 0; t < taps; ++t) {
    const float* x = rows[t] + ow * Stride;
    const V wv = V{} + w[t];
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      V xv;
      if constexpr (Stride == 1) {
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
  float lanes[U * W];
  float* out = count == U * W ? y + ow : lanes;
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) __builtin_memcpy(out + u * W, &acc[u], sizeof(V));
  if (out == lanes)
    for (int64_t k = 0; k < count; ++k) y[ow + k] = lanes[k];
}

// See DepthwiseRowF32: blocks of 8 vectors, then the rest (up to 8 vectors, the last partial) as
// one block, so that its sums too are independent chains rather than one vector's latency-bound
// chain over the taps.
template <int W, int Stride>
void depthwise_row_of_stride(int64_t n, int64_t taps, const float* const* rows, const float* w, float bias, float* y) {
  constexpr int U = 8;
  int64_t ow = 0;
  for (; ow + U * W <= n; ow += U * W) depthwise_vectors<W, U, Stride>(ow, U * W, taps, rows, w, bias, y);
  using Block = void (*)(int64_t, int64_t, int64_t, const float* const*, const float*, float, float*);
  static constexpr Block last_blocks[U] = {depthwise_vectors<W, 1, Stride>, depthwise_vectors<W, 2, Stride>,
                                           depthwise_vectors<W, 3, Stride>, depthwise_vectors<W, 4, Stride>,
                                           depthwise_vectors<W, 5, Stride>, depthwise_vectors<W, 6, Stride>,
                                           depthwise_vectors<W, 7, Stride>, depthwise_vectors<W, 8, Stride>};
  const int64_t rest = n - ow;
  if (rest > 0) last_blocks[(rest + W - 1) / W - 1](ow, rest, taps, rows, w, bias, y);
}
template <int W>
void depthwise_row(int64_t n, int64_t taps, const float* const* rows, const float* w, int64_t stride, float bias,
                   float* y) {
  if (stride == 1) return depthwise_row_of_stride<W, 1>(n, taps, rows, w, bias, y);
  depthwise_row_of_stride<W, 2>(n, taps, rows, w, bias, y);
}

// R of DotRowsF32's dot products (rows a + r * a_rs, r < R), each b vector loaded once for all:
// per row 4 vector accumulators of W lanes, added pairwise, then the lanes, then the tail.
template <int W, int R>
void dot_rows_of(int64_t n, const float* a, int64_t a_rs, const float* b, float* out) {
  typedef typename FloatVector<W>::type V;
  V acc[R][4] = {};
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W)
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      V bv;
      __builtin_memcpy(&bv, b + i + u * W, sizeof(V));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        V av;
        __builtin_memcpy(&av, a + r * a_rs + i + u * W, sizeof(V));
        acc[r][u] += av * bv;
      }
    }
  for (; i + W <= n; i += W) {
    V bv;
    __builtin_memcpy(&bv, b + i, sizeof(V));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      V av;
      __builtin_memcpy(&av, a + r * a_rs + i, sizeof(V));
      acc[r][0] += av * bv;
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const V total = (acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3]);
    float sum = 0;
    for (int lane = 0; lane < W; ++lane) sum += total[lane];
    for (int64_t k = i; k < n; ++k) sum += a[r * a_rs + k] * b[k];
    out[r] = sum;
  }
}

// See DotRowsF32: rows in groups of as many as keep their accumulators in registers (4 with 32
// vector registers, else 2), then the rest.
template <int W>
void dot_rows(int64_t n, const float* a, int64_t a_rs, int64_t rows, const float* b, float* out) {
  constexpr int G = W == 16 ? 4 : 2;
  int64_t r = 0;
  for (; r + G <= rows; r += G) dot_rows_of<W, G>(n, a + r * a_rs, a_rs, b, out + r);
  for (; r < rows; ++r) dot_rows_of<W, 1>(n, a + r * a_rs, a_rs, b, out + r);
}

// e^x of W floats, within 2 ulp: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is
// exact), e^r by Cephes' degree-6 polynomial, times 2^n as two powers of two built in the exponent
// bits (so that n from -150 to 128 scales without overflow and denormal results round once).
// inf above 88.72284 (the largest finite result), 0 below -103.97208; NaN stays NaN. With
// NonPositive (x <= 0 or NaN, as sigmoid's e^-|x|) the overflow side is left out, below
// -103.97208 the result is e^-103.97208 scaled as the rest (0 or 2^-149), and 2^n is one power of
// two, 2^(n + 64), then 2^-64 (the same single rounding).
template <int W, bool NonPositive = false>
[[gnu::always_inline]] inline typename FloatVector<W>::type exp_lanes(typename FloatVector<W>::type x) {
  typedef typename FloatVector<W>::type V;
  typedef typename IntVector<W>::type I;
  const V hi = V{} + 88.72283935546875f, lo = V{} - 103.972084045410f;
  V xc = x;
  if constexpr (!NonPositive) xc = xc > hi ? hi : xc;  // comparisons with NaN are false: NaN passes through
  xc = xc < lo ? lo : xc;
  const V shifter = V{} + 12582912.0f;                    // 1.5 * 2^23: adding it rounds to an integer
  const V shifted = xc * 1.44269504088896341f + shifter;  // its low bits n as an integer
  const V n = shifted - shifter;
  V r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const V e = p * (r * r) + r + 1.0f;
  V y;
#ifdef __AVX512F__
  if constexpr (W == 16) {
    // e * 2^n in one instruction (vscalefps), rounded once, as the two scalings below.
    y = __builtin_ia32_scalefps512_mask(e, n, e, static_cast<unsigned short>(-1), 4 /* _MM_FROUND_CUR_DIRECTION */);
  } else
#endif
      if constexpr (NonPositive) {
    // n in [-150, 0]: e * 2^(n + 64), exact (normal), times 2^-64, rounded once as the two
    // scalings below; 2^(n + 64)'s exponent bits n + 64 + 127 from the shifted sum's low bits
    // (the shift by 23 drops its high bits), without a conversion.
    typedef uint32_t U __attribute__((vector_size(sizeof(V))));
    U bits;
    __builtin_memcpy(&bits, &shifted, sizeof(V));
    bits = (bits + (64 + 127)) << 23;
    V scale;
    __builtin_memcpy(&scale, &bits, sizeof(V));
    y = e * scale * 0x1p-64f;
  } else {
    // e * 2^n as two exact powers of two (n in [-150, 128]: each half within the normal range).
    const I ni = __builtin_convertvector(n, I);
    const I half = ni >> 1;
    const I bits1 = (half + 127) << 23, bits2 = (ni - half + 127) << 23;
    V scale1, scale2;
    __builtin_memcpy(&scale1, &bits1, sizeof(V));
    __builtin_memcpy(&scale2, &bits2, sizeof(V));
    y = e * scale1 * scale2;
  }
  if constexpr (!NonPositive) {
    y = x > hi ? V{} + __builtin_inff() : y;
    y = x < lo ? V{} : y;
  }
  return y;
}

// a / d for d in [1, 2] or NaN: on AVX-512 from the 14-bit reciprocal estimate r, the
// quotient a * r refined once by its residual, a * r + r * (a - d * (a * r)), within about half
// an ulp more than the rounded quotient (vdivps took a third of silu's time on Zen 4);
// elsewhere the division.
template <int W>
typename FloatVector<W>::type quotient_lanes(typename FloatVector<W>::type a, typename FloatVector<W>::type d) {
#ifdef __AVX512F__
  if constexpr (W == 16) {
    typedef typename FloatVector<W>::type V;
    const V r = __builtin_ia32_rcp14ps512_mask(d, V{}, static_cast<unsigned short>(-1));
    const V q = a * r;
    return q + r * (a - d * q);
  }
#endif
  return a / d;
}

// See ConvRowsF32: OB channels (kConvRowsChannels a multiple of OB) by PV vectors of positions
// in registers, each tap's inputs loaded once per block and its weights broadcast. conv_rows_f32
// takes blocks of 3 vectors, then 2, then 1: fewer broadcasts per FMA (measured on Sapphire Rapids,
// 2 threads, ResNet's stem, against 2 then 1: 0.96-1.0x the time at batch 1, 0.92-0.97x at batch 8).
template <int W, int OB, int PV>
__attribute__((always_inline)) inline void conv_rows_block(int64_t j, int64_t taps, const float* const* rows,
                                                           const float* w, int64_t oc, int64_t o0, float* y,
                                                           int64_t y_os) {
  typedef typename FloatVector<W>::type V;
  V acc[OB][PV];
#pragma GCC unroll 16
  for (int o = 0; o < OB; ++o)
#pragma GCC unroll 4
    for (int p = 0; p < PV; ++p) acc[o][p] = V{};
  for (int64_t t = 0; t < taps; ++t) {
    V xv[PV];
#pragma GCC unroll 4
    for (int p = 0; p < PV; ++p) xv[p] = load_lanes<W>(rows[t] + j + p * W);
    const float* wt = w + t * oc + o0;
#pragma GCC unroll 16
    for (int o = 0; o < OB; ++o) {
      const float wo = wt[o];
#pragma GCC unroll 4
      for (int p = 0; p < PV; ++p) acc[o][p] += wo * xv[p];
    }
  }
#pragma GCC unroll 16
  for (int o = 0; o < OB; ++o)
#pragma GCC unroll 4
    for (int p = 0; p < PV; ++p) __builtin_memcpy(y + (o0 + o) * y_os + j + p * W, &acc[o][p], sizeof(V));
}

template <int W, int OB>
void conv_rows_f32(int64_t n, int64_t taps, const float* const* rows, const float* w, int64_t oc, float* y,
                   int64_t y_os) {
  int64_t j = 0;
  for (; j + 3 * W <= n; j += 3 * W)
    for (int64_t o0 = 0; o0 < oc; o0 += OB) conv_rows_block<W, OB, 3>(j, taps, rows, w, oc, o0, y, y_os);
  for (; j + 2 * W <= n; j += 2 * W)
    for (int64_t o0 = 0; o0 < oc; o0 += OB) conv_rows_block<W, OB, 2>(j, taps, rows, w, oc, o0, y, y_os);
  for (; j < n; j += W)
    for (int64_t o0 = 0; o0 < oc; o0 += OB) conv_rows_block<W, OB, 1>(j, taps, rows, w, oc, o0, y, y_os);
}

// See UnaryF32: whole vectors; the tail as the last W values, loaded before the loop (which may
// overwrite them in place) and stored after it, the overlap getting the same values again; fewer
// than W values through a zero-padded vector.
template <int W, typename F>
void map_lanes(int64_t n, const float* x, float* y, F f) {
  typedef typename FloatVector<W>::type V;
  if (n < W) {
    float buf[W] = {};
    for (int64_t k = 0; k < n; ++k) buf[k] = x[k];
    V v;
    __builtin_memcpy(&v, buf, sizeof(V));
    v = f(v);
    __builtin_memcpy(buf, &v, sizeof(V));
    for (int64_t k = 0; k < n; ++k) y[k] = buf[k];
    return;
  }
  V last;
  __builtin_memcpy(&last, x + n - W, sizeof(V));
  int64_t i = 0;
  // Two vectors at a time, each function inlined: their chains interleave (gelu: 0.93x the time).
  constexpr int U = 2;
  for (; i + U * W <= n; i += U * W) {
    V v[U];
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) __builtin_memcpy(&v[u], x + i + u * W, sizeof(V));
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) v[u] = f(v[u]);
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) __builtin_memcpy(y + i + u * W, &v[u], sizeof(V));
  }
  for (; i + W <= n; i += W) {
    V v;
    __builtin_memcpy(&v, x + i, sizeof(V));
    v = f(v);
    __builtin_memcpy(y + i, &v, sizeof(V));
  }
  if (i < n) {
    last = f(last);
    __builtin_memcpy(y + n - W, &last, sizeof(V));
  }
}

template <int W>
void exp_f32(int64_t n, const float* x, float* y) {
  map_lanes<W>(n, x, y, [](auto v) { return exp_lanes<W>(v); });
}

// Sums in double over 8 lanes, term i into lane i % 8, the lanes combined as
// ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) (loops.h's sum_in_lanes): one vector of 8 doubles
// whatever the instruction set's width, so that every instruction set gets the same bits.
typedef float F8 __attribute__((vector_size(8 * sizeof(float))));
typedef double D8 __attribute__((vector_size(8 * sizeof(double))));
// The 8 floats from p as doubles (by reference: 64-byte vectors change the calling convention
// between instruction sets).
inline void eight_doubles(const float* p, D8& d) {
  F8 v;
  __builtin_memcpy(&v, p, sizeof(F8));
  d = __builtin_convertvector(v, D8);
}
// Sums in those 8 lanes, held as two vectors of 4: GCC 12 keeps a variable vector of 8 doubles in
// memory below AVX-512, its adds through the stack (batch norm's sum 1.5 ns a value on Zen 3
// against 0.12 this way). The last terms of a row go into the lanes as an array (store, then
// lane i % 8), and lanes_total combines them.
typedef double D4 __attribute__((vector_size(4 * sizeof(double))));
struct EightLanes {
  D4 low = {}, high = {};
  void add(const D8& t) {
    low += __builtin_shufflevector(t, t, 0, 1, 2, 3);
    high += __builtin_shufflevector(t, t, 4, 5, 6, 7);
  }
  void load(const double* lanes) {
    __builtin_memcpy(&low, lanes, sizeof(D4));
    __builtin_memcpy(&high, lanes + 4, sizeof(D4));
  }
  void store(double* lanes) const {
    __builtin_memcpy(lanes, &low, sizeof(D4));
    __builtin_memcpy(lanes + 4, &high, sizeof(D4));
  }
};
inline double lanes_total(const double* l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }
// Keeps the product in v rounded on its own, never fused with the sum it goes into (one FMA):
// GCC fuses a product with a later add even across statements where the instruction set has
// FMA, clang within one expression. A value that fits a register passes through an empty asm
// (GCC's __builtin_assoc_barrier splits a float vector into its lanes); a wider one (8 doubles
// below AVX-512) through that barrier, or for clang through the statement that holds it.
template <typename T>
[[gnu::always_inline]] inline void round_apart(T& v) {
#if defined(__AVX512F__)
  constexpr int64_t register_bytes = 64;
#elif defined(__AVX__)
  constexpr int64_t register_bytes = 32;
#else
  constexpr int64_t register_bytes = 16;
#endif
  if constexpr (static_cast<int64_t>(sizeof(T)) <= register_bytes) {
    asm("" : "+v"(v));
  } else {
#if !defined(__clang__)
    v = __builtin_assoc_barrier(v);
#endif
  }
}

// The sum of y[0..n) in double as SoftmaxRowsF32 makes it.
inline float softmax_sum(int64_t n, const float* y) {
  EightLanes sums;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    D8 v;
    eight_doubles(y + i, v);
    sums.add(v);
  }
  double lanes[8];
  sums.store(lanes);
  for (; i < n; ++i) lanes[i % 8] += y[i];
  return static_cast<float>(lanes_total(lanes));
}

// The softmax of one row (SoftmaxRowsF32) in passes over memory.
template <int W>
void softmax_row_f32(int64_t n, const float* x, float* y) {
  typedef typename FloatVector<W>::type V;
  // A NaN is passed over here (it may hide other values of its lane) but reaches the sum through
  // x - m, and so every output.
  float m = x[0];
  int64_t i = 1;
  if (n >= W) {
    V lanes = load_lanes<W>(x);
    for (i = W; i + W <= n; i += W) {
      const V v = load_lanes<W>(x + i);
      lanes = v > lanes ? v : lanes;
    }
    for (int k = 0; k < W; ++k) m = lanes[k] > m ? lanes[k] : m;
  }
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (i = 0; i + W <= n; i += W) {
    const V v = load_lanes<W>(x + i) - m;
    __builtin_memcpy(y + i, &v, sizeof(V));
  }
  for (; i < n; ++i) y[i] = x[i] - m;
  exp_f32<W>(n, y, y);
  const float s = softmax_sum(n, y);
  for (i = 0; i + W <= n; i += W) {
    const V v = load_lanes<W>(y + i) / s;
    __builtin_memcpy(y + i, &v, sizeof(V));
  }
  for (; i < n; ++i) y[i] /= s;
}

// The softmax of G rows of n <= NV vectors each (NV <= kShortRowVectors: Swin's 49 scores a
// row), side by side, in registers: v[g] holds row g, its lanes past n -inf (no part in the
// maximum, e^-inf = 0 after it); the sum made from the registers (8 lanes at a time, as
// softmax_sum: 0 added for the lanes past n). The same values as softmax_row_f32, whose passes over
// memory and chains of dependent steps (one row at a time) cost such rows more than their
// arithmetic. W >= 8 (its halves of 8 lanes).
// Lanes [8 H, 8 H + 8) of v (W 8 or 16).
template <int W, int H>
[[gnu::always_inline]] inline F8 eight_lanes(typename FloatVector<W>::type v) {
  if constexpr (W == 8) {
    F8 f;
    __builtin_memcpy(&f, &v, sizeof(F8));
    return f;
  } else {
    return __builtin_shufflevector(v, v, 8 * H, 8 * H + 1, 8 * H + 2, 8 * H + 3, 8 * H + 4, 8 * H + 5, 8 * H + 6,
                                   8 * H + 7);
  }
}
template <int W, int G, int NV>
[[gnu::always_inline]] inline void softmax_short_vectors(int64_t n, typename FloatVector<W>::type (&v)[G][NV]) {
  typedef typename FloatVector<W>::type V;
  float m[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    V top = v[g][0];
#pragma GCC unroll 4
    for (int r = 1; r < NV; ++r) top = v[g][r] > top ? v[g][r] : top;
    m[g] = top[0];  // (a NaN may be passed over here, but reaches every output through the sum)
#pragma GCC unroll 16
    for (int k = 1; k < W; ++k) m[g] = top[k] > m[g] ? top[k] : m[g];
  }
  float s[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    EightLanes sums;
#pragma GCC unroll 4
    for (int r = 0; r < NV; ++r) {
      if (r * W >= n) break;
      v[g][r] = exp_lanes<W>(v[g][r] - m[g]);
      sums.add(__builtin_convertvector(eight_lanes<W, 0>(v[g][r]), D8));
      if constexpr (W == 16)
        if (r * W + 8 < n) sums.add(__builtin_convertvector(eight_lanes<W, 1>(v[g][r]), D8));
    }
    double lanes[8];
    sums.store(lanes);
    s[g] = static_cast<float>(lanes_total(lanes));
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int r = 0; r < NV; ++r)
      if (r * W < n) v[g][r] /= s[g];
}

// v with its lanes from `count` on set to -inf.
template <int W>
[[gnu::always_inline]] inline typename FloatVector<W>::type minus_inf_from(typename FloatVector<W>::type v,
                                                                           int64_t count) {
  typedef typename FloatVector<W>::type V;
  typedef typename IntVector<W>::type I;
  I lane;
#pragma GCC unroll 16
  for (int k = 0; k < W; ++k) lane[k] = k;
  const V minus_inf = V{} - __builtin_inff();
  return lane < static_cast<int32_t>(count) ? v : minus_inf;
}

// G consecutive rows of n <= kShortRowVectors vectors through softmax_short_vectors.
template <int W, int G>
[[gnu::always_inline]] inline void softmax_short_rows_f32(int64_t n, const float* x, float* y) {
  typedef typename FloatVector<W>::type V;
  constexpr int R = kShortRowVectors;
  const V minus_inf = V{} - __builtin_inff();
  V v[G][R];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int64_t count = n - r * W;
      v[g][r] = count <= 0 ? minus_inf : minus_inf_from<W>(load_first_lanes<W>(x + g * n + r * W, count), count);
    }
  softmax_short_vectors<W, G, R>(n, v);
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
      if (r * W < n) store_lanes<W>(v[g][r], n - r * W, y + g * n + r * W);
}

// See SoftmaxRowsF32.
template <int W>
void softmax_f32(int64_t rows, int64_t n, const float* x, float* y) {
  int64_t r = 0;
  if constexpr (W >= 8)
    if (n <= kShortRowVectors * W) {
      for (; r + 2 <= rows; r += 2) softmax_short_rows_f32<W, 2>(n, x + r * n, y + r * n);
      for (; r < rows; ++r) softmax_short_rows_f32<W, 1>(n, x + r * n, y + r * n);
    }
  for (; r < rows; ++r) softmax_row_f32<W>(n, x + r * n, y + r * n);
}

// One row of an additive term of attention's scores (bias or mask): its elements [r W, r W + W)
// of row i as a vector (lanes past S as they come: the caller sets them to -inf).
template <int W>
[[gnu::always_inline]] inline typename FloatVector<W>::type score_term(const float* t, int64_t rs, int64_t cs,
                                                                       int64_t i, int64_t j0, int64_t S) {
  typename FloatVector<W>::type x{};
  const float* row = t + i * rs + j0 * cs;
  if (cs == 1) return load_first_lanes<W>(row, S - j0);
#pragma GCC unroll 16
  for (int k = 0; k < W; ++k)
    if (j0 + k < S) x[k] = row[k * cs];
  return x;
}

// G rows of an attention item from row i0 (see AttentionShortF32): their scores in NV vectors
// each (kt: k^T, NV * W floats a row), softmax, then P (stored at p, NV * W floats a row) @ v in
// chunks of U vectors of v's columns.
template <int W, int G, int NV>
[[gnu::always_inline]] inline void attention_short_rows(const AttentionItemF32& a, int64_t i0, const float* kt,
                                                        float* p) {
  typedef typename FloatVector<W>::type V;
  constexpr int SW = NV * W, U = 2;
  V s[G][NV];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int r = 0; r < NV; ++r) s[g][r] = V{};
  const float* q = a.q + i0 * a.q_rs;
  for (int64_t d = 0; d < a.D; ++d) {
    V kv[NV];
#pragma GCC unroll 4
    for (int r = 0; r < NV; ++r) kv[r] = load_lanes<W>(kt + d * SW + r * W);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const float qv = q[g * a.q_rs + d * a.q_cs];
#pragma GCC unroll 4
      for (int r = 0; r < NV; ++r) s[g][r] = FmaStep::step(s[g][r], qv, kv[r]);
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int r = 0; r < NV; ++r) {
      if (a.bias) s[g][r] += score_term<W>(a.bias, a.bias_rs, a.bias_cs, i0 + g, r * W, a.S);
      if (a.mask) s[g][r] += score_term<W>(a.mask, a.mask_rs, a.mask_cs, i0 + g, r * W, a.S);
      s[g][r] = minus_inf_from<W>(s[g][r], a.S - r * W);
    }
  softmax_short_vectors<W, G, NV>(a.S, s);
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int r = 0; r < NV; ++r) __builtin_memcpy(p + g * SW + r * W, &s[g][r], sizeof(V));
  // Columns [j0, j0 + U W) of the G output rows, the last `left` of them where Partial.
  auto columns = [&]<bool Partial>(int64_t j0, int64_t left) {
    V o[G][U];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) o[g][u] = V{};
    for (int64_t t = 0; t < a.S; ++t) {
      const float* vrow = a.v + t * a.v_rs + j0;
      V vv[U];
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u)
        vv[u] = !Partial       ? load_lanes<W>(vrow + u * W)
                : left > u * W ? load_first_lanes<W>(vrow + u * W, left - u * W)
                               : V{};
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
        for (int u = 0; u < U; ++u) o[g][u] = FmaStep::step(o[g][u], p[g * SW + t], vv[u]);
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u)
        if (!Partial || left > u * W) store_lanes<W>(o[g][u], left - u * W, a.out + (i0 + g) * a.out_rs + j0 + u * W);
  };
  int64_t j0 = 0;
  for (; j0 + U * W <= a.Dv; j0 += U * W) columns.template operator()<false>(j0, U * W);
  if (j0 < a.Dv) columns.template operator()<true>(j0, a.Dv - j0);
}

// See AttentionShortF32 (S <= NV * W): k^T packed once, then the rows kAttentionRows at a time.
constexpr int kAttentionRows = 4;
static_assert(kAttentionRows <= kShortRowVectors);  // p's rows in the scratch (AttentionShortF32)
template <int W, int NV>
void attention_short_vectors(const AttentionItemF32& a) {
  constexpr int SW = NV * W;
  float* kt = a.scratch;
  float* p = kt + a.D * SW;
  if (a.k_cs == 1) {
    pack_transposed<W>(a.D, a.S, a.k, a.k_rs, kt, SW);
  } else {
    for (int64_t d = 0; d < a.D; ++d)
      for (int64_t j = 0; j < a.S; ++j) kt[d * SW + j] = a.k[j * a.k_rs + d * a.k_cs];
  }
  for (int64_t d = 0; d < a.D; ++d)
    for (int64_t j = a.S; j < SW; ++j) kt[d * SW + j] = 0.f;
  int64_t i = 0;
  for (; i + kAttentionRows <= a.L; i += kAttentionRows) attention_short_rows<W, kAttentionRows, NV>(a, i, kt, p);
  for (; i < a.L; ++i) attention_short_rows<W, 1, NV>(a, i, kt, p);
}
template <int W>
void attention_short_f32(const AttentionItemF32& a) {
  static_assert(kShortRowVectors == 4);
  switch ((a.S + W - 1) / W) {
    case 1:
      return attention_short_vectors<W, 1>(a);
    case 2:
      return attention_short_vectors<W, 2>(a);
    case 3:
      return attention_short_vectors<W, 3>(a);
    default:
      return attention_short_vectors<W, 4>(a);
  }
}

// sigmoid(x) = 1 / (1 + z) for x >= 0 and z / (1 + z) below, with z = e^-|x|: z never overflows,
// so the tiny results of very negative x keep their precision.
template <int W>
[[gnu::always_inline]] inline typename FloatVector<W>::type sigmoid_lanes(typename FloatVector<W>::type x) {
  typedef typename FloatVector<W>::type V;
  typedef typename IntVector<W>::type I;
  I bits;  // -|x| as x with its sign bit set (NaN stays NaN)
  __builtin_memcpy(&bits, &x, sizeof(V));
  bits |= std::numeric_limits<int32_t>::min();
  V minus_abs;
  __builtin_memcpy(&minus_abs, &bits, sizeof(V));
  const V z = exp_lanes<W, true>(minus_abs);
  return quotient_lanes<W>(x < 0 ? z : V{} + 1.0f, 1.0f + z);
}

template <int W>
void sigmoid_f32(int64_t n, const float* x, float* y) {
  map_lanes<W>(n, x, y, [](auto v) { return sigmoid_lanes<W>(v); });
}

template <int W>
void silu_f32(int64_t n, const float* x, float* y) {
  map_lanes<W>(n, x, y, [](auto v) { return v * sigmoid_lanes<W>(v); });
}

// min(hi, max(lo, x)) in each lane, NaN kept: vmaxps and vminps where the instruction set has
// them (they give their second operand for NaN), else two selects.
template <int W>
[[gnu::always_inline]] inline typename FloatVector<W>::type clamp_lanes(typename FloatVector<W>::type x, float lo,
                                                                        float hi) {
  typedef typename FloatVector<W>::type V;
#ifdef __AVX512F__
  if constexpr (W == 16) {  // (the masked forms: GCC 12 warns of the plain ones' undefined source)
    const V upper = _mm512_mask_min_ps(x, 0xffff, V{} + hi, x);
    return _mm512_mask_max_ps(upper, 0xffff, V{} + lo, upper);
  }
#endif
#ifdef __AVX__
  if constexpr (W == 8) return _mm256_max_ps(V{} + lo, _mm256_min_ps(V{} + hi, x));
#endif
  const V below = x > hi ? V{} + hi : x;
  return below < lo ? V{} + lo : below;
}

// x * x - s exactly, for s = x * x rounded (|x| <= 20 here): one FMA where the instruction set
// has it, else Dekker's product of x split into 12-bit halves (each partial product exact).
template <int W>
[[gnu::always_inline]] inline typename FloatVector<W>::type square_error_lanes(typename FloatVector<W>::type x,
                                                                               typename FloatVector<W>::type s) {
  typedef typename FloatVector<W>::type V;
  typedef typename IntVector<W>::type I;
#ifdef __AVX512F__
  if constexpr (W == 16) return _mm512_fmsub_ps(x, x, s);
#endif
#ifdef __FMA__
  if constexpr (W == 8) return _mm256_fmsub_ps(x, x, s);
#endif
  I bits;
  __builtin_memcpy(&bits, &x, sizeof(V));
  bits &= static_cast<int32_t>(0xfffff000u);
  V high;
  __builtin_memcpy(&high, &bits, sizeof(V));
  const V low = x - high;
  return ((high * high - s) + 2.0f * high * low) + low * low;
}

// Phi(x) = P(X <= x) for a standard normal X: with z = |x| / sqrt(2) and t = 1 / (1 + z / 2),
// erfc(z) = t * exp(-z^2 + P(t)), P the degree-9 Chebyshev fit of Numerical Recipes (section 6.2,
// fractional error below 1.2e-7 for every z), and Phi = erfc(z) / 2 below 0, 1 - erfc(z) / 2
// above: relative precision in the negative tail, where 1 + erf(x / sqrt(2)) cancels. The
// exponent -x^2 / 2 + P(t) is carried as a float pair (x^2 as its rounded value and the exact
// error, square_error_lanes; the sum with P by Fast2Sum), since its rounding alone, times e^...,
// would cost z^2 ulps. x is clamped to [-20, 20], where Phi is 0 and 1 in float; the exponent is
// then at least -200, so exp_lanes' NonPositive form (below -103.97 e^-103.97 scaled, 0 or
// 2^-149, where the result is 0 or denormal anyway) serves. Measured on Zen 4, one thread, the
// GELU of 16384 values in L1: 0.88 ns a value against 1.16 with two selects a clamp, the 12-bit
// split and exp_lanes' overflow checks.
template <int W>
[[gnu::always_inline]] inline typename FloatVector<W>::type normal_cdf_lanes(typename FloatVector<W>::type x) {
  typedef typename FloatVector<W>::type V;
  const V xc = clamp_lanes<W>(x, -20.0f, 20.0f);  // NaN stays NaN
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
  const V square = xc * xc;
  const V a = -0.5f * square;                                // exact
  const V b = p - 0.5f * square_error_lanes<W>(xc, square);  // -x^2 / 2 + P = a + b, nearly exactly
  const V sum = a + b, rest = b - (sum - a);  // a + b exactly where |a| >= |b| (large |x|, where it matters)
  const V half_erfc = 0.5f * t * exp_lanes<W, true>(sum) * (1.0f + rest);
  return xc < 0 ? half_erfc : 1.0f - half_erfc;
}

template <int W>
void gelu_f32(int64_t n, const float* x, float* y) {
  map_lanes<W>(n, x, y, [](auto v) { return v * normal_cdf_lanes<W>(v); });
}

// See GeluBackwardF32: whole vectors, then the tail through zero-padded vectors.
template <int W>
void gelu_backward_f32(int64_t n, const float* dy, const float* x, float* dx) {
  typedef typename FloatVector<W>::type V;
  auto lanes = [](V d, V v) {
    const V pdf = 0.398942280401432678f * exp_lanes<W>(-0.5f * (v * v));
    return d * (normal_cdf_lanes<W>(v) + v * pdf);
  };
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const V v = lanes(load_lanes<W>(dy + i), load_lanes<W>(x + i));
    __builtin_memcpy(dx + i, &v, sizeof(V));
  }
  if (i < n) {
    float db[W] = {}, xb[W] = {};
    for (int64_t k = i; k < n; ++k) db[k - i] = dy[k], xb[k - i] = x[k];
    store_lanes<W>(lanes(load_lanes<W>(db), load_lanes<W>(xb)), n - i, dx + i);
  }
}

// ---------------------------------------------------------------- Winograd F(4x4, 3x3)

// Lane shuffles over W-lane vectors (J: the lane indices 0..W-1): the even or odd elements of the
// 2W values lo, hi; the first or second halves of a and b interleaved (a0 b0 a1 b1 ...).
template <int W, int... J>
typename FloatVector<W>::type pick_even(typename FloatVector<W>::type lo, typename FloatVector<W>::type hi,
                                        Lanes<J...>) {
  return __builtin_shufflevector(lo, hi, (2 * J)...);
}
template <int W, int... J>
typename FloatVector<W>::type pick_odd(typename FloatVector<W>::type lo, typename FloatVector<W>::type hi,
                                       Lanes<J...>) {
  return __builtin_shufflevector(lo, hi, (2 * J + 1)...);
}
template <int W, int... J>
typename FloatVector<W>::type zip_low(typename FloatVector<W>::type a, typename FloatVector<W>::type b, Lanes<J...>) {
  return __builtin_shufflevector(a, b, ((J & 1) ? W + J / 2 : J / 2)...);
}
template <int W, int... J>
typename FloatVector<W>::type zip_high(typename FloatVector<W>::type a, typename FloatVector<W>::type b, Lanes<J...>) {
  return __builtin_shufflevector(a, b, ((J & 1) ? W + W / 2 + J / 2 : W / 2 + J / 2)...);
}

// q[i][lane] = p[4 * lane + i] for i < 4: the 4W floats at p split into their four phases.
template <int W>
void load_phases(const float* p, typename FloatVector<W>::type (&q)[4]) {
  typedef typename FloatVector<W>::type V;
  const typename MakeLanes<W>::type lanes;
  V a, b, c, d;
  __builtin_memcpy(&a, p, sizeof(V));
  __builtin_memcpy(&b, p + W, sizeof(V));
  __builtin_memcpy(&c, p + 2 * W, sizeof(V));
  __builtin_memcpy(&d, p + 3 * W, sizeof(V));
  const V even_ab = pick_even<W>(a, b, lanes), even_cd = pick_even<W>(c, d, lanes);
  const V odd_ab = pick_odd<W>(a, b, lanes), odd_cd = pick_odd<W>(c, d, lanes);
  q[0] = pick_even<W>(even_ab, even_cd, lanes);
  q[1] = pick_even<W>(odd_ab, odd_cd, lanes);
  q[2] = pick_odd<W>(even_ab, even_cd, lanes);
  q[3] = pick_odd<W>(odd_ab, odd_cd, lanes);
}

// The inverse: p[4 * lane + i] = q[i][lane], 4W floats.
template <int W>
void store_phases(const typename FloatVector<W>::type (&q)[4], float* p) {
  typedef typename FloatVector<W>::type V;
  const typename MakeLanes<W>::type lanes;
  const V lo02 = zip_low<W>(q[0], q[2], lanes), hi02 = zip_high<W>(q[0], q[2], lanes);
  const V lo13 = zip_low<W>(q[1], q[3], lanes), hi13 = zip_high<W>(q[1], q[3], lanes);
  const V out[4] = {zip_low<W>(lo02, lo13, lanes), zip_high<W>(lo02, lo13, lanes), zip_low<W>(hi02, hi13, lanes),
                    zip_high<W>(hi02, hi13, lanes)};
  __builtin_memcpy(p, out, sizeof(out));
}

// The 1-d transforms of F(4, 3) on vectors (or floats): out = B^T d (6 of 6), out = A^T m (4 of
// 6), out = G g (6 of 3), with Lavin's matrices (interpolation points 0, +-1, +-2, infinity).
template <typename V>
[[gnu::always_inline]] inline void winograd_bt(const V (&d)[6], V (&out)[6]) {
  out[0] = 4.f * d[0] - 5.f * d[2] + d[4];
  out[1] = d[3] + d[4] - 4.f * (d[1] + d[2]);
  out[2] = d[4] - d[3] + 4.f * (d[1] - d[2]);
  out[3] = d[4] - d[2] + 2.f * (d[3] - d[1]);
  out[4] = d[4] - d[2] + 2.f * (d[1] - d[3]);
  out[5] = 4.f * d[1] - 5.f * d[3] + d[5];
}
template <typename V>
[[gnu::always_inline]] inline void winograd_at(const V (&m)[6], V (&out)[4]) {
  const V s12 = m[1] + m[2], d12 = m[1] - m[2], s34 = m[3] + m[4], d34 = m[3] - m[4];
  out[0] = m[0] + s12 + s34;
  out[1] = d12 + 2.f * d34;
  out[2] = s12 + 4.f * s34;
  out[3] = d12 + 8.f * d34 + m[5];
}
template <typename V>
[[gnu::always_inline]] inline void winograd_g(const V (&g)[3], V (&out)[6]) {
  const V sum = g[0] + g[2], quarter = g[0] * 0.25f;
  out[0] = quarter;
  out[1] = (sum + g[1]) * (-1.f / 6);
  out[2] = (sum - g[1]) * (-1.f / 6);
  out[3] = quarter * (1.f / 6) + g[1] * (1.f / 12) + g[2] * (1.f / 6);
  out[4] = quarter * (1.f / 6) - g[1] * (1.f / 12) + g[2] * (1.f / 6);
  out[5] = g[2];
}

// ---------------------------------------------------------------- convolution epilogue

// Always inlined, as the transforms of Winograd above: as a call, SiLU's (an e^x and a quotient)
// left its callers' live vectors spilled around each call and its chains unoverlapped (the GEMM's
// epilogue over a 12 x 32 tile, the depthwise kernels'), taking 13% of EfficientNet-B0's time at
// batch 1 in a profile; measured on Zen 4, 2 threads: its inverted residuals 0.93-0.94x the time
// at batch 1, the Winograd convolutions of ResNet-50 and DenseNet-121 0.95x. The same bits.
template <int W, RowActivation Act>
[[gnu::always_inline]] inline typename FloatVector<W>::type activation_lanes(typename FloatVector<W>::type v) {
  typedef typename FloatVector<W>::type V;
  if constexpr (Act == RowActivation::relu) {
    return v < 0.f ? V{} : v;
  } else if constexpr (Act == RowActivation::relu6) {
    const V x = v < 0.f ? V{} : v;
    return x > 6.f ? V{} + 6.f : x;
  } else if constexpr (Act == RowActivation::silu) {
    return v * sigmoid_lanes<W>(v);
  } else if constexpr (Act == RowActivation::hardswish) {
    V r = v + 3.f;
    r = r < 0.f ? V{} : r;
    r = r > 6.f ? V{} + 6.f : r;
    return v * r / 6.f;
  } else {
    return v;
  }
}

// See GemmMicroKernelEpilogueF32: micro_kernel's sums (the tile whole) with beta times C added as
// store_tile adds it, then each row through EpilogueRowF32's arithmetic in registers; the
// residual's tile is fetched while the sums run.
template <int W, int MR, int NV, bool ARows, bool Ahead, RowActivation Act>
void gemm_micro_kernel_epilogue(int64_t kc, const float* __restrict a, int64_t a_ks, const float* __restrict b,
                                int64_t b_rs, float beta, float* __restrict c, int64_t c_rs, const GemmRowEpilogue& e) {
  typedef typename FloatVector<W>::type V;
  prefetch_tile(c, c_rs, 1, MR, NV * W);
  if (e.residual)
#pragma GCC unroll 64
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NV * W; j += 16) __builtin_prefetch(e.residual + i * e.r_rs + j, 0, 3);
  V acc[MR][NV];
  if constexpr (ARows)
    micro_kernel_sums<float, float, W, MR, NV, FmaStep, Ahead, ARowsOf<float>, false>(kc, ARowsOf<float>{a, a_ks}, b,
                                                                                      b_rs, b, nullptr, acc);
  else
    micro_kernel_sums<float, float, W, MR, NV, FmaStep, Ahead, AColumns<float>, false>(kc, AColumns<float>{a, a_ks}, b,
                                                                                       b_rs, b, nullptr, acc);
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i) {
    const V s = e.scale ? V{} + e.scale[i] : V{}, h = e.shift ? V{} + e.shift[i] : V{};
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      V x = acc[i][v];
      if (beta != 0.f) x += beta * load_lanes<W>(c + i * c_rs + v * W);  // as store_tile's
      if (e.scale)
        x = x * s + h;
      else if (e.shift)
        x = x + h;
      if (e.residual) x = x + load_lanes<W>(e.residual + i * e.r_rs + v * W);
      x = activation_lanes<W, Act>(x);
      __builtin_memcpy(c + i * c_rs + v * W, &x, sizeof(V));
    }
  }
}

// The tail as map_lanes's. PerChannel: scale and shift hold n values (EpilogueChannelsF32), else
// one each (EpilogueRowF32).
template <int W, RowActivation Act, bool PerChannel>
void epilogue_lanes(int64_t n, const float* x, float* y, const float* scale, const float* shift,
                    const float* residual) {
  typedef typename FloatVector<W>::type V;
  // The scale and shift of the lanes from i: one value each, or one per channel.
  auto at = [](const float* p, int64_t i) {
    if constexpr (PerChannel)
      return load_lanes<W>(p + i);
    else
      return V{} + *p;
  };
  auto one = [&](V v, V r, V s, V b) {  // one arithmetic for both forms and every length
    if (scale)
      v = v * s + b;
    else if (shift)
      v = v + b;
    if (residual) v = v + r;
    return activation_lanes<W, Act>(v);
  };
  if (n < W) {  // the first n lanes (masked loads and store on AVX-512), the others unused
    auto first = [&](const float* p) {
      if constexpr (PerChannel)
        return load_first_lanes<W>(p, n);
      else
        return V{} + *p;
    };
    const V r = residual ? load_first_lanes<W>(residual, n) : V{};
    store_lanes<W>(one(load_first_lanes<W>(x, n), r, scale ? first(scale) : V{}, shift ? first(shift) : V{}), n, y);
    return;
  }
  auto step = [&](V v, V r, int64_t i) { return one(v, r, scale ? at(scale, i) : V{}, shift ? at(shift, i) : V{}); };
  V last, last_r{};
  __builtin_memcpy(&last, x + n - W, sizeof(V));
  if (residual) __builtin_memcpy(&last_r, residual + n - W, sizeof(V));
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    V v, r{};
    __builtin_memcpy(&v, x + i, sizeof(V));
    if (residual) __builtin_memcpy(&r, residual + i, sizeof(V));
    v = step(v, r, i);
    __builtin_memcpy(y + i, &v, sizeof(V));
  }
  if (i < n) {
    last = step(last, last_r, n - W);
    __builtin_memcpy(y + n - W, &last, sizeof(V));
  }
}

// Calls f.template operator()<Act>() with act as a compile-time constant: each kernel's form for
// one activation.
template <typename F>
void with_activation(RowActivation act, F&& f) {
  switch (act) {
    case RowActivation::none:
      return f.template operator()<RowActivation::none>();
    case RowActivation::relu:
      return f.template operator()<RowActivation::relu>();
    case RowActivation::relu6:
      return f.template operator()<RowActivation::relu6>();
    case RowActivation::silu:
      return f.template operator()<RowActivation::silu>();
    case RowActivation::hardswish:
      return f.template operator()<RowActivation::hardswish>();
  }
}

// See EpilogueRowF32.
template <int W>
void epilogue_f32(int64_t n, const float* x, float* y, const float* scale, const float* shift, const float* residual,
                  RowActivation act) {
  with_activation(act, [&]<RowActivation Act>() { epilogue_lanes<W, Act, false>(n, x, y, scale, shift, residual); });
}

// See EpilogueChannelsF32.
template <int W, RowActivation Act>
void epilogue_channel_rows(int64_t rows, int64_t n, const float* x, int64_t x_rs, float* y, int64_t y_rs,
                           const float* scale, const float* shift, const float* residual, int64_t r_rs) {
  for (int64_t i = 0; i < rows; ++i)
    epilogue_lanes<W, Act, true>(n, x + i * x_rs, y + i * y_rs, scale, shift, residual ? residual + i * r_rs : nullptr);
}
template <int W>
void epilogue_channels_f32(int64_t rows, int64_t n, const float* x, int64_t x_rs, float* y, int64_t y_rs,
                           const float* scale, const float* shift, const float* residual, int64_t r_rs,
                           RowActivation act) {
  with_activation(act, [&]<RowActivation Act>() {
    epilogue_channel_rows<W, Act>(rows, n, x, x_rs, y, y_rs, scale, shift, residual, r_rs);
  });
}

// G output positions from ow of a channel block (see DepthwiseChannelsF32): kDepthwiseBlock / W
// vectors each, in registers over the taps, then through the epilogue into y.
template <int W, int G, RowActivation Act>
void depthwise_channel_positions(int64_t ow, int64_t taps, const float* x, const int64_t* offsets, int64_t step,
                                 const float* w, const float* bias, const float* scale, const float* shift, float* y,
                                 int64_t y_step) {
  typedef typename FloatVector<W>::type V;
  constexpr int B = kDepthwiseBlock / W;
  V acc[G][B];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) acc[g][b] = load_lanes<W>(bias + b * W);
  for (int64_t t = 0; t < taps; ++t) {
    const float* xt = x + offsets[t] + ow * step;
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) {
      const V wv = load_lanes<W>(w + t * kDepthwiseBlock + b * W);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) acc[g][b] += wv * load_lanes<W>(xt + g * step + b * W);
    }
  }
#pragma GCC unroll 4
  for (int b = 0; b < B; ++b) {
    // The same arithmetic as EpilogueRowF32's with one channel's scale and shift.
    const V s = scale ? load_lanes<W>(scale + b * W) : V{}, h = shift ? load_lanes<W>(shift + b * W) : V{};
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      V v = acc[g][b];
      if (scale) v = v * s + h;
      v = activation_lanes<W, Act>(v);
      __builtin_memcpy(y + (ow + g) * y_step + b * W, &v, sizeof(V));
    }
  }
}

// See DepthwiseChannelsF32: groups of G positions (8 vectors of sums), the rest as one smaller
// group (its sums independent chains too).
template <int W, RowActivation Act>
void depthwise_channels_act(int64_t n, int64_t taps, const float* x, const int64_t* offsets, int64_t step,
                            const float* w, const float* bias, const float* scale, const float* shift, float* y,
                            int64_t y_step) {
  constexpr int G = 8 / (kDepthwiseBlock / W);
  using Group = void (*)(int64_t, int64_t, const float*, const int64_t*, int64_t, const float*, const float*,
                         const float*, const float*, float*, int64_t);
  static constexpr Group last_groups[8] = {
      depthwise_channel_positions<W, 1, Act>, depthwise_channel_positions<W, 2, Act>,
      depthwise_channel_positions<W, 3, Act>, depthwise_channel_positions<W, 4, Act>,
      depthwise_channel_positions<W, 5, Act>, depthwise_channel_positions<W, 6, Act>,
      depthwise_channel_positions<W, 7, Act>, depthwise_channel_positions<W, 8, Act>};
  int64_t ow = 0;
  for (; ow + G <= n; ow += G)
    depthwise_channel_positions<W, G, Act>(ow, taps, x, offsets, step, w, bias, scale, shift, y, y_step);
  if (ow < n) last_groups[n - ow - 1](ow, taps, x, offsets, step, w, bias, scale, shift, y, y_step);
}
template <int W>
void depthwise_channels(int64_t n, int64_t taps, const float* x, const int64_t* offsets, int64_t step, const float* w,
                        const float* bias, const float* scale, const float* shift, RowActivation act, float* y,
                        int64_t y_step) {
  with_activation(act, [&]<RowActivation Act>() {
    depthwise_channels_act<W, Act>(n, taps, x, offsets, step, w, bias, scale, shift, y, y_step);
  });
}

// ---------------------------------------------------------------- layer norm

// The sum of n terms: lanes(i) gives the W terms from i, one(i) the term i alone; 4 accumulators
// of W lanes added pairwise, then the lanes, then the tail in order.
template <int W, typename Lanes, typename One>
float row_sum(int64_t n, Lanes lanes, One one) {
  typedef typename FloatVector<W>::type V;
  V acc[4] = {};
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W)
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) acc[u] += lanes(i + u * W);
  for (; i + W <= n; i += W) acc[0] += lanes(i);
  float s = lane_total<W>((acc[0] + acc[1]) + (acc[2] + acc[3]));
  for (; i < n; ++i) s += one(i);
  return s;
}

// See LayerNormRowF32.
template <int W>
void layer_norm_f32(int64_t n, const float* x, const float* w, const float* b, float eps, float* y, float* mean_out,
                    float* rstd_out) {
  typedef typename FloatVector<W>::type V;
  const float mean = row_sum<W>(
                         n, [&](int64_t i) { return load_lanes<W>(x + i); }, [&](int64_t i) { return x[i]; }) /
                     static_cast<float>(n);
  const float var = row_sum<W>(
                        n,
                        [&](int64_t i) {
                          const V d = load_lanes<W>(x + i) - mean;
                          return d * d;
                        },
                        [&](int64_t i) { return (x[i] - mean) * (x[i] - mean); }) /
                    static_cast<float>(n);
  const float rstd = 1.0f / __builtin_sqrtf(var + eps);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const V v = (load_lanes<W>(x + i) - mean) * rstd * load_lanes<W>(w + i) + load_lanes<W>(b + i);
    __builtin_memcpy(y + i, &v, sizeof(V));
  }
  for (; i < n; ++i) y[i] = (x[i] - mean) * rstd * w[i] + b[i];
  *mean_out = mean;
  *rstd_out = rstd;
}

// See LayerNormBackwardRowF32.
template <int W>
void layer_norm_backward_f32(int64_t n, const float* dy, const float* x, float mean, float rstd, const float* w,
                             float* dx, float* sum_dy_xhat, float* sum_dy) {
  typedef typename FloatVector<W>::type V;
  V acc_g[2] = {}, acc_gx[2] = {};
  int64_t i = 0;
  auto lanes = [&](int64_t at, int u) {
    const V d = load_lanes<W>(dy + at), xhat = (load_lanes<W>(x + at) - mean) * rstd, g = d * load_lanes<W>(w + at);
    acc_g[u] += g;
    acc_gx[u] += g * xhat;
    if (sum_dy_xhat) {
      const V s = load_lanes<W>(sum_dy_xhat + at) + d * xhat;
      __builtin_memcpy(sum_dy_xhat + at, &s, sizeof(V));
    }
    if (sum_dy) {
      const V s = load_lanes<W>(sum_dy + at) + d;
      __builtin_memcpy(sum_dy + at, &s, sizeof(V));
    }
  };
  for (; i + 2 * W <= n; i += 2 * W) lanes(i, 0), lanes(i + W, 1);
  for (; i + W <= n; i += W) lanes(i, 0);
  float s_g = lane_total<W>(acc_g[0] + acc_g[1]), s_gx = lane_total<W>(acc_gx[0] + acc_gx[1]);
  for (int64_t k = i; k < n; ++k) {
    const float xhat = (x[k] - mean) * rstd, g = dy[k] * w[k];
    s_g += g;
    s_gx += g * xhat;
    if (sum_dy_xhat) sum_dy_xhat[k] += dy[k] * xhat;
    if (sum_dy) sum_dy[k] += dy[k];
  }
  const float mean_g = s_g / static_cast<float>(n), mean_gx = s_gx / static_cast<float>(n);
  for (i = 0; i + W <= n; i += W) {
    const V xhat = (load_lanes<W>(x + i) - mean) * rstd;
    const V v = rstd * (load_lanes<W>(dy + i) * load_lanes<W>(w + i) - mean_g - xhat * mean_gx);
    __builtin_memcpy(dx + i, &v, sizeof(V));
  }
  for (; i < n; ++i) dx[i] = rstd * (dy[i] * w[i] - mean_g - (x[i] - mean) * rstd * mean_gx);
}

// ---------------------------------------------------------------- batch norm

// See BatchNormRowsF32: S sums at once, each over rows (in order) of each row's n double terms in
// 8 lanes: eight(r, i, t) sets t[k] to row r's terms i .. i + 7 of sum k, one(r, i, t) t[k] to
// its term i alone.
template <int S, typename Eight, typename One>
void sums_of_rows(int64_t rows, int64_t n, Eight eight, One one, double* totals) {
  for (int k = 0; k < S; ++k) totals[k] = 0;
  for (int64_t r = 0; r < rows; ++r) {
    EightLanes acc[S];
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      D8 t[S];
      eight(r, i, t);
      for (int k = 0; k < S; ++k) acc[k].add(t[k]);
    }
    double lanes[S][8];
    for (int k = 0; k < S; ++k) acc[k].store(lanes[k]);
    for (; i < n; ++i) {
      double t[S];
      one(r, i, t);
      for (int k = 0; k < S; ++k) lanes[k][i % 8] += t[k];
    }
    for (int k = 0; k < S; ++k) totals[k] += lanes_total(lanes[k]);
  }
}

inline double batch_norm_sum_f32(int64_t rows, int64_t n, int64_t rs, const float* x) {
  double total;
  sums_of_rows<1>(
      rows, n, [&](int64_t r, int64_t i, D8* t) { eight_doubles(x + r * rs + i, t[0]); },
      [&](int64_t r, int64_t i, double* t) { t[0] = x[r * rs + i]; }, &total);
  return total;
}

inline double batch_norm_squares_f32(int64_t rows, int64_t n, int64_t rs, const float* x, double m) {
  double total;
  sums_of_rows<1>(
      rows, n,
      [&](int64_t r, int64_t i, D8* t) {
        eight_doubles(x + r * rs + i, t[0]);
        t[0] -= m;
        t[0] *= t[0];
        round_apart(t[0]);
      },
      [&](int64_t r, int64_t i, double* t) {
        const double d = static_cast<double>(x[r * rs + i]) - m;
        t[0] = d * d;
        round_apart(t[0]);
      },
      &total);
  return total;
}

// See ColumnSumsF32: a strip of V vectors of 8 columns over `rows` rows, its sums in registers.
template <int V>
[[gnu::always_inline]] inline void column_strip_sums(int64_t rows, int64_t rs, const float* x, double* sums) {
  EightLanes acc[V];
  for (int v = 0; v < V; ++v) acc[v].load(sums + 8 * v);
  for (int64_t r = 0; r < rows; ++r)
    for (int v = 0; v < V; ++v) {
      D8 t;
      eight_doubles(x + r * rs + 8 * v, t);
      acc[v].add(t);
    }
  for (int v = 0; v < V; ++v) acc[v].store(sums + 8 * v);
}

// Blocks of 16 rows, each across the columns as strips of 16, then 8, then one by one: the block's
// rows are read as 16 streams side by side, which the prefetchers follow (strips down many rows,
// a column block at a time, ran at a third of the speed from memory; row after row into sums kept
// in L1, at half of it), and the sums of a strip stay in registers down the block.
inline void column_sums_f32(int64_t rows, int64_t n, int64_t rs, const float* x, double* sums) {
  constexpr int64_t kRowBlock = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int64_t block = rows - r0 < kRowBlock ? rows - r0 : kRowBlock;
    const float* xb = x + r0 * rs;
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) column_strip_sums<2>(block, rs, xb + c, sums + c);
    for (; c + 8 <= n; c += 8) column_strip_sums<1>(block, rs, xb + c, sums + c);
    for (int64_t r = 0; r < block; ++r)
      for (int64_t k = c; k < n; ++k) sums[k] += static_cast<double>(xb[r * rs + k]);
  }
}

// dy times ReLU's gradient at y (1 where y >= the smallest positive float, else 0; see
// BatchNormRowsF32), for one float or a vector of them (by reference: see eight_doubles).
template <typename T>
[[gnu::always_inline]] inline void relu_gradient(T& dy, const T& y) {
  dy *= y >= __FLT_DENORM_MIN__ ? T{} + 1.0f : T{};
}

inline void batch_norm_grad_sums_f32(int64_t rows, int64_t n, int64_t rs, const float* dy, const float* relu_y,
                                     const float* x, double m, double* s_dy, double* s_dy_xc) {
  double totals[2];
  sums_of_rows<2>(
      rows, n,
      [&](int64_t r, int64_t i, D8* t) {
        F8 g;
        __builtin_memcpy(&g, dy + r * rs + i, sizeof(F8));
        if (relu_y) {
          F8 y;
          __builtin_memcpy(&y, relu_y + r * rs + i, sizeof(F8));
          relu_gradient(g, y);
        }
        t[0] = __builtin_convertvector(g, D8);
        D8 xv;
        eight_doubles(x + r * rs + i, xv);
        t[1] = t[0] * (xv - m);
        round_apart(t[1]);
      },
      [&](int64_t r, int64_t i, double* t) {
        float g = dy[r * rs + i];
        if (relu_y) relu_gradient(g, relu_y[r * rs + i]);
        t[0] = g;
        t[1] = t[0] * (static_cast<double>(x[r * rs + i]) - m);
        round_apart(t[1]);
      },
      totals);
  *s_dy = totals[0], *s_dy_xc = totals[1];
}

template <int W>
void batch_norm_grad_f32(int64_t rows, int64_t n, int64_t rs, const float* dy, const float* relu_y, const float* x,
                         float a, float b, float d, float m, float* dx) {
  typedef typename FloatVector<W>::type V;
  auto lanes = [&](V g, V xv) {
    V p = a * g, q = b * (xv - m);
    round_apart(p);
    round_apart(q);
    return p + q + d;
  };
  // dy's first count values from i (count < W: zeros after), masked where relu_y is given.
  auto g_at = [&](int64_t i, int64_t count) {
    V g = load_first_lanes<W>(dy + i, count);
    if (relu_y) relu_gradient(g, load_first_lanes<W>(relu_y + i, count));
    return g;
  };
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = r * rs;
    int64_t i = 0;
    for (; i + W <= n; i += W) {
      const V v = lanes(g_at(at + i, W), load_lanes<W>(x + at + i));
      __builtin_memcpy(dx + at + i, &v, sizeof(V));
    }
    // The tail as one more vector (a scalar loop would be vectorised with FMAs).
    if (i < n) store_lanes<W>(lanes(g_at(at + i, n - i), load_first_lanes<W>(x + at + i, n - i)), n - i, dx + at + i);
  }
}

// See WinogradInputF32.
template <int W>
void winograd_input_f43(int64_t tiles, const float* const* rows, float* v, int64_t v_stride) {
  typedef typename FloatVector<W>::type V;
  for (int64_t t0 = 0; t0 < tiles; t0 += W) {
    V h[6][6];  // h[j][l]: the horizontal transform of row j
#pragma GCC unroll 6
    for (int j = 0; j < 6; ++j) {
      V q[4], next[4];
      load_phases<W>(rows[j] + 4 * t0, q);
      load_phases<W>(rows[j] + 4 * t0 + 4, next);  // columns 4 and 5 of each tile
      const V d[6] = {q[0], q[1], q[2], q[3], next[0], next[1]};
      winograd_bt(d, h[j]);
    }
#pragma GCC unroll 6
    for (int l = 0; l < 6; ++l) {
      const V col[6] = {h[0][l], h[1][l], h[2][l], h[3][l], h[4][l], h[5][l]};
      V out[6];
      winograd_bt(col, out);
#pragma GCC unroll 6
      for (int k = 0; k < 6; ++k) store_lanes<W>(out[k], tiles - t0, v + (k * 6 + l) * v_stride + t0);
    }
  }
}

// See WinogradOutputF32.
template <int W>
void winograd_output_f43(int64_t tiles, const float* m, int64_t m_stride, float* const* rows) {
  typedef typename FloatVector<W>::type V;
  for (int64_t t0 = 0; t0 < tiles; t0 += W) {
    V s[6][4];  // s[k][b]: the horizontal transform of row k of M
#pragma GCC unroll 6
    for (int k = 0; k < 6; ++k) {
      V mk[6];
#pragma GCC unroll 6
      for (int l = 0; l < 6; ++l) __builtin_memcpy(&mk[l], m + (k * 6 + l) * m_stride + t0, sizeof(V));
      winograd_at(mk, s[k]);
    }
    V y[4][4];  // y[b][a]
#pragma GCC unroll 4
    for (int b = 0; b < 4; ++b) {
      const V col[6] = {s[0][b], s[1][b], s[2][b], s[3][b], s[4][b], s[5][b]};
      winograd_at(col, y[b]);
    }
#pragma GCC unroll 4
    for (int a = 0; a < 4; ++a) {
      const V q[4] = {y[0][a], y[1][a], y[2][a], y[3][a]};
      store_phases<W>(q, rows[a] + 4 * t0);
    }
  }
}

// See WinogradWeightF32.
template <int W>
void winograd_weight_f43(int64_t pairs, const float* w, float* u, int64_t u_stride) {
  typedef typename FloatVector<W>::type V;
  for (int64_t q0 = 0; q0 < pairs; q0 += W) {
    const int64_t n = pairs - q0 < W ? pairs - q0 : W;
    float taps[9][W] = {};
    for (int64_t i = 0; i < n; ++i)
      for (int t = 0; t < 9; ++t) taps[t][i] = w[(q0 + i) * 9 + t];
    V g[3][3];
    __builtin_memcpy(g, taps, sizeof(g));
    V gg[3][6];  // gg[c][k] = (G g)[k][c]
#pragma GCC unroll 3
    for (int c = 0; c < 3; ++c) {
      const V col[3] = {g[0][c], g[1][c], g[2][c]};
      winograd_g(col, gg[c]);
    }
#pragma GCC unroll 6
    for (int k = 0; k < 6; ++k) {
      const V row[3] = {gg[0][k], gg[1][k], gg[2][k]};
      V out[6];
      winograd_g(row, out);
#pragma GCC unroll 6
      for (int l = 0; l < 6; ++l) store_lanes<W>(out[l], n, u + (k * 6 + l) * u_stride + q0);
    }
  }
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
