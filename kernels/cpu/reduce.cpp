// CPU kernels: reductions (sum, amax, amin, argmax, argmin) and topk.
// The output arrives in keepdim form: a dim is reduced where the output has extent 1 and the
// input does not. Each output element is reduced by one thread in a fixed order, accumulating
// floating types in double, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu_kernels.h"
#include "gemm.h"
#include "loops.h"

namespace tvc::cpu {
namespace {

// Splits the input's dims into kept (outer) and reduced (inner) index spaces.
struct ReduceGeometry {
  std::vector<int64_t> kept_shape, kept_in_strides, kept_out_strides;
  std::vector<int64_t> red_shape, red_strides;  // reduced dims, coalesced, innermost last
  int64_t num_out = 1, num_red = 1;
};

ReduceGeometry reduce_geometry(const Tensor& in, const Tensor& out) {
  ReduceGeometry g;
  for (int64_t d = 0; d < in.dim(); ++d) {
    int64_t n = in.shape()[d];
    if (out.shape()[d] == n) {
      if (n == 1) continue;
      g.kept_shape.push_back(n);
      g.kept_in_strides.push_back(in.strides()[d]);
      g.kept_out_strides.push_back(out.strides()[d]);
      g.num_out *= n;
    } else {
      if (!g.red_shape.empty() && g.red_strides.back() == in.strides()[d] * n) {
        g.red_shape.back() *= n;
        g.red_strides.back() = in.strides()[d];
      } else {
        g.red_shape.push_back(n);
        g.red_strides.push_back(in.strides()[d]);
      }
      g.num_red *= n;
    }
  }
  return g;
}

// Calls visit(in_offset, out_offset, reduce_fn) for each output element, where reduce_fn
// iterates over the reduced elements: reduce_fn(step) calls step(element_offset, linear_index).
template <typename Visit>
void for_each_output(const Tensor& in, const Tensor& out, Visit&& visit) {
  ReduceGeometry g = reduce_geometry(in, out);
  int64_t nk = static_cast<int64_t>(g.kept_shape.size());
  int64_t nr = static_cast<int64_t>(g.red_shape.size());
  parallel_for(g.num_out, g.num_red, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> ridx(nr);
    for (int64_t o = begin; o < end; ++o) {
      int64_t in_off = 0, out_off = 0, rem = o;
      for (int64_t d = nk - 1; d >= 0; --d) {
        int64_t i = rem % g.kept_shape[d];
        rem /= g.kept_shape[d];
        in_off += i * g.kept_in_strides[d];
        out_off += i * g.kept_out_strides[d];
      }
      auto iterate = [&](auto&& step) {
        if (g.num_red == 0) return;
        std::fill(ridx.begin(), ridx.end(), 0);
        int64_t inner = nr ? g.red_shape[nr - 1] : 1;
        int64_t inner_stride = nr ? g.red_strides[nr - 1] : 0;
        int64_t linear = 0;
        for (;;) {
          int64_t off = in_off;
          for (int64_t d = 0; d + 1 < nr; ++d) off += ridx[d] * g.red_strides[d];
          step(off, inner, inner_stride, linear);
          linear += inner;
          int64_t d = nr - 2;
          for (; d >= 0; --d) {
            if (++ridx[d] < g.red_shape[d]) break;
            ridx[d] = 0;
          }
          if (d < 0) break;
        }
      };
      visit(out_off, iterate);
    }
  });
}

template <typename T>
using acc_t = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double, int64_t>;

// Columns of a column block of sum_columns: their sums (double) stay in L1 while the rows stream.
constexpr int64_t kSumColumnBlock = 512;

// sum where the kept dims are one contiguous run of columns, every reduced dim outside it (a
// bias's gradient: the sum over rows of (R, D)): each thread takes a range of columns and adds
// row after row into their sums, in the order for_each_output's per-element loop adds them (so
// the same values), reading rows contiguously instead of one strided column at a time (float32
// by the instruction set's column_sums: Swin's bias gradients at batch 8 0.58-0.83x the time of
// this loop, Zen 3). False where the geometry is not that.
template <typename T, typename TOut>
bool sum_columns(const Tensor& in, const Tensor& out) {
  const ReduceGeometry g = reduce_geometry(in, out);
  if (g.kept_shape.size() != 1 || g.kept_in_strides[0] != 1 || g.red_shape.empty() || g.num_red < 2) return false;
  const int64_t nr = static_cast<int64_t>(g.red_shape.size()), columns = g.kept_shape[0];
  for (int64_t d = 0; d < nr; ++d)
    if (g.red_strides[d] < columns) return false;
  using A = acc_t<T>;
  const T* src = static_cast<const T*>(in.raw_data());
  TOut* dst = static_cast<TOut*>(out.raw_data());
  const int64_t out_stride = g.kept_out_strides[0];
  parallel_for(columns, g.num_red, [&](int64_t begin, int64_t end) {
    A acc[kSumColumnBlock];
    std::vector<int64_t> ridx(nr);
    for (int64_t c0 = begin; c0 < end; c0 += kSumColumnBlock) {
      const int64_t width = std::min(kSumColumnBlock, end - c0);
      std::fill(acc, acc + width, A(0));
      std::fill(ridx.begin(), ridx.end(), 0);
      const int64_t run = g.red_shape[nr - 1], run_stride = g.red_strides[nr - 1];
      for (;;) {  // over the outer reduced dims, each time a run of rows along the innermost
        const T* row = src + c0;
        for (int64_t d = 0; d + 1 < nr; ++d) row += ridx[d] * g.red_strides[d];
        if constexpr (std::is_same_v<T, float>) {
          column_sums(run, width, run_stride, row, acc);
        } else {
          for (int64_t r = 0; r < run; ++r)
            for (int64_t c = 0; c < width; ++c)
              acc[c] += static_cast<A>(static_cast<compute_t<T>>(row[r * run_stride + c]));
        }
        int64_t d = nr - 2;
        for (; d >= 0; --d) {
          if (++ridx[d] < g.red_shape[d]) break;
          ridx[d] = 0;
        }
        if (d < 0) break;
      }
      for (int64_t c = 0; c < width; ++c)
        dst[(c0 + c) * out_stride] = static_cast<TOut>(static_cast<compute_t<TOut>>(acc[c]));
    }
  });
  return true;
}

void sum_kernel(const KernelArgs& args) {
  const Tensor& in = args.in[0];
  const Tensor& out = args.out[0];
  dispatch_all(in.dtype(), Op::sum, [&]<typename T>() {
    dispatch_all(out.dtype(), Op::sum, [&]<typename TOut>() {
      using A = acc_t<T>;
      if (sum_columns<T, TOut>(in, out)) return;
      const T* src = static_cast<const T*>(in.raw_data());
      TOut* dst = static_cast<TOut*>(out.raw_data());
      for_each_output(in, out, [&](int64_t out_off, auto&& iterate) {
        A acc = 0;
        iterate([&](int64_t off, int64_t n, int64_t stride, int64_t) {
          const T* p = src + off;
          if (stride == 1) {
            acc += sum_in_four<A>(n, [&](int64_t i) { return static_cast<A>(static_cast<compute_t<T>>(p[i])); });
          } else {
            for (int64_t i = 0; i < n; ++i) acc += static_cast<A>(static_cast<compute_t<T>>(p[i * stride]));
          }
        });
        dst[out_off] = static_cast<TOut>(static_cast<compute_t<TOut>>(acc));
      });
    });
  });
}

// amax/amin (values, NaN propagates) and argmax/argmin (first index of the extremum; a NaN
// counts as the extremum).
template <bool kMax, bool kIndex>
void extremum_kernel(const KernelArgs& args) {
  constexpr Op op = kIndex ? (kMax ? Op::argmax : Op::argmin) : (kMax ? Op::amax : Op::amin);
  const Tensor& in = args.in[0];
  const Tensor& out = args.out[0];
  TVC_CHECK(in.numel() > 0, op_name(op), ": cannot reduce an empty tensor of shape ", in.shape(),
            " over a dim of size 0");
  dispatch_numeric(in.dtype(), op, [&]<typename T>() {
    using C = compute_t<T>;
    const T* src = static_cast<const T*>(in.raw_data());
    for_each_output(in, out, [&](int64_t out_off, auto&& iterate) {
      C best{};
      int64_t best_i = -1;
      bool best_nan = false;
      iterate([&](int64_t off, int64_t n, int64_t stride, int64_t linear) {
        for (int64_t i = 0; i < n; ++i) {
          if (best_nan) return;
          C v = static_cast<C>(src[off + i * stride]);
          bool take = best_i < 0;
          if constexpr (std::is_floating_point_v<C>) {
            if (std::isnan(v)) {
              best = v, best_i = linear + i, best_nan = true;
              return;
            }
          }
          if (!take) take = kMax ? v > best : v < best;
          if (take) best = v, best_i = linear + i;
        }
      });
      if constexpr (kIndex)
        static_cast<int64_t*>(out.raw_data())[out_off] = best_i;
      else
        static_cast<T*>(out.raw_data())[out_off] = static_cast<T>(best);
    });
  });
}

// in = (input) -> out = (values, int64 indices), both with extent k along dim.
void topk_kernel(const KernelArgs& args) {
  const auto& p = args.p<TopkParams>();
  const Tensor& in = args.in[0];
  const Tensor& values = args.out[0];
  const Tensor& indices = args.out[1];
  dispatch_numeric(in.dtype(), Op::topk, [&]<typename T>() {
    using C = compute_t<T>;
    int64_t n = in.shape()[p.dim];
    int64_t rows = in.numel() / std::max<int64_t>(n, 1);
    // Iterate over all positions with the topk dim fixed at 0.
    Tensor in0 = in.select(p.dim, 0), v0 = values.select(p.dim, 0), i0 = indices.select(p.dim, 0);
    int64_t nd = in0.dim();
    parallel_for(rows, n, [&](int64_t begin, int64_t end) {
      std::vector<std::pair<C, int64_t>> row(n);
      for (int64_t r = begin; r < end; ++r) {
        int64_t rem = r, in_off = in0.storage_offset(), v_off = v0.storage_offset(), i_off = i0.storage_offset();
        for (int64_t d = nd - 1; d >= 0; --d) {
          int64_t idx = rem % in0.shape()[d];
          rem /= in0.shape()[d];
          in_off += idx * in0.strides()[d];
          v_off += idx * v0.strides()[d];
          i_off += idx * i0.strides()[d];
        }
        const T* src = static_cast<const T*>(in.storage()->data()) + in_off;
        for (int64_t j = 0; j < n; ++j) row[j] = {static_cast<C>(src[j * in.strides()[p.dim]]), j};
        auto before = [&](const std::pair<C, int64_t>& a, const std::pair<C, int64_t>& b) {
          bool an = false, bn = false;
          if constexpr (std::is_floating_point_v<C>) an = std::isnan(a.first), bn = std::isnan(b.first);
          if (an != bn) return p.largest ? an : bn;  // NaN is the largest
          if (a.first != b.first && !an) return p.largest ? a.first > b.first : a.first < b.first;
          return a.second < b.second;
        };
        std::partial_sort(row.begin(), row.begin() + p.k, row.end(), before);
        T* vdst = static_cast<T*>(values.storage()->data()) + v_off;
        int64_t* idst = static_cast<int64_t*>(indices.storage()->data()) + i_off;
        for (int64_t j = 0; j < p.k; ++j) {
          vdst[j * values.strides()[p.dim]] = static_cast<T>(row[j].first);
          idst[j * indices.strides()[p.dim]] = row[j].second;
        }
      }
    });
  });
}

}  // namespace

void register_reduce_kernels(KernelRegistry& r) {
  const Device cpu = Device::CPU;
  r.set(Op::sum, cpu, sum_kernel);
  r.set(Op::amax, cpu, extremum_kernel<true, false>);
  r.set(Op::amin, cpu, extremum_kernel<false, false>);
  r.set(Op::argmax, cpu, extremum_kernel<true, true>);
  r.set(Op::argmin, cpu, extremum_kernel<false, true>);
  r.set(Op::topk, cpu, topk_kernel);
}

}  // namespace tvc::cpu
