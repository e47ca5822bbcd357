// CPU kernels: max, average, adaptive average and adaptive max 2-d pooling and their backward.
//
// Shape legend: N batch, C channels, H,W input size, Ho,Wo output size. Every (n, c) plane is
// pooled independently by one thread, reading and writing through the tensors' strides (so
// channels-last operands work as they are; a global average, max pooling and its gradient of a
// channels-last input go along rows of positions instead, many channels at a time). Max pooling
// returns int64 indices h*W + w into each input plane; its backward (shared with adaptive max
// pooling) scatters through them. Window
// rules follow PyTorch's CPU kernels exactly, including the last window under ceil_mode and the
// NaN rule of max pooling (a NaN wins).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_kernels.h"
#include "gemm.h"
#include "loops.h"
#include "pool_row.h"

namespace tvc::cpu {
namespace {

struct PlaneGeom {
  int64_t N, C, H, W, Ho, Wo;
};

PlaneGeom plane_geom(const Tensor& in, const Tensor& out) {
  return {in.shape()[0], in.shape()[1], in.shape()[2], in.shape()[3], out.shape()[2], out.shape()[3]};
}

// The input positions under output (oh, ow): rows h0, h0+dh, ... < h1 and columns likewise;
// divisor is what an average divides the window's sum by.
struct Window {
  int64_t h0, h1, dh, w0, w1, dw;
  double divisor;
};

inline Window max_window(const Pool2dParams& p, const PlaneGeom& g, int64_t oh, int64_t ow) {
  Window win{};
  win.dh = p.dilation[0], win.dw = p.dilation[1];
  win.h0 = oh * p.stride[0] - p.padding[0];
  win.w0 = ow * p.stride[1] - p.padding[1];
  win.h1 = std::min(win.h0 + (p.kernel[0] - 1) * win.dh + 1, g.H);
  win.w1 = std::min(win.w0 + (p.kernel[1] - 1) * win.dw + 1, g.W);
  while (win.h0 < 0) win.h0 += win.dh;
  while (win.w0 < 0) win.w0 += win.dw;
  win.divisor = 1;
  return win;
}

// PyTorch's rule: the pool size counts padding but not what lies past it (the last window
// under ceil_mode), then the window is clipped to the input.
inline Window avg_window(const Pool2dParams& p, const PlaneGeom& g, int64_t oh, int64_t ow) {
  Window win{};
  win.dh = win.dw = 1;
  win.h0 = oh * p.stride[0] - p.padding[0];
  win.w0 = ow * p.stride[1] - p.padding[1];
  win.h1 = std::min(win.h0 + p.kernel[0], g.H + p.padding[0]);
  win.w1 = std::min(win.w0 + p.kernel[1], g.W + p.padding[1]);
  int64_t pool_size = (win.h1 - win.h0) * (win.w1 - win.w0);
  win.h0 = std::max<int64_t>(win.h0, 0), win.w0 = std::max<int64_t>(win.w0, 0);
  win.h1 = std::min(win.h1, g.H), win.w1 = std::min(win.w1, g.W);
  if (p.divisor_override)
    win.divisor = static_cast<double>(p.divisor_override);
  else if (p.count_include_pad)
    win.divisor = static_cast<double>(pool_size);
  else
    win.divisor = static_cast<double>((win.h1 - win.h0) * (win.w1 - win.w0));
  return win;
}

// start = floor(i * In / Out), end = ceil((i + 1) * In / Out).
inline Window adaptive_window(const Pool2dParams&, const PlaneGeom& g, int64_t oh, int64_t ow) {
  Window win{};
  win.dh = win.dw = 1;
  win.h0 = oh * g.H / g.Ho;
  win.h1 = ((oh + 1) * g.H + g.Ho - 1) / g.Ho;
  win.w0 = ow * g.W / g.Wo;
  win.w1 = ((ow + 1) * g.W + g.Wo - 1) / g.Wo;
  win.divisor = static_cast<double>((win.h1 - win.h0) * (win.w1 - win.w0));
  return win;
}

// Rough work per plane, for the decision to use threads (adaptive windows have no kernel size).
int64_t plane_work(const Pool2dParams& p, const PlaneGeom& g) {
  return g.H * g.W + g.Ho * g.Wo * p.kernel[0] * p.kernel[1];
}

using WindowFn = Window (*)(const Pool2dParams&, const PlaneGeom&, int64_t, int64_t);

// Calls body(n, c) for every plane, split over threads.
template <typename F>
void for_planes(const PlaneGeom& g, int64_t work_per_plane, F&& body) {
  parallel_for(g.N * g.C, work_per_plane, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) body(it / g.C, it % g.C);
  });
}

template <typename T>
T* plane_ptr(const Tensor& t, int64_t n, int64_t c) {
  return static_cast<T*>(t.raw_data()) + n * t.strides()[0] + c * t.strides()[1];
}

// ---------------------------------------------------------------- forward

// The length of max_plane_values's row of column maxima: from the left padding to the last
// window's end, and at least to the input row's end.
int64_t padded_row_length(const Pool2dParams& p, const PlaneGeom& g) {
  return std::max(p.padding[1] + g.W, (g.Wo - 1) * p.stride[1] + (p.kernel[1] - 1) * p.dilation[1] + 1);
}

// Max of one plane, with its int64 indices when ip is given (training). Each output row's window
// rows are first reduced column by column into rows_max (its W values after the left padding,
// every other value -inf; the first row copied, as its max with -inf is itself, NaNs included),
// then each output takes the max of its window's columns there, tap by tap over the whole output
// row (best, Wo values). Max ignores the -inf padding (every window holds an input column) and
// both steps keep the NaN rule, so every value equals the windowed scan's. (The copy and
// max_into's last partial vectors masked: ResNet's 3x3 stride-2 pool from 112x112 at batch 1,
// Sapphire Rapids, 2 threads, 0.155-0.160 -> 0.123 ms; batch 8 0.75-0.85x.)
//
// The indices follow PyTorch's scan (window rows, then columns, in order; a greater value or a NaN
// replaces the best): the first position in that order holding the maximum, or the last NaN. So
// the taps are visited in reverse order, each taking an output whose best it equals (every window
// without a NaN holds its maximum) or, for a NaN best, the first NaN met (the scan's last); tap
// numbers in `tap` (int32, so that the loop vectorises with the float compare). A window without
// an input position keeps the scan's start. The output is then the input at the index, so its
// bits are the scan's too (the sign of a zero maximum, a NaN's payload). taps: each tap's offsets
// (max_taps); rows_max holds padded_row_length values; best and tap Wo.
struct TapOffsets {
  int64_t index, x;  // from the window's top-left corner (padding included): in the index, in x
};
std::vector<TapOffsets> max_taps(const Pool2dParams& p, const PlaneGeom& g, int64_t xs2, int64_t xs3) {
  std::vector<TapOffsets> taps;
  for (int64_t i = 0; i < p.kernel[0]; ++i)
    for (int64_t j = 0; j < p.kernel[1]; ++j) {
      const int64_t di = i * p.dilation[0], dj = j * p.dilation[1];
      taps.push_back({di * g.W + dj, di * xs2 + dj * xs3});
    }
  return taps;
}

// max_plane's two steps for one output row: the window's input rows (count of them, in order, W
// values each at a stride of xs3) reduced column by column into rows_max's W values after the left
// padding (the first row copied where it is float and dense), then best[ow] (Wo values) the max of
// its window's columns there, tap by tap. rows_max: padded_row_length values, -inf outside those W.
template <typename T>
void max_row(const T* const* rows, int64_t count, int64_t xs3, const Pool2dParams& p, const PlaneGeom& g,
             compute_t<T>* rows_max, compute_t<T>* best) {
  using C = compute_t<T>;
  constexpr C lowest = -std::numeric_limits<C>::infinity();
  C* row = rows_max + p.padding[1];
  auto take = [](C& acc, C v) { acc = (v > acc || v != v) ? v : acc; };
  int64_t h = 0;
  if (std::is_same_v<T, C> && xs3 == 1 && count > 0) {  // the first row as it is: the max of -inf and it
    std::copy(rows[0], rows[0] + g.W, row);
    h = 1;
  } else {
    std::fill(row, row + g.W, lowest);
  }
  for (; h < count; ++h) {
    const T* xrow = rows[h];
    if constexpr (std::is_same_v<T, float>)
      max_into(g.W, xrow, xs3, row);  // the instruction set's kernel, the same rule
    else if (xs3 == 1)                // contiguous rows: a loop the compiler vectorises
      for (int64_t w = 0; w < g.W; ++w) take(row[w], static_cast<C>(xrow[w]));
    else
      for (int64_t w = 0; w < g.W; ++w) take(row[w], static_cast<C>(xrow[w * xs3]));
  }
  std::fill(best, best + g.Wo, lowest);
  for (int64_t j = 0; j < p.kernel[1]; ++j) {
    const C* from = rows_max + j * p.dilation[1];
    if constexpr (std::is_same_v<C, float>)
      max_into(g.Wo, from, p.stride[1], best);
    else
      for (int64_t ow = 0; ow < g.Wo; ++ow) take(best[ow], from[ow * p.stride[1]]);
  }
}

template <typename T>
void max_plane(const T* xp, int64_t xs2, int64_t xs3, const Pool2dParams& p, const PlaneGeom& g, T* yp, int64_t ys2,
               int64_t ys3, int64_t* ip, int64_t is2, int64_t is3, const TapOffsets* taps, compute_t<T>* rows_max,
               compute_t<T>* best, int32_t* tap) {
  using C = compute_t<T>;
  constexpr int32_t none = -1;
  const int64_t stride = p.stride[1], dilation = p.dilation[1];
  std::fill(rows_max, rows_max + padded_row_length(p, g), -std::numeric_limits<C>::infinity());
  std::vector<const T*> rows(p.kernel[0]);
  for (int64_t oh = 0; oh < g.Ho; ++oh) {
    const Window window = max_window(p, g, oh, 0);
    int64_t count = 0;
    for (int64_t h = window.h0; h < window.h1; h += window.dh) rows[count++] = xp + h * xs2;
    max_row(rows.data(), count, xs3, p, g, rows_max, best);
    if (!ip) {
      if (std::is_same_v<T, C> && ys3 == 1)
        std::copy(best, best + g.Wo, yp + oh * ys2);
      else
        for (int64_t ow = 0; ow < g.Wo; ++ow) yp[oh * ys2 + ow * ys3] = static_cast<T>(best[ow]);
      continue;
    }
    std::fill(tap, tap + g.Wo, none);
    for (int64_t i = p.kernel[0] - 1; i >= 0; --i) {
      const int64_t h = oh * p.stride[0] - p.padding[0] + i * p.dilation[0];
      if (h < 0 || h >= g.H) continue;
      for (int64_t j = p.kernel[1] - 1; j >= 0; --j) {
        const int64_t offset = j * dilation - p.padding[1];  // w = ow * stride + offset
        const int64_t lo = std::max<int64_t>(0, (-offset + stride - 1) / stride),
                      hi = std::min(g.Wo, offset < g.W ? (g.W - offset + stride - 1) / stride : 0);
        const T* x = xp + h * xs2 + offset * xs3;
        const int32_t t = static_cast<int32_t>(i * p.kernel[1] + j);
        for (int64_t ow = lo; ow < hi; ++ow) {
          const C v = static_cast<C>(x[ow * stride * xs3]), b = best[ow];
          const bool first_nan = v != v && b != b && tap[ow] == none;
          tap[ow] = v == b || first_nan ? t : tap[ow];
        }
      }
    }
    const int64_t top = oh * p.stride[0] - p.padding[0];  // the window's first row, maybe padding
    for (int64_t ow = 0; ow < g.Wo; ++ow) {
      const int64_t left = ow * stride - p.padding[1];
      if (tap[ow] == none) {
        const Window win = max_window(p, g, oh, ow);
        ip[oh * is2 + ow * is3] = win.h0 * g.W + win.w0;
        yp[oh * ys2 + ow * ys3] = static_cast<T>(best[ow]);
        continue;
      }
      const TapOffsets& o = taps[tap[ow]];
      ip[oh * is2 + ow * is3] = top * g.W + left + o.index;
      yp[oh * ys2 + ow * ys3] = xp[top * xs2 + left * xs3 + o.x];
    }
  }
}

// Max pooling without indices of a channels-last float32 x into a channels-last y (both with
// the channels of a position contiguous, so each row of x is W * C contiguous values and each
// row of y Wo * C), one output row at a time as max_plane does a plane's: the window's rows
// reduced position by position into rows_max (a padded row of positions, -inf in the padding; the
// first row copied), then each output's window columns from there, tap by tap. Every value comes
// from the same comparisons in the same order as on the planes' path, so its bits are those of
// the NCHW input's; x is read along its rows, where the planes' path reads each channel's plane
// at a stride of C values, a cache line for each value. ResNet's 3x3 stride-2 pool of 64 channels
// from 112x112, Sapphire Rapids, 2 threads: 3.1 -> 0.13 ms at batch 1, 27.7 -> 2.0 ms at batch 8
// (NCHW: 0.13 and 2.2 ms); with indices (below) 5.0 -> 0.36 and 40.6 -> 3.4 ms, the gradient
// (max_backward_channels_last) 5.5 -> 0.69 and 34.2 -> 4.6 ms.
void max_rows_channels_last(const Tensor& x, const Tensor& y, const Pool2dParams& p, const PlaneGeom& g) {
  constexpr float lowest = -std::numeric_limits<float>::infinity();
  const float* xp = static_cast<const float*>(x.raw_data());
  float* yp = static_cast<float*>(y.raw_data());
  const int64_t xs0 = x.strides()[0], xs2 = x.strides()[2], ys0 = y.strides()[0], ys2 = y.strides()[2];
  const int64_t length = padded_row_length(p, g) * g.C, row_values = g.W * g.C;
  const int64_t work = p.kernel[0] * row_values + g.Wo * p.kernel[1] * g.C;
  parallel_for(g.N * g.Ho, work, [&](int64_t b, int64_t e) {
    std::vector<float> rows_max(length, lowest);
    float* row = rows_max.data() + p.padding[1] * g.C;
    for (int64_t it = b; it < e; ++it) {
      const int64_t n = it / g.Ho, oh = it % g.Ho;
      const Window rows = max_window(p, g, oh, 0);
      int64_t h = rows.h0;
      if (h < rows.h1) {
        std::copy_n(xp + n * xs0 + h * xs2, row_values, row);
        h += rows.dh;
      } else {
        std::fill_n(row, row_values, lowest);
      }
      for (; h < rows.h1; h += rows.dh) max_into(row_values, xp + n * xs0 + h * xs2, 1, row);
      float* out = yp + n * ys0 + oh * ys2;
      for (int64_t ow = 0; ow < g.Wo; ++ow) {
        float* best = out + ow * g.C;
        std::fill_n(best, g.C, lowest);
        for (int64_t j = 0; j < p.kernel[1]; ++j)
          max_into(g.C, rows_max.data() + (ow * p.stride[1] + j * p.dilation[1]) * g.C, 1, best);
      }
    }
  });
}

// Whether t (N, C, H, W) has each position's channels contiguous and each row's positions
// contiguous: a row of t is W * C contiguous values.
bool rows_of_positions(const Tensor& t) { return t.strides()[1] == 1 && t.strides()[3] == t.shape()[1]; }

// Max pooling with indices (PyTorch's scan, as the planes' generic path: each window's positions
// in row-major order, a greater value or a NaN replacing the best) of a channels-last x into a
// channels-last y and indices, each output position's channels side by side, so x is read a
// position's channels at a time rather than a plane at a stride of C. Position: the indices'
// type during the scan, int32 where a plane's positions fit (so that the loop over channels
// vectorises with the compares of float32 values), else int64.
template <typename T, WindowFn window, typename Position>
void max_scan_channels_last(const Tensor& x, const Tensor& y, const Tensor& idx, const Pool2dParams& p,
                            const PlaneGeom& g) {
  using C = compute_t<T>;
  const T* xp = static_cast<const T*>(x.raw_data());
  T* yp = static_cast<T*>(y.raw_data());
  int64_t* ip = static_cast<int64_t*>(idx.raw_data());
  const int64_t xs0 = x.strides()[0], xs2 = x.strides()[2], xs3 = x.strides()[3];
  parallel_for(g.N * g.Ho, plane_work(p, g) * g.C / std::max<int64_t>(g.Ho, 1), [&](int64_t b, int64_t e) {
    std::vector<C> best(g.C);
    std::vector<Position> best_at(g.C);
    for (int64_t it = b; it < e; ++it) {
      const int64_t n = it / g.Ho, oh = it % g.Ho;
      for (int64_t ow = 0; ow < g.Wo; ++ow) {
        const Window win = window(p, g, oh, ow);
        std::fill(best.begin(), best.end(), -std::numeric_limits<C>::infinity());
        std::fill(best_at.begin(), best_at.end(), static_cast<Position>(win.h0 * g.W + win.w0));
        for (int64_t h = win.h0; h < win.h1; h += win.dh)
          for (int64_t w = win.w0; w < win.w1; w += win.dw) {
            const T* xv = xp + n * xs0 + h * xs2 + w * xs3;
            const auto at = static_cast<Position>(h * g.W + w);
            for (int64_t c = 0; c < g.C; ++c) {
              const C v = static_cast<C>(xv[c]);
              const bool take = v > best[c] || v != v;
              best[c] = take ? v : best[c];
              best_at[c] = take ? at : best_at[c];
            }
          }
        T* yo = yp + n * y.strides()[0] + oh * y.strides()[2] + ow * y.strides()[3];
        int64_t* io = ip + n * idx.strides()[0] + oh * idx.strides()[2] + ow * idx.strides()[3];
        for (int64_t c = 0; c < g.C; ++c) yo[c] = static_cast<T>(best[c]), io[c] = best_at[c];
      }
    }
  });
}

// in = (x) -> out (values[, int64 indices]): the indices only when the caller asks for them
// (autograd needs them for the backward).
struct MaxForward {
  template <typename T, WindowFn window>
  static void run(const KernelArgs& args, const Pool2dParams& p) {
    const Tensor& x = args.in[0];
    const Tensor& y = args.out[0];
    using C = compute_t<T>;
    PlaneGeom g = plane_geom(x, y);
    int64_t xs2 = x.strides()[2], xs3 = x.strides()[3], ys2 = y.strides()[2], ys3 = y.strides()[3];
    const bool indexed = args.out.size() == 2;
    const Tensor idx = indexed ? args.out[1] : Tensor();
    const int64_t is2 = indexed ? idx.strides()[2] : 0, is3 = indexed ? idx.strides()[3] : 0;
    if (rows_of_positions(x) && rows_of_positions(y)) {
      if constexpr (std::is_same_v<T, float>)
        if (!indexed && window == max_window) return max_rows_channels_last(x, y, p, g);
      if (indexed && rows_of_positions(idx))
        return g.H * g.W <= std::numeric_limits<int32_t>::max()
                   ? max_scan_channels_last<T, window, int32_t>(x, y, idx, p, g)
                   : max_scan_channels_last<T, window, int64_t>(x, y, idx, p, g);
    }
    if (window == max_window) {
      parallel_for(g.N * g.C, plane_work(p, g), [&](int64_t b, int64_t e) {
        std::vector<C> rows_max(padded_row_length(p, g)), best(g.Wo);
        std::vector<int32_t> tap(g.Wo);
        const std::vector<TapOffsets> taps = max_taps(p, g, xs2, xs3);
        for (int64_t it = b; it < e; ++it) {
          const int64_t n = it / g.C, c = it % g.C;
          max_plane(plane_ptr<T>(x, n, c), xs2, xs3, p, g, plane_ptr<T>(y, n, c), ys2, ys3,
                    indexed ? plane_ptr<int64_t>(idx, n, c) : nullptr, is2, is3, taps.data(), rows_max.data(),
                    best.data(), tap.data());
        }
      });
      return;
    }
    for_planes(g, plane_work(p, g), [&](int64_t n, int64_t c) {
      const T* xp = plane_ptr<T>(x, n, c);
      T* yp = plane_ptr<T>(y, n, c);
      int64_t* ip = plane_ptr<int64_t>(idx, n, c);
      for (int64_t oh = 0; oh < g.Ho; ++oh)
        for (int64_t ow = 0; ow < g.Wo; ++ow) {
          Window win = window(p, g, oh, ow);
          C best = -std::numeric_limits<C>::infinity();
          int64_t best_i = win.h0 * g.W + win.w0;
          for (int64_t h = win.h0; h < win.h1; h += win.dh)
            for (int64_t w = win.w0; w < win.w1; w += win.dw) {
              C v = static_cast<C>(xp[h * xs2 + w * xs3]);
              if (v > best || std::isnan(v)) best = v, best_i = h * g.W + w;
            }
          yp[oh * ys2 + ow * ys3] = static_cast<T>(best);
          ip[oh * is2 + ow * is3] = best_i;
        }
    });
  }
};

// The average of every whole plane of a dense channels-last x (a global average pool), into y's
// (n, c) elements: each channel's positions summed in order into 8 partial sums combined as
// sum_in_lanes combines them (the same bits as the planes' path), kGlobalChannels channels at a
// time, so that x is read along its rows rather than one channel at a time across all of them.
constexpr int64_t kGlobalChannels = 64;
template <typename T, typename C>
void global_average_channels_last(const Tensor& x, const Tensor& y, const PlaneGeom& g, C divisor) {
  // chunks of equal width (a multiple of 16 channels where that fits)
  const int64_t chunks = (g.C + kGlobalChannels - 1) / kGlobalChannels, positions = g.H * g.W;
  const int64_t width = std::min(kGlobalChannels, ((g.C + chunks - 1) / chunks + 15) / 16 * 16);
  const T* xp = static_cast<const T*>(x.raw_data());
  T* yp = static_cast<T*>(y.raw_data());
  parallel_for(g.N * chunks, positions * kGlobalChannels, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const int64_t n = it / chunks, c0 = it % chunks * width, count = std::min(width, g.C - c0);
      C acc[8][kGlobalChannels] = {};
      const T* xn = xp + n * x.strides()[0] + c0;
      for (int64_t q = 0; q < positions; ++q) {
        C* a = acc[q % 8];
        const T* row = xn + q * g.C;
        for (int64_t c = 0; c < count; ++c) a[c] += static_cast<C>(row[c]);
      }
      for (int64_t c = 0; c < count; ++c) {
        const C sum =
            ((acc[0][c] + acc[1][c]) + (acc[2][c] + acc[3][c])) + ((acc[4][c] + acc[5][c]) + (acc[6][c] + acc[7][c]));
        yp[n * y.strides()[0] + (c0 + c) * y.strides()[1]] = static_cast<T>(sum / divisor);
      }
    }
  });
}

// The average of every whole plane of an x whose planes are dense (a global average pool of
// NCHW), into y's (n, c) elements: each plane summed as the planes' path sums a window of whole
// rows (sum_in_lanes over the plane as one run; the same bits), with the pointers and strides
// read once rather than per plane and output (a squeeze-excitation block's pool at batch 8,
// [8, 1152, 7, 7], 0.35 ms on one thread before, Zen 4).
template <typename T, typename C>
void global_average_planes(const Tensor& x, const Tensor& y, const PlaneGeom& g, C divisor) {
  const T* xp = static_cast<const T*>(x.raw_data());
  T* yp = static_cast<T*>(y.raw_data());
  const int64_t xs0 = x.strides()[0], xs1 = x.strides()[1], ys0 = y.strides()[0], ys1 = y.strides()[1];
  const int64_t positions = g.H * g.W;
  parallel_for(g.N * g.C, positions, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const int64_t n = it / g.C, c = it % g.C;
      const T* plane = xp + n * xs0 + c * xs1;
      const C sum = sum_in_lanes<C>(positions, [&](int64_t i) { return static_cast<C>(plane[i]); });
      yp[n * ys0 + c * ys1] = static_cast<T>(sum / divisor);
    }
  });
}

// Whether every window is the 2x2 block at (2 oh, 2 ow) with one divisor (average pooling of
// kernel 2, stride 2 and no padding; adaptive pooling to half the size): DenseNet's transitions.
// A window's rows depend on oh only and its columns on ow only.
bool windows_are_2x2_blocks(const Pool2dParams& p, const PlaneGeom& g, WindowFn window) {
  if (g.Ho == 0 || g.Wo == 0) return false;
  const double divisor = window(p, g, 0, 0).divisor;
  for (int64_t oh = 0; oh < g.Ho; ++oh) {
    const Window win = window(p, g, oh, 0);
    if (win.h0 != 2 * oh || win.h1 != 2 * oh + 2 || win.divisor != divisor) return false;
  }
  for (int64_t ow = 0; ow < g.Wo; ++ow) {
    const Window win = window(p, g, 0, ow);
    if (win.w0 != 2 * ow || win.w1 != 2 * ow + 2 || win.divisor != divisor) return false;
  }
  return true;
}

// The averages of 2x2 blocks (see windows_are_2x2_blocks), plane by plane, with the sums the
// windows' path makes (each row's pair as sum_in_lanes sums two values: from zero, in lanes 0
// and 1, then with the six zero lanes; the rows from zero, in order): the same bits, without a
// window's bounds and a loop per output.
template <typename T, typename C>
void average_2x2_blocks(const Tensor& x, const Tensor& y, const PlaneGeom& g, C divisor) {
  const int64_t xs2 = x.strides()[2], xs3 = x.strides()[3], ys2 = y.strides()[2], ys3 = y.strides()[3];
  auto pair = [](const T* v, int64_t step) {
    return (((C(0) + static_cast<C>(v[0])) + (C(0) + static_cast<C>(v[step]))) + C(0)) + C(0);
  };
  for_planes(g, 4 * g.Ho * g.Wo, [&](int64_t n, int64_t c) {
    const T* xp = plane_ptr<T>(x, n, c);
    T* yp = plane_ptr<T>(y, n, c);
    for (int64_t oh = 0; oh < g.Ho; ++oh) {
      const T* top = xp + 2 * oh * xs2;
      const T* bottom = top + xs2;
      T* yr = yp + oh * ys2;
      for (int64_t ow = 0; ow < g.Wo; ++ow)
        yr[ow * ys3] =
            static_cast<T>(((C(0) + pair(top + 2 * ow * xs3, xs3)) + pair(bottom + 2 * ow * xs3, xs3)) / divisor);
    }
  });
}

// in = (x) -> out (averages).
struct AvgForward {
  template <typename T, WindowFn window>
  static void run(const KernelArgs& args, const Pool2dParams& p) {
    const Tensor& x = args.in[0];
    const Tensor& y = args.out[0];
    using C = compute_t<T>;
    PlaneGeom g = plane_geom(x, y);
    int64_t xs2 = x.strides()[2], xs3 = x.strides()[3], ys2 = y.strides()[2], ys3 = y.strides()[3];
    if (g.Ho == 1 && g.Wo == 1 && g.H * g.W > 0) {
      const Window win = window(p, g, 0, 0);
      const bool whole = win.h0 == 0 && win.h1 == g.H && win.w0 == 0 && win.w1 == g.W;
      if (whole && x.strides()[1] == 1 && xs3 == g.C && xs2 == g.W * g.C)
        return global_average_channels_last<T, C>(x, y, g, static_cast<C>(win.divisor));
      if (whole && xs3 == 1 && xs2 == g.W) return global_average_planes<T, C>(x, y, g, static_cast<C>(win.divisor));
    }
    if (windows_are_2x2_blocks(p, g, window))
      return average_2x2_blocks<T, C>(x, y, g, static_cast<C>(window(p, g, 0, 0).divisor));
    for_planes(g, plane_work(p, g), [&](int64_t n, int64_t c) {
      const T* xp = plane_ptr<T>(x, n, c);
      T* yp = plane_ptr<T>(y, n, c);
      for (int64_t oh = 0; oh < g.Ho; ++oh)
        for (int64_t ow = 0; ow < g.Wo; ++ow) {
          Window win = window(p, g, oh, ow);
          // Each window row summed in lanes (loops.h), rows in order; a window of whole rows of a
          // plane with contiguous rows (a global average pool) in lanes as one run.
          C sum = 0;
          const int64_t width = win.w1 - win.w0;
          if (width == g.W && xs3 == 1 && xs2 == g.W && win.h1 > win.h0) {
            const T* run = xp + win.h0 * xs2;
            sum = sum_in_lanes<C>((win.h1 - win.h0) * g.W, [&](int64_t i) { return static_cast<C>(run[i]); });
          } else {
            for (int64_t h = win.h0; h < win.h1; ++h) {
              const T* row = xp + h * xs2 + win.w0 * xs3;
              sum += sum_in_lanes<C>(width, [&](int64_t w) { return static_cast<C>(row[w * xs3]); });
            }
          }
          bool empty = win.h0 >= win.h1 || win.w0 >= win.w1;
          yp[oh * ys2 + ow * ys3] = static_cast<T>(empty ? C(0) : sum / static_cast<C>(win.divisor));
        }
    });
  }
};

// ---------------------------------------------------------------- backward

// Accumulates one plane of the input gradient in a buffer, then stores it through dx's strides.
template <typename T, typename F>
void scatter_planes(const Tensor& dx, const PlaneGeom& g, int64_t work_per_plane, F&& scatter) {
  using C = compute_t<T>;
  int64_t s2 = dx.strides()[2], s3 = dx.strides()[3];
  parallel_for(g.N * g.C, work_per_plane, [&](int64_t b, int64_t e) {
    std::vector<C> buf(g.H * g.W);
    for (int64_t it = b; it < e; ++it) {
      int64_t n = it / g.C, c = it % g.C;
      std::fill(buf.begin(), buf.end(), C(0));
      scatter(n, c, buf.data());
      T* dp = plane_ptr<T>(dx, n, c);
      for (int64_t h = 0; h < g.H; ++h)
        for (int64_t w = 0; w < g.W; ++w) dp[h * s2 + w * s3] = static_cast<T>(buf[h * g.W + w]);
    }
  });
}

// The gradient of a max pool into a dense channels-last dx (each sample H * W * C values) from
// channels-last indices (dy through its strides): each block of a sample's channels zeroed, then
// every output's gradient added at its index in output order, as scatter_planes adds them into a
// plane's buffer (the same sums), a position's channels side by side.
constexpr int64_t kScatterChannels = 64;
template <typename T>
void max_backward_channels_last(const Tensor& dy, const Tensor& idx, const Tensor& dx, const PlaneGeom& g) {
  const T* dyp = static_cast<const T*>(dy.raw_data());
  const int64_t* ip = static_cast<const int64_t*>(idx.raw_data());
  T* dxp = static_cast<T*>(dx.raw_data());
  const int64_t blocks = (g.C + kScatterChannels - 1) / kScatterChannels;
  parallel_for(g.N * blocks, (g.H * g.W + g.Ho * g.Wo) * kScatterChannels, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const int64_t n = it / blocks, c0 = it % blocks * kScatterChannels, c1 = std::min(g.C, c0 + kScatterChannels);
      T* dxn = dxp + n * dx.strides()[0];
      for (int64_t q = 0; q < g.H * g.W; ++q) std::fill(dxn + q * g.C + c0, dxn + q * g.C + c1, T(0));
      for (int64_t oh = 0; oh < g.Ho; ++oh)
        for (int64_t ow = 0; ow < g.Wo; ++ow) {
          const T* d = dyp + n * dy.strides()[0] + oh * dy.strides()[2] + ow * dy.strides()[3];
          const int64_t* at = ip + n * idx.strides()[0] + oh * idx.strides()[2] + ow * idx.strides()[3];
          for (int64_t c = c0; c < c1; ++c) dxn[at[c] * g.C + c] += d[c * dy.strides()[1]];
        }
    }
  });
}

// in = (grad_out, indices) -> out (grad_input).
template <typename T>
void max_backward(const KernelArgs& args) {
  const Tensor& dy = args.in[0];
  const Tensor& idx = args.in[1];
  const Tensor& dx = args.out[0];
  PlaneGeom g = plane_geom(dx, dy);
  if constexpr (std::is_same_v<compute_t<T>, T>)
    if (rows_of_positions(idx) && rows_of_positions(dx) && dx.strides()[2] == g.W * g.C)
      return max_backward_channels_last<T>(dy, idx, dx, g);
  int64_t ys2 = dy.strides()[2], ys3 = dy.strides()[3], is2 = idx.strides()[2], is3 = idx.strides()[3];
  scatter_planes<T>(dx, g, g.Ho * g.Wo, [&](int64_t n, int64_t c, compute_t<T>* buf) {
    const T* dyp = plane_ptr<T>(dy, n, c);
    const int64_t* ip = plane_ptr<int64_t>(idx, n, c);
    for (int64_t oh = 0; oh < g.Ho; ++oh)
      for (int64_t ow = 0; ow < g.Wo; ++ow)
        buf[ip[oh * is2 + ow * is3]] += static_cast<compute_t<T>>(dyp[oh * ys2 + ow * ys3]);
  });
}

// in = (grad_out) -> out (grad_input).
struct AvgBackward {
  template <typename T, WindowFn window>
  static void run(const KernelArgs& args, const Pool2dParams& p) {
    const Tensor& dy = args.in[0];
    const Tensor& dx = args.out[0];
    using C = compute_t<T>;
    PlaneGeom g = plane_geom(dx, dy);
    int64_t ys2 = dy.strides()[2], ys3 = dy.strides()[3];
    scatter_planes<T>(dx, g, plane_work(p, g), [&](int64_t n, int64_t c, C* buf) {
      const T* dyp = plane_ptr<T>(dy, n, c);
      for (int64_t oh = 0; oh < g.Ho; ++oh)
        for (int64_t ow = 0; ow < g.Wo; ++ow) {
          Window win = window(p, g, oh, ow);
          C v = static_cast<C>(dyp[oh * ys2 + ow * ys3]) / static_cast<C>(win.divisor);
          for (int64_t h = win.h0; h < win.h1; ++h)
            for (int64_t w = win.w0; w < win.w1; ++w) buf[h * g.W + w] += v;
        }
    });
  }
};

// ---------------------------------------------------------------- registration

const Pool2dParams& params_or_none(const KernelArgs& args) {
  static const Pool2dParams none{};
  return args.params ? args.p<Pool2dParams>() : none;
}

// Dispatches Kernel::run<T, window> over the floating dtypes.
template <Op op, typename Kernel, WindowFn window>
void windowed_kernel(const KernelArgs& args) {
  dispatch_floating(args.in[0].dtype(), op,
                    [&]<typename T>() { Kernel::template run<T, window>(args, params_or_none(args)); });
}

template <Op op>
void max_backward_kernel(const KernelArgs& args) {
  dispatch_floating(args.in[0].dtype(), op, [&]<typename T>() { max_backward<T>(args); });
}

}  // namespace

MaxPoolRows max_pool_rows(const Pool2dParams& p, int64_t H, int64_t oh) {
  const Window window = max_window(p, {0, 0, H, 0, 0, 0}, oh, 0);
  return {window.h0, window.h1, window.dh};
}
int64_t max_pool_row_floats(const Pool2dParams& p, int64_t W, int64_t Wo) {
  return padded_row_length(p, {0, 0, 0, W, 0, Wo});
}
void max_pool_row(const float* const* rows, int64_t count, const Pool2dParams& p, int64_t W, int64_t Wo,
                  float* rows_max, float* y) {
  max_row(rows, count, 1, p, {0, 0, 0, W, 0, Wo}, rows_max, y);
}

void register_pool_kernels(KernelRegistry& r) {
  r.set(Op::max_pool2d, Device::CPU, windowed_kernel<Op::max_pool2d, MaxForward, max_window>);
  r.set(Op::max_pool2d_backward, Device::CPU, max_backward_kernel<Op::max_pool2d_backward>);
  r.set(Op::avg_pool2d, Device::CPU, windowed_kernel<Op::avg_pool2d, AvgForward, avg_window>);
  r.set(Op::avg_pool2d_backward, Device::CPU, windowed_kernel<Op::avg_pool2d_backward, AvgBackward, avg_window>);
  r.set(Op::adaptive_avg_pool2d, Device::CPU, windowed_kernel<Op::adaptive_avg_pool2d, AvgForward, adaptive_window>);
  r.set(Op::adaptive_avg_pool2d_backward, Device::CPU,
        windowed_kernel<Op::adaptive_avg_pool2d_backward, AvgBackward, adaptive_window>);
  r.set(Op::adaptive_max_pool2d, Device::CPU, windowed_kernel<Op::adaptive_max_pool2d, MaxForward, adaptive_window>);
  r.set(Op::adaptive_max_pool2d_backward, Device::CPU, max_backward_kernel<Op::adaptive_max_pool2d_backward>);
}

}  // namespace tvc::cpu
