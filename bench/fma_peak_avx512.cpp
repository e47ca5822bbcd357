// The fp32 FMA peak loop for AVX-512: independent accumulator chains, enough to cover the FMA
// latency times the number of FMA pipes, all kept in zmm registers.
#include <immintrin.h>

#include "fma_peak.h"

namespace tvc::bench {

float fma_peak_avx512(int64_t iterations) {
  constexpr int kChains = static_cast<int>(kFmaPeakChains);
  __m512 acc[kChains];
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-6f);
#pragma GCC unroll 64
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 64
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  }
  __m512 s = acc[0];
#pragma GCC unroll 64
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  float lanes[16];
  _mm512_storeu_ps(lanes, s);
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

}  // namespace tvc::bench
