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

// See GemmMicroKernelF32. MR rows of A are broadcast, NR = NV * W columns of B are held in NV
// vectors; the MR x NV accumulators stay in registers over the k loop.
template <typename T, int W, int MR, int NV>
void gemm_micro_kernel(int64_t kc, const T* __restrict a, const T* __restrict b, int64_t b_rs, T beta, T* __restrict c,
                       int64_t c_rs, int64_t c_cs, int64_t m, int64_t n) {
  typedef T V __attribute__((vector_size(W * sizeof(T))));
  constexpr int NR = NV * W;
  // Fetch the C tile while the k loop runs.
  if (c_cs == 1)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; j += 64 / sizeof(T)) __builtin_prefetch(c + i * c_rs + j, 1);
  V acc[MR][NV];
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 64
    for (int v = 0; v < NV; ++v) acc[i][v] = V{};
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    V bv[NV];
#pragma GCC unroll 64
    for (int v = 0; v < NV; ++v) __builtin_memcpy(&bv[v], b + k * b_rs + v * W, sizeof(V));
#pragma GCC unroll 64
    for (int i = 0; i < MR; ++i) {
      T ai = a[k * MR + i];
#pragma GCC unroll 64
      for (int v = 0; v < NV; ++v) acc[i][v] += ai * bv[v];
    }
  }
  // C = acc + beta * C, through a row buffer when the tile is partial or C's columns strided;
  // either way each element gets the same arithmetic.
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

// See FmaPeakLoop: Chains accumulators of W floats.
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
