// libFuzzer target: tensors and views made from arbitrary shapes, strides, offsets and sizes,
// many of them near 2^63 (tvc/tensor.h's creation functions and view methods).
//
// The input is a little program: each step picks an operation and its integer arguments. Every
// call must either work or raise tvc::Error. A crash, a sanitizer report, another exception, a
// result that reaches outside its storage, a size computation that wraps around (a call that
// should have been refused but was not) or an allocation the sizes did not ask for (libFuzzer's
// malloc limit) is a finding.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "tvc/error.h"
#include "tvc/ops.h"
#include "tvc/tensor.h"

namespace {

constexpr int64_t kMaxBytes = int64_t{64} << 20;   // larger tensors are legitimate but not made here
constexpr int64_t kMaxTouched = int64_t{1} << 20;  // elements read through a view

// The fuzzer's bytes as a stream of choices; zeros once they run out.
class Choices {
 public:
  Choices(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool empty() const { return pos_ >= size_; }
  // An int64, usually one of the values where size arithmetic breaks.
  int64_t integer() {
    static constexpr int64_t kEdges[] = {0,
                                         1,
                                         2,
                                         3,
                                         4,
                                         7,
                                         -1,
                                         -2,
                                         -3,
                                         1000,
                                         int64_t{1} << 31,
                                         int64_t{1} << 32,
                                         (int64_t{1} << 53) + 1,
                                         int64_t{1} << 61,
                                         int64_t{1} << 62,
                                         INT64_MAX / 2 + 1,
                                         INT64_MAX / 3,
                                         INT64_MAX - 1,
                                         INT64_MAX,
                                         INT64_MIN,
                                         INT64_MIN + 1};
    uint8_t kind = byte();
    if (kind < 128) return kEdges[kind % std::size(kEdges)];
    if (kind < 192) return static_cast<int64_t>(byte() % 16);
    int64_t value = 0;
    for (int i = 0; i < 8; ++i) value = static_cast<int64_t>(static_cast<uint64_t>(value) << 8 | byte());
    return value;
  }
  tvc::Shape shape(size_t max_dims = 6) {
    tvc::Shape out(byte() % (max_dims + 1));
    for (int64_t& v : out) v = integer();
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// The bytes a (shape, strides) layout of dtype spans, exactly (__int128) up to 2^100 and capped
// there (far past int64 either way), or -1 for a layout the engine must refuse (a negative size
// or stride, or lengths that differ).
__int128 exact_bytes(const tvc::Shape& shape, const tvc::Shape& strides, tvc::DType dtype) {
  if (shape.size() != strides.size()) return -1;
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] < 0 || strides[i] < 0) return -1;
  for (int64_t size : shape)
    if (size == 0) return 0;
  constexpr __int128 kCap = __int128{1} << 100;
  __int128 extent = 1;
  for (size_t i = 0; i < shape.size(); ++i)  // each term is below 2^126
    extent = std::min(kCap, extent + static_cast<__int128>(shape[i] - 1) * strides[i]);
  return extent * static_cast<__int128>(tvc::dtype_size(dtype));
}

constexpr __int128 kInt64Max = INT64_MAX;

// Calls make; a tvc::Error is a valid answer unless the engine must accept the call.
template <typename Make>
void expect_refused(const char* what, Make make) {
  try {
    make();
  } catch (const tvc::Error&) {
    return;
  }
  tvc_fuzz::finding(std::string(what) + " accepted a layout whose size does not fit in int64");
}

// A view made from a small tensor, checked to stay inside its storage and read when not huge.
void check_view(const tvc::Tensor& view, const char* what) {
  tvc_fuzz::check_in_storage(view, what);
  if (view.numel() <= kMaxTouched) tvc_fuzz::check_tensor(view, what);
}

void step(Choices& in, std::vector<char>& blob) {
  const tvc::DType dtype = in.byte() % 2 ? tvc::DType::Float32 : tvc::DType::Int64;
  switch (in.byte() % 16) {
    case 0: {  // empty_strided: refused when its bytes do not fit in int64
      tvc::Shape shape = in.shape(), strides = in.shape();
      strides.resize(shape.size(), 1);
      __int128 bytes = exact_bytes(shape, strides, dtype);
      if (bytes < 0 || bytes > kInt64Max)
        return expect_refused("empty_strided", [&] { tvc::empty_strided(shape, strides, {.dtype = dtype}); });
      if (bytes <= kMaxBytes) {  // zero strides can give many elements in few bytes: touched when few
        tvc::Tensor t = tvc::empty_strided(shape, strides, {.dtype = dtype});
        if (t.numel() <= kMaxTouched) t.zero_();
        check_view(t, "empty_strided");
      }
      return;
    }
    case 1: {  // from_blob over a buffer: refused when the layout's bytes do not fit in int64
      tvc::Shape shape = in.shape(), strides = in.shape();
      strides.resize(shape.size(), 1);
      __int128 bytes = exact_bytes(shape, strides, dtype);
      if (bytes < 0 || bytes > kInt64Max)
        return expect_refused("from_blob", [&] { tvc::from_blob(blob.data(), shape, dtype, {}, strides); });
      if (bytes <= static_cast<__int128>(blob.size()))
        check_view(tvc::from_blob(blob.data(), shape, dtype, {}, strides), "from_blob");
      return;
    }
    case 2: {  // empty / zeros of any shape: refused when the element count or bytes overflow
      tvc::Shape shape = in.shape();
      __int128 bytes = 0;
      for (int64_t size : shape) bytes = size < 0 ? -1 : bytes;
      if (bytes == 0) {
        __int128 count = 1;
        for (int64_t size : shape) count = count > kInt64Max ? count : count * size;
        bytes = count > kInt64Max ? count : count * static_cast<__int128>(tvc::dtype_size(dtype));
      }
      if (bytes < 0 || bytes > kInt64Max) return expect_refused("empty", [&] { tvc::empty(shape, {.dtype = dtype}); });
      if (bytes <= kMaxBytes) tvc_fuzz::check_tensor(tvc::zeros(shape, {.dtype = dtype}), "zeros");
      return;
    }
    default:
      break;
  }
  // A view of a small tensor with arbitrary arguments.
  tvc::Tensor base = tvc::arange(24, {.dtype = dtype}).reshape({2, 3, 4});
  if (in.byte() % 2) base = base.permute({2, 0, 1});
  const int64_t a = in.integer(), b = in.integer(), c = in.integer();
  switch (in.byte() % 13) {
    case 0:
      return check_view(base.view(in.shape()), "view");
    case 1:
      return check_view(base.reshape(in.shape()), "reshape");
    case 2:
      return check_view(base.as_strided(in.shape(), in.shape(), a), "as_strided");
    case 3:
      return check_view(base.slice(a, b, c, in.integer()), "slice");
    case 4:
      return check_view(base.narrow(a, b, c), "narrow");
    case 5:
      return check_view(base.select(a, b), "select");
    case 6:
      return check_view(base.expand(in.shape()), "expand");
    case 7:
      return check_view(base.permute(in.shape()), "permute");
    case 8:
      return check_view(base.transpose(a, b), "transpose");
    case 9:
      return check_view(base.unsqueeze(a).squeeze(b), "unsqueeze");
    case 10:
      return check_view(base.flatten(a, b), "flatten");
    case 11:
      return check_view(base.unflatten(a, in.shape()), "unflatten");
    case 12: {  // a broadcast view, summed over its broadcast dim when that is small
      tvc::Tensor expanded = base.expand({a, 2, 3, 4});
      check_view(expanded, "expand");
      if (a <= 64) check_view(expanded.sum(0), "sum of an expanded view");
      return;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Choices in(data, size);
  std::vector<char> blob(4096);
  for (int steps = 0; steps < 16 && !in.empty(); ++steps) {
    try {
      step(in, blob);
    } catch (const tvc::Error&) {
      // the expected answer to arguments that make no tensor
    } catch (const std::exception& e) {
      tvc_fuzz::finding(std::string("an exception other than tvc::Error: ") + e.what());
    } catch (...) {
      tvc_fuzz::finding("an exception that is not a std::exception");
    }
  }
  return 0;
}
