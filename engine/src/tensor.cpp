// Tensor metadata, views (with their backward rules), copies and creation.
#include "tvc/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "internal.h"

namespace tvc {

using autograd::GradList;
using detail::make_view;

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = std::max<int64_t>(ndim, 1);
  TVC_CHECK(dim >= -n && dim < n, op, ": dim ", dim, " is out of range for a tensor with ", ndim, " dims");
  return dim < 0 ? dim + n : dim;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    TVC_CHECK(s >= 0, "negative size in shape ", shape);
    TVC_CHECK(s == 0 || n <= INT64_MAX / s, "shape ", shape, " has more elements than int64 holds");
    n *= s;
  }
  return n;
}

Shape contiguous_strides(const Shape& shape, MemoryFormat format) {
  // Size-0 dims count as 1, so the product can exceed the element count: check it.
  auto times = [&](int64_t a, int64_t b) {
    int64_t r;
    TVC_CHECK(b >= 0 && !__builtin_mul_overflow(a, std::max<int64_t>(b, 1), &r), "shape ", shape,
              " is invalid or has more elements than int64 holds");
    return r;
  };
  Shape strides(shape.size());
  if (format == MemoryFormat::ChannelsLast && shape.size() == 4) {
    strides[1] = 1;
    strides[3] = times(1, shape[1]);
    strides[2] = times(strides[3], shape[3]);
    strides[0] = times(strides[2], shape[2]);
    return strides;
  }
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s = times(s, shape[i]);
  }
  return strides;
}

namespace {

// The elements a (shape, strides) layout spans from its first element: 1 + sum (size - 1) *
// stride, 0 when it has no element. Sizes and strides must be non-negative (negative strides are
// not supported); an extent beyond int64 is an error naming op and the layout.
int64_t storage_extent(const Shape& shape, const Shape& strides, const char* op) {
  TVC_CHECK(shape.size() == strides.size(), op, ": shape ", shape, " and strides ", strides, " differ in length");
  for (size_t i = 0; i < shape.size(); ++i) {
    TVC_CHECK(shape[i] >= 0, op, ": negative size in shape ", shape);
    TVC_CHECK(strides[i] >= 0, op, ": negative stride in ", strides, " (negative strides are not supported)");
  }
  int64_t numel = 1;
  for (int64_t size : shape)
    TVC_CHECK(!__builtin_mul_overflow(numel, size, &numel), op, ": shape ", shape,
              " has more elements than int64 holds");
  if (numel == 0) return 0;
  int64_t extent = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t step;
    TVC_CHECK(
        !__builtin_mul_overflow(shape[i] - 1, strides[i], &step) && !__builtin_add_overflow(extent, step, &extent), op,
        ": shape ", shape, " with strides ", strides, " spans more elements than int64 holds");
  }
  return extent;
}

// Bytes of count elements of dtype; more than int64 holds is an error naming op.
int64_t checked_bytes(int64_t count, DType dtype, const char* op) {
  int64_t bytes;
  TVC_CHECK(!__builtin_mul_overflow(count, static_cast<int64_t>(dtype_size(dtype)), &bytes), op, ": ", count,
            " elements of ", dtype_name(dtype), " are more bytes than int64 holds");
  return bytes;
}

}  // namespace

// ---------------------------------------------------------------- metadata

TensorImpl& Tensor::checked() const {
  TVC_CHECK(impl_ != nullptr, "tensor is undefined");
  return *impl_;
}

const Shape& Tensor::shape() const { return checked().shape; }
const Shape& Tensor::strides() const { return checked().strides; }
DType Tensor::dtype() const { return checked().dtype; }
int64_t Tensor::storage_offset() const { return checked().offset; }
const std::shared_ptr<Storage>& Tensor::storage() const { return checked().storage; }
bool Tensor::requires_grad() const { return checked().requires_grad; }
const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const { return checked().grad_fn; }
bool Tensor::retains_grad() const { return checked().retains_grad; }

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }
int64_t Tensor::numel() const { return shape_numel(shape()); }

bool Tensor::is_contiguous(MemoryFormat format) const {
  const Shape& sh = shape();
  if (numel() == 0) return format != MemoryFormat::ChannelsLast || sh.size() == 4;
  if (format == MemoryFormat::ChannelsLast) {
    if (sh.size() != 4) return false;
    Shape expect = contiguous_strides(sh, MemoryFormat::ChannelsLast);
    for (int i = 0; i < 4; ++i)
      if (sh[i] != 1 && strides()[i] != expect[i]) return false;
    return true;
  }
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (sh[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= sh[i];
  }
  return true;
}

MemoryFormat Tensor::suggest_memory_format() const {
  if (dim() == 4 && !is_contiguous() && is_contiguous(MemoryFormat::ChannelsLast)) return MemoryFormat::ChannelsLast;
  return MemoryFormat::Contiguous;
}

void* Tensor::raw_data() const {
  auto* base = static_cast<char*>(storage()->data());
  if (!base) return nullptr;  // an empty storage (its offset may still be non-zero)
  return base + storage_offset() * static_cast<int64_t>(element_size());
}

double Tensor::item_double() const {
  TVC_CHECK(numel() == 1, "item: tensor with ", numel(), " elements (shape ", shape(),
            ") cannot be converted to a number");
  return to_vector()[0];
}

int64_t Tensor::item_int64() const {
  TVC_CHECK(numel() == 1, "item: tensor with ", numel(), " elements (shape ", shape(),
            ") cannot be converted to a number");
  return *detach().to(DType::Int64).contiguous().data_ptr<int64_t>();
}

std::vector<double> Tensor::to_vector() const {
  Tensor c = detach().to(DType::Float64).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// ---------------------------------------------------------------- views

namespace detail {

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->view_base = base.impl()->view_base ? base.impl()->view_base : base.impl_ptr();
  return Tensor(std::move(impl));
}

Tensor empty_with_format(const Shape& shape, DType dtype, MemoryFormat format) {
  return empty_strided(shape, contiguous_strides(shape, format), {.dtype = dtype});
}

MemoryFormat result_format(const std::vector<Tensor>& inputs) {
  for (const Tensor& t : inputs)
    if (t.defined() && t.suggest_memory_format() == MemoryFormat::ChannelsLast) return MemoryFormat::ChannelsLast;
  return MemoryFormat::Contiguous;
}

}  // namespace detail

namespace {

// Records a view op's backward; views share the version counter of their base.
Tensor record_view(const char* name, const Tensor& self, Tensor out, autograd::BackwardFn fn) {
  autograd::record(name, {self}, {out}, std::move(fn));
  return out;
}

// record_view for a view of part of self, part(t) taking that part of a tensor shaped as self:
// the backward writes the gradient into zeros of self's shape, or adds it into self's gradient
// gathered so far (Node::add_part_into).
template <typename Part>
Tensor record_part_view(const char* name, const Tensor& self, Tensor out, Part part) {
  const Shape in_shape = self.shape();
  const DType dt = self.dtype();
  auto node = autograd::record(name, {self}, {out}, [in_shape, dt, part](const GradList& g) -> GradList {
    Tensor gi = zeros(in_shape, {.dtype = dt});
    part(gi).copy_(g[0]);
    return {gi};
  });
  if (node) node->add_part_into = [part](Tensor& slot, const Tensor& g) { part(slot).add_(g); };
  return out;
}

// Strides for viewing a tensor of (shape, strides) as new_shape, or nullopt when no view exists
// (PyTorch's computeStride).
std::optional<Shape> view_strides(const Shape& shape, const Shape& strides, const Shape& new_shape) {
  Shape out(new_shape.size());
  if (shape_numel(shape) == 0) return contiguous_strides(new_shape);
  if (shape.empty()) return Shape(new_shape.size(), 1);  // a 0-d tensor views as any size-1 shape
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

Shape infer_shape(Shape shape, int64_t numel, const char* op) {
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TVC_CHECK(infer < 0, op, ": only one dimension can be -1 in shape ", shape);
      infer = static_cast<int64_t>(i);
    } else {
      TVC_CHECK(shape[i] >= 0, op, ": invalid size ", shape[i], " in shape ", shape);
      TVC_CHECK(!__builtin_mul_overflow(known, shape[i], &known), op, ": shape ", shape,
                " is invalid for input of size ", numel);
    }
  }
  if (infer >= 0) {
    TVC_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape, " is invalid for input of size ", numel);
    shape[infer] = numel / known;
  }
  TVC_CHECK(shape_numel(shape) == numel, op, ": shape ", shape, " is invalid for input of size ", numel);
  return shape;
}

}  // namespace

Tensor Tensor::view(const Shape& new_shape_in) const {
  Shape new_shape = infer_shape(new_shape_in, numel(), "view");
  auto st = view_strides(shape(), strides(), new_shape);
  TVC_CHECK(st.has_value(), "view: shape ", new_shape_in, " is not compatible with input shape ", shape(),
            " and strides ", strides(), "; use reshape");
  Shape in_shape = shape();
  return record_view("ViewBackward0", *this, make_view(*this, new_shape, *st, storage_offset()),
                     [in_shape](const GradList& g) -> GradList { return {g[0].reshape(in_shape)}; });
}

Tensor Tensor::reshape(const Shape& new_shape_in) const {
  Shape new_shape = infer_shape(new_shape_in, numel(), "reshape");
  if (view_strides(shape(), strides(), new_shape)) return view(new_shape);
  return contiguous().view(new_shape);
}

Tensor Tensor::permute(const Shape& dims) const {
  TVC_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: number of dims ", dims,
            " does not match the tensor's ", dim(), " dims (shape ", shape(), ")");
  Shape sh(dims.size()), st(dims.size()), inverse(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute");
    TVC_CHECK(!seen[d], "permute: dim ", d, " repeats in ", dims);
    seen[d] = true;
    sh[i] = shape()[d];
    st[i] = strides()[d];
    inverse[d] = static_cast<int64_t>(i);
  }
  return record_view("PermuteBackward0", *this, make_view(*this, sh, st, storage_offset()),
                     [inverse](const GradList& g) -> GradList { return {g[0].permute(inverse)}; });
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  if (dim() == 0) return *this;
  d0 = wrap_dim(d0, dim(), "transpose");
  d1 = wrap_dim(d1, dim(), "transpose");
  Shape sh = shape(), st = strides();
  std::swap(sh[d0], sh[d1]);
  std::swap(st[d0], st[d1]);
  return record_view("TransposeBackward0", *this, make_view(*this, sh, st, storage_offset()),
                     [d0, d1](const GradList& g) -> GradList { return {g[0].transpose(d0, d1)}; });
}

Tensor Tensor::t() const {
  TVC_CHECK(dim() <= 2, "t: expects a tensor with <= 2 dims, got shape ", shape());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  TVC_CHECK(dim() > 0, "slice: cannot slice a 0-d tensor");
  d = wrap_dim(d, dim(), "slice");
  TVC_CHECK(step > 0, "slice: step must be positive, got ", step);
  int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sh = shape(), st = strides();
  sh[d] = end == start ? 0 : (end - start - 1) / step + 1;  // no overflow for any step
  // With two or more elements step < n, so the stride stays inside the tensor's extent; with one
  // or none it is never used, and stays the input's where stride * step would overflow. An empty
  // result keeps the input's offset (start * stride may pass int64 there).
  int64_t stepped = 0;
  if (!__builtin_mul_overflow(st[d], step, &stepped)) st[d] = stepped;
  int64_t offset = storage_offset() + (sh[d] > 0 ? start * strides()[d] : 0);
  return record_part_view("SliceBackward0", *this, make_view(*this, sh, st, offset),
                          [d, start, end, step](const Tensor& t) { return t.slice(d, start, end, step); });
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  TVC_CHECK(dim() > 0, "narrow: cannot narrow a 0-d tensor");
  d = wrap_dim(d, dim(), "narrow");
  int64_t n = shape()[d];
  if (start < 0) start += n;
  TVC_CHECK(start >= 0 && length >= 0 && length <= n - start, "narrow: start ", start, " + length ", length,
            " exceeds dimension ", d, " of size ", n, " (shape ", shape(), ")");
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  TVC_CHECK(dim() > 0, "select: cannot select from a 0-d tensor");
  d = wrap_dim(d, dim(), "select");
  int64_t n = shape()[d];
  TVC_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dimension ", d, " of size ", n,
            " (shape ", shape(), ")");
  if (index < 0) index += n;
  Shape sh = shape(), st = strides();
  int64_t off = storage_offset() + index * st[d];
  sh.erase(sh.begin() + d);
  st.erase(st.begin() + d);
  return record_part_view("SelectBackward0", *this, make_view(*this, sh, st, off),
                          [d, index](const Tensor& t) { return t.select(d, index); });
}

Tensor Tensor::expand(const Shape& target) const {
  int64_t nd = static_cast<int64_t>(target.size());
  TVC_CHECK(nd >= dim(), "expand: the number of sizes ", target, " must be at least the tensor's dims (shape ", shape(),
            ")");
  Shape sh(nd), st(nd);
  for (int64_t i = nd - 1; i >= 0; --i) {
    int64_t j = i - (nd - dim());
    int64_t size = j >= 0 ? shape()[j] : 1;
    int64_t stride = j >= 0 ? strides()[j] : 0;
    int64_t want = target[i];
    if (want == -1) {
      TVC_CHECK(j >= 0, "expand: -1 is not allowed for a new leading dim in ", target);
      want = size;
    }
    TVC_CHECK(want >= 0, "expand: invalid size ", want, " in ", target);
    if (size != want) {
      TVC_CHECK(size == 1, "expand: the size ", size, " of dim ", j, " (shape ", shape(), ") must match ", want,
                " or be 1 (target ", target, ")");
      stride = 0;
    }
    sh[i] = want;
    st[i] = stride;
  }
  int64_t numel = 1;
  for (int64_t size : sh)
    TVC_CHECK(!__builtin_mul_overflow(numel, size, &numel), "expand: target ", target,
              " has more elements than int64 holds");
  Shape in_shape = shape();
  return record_view("ExpandBackward0", *this, make_view(*this, sh, st, storage_offset()),
                     [in_shape](const GradList& g) -> GradList { return {sum_to(g[0], in_shape)}; });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape sh = shape(), st = strides();
  // The new dim's stride is never used (size 1); PyTorch's, stride * size, where that fits.
  int64_t stride = 1;
  if (d < dim() && __builtin_mul_overflow(st[d], sh[d], &stride)) stride = st[d];
  sh.insert(sh.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return record_view("UnsqueezeBackward0", *this, make_view(*this, sh, st, storage_offset()),
                     [d](const GradList& g) -> GradList { return {g[0].squeeze(d)}; });
}

Tensor Tensor::squeeze() const {
  Shape sh, st;
  for (int64_t i = 0; i < dim(); ++i)
    if (shape()[i] != 1) {
      sh.push_back(shape()[i]);
      st.push_back(strides()[i]);
    }
  Shape in_shape = shape();
  return record_view("SqueezeBackward0", *this, make_view(*this, sh, st, storage_offset()),
                     [in_shape](const GradList& g) -> GradList { return {g[0].reshape(in_shape)}; });
}

Tensor Tensor::squeeze(int64_t d) const {
  if (dim() == 0) return *this;
  d = wrap_dim(d, dim(), "squeeze");
  if (shape()[d] != 1) return *this;
  Shape sh = shape(), st = strides();
  sh.erase(sh.begin() + d);
  st.erase(st.begin() + d);
  return record_view("SqueezeBackward1", *this, make_view(*this, sh, st, storage_offset()),
                     [d](const GradList& g) -> GradList { return {g[0].unsqueeze(d)}; });
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  start = wrap_dim(start, dim(), "flatten");
  end = wrap_dim(end, dim(), "flatten");
  TVC_CHECK(start <= end, "flatten: start_dim ", start, " must not be after end_dim ", end);
  Shape sh(shape().begin(), shape().begin() + start);
  int64_t n = 1;
  for (int64_t i = start; i <= end; ++i)
    TVC_CHECK(!__builtin_mul_overflow(n, shape()[i], &n), "flatten: dims ", start, " to ", end, " of shape ", shape(),
              " hold more elements than int64 holds");
  sh.push_back(n);
  sh.insert(sh.end(), shape().begin() + end + 1, shape().end());
  return reshape(sh);
}

Tensor Tensor::unflatten(int64_t d, const Shape& sizes) const {
  d = wrap_dim(d, dim(), "unflatten");
  Shape sh(shape().begin(), shape().begin() + d);
  Shape inner = infer_shape(sizes, shape()[d], "unflatten");
  sh.insert(sh.end(), inner.begin(), inner.end());
  sh.insert(sh.end(), shape().begin() + d + 1, shape().end());
  return view(sh);
}

Tensor Tensor::as_strided(const Shape& sh, const Shape& st, int64_t offset) const {
  TVC_CHECK(sh.size() == st.size(), "as_strided: shape ", sh, " and strides ", st, " differ in length");
  TVC_CHECK(!(requires_grad() && is_grad_enabled()),
            "as_strided: not differentiable; call it on a detached tensor or under NoGradGuard");
  int64_t extent = storage_extent(sh, st, "as_strided"), end = 0;
  TVC_CHECK(offset >= 0, "as_strided: negative storage offset ", offset);
  TVC_CHECK(extent == 0 || (!__builtin_add_overflow(offset, extent, &end) &&
                            checked_bytes(end, dtype(), "as_strided") <= static_cast<int64_t>(storage()->nbytes())),
            "as_strided: shape ", sh, " strides ", st, " offset ", offset, " reach past the storage of ",
            storage()->nbytes(), " bytes");
  return make_view(*this, sh, st, offset);
}

Tensor Tensor::contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::Preserve) return *this;
  if (is_contiguous(format)) return *this;
  return clone(format);
}

// ---------------------------------------------------------------- copies

Tensor Tensor::clone(MemoryFormat format) const {
  if (format == MemoryFormat::Preserve) format = suggest_memory_format();
  Tensor out = detail::empty_with_format(shape(), dtype(), format);
  detail::run(Op::copy, {*this}, {out});
  autograd::record("CloneBackward0", {*this}, {out}, [](const GradList& g) -> GradList { return {g[0]}; });
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = detail::empty_with_format(shape(), target, suggest_memory_format());
  detail::run(Op::copy, {*this}, {out});
  if (is_floating(target) && is_floating(dtype())) {
    DType src = dtype();
    autograd::record("ToCopyBackward0", {*this}, {out},
                     [src](const GradList& g) -> GradList { return {g[0].to(src)}; });
  }
  return out;
}

Tensor Tensor::to(Device target) const {
  Device source = device();
  if (target == source) return *this;
  // The copy goes through the memory functions of the non-CPU side's backend.
  const DeviceMemory& memory = device_memory(source == Device::CPU ? target : source, "to");
  Tensor src = contiguous();
  Tensor out = empty(shape(), {.dtype = dtype(), .device = target});
  if (size_t bytes = static_cast<size_t>(numel()) * element_size())
    memory.copy(out.raw_data(), target, src.raw_data(), source, bytes);
  if (is_floating(dtype()))
    autograd::record("ToCopyBackward0", {*this}, {out},
                     [source](const GradList& g) -> GradList { return {g[0].to(source)}; });
  return out;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage();
  impl->shape = shape();
  impl->strides = strides();
  impl->offset = storage_offset();
  impl->dtype = dtype();
  return Tensor(std::move(impl));
}

Tensor& Tensor::detach_() {
  impl_->grad_fn.reset();
  impl_->output_nr = 0;
  impl_->requires_grad = false;
  return *this;
}

// ---------------------------------------------------------------- creation

Tensor empty_strided(const Shape& shape, const Shape& strides, TensorOptions options) {
  int64_t bytes = checked_bytes(storage_extent(shape, strides, "empty_strided"), options.dtype, "empty_strided");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::allocate(static_cast<size_t>(bytes), options.device);
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = options.dtype;
  impl->requires_grad = options.requires_grad;
  TVC_CHECK(!options.requires_grad || is_floating(options.dtype),
            "only floating point tensors can require gradients, got ", dtype_name(options.dtype));
  return Tensor(std::move(impl));
}

Tensor empty(const Shape& shape, TensorOptions options) {
  return empty_strided(shape, contiguous_strides(shape), options);
}

Tensor empty_like(const Tensor& t, MemoryFormat format) {
  if (format == MemoryFormat::Preserve) format = t.suggest_memory_format();
  return detail::empty_with_format(t.shape(), t.dtype(), format);
}

Tensor full(const Shape& shape, Scalar value, TensorOptions options) {
  bool rg = options.requires_grad;
  options.requires_grad = false;
  Tensor t = empty(shape, options);
  t.fill_(value);
  if (rg) t.requires_grad_(true);
  return t;
}

Tensor zeros(const Shape& shape, TensorOptions options) { return full(shape, 0, options); }
Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1, options); }
Tensor zeros_like(const Tensor& t) { return empty_like(t).fill_(0); }
Tensor ones_like(const Tensor& t) { return empty_like(t).fill_(1); }
Tensor full_like(const Tensor& t, Scalar value) { return empty_like(t).fill_(value); }
Tensor scalar_tensor(Scalar value, TensorOptions options) { return full({}, value, options); }

Tensor arange(double start, double end, double step, TensorOptions options) {
  TVC_CHECK(step != 0, "arange: step must be nonzero");
  TVC_CHECK(std::isfinite(start) && std::isfinite(end), "arange: start ", start, " and end ", end, " must be finite");
  TVC_CHECK((end - start) / step >= 0, "arange: upper bound ", end, " and lower bound ", start,
            " are inconsistent with step sign ", step);
  double count = std::ceil((end - start) / step);
  TVC_CHECK(count < 1e15, "arange: ", count, " elements is too many");
  Tensor t = empty({static_cast<int64_t>(count)}, {.dtype = options.dtype});
  FillParams p{.a = start, .b = step};
  detail::run(Op::arange, {}, {t}, &p);
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor arange(int64_t end, TensorOptions options) { return arange(0, static_cast<double>(end), 1, options); }

Tensor linspace(double start, double end, int64_t steps, TensorOptions options) {
  TVC_CHECK(steps >= 0, "linspace: number of steps must be non-negative, got ", steps);
  // As PyTorch: the first half counts up from start, the second half down from end.
  std::vector<double> v(steps);
  double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0;
  int64_t half = steps == 1 ? 1 : steps / 2;  // a single step is start, as PyTorch
  for (int64_t i = 0; i < steps; ++i)
    v[i] = i < half ? start + step * static_cast<double>(i) : end - step * static_cast<double>(steps - 1 - i);
  Tensor t = tensor<double>(v).to(options.dtype);
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor from_blob(void* data, const Shape& shape, DType dtype, Storage::Deleter deleter, std::optional<Shape> strides) {
  Shape st = strides ? *strides : contiguous_strides(shape);
  int64_t bytes = checked_bytes(storage_extent(shape, st, "from_blob"), dtype, "from_blob");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::wrap(data, static_cast<size_t>(bytes), std::move(deleter));
  impl->shape = shape;
  impl->strides = st;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

template <typename T>
Tensor tensor(const std::vector<T>& values, std::optional<Shape> shape) {
  Shape sh = shape ? *shape : Shape{static_cast<int64_t>(values.size())};
  TVC_CHECK(shape_numel(sh) == static_cast<int64_t>(values.size()), "tensor: ", values.size(),
            " values do not fill shape ", sh);
  Tensor t = empty(sh, {.dtype = dtype_of<T>()});
  std::copy(values.begin(), values.end(), t.data_ptr<T>());
  return t;
}
template Tensor tensor<float>(const std::vector<float>&, std::optional<Shape>);
template Tensor tensor<double>(const std::vector<double>&, std::optional<Shape>);
template Tensor tensor<int64_t>(const std::vector<int64_t>&, std::optional<Shape>);
template Tensor tensor<int32_t>(const std::vector<int32_t>&, std::optional<Shape>);
template Tensor tensor<uint8_t>(const std::vector<uint8_t>&, std::optional<Shape>);
template Tensor tensor<Half>(const std::vector<Half>&, std::optional<Shape>);
template Tensor tensor<BFloat16>(const std::vector<BFloat16>&, std::optional<Shape>);

template <>
Tensor tensor<bool>(const std::vector<bool>& values, std::optional<Shape> shape) {
  std::vector<uint8_t> bytes(values.begin(), values.end());
  Tensor t = tensor<uint8_t>(bytes, shape);
  t.impl()->dtype = DType::Bool;
  return t;
}

// ---------------------------------------------------------------- printing
// A port of the rules of PyTorch's torch/_tensor_str.py (precision 4, threshold 1000,
// edgeitems 3, linewidth 80), so that repr() prints what Python prints.

namespace {

constexpr int64_t kPrintThreshold = 1000, kEdgeItems = 3, kLineWidth = 80;

std::string printf_str(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

struct Formatter {
  bool floating = false, int_mode = true, sci_mode = false, is_bool = false;
  size_t max_width = 1;

  Formatter(const std::vector<double>& values, DType dtype) {
    floating = is_floating(dtype);
    is_bool = dtype == DType::Bool;
    if (!floating) {
      for (double v : values) max_width = std::max(max_width, plain(v).size());
      return;
    }
    std::vector<double> nz;
    for (double v : values)
      if (std::isfinite(v) && v != 0) nz.push_back(v);
    if (nz.empty()) return;
    double mn = INFINITY, mx = 0;
    for (double v : nz) {
      mn = std::min(mn, std::fabs(v));
      mx = std::max(mx, std::fabs(v));
      if (v != std::ceil(v)) int_mode = false;
    }
    if (int_mode) {
      sci_mode = mx / mn > 1000. || mx > 1e8;
      for (double v : nz)
        max_width = std::max(max_width, sci_mode ? printf_str("%.4e", v).size() : printf_str("%.0f", v).size() + 1);
    } else {
      sci_mode = mx / mn > 1000. || mx > 1e8 || mn < 1e-4;
      for (double v : nz) max_width = std::max(max_width, printf_str(sci_mode ? "%.4e" : "%.4f", v).size());
    }
  }

  std::string plain(double v) const {
    if (is_bool) return v != 0 ? "True" : "False";
    return std::to_string(static_cast<int64_t>(v));
  }

  std::string format(double v) const {
    std::string r;
    if (!floating) {
      r = plain(v);
    } else if (std::isnan(v)) {
      r = "nan";
    } else if (std::isinf(v)) {
      r = v > 0 ? "inf" : "-inf";
    } else if (sci_mode) {
      r = printf_str("%.4e", v);
    } else if (int_mode) {
      r = printf_str("%.0f", v) + ".";
    } else {
      r = printf_str("%.4f", v);
    }
    if (r.size() < max_width) r.insert(0, max_width - r.size(), ' ');
    return r;
  }
};

// The values printing shows: all, or the edge items of every dim when summarising.
void summarized_values(const std::vector<double>& v, const Shape& shape, const Shape& st, int64_t dim, int64_t base,
                       bool summarize, std::vector<double>& out) {
  if (dim == static_cast<int64_t>(shape.size())) {
    out.push_back(v[base]);
    return;
  }
  int64_t n = shape[dim];
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) i = n - kEdgeItems;
    summarized_values(v, shape, st, dim + 1, base + i * st[dim], summarize, out);
  }
}

std::string vector_str(const std::vector<double>& v, int64_t n, int64_t base, int64_t stride, int64_t indent,
                       bool summarize, const Formatter& f) {
  size_t element_length = f.max_width + 2;
  int64_t per_line = std::max<int64_t>(1, (kLineWidth - indent) / static_cast<int64_t>(element_length));
  std::vector<std::string> data;
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
      data.push_back(" ...");
      i = n - kEdgeItems;
    }
    data.push_back(f.format(v[base + i * stride]));
  }
  std::string out = "[";
  for (size_t i = 0; i < data.size(); ++i) {
    if (i > 0) out += (static_cast<int64_t>(i) % per_line == 0) ? ",\n" + std::string(indent + 1, ' ') : ", ";
    out += data[i];
  }
  return out + "]";
}

std::string tensor_str(const std::vector<double>& v, const Shape& shape, const Shape& st, int64_t dim, int64_t base,
                       int64_t indent, bool summarize, const Formatter& f) {
  int64_t nd = static_cast<int64_t>(shape.size()) - dim;
  if (nd == 0) return f.format(v[base]);
  if (nd == 1) return vector_str(v, shape[dim], base, st[dim], indent, summarize, f);
  std::vector<std::string> slices;
  int64_t n = shape[dim];
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
      slices.push_back("...");
      i = n - kEdgeItems;
    }
    slices.push_back(tensor_str(v, shape, st, dim + 1, base + i * st[dim], indent + 1, summarize, f));
  }
  std::string sep = "," + std::string(nd - 1, '\n') + std::string(indent + 1, ' ');
  std::string out = "[";
  for (size_t i = 0; i < slices.size(); ++i) out += (i ? sep : "") + slices[i];
  return out + "]";
}

}  // namespace

std::string Tensor::repr() const {
  if (!defined()) return "tensor(undefined)";
  const std::string prefix = "tensor(";
  const int64_t indent = static_cast<int64_t>(prefix.size());
  std::vector<std::string> suffixes;
  bool default_dtype = dtype() == DType::Float32 || dtype() == DType::Int64 || dtype() == DType::Bool;
  std::string body;
  if (numel() == 0) {
    if (dim() != 1) {
      std::string size = "size=(";
      for (int64_t i = 0; i < dim(); ++i) size += (i ? ", " : "") + std::to_string(shape()[i]);
      suffixes.push_back(size + ")");
    }
    if (dtype() != DType::Float32) suffixes.push_back(std::string("dtype=torch.") + dtype_name(dtype()));
    body = "[]";
  } else {
    if (!default_dtype) suffixes.push_back(std::string("dtype=torch.") + dtype_name(dtype()));
    std::vector<double> v = to_vector();
    bool summarize = numel() > kPrintThreshold;
    Shape st = contiguous_strides(shape());
    std::vector<double> shown;
    summarized_values(v, shape(), st, 0, 0, summarize, shown);
    Formatter f(shown, dtype());
    body = tensor_str(v, shape(), st, 0, 0, indent, summarize, f);
  }
  if (grad_fn())
    suffixes.push_back("grad_fn=<" + grad_fn()->name() + ">");
  else if (requires_grad())
    suffixes.push_back("requires_grad=True");
  std::string out = prefix + body;
  int64_t last_line_len = static_cast<int64_t>(out.size() - out.rfind('\n')) + 1;
  if (out.find('\n') == std::string::npos) last_line_len = static_cast<int64_t>(out.size()) + 2;
  for (const std::string& s : suffixes) {
    int64_t len = static_cast<int64_t>(s.size());
    if (last_line_len + len + 2 > kLineWidth) {
      out += ",\n" + std::string(indent, ' ') + s;
      last_line_len = indent + len;
    } else {
      out += ", " + s;
      last_line_len += len + 2;
    }
  }
  return out + ")";
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.repr(); }
std::ostream& operator<<(std::ostream& os, const Shape& shape) { return os << shape_str(shape); }

}  // namespace tvc
