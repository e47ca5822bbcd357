#include "tvc/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tvc/error.h"
#include "tvc/modes.h"

namespace tvc {

namespace {
struct DTypeInfo {
  const char* name;
  size_t size;
};
constexpr DTypeInfo kInfo[kNumDTypes] = {
    {"float32", 4}, {"float64", 8}, {"float16", 2}, {"bfloat16", 2}, {"int64", 8},
    {"int32", 4},   {"int16", 2},   {"int8", 1},    {"uint8", 1},    {"bool", 1},
};
}  // namespace

size_t dtype_size(DType dtype) { return kInfo[static_cast<int>(dtype)].size; }
const char* dtype_name(DType dtype) { return kInfo[static_cast<int>(dtype)].name; }
const char* device_name(Device device) { return device == Device::CPU ? "cpu" : "cuda"; }

bool is_floating(DType d) {
  return d == DType::Float32 || d == DType::Float64 || d == DType::Float16 || d == DType::BFloat16;
}
bool is_integral(DType d) { return !is_floating(d) && d != DType::Bool; }

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::Bool) return b;
  if (b == DType::Bool) return a;
  if (is_floating(a) != is_floating(b)) return is_floating(a) ? a : b;
  if (is_floating(a)) {
    // float16 with bfloat16 -> float32; otherwise the wider one.
    if ((a == DType::Float16 && b == DType::BFloat16) || (a == DType::BFloat16 && b == DType::Float16))
      return DType::Float32;
    if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
    return DType::Float32;
  }
  // both integral
  if (a == DType::UInt8 || b == DType::UInt8) {
    DType other = a == DType::UInt8 ? b : a;
    return other == DType::Int8 ? DType::Int16 : other;
  }
  auto rank = [](DType d) {
    switch (d) {
      case DType::Int8:
        return 0;
      case DType::Int16:
        return 1;
      case DType::Int32:
        return 2;
      default:
        return 3;
    }
  };
  return rank(a) > rank(b) ? a : b;
}

float half_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half_bits(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absu < 0x38800000u) {  // subnormal or zero in half: round(|x| * 2^24)
    float a;
    std::memcpy(&a, &absu, 4);
    float scaled = a * 16777216.0f;                          // exact: power of two
    auto m = static_cast<uint32_t>(std::nearbyint(scaled));  // round half to even
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t mant_odd = (absu >> 13) & 1u;
  absu += 0xc8000fffu + mant_odd;  // re-bias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (absu >> 13));
}

std::string Scalar::str() const {
  switch (kind_) {
    case Kind::Bool:
      return i_ ? "True" : "False";
    case Kind::Int:
      return std::to_string(i_);
    case Kind::Float: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", d_);
      return buf;
    }
  }
  return "";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::vector<std::string> nearest_names(const std::string& name, const std::vector<std::string>& candidates,
                                       size_t count) {
  std::vector<std::pair<size_t, size_t>> ranked;  // (distance, index)
  for (size_t i = 0; i < candidates.size(); ++i) ranked.emplace_back(edit_distance(name, candidates[i]), i);
  std::stable_sort(ranked.begin(), ranked.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < std::min(count, ranked.size()); ++i) out.push_back(candidates[ranked[i].second]);
  return out;
}

size_t utf8_char_length(std::string_view text, size_t at) {
  auto lead = static_cast<unsigned char>(text[at]);
  size_t len = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xe ? 3 : (lead >> 3) == 0x1e ? 4 : 0;
  if (len == 0 || len > text.size() - at) return 0;
  uint32_t cp = len == 1 ? lead : len == 2 ? (lead & 0x1f) : len == 3 ? (lead & 0x0f) : (lead & 0x07);
  for (size_t k = 1; k < len; ++k) {
    auto next = static_cast<unsigned char>(text[at + k]);
    if ((next >> 6) != 0x2) return 0;
    cp = (cp << 6) | (next & 0x3f);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};  // shorter forms are overlong
  if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    auto lead = static_cast<unsigned char>(text[i]);
    size_t len = utf8_char_length(text, i);
    bool c1_control = len == 2 && lead == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0;
    bool control = lead < 0x20 || lead == 0x7f || c1_control;
    if (lead == '\\') {
      out += "\\\\";
    } else if (len > 0 && !control) {
      out.append(text.substr(i, len));
    } else {
      len = std::max<size_t>(len, 1);  // a control character's bytes, or the one byte that breaks UTF-8
      for (size_t k = 0; k < len; ++k) {
        auto byte = static_cast<unsigned char>(text[i + k]);
        out += {'\\', 'x', kHex[byte >> 4], kHex[byte & 0xf]};
      }
    }
    i += len;
  }
  return out;
}

namespace detail {

void throw_unknown_mode(const char* option, std::string_view text, const char* const* names, size_t count) {
  std::string accepted;
  for (size_t i = 0; i < count; ++i) accepted += (i ? ", '" : "'") + std::string(names[i]) + "'";
  throw Error(std::string(option) + ": '" + printable(text) + "' is not one of " + accepted);
}

void throw_invalid_mode(const char* option, int value) {
  throw Error(std::string(option) + ": invalid enum value " + std::to_string(value));
}

}  // namespace detail

}  // namespace tvc
