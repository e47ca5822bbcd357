// Element types, devices, half-precision storage types and scalars.
//
// float16 and bfloat16 are storage types: kernels load them into float, compute in float and
// round back (round-to-nearest-even), as PyTorch does on the CPU.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace tvc {

enum class DType : uint8_t {
  Float32,
  Float64,
  Float16,
  BFloat16,
  Int64,
  Int32,
  Int16,
  Int8,
  UInt8,
  Bool,
};
inline constexpr int kNumDTypes = 10;

enum class Device : uint8_t { CPU, CUDA };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "float32", "int64", ... as torch prints them
const char* device_name(Device device);
bool is_floating(DType dtype);  // float32/64/16, bfloat16
bool is_integral(DType dtype);  // ints and uint8, not bool
// Type promotion between two tensor dtypes, as torch.promote_types.
DType promote_types(DType a, DType b);

// IEEE binary16 stored as its bits.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float value);  // NOLINT: implicit like a number
  operator float() const;
};

// bfloat16 stored as the upper half of a float32.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float value) {  // NOLINT: implicit like a number
    uint32_t u;
    std::memcpy(&u, &value, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = 0x7fc0;  // NaN
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    bits = static_cast<uint16_t>(u >> 16);
  }
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

float half_bits_to_float(uint16_t bits);
uint16_t float_to_half_bits(float value);
inline Half::Half(float value) : bits(float_to_half_bits(value)) {}
inline Half::operator float() const { return half_bits_to_float(bits); }

// The C++ type of each dtype.
template <DType D>
struct dtype_traits;
template <>
struct dtype_traits<DType::Float32> {
  using type = float;
};
template <>
struct dtype_traits<DType::Float64> {
  using type = double;
};
template <>
struct dtype_traits<DType::Float16> {
  using type = Half;
};
template <>
struct dtype_traits<DType::BFloat16> {
  using type = BFloat16;
};
template <>
struct dtype_traits<DType::Int64> {
  using type = int64_t;
};
template <>
struct dtype_traits<DType::Int32> {
  using type = int32_t;
};
template <>
struct dtype_traits<DType::Int16> {
  using type = int16_t;
};
template <>
struct dtype_traits<DType::Int8> {
  using type = int8_t;
};
template <>
struct dtype_traits<DType::UInt8> {
  using type = uint8_t;
};
template <>
struct dtype_traits<DType::Bool> {
  using type = bool;
};

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::Float32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::Float64;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::Float16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::BFloat16;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::Int64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::Int32;
}
template <>
constexpr DType dtype_of<int16_t>() {
  return DType::Int16;
}
template <>
constexpr DType dtype_of<int8_t>() {
  return DType::Int8;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::UInt8;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::Bool;
}

// The type arithmetic on T is done in: float for the half types, T otherwise.
template <typename T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<Half> {
  using type = float;
};
template <>
struct compute_type<BFloat16> {
  using type = float;
};
template <typename T>
using compute_t = typename compute_type<T>::type;

// A number given to an op (tensor + 2.5). It keeps whether it was written as a bool, an integer
// or a floating point number, which decides type promotion as in PyTorch: a float scalar with an
// integer tensor gives the default float dtype (float32); otherwise the tensor's dtype wins.
class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Int, Float };
  Scalar(double v) : kind_(Kind::Float), d_(v), i_(truncate(v)) {}              // NOLINT
  Scalar(float v) : Scalar(static_cast<double>(v)) {}                           // NOLINT
  Scalar(int v) : kind_(Kind::Int), d_(v), i_(v) {}                             // NOLINT
  Scalar(long v) : kind_(Kind::Int), d_(static_cast<double>(v)), i_(v) {}       // NOLINT
  Scalar(long long v) : kind_(Kind::Int), d_(static_cast<double>(v)), i_(v) {}  // NOLINT
  Scalar(bool v) : kind_(Kind::Bool), d_(v), i_(v) {}                           // NOLINT
  Kind kind() const { return kind_; }
  double to_double() const { return d_; }
  // The integer value: a floating value truncated toward zero, saturated to int64's range
  // (infinities too; NaN gives 0), never the undefined cast of an out-of-range double.
  int64_t to_int() const { return i_; }
  std::string str() const;

 private:
  static int64_t truncate(double v) {
    constexpr double kLimit = 9223372036854775808.0;  // 2^63
    if (!(v == v)) return 0;
    if (v >= kLimit) return INT64_MAX;
    if (v <= -kLimit) return INT64_MIN;
    return static_cast<int64_t>(v);
  }
  Kind kind_;
  double d_;
  int64_t i_;
};

}  // namespace tvc
