// One output row of a float32 max pool without indices, for kernels that pool rows they have just
// made (conv.cpp's convolution and max pool in one: a network's stem).
#pragma once

#include <cstdint>

#include "tvc/internal/kernel.h"

namespace tvc::cpu {

// The input rows of output row oh's windows (p's, an input of H rows): first, first + step, ...
// < end.
struct MaxPoolRows {
  int64_t first, end, step;
};
MaxPoolRows max_pool_rows(const Pool2dParams& p, int64_t H, int64_t oh);
// The floats of max_pool_row's rows_max for input rows of W values and output rows of Wo.
int64_t max_pool_row_floats(const Pool2dParams& p, int64_t W, int64_t Wo);
// y (Wo values) = output row oh of max_pool2d (p, values only) from the window's input rows of
// that output row, rows[0, count) in order (max_pool_rows'; W contiguous values each): the same
// comparisons in the same order as the max_pool2d kernel's planes (the first row copied, the
// others' columns reduced into rows_max, then each output's window columns tap by tap), so the
// same bits. rows_max: max_pool_row_floats(p, W, Wo) floats, all -inf before the first call (the
// calls keep the padding around the row -inf).
void max_pool_row(const float* const* rows, int64_t count, const Pool2dParams& p, int64_t W, int64_t Wo,
                  float* rows_max, float* y);
// max_pool_row for output row oh of an input of H rows whose row h is row_at(h); window: room for
// p.kernel[0] row pointers.
template <typename RowAt>
void max_pool_output_row(const Pool2dParams& p, int64_t H, int64_t oh, RowAt row_at, int64_t W, int64_t Wo,
                         const float** window, float* rows_max, float* y) {
  const MaxPoolRows in = max_pool_rows(p, H, oh);
  int64_t count = 0;
  for (int64_t h = in.first; h < in.end; h += in.step) window[count++] = row_at(h);
  max_pool_row(window, count, p, W, Wo, rows_max, y);
}

}  // namespace tvc::cpu
