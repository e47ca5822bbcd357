// The machine's fp32 FMA peak loop (fma_peak_avx512.cpp, built with AVX-512 flags).
// Declarations only, as that file is compiled for another instruction set than its callers.
#pragma once

#include <cstdint>

namespace tvc::bench {

// Runs `iterations` rounds of kFmaPeakChains independent 512-bit fp32 FMAs (16 lanes each) on
// the calling thread: 2 * 16 * kFmaPeakChains * iterations floating-point operations. Returns a
// value computed from the results so the loop cannot be optimised away.
inline constexpr int64_t kFmaPeakChains = 24;
float fma_peak_avx512(int64_t iterations);

}  // namespace tvc::bench
