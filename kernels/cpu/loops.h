// Iteration machinery shared by the CPU kernels: dtype dispatch and strided n-ary loops.
//
// for_each_strided visits every element of same-shaped operands (the output first) in an order
// that follows the output's memory layout, coalescing dims that are contiguous in all operands,
// and splits the outer iterations over the OpenMP threads in fixed chunks. Each element is
// computed by exactly one thread with no cross-element state, so results do not depend on the
// thread count.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <type_traits>
#include <vector>

#include "tvc/internal/kernel.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tvc::cpu {

// Calls f.template operator()<T>() for the C++ type T of dtype.
template <typename F>
void dispatch_all(DType dtype, Op op, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f.template operator()<float>();
    case DType::Float64:
      return f.template operator()<double>();
    case DType::Float16:
      return f.template operator()<Half>();
    case DType::BFloat16:
      return f.template operator()<BFloat16>();
    case DType::Int64:
      return f.template operator()<int64_t>();
    case DType::Int32:
      return f.template operator()<int32_t>();
    case DType::Int16:
      return f.template operator()<int16_t>();
    case DType::Int8:
      return f.template operator()<int8_t>();
    case DType::UInt8:
      return f.template operator()<uint8_t>();
    case DType::Bool:
      return f.template operator()<bool>();
  }
  unsupported_dtype(op, dtype, Device::CPU);
}

// Floating dtypes only.
template <typename F>
void dispatch_floating(DType dtype, Op op, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f.template operator()<float>();
    case DType::Float64:
      return f.template operator()<double>();
    case DType::Float16:
      return f.template operator()<Half>();
    case DType::BFloat16:
      return f.template operator()<BFloat16>();
    default:
      unsupported_dtype(op, dtype, Device::CPU);
  }
}

// Numbers (everything but bool).
template <typename F>
void dispatch_numeric(DType dtype, Op op, F&& f) {
  switch (dtype) {
    case DType::Int64:
      return f.template operator()<int64_t>();
    case DType::Int32:
      return f.template operator()<int32_t>();
    case DType::Int16:
      return f.template operator()<int16_t>();
    case DType::Int8:
      return f.template operator()<int8_t>();
    case DType::UInt8:
      return f.template operator()<uint8_t>();
    default:
      return dispatch_floating(dtype, op, std::forward<F>(f));
  }
}

// Worth splitting over threads: more than this many elements of work.
inline constexpr int64_t kParallelGrain = 32768;

// Carries the first exception thrown inside an OpenMP region to the thread that started it: an
// exception that leaves a region ends the program. Each thread runs its work through run(), in
// the floating-point mode of the thread that made this (float_mode); after the region,
// rethrow() raises that exception on the calling thread.
class RegionErrors {
 public:
  template <typename F>
  void run(F&& work) noexcept {
    const FloatModeScope caller_mode(mode_);
    try {
      work();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!first_) first_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  const unsigned mode_ = float_mode();
  std::mutex mutex_;
  std::exception_ptr first_;
};

// Σ f(i) for i in [0, n) in Acc as the sum kernel adds a contiguous run: 4 partial sums (i % 4,
// the last n % 4 terms into the first), combined as (0 + 1) + (2 + 3).
template <typename Acc, typename F>
Acc sum_in_four(int64_t n, F f) {
  Acc partial[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) partial[k] += f(i + k);
  for (; i < n; ++i) partial[0] += f(i);
  return (partial[0] + partial[1]) + (partial[2] + partial[3]);
}

// Σ f(i) for i in [0, n) in Acc, as 8 partial sums combined in a fixed order: 8 independent
// chains (which vectorise) where one running sum would wait on every add.
template <typename Acc, typename F>
Acc sum_in_lanes(int64_t n, F f) {
  Acc acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += f(i + k);
  for (; i < n; ++i) acc[i % 8] += f(i);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// A per-thread scratch buffer of at least `elements` T, 64-byte aligned, kept for the thread's
// next calls and grown on demand; its contents are not initialised. Buffers in use at the same
// time need different slots: 0 and 1 are the convolutions', 2 and 3 the GEMM's packing, 4 the
// convolution epilogue's inside the GEMM, 12 a gathered residual's (epilogue_positions).
template <typename T, int Slot>
T* thread_scratch(int64_t elements) {
  thread_local std::unique_ptr<char[]> raw;
  thread_local size_t capacity = 0;
  size_t need = static_cast<size_t>(elements) * sizeof(T) + 64;
  if (capacity < need) {
    raw.reset(new char[need]);
    capacity = need;
  }
  auto p = reinterpret_cast<uintptr_t>(raw.get());
  return reinterpret_cast<T*>((p + 63) & ~uintptr_t{63});
}

// The threads a parallel region started here would have: 1 inside one (parallel_for then runs its
// body on the calling thread).
inline int64_t available_threads() {
#ifdef _OPENMP
  if (!omp_in_parallel()) return omp_get_max_threads();
#endif
  return 1;
}

// parallel_for's work, compiled once (loops.cpp): chunk(context, begin, end) for each chunk.
void parallel_chunks(int64_t n, int64_t work_per_item, void (*chunk)(void* context, int64_t begin, int64_t end),
                     void* context);

// Runs body(begin, end) over [0, n) split into contiguous chunks, one per thread (on the calling
// thread alone when the work is small, with one thread, or inside a parallel region). The body is
// called through a pointer so that the OpenMP region and its error handling exist once, not once
// per body: the elementwise kernels alone have some 380 bodies.
template <typename F>
void parallel_for(int64_t n, int64_t work_per_item, F&& body) {
  using Body = std::remove_reference_t<F>;
  parallel_chunks(
      n, work_per_item, [](void* context, int64_t begin, int64_t end) { (*static_cast<Body*>(context))(begin, end); },
      const_cast<void*>(static_cast<const void*>(std::addressof(body))));
}

// Geometry of an n-ary strided iteration, in bytes, innermost dim last.
template <size_t N>
struct StridedGeometry {
  std::vector<int64_t> shape;
  std::vector<std::array<int64_t, N>> strides;  // per dim, per operand (bytes)
};

template <size_t N>
StridedGeometry<N> make_geometry(const std::array<const Tensor*, N>& ops) {
  const Tensor& out = *ops[0];
  int64_t nd = out.dim();
  // Visit dims in the order of the output's strides, largest first (stable), so channels-last
  // outputs are written sequentially.
  std::vector<int64_t> order;
  for (int64_t d = 0; d < nd; ++d)
    if (out.shape()[d] != 1) order.push_back(d);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return out.strides()[a] > out.strides()[b]; });
  StridedGeometry<N> g;
  for (int64_t d : order) {
    std::array<int64_t, N> st;
    for (size_t k = 0; k < N; ++k) st[k] = ops[k]->strides()[d] * static_cast<int64_t>(ops[k]->element_size());
    if (!g.shape.empty()) {
      // Merge into the previous dim when contiguous across both for every operand.
      bool merge = true;
      for (size_t k = 0; k < N; ++k) merge &= g.strides.back()[k] == st[k] * out.shape()[d];
      if (merge) {
        g.shape.back() *= out.shape()[d];
        g.strides.back() = st;
        continue;
      }
    }
    g.shape.push_back(out.shape()[d]);
    g.strides.push_back(st);
  }
  if (g.shape.empty()) {
    g.shape.push_back(1);
    g.strides.push_back({});
  }
  return g;
}

// Calls inner(ptrs, byte_strides, n) for each innermost row of the operands; ops[0] is the
// output. Operands must have the same shape.
template <size_t N, typename Inner>
void for_each_strided(const std::array<const Tensor*, N>& ops, Inner&& inner) {
  if (ops[0]->numel() == 0) return;
  StridedGeometry<N> g = make_geometry(ops);
  std::array<char*, N> base;
  for (size_t k = 0; k < N; ++k) base[k] = static_cast<char*>(ops[k]->raw_data());
  int64_t nd = static_cast<int64_t>(g.shape.size());
  int64_t inner_n = g.shape.back();
  std::array<int64_t, N> inner_st = g.strides.back();
  int64_t outer = 1;
  for (int64_t d = 0; d + 1 < nd; ++d) outer *= g.shape[d];
  // Rows are the units of work; with fewer rows than threads (a dense tensor is one row) long rows
  // are cut into pieces so that every thread gets a share. Elementwise results do not depend on
  // the cut.
  int64_t pieces = 1;
#ifdef _OPENMP
  if (const int64_t threads = omp_get_max_threads(); outer < threads)
    pieces = std::clamp<int64_t>(inner_n / kParallelGrain, 1, threads);
#endif
  parallel_for(outer * pieces, inner_n / pieces, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> idx(std::max<int64_t>(nd - 1, 1), 0);
    int64_t rem = begin / pieces;
    for (int64_t d = nd - 2; d >= 0; --d) {
      idx[d] = rem % g.shape[d];
      rem /= g.shape[d];
    }
    for (int64_t item = begin; item < end; ++item) {
      const int64_t piece = item % pieces;
      const int64_t from = inner_n * piece / pieces, to = inner_n * (piece + 1) / pieces;
      std::array<char*, N> p = base;
      for (size_t k = 0; k < N; ++k) p[k] += from * inner_st[k];
      for (int64_t d = 0; d + 1 < nd; ++d)
        for (size_t k = 0; k < N; ++k) p[k] += idx[d] * g.strides[d][k];
      inner(p, inner_st, to - from);
      if (piece + 1 < pieces) continue;
      for (int64_t d = nd - 2; d >= 0; --d) {
        if (++idx[d] < g.shape[d]) break;
        idx[d] = 0;
      }
    }
  });
}

// Elementwise map: out[i] = f(in0[i], ..., in{N-2}[i]) with loads converted to C (compute type)
// and the result converted to the output's type.
template <typename TOut, typename TIn, typename C, size_t N, typename F>
void map_elements(const std::array<const Tensor*, N>& ops, F&& f) {
  for_each_strided<N>(ops, [&](std::array<char*, N> p, const std::array<int64_t, N>& st, int64_t n) {
    bool contiguous = st[0] == sizeof(TOut);
    for (size_t k = 1; k < N; ++k) contiguous &= st[k] == sizeof(TIn);
    if constexpr (N == 2) {
      auto* out = reinterpret_cast<TOut*>(p[0]);
      auto* a = reinterpret_cast<const TIn*>(p[1]);
      if (contiguous) {
        for (int64_t i = 0; i < n; ++i) out[i] = static_cast<TOut>(f(static_cast<C>(a[i])));
      } else {
        for (int64_t i = 0; i < n; ++i)
          *reinterpret_cast<TOut*>(p[0] + i * st[0]) =
              static_cast<TOut>(f(static_cast<C>(*reinterpret_cast<const TIn*>(p[1] + i * st[1]))));
      }
    } else if constexpr (N == 3) {
      auto* out = reinterpret_cast<TOut*>(p[0]);
      auto* a = reinterpret_cast<const TIn*>(p[1]);
      auto* b = reinterpret_cast<const TIn*>(p[2]);
      if (contiguous) {
        for (int64_t i = 0; i < n; ++i) out[i] = static_cast<TOut>(f(static_cast<C>(a[i]), static_cast<C>(b[i])));
      } else if (st[0] == sizeof(TOut) && st[1] == sizeof(TIn) && st[2] == 0) {
        C bv = static_cast<C>(*b);
        for (int64_t i = 0; i < n; ++i) out[i] = static_cast<TOut>(f(static_cast<C>(a[i]), bv));
      } else {
        for (int64_t i = 0; i < n; ++i)
          *reinterpret_cast<TOut*>(p[0] + i * st[0]) =
              static_cast<TOut>(f(static_cast<C>(*reinterpret_cast<const TIn*>(p[1] + i * st[1])),
                                  static_cast<C>(*reinterpret_cast<const TIn*>(p[2] + i * st[2]))));
      }
    } else {
      static_assert(N == 4, "map_elements supports 1 to 3 inputs");
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<TOut*>(p[0] + i * st[0]) =
            static_cast<TOut>(f(static_cast<C>(*reinterpret_cast<const TIn*>(p[1] + i * st[1])),
                                static_cast<C>(*reinterpret_cast<const TIn*>(p[2] + i * st[2])),
                                static_cast<C>(*reinterpret_cast<const TIn*>(p[3] + i * st[3]))));
    }
  });
}

}  // namespace tvc::cpu
