// CPU kernels: gather / scatter_add and index_select / index_add along one dim.
// gather: out[..., i, ...] = in[..., index[..., i, ...], ...] with index shaped like out.
// index_select: out[..., j, ...] = in[..., index[j], ...] with index 1-d.
// Indices are checked against the dim's size; a bad one raises naming the op and the value.
#include "cpu_kernels.h"
#include "loops.h"

namespace tvc::cpu {
namespace {

// Walks every element of `shape` (row-major), giving the offsets (in elements) into a, b, c.
template <typename F>
void walk3(const Shape& shape, const Tensor& a, const Tensor& b, const Tensor& c, F&& f) {
  int64_t nd = static_cast<int64_t>(shape.size());
  int64_t n = shape_numel(shape);
  std::vector<int64_t> idx(nd, 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t oa = 0, ob = 0, oc = 0;
    for (int64_t d = 0; d < nd; ++d) {
      oa += idx[d] * a.strides()[d];
      ob += idx[d] * b.strides()[d];
      oc += idx[d] * c.strides()[d];
    }
    f(idx, oa, ob, oc);
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

int64_t checked_index(int64_t i, int64_t size, Op op) {
  if (i < -size || i >= size)
    throw Error(cat_str(op_name(op), ": index ", i, " is out of bounds for dimension of size ", size));
  return i < 0 ? i + size : i;
}

// gather (scatter = false): out[p] = in[p with dim -> index[p]]
// scatter_add (scatter = true): out[p with dim -> index[p]] += in[p]  (in = grad, shaped as index)
template <bool kScatter>
void gather_scatter_kernel(const KernelArgs& args) {
  constexpr Op op = kScatter ? Op::scatter_add : Op::gather;
  int64_t dim = args.p<IndexParams>().dim;
  const Tensor& src = args.in[0];
  const Tensor& index = args.in[1];
  const Tensor& out = args.out[0];
  const Tensor& big = kScatter ? out : src;    // the tensor indexed along dim
  const Tensor& small = kScatter ? src : out;  // shaped as index
  int64_t size = big.shape()[dim];
  dispatch_numeric(src.dtype(), op, [&]<typename T>() {
    T* pbig = static_cast<T*>(big.storage()->data()) + big.storage_offset();
    T* psmall = static_cast<T*>(small.storage()->data()) + small.storage_offset();
    const int64_t* pidx = static_cast<const int64_t*>(index.raw_data());
    walk3(index.shape(), small, index, big, [&](const std::vector<int64_t>& idx, int64_t os, int64_t oi, int64_t ob) {
      int64_t j = checked_index(pidx[oi], size, op);
      int64_t off = ob - idx[dim] * big.strides()[dim] + j * big.strides()[dim];
      if constexpr (kScatter)
        pbig[off] = static_cast<T>(static_cast<compute_t<T>>(pbig[off]) + static_cast<compute_t<T>>(psmall[os]));
      else
        psmall[os] = pbig[off];
    });
  });
}

// index_select (add = false): out.select(dim, j) = in.select(dim, index[j])
// index_add (add = true): out.select(dim, index[j]) += in.select(dim, j)  (in = grad)
// Element by element over the small side's shape: position p maps to the big side's p with dim
// -> index[p[dim]] (indices checked once, up front); contiguous tensors as runs of their trailing
// dims.
template <bool kAdd>
void index_kernel(const KernelArgs& args) {
  constexpr Op op = kAdd ? Op::index_add : Op::index_select;
  int64_t dim = args.p<IndexParams>().dim;
  const Tensor& src = args.in[0];
  const Tensor& out = args.out[0];
  const Tensor& big = kAdd ? out : src;
  const Tensor& small = kAdd ? src : out;
  const int64_t size = big.shape()[dim], stride = big.strides()[dim];
  const Tensor& index = args.in[1];
  const int64_t count = index.numel(), index_stride = index.strides()[0];
  const int64_t* indices = static_cast<const int64_t*>(index.raw_data());
  std::vector<int64_t> rows(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) rows[j] = checked_index(indices[j * index_stride], size, op);
  if (small.numel() == 0) return;  // (an empty tensor's storage may have no data to offset)
  dispatch_numeric(src.dtype(), op, [&]<typename T>() {
    T* pbig = static_cast<T*>(big.storage()->data()) + big.storage_offset();
    T* psmall = static_cast<T*>(small.storage()->data()) + small.storage_offset();
    auto apply = [](T& b, T& s) {
      if constexpr (kAdd)
        b = static_cast<T>(static_cast<compute_t<T>>(b) + static_cast<compute_t<T>>(s));
      else
        s = b;
    };
    if (big.is_contiguous() && small.is_contiguous()) {  // (outer, rows, inner) runs
      int64_t outer = 1, inner = 1;
      for (int64_t d = 0; d < dim; ++d) outer *= small.shape()[d];
      for (int64_t d = dim + 1; d < small.dim(); ++d) inner *= small.shape()[d];
      const int64_t n = static_cast<int64_t>(rows.size());
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j < n; ++j) {
          T* b = pbig + (o * size + rows[j]) * inner;
          T* sm = psmall + (o * n + j) * inner;
          for (int64_t i = 0; i < inner; ++i) apply(b[i], sm[i]);
        }
      return;
    }
    walk3(small.shape(), small, small, big, [&](const std::vector<int64_t>& pos, int64_t os, int64_t, int64_t ob) {
      apply(pbig[ob + (rows[pos[dim]] - pos[dim]) * stride], psmall[os]);
    });
  });
}

}  // namespace

void register_index_kernels(KernelRegistry& r) {
  r.set(Op::gather, Device::CPU, gather_scatter_kernel<false>);
  r.set(Op::scatter_add, Device::CPU, gather_scatter_kernel<true>);
  r.set(Op::index_select, Device::CPU, index_kernel<false>);
  r.set(Op::index_add, Device::CPU, index_kernel<true>);
}

}  // namespace tvc::cpu
