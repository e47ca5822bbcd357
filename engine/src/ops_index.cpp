// Indexing ops: gather, index_select (backward: scatter_add, index_add).
#include "internal.h"

namespace tvc {

using autograd::GradList;
using autograd::SavedTensor;

Tensor gather(const Tensor& t, int64_t dim, const Tensor& index) {
  TVC_CHECK(index.dtype() == DType::Int64, "gather: index must be int64, got ", dtype_name(index.dtype()));
  int64_t nd = std::max<int64_t>(t.dim(), 1);
  TVC_CHECK(std::max<int64_t>(index.dim(), 1) == nd, "gather: index of shape ", index.shape(),
            " must have as many dims as the input of shape ", t.shape());
  int64_t d = wrap_dim(dim, t.dim(), "gather");
  Tensor x = t.dim() == 0 ? t.reshape({1}) : t;
  Tensor ix = index.dim() == 0 ? index.reshape({1}) : index;
  for (int64_t i = 0; i < nd; ++i)
    TVC_CHECK(i == d || ix.shape()[i] <= x.shape()[i], "gather: index of shape ", index.shape(),
              " is larger than the input of shape ", t.shape(), " in dim ", i);
  Tensor out = empty(ix.shape(), {.dtype = t.dtype()});
  IndexParams p{d};
  detail::run(Op::gather, {x, ix}, {out}, &p);
  out = out.view(index.shape());
  if (!autograd::any_requires_grad({t})) return out;
  SavedTensor si(ix);
  Shape in_shape = x.shape(), orig_shape = t.shape();
  autograd::record("GatherBackward0", {t}, {out}, [=](const GradList& g) -> GradList {
    Tensor gi = zeros(in_shape, {.dtype = g[0].dtype()});
    IndexParams q{d};
    detail::run(Op::scatter_add, {g[0].reshape(si.unpack("GatherBackward0").shape()), si.unpack("GatherBackward0")},
                {gi}, &q);
    return {gi.reshape(orig_shape)};
  });
  return out;
}

Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index) {
  TVC_CHECK(index.dtype() == DType::Int64 || index.dtype() == DType::Int32,
            "index_select: index must be int64 or int32, got ", dtype_name(index.dtype()));
  TVC_CHECK(index.dim() <= 1, "index_select: index must be 0-d or 1-d, got shape ", index.shape());
  Tensor x = t.dim() == 0 ? t.reshape({1}) : t;
  int64_t d = wrap_dim(dim, x.dim(), "index_select");
  Tensor ix = index.to(DType::Int64).reshape({-1});
  Shape out_shape = x.shape();
  out_shape[d] = ix.numel();
  Tensor out = empty(out_shape, {.dtype = t.dtype()});
  IndexParams p{d};
  detail::run(Op::index_select, {x, ix}, {out}, &p);
  if (t.dim() == 0) out = out.reshape(index.dim() == 0 ? Shape{} : Shape{ix.numel()});
  if (!autograd::any_requires_grad({t})) return out;
  SavedTensor si(ix);
  Shape in_shape = x.shape(), orig_shape = t.shape(), full_out = out_shape;
  autograd::record("IndexSelectBackward0", {t}, {out}, [=](const GradList& g) -> GradList {
    Tensor gi = zeros(in_shape, {.dtype = g[0].dtype()});
    IndexParams q{d};
    detail::run(Op::index_add, {g[0].reshape(full_out), si.unpack("IndexSelectBackward0")}, {gi}, &q);
    return {gi.reshape(orig_shape)};
  });
  return out;
}

}  // namespace tvc
