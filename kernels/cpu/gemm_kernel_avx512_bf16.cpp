// The bfloat16 GEMM micro-kernel and peak loop with AVX512_BF16's vdpbf16ps (built with the
// AVX-512 flags and -mavx512bf16); the rest of that instruction set's kernels are AVX-512's.
// 12 x 32 floats: 24 zmm accumulators, 2 for B, broadcasts of A's pairs.
#include <immintrin.h>

#include "gemm_kernel_impl.h"

namespace tvc::cpu {
namespace {

// vdpbf16ps: acc += a_odd * b_odd + a_even * b_even per 32-bit lane (see PairDotEmulated).
struct PairDotNative {
  typedef float V __attribute__((vector_size(64)));
  typedef uint32_t U __attribute__((vector_size(64)));
  static V step(V acc, uint32_t a, U b) { return (V)_mm512_dpbf16_ps((__m512)acc, (__m512bh)(U{} + a), (__m512bh)b); }
};

// See FmaPeakLoop: Chains accumulators of 16 floats, each one vdpbf16ps (32 products) per
// iteration.
template <int Chains>
float dpbf16_peak_loop(int64_t iterations) {
  typedef PairDotNative::V V;
  typedef PairDotNative::U U;
  V acc[Chains];
  const U x = U{} + 0x3f803f80u, y = U{} + 0x358637bdu;  // bfloat16 pairs (1, 1), (2e-5, 1e-6)
#pragma GCC unroll 64
  for (int i = 0; i < Chains; ++i) acc[i] = V{} + static_cast<float>(i);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 64
    for (int i = 0; i < Chains; ++i) acc[i] = (V)_mm512_dpbf16_ps((__m512)acc[i], (__m512bh)x, (__m512bh)y);
  }
  float sum = 0;
  for (int i = 0; i < Chains; ++i)
    for (int lane = 0; lane < 16; ++lane) sum += acc[i][lane];
  return sum;
}

}  // namespace

extern const GemmKernelBF16 gemm_bf16_avx512_native = {12,
                                                       32,
                                                       768,
                                                       1536,
                                                       384,
                                                       gemm_micro_kernel_bf16<16, 12, 2, PairDotNative>,
                                                       gemm_micro_kernel_bf16<16, 12, 2, PairDotNative, true>};
extern const FmaPeakLoop bf16_peak_avx512_native = {32, 24, dpbf16_peak_loop<24>};

}  // namespace tvc::cpu
