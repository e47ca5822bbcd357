// Reductions: sum, mean, var, std, amax/amin, max/min, argmax/argmin, topk; their backward.
#include <algorithm>

#include "internal.h"

namespace tvc {

using autograd::GradList;
using autograd::SavedTensor;

namespace detail {

std::vector<int64_t> reduction_dims(const Shape& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, ndim, op);
    TVC_CHECK(std::find(out.begin(), out.end(), w) == out.end(), op, ": dim ", w, " appears more than once in ", dims);
    out.push_back(w);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    bool reduced = std::binary_search(dims.begin(), dims.end(), d);
    if (!reduced)
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

Tensor unsqueeze_dims(const Tensor& t, const std::vector<int64_t>& dims) {
  Tensor r = t;
  for (int64_t d : dims) r = r.unsqueeze(d);
  return r;
}

}  // namespace detail

namespace {

// Runs a reduction kernel: out allocated in keepdim form, then viewed without the dims.
Tensor reduce_forward(Op op, const Tensor& t, const std::vector<int64_t>& dims, bool keepdim, DType out_dtype) {
  NoGradGuard no_grad;
  Shape keep_shape = detail::reduced_shape(t.shape(), dims, true);
  Tensor out = empty(keep_shape, {.dtype = out_dtype});
  if (t.dim() == 0) {
    detail::run(Op::copy, {t}, {out});
  } else {
    detail::run(op, {t}, {out});
  }
  return keepdim ? out : out.view(detail::reduced_shape(t.shape(), dims, false));
}

// Expands a reduced gradient back over the input's shape.
Tensor expand_back(const Tensor& g, const Shape& in_shape, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor r = keepdim ? g : detail::unsqueeze_dims(g, dims);
  return r.expand(in_shape);
}

int64_t count_over(const Shape& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[d];
  return n;
}

}  // namespace

Tensor sum(const Tensor& t, const Shape& dims_in, bool keepdim, std::optional<DType> dtype) {
  auto dims = detail::reduction_dims(dims_in, t.dim(), "sum");
  DType out_dtype = dtype ? *dtype : (is_integral(t.dtype()) || t.dtype() == DType::Bool) ? DType::Int64 : t.dtype();
  Tensor out = reduce_forward(Op::sum, t, dims, keepdim, out_dtype);
  Shape in_shape = t.shape();
  autograd::record("SumBackward1", {t}, {out},
                   [=](const GradList& g) -> GradList { return {expand_back(g[0], in_shape, dims, keepdim)}; });
  return out;
}

Tensor mean(const Tensor& t, const Shape& dims_in, bool keepdim) {
  TVC_CHECK(is_floating(t.dtype()), "mean: needs a floating tensor, got ", dtype_name(t.dtype()));
  auto dims = detail::reduction_dims(dims_in, t.dim(), "mean");
  int64_t n = count_over(t.shape(), dims);
  return div(sum(t, dims_in, keepdim), scalar_like(static_cast<double>(n), t.dtype()));
}

Tensor var(const Tensor& t, const Shape& dims_in, int64_t correction, bool keepdim) {
  TVC_CHECK(is_floating(t.dtype()), "var: needs a floating tensor, got ", dtype_name(t.dtype()));
  auto dims = detail::reduction_dims(dims_in, t.dim(), "var");
  int64_t n = count_over(t.shape(), dims);
  // Two passes (mean, then squared deviations) for accuracy.
  Tensor centered = sub(t, mean(t, dims_in, true));
  Tensor ss = sum(mul(centered, centered), dims_in, keepdim);
  double denom = std::max<double>(static_cast<double>(n - correction), 0.0);
  return div(ss, scalar_like(denom, t.dtype()));
}

Tensor std(const Tensor& t, const Shape& dims, int64_t correction, bool keepdim) {
  return sqrt(var(t, dims, correction, keepdim));
}

namespace {
Tensor extremum_values(Op op, const char* name, const Tensor& t, const Shape& dims_in, bool keepdim) {
  auto dims = detail::reduction_dims(dims_in, t.dim(), op_name(op));
  Tensor out = reduce_forward(op, t, dims, keepdim, t.dtype());
  if (!autograd::any_requires_grad({t})) return out;
  SavedTensor sin(t), sout(out);
  Shape in_shape = t.shape();
  std::string nm = name;
  autograd::record(name, {t}, {out}, [=](const GradList& g) -> GradList {
    // The gradient is shared evenly among the elements equal to the extremum (as PyTorch).
    Tensor x = sin.unpack(nm);
    Tensor y = expand_back(sout.unpack(nm), in_shape, dims, keepdim);
    Tensor mask = eq(x, y).to(g[0].dtype());
    Tensor count = expand_back(sum(mask, dims, keepdim), in_shape, dims, keepdim);
    return {div(mul(expand_back(g[0], in_shape, dims, keepdim), mask), count)};
  });
  return out;
}

Tensor arg_extremum(Op op, const Tensor& t, std::optional<int64_t> dim, bool keepdim) {
  if (!dim) {
    Tensor flat = t.reshape({-1});
    Tensor r = reduce_forward(op, flat, {0}, false, DType::Int64);
    return keepdim ? r.reshape(Shape(t.dim(), 1)) : r;
  }
  int64_t d = wrap_dim(*dim, t.dim(), op_name(op));
  return reduce_forward(op, t, {t.dim() == 0 ? 0 : d}, keepdim, DType::Int64);
}
}  // namespace

Tensor amax(const Tensor& t, const Shape& dims, bool keepdim) {
  return extremum_values(Op::amax, "AmaxBackward0", t, dims, keepdim);
}
Tensor amin(const Tensor& t, const Shape& dims, bool keepdim) {
  return extremum_values(Op::amin, "AminBackward0", t, dims, keepdim);
}
Tensor max(const Tensor& t) { return amax(t); }
Tensor min(const Tensor& t) { return amin(t); }

Tensor argmax(const Tensor& t, std::optional<int64_t> dim, bool keepdim) {
  return arg_extremum(Op::argmax, t, dim, keepdim);
}
Tensor argmin(const Tensor& t, std::optional<int64_t> dim, bool keepdim) {
  return arg_extremum(Op::argmin, t, dim, keepdim);
}

namespace {
// (values, indices) along dim: the indices of arg_op, the values gathered by them (so the
// gradient flows back through the indices).
std::pair<Tensor, Tensor> values_and_indices(Op arg_op, const Tensor& t, int64_t dim, bool keepdim) {
  int64_t d = t.dim() == 0 ? 0 : wrap_dim(dim, t.dim(), op_name(arg_op));
  Tensor idx = arg_extremum(arg_op, t, dim, true);
  Tensor values = gather(t, d, idx);
  if (!keepdim && t.dim() > 0) return {values.squeeze(d), idx.squeeze(d)};
  return {values, idx};
}
}  // namespace

std::pair<Tensor, Tensor> max(const Tensor& t, int64_t dim, bool keepdim) {
  return values_and_indices(Op::argmax, t, dim, keepdim);
}

std::pair<Tensor, Tensor> min(const Tensor& t, int64_t dim, bool keepdim) {
  return values_and_indices(Op::argmin, t, dim, keepdim);
}

std::pair<Tensor, Tensor> topk(const Tensor& t, int64_t k, int64_t dim, bool largest, bool sorted) {
  Tensor x = t.dim() == 0 ? t.unsqueeze(0) : t;
  int64_t d = wrap_dim(dim, x.dim(), "topk");
  TVC_CHECK(k >= 0 && k <= x.shape()[d], "topk: k = ", k, " is out of range for dimension ", d, " of size ",
            x.shape()[d], " (shape ", t.shape(), ")");
  Shape out_shape = x.shape();
  out_shape[d] = k;
  Tensor values = empty(out_shape, {.dtype = x.dtype()});
  Tensor indices = empty(out_shape, {.dtype = DType::Int64});
  TopkParams p{k, d, largest, sorted};
  if (k > 0) detail::run(Op::topk, {x}, {values, indices}, &p);
  if (t.dim() == 0) values = values.squeeze(0), indices = indices.squeeze(0);
  // With autograd, take the values through gather so the gradient flows back by the indices.
  if (autograd::any_requires_grad({t})) values = gather(t, t.dim() == 0 ? 0 : d, indices);
  return {values, indices};
}

Tensor Tensor::sum(const Shape& dims, bool keepdim) const { return tvc::sum(*this, dims, keepdim); }
Tensor Tensor::mean(const Shape& dims, bool keepdim) const { return tvc::mean(*this, dims, keepdim); }
Tensor Tensor::argmax(std::optional<int64_t> dim, bool keepdim) const { return tvc::argmax(*this, dim, keepdim); }
Tensor Tensor::argmin(std::optional<int64_t> dim, bool keepdim) const { return tvc::argmin(*this, dim, keepdim); }
Tensor Tensor::var(const Shape& dims, int64_t correction, bool keepdim) const {
  return tvc::var(*this, dims, correction, keepdim);
}
Tensor Tensor::std(const Shape& dims, int64_t correction, bool keepdim) const {
  return tvc::std(*this, dims, correction, keepdim);
}
Tensor Tensor::max() const { return tvc::max(*this); }
Tensor Tensor::min() const { return tvc::min(*this); }
std::pair<Tensor, Tensor> Tensor::max(int64_t dim, bool keepdim) const { return tvc::max(*this, dim, keepdim); }
std::pair<Tensor, Tensor> Tensor::min(int64_t dim, bool keepdim) const { return tvc::min(*this, dim, keepdim); }

}  // namespace tvc
