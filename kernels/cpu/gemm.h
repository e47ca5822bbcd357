// The CPU GEMM used by bmm and the convolutions (not installed).
#pragma once

#include <cstdint>

#include "tvc/internal/kernel.h"

namespace tvc::cpu {

// C = A @ B + beta * C, with A (M,K), B (K,N), C (M,N) given by element strides
// (row stride rs, column stride cs) so transposed operands need no copy, as in BLIS.
// beta = 0 ignores C's old contents (NaN included). Deterministic for any thread count.
template <typename T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
          int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, T beta);

}  // namespace tvc::cpu
