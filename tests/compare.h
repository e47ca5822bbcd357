// The one error measure used by every test: err = ||a - b||2 / ||b||2 per tensor.
#pragma once

#include "tvc/tensor.h"

namespace tvc::test {

// ||a - b||2 / ||b||2 computed in float64; when ||b|| is 0 the absolute ||a - b||2. Shapes must
// match (a mismatch gives +inf). NaNs in the same places count as equal.
double relative_error(const Tensor& a, const Tensor& b);

}  // namespace tvc::test
