// The element types of weight files: names in safetensors headers and torch storage types,
// sizes, and how they map to tvc dtypes.
#include "io/file_dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "tvc/error.h"
#include "tvc/serialize.h"

namespace tvc::io {

namespace {

struct FileDTypeInfo {
  FileDType dtype;
  const char* safetensors;
  const char* torch_storage;  // null: torch has no storage type of it
  int bits;
  std::optional<DType> exact;
  std::optional<DType> widened;
};

// One row per FileDType, in enum order.
constexpr FileDTypeInfo kInfo[] = {
    {FileDType::Bool, "BOOL", "BoolStorage", 8, DType::Bool, DType::Bool},
    {FileDType::UInt8, "U8", "ByteStorage", 8, DType::UInt8, DType::UInt8},
    {FileDType::Int8, "I8", "CharStorage", 8, DType::Int8, DType::Int8},
    {FileDType::Int16, "I16", "ShortStorage", 16, DType::Int16, DType::Int16},
    {FileDType::UInt16, "U16", "UInt16Storage", 16, std::nullopt, DType::Int32},
    {FileDType::Int32, "I32", "IntStorage", 32, DType::Int32, DType::Int32},
    {FileDType::UInt32, "U32", "UInt32Storage", 32, std::nullopt, DType::Int64},
    {FileDType::Int64, "I64", "LongStorage", 64, DType::Int64, DType::Int64},
    {FileDType::UInt64, "U64", "UInt64Storage", 64, std::nullopt, DType::Int64},
    {FileDType::Float16, "F16", "HalfStorage", 16, DType::Float16, DType::Float16},
    {FileDType::BFloat16, "BF16", "BFloat16Storage", 16, DType::BFloat16, DType::BFloat16},
    {FileDType::Float32, "F32", "FloatStorage", 32, DType::Float32, DType::Float32},
    {FileDType::Float64, "F64", "DoubleStorage", 64, DType::Float64, DType::Float64},
    {FileDType::Float8E4M3, "F8_E4M3", "Float8_e4m3fnStorage", 8, std::nullopt, DType::Float32},
    {FileDType::Float8E5M2, "F8_E5M2", "Float8_e5m2Storage", 8, std::nullopt, DType::Float32},
    {FileDType::Float8E4M3Fnuz, "F8_E4M3FNUZ", "Float8_e4m3fnuzStorage", 8, std::nullopt, DType::Float32},
    {FileDType::Float8E5M2Fnuz, "F8_E5M2FNUZ", "Float8_e5m2fnuzStorage", 8, std::nullopt, DType::Float32},
    {FileDType::Float8E8M0, "F8_E8M0", nullptr, 8, std::nullopt, DType::Float32},
    // Sub-byte types pack several elements per byte in an order the formats do not pin down,
    // so they are copied as bytes only, never widened.
    {FileDType::Float6E2M3, "F6_E2M3", nullptr, 6, std::nullopt, std::nullopt},
    {FileDType::Float6E3M2, "F6_E3M2", nullptr, 6, std::nullopt, std::nullopt},
    {FileDType::Float4E2M1, "F4", nullptr, 4, std::nullopt, std::nullopt},
    {FileDType::Complex64, "C64", "ComplexFloatStorage", 64, std::nullopt, std::nullopt},
    {FileDType::Complex128, "C128", "ComplexDoubleStorage", 128, std::nullopt, std::nullopt},
};
static_assert(sizeof(kInfo) / sizeof(kInfo[0]) == static_cast<size_t>(FileDType::Complex128) + 1);

const FileDTypeInfo& info(FileDType dtype) {
  const FileDTypeInfo& row = kInfo[static_cast<size_t>(dtype)];
  return row;
}

// A float with `exp_bits` exponent bits (bias `bias`) and `man_bits` mantissa bits, no
// infinities or NaNs of its own (the callers handle those): normal 2^(e-bias) * (1 + m/2^M),
// subnormal (e == 0) 2^(1-bias) * m/2^M.
float decode_fields(uint32_t bits, int exp_bits, int man_bits, int bias, bool has_sign) {
  uint32_t man = bits & ((1u << man_bits) - 1);
  uint32_t exp = (bits >> man_bits) & ((1u << exp_bits) - 1);
  bool negative = has_sign && ((bits >> (man_bits + exp_bits)) & 1u);
  float fraction = static_cast<float>(man) / static_cast<float>(1u << man_bits);
  float value = exp == 0 ? std::ldexp(fraction, 1 - bias) : std::ldexp(1.0f + fraction, static_cast<int>(exp) - bias);
  return negative ? -value : value;
}

}  // namespace

const char* safetensors_name(FileDType dtype) { return info(dtype).safetensors; }

std::optional<FileDType> file_dtype_from_safetensors(const std::string& name) {
  for (const auto& row : kInfo)
    if (name == row.safetensors && row.dtype != FileDType::Complex128) return row.dtype;
  return std::nullopt;
}

const char* torch_storage_name(FileDType dtype) { return info(dtype).torch_storage; }

std::optional<FileDType> file_dtype_from_torch_storage(const std::string& name) {
  for (const auto& row : kInfo)
    if (row.torch_storage && name == row.torch_storage) return row.dtype;
  return std::nullopt;
}

int bit_size(FileDType dtype) { return info(dtype).bits; }
std::optional<DType> exact_dtype(FileDType dtype) { return info(dtype).exact; }
std::optional<DType> widened_dtype(FileDType dtype) { return info(dtype).widened; }

FileDType file_dtype(DType dtype) {
  for (const auto& row : kInfo)
    if (row.exact == dtype) return row.dtype;
  throw Error(cat_str("no file dtype for ", dtype_name(dtype)));
}

float decode_small_float(FileDType dtype, uint8_t bits) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  switch (dtype) {
    case FileDType::Float8E4M3:  // no infinities; S.1111.111 is NaN
      return (bits & 0x7f) == 0x7f ? kNaN : decode_fields(bits, 4, 3, 7, true);
    case FileDType::Float8E5M2:  // IEEE: exponent 31 is infinity (m = 0) or NaN
      if ((bits & 0x7c) == 0x7c) return (bits & 0x03) ? kNaN : ((bits & 0x80) ? -kInf : kInf);
      return decode_fields(bits, 5, 2, 15, true);
    case FileDType::Float8E4M3Fnuz:  // "fnuz": no infinities, no -0; 0x80 is the NaN
      return bits == 0x80 ? kNaN : decode_fields(bits, 4, 3, 8, true);
    case FileDType::Float8E5M2Fnuz:
      return bits == 0x80 ? kNaN : decode_fields(bits, 5, 2, 16, true);
    case FileDType::Float8E8M0:  // unsigned power of two 2^(e-127); 0xff is NaN
      return bits == 0xff ? kNaN : std::ldexp(1.0f, static_cast<int>(bits) - 127);
    case FileDType::Float6E2M3:
      return decode_fields(bits & 0x3f, 2, 3, 1, true);
    case FileDType::Float6E3M2:
      return decode_fields(bits & 0x3f, 3, 2, 3, true);
    case FileDType::Float4E2M1:
      return decode_fields(bits & 0x0f, 2, 1, 1, true);
    default:
      throw Error(cat_str("decode_small_float: ", safetensors_name(dtype), " is not a small float type"));
  }
}

}  // namespace tvc::io

namespace tvc::io {

DType load_dtype(FileDType dtype, bool widen, const std::string& what) {
  if (auto exact = exact_dtype(dtype)) return *exact;
  auto widened = widened_dtype(dtype);
  TVC_CHECK(widened.has_value(), what, " has dtype ", safetensors_name(dtype),
            ", which tvc tensors cannot hold (it can only be copied as bytes between safetensors files)");
  TVC_CHECK(widen, what, " has dtype ", safetensors_name(dtype), ", which tvc tensors do not hold; ask for it",
            " widened to ", dtype_name(*widened), " (ReadOptions::widen, tvc convert --widen)");
  return *widened;
}

void widen_elements(FileDType dtype, const void* src, int64_t numel, void* dst, const std::string& what) {
  const auto* in = static_cast<const uint8_t*>(src);
  auto load = [in]<typename T>(int64_t i, T) {
    T v;
    std::memcpy(&v, in + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    return v;
  };
  switch (dtype) {
    case FileDType::UInt16:
      for (int64_t i = 0; i < numel; ++i) static_cast<int32_t*>(dst)[i] = load(i, uint16_t{});
      return;
    case FileDType::UInt32:
      for (int64_t i = 0; i < numel; ++i) static_cast<int64_t*>(dst)[i] = load(i, uint32_t{});
      return;
    case FileDType::UInt64:
      for (int64_t i = 0; i < numel; ++i) {
        uint64_t v = load(i, uint64_t{});
        TVC_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), what, ": element ", i, " = ", v,
                  " of a U64 tensor does not fit in int64");
        static_cast<int64_t*>(dst)[i] = static_cast<int64_t>(v);
      }
      return;
    default:
      TVC_CHECK(bit_size(dtype) == 8 && widened_dtype(dtype) == DType::Float32, what, ": cannot widen ",
                safetensors_name(dtype));
      for (int64_t i = 0; i < numel; ++i) static_cast<float*>(dst)[i] = decode_small_float(dtype, in[i]);
      return;
  }
}

}  // namespace tvc::io
