// Conversions between weight-file element types and tvc dtypes, shared by the readers.
#pragma once

#include <cstdint>
#include <string>

#include "tvc/serialize.h"

namespace tvc::io {

// The dtype a tensor of `dtype` loads as: exact_dtype, or widened_dtype when widen is set.
// Throws naming `what` (e.g. "tensor 'fc.weight' in 'a.safetensors'") when there is none.
DType load_dtype(FileDType dtype, bool widen, const std::string& what);

// Converts numel little-endian elements of `dtype` at src into widened_dtype(dtype) at dst.
// Throws naming `what` for UInt64 values beyond int64.
void widen_elements(FileDType dtype, const void* src, int64_t numel, void* dst, const std::string& what);

}  // namespace tvc::io
