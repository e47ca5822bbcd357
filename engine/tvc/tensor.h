// tvc::Tensor: an n-dimensional strided view of a Storage, with autograd.
//
// A Tensor is a cheap, reference-counted handle; copies share the same tensor (as in PyTorch).
// shape[i] is the extent of dim i, strides[i] the step in elements between neighbours along i,
// storage_offset the element index of [0, ..., 0] in the storage. View ops (view, permute,
// slice, ...) make new tensors over the same storage without copying; their results share the
// storage's version counter. Free functions for every op are in tvc/ops.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tvc/dtype.h"
#include "tvc/error.h"
#include "tvc/storage.h"

namespace tvc {

// Sizes (or strides) of a tensor, one per dim: a std::vector<int64_t> of its own type, so that
// `std::cout << t.shape()` prints [2, 3, 224, 224] wherever it is written. It converts to and
// from std::vector<int64_t>.
struct Shape : std::vector<int64_t> {
  using std::vector<int64_t>::vector;
  Shape() = default;
  Shape(const std::vector<int64_t>& sizes) : std::vector<int64_t>(sizes) {}        // NOLINT
  Shape(std::vector<int64_t>&& sizes) : std::vector<int64_t>(std::move(sizes)) {}  // NOLINT
};

namespace autograd {
class Node;
}
class Generator;  // tvc/ops.h

// Layout of a 4-d tensor: NCHW strides (Contiguous) or NHWC strides (ChannelsLast).
// Preserve keeps the input's layout.
enum class MemoryFormat : uint8_t { Contiguous, ChannelsLast, Preserve };

struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = Device::CPU;
  bool requires_grad = false;
};

class Tensor;
using TensorHook = std::function<Tensor(const Tensor& grad)>;  // may return an undefined tensor

// The state behind a Tensor handle (internal: tvc/internal/tensor_impl.h).
struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;  // undefined tensor
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // ---- metadata ----
  const Shape& shape() const;
  const Shape& sizes() const { return shape(); }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  const Shape& strides() const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t numel() const;
  DType dtype() const;
  Device device() const { return storage()->device(); }
  size_t element_size() const { return dtype_size(dtype()); }
  int64_t storage_offset() const;
  const std::shared_ptr<Storage>& storage() const;
  bool is_contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;
  // ChannelsLast when this 4-d tensor is NHWC-strided but not NCHW-contiguous, else Contiguous.
  MemoryFormat suggest_memory_format() const;
  TensorOptions options() const { return {dtype(), device(), false}; }
  uint64_t version() const { return storage()->version(); }

  // ---- data ----
  // Writes through these pointers are not seen by the storage's version counter: follow them
  // with storage()->bump_version() when the tensor was used before (autograd's saved tensors and
  // the kernels' derived data, Storage::derived, check the version).
  void* raw_data() const;  // address of element [0, ..., 0]
  template <typename T>
  T* data_ptr() const {
    TVC_CHECK(dtype() == dtype_of<T>(), "data_ptr: tensor has dtype ", dtype_name(dtype()), ", asked for ",
              dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw_data());
  }
  // The value of a one-element tensor, converted to T (integers exactly; floats truncate
  // toward zero for an integer T, as Python's int(); bool is value != 0).
  template <typename T>
  T item() const {
    if constexpr (std::is_same_v<T, bool>)
      return item_double() != 0;
    else if constexpr (std::is_integral_v<T>)
      return static_cast<T>(item_int64());
    else
      return static_cast<T>(item_double());
  }
  double item_double() const;
  int64_t item_int64() const;
  std::vector<double> to_vector() const;  // all elements in row-major order, as double

  // ---- views (share storage) ----
  Tensor view(const Shape& shape) const;     // one dim may be -1; needs compatible strides
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // transpose of a tensor with <= 2 dims
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;  // clamps like Python
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;  // -1 keeps a dim
  Tensor expand_as(const Tensor& other) const { return expand(other.shape()); }
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor unflatten(int64_t dim, const Shape& sizes) const;
  Tensor as_strided(const Shape& shape, const Shape& strides, int64_t storage_offset) const;
  Tensor contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;
  Tensor operator[](int64_t index) const { return select(0, index); }

  // ---- copies and conversions ----
  Tensor clone(MemoryFormat format = MemoryFormat::Preserve) const;
  Tensor to(DType dtype) const;  // same tensor when the dtype already matches
  Tensor to(Device device) const;
  Tensor detach() const;  // shares storage and version counter, no history
  Tensor& detach_();

  // ---- autograd ----
  bool requires_grad() const;
  Tensor& requires_grad_(bool requires_grad = true);
  bool is_leaf() const { return grad_fn() == nullptr; }
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;  // null for leaves
  void retain_grad() const;
  bool retains_grad() const;
  // Computes gradients of this tensor w.r.t. the graph leaves. grad defaults to ones for a
  // one-element tensor. Without retain_graph the graph's saved tensors are freed.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  // hook(grad) runs when this tensor's gradient is computed; a defined result replaces it.
  // Returns a handle for remove_hook.
  int register_hook(TensorHook hook) const;
  void remove_hook(int handle) const;

  // ---- in-place ----
  Tensor& zero_();
  Tensor& fill_(Scalar value);
  Tensor& copy_(const Tensor& src);  // broadcasts src, converts dtype
  Tensor& add_(const Tensor& other, Scalar alpha = 1);
  Tensor& add_(Scalar other);
  Tensor& sub_(const Tensor& other, Scalar alpha = 1);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(Scalar other);
  Tensor& div_(const Tensor& other);
  Tensor& div_(Scalar other);
  // Activations in place: when autograd does not record the op, its kernel writes into this
  // tensor in one pass; when it does, the result is computed aside and taken over with its history.
  Tensor& clamp_(std::optional<double> min, std::optional<double> max);
  Tensor& relu_();
  Tensor& sigmoid_();
  Tensor& silu_();
  Tensor& hardsigmoid_();
  Tensor& hardswish_();
  Tensor& masked_fill_(const Tensor& mask, Scalar value);
  // Random fills from gen (the default generator when null), drawn in float64 and rounded.
  Tensor& uniform_(double from = 0, double to = 1, Generator* gen = nullptr);
  Tensor& normal_(double mean = 0, double std = 1, Generator* gen = nullptr);

  // ---- common ops as methods (the free functions of tvc/ops.h, with the same rules) ----
  Tensor add(const Tensor& other, Scalar alpha = 1) const;  // this + alpha * other
  Tensor sub(const Tensor& other, Scalar alpha = 1) const;
  Tensor mul(const Tensor& other) const;
  Tensor div(const Tensor& other) const;
  Tensor matmul(const Tensor& other) const;
  Tensor pow(Scalar exponent) const;
  Tensor sqrt() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor abs() const;
  Tensor neg() const;
  Tensor clamp(std::optional<double> min, std::optional<double> max) const;
  Tensor relu() const;
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  // Reductions: over dims (all when empty) or one dim.
  Tensor sum(const Shape& dims = {}, bool keepdim = false) const;
  Tensor sum(int64_t dim, bool keepdim = false) const { return sum(Shape{dim}, keepdim); }
  Tensor mean(const Shape& dims = {}, bool keepdim = false) const;
  Tensor mean(int64_t dim, bool keepdim = false) const { return mean(Shape{dim}, keepdim); }
  Tensor var(const Shape& dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor std(const Shape& dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor max() const;  // the largest element (0-d)
  Tensor min() const;
  // (values, indices) along dim.
  std::pair<Tensor, Tensor> max(int64_t dim, bool keepdim = false) const;
  std::pair<Tensor, Tensor> min(int64_t dim, bool keepdim = false) const;
  // Index of the largest (smallest) element along dim, or of all elements flattened.
  Tensor argmax(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  Tensor argmin(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;

  std::string repr() const;  // like PyTorch's repr: tensor([...], dtype=...)

 private:
  TensorImpl& checked() const;  // throws for an undefined tensor
  std::shared_ptr<TensorImpl> impl_;
};

// Prints repr(): tensor([...], dtype=...).
std::ostream& operator<<(std::ostream& os, const Tensor& t);
// Prints a shape as [2, 3, 224, 224].
std::ostream& operator<<(std::ostream& os, const Shape& shape);

// ---- creation ----
Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor empty_strided(const Shape& shape, const Shape& strides, TensorOptions options = {});
Tensor empty_like(const Tensor& t, MemoryFormat format = MemoryFormat::Preserve);
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor zeros_like(const Tensor& t);
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor ones_like(const Tensor& t);
Tensor full(const Shape& shape, Scalar value, TensorOptions options = {});
Tensor full_like(const Tensor& t, Scalar value);
Tensor scalar_tensor(Scalar value, TensorOptions options = {});
// [start, end) with step; dtype int64 unless options say otherwise.
Tensor arange(double start, double end, double step = 1, TensorOptions options = {.dtype = DType::Int64});
Tensor arange(int64_t end, TensorOptions options = {.dtype = DType::Int64});
Tensor linspace(double start, double end, int64_t steps, TensorOptions options = {});
// Wraps data without copying; strides default to row-major. deleter (may be empty) runs when the
// last view dies. data needs no particular alignment.
Tensor from_blob(void* data, const Shape& shape, DType dtype, Storage::Deleter deleter = {},
                 std::optional<Shape> strides = std::nullopt);
// A new tensor holding a copy of values, shaped as shape (default: 1-d).
template <typename T>
Tensor tensor(const std::vector<T>& values, std::optional<Shape> shape = std::nullopt);

// Element count of a shape; throws on negative sizes or overflow.
int64_t shape_numel(const Shape& shape);
// Row-major (NCHW) strides of a shape, or NHWC strides for ChannelsLast.
Shape contiguous_strides(const Shape& shape, MemoryFormat format = MemoryFormat::Contiguous);
// Wraps a negative dim into [0, ndim); throws naming op when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

}  // namespace tvc
