// CPU kernels: conv2d forward and its backward w.r.t. input and weight.
//
// Shape legend: N batch, C input channels, O output channels, G groups, Cg = C/G input and
// Og = O/G output channels per group, H,W input size, kh,kw kernel size, Ho,Wo output size,
// P = Ho*Wo output positions, K = Cg*kh*kw (the GEMM inner dim).
//
// General path: im2col lowers one (sample, group) to a (K, P) matrix and the CPU GEMM multiplies
// the (Og, K) weight by it; backward w.r.t. input runs the GEMM transposed into a (K, P) matrix
// and col2im scatters it back. Small maps put several samples side by side in one (K, m*P)
// matrix (samples_per_gemm). 1x1, stride-1, unpadded convs use the input itself as the (K, P)
// matrix. float32 3x3 stride-1 convs with enough channels and outputs take Winograd F(4x4, 3x3)
// instead (use_winograd: transforms per 4x4 output tile, 36 GEMMs of (O, C) by (C, tiles)).
// Depthwise convs (Cg == 1) use direct loops, as a GEMM with K = kh*kw is slow: a float32
// plane, zero-padded, goes to the instruction set's row kernel as one long row (depthwise_row,
// gemm_kernels.h).
// Tensors may have any strides (channels-last included): the kernels read and write through
// them, so the output keeps whatever layout the caller allocated.
//
// Forward outputs pass through an epilogue (Epilogue: a per-channel scale and shift, a residual,
// an activation; conv2d's bias is its shift alone): inside the GEMM on each finished block while
// it is in cache when the GEMM writes y itself, per plane for depthwise convs, else after the
// copy into y. conv2d_epilogue (an eval-mode conv, batch norm and activation) is this kernel with
// the whole epilogue.
//
// inverted_residual (a MobileNet or EfficientNet block's 1x1 expansion, depthwise layer and 1x1
// projection) runs these convolutions over bands of output rows or groups of whole maps, each on
// one thread, the expanded and depthwise rows in the thread's scratch (inverted_residual_forward).
//
// bfloat16 inputs and weights (other than depthwise) go through the GEMM's bfloat16 form: float32
// sums into a float32 block, the epilogue in float32, stored as bfloat16 (rounded once) or as
// float32 (a float32 input with a bfloat16 weight, the input rounded by the op).
//
// Work is split over (samples, group) items, each computed by one thread in a fixed order, and
// the weight gradient sums per-chunk partials (fixed chunks of the batch) in chunk order, so
// results do not depend on the thread count.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "cpu_kernels.h"
#include "gemm.h"
#include "loops.h"
#include "pool_row.h"
#include "weight_form.h"

namespace tvc::cpu {
namespace {

struct ConvGeom {
  int64_t N, C, H, W, O, G, Cg, Og, kh, kw, Ho, Wo, P, K;
  int64_t sh, sw, ph, pw, dh, dw;
  bool keep_weight_forms;  // Conv2dParams'
};

// in_shape (N,C,H,W), weight_shape (O,Cg,kh,kw), out_shape (N,O,Ho,Wo).
ConvGeom conv_geom(const Shape& in, const Shape& wt, const Shape& out, const Conv2dParams& p) {
  ConvGeom g{};
  g.N = in[0], g.C = in[1], g.H = in[2], g.W = in[3];
  g.O = wt[0], g.Cg = wt[1], g.kh = wt[2], g.kw = wt[3];
  g.Ho = out[2], g.Wo = out[3];
  g.G = p.groups;
  g.Og = g.O / g.G;
  g.P = g.Ho * g.Wo;
  g.K = g.Cg * g.kh * g.kw;
  g.sh = p.stride[0], g.sw = p.stride[1];
  g.ph = p.padding[0], g.pw = p.padding[1];
  g.dh = p.dilation[0], g.dw = p.dilation[1];
  g.keep_weight_forms = p.keep_weight_forms;
  return g;
}

// Output positions o in [lo, hi) for which the input index o*stride - pad + off is in [0, in).
struct Range {
  int64_t lo, hi;
};
Range valid_range(int64_t off, int64_t stride, int64_t pad, int64_t in, int64_t out) {
  int64_t first = pad - off;  // o*stride >= first
  int64_t lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  int64_t last = in - 1 + pad - off;  // o*stride <= last
  int64_t hi = last < 0 ? 0 : last / stride + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
  return {lo, hi};
}

bool is_pointwise(const ConvGeom& g) {
  return g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
}

// A 4-d operand: base pointer and element strides.
template <typename T>
struct Operand {
  T* p;
  int64_t s[4];
};
template <typename T>
Operand<T> operand(const Tensor& t) {
  return {static_cast<T*>(t.raw_data()), {t.strides()[0], t.strides()[1], t.strides()[2], t.strides()[3]}};
}

// ---------------------------------------------------------------- epilogue

// What happens to each convolution output before it is stored: the per-output-channel affine
// map z = acc * scale[o] + shift[o] (either may be null: 1 and 0), plus the residual's element
// when there is one, then the activation. Plain conv2d has shift = its bias and nothing else.
// T is the type of the sums (float32 for bfloat16 convolutions), R the residual's.
template <typename T, typename R = T>
struct Epilogue {
  const T* scale = nullptr;
  const T* shift = nullptr;
  const R* residual = nullptr;  // with the output's shape, strides rs
  int64_t rs[4] = {};
  EpilogueActivation activation = EpilogueActivation::None;

  bool is_identity() const { return !scale && !shift && !residual && activation == EpilogueActivation::None; }
};

// The activation over n contiguous values, in place; NaN stays NaN (the comparisons are false
// for it). Written as selects, which compile to vector blends.
template <typename T>
void activate(EpilogueActivation a, int64_t n, T* v) {
  switch (a) {
    case EpilogueActivation::None:
      return;
    case EpilogueActivation::ReLU:
      for (int64_t i = 0; i < n; ++i) v[i] = v[i] < T(0) ? T(0) : v[i];
      return;
    case EpilogueActivation::ReLU6:
      for (int64_t i = 0; i < n; ++i) {
        T x = v[i] < T(0) ? T(0) : v[i];
        v[i] = x > T(6) ? T(6) : x;
      }
      return;
    case EpilogueActivation::Hardswish:
      for (int64_t i = 0; i < n; ++i) {
        T r = v[i] + T(3);
        r = r < T(0) ? T(0) : r;
        r = r > T(6) ? T(6) : r;
        v[i] = v[i] * r / T(6);
      }
      return;
    case EpilogueActivation::SiLU:
      if constexpr (std::is_same_v<T, float>) {
        vector_function(VectorFunction::silu, n, v, v);
      } else {
        for (int64_t i = 0; i < n; ++i) v[i] = v[i] / (T(1) + std::exp(-v[i]));
      }
      return;
  }
}

RowActivation row_activation(EpilogueActivation a) {
  switch (a) {
    case EpilogueActivation::ReLU:
      return RowActivation::relu;
    case EpilogueActivation::ReLU6:
      return RowActivation::relu6;
    case EpilogueActivation::SiLU:
      return RowActivation::silu;
    case EpilogueActivation::Hardswish:
      return RowActivation::hardswish;
    case EpilogueActivation::None:
      break;
  }
  return RowActivation::none;
}

// The residual's values at positions p0 .. p0 + len - 1 of channel o of sample n when they are
// contiguous, else null.
template <typename T, typename R>
const R* residual_run(const Epilogue<T, R>& e, int64_t n, int64_t o, int64_t p0, int64_t Wo, int64_t len) {
  if (e.rs[3] != 1 || (e.rs[2] != Wo && p0 % Wo + len > Wo)) return nullptr;
  return e.residual + n * e.rs[0] + o * e.rs[1] + p0 / Wo * e.rs[2] + p0 % Wo;
}

// dst[k] = the epilogue of src[k], positions p0 + k (k < len, in row-major (Ho, Wo) order, rows
// Wo long) of channel o of sample n; src and dst contiguous, possibly the same. Float32 (with a
// float32 residual, its values there gathered into one run where they are not) in one pass of the
// instruction set's kernel; else in place in dst.
template <typename T, typename R>
void epilogue_positions(const Epilogue<T, R>& e, int64_t n, int64_t o, int64_t p0, int64_t Wo, const T* src, T* dst,
                        int64_t len) {
  if (e.is_identity()) {
    if (src != dst) std::copy(src, src + len, dst);
    return;
  }
  if constexpr (std::is_same_v<T, float> && std::is_same_v<R, float>) {
    const float* r = e.residual ? residual_run(e, n, o, p0, Wo, len) : nullptr;
    if (e.residual && !r) {
      // A residual whose values here are not one run (channels-last) is gathered into one, so that
      // the instruction set's kernel makes the sums, rounded as for an NCHW residual (the loop
      // below multiplies and adds apart where the kernel has one FMA).
      float* run = thread_scratch<float, 12>(len);
      const float* plane = e.residual + n * e.rs[0] + o * e.rs[1];
      for (int64_t k = 0, h = p0 / Wo, w = p0 % Wo; k < len; ++k) {
        run[k] = plane[h * e.rs[2] + w * e.rs[3]];
        if (++w == Wo) w = 0, ++h;
      }
      r = run;
    }
    return epilogue_row(len, src, dst, e.scale ? e.scale + o : nullptr, e.shift ? e.shift + o : nullptr, r,
                        row_activation(e.activation));
  }
  if (src != dst) std::copy(src, src + len, dst);
  T* v = dst;
  const T s = e.scale ? e.scale[o] : T(1), b = e.shift ? e.shift[o] : T(0);
  if (e.scale)
    for (int64_t k = 0; k < len; ++k) v[k] = v[k] * s + b;
  else if (e.shift)
    for (int64_t k = 0; k < len; ++k) v[k] += b;
  if (e.residual) {
    const R* r = e.residual + n * e.rs[0] + o * e.rs[1];
    if (e.rs[3] == 1 && e.rs[2] == Wo) {
      for (int64_t k = 0; k < len; ++k) v[k] += r[p0 + k];
    } else {
      for (int64_t k = 0, h = p0 / Wo, w = p0 % Wo; k < len; ++k) {
        v[k] += r[h * e.rs[2] + w * e.rs[3]];
        if (++w == Wo) w = 0, ++h;
      }
    }
  }
  activate(e.activation, len, v);
}

// v[c * step] = the epilogue of channel o0 + c (c < count) at position p of sample n, in place;
// tmp holds count values.
template <typename T>
void epilogue_position_channels(const Epilogue<T>& e, int64_t n, int64_t p, int64_t Wo, int64_t o0, T* v, int64_t step,
                                int64_t count, T* tmp) {
  T* run = step == 1 ? v : tmp;
  const T* r = e.residual ? e.residual + n * e.rs[0] + o0 * e.rs[1] + p / Wo * e.rs[2] + p % Wo * e.rs[3] : nullptr;
  for (int64_t c = 0; c < count; ++c) {
    T z = v[c * step];
    if (e.scale) z *= e.scale[o0 + c];
    if (e.shift) z += e.shift[o0 + c];
    if (r) z += r[c * e.rs[1]];
    run[c] = z;
  }
  activate(e.activation, count, run);
  if (step != 1)
    for (int64_t c = 0; c < count; ++c) v[c * step] = run[c];
}

// Row oh of output channel o of sample n, Wo sums at row (which may be overwritten), through the
// epilogue into its place in yo (that channel's plane of y, strides ys).
void store_output_row(const Epilogue<float>& e, int64_t n, int64_t o, int64_t oh, int64_t Wo, float* row, float* yo,
                      const int64_t* ys) {
  if (ys[3] == 1) return epilogue_positions(e, n, o, oh * Wo, Wo, row, yo + oh * ys[2], Wo);
  epilogue_positions(e, n, o, oh * Wo, Wo, row, row, Wo);
  for (int64_t ow = 0; ow < Wo; ++ow) yo[oh * ys[2] + ow * ys[3]] = row[ow];
}

// Whether the epilogue's residual, if any, has its channels contiguous (channels-last).
template <typename T, typename R>
bool channels_last_residual(const Epilogue<T, R>& e) {
  return !e.residual || e.rs[1] == 1;
}

// dst = the epilogue of src at positions p0 .. p0 + rows - 1 (row-major (Ho, Wo) order) of sample
// n, channels o0 .. o0 + count - 1 contiguous in each position's row of src and dst (row strides
// src_rs, dst_rs; dst may be src), in one pass of the instruction set's kernel wherever the
// residual's positions are one stride apart (channels_last_residual holds).
void epilogue_channels_last(const Epilogue<float>& e, int64_t n, int64_t p0, int64_t rows, int64_t Wo, int64_t o0,
                            int64_t count, const float* src, int64_t src_rs, float* dst, int64_t dst_rs) {
  const float* scale = e.scale ? e.scale + o0 : nullptr;
  const float* shift = e.shift ? e.shift + o0 : nullptr;
  const RowActivation act = row_activation(e.activation);
  if (!e.residual || e.rs[2] == Wo * e.rs[3]) {
    const float* r = e.residual ? e.residual + n * e.rs[0] + o0 + p0 * e.rs[3] : nullptr;
    return epilogue_channels(rows, count, src, src_rs, dst, dst_rs, scale, shift, r, e.rs[3], act);
  }
  for (int64_t p = p0; p < p0 + rows;) {  // output row by output row
    const int64_t len = std::min(p0 + rows - p, Wo - p % Wo);
    const float* r = e.residual + n * e.rs[0] + o0 + p / Wo * e.rs[2] + p % Wo * e.rs[3];
    epilogue_channels(len, count, src + (p - p0) * src_rs, src_rs, dst + (p - p0) * dst_rs, dst_rs, scale, shift, r,
                      e.rs[3], act);
    p += len;
  }
}

// count channels' runs of len positions (channel c's at src + c * src_rs) into a channels-last y
// (positions ys3 apart, channels contiguous) from position p0 of sample n, channel o0 on,
// transposed, then through the epilogue there (epilogue_channels_last: where the residual's
// channels are contiguous, the caller's check). count of at least kTransposeRowsMin: the
// transposing kernel may write zeros past a row of fewer values than its vector (transpose_copy).
constexpr int64_t kTransposeRowsMin = 16;
void store_transposed(const Epilogue<float>& e, int64_t n, int64_t p0, int64_t len, int64_t Wo, int64_t o0,
                      int64_t count, const float* src, int64_t src_rs, const Operand<float>& y) {
  float* yp = y.p + n * y.s[0] + p0 * y.s[3] + o0;
  transpose_copy(len, count, src, src_rs, yp, y.s[3]);
  if (!e.is_identity()) epilogue_channels_last(e, n, p0, len, Wo, o0, count, yp, y.s[3], yp, y.s[3]);
}

// The epilogue inside the GEMM of one group of samples from n (GemmEpilogue): C's rows are
// channels from o0, its columns positions (y itself, (H, W) flattened to one stride; several
// samples side by side only where y is channels-last and its samples follow each other, P
// positions each).
template <typename T>
struct GemmOutput {
  const Epilogue<T>* e;
  int64_t n, o0, Wo, P;
};
template <typename T>
void epilogue_gemm_block(const void* ctx, T* c, int64_t c_rs, int64_t c_cs, int64_t i0, int64_t m, int64_t j0,
                         int64_t cols) {
  const auto& out = *static_cast<const GemmOutput<T>*>(ctx);
  const Epilogue<T>& e = *out.e;
  // One float32 column with its rows contiguous (a 1x1 map's channels: a squeeze-excitation
  // block) goes as channels-last below, in one call rather than one per element.
  const bool column = std::is_same_v<T, float> && cols == 1 && c_rs == 1 && channels_last_residual(e);
  if (c_cs == 1 && !column) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = j0; j < j0 + cols;) {  // in runs inside one sample
        const int64_t p0 = j % out.P, len = std::min(j0 + cols - j, out.P - p0);
        T* run = c + i * c_rs + (j - j0);
        epilogue_positions(e, out.n + j / out.P, out.o0 + i0 + i, p0, out.Wo, run, run, len);
        j += len;
      }
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (c_rs == 1 && channels_last_residual(e)) {  // channels-last: the block's positions in one pass
      for (int64_t j = j0; j < j0 + cols;) {       // in runs inside one sample
        const int64_t p0 = j % out.P, len = std::min(j0 + cols - j, out.P - p0);
        T* run = c + (j - j0) * c_cs;
        epilogue_channels_last(e, out.n + j / out.P, p0, len, out.Wo, out.o0 + i0, m, run, c_cs, run, c_cs);
        j += len;
      }
      return;
    }
  }
  T* tmp = thread_scratch<T, 4>(m);
  for (int64_t j = 0; j < cols; ++j)
    epilogue_position_channels(e, out.n + (j0 + j) / out.P, (j0 + j) % out.P, out.Wo, out.o0 + i0, c + j * c_cs, c_rs,
                               m, tmp);
}

// The same for a C whose rows are the positions and columns the channels (output positions as rows).
void epilogue_gemm_block_positions(const void* ctx, float* c, int64_t c_rs, int64_t c_cs, int64_t i0, int64_t m,
                                   int64_t j0, int64_t n) {
  epilogue_gemm_block<float>(ctx, c, c_cs, c_rs, j0, n, i0, m);
}

// Where a convolution GEMM's sums go when it does not write y itself (GemmEpilogue): C is the
// item's dense (Og, m*P) block of samples from n0, rows channels from o0; each finished block
// gets the epilogue while in cache and is stored into y (of Y: the sums' type T, or bfloat16 for
// float32 sums, rounded once).
template <typename T, typename Y>
struct ConvBlockOutput {
  const Epilogue<T, Y>* e;
  Operand<Y> y;
  int64_t n0, o0, P, Wo;
};
template <typename T, typename Y>
void epilogue_into(const void* ctx, T* c, int64_t c_rs, int64_t /*c_cs: 1, C is row-major*/, int64_t i0, int64_t rows,
                   int64_t j0, int64_t cols) {
  const auto& out = *static_cast<const ConvBlockOutput<T, Y>*>(ctx);
  const Operand<Y>& y = out.y;
  if constexpr (std::is_same_v<T, float> && std::is_same_v<Y, float>) {
    // One position a sample (1x1 maps side by side: squeeze-excitation blocks at batch > 1), its
    // channels contiguous in y: each sample's column of C gathered into a row and through the
    // epilogue as channels-last in one call, rather than one call per element (as
    // epilogue_gemm_block takes a single column; the same bits). Measured on Zen 4, 2 threads,
    // [8, 48, 1, 1] -> 1152 channels (EfficientNet-B0's last squeeze-excitations): 100 -> 68 us.
    if (out.P == 1 && y.s[1] == 1 && channels_last_residual(*out.e)) {
      float* column = thread_scratch<float, 4>(rows);
      for (int64_t j = j0; j < j0 + cols; ++j) {
        for (int64_t i = 0; i < rows; ++i) column[i] = c[i * c_rs + (j - j0)];
        const int64_t n = out.n0 + j, o0 = out.o0 + i0;
        epilogue_channels_last(*out.e, n, 0, 1, 1, o0, rows, column, rows, y.p + n * y.s[0] + o0, rows);
      }
      return;
    }
    // A channels-last y whose positions lie at one stride (ys3 apart), with its residual's channels
    // contiguous: each run of the block goes into y transposed, a position's channels side by
    // side, and gets the epilogue there through the channels' kernel, rather than each channel's
    // run through the epilogue and into y one value at a time at a stride of C (and, with a
    // residual, by the scalar loop, whose separate multiply and add gave other bits than the NCHW
    // output's). Measured on Sapphire Rapids, 2 threads, the few-channel rows of a channels-last
    // input: ResNet's 7x7 stem 1.41 -> 1.07 ms at batch 1, 13.3-13.8 -> 10.9-11.3 ms at batch 8;
    // MobileNet's 3x3 stride-2 stem to 32 channels 2.77 -> 1.62 ms at batch 8.
    if (y.s[1] == 1 && y.s[2] == out.Wo * y.s[3] && rows >= kTransposeRowsMin && channels_last_residual(*out.e)) {
      for (int64_t j = j0; j < j0 + cols;) {
        const int64_t s = j / out.P, p0 = j % out.P, len = std::min(j0 + cols - j, out.P - p0);
        store_transposed(*out.e, out.n0 + s, p0, len, out.Wo, out.o0 + i0, rows, c + (j - j0), c_rs, y);
        j += len;
      }
      return;
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t o = out.o0 + i0 + i;
    for (int64_t j = j0; j < j0 + cols;) {  // in runs inside one sample
      const int64_t s = j / out.P, p0 = j % out.P, len = std::min(j0 + cols - j, out.P - p0);
      T* v = c + i * c_rs + (j - j0);
      Y* yp = y.p + (out.n0 + s) * y.s[0] + o * y.s[1];
      const bool dense = y.s[3] == 1 && y.s[2] == out.Wo;
      if constexpr (std::is_same_v<T, Y>) {
        if (dense) {
          epilogue_positions(*out.e, out.n0 + s, o, p0, out.Wo, v, yp + p0, len);
          j += len;
          continue;
        }
      }
      epilogue_positions(*out.e, out.n0 + s, o, p0, out.Wo, v, v, len);
      if (dense) {
        for (int64_t k = 0; k < len; ++k) yp[p0 + k] = Y(v[k]);
      } else {
        for (int64_t k = 0, h = p0 / out.Wo, w = p0 % out.Wo; k < len; ++k) {
          yp[h * y.s[2] + w * y.s[3]] = Y(v[k]);
          if (++w == out.Wo) w = 0, ++h;
        }
      }
      j += len;
    }
  }
}

// A float32 convolution's output larger than this many bytes, dense NCHW, takes its GEMM's
// blocks through the thread's sums (the epilogue applied there, in cache) into y with stores past
// the caches (stream_rows): it would not stay in cache for the next layer anyway, and stored
// as usual each of its lines is first read from memory. Measured on Sapphire Rapids, 2 threads,
// batch 8, in the networks: the 16 -> 96 expansions at 112x112 (38.5 MB) of MobileNet v2 4.4 ->
// 3.0 ms and EfficientNet-B0 5.8 -> 4.6 ms (their next layers, reading it from memory, 0.1-0.25 ms
// slower); ResNet-50's 25.7 MB outputs at 56x56 (24 MB then the bound) mixed, 0.9-1.1x.
// The few-channel rows (a network's first layer) from 16 MB: measured the same way, batch 8,
// ResNet-50's 7x7 stem (25.7 MB) 9.9 -> 8.1 ms, VGG-11's first layer (102 MB) 13.4 -> 8.9 ms (in
// the layer alone, ResNet's stem from 12.8 MB 20% faster, VGG's 3x3 at 25.7 MB 20-33%), but the
// MobileNets' 3x3 stride-2 stem to 32 channels 8-10% slower at 12.8 MB (batch 8).
constexpr int64_t kStreamedOutputBytes = int64_t{32} << 20, kStreamedFirstLayerBytes = int64_t{16} << 20;
bool streamed_output(const Operand<float>& y, const ConvGeom& g, int64_t bound = kStreamedOutputBytes) {
  return g.N * g.O * g.P * static_cast<int64_t>(sizeof(float)) > bound && y.s[3] == 1 && y.s[2] == g.Wo;
}

// A pointwise convolution's input of at most this many bytes (all its samples) is taken to be in
// the cores' caches, as the layer before has just written it (gemm's b_in_cache); a larger one
// has left them by the time a sample's product reads it (MobileNet v2's projections at batch 8,
// 4.8-14 MB, measured slower read in place).
constexpr int64_t kCachedInputBytes = int64_t{2} << 20;
template <typename T>
bool input_in_cache(const ConvGeom& g) {
  return is_pointwise(g) && g.N * g.C * g.H * g.W * static_cast<int64_t>(sizeof(T)) <= kCachedInputBytes;
}

// The epilogue of a block of the sums of a chunk of a ConvBlockOutput's columns (C row-major, rows
// channels from o0, columns its positions from column c0 on, counted from sample n0's first)
// applied in place, then the block stored into y past the caches, a run of positions inside one
// sample at a time (y dense NCHW).
constexpr int64_t kStreamedColumns = 768;
struct StreamedOutput {
  ConvBlockOutput<float, float> out;
  int64_t c0;
};
void epilogue_streamed(const void* ctx, float* c, int64_t c_rs, int64_t /*c_cs: 1*/, int64_t i0, int64_t rows,
                       int64_t chunk_j0, int64_t cols) {
  const auto& [out, c0] = *static_cast<const StreamedOutput*>(ctx);
  const int64_t j0 = c0 + chunk_j0;
  for (int64_t j = j0; j < j0 + cols;) {
    const int64_t s = j / out.P, p0 = j % out.P, len = std::min(j0 + cols - j, out.P - p0);
    float* block = c + (j - j0);
    for (int64_t i = 0; i < rows; ++i)
      epilogue_positions(*out.e, out.n0 + s, out.o0 + i0 + i, p0, out.Wo, block + i * c_rs, block + i * c_rs, len);
    stream_rows(rows, len, block, c_rs, out.y.p + (out.n0 + s) * out.y.s[0] + (out.o0 + i0) * out.y.s[1] + p0,
                out.y.s[1]);
    j += len;
  }
}

// p[0, n) = 0.
template <typename T>
void zero_fill(T* p, int64_t n) {
  // Most of im2col's runs of padding are one value: a store, where a call to memset costs more.
  if (n == 1)
    *p = T(0);
  else if (n > 1)
    std::fill(p, p + n, T(0));
}

// dst[k] = src[k * step] for k < n: a copy, for float32 at step 2 (stride-2 convolutions of dense
// rows) the instruction set's kernel, else one by one.
template <typename T>
void strided_copy(int64_t n, const T* src, int64_t step, T* dst) {
  if (step == 1) {
    std::copy(src, src + n, dst);
    return;
  }
  if constexpr (std::is_same_v<T, float>)
    if (step == 2) return even_copy(n, src, dst);
  for (int64_t k = 0; k < n; ++k) dst[k] = src[k * step];
}

// col (K, P) <- the receptive fields of channels [0, Cg) of x (x points at sample n, channel
// c0; xs its strides), zero where the window reads padding; ld is col's row stride (>= P). With
// an output row range [oh0, oh1), only those rows' positions: col (K, (oh1 - oh0) * Wo).
// Channels are split over threads unless the caller already runs on them.
//
// A "same" convolution's rows (stride 1, Wo == W, dense rows of x) take one copy per
// kernel tap: col position oh * Wo + ow reads x's plane at a fixed offset from oh * W + ow, so
// the tap's valid output rows are one contiguous run of the plane, after which the columns that
// read padding (they picked up the neighbouring row's edge) are zeroed; the general path copies
// Ho runs of Wo values (14 or 7 for the small maps of ResNet's and DenseNet's last stages).
template <typename T>
void im2col(const T* x, const int64_t* xs, const ConvGeom& g, T* col, int64_t ld, int64_t oh0 = 0, int64_t oh1 = -1) {
  if (oh1 < 0) oh1 = g.Ho;
  const bool same_rows = g.sh == 1 && g.sw == 1 && g.Wo == g.W && xs[3] == 1 && xs[2] == g.W;
  parallel_for(g.Cg, g.kh * g.kw * (oh1 - oh0) * g.Wo, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j) {
          T* row = col + ((c * g.kh + i) * g.kw + j) * ld;
          Range rw = valid_range(j * g.dw, g.sw, g.pw, g.W, g.Wo);
          if (same_rows) {
            // Output rows [lo, hi) read input rows oh * sh - ph + i * dh inside the map.
            const Range rh = valid_range(i * g.dh, g.sh, g.ph, g.H, g.Ho);
            const int64_t lo = std::clamp(rh.lo, oh0, oh1), hi = std::clamp(rh.hi, lo, oh1);
            std::fill(row, row + (lo - oh0) * g.Wo, T(0));
            std::fill(row + (hi - oh0) * g.Wo, row + (oh1 - oh0) * g.Wo, T(0));
            if (lo == hi) continue;
            if (rw.lo == rw.hi) {
              std::fill(row + (lo - oh0) * g.Wo, row + (hi - oh0) * g.Wo, T(0));
              continue;
            }
            // Positions [first, last) of the run: row lo's first valid column to row hi - 1's
            // last; every read is inside the plane (rows of lo and hi - 1, valid columns).
            const int64_t first = (lo - oh0) * g.Wo + rw.lo, last = (hi - 1 - oh0) * g.Wo + rw.hi;
            const T* src = x + c * xs[1] + (lo * g.sh - g.ph + i * g.dh) * xs[2] + rw.lo + j * g.dw - g.pw;
            std::copy(src, src + (last - first), row + first);
            for (int64_t oh = lo; oh < hi; ++oh) {
              T* r = row + (oh - oh0) * g.Wo;
              zero_fill(r, rw.lo);
              zero_fill(r + rw.hi, g.Wo - rw.hi);
            }
            continue;
          }
          for (int64_t oh = oh0; oh < oh1; ++oh) {
            T* r = row + (oh - oh0) * g.Wo;
            int64_t ih = oh * g.sh - g.ph + i * g.dh;
            if (ih < 0 || ih >= g.H) {
              std::fill(r, r + g.Wo, T(0));
              continue;
            }
            const T* xr = x + c * xs[1] + ih * xs[2] + (j * g.dw - g.pw) * xs[3];
            zero_fill(r, rw.lo);
            strided_copy(rw.hi - rw.lo, xr + rw.lo * g.sw * xs[3], g.sw * xs[3], r + rw.lo);
            zero_fill(r + rw.hi, g.Wo - rw.hi);
          }
        }
  });
}

// dx += the (K, P) matrix col (row stride ld) scattered back over its receptive fields (the
// adjoint of im2col), channels split over threads like im2col's.
template <typename T>
void col2im(const T* col, int64_t ld, const ConvGeom& g, T* dx, const int64_t* xs) {
  parallel_for(g.Cg, g.kh * g.kw * g.P, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j) {
          const T* row = col + ((c * g.kh + i) * g.kw + j) * ld;
          Range rw = valid_range(j * g.dw, g.sw, g.pw, g.W, g.Wo);
          int64_t step = g.sw * xs[3];
          for (int64_t oh = 0; oh < g.Ho; ++oh) {
            int64_t ih = oh * g.sh - g.ph + i * g.dh;
            if (ih < 0 || ih >= g.H) continue;
            const T* r = row + oh * g.Wo;
            T* xr = dx + c * xs[1] + ih * xs[2] + (j * g.dw - g.pw) * xs[3];
            if (step == 1)
              for (int64_t ow = rw.lo; ow < rw.hi; ++ow) xr[ow] += r[ow];
            else
              for (int64_t ow = rw.lo; ow < rw.hi; ++ow) xr[ow * step] += r[ow];
          }
        }
  });
}

// Runs body(begin, end) over n items: split over threads when there are at least as many items
// as threads, else in one go so the GEMM inside can use the threads.
template <typename F>
void for_items(int64_t n, int64_t work_per_item, F&& body) {
#ifdef _OPENMP
  if (n < omp_get_max_threads()) {
    body(int64_t{0}, n);
    return;
  }
#endif
  parallel_for(n, work_per_item, body);
}

// ---------------------------------------------------------------- depthwise (Cg == 1)

// One output plane: y[o] (a (Ho,Wo) buffer) = sum over the window of w[o] * x[c].
template <typename T>
void depthwise_plane(const T* x, const int64_t* xs, const T* w, const ConvGeom& g, T* y) {
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j) {
      T wv = w[i * g.kw + j];
      Range rw = valid_range(j * g.dw, g.sw, g.pw, g.W, g.Wo);
      int64_t step = g.sw * xs[3];
      for (int64_t oh = 0; oh < g.Ho; ++oh) {
        int64_t ih = oh * g.sh - g.ph + i * g.dh;
        if (ih < 0 || ih >= g.H) continue;
        const T* xr = x + ih * xs[2] + (j * g.dw - g.pw) * xs[3];
        T* yr = y + oh * g.Wo;
        for (int64_t ow = rw.lo; ow < rw.hi; ++ow) yr[ow] += wv * xr[ow * step];
      }
    }
}

// The flat (one long row) paths below need a float32 plane with one stride both ways, 1 or 2
// (see depthwise_plane_flat); the backward ones also contiguous rows.
bool flat_depthwise(const ConvGeom& g) { return (g.sw == 1 || g.sw == 2) && g.sh == g.sw; }

// The offset of tap t = (i, j) in a padded plane of row length Wp.
int64_t tap_offset(const ConvGeom& g, int64_t Wp, int64_t i, int64_t j) { return i * g.dh * Wp + j * g.dw; }

// Float32 planes (x's row and column strides x_rs, x_cs: channels-last planes too), stride 1 or 2,
// all to the instruction set's row kernel (depthwise_row) as one long row: the plane is copied
// into a zero-padded (Hp, Wp) buffer xp, and output (oh, ow) is element q = oh * Wp + ow of a flat
// result whose tap (i, j) is xp[stride * q + i * dh * Wp + j * dw]; the q with ow >= Wo are computed
// and dropped. Short rows (small maps, 5x5 windows) become whole vectors this way. Taps over the
// padding add exact zeros, so every output is the sum over the taps inside the input, in tap order.
// The result stays in yq (output row oh at yq + oh * Wp), for the caller's epilogue to store; xp
// holds depthwise_padded_floats, yq depthwise_flat_outputs, rows and tap_w kh * kw.
int64_t depthwise_padded_floats(const ConvGeom& g) { return (g.H + 2 * g.ph) * (g.W + 2 * g.pw) + kDepthwiseRowSlack; }
int64_t depthwise_flat_outputs(const ConvGeom& g) { return (g.Ho - 1) * (g.W + 2 * g.pw) + g.Wo; }
void depthwise_plane_flat(const float* x, int64_t x_rs, int64_t x_cs, const float* w, float bias, const ConvGeom& g,
                          float* xp, float* yq, const float** rows, float* tap_w) {
  const int64_t Wp = g.W + 2 * g.pw;
  std::fill(xp, xp + depthwise_padded_floats(g), 0.f);  // the padding, and the slack the kernel's last loads read
  for (int64_t h = 0; h < g.H; ++h) {
    float* row = xp + (h + g.ph) * Wp + g.pw;
    const float* src = x + h * x_rs;
    if (x_cs == 1)
      std::copy(src, src + g.W, row);
    else
      for (int64_t w = 0; w < g.W; ++w) row[w] = src[w * x_cs];
  }
  for (int64_t i = 0, t = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j, ++t) {
      rows[t] = xp + tap_offset(g, Wp, i, j);
      tap_w[t] = w[t];
    }
  depthwise_row(depthwise_flat_outputs(g), g.kh * g.kw, rows, tap_w, g.sw, bias, yq);
}

// Output rows at least this long get the epilogue on their way out (one pass, whole vectors);
// shorter ones over the whole flat result first (whole vectors across rows), then are copied.
constexpr int64_t kDepthwiseShortRow = 16;

// The epilogue left after a depthwise plane started from `first` (the shift when there is no
// scale: the row kernels start each sum from it, as conv2d's bias always did).
template <typename T>
struct DepthwiseStart {
  Epilogue<T> rest;
  const T* first;
};
template <typename T>
DepthwiseStart<T> depthwise_start(const Epilogue<T>& e) {
  if (e.scale || !e.shift) return {e, nullptr};
  Epilogue<T> rest = e;
  rest.shift = nullptr;
  return {rest, e.shift};
}

// Float32 depthwise convolutions in blocks of kDepthwiseBlock channels held position-major (the
// block's channels side by side in the vectors): each block's input planes are copied into a
// zero-padded (Hp, Wp, block) buffer (transposed in 16 x 16 tiles), every output row of the block
// is one call of the instruction set's kernel (depthwise_channels), and the block's planes come
// back transposed for the epilogue and the store. Output channels past O in the last block are
// computed from zero weights and dropped. Taps over the padding add exact zeros, so every output
// is the sum over the taps inside the input in tap order from its start, as in the flat rows.
// The flat rows (depthwise_plane_flat) compute and drop the padding columns between output rows
// (and at stride 2 every other column); the blocks compute none but their last block's unused
// lanes: they are taken when their share of dropped work is the lower (the transposes, whole
// tiles through registers, cost about what the flat rows' copy into the padded plane does), or
// when the flat rows do not apply. Measured on Zen 4 (1 thread, batch 8): every 3x3 and 5x5
// layer of MobileNet v2/v3 and EfficientNet-B0 with a multiple of 16 channels faster in blocks
// (14x14 and 28x28 3x3 stride 1: 0.55-0.6x the rows' time; 56x56: 0.8x); 72 channels at 56x56
// (80 lanes) 0.91x the blocks' time in rows. With fewer blocks than threads the flat rows (split
// by planes) are taken; with one block per thread (since input rows go into the blocks row by
// row) 32 channels took 0.89x the rows' time at 112x112 and 0.59x at 56x56 stride 2 (batch 1, 2
// threads).
bool use_depthwise_channel_blocks(const ConvGeom& g, const Operand<const float>& x) {
  if (!flat_depthwise(g) || (g.Og == 1 && x.s[1] == 1)) return true;  // channels-last: no transposes at all
#ifdef _OPENMP
  if (g.N * ((g.O + kDepthwiseBlock - 1) / kDepthwiseBlock) < omp_get_max_threads()) return false;
#endif
  const double lanes = static_cast<double>((g.O + kDepthwiseBlock - 1) / kDepthwiseBlock * kDepthwiseBlock);
  return lanes / static_cast<double>(g.O) < static_cast<double>(depthwise_flat_outputs(g)) / static_cast<double>(g.P);
}

// Input rows at least this long are transposed into a block's padded buffer row by row (the 16 x
// 16 tiles of a row, its last one partial); shorter ones plane by plane, then copied. Measured on
// Zen 4, 2 threads (rows against planes, batch 1 and 8): 0.77-0.94x the time at 112x112 and 56x56,
// 0.97-0.98x at 28x28, 1.06-1.24x at 14x14 and 7x7 (a partial tile per row).
constexpr int64_t kDepthwiseRowTranspose = 16;

void depthwise_channel_blocks(const Operand<const float>& x, const float* w, const Epilogue<float>& rest,
                              const float* first, const Operand<float>& y, const ConvGeom& g) {
  note_kernel_path("depthwise channel blocks");
  constexpr int64_t L = kDepthwiseBlock;
  const int64_t Hp = g.H + 2 * g.ph, Wp = g.W + 2 * g.pw, taps = g.kh * g.kw, blocks = (g.O + L - 1) / L;
  std::vector<int64_t> offsets(taps);
  for (int64_t i = 0, t = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j, ++t) offsets[t] = tap_offset(g, Wp, i, j) * L;
  // Dense input planes with rows of a whole tile or more are transposed row by row straight into
  // the padded buffer, smaller ones in whole 16 x 16 tiles into the space of the output planes,
  // then copied row by row into it; channels-last ones need no transpose. The
  // epilogue runs in the kernel, in registers, unless there is a residual (then after, as below).
  // Full blocks of a channels-last output are written by the kernel itself; other blocks' sums go
  // to yb: channels-last ones are copied out per position, dense output planes of at least 16
  // positions take them transposed in place (transpose_copy's whole-vector stores stay inside each
  // plane), others through a transposed copy of the planes.
  const bool dense_x = g.Og == 1 && x.s[3] == 1 && x.s[2] == g.W;
  const bool dense_y = y.s[3] == 1 && y.s[2] == g.Wo && g.P >= 16;
  const bool channels_last_y = y.s[1] == 1 && channels_last_residual(rest);
  const bool fused = !rest.residual;
  const Epilogue<float> after = fused ? Epilogue<float>{} : rest;
  const RowActivation act = fused ? row_activation(rest.activation) : RowActivation::none;
  parallel_for(g.N * blocks, L * g.P * taps, [&](int64_t b, int64_t end) {
    float* xb = thread_scratch<float, 0>(Hp * Wp * L);
    // The block's sums, then its input position-major or its output planes.
    float* yb = thread_scratch<float, 1>((g.P + std::max(g.P, g.H * g.W)) * L);
    float* planes = yb + g.P * L;
    std::vector<float> wb(taps * L), start(L), scale(L), shift(L);
    // The padding stays zero: only the interior is written. Lanes past count hold whatever they
    // held; their sums (each lane its own channel's) are dropped.
    std::fill(xb, xb + Hp * Wp * L, 0.f);
    for (int64_t it = b; it < end; ++it) {
      const int64_t n = it / blocks, o0 = it % blocks * L, count = std::min(L, g.O - o0);
      for (auto* v : {&wb, &start, &scale, &shift}) std::fill(v->begin(), v->end(), 0.f);
      for (int64_t k = 0; k < count; ++k) {
        for (int64_t t = 0; t < taps; ++t) wb[t * L + k] = w[(o0 + k) * taps + t];
        if (first) start[k] = first[o0 + k];
        if (rest.scale) scale[k] = rest.scale[o0 + k];
        if (rest.shift) shift[k] = rest.shift[o0 + k];
      }
      const float* xn = x.p + n * x.s[0];
      auto at = [&](int64_t h, int64_t v) { return xb + ((h + g.ph) * Wp + v + g.pw) * L; };
      if (dense_x && g.W >= kDepthwiseRowTranspose) {
        for (int64_t h = 0; h < g.H; ++h) transpose_copy(g.W, count, xn + o0 * x.s[1] + h * g.W, x.s[1], at(h, 0), L);
      } else if (dense_x) {
        transpose_copy(g.H * g.W, count, xn + o0 * x.s[1], x.s[1], planes, L);
        for (int64_t h = 0; h < g.H; ++h) std::copy_n(planes + h * g.W * L, g.W * L, at(h, 0));
      } else if (g.Og == 1 && x.s[1] == 1) {  // channels-last: the block's channels are contiguous already
        for (int64_t h = 0; h < g.H; ++h)
          for (int64_t v = 0; v < g.W; ++v) {
            const float* src = xn + o0 + h * x.s[2] + v * x.s[3];
            if (count == L)
              __builtin_memcpy(at(h, v), src, L * sizeof(float));  // one vector, not a call
            else
              std::copy_n(src, count, at(h, v));
          }
      } else {
        for (int64_t k = 0; k < count; ++k)
          for (int64_t h = 0; h < g.H; ++h)
            for (int64_t v = 0; v < g.W; ++v) at(h, v)[k] = xn[(o0 + k) / g.Og * x.s[1] + h * x.s[2] + v * x.s[3]];
      }
      float* yn = y.p + n * y.s[0];
      const bool into_y = channels_last_y && fused && count == L;
      const float* sp = fused && rest.scale ? scale.data() : nullptr;
      for (int64_t oh = 0; oh < g.Ho; ++oh)
        depthwise_channels(g.Wo, taps, xb + oh * g.sh * Wp * L, offsets.data(), g.sw * L, wb.data(), start.data(), sp,
                           sp ? shift.data() : nullptr, act, into_y ? yn + oh * y.s[2] + o0 : yb + oh * g.Wo * L,
                           into_y ? y.s[3] : L);
      if (into_y) continue;
      if (channels_last_y) {
        for (int64_t oh = 0; oh < g.Ho; ++oh)
          epilogue_channels_last(after, n, oh * g.Wo, g.Wo, g.Wo, o0, count, yb + oh * g.Wo * L, L,
                                 yn + oh * y.s[2] + o0, y.s[3]);
      } else if (dense_y) {
        transpose_copy(count, g.P, yb, L, yn + o0 * y.s[1], y.s[1]);
        if (!fused)
          for (int64_t k = 0; k < count; ++k) {
            float* yp = yn + (o0 + k) * y.s[1];
            epilogue_positions(rest, n, o0 + k, 0, g.Wo, yp, yp, g.P);
          }
      } else {
        transpose_copy(count, g.P, yb, L, planes, g.P);
        for (int64_t k = 0; k < count; ++k)
          for (int64_t oh = 0; oh < g.Ho; ++oh)
            store_output_row(after, n, o0 + k, oh, g.Wo, planes + k * g.P + oh * g.Wo, yn + (o0 + k) * y.s[1], y.s);
      }
    }
  });
}

// Float32 depthwise convolutions of a channels-last input into a channels-last output, with
// whole blocks of kDepthwiseBlock channels and no residual: each (sample, output row, channel
// block) is one call of the instruction set's kernel (depthwise_channels) reading the input in
// place, its epilogue in registers, its stores straight into y. Taps that fall outside the input
// are left out (rows above or below: the window's other rows; the few positions at the left and
// right ends: one call each over the taps inside), so nothing is copied or padded. The items run
// sample by sample, row by row, the channel blocks innermost: the input rows a thread reads stay
// in its cache for the next output rows. Measured on Sapphire Rapids, 2 threads, batch 1, against
// the channel blocks (which copy every block's input into a padded buffer): MobileNet v2's 3x3
// layers at 112x112 0.43x the time (32 channels) and 0.36x (96, stride 2), 56x56 0.65x (144) and
// 0.33x (144, stride 2), 28x28 0.2x (192); on 14x14 and 7x7 maps 1.5x and 2.4x (the calls per row
// and the edges weigh more), so shorter rows keep the blocks. With stride 1 and no dilation, where
// the instruction set has it (AVX-512; windows 3, 5 and 7 wide), a whole output row is one call of
// depthwise_channel_rows instead, the ends included (each window row's weights in registers, each
// input column loaded once for the outputs that use it, rather than once per tap): ConvNeXt-T's
// 7x7 layers at 56x56 0.32 -> 0.126 ms, 28x28 0.23 -> 0.083 ms (batch 1), 2.7 -> 1.06 ms at 56x56
// batch 8; a 3x3 at 56x56 0.057 -> 0.05 ms. On 14x14 maps it gains at batch 8 (0.42 -> 0.31 ms)
// but not at batch 1, and loses on 7x7 maps at batch 1 (0.035 -> 0.055 ms): the threshold stays.
constexpr int64_t kDepthwiseInPlaceRow = 16;
bool use_depthwise_channels_last(const ConvGeom& g, const Operand<const float>& x, const Operand<float>& y,
                                 const Epilogue<float>& rest) {
  return g.Og == 1 && g.O % kDepthwiseBlock == 0 && g.Wo >= kDepthwiseInPlaceRow && x.s[1] == 1 && y.s[1] == 1 &&
         !rest.residual;
}

void depthwise_channels_last(const Operand<const float>& x, const float* w, const Epilogue<float>& rest,
                             const float* first, const Operand<float>& y, const ConvGeom& g) {
  note_kernel_path("depthwise channels-last");
  constexpr int64_t L = kDepthwiseBlock;
  const int64_t taps = g.kh * g.kw, blocks = g.O / L;
  std::vector<float> wl(blocks * taps * L), zeros(L, 0.f);  // each block's weights (taps, L)
  for (int64_t o = 0; o < g.O; ++o)
    for (int64_t t = 0; t < taps; ++t) wl[(o / L * taps + t) * L + o % L] = w[o * taps + t];
  // Output columns [lo, hi) have every tap inside the input's width.
  auto inside = [&](int64_t ow) { return ow * g.sw - g.pw >= 0 && ow * g.sw - g.pw + (g.kw - 1) * g.dw < g.W; };
  int64_t lo = 0;
  while (lo < g.Wo && !inside(lo)) ++lo;
  int64_t hi = lo;
  while (hi < g.Wo && inside(hi)) ++hi;
  const RowActivation act = row_activation(rest.activation);
  parallel_for(g.N * g.Ho * blocks, g.Wo * taps * L, [&](int64_t b, int64_t end) {
    std::vector<int64_t> offsets(taps), some_offsets(taps), row_offsets(g.kh);
    std::vector<float> some_w(taps * L);
    for (int64_t it = b; it < end; ++it) {
      const int64_t n = it / (g.Ho * blocks), oh = it / blocks % g.Ho, o0 = it % blocks * L;
      const float* xr = x.p + n * x.s[0] + o0;  // tap (i, j) of column ow at xr + offsets[t] + ow * step
      float* yr = y.p + n * y.s[0] + oh * y.s[2] + o0;
      const float* wb = wl.data() + o0 * taps;
      const float* start = first ? first + o0 : zeros.data();
      const float* scale = rest.scale ? rest.scale + o0 : nullptr;
      const float* shift = rest.scale && rest.shift ? rest.shift + o0 : nullptr;
      const int64_t step = g.sw * x.s[3];
      // The window's rows inside the input: taps [i0 * kw, i1 * kw), their weights contiguous.
      int64_t i0 = 0, i1 = g.kh;
      while (i0 < i1 && oh * g.sh - g.ph + i0 * g.dh < 0) ++i0;
      while (i1 > i0 && oh * g.sh - g.ph + (i1 - 1) * g.dh >= g.H) --i1;
      if (g.sw == 1 && g.dw == 1) {  // each window row's taps consecutive columns: the whole row at once
        for (int64_t i = i0; i < i1; ++i) row_offsets[i - i0] = (oh * g.sh - g.ph + i * g.dh) * x.s[2];
        if (depthwise_channel_rows(g.Wo, i1 - i0, g.kw, g.pw, g.W, xr, row_offsets.data(), x.s[3], wb + i0 * g.kw * L,
                                   start, scale, shift, act, yr, y.s[3]))
          continue;
      }
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = 0; j < g.kw; ++j)
          offsets[i * g.kw + j] = (oh * g.sh - g.ph + i * g.dh) * x.s[2] + (j * g.dw - g.pw) * x.s[3];
      const int64_t rows_taps = (i1 - i0) * g.kw;
      if (hi > lo)
        depthwise_channels(hi - lo, rows_taps, xr + lo * step, offsets.data() + i0 * g.kw, step, wb + i0 * g.kw * L,
                           start, scale, shift, act, yr + lo * y.s[3], y.s[3]);
      // A column at an end: over the taps whose columns are inside.
      auto edge = [&](int64_t ow) {
        int64_t count = 0;
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t iw = ow * g.sw - g.pw + j * g.dw;
            if (iw < 0 || iw >= g.W) continue;
            some_offsets[count] = offsets[i * g.kw + j];
            std::copy_n(wb + (i * g.kw + j) * L, L, some_w.data() + count * L);
            ++count;
          }
        depthwise_channels(1, count, xr + ow * step, some_offsets.data(), step, some_w.data(), start, scale, shift, act,
                           yr + ow * y.s[3], y.s[3]);
      };
      for (int64_t ow = 0; ow < lo; ++ow) edge(ow);
      for (int64_t ow = hi; ow < g.Wo; ++ow) edge(ow);
    }
  });
}

// The (sample, channel plane) pairs of a depthwise convolution split over the threads, each thread's
// share as runs of consecutive channels inside one sample: run(n, o, planes) for channels
// [o, o + planes) of sample n (work: per plane).
template <typename F>
void for_plane_runs(const ConvGeom& g, int64_t work, F&& run) {
  parallel_for(g.N * g.O, work, [&](int64_t b, int64_t end) {
    for (int64_t it = b; it < end;) {
      const int64_t n = it / g.O, o = it % g.O, planes = std::min(end - it, g.O - o);
      run(n, o, planes);
      it += planes;
    }
  });
}

// Float32 depthwise convolutions of stride 1 whose output map is the input's ("same" padding) on
// dense NCHW planes, without a residual: each run of a sample's channel planes by the instruction
// set's kernel (depthwise_planes, AVX-512, two planes at a time) read in place, in vectors of
// consecutive positions across its rows, the taps outside the map masked off (each tap's masks per
// vector made once per geometry and kept), so nothing is transposed, padded or copied. Each
// element gets the channel blocks' arithmetic (the sums from the bias in tap order, the padding's
// w * 0 included; the epilogue in registers).
bool use_depthwise_planes(const ConvGeom& g, const Operand<const float>& x, const Operand<float>& y,
                          const Epilogue<float>& rest) {
  return has_depthwise_planes_kernel() && g.Og == 1 && g.sh == 1 && g.sw == 1 && g.Ho == g.H && g.Wo == g.W &&
         x.s[3] == 1 && x.s[2] == g.W && y.s[3] == 1 && y.s[2] == g.Wo && !rest.residual;
}

void depthwise_planes_forward(const Operand<const float>& x, const float* w, const Epilogue<float>& rest,
                              const float* first, const Operand<float>& y, const ConvGeom& g) {
  note_kernel_path("depthwise planes");
  constexpr int64_t L = kDepthwisePlaneLanes;
  const int64_t taps = g.kh * g.kw, vectors = (g.P + L - 1) / L;
  // The masks depend on the geometry only: the calling thread keeps the last few it made (a
  // network's layers repeat theirs every forward pass).
  struct Masks {
    std::array<int64_t, 8> key;
    std::vector<int64_t> offsets;
    std::vector<uint16_t> bits;
  };
  thread_local std::vector<Masks> kept;
  const std::array<int64_t, 8> key{g.H, g.W, g.kh, g.kw, g.dh, g.dw, g.ph, g.pw};
  auto found = std::find_if(kept.begin(), kept.end(), [&](const Masks& m) { return m.key == key; });
  if (found == kept.end()) {
    Masks m{key, std::vector<int64_t>(taps), std::vector<uint16_t>(vectors * taps)};
    for (int64_t i = 0, t = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j, ++t) {
        const int64_t di = i * g.dh - g.ph, dj = j * g.dw - g.pw;
        m.offsets[t] = di * g.W + dj;
        for (int64_t q = 0, h = 0, c = 0; q < g.P; ++q) {  // position q at row h, column c
          if (h + di >= 0 && h + di < g.H && c + dj >= 0 && c + dj < g.W)
            m.bits[t * vectors + q / L] |= static_cast<uint16_t>(1u << (q % L));
          if (++c == g.W) c = 0, ++h;
        }
      }
    constexpr size_t kKeptMasks = 32;
    if (kept.size() == kKeptMasks) kept.erase(kept.begin());
    kept.push_back(std::move(m));
    found = kept.end() - 1;
  }
  const std::vector<int64_t>& offsets = found->offsets;
  const std::vector<uint16_t>& masks = found->bits;
  const RowActivation act = row_activation(rest.activation);
  for_plane_runs(g, g.P * taps, [&](int64_t n, int64_t o, int64_t planes) {
    depthwise_planes(DepthwisePlanes{
        planes, g.P, taps, x.p + n * x.s[0] + o * x.s[1], x.s[1], offsets.data(), masks.data(), w + o * taps,
        first ? first + o : nullptr, rest.scale ? rest.scale + o : nullptr,
        rest.scale && rest.shift ? rest.shift + o : nullptr, act, y.p + n * y.s[0] + o * y.s[1], y.s[1]});
  });
}

// Float32 depthwise convolutions of stride 2 (no dilation) with windows up to 3 wide, or 5 wide
// on output rows of more than 8 (two rows to a vector take a permutation per tap), on dense NCHW
// planes, without a residual, whose input is at most kDepthwiseStride2InputBytes: each run of a
// sample's channel planes by the instruction set's kernel (depthwise_stride2_planes, AVX-512, two
// planes at a time) read in place, output rows in vectors of columns whose taps are picked from
// each input row's window of three loads, the taps outside the map masked off: nothing transposed,
// padded or copied. Measured on Sapphire Rapids, 2 threads, against the channel blocks: at batch 1
// 3x3 layers of MobileNet v2, v3 and EfficientNet-B0 0.58-0.65x the time from 112x112 to 28x28
// inputs, 0.85-1.0x at 14x14, 5x5 0.62-0.76x from 56x56 and 28x28; at batch 8 0.6-0.75x (3x3 from
// 56x56 to 14x14, 14 MB at most), 5x5 0.8x (72 channels at 56x56) and 0.93x (144: 14 MB), from
// 12.8 MB inputs (32 channels at 112x112) 0.75x but 1.15-1.2x from 25-38 MB (64 and 96 at 112x112:
// out of cache, which the blocks' transposes read 16 planes at a time, more misses in flight); 5x5
// on rows of 7 (two to a vector, a permutation per tap) 1.35x.
constexpr int64_t kDepthwiseStride2InputBytes = int64_t{16} << 20;
bool use_depthwise_stride2_planes(const ConvGeom& g, const Operand<const float>& x, const Operand<float>& y,
                                  const Epilogue<float>& rest) {
  return has_depthwise_planes_kernel() && g.Og == 1 && g.sh == 2 && g.sw == 2 && g.dh == 1 && g.dw == 1 &&
         (g.kw <= 3 || (g.kw <= 5 && g.Wo > 8)) &&
         g.N * g.C * g.H * g.W * static_cast<int64_t>(sizeof(float)) <= kDepthwiseStride2InputBytes && x.s[3] == 1 &&
         x.s[2] == g.W && y.s[3] == 1 && y.s[2] == g.Wo && !rest.residual;
}

void depthwise_stride2_planes_forward(const Operand<const float>& x, const float* w, const Epilogue<float>& rest,
                                      const float* first, const Operand<float>& y, const ConvGeom& g) {
  note_kernel_path("depthwise planes, stride 2");
  const int64_t taps = g.kh * g.kw;
  const RowActivation act = row_activation(rest.activation);
  for_plane_runs(g, g.Ho * g.Wo * taps, [&](int64_t n, int64_t o, int64_t planes) {
    depthwise_stride2_planes(DepthwiseStride2Planes{
        planes, g.H, g.W, g.Ho, g.Wo, g.kh, g.kw, g.ph, g.pw, x.p + n * x.s[0] + o * x.s[1], x.s[1], w + o * taps,
        first ? first + o : nullptr, rest.scale ? rest.scale + o : nullptr,
        rest.scale && rest.shift ? rest.shift + o : nullptr, act, y.p + n * y.s[0] + o * y.s[1], y.s[1]});
  });
}

template <typename T>
void depthwise_forward(const Operand<const T>& x, const T* w, const Epilogue<T>& e, const Operand<T>& y,
                       const ConvGeom& g) {
  const DepthwiseStart<T> start = depthwise_start(e);  // no structured binding: lambdas use it (clang 14)
  const Epilogue<T>& rest = start.rest;
  const T* first = start.first;
  if constexpr (std::is_same_v<T, float>) {
    if (use_depthwise_channels_last(g, x, y, rest)) return depthwise_channels_last(x, w, rest, first, y, g);
    if (use_depthwise_planes(g, x, y, rest)) return depthwise_planes_forward(x, w, rest, first, y, g);
    if (use_depthwise_stride2_planes(g, x, y, rest)) return depthwise_stride2_planes_forward(x, w, rest, first, y, g);
    if (use_depthwise_channel_blocks(g, x)) return depthwise_channel_blocks(x, w, rest, first, y, g);
    if (flat_depthwise(g)) {
      note_kernel_path("depthwise rows");
      const int64_t Wp = g.W + 2 * g.pw, taps = g.kh * g.kw;
      parallel_for(g.N * g.O, g.P * taps, [&](int64_t b, int64_t end) {
        float* xp = thread_scratch<float, 0>(depthwise_padded_floats(g));
        float* yq = thread_scratch<float, 1>(depthwise_flat_outputs(g));
        std::vector<const float*> rows(taps);
        std::vector<float> tap_w(taps);
        for (int64_t it = b; it < end; ++it) {
          const int64_t n = it / g.O, o = it % g.O, c = o / g.Og;
          depthwise_plane_flat(x.p + n * x.s[0] + c * x.s[1], x.s[2], x.s[3], w + o * taps, first ? first[o] : 0.f, g,
                               xp, yq, rows.data(), tap_w.data());
          const bool flat_epilogue = !rest.residual && g.Wo < kDepthwiseShortRow;
          if (flat_epilogue) epilogue_positions(rest, n, o, 0, Wp, yq, yq, depthwise_flat_outputs(g));
          float* yp = y.p + n * y.s[0] + o * y.s[1];
          for (int64_t oh = 0; oh < g.Ho; ++oh)
            store_output_row(flat_epilogue ? Epilogue<float>{} : rest, n, o, oh, g.Wo, yq + oh * Wp, yp, y.s);
        }
      });
      return;
    }
  }
  note_kernel_path("depthwise direct");
  parallel_for(g.N * g.O, g.P * g.kh * g.kw, [&](int64_t b, int64_t end) {
    std::vector<T> buf(g.P);
    for (int64_t it = b; it < end; ++it) {
      int64_t n = it / g.O, o = it % g.O, c = o / g.Og;
      std::fill(buf.begin(), buf.end(), first ? first[o] : T(0));
      depthwise_plane(x.p + n * x.s[0] + c * x.s[1], x.s, w + o * g.kh * g.kw, g, buf.data());
      epilogue_positions(rest, n, o, 0, g.Wo, buf.data(), buf.data(), g.P);
      T* yp = y.p + n * y.s[0] + o * y.s[1];
      for (int64_t oh = 0; oh < g.Ho; ++oh)
        for (int64_t ow = 0; ow < g.Wo; ++ow) yp[oh * y.s[2] + ow * y.s[3]] = buf[oh * g.Wo + ow];
    }
  });
}

// The input gradient of one float32 plane (one output channel per input channel) through the
// row kernel over one long row: dy spread to the stride-s positions s * (oh * Wp + ow) of a zero
// padded plane dyu, behind M = the largest tap offset of zeros, gives every element p of the
// padded input plane as dx_pad[p] = Σ_t w_t * dyu[M + p - offset_t], the taps in order; dx is the
// inside of dx_pad. dy_rs and dx_rs are row strides (columns contiguous); dyu holds
// M + Hp * Wp + kDepthwiseRowSlack floats, dxp Hp * Wp, rows and tap_w kh * kw.
void depthwise_plane_input_flat(const float* dy, int64_t dy_rs, const float* w, const ConvGeom& g, float* dx,
                                int64_t dx_rs, float* dyu, float* dxp, const float** rows, float* tap_w) {
  const int64_t Hp = g.H + 2 * g.ph, Wp = g.W + 2 * g.pw, M = tap_offset(g, Wp, g.kh - 1, g.kw - 1);
  std::fill(dyu, dyu + M + Hp * Wp + kDepthwiseRowSlack, 0.f);
  for (int64_t oh = 0; oh < g.Ho; ++oh)
    for (int64_t ow = 0; ow < g.Wo; ++ow) dyu[M + g.sw * (oh * Wp + ow)] = dy[oh * dy_rs + ow];
  for (int64_t i = 0, t = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j, ++t) {
      rows[t] = dyu + M - tap_offset(g, Wp, i, j);
      tap_w[t] = w[t];
    }
  depthwise_row(Hp * Wp, g.kh * g.kw, rows, tap_w, 1, 0.f, dxp);
  for (int64_t h = 0; h < g.H; ++h)
    std::copy(dxp + (h + g.ph) * Wp + g.pw, dxp + (h + g.ph) * Wp + g.pw + g.W, dx + h * dx_rs);
}

template <typename T>
void depthwise_backward_input(const Operand<const T>& dy, const T* w, const Operand<T>& dx, const ConvGeom& g) {
  if constexpr (std::is_same_v<T, float>) {
    if (g.Og == 1 && flat_depthwise(g) && dy.s[3] == 1 && dx.s[3] == 1) {
      const int64_t Hp = g.H + 2 * g.ph, Wp = g.W + 2 * g.pw, taps = g.kh * g.kw;
      parallel_for(g.N * g.C, g.P * taps, [&](int64_t b, int64_t e) {
        float* dyu = thread_scratch<float, 0>(tap_offset(g, Wp, g.kh - 1, g.kw - 1) + Hp * Wp + kDepthwiseRowSlack);
        float* dxp = thread_scratch<float, 1>(Hp * Wp);
        std::vector<const float*> rows(taps);
        std::vector<float> tap_w(taps);
        for (int64_t it = b; it < e; ++it) {
          int64_t n = it / g.C, c = it % g.C;
          depthwise_plane_input_flat(dy.p + n * dy.s[0] + c * dy.s[1], dy.s[2], w + c * taps, g,
                                     dx.p + n * dx.s[0] + c * dx.s[1], dx.s[2], dyu, dxp, rows.data(), tap_w.data());
        }
      });
      return;
    }
  }
  parallel_for(g.N * g.C, g.Og * g.P * g.kh * g.kw, [&](int64_t b, int64_t e) {
    std::vector<T> buf(g.H * g.W);
    const int64_t bs[4] = {0, 0, g.W, 1};
    for (int64_t it = b; it < e; ++it) {
      int64_t n = it / g.C, c = it % g.C;
      std::fill(buf.begin(), buf.end(), T(0));
      for (int64_t m = 0; m < g.Og; ++m) {
        int64_t o = c * g.Og + m;
        const T* dyp = dy.p + n * dy.s[0] + o * dy.s[1];
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            T wv = w[(o * g.kh + i) * g.kw + j];
            Range rw = valid_range(j * g.dw, g.sw, g.pw, g.W, g.Wo);
            for (int64_t oh = 0; oh < g.Ho; ++oh) {
              int64_t ih = oh * g.sh - g.ph + i * g.dh;
              if (ih < 0 || ih >= g.H) continue;
              T* xr = buf.data() + ih * bs[2] + (j * g.dw - g.pw);
              const T* dyr = dyp + oh * dy.s[2];
              for (int64_t ow = rw.lo; ow < rw.hi; ++ow) xr[ow * g.sw] += wv * dyr[ow * dy.s[3]];
            }
          }
      }
      T* dxp = dx.p + n * dx.s[0] + c * dx.s[1];
      for (int64_t h = 0; h < g.H; ++h)
        for (int64_t x = 0; x < g.W; ++x) dxp[h * dx.s[2] + x * dx.s[3]] = buf[h * g.W + x];
    }
  });
}

// The weight gradient of a float32 depthwise conv, per output channel o: with each sample's input
// plane zero-padded (xp, Hp x Wp) and its dy spread to q = oh * Wp + ow of a zero row dyq of
// L = (Ho - 1) * Wp + Wo, tap t's gradient is Σ_q dyq[q] * xp[s * q + offset_t]: a dot product
// of contiguous rows (for stride 2 xp's even and odd elements are split first), summed over the
// samples in double.
void depthwise_weight_flat(const Operand<const float>& dy, const Operand<const float>& x, int64_t o, const ConvGeom& g,
                           float* dw) {
  const int64_t Hp = g.H + 2 * g.ph, Wp = g.W + 2 * g.pw, taps = g.kh * g.kw, L = (g.Ho - 1) * Wp + g.Wo;
  const int64_t half = (Hp * Wp + 1) / 2;
  float* xp = thread_scratch<float, 0>(Hp * Wp + 2 * half);
  float *even = xp + Hp * Wp, *odd = even + half;
  float* dyq = thread_scratch<float, 1>(L);
  std::vector<double> acc(taps, 0.0);
  for (int64_t n = 0; n < g.N; ++n) {
    const float* xc = x.p + n * x.s[0] + (o / g.Og) * x.s[1];
    std::fill(xp, xp + Hp * Wp, 0.f);
    for (int64_t h = 0; h < g.H; ++h) std::copy(xc + h * x.s[2], xc + h * x.s[2] + g.W, xp + (h + g.ph) * Wp + g.pw);
    if (g.sw == 2)
      for (int64_t k = 0; k < Hp * Wp; ++k) (k % 2 ? odd : even)[k / 2] = xp[k];
    const float* dyc = dy.p + n * dy.s[0] + o * dy.s[1];
    std::fill(dyq, dyq + L, 0.f);
    for (int64_t oh = 0; oh < g.Ho; ++oh) std::copy(dyc + oh * dy.s[2], dyc + oh * dy.s[2] + g.Wo, dyq + oh * Wp);
    for (int64_t i = 0, t = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j, ++t) {
        const int64_t off = tap_offset(g, Wp, i, j);
        const float* src = g.sw == 1 ? xp + off : (off % 2 ? odd : even) + off / 2;
        acc[t] += dot(L, dyq, src);
      }
  }
  for (int64_t t = 0; t < taps; ++t) dw[o * taps + t] = static_cast<float>(acc[t]);
}

template <typename T>
void depthwise_backward_weight(const Operand<const T>& dy, const Operand<const T>& x, T* dw, const ConvGeom& g) {
  if constexpr (std::is_same_v<T, float>) {
    if (flat_depthwise(g) && dy.s[3] == 1 && x.s[3] == 1) {
      parallel_for(g.O, g.N * g.P * g.kh * g.kw, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) depthwise_weight_flat(dy, x, o, g, dw);
      });
      return;
    }
  }
  parallel_for(g.O, g.N * g.P * g.kh * g.kw, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      int64_t c = o / g.Og;
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j) {
          Range rw = valid_range(j * g.dw, g.sw, g.pw, g.W, g.Wo);
          double acc = 0;
          for (int64_t n = 0; n < g.N; ++n) {
            const T* xp = x.p + n * x.s[0] + c * x.s[1];
            const T* dyp = dy.p + n * dy.s[0] + o * dy.s[1];
            for (int64_t oh = 0; oh < g.Ho; ++oh) {
              int64_t ih = oh * g.sh - g.ph + i * g.dh;
              if (ih < 0 || ih >= g.H) continue;
              const T* xr = xp + ih * x.s[2] + (j * g.dw - g.pw) * x.s[3];
              const T* dyr = dyp + oh * dy.s[2];
              T row = 0;
              for (int64_t ow = rw.lo; ow < rw.hi; ++ow) row += dyr[ow * dy.s[3]] * xr[ow * g.sw * x.s[3]];
              acc += row;
            }
          }
          dw[(o * g.kh + i) * g.kw + j] = static_cast<T>(acc);
        }
    }
  });
}

// ---------------------------------------------------------------- GEMM paths

// Small maps are lowered several samples side by side: m samples make one (K, m*P) matrix, so
// the GEMM has enough columns to pay for packing the weight (a ResNet's last stage at 32x32
// input has P = 1): up to about kGemmColumns columns, the n samples cut into equal groups (8
// samples of 7x7 maps as 4 + 4, not 5 + 3, which left one thread waiting for the other). The
// count depends on the shape only, so results do not depend on threads.
constexpr int64_t kGemmColumns = 256;
int64_t samples_per_gemm(const ConvGeom& g, int64_t n) {
  n = std::max<int64_t>(n, 1);
  const int64_t most = std::clamp<int64_t>(kGemmColumns / g.P, 1, n), groups = (n + most - 1) / most;
  return (n + groups - 1) / groups;
}

// A (channels, m*P) matrix of m samples' maps: the tensor itself (strides rs, cs) when m == 1
// and its (H, W) flatten to one stride, else a copy (dense rows of m*P) in the thread's scratch
// slot Slot.
template <typename T>
struct Columns {
  const T* p;
  int64_t rs, cs;
};
template <typename T, int Slot>
Columns<T> gather_columns(const Operand<const T>& t, int64_t n0, int64_t m, int64_t c0, int64_t channels, int64_t Ho,
                          int64_t Wo) {
  const T* base = t.p + n0 * t.s[0] + c0 * t.s[1];
  if (t.s[2] == Wo * t.s[3] && (m == 1 || t.s[0] == Ho * Wo * t.s[3])) return {base, t.s[1], t.s[3]};
  int64_t P = Ho * Wo, cols = m * P;
  T* buf = thread_scratch<T, Slot>(channels * cols);
  // Row by row, every other element by even_copy (a strided 1x1's view of float32 planes), the
  // channels over the threads where this runs outside a parallel region (one GEMM at a time):
  // ResNet-50's 256 -> 512 from 56x56 at batch 1 (Sapphire Rapids, 2 threads) with inputs out of
  // cache 1.01-1.05 -> 0.82-0.83 ms against one thread gathering element by element.
  parallel_for(channels, m * P, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t h = 0; h < Ho; ++h) {
          const T* src = base + i * t.s[0] + c * t.s[1] + h * t.s[2];
          T* dst = buf + c * cols + i * P + h * Wo;
          if constexpr (std::is_same_v<T, float>) {
            if (t.s[3] == 2) {
              even_copy(Wo, src, dst);
              continue;
            }
          }
          for (int64_t x = 0; x < Wo; ++x) dst[x] = src[x * t.s[3]];
        }
  });
  return {buf, cols, 1};
}

// col (K, m*P) <- im2col of samples [n0, n0+m), group gi, of x.
template <typename T>
void im2col_samples(const Operand<const T>& x, int64_t n0, int64_t m, int64_t gi, const ConvGeom& g, T* col) {
  for (int64_t i = 0; i < m; ++i) im2col(x.p + (n0 + i) * x.s[0] + gi * g.Cg * x.s[1], x.s, g, col + i * g.P, m * g.P);
}

// The (K, m*P) matrix of samples [n0, n0+m), group gi, of x: the input itself for a pointwise
// conv (gather_columns; with one position a sample, as a squeeze-excitation block's 1x1 maps,
// read in place through the samples' stride: gathered element by element, [8, 1152, 1, 1] took
// 34 us on Zen 4, its convolution to 48 channels 54 -> 24 us and 48 -> 1152 68 -> 40 us), else its
// receptive fields (im2col), in scratch slot 0.
template <typename T>
Columns<T> input_columns(const Operand<const T>& x, int64_t n0, int64_t m, int64_t gi, const ConvGeom& g) {
  if (is_pointwise(g) && g.H * g.W == 1) return {x.p + n0 * x.s[0] + gi * g.Cg * x.s[1], x.s[1], x.s[0]};
  if (is_pointwise(g)) return gather_columns<T, 0>(x, n0, m, gi * g.Cg, g.Cg, g.H, g.W);
  T* buf = thread_scratch<T, 0>(g.K * m * g.P);
  im2col_samples(x, n0, m, gi, g, buf);
  return {buf, m * g.P, 1};
}

// Runs item(n0, m, gi) for each GEMM of a forward convolution: samples [n0, n0 + m) of group
// gi (m from samples_per_gemm), items split over threads as for_items does; names the path
// (streamed: the output stored past the caches, see streamed_output).
template <typename F>
void for_gemm_items(const ConvGeom& g, bool bfloat16, bool streamed, F&& item) {
  const int64_t nb = samples_per_gemm(g, g.N), batches = (g.N + nb - 1) / nb;
  static const char* const paths[2][2][2] = {// [bfloat16][pointwise][samples side by side]
                                             {{"im2col+gemm", "im2col+gemm, samples side by side"},
                                              {"pointwise gemm", "pointwise gemm, samples side by side"}},
                                             {{"im2col+gemm bf16", "im2col+gemm bf16, samples side by side"},
                                              {"pointwise gemm bf16", "pointwise gemm bf16, samples side by side"}}};
  static const char* const streamed_paths[2] = {"im2col+gemm, streamed", "pointwise gemm, streamed"};
  note_kernel_path(streamed ? streamed_paths[is_pointwise(g)] : paths[bfloat16][is_pointwise(g)][nb > 1]);
  for_items(batches * g.G, nb * g.Og * g.K * g.P, [&](int64_t b, int64_t end) {
    for (int64_t it = b; it < end; ++it) {
      const int64_t n0 = it / g.G * nb;
      item(n0, std::min(nb, g.N - n0), it % g.G);
    }
  });
}

// ---------------------------------------------------------------- Winograd F(4x4, 3x3)

// Winograd's GEMMs get the tiles of several samples side by side when one sample has few (as
// samples_per_gemm does for im2col): about kWinogradColumns columns.
constexpr int64_t kWinogradColumns = 64;
int64_t winograd_samples(const ConvGeom& g) {
  const int64_t tiles = (g.Ho + 3) / 4 * ((g.Wo + 3) / 4);
  return std::clamp<int64_t>((kWinogradColumns + tiles - 1) / tiles, 1, std::max<int64_t>(g.N, 1));
}

// Whether a float32 convolution takes Winograd F(4x4, 3x3): 3x3, stride 1, no dilation, one
// group, enough channels for its 36 GEMMs (K = C, M = O) and enough 4x4 output tiles for their
// columns (winograd_samples' samples together). Measured on ResNet's, VGG's and DenseNet's shapes
// (docs/benchmarks.md): 1.6-2.1x faster than im2col + GEMM with 49 tiles and more, slower with
// 16 or 4 (14x14 and 7x7 maps of one sample), where the transformed weights (4x the weights, kept
// between calls by weight_form) and the GEMMs' few columns cost more than the 4x fewer
// multiplications save (2026-12-04, transformed weights kept: 1.4x the time of the position rows at
// 14x14 and 4.8x at 7x7 with 256 and 512 channels).
// Few output channels on maps of 16 tiles or fewer (DenseNet's 3x3 128 -> 32 at 14x14) leave the
// input transform (its cost per channel in, as the GEMMs' saving is per channel pair) the
// larger part: at batch 8 the position rows took 0.56x Winograd's time there (0.89x at 28x28,
// kept for batch 1's 1.06x; 1.6x at 56x56).
// Those comparisons (both rules) were with the position rows (AVX-512). Where the instruction set
// has no 7-row kernel (AVX2, generic) the other path is im2col and gemm's tiles, which Winograd
// beats from 16 tiles, few output channels too: measured on Zen 3 (AVX2), 2 threads, one process
// alternating, 3x3 layers of 128 to 512 channels on 14x14 maps at batch 1 (16 tiles) 0.49-0.67x
// the time, 512 at 7x7 at batch 8 (32 tiles) 0.68x, DenseNet's 128 -> 32 at 14x14 0.72x (batch 1)
// and 0.77x (batch 8), at 7x7 at batch 8 0.78x; at 7x7 with 4 and 8 tiles (batch 1 and 2)
// 1.1-1.6x.
constexpr int64_t kWinogradMinTiles = 36, kWinogradMinTilesWithoutPositionRows = 16;
constexpr int64_t kWinogradFewChannels = 64, kWinogradSmallMapTiles = 16;
bool use_winograd(const ConvGeom& g) {
  const int64_t tiles = (g.Ho + 3) / 4 * ((g.Wo + 3) / 4);
  const bool position_rows = has_rows_of_7_kernel();
  if (position_rows && g.O < kWinogradFewChannels && tiles <= kWinogradSmallMapTiles) return false;
  const int64_t min_tiles = position_rows ? kWinogradMinTiles : kWinogradMinTilesWithoutPositionRows;
  return g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.G == 1 && g.C >= 16 &&
         g.O >= 16 && tiles * winograd_samples(g) >= min_tiles;
}

// y = the convolution through F(4x4, 3x3) (the instruction set's transforms, gemm_kernels.h
// WinogradF43), nb = winograd_samples samples at a time: each input plane, zero-padded, becomes
// its 36 transformed planes of T tiles in V (36, C, nb * T); 36 GEMMs M[xi] (O, nb * T) =
// U[xi] (O, C) @ V[xi] with U (36, O, C) the transformed weights; each output plane's tiles come
// back from M by the output transform, row by row, get the epilogue and are stored through y's
// strides. Every element is computed by one thread in a fixed order.
// The transformed weights U (36, O, C) of winograd_forward from w (O, C, 3, 3), at
// u[xi * winograd_u_stride(g) + c * O + o]: each U[xi] (O, C) column-major, so that the GEMMs read
// it in place (they have few columns); the kernels in (C, O) order, transformed.
int64_t winograd_u_stride(const ConvGeom& g) {
  return g.O * g.C + 16;  // not a multiple of 4 KiB: the weight transform's 36 output streams
}
void winograd_weights(const float* w, const ConvGeom& g, float* u) {
  const int64_t pairs = g.O * g.C, u_stride = winograd_u_stride(g);
  float* const wt = thread_scratch<float, 6>(9 * pairs);
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t o = 0; o < g.O; ++o)
      std::copy(w + (o * g.C + c) * 9, w + (o * g.C + c) * 9 + 9, wt + (c * g.O + o) * 9);
  parallel_for(pairs, 36 * 9,
               [&](int64_t b, int64_t end) { winograd_f43().weight(end - b, wt + b * 9, u + b, u_stride); });
}

// y = the convolution by the weights transformed by winograd_weights.
// Each thread runs its own rounds of samples where the transformed weights U (36 x O x C) are at
// most this many times a round's transformed input V (36 x C x columns), i.e. O <= 4 * columns:
// measured at batch 8, 2 threads (Sapphire Rapids), 0.58-0.92x the time from ResNet's and
// DenseNet's 3x3 layers at 56x56 to 14x14 (U up to 4x V), 1.07-1.33x for VGG's 512 -> 512 at 14x14
// (U 8x V, each thread reading all of it).
constexpr int64_t kWinogradOwnRoundsChannels = 4;
// The channels of a channels-last input or output that winograd_forward transposes at once.
// Measured on Sapphire Rapids, 2 threads, against a plane at a time at a stride of C: 64 -> 64
// channels at 56x56 1.25 -> 0.65 ms at batch 1 (NCHW 0.46), 6.5 -> 4.3 ms at batch 8 (NCHW 3.5);
// 128 -> 128 at 28x28, batch 8, 4.45 -> 3.33 ms (NCHW 3.41).
constexpr int64_t kWinogradChannelBlock = 16;
static_assert(kWinogradChannelBlock >= kTransposeRowsMin, "a whole block is stored transposed");
void winograd_forward(const Operand<const float>& x, const float* u, const Epilogue<float>& e, const Operand<float>& y,
                      const ConvGeom& g) {
  const WinogradF43& kn = winograd_f43();
  const int64_t th = (g.Ho + 3) / 4, tw = (g.Wo + 3) / 4, T = th * tw;
  const int64_t nb = winograd_samples(g), cols = nb * T;  // GEMM columns: the tiles of nb samples
  const int64_t row_len = 4 * ((tw + 15) / 16 * 16) + 8;  // readable and writable lengths the kernels need
  const int64_t Hp = 4 * th + 2;                          // padded plane: Hp rows of row_len
  const int64_t u_stride = winograd_u_stride(g);
  // A channels-last input or output (each position's channels contiguous, rows of positions at one
  // stride) goes by blocks of channels, transposed, rather than a plane at a time at a stride of C.
  const bool x_channels_last = x.s[1] == 1 && x.s[3] >= g.C && g.C >= kWinogradChannelBlock;
  const bool y_channels_last =
      y.s[1] == 1 && y.s[2] == g.Wo * y.s[3] && g.O >= kWinogradChannelBlock && channels_last_residual(e);
  note_kernel_path(nb > 1 ? "winograd F(4x4,3x3), samples side by side" : "winograd F(4x4,3x3)");
  // Rounds of nb samples: each thread its own rounds where there are enough and the transformed
  // weights are not the larger part (each thread's data stays in its caches, no thread waits for
  // another, but each reads all of U), else round by round, each split over the threads.
  const int64_t rounds = (g.N + nb - 1) / nb;
  auto run = [&](int64_t r0, int64_t r1) {
    // The thread's scratch (kept between calls: no fresh pages), shared with the others while it
    // waits for them; every element is written before it is read (m's 16 extra floats are read past
    // its end by the output transform's last vector, and dropped).
    float* const v = thread_scratch<float, 8>(36 * g.C * cols);
    float* const m = thread_scratch<float, 9>(36 * g.O * cols + 16);
    for (int64_t n0 = r0 * nb; n0 < std::min(g.N, r1 * nb); n0 += nb) {
      const int64_t ns = std::min(nb, g.N - n0), used = ns * T;  // samples and columns of this round
      // V[xi] (C, cols): sample s's tiles at columns s * T + t. Each item is a block of cb planes
      // (channels-last: kWinogradChannelBlock channels, read a position's channels at a time and
      // transposed into the planes; else one plane).
      const int64_t cb = x_channels_last ? kWinogradChannelBlock : 1, blocks = (g.C + cb - 1) / cb;
      parallel_for(ns * blocks, cb * Hp * row_len, [&](int64_t b, int64_t end) {
        // The padding is the same for every plane: zeroed once, each plane overwrites the rest.
        float* planes = thread_scratch<float, 0>(cb * Hp * row_len);
        std::fill(planes, planes + cb * Hp * row_len, 0.f);
        const float* rows[6];
        for (int64_t it = b; it < end; ++it) {
          const int64_t s = it / blocks, c0 = it % blocks * cb, count = std::min(cb, g.C - c0);
          const float* xs = x.p + (n0 + s) * x.s[0];
          for (int64_t ih = 0; ih < g.H; ++ih) {
            float* dst = planes + (ih + g.ph) * row_len + g.pw;
            const float* src = xs + ih * x.s[2] + c0 * x.s[1];
            if (x_channels_last)  // (zeros past a row of fewer positions than a vector: its padding)
              transpose_copy(count, g.W, src, x.s[3], dst, Hp * row_len);
            else if (x.s[3] == 1)
              std::copy(src, src + g.W, dst);
            else
              for (int64_t iw = 0; iw < g.W; ++iw) dst[iw] = src[iw * x.s[3]];
          }
          for (int64_t c = 0; c < count; ++c)
            for (int64_t i = 0; i < th; ++i) {
              for (int j = 0; j < 6; ++j) rows[j] = planes + c * Hp * row_len + (4 * i + j) * row_len;
              kn.input(tw, rows, v + (c0 + c) * cols + s * T + i * tw, g.C * cols);
            }
        }
      });
      parallel_for(36, g.O * g.C * used, [&](int64_t x0, int64_t x1) {
        for (int64_t xi = x0; xi < x1; ++xi)
          gemm<float>(g.O, used, g.C, u + xi * u_stride, 1, g.O, v + xi * g.C * cols, cols, 1, m + xi * g.O * cols,
                      cols, 1, 0.f);
      });
      // Each item a block of ob output channels (channels-last: kWinogradChannelBlock, their rows
      // transposed into y a position's channels at a time, the epilogue applied there; else one).
      const int64_t ob = y_channels_last ? kWinogradChannelBlock : 1, out_blocks = (g.O + ob - 1) / ob;
      parallel_for(ns * out_blocks, 36 * T * ob, [&](int64_t b, int64_t end) {
        float* buf = thread_scratch<float, 1>(4 * ob * row_len);
        for (int64_t it = b; it < end; ++it) {
          const int64_t s = it / out_blocks, o0 = it % out_blocks * ob, count = std::min(ob, g.O - o0), n = n0 + s;
          for (int64_t i = 0; i < th; ++i) {
            for (int64_t c = 0; c < count; ++c) {  // channel o0 + c's 4 rows at buf + (4 c + a) * row_len
              float* rows[4];
              for (int a = 0; a < 4; ++a) rows[a] = buf + (4 * c + a) * row_len;
              kn.output(tw, m + (o0 + c) * cols + s * T + i * tw, g.O * cols, rows);
            }
            for (int64_t a = 0; a < 4 && 4 * i + a < g.Ho; ++a) {
              const int64_t oh = 4 * i + a;
              if (y_channels_last && count == kWinogradChannelBlock) {  // a whole block
                store_transposed(e, n, oh * g.Wo, g.Wo, g.Wo, o0, count, buf + a * row_len, 4 * row_len, y);
                continue;
              }
              for (int64_t c = 0; c < count; ++c)
                store_output_row(e, n, o0 + c, oh, g.Wo, buf + (4 * c + a) * row_len,
                                 y.p + n * y.s[0] + (o0 + c) * y.s[1], y.s);
            }
          }
        }
      });
    }
  };
  if (g.O <= kWinogradOwnRoundsChannels * cols)
    for_items(rounds, 36 * g.O * g.C * cols, run);
  else
    run(0, rounds);
}

// The input gradient of a float32 3x3 stride-1 convolution (one group, no dilation, padding up to
// 2) is the stride-1 3x3 convolution of dy padded by 2 - padding, with the kernels turned half a
// turn and their input and output channels swapped: through winograd_forward where use_winograd
// takes that convolution. Returns whether it did.
bool winograd_backward_input(const Operand<const float>& dy, const float* w, const Operand<float>& dx,
                             const ConvGeom& g) {
  if (g.G != 1 || g.kh != 3 || g.kw != 3 || g.sh != 1 || g.sw != 1 || g.dh != 1 || g.dw != 1 || g.ph > 2 || g.pw > 2)
    return false;
  ConvGeom t = g;
  t.C = t.Cg = g.O, t.O = t.Og = g.C;
  t.H = g.Ho, t.W = g.Wo, t.Ho = g.H, t.Wo = g.W;
  t.P = g.H * g.W, t.K = g.O * 9;
  t.ph = 2 - g.ph, t.pw = 2 - g.pw;
  if (!use_winograd(t)) return false;
  float* turned = thread_scratch<float, 10>(9 * g.O * g.C);  // (C, O, 3, 3)
  for (int64_t o = 0; o < g.O; ++o)
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t i = 0; i < 9; ++i) turned[(c * g.O + o) * 9 + i] = w[(o * g.C + c) * 9 + 8 - i];
  float* u = thread_scratch<float, 7>(36 * winograd_u_stride(t));
  winograd_weights(turned, t, u);
  winograd_forward(dy, u, Epilogue<float>{}, dx, t);
  return true;
}

// ---------------------------------------------------------------- output positions as rows

// Float32 convolutions of one group whose GEMMs have few columns (the positions of 7x7 and 14x14
// maps: 49 and 196 fill AVX-512's 32-column tiles to 49/64 and 196/224) run transposed, with the
// output positions as the rows of C in the 7-row tiles of gemm_b_panels (every map of a 224x224
// network from 56x56 down is a whole number of sevens) and the output channels as its columns:
//   C (cols, O) = columns^T (cols, K) @ W^T (K, O),
// W^T packed once and kept with the weight's storage when the weight cannot change while the
// result is used (weight_form.h), else packed for the call; columns^T is read in place, from the
// input itself (pointwise) or through offsets into a zero-padded copy (position_rows_input), each
// tile 7 positions of one output row (Wo a multiple of 7). A channels-last y is C itself; else C goes back to
// (channels, positions) in blocks of channels and positions through epilogue_into: a pass over the output that the
// standard path does not make, so the path is taken where the multiply-adds the standard tiles waste on padding
// columns, (padded - cols) * K per output channel, are at least kPositionRowsWaste per padded column. The sums are
// those of the standard path bit for bit (gemm_b_panels). Measured on Zen 4, 2 threads, batch 1, against the standard
// path: 0.59-0.91x the time at 7x7 and 14x14 with K of 160 to 4608 (ResNet's and DenseNet's last stages, MobileNet's
// and EfficientNet's 1x1 convolutions there), 0.96x with K = 256 at 14x14; slower where it is not taken: 1.24x with K =
// 64 at 14x14, 1.15-2.5x on 28x28 and 56x56 maps, whose tiles waste little.
constexpr int64_t kPositionRowsWaste = 32;
// Convolutions with taps read their input in place (position_rows_input), without im2col: with
// output rows of whole tiles (Wo a multiple of 7) and at least this K they take the path on any
// map. Measured on Zen 4, 2 threads, against im2col and the standard tiles (batch 1 and 8):
// ResNet's 7x7 stem (K = 147) 0.83-0.90x the time, 3x3 stride 2 from 56x56 (K = 1152) 0.82-0.88x;
// a 3x3 of 3 channels (K = 27) 1.10-1.55x, its C tiles' loads and stores over too few k.
constexpr int64_t kPositionRowsOffsetsMinK = 128;
bool use_position_rows(const ConvGeom& g) {
  if (g.G != 1 || g.O < 16 || !has_rows_of_7_kernel()) return false;
  const int64_t cols = samples_per_gemm(g, g.N) * g.P, nr = gemm_tile_columns();
  const int64_t padded = (cols + nr - 1) / nr * nr;
  if (g.Wo % 7 != 0) return false;
  if (!is_pointwise(g) && g.K >= kPositionRowsOffsetsMinK) return true;
  return (padded - cols) * g.K >= kPositionRowsWaste * padded;
}

// Channels and positions per block of the transposing store.
constexpr int64_t kPositionRowsStoreChannels = 64, kPositionRowsStoreColumns = 256;

// Where a position-rows GEMM of samples [n0, n0 + m) reads its A (cols, K) (RowsOf7Input: an
// implicit im2col; every 7-row tile is 7 positions of one output row, as Wo is a multiple of 7): a
// pointwise convolution reads the input itself in place (its channels at a stride, or through
// offsets when its positions are not contiguous), one with taps a zero-padded copy of the input's
// planes through offsets (only the rows its tiles' windows cover are written: position_rows_pad).
// A pointwise one of every other position of channel planes (a strided 1x1, as ResNet's
// downsampling, is the pointwise one of that view) reads a dense copy of them (gather_columns,
// channels m * P floats apart): read in place, each step of k a channel plane of its own, an
// input out of cache cost a miss per step that no prefetcher follows (ResNet-50's 512 -> 1024
// from 28x28 at batch 1, Sapphire Rapids, 2 threads: 1.16-1.25 ms with inputs out of cache,
// 0.88-0.93 in cache).
struct PositionRowsInput {
  int64_t plane, Wp;                          // the padded copy's plane and row (taps)
  int64_t step;                               // between a tile's positions
  int64_t k_stride;                           // between channels, without offsets
  bool gathered;                              // read from gather_columns' copy
  std::vector<int64_t> offsets, tile_starts;  // per k (or none), per tile
  RowsOf7Input at(const float* a) const {
    return {a, tile_starts.data(), offsets.empty() ? nullptr : offsets.data(), k_stride, step};
  }
};
PositionRowsInput position_rows_input(const Operand<const float>& x, int64_t m, const ConvGeom& g) {
  PositionRowsInput in{};
  const bool pointwise = is_pointwise(g);
  in.Wp = g.W + 2 * g.pw, in.plane = (g.H + 2 * g.ph) * in.Wp;
  in.gathered = pointwise && x.s[3] != 1 && x.s[1] >= x.s[2];
  if (in.gathered) {
    in.step = 1, in.k_stride = m * g.P;
    in.tile_starts.resize(m * g.P / 7);
    for (int64_t t = 0; t < static_cast<int64_t>(in.tile_starts.size()); ++t) in.tile_starts[t] = 7 * t;
    return in;
  }
  in.step = pointwise ? x.s[3] : g.sw;
  in.k_stride = x.s[1];
  const int64_t sample = pointwise ? x.s[0] : g.C * in.plane, row = pointwise ? x.s[2] : g.sh * in.Wp,
                column = pointwise ? x.s[3] : g.sw;
  if (!pointwise || in.step != 1) {
    in.offsets.resize(g.K);
    for (int64_t c = 0, k = 0; c < g.C; ++c)
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j, ++k)
          in.offsets[k] = pointwise ? c * x.s[1] : c * in.plane + i * g.dh * in.Wp + j * g.dw;
  }
  in.tile_starts.resize(m * g.P / 7);
  for (int64_t t = 0; t < static_cast<int64_t>(in.tile_starts.size()); ++t) {
    const int64_t s = t * 7 / g.P, p = t * 7 % g.P;
    in.tile_starts[t] = s * sample + p / g.Wo * row + p % g.Wo * column;
  }
  return in;
}

// Writes into `padded` (laid out as position_rows_input's plane and Wp, samples [n0, n0 + m)) the
// rows that the windows of output positions [q0, q1) (counted from sample n0's first) read: the
// input's rows, zero-padded, and the padding rows among them.
void position_rows_pad(const Operand<const float>& x, int64_t n0, int64_t q0, int64_t q1, const PositionRowsInput& in,
                       const ConvGeom& g, float* padded) {
  for (int64_t s = q0 / g.P; s * g.P < q1; ++s) {
    const int64_t first = std::max(q0 - s * g.P, int64_t{0}) / g.Wo,
                  last = (std::min(q1 - s * g.P, g.P) - 1) / g.Wo;                      // output rows
    const int64_t r0 = first * g.sh, r1 = last * g.sh + (g.kh - 1) * g.dh + 1;          // padded rows [r0, r1)
    const int64_t h0 = std::max(r0 - g.ph, int64_t{0}), h1 = std::min(r1 - g.ph, g.H);  // input rows
    for (int64_t c = 0; c < g.C; ++c) {
      const float* src = x.p + (n0 + s) * x.s[0] + c * x.s[1];
      float* dst = padded + (s * g.C + c) * in.plane;
      std::fill(dst + r0 * in.Wp, dst + r1 * in.Wp, 0.f);  // one call, not three a row: these rows are short
      for (int64_t h = h0; h < h1; ++h) {
        float* out = dst + (g.ph + h) * in.Wp + g.pw;
        if (x.s[3] == 1)
          std::copy_n(src + h * x.s[2], g.W, out);
        else
          for (int64_t w = 0; w < g.W; ++w) out[w] = src[h * x.s[2] + w * x.s[3]];
      }
    }
  }
}

// Each GEMM item is split over the threads (when the items themselves are not) as gemm splits its
// products, in a grid of tiles (positions) by panels of output channels (gemm_thread_grid), and
// each thread makes its rectangle's share of everything: the padded rows its windows read, its
// sums, their transposing store into y. So no thread waits for another between the three, and
// each reads what it wrote from its own cache.
void position_rows_forward(const Operand<const float>& x, const float* wt, const Epilogue<float>& e,
                           const Operand<float>& y, const ConvGeom& g) {
  const int64_t nb = samples_per_gemm(g, g.N), batches = (g.N + nb - 1) / nb, nr = rows_of_7_tile_columns();
  const int64_t panels = (g.O + nr - 1) / nr;
  note_kernel_path(nb > 1 ? "position rows gemm, samples side by side" : "position rows gemm");
  for_items(batches, nb * g.O * g.K * g.P, [&](int64_t b, int64_t end) {
    for (int64_t it = b; it < end; ++it) {
      const int64_t n0 = it * nb, m = std::min(nb, g.N - n0), cols = m * g.P, tiles = cols / 7;
      const PositionRowsInput in = position_rows_input(x, m, g);
      // A gathered input's dense copy, made by the threads together before they split the product.
      const float* gathered = in.gathered ? gather_columns<float, 0>(x, n0, m, 0, g.C, g.H, g.W).p : nullptr;
      const bool channels_last = y.s[1] == 1 && y.s[2] == g.Wo * y.s[3] && (m == 1 || y.s[0] == g.P * y.s[3]);
      // Channels-last: C (cols, O) is y itself, else a block of sums stored into y transposed.
      float* sums = channels_last ? nullptr : thread_scratch<float, 1>(cols * g.O);
      const ConvBlockOutput<float, float> out{&e, y, n0, 0, g.P, g.Wo};
      // Tiles [t0, t1) of output channels [c0, c1).
      auto rectangle = [&](int64_t t0, int64_t t1, int64_t c0, int64_t c1) {
        const float* a = in.gathered ? gathered : x.p + n0 * x.s[0];
        if (!is_pointwise(g)) {
          float* padded = thread_scratch<float, 0>(m * g.C * in.plane);
          position_rows_pad(x, n0, 7 * t0, 7 * t1, in, g, padded);
          a = padded;
        }
        if (channels_last) {
          const GemmOutput<float> block_out{&e, n0, c0, g.Wo, g.P};
          const GemmEpilogue<float> epilogue{epilogue_gemm_block_positions, &block_out};
          gemm_rows_of_7_offsets(t0, t1, in.at(a), c1 - c0, g.K, wt + c0 * g.K, y.p + n0 * y.s[0] + c0, y.s[3], 1,
                                 e.is_identity() ? nullptr : &epilogue);
          return;
        }
        gemm_rows_of_7_offsets(t0, t1, in.at(a), c1 - c0, g.K, wt + c0 * g.K, sums + c0, g.O, 1, nullptr);
        // Back to (channels, positions) in blocks of channels and of positions, each block's
        // rows runs of positions for epilogue_into.
        float* t = thread_scratch<float, 11>(kPositionRowsStoreChannels * kPositionRowsStoreColumns +
                                             16);  // transpose_copy's slack
        for (int64_t o0 = c0; o0 < c1; o0 += kPositionRowsStoreChannels)
          for (int64_t j0 = 7 * t0; j0 < 7 * t1; j0 += kPositionRowsStoreColumns) {
            const int64_t count = std::min(kPositionRowsStoreChannels, c1 - o0),
                          len = std::min(kPositionRowsStoreColumns, 7 * t1 - j0);
            transpose_copy(count, len, sums + j0 * g.O + o0, g.O, t, len);
            epilogue_into<float, float>(&out, t, len, 1, o0, count, j0, len);
          }
      };
      const int64_t team = std::min(available_threads(), tiles * panels);
      const GemmGrid grid = gemm_thread_grid(team, tiles, panels, 7, nr);
      parallel_for(team, 7 * tiles * g.K * g.O / team, [&](int64_t q0, int64_t q1) {
        for (int64_t q = q0; q < q1; ++q) {
          const int64_t i = q / grid.tn, j = q % grid.tn;
          const int64_t t0 = tiles * i / grid.tm, t1 = tiles * (i + 1) / grid.tm;
          const int64_t c0 = std::min(g.O, panels * j / grid.tn * nr),
                        c1 = std::min(g.O, panels * (j + 1) / grid.tn * nr);
          if (t0 < t1 && c0 < c1) rectangle(t0, t1, c0, c1);
        }
      });
    }
  });
}

// Float32 convolutions of an input with few channels (a network's 3-channel stem: K = 27 for a
// 3x3) by rows of output positions: for each output row, the input rows its taps read are copied
// zero-padded (and de-interleaved for stride 2) into a small buffer, and the instruction set's
// kernel (conv_rows) makes every output channel's sums of the row in registers, each over the taps
// in order from zero as im2col + gemm sums k: the same bits, without the (K, P) matrix that one
// thread writes before a GEMM whose tiles get too few k to pay for their loads and stores. The
// sums then get the epilogue on their way into y (epilogue_into, as gemm's blocks). Measured on
// Zen 4, 2 threads, against im2col + gemm (alternating): 3x3 stride 2 from 224x224 to 16, 24 and
// 32 channels 0.60-0.79x the time at batch 1, 0.74-0.96x at batch 8; VGG's 3x3 stride 1 to 64
// channels 0.72x at batch 1, 1.05x at batch 8 (taken anyway). ResNet's 7x7 stem too, rather than
// the position rows (which give the same bits): 0.96-0.99x on Zen 4; on Sapphire Rapids, 2
// threads, 0.87-0.89x at batch 1 and 0.80-0.89x at batch 8 (1 thread 0.83-0.89x and 0.98-1.12x).
// An output of more than kStreamedFirstLayerBytes goes into y past the caches (epilogue_streamed).
// Pointwise convolutions of few channels (a
// squeeze-excitation's 4 -> 96 on a 1x1 map) keep gemm, whose smallest products are plain dot
// products (rounded otherwise than the micro-kernel's sums made here).
constexpr int64_t kFewChannels = 4;
bool use_few_channel_rows(const ConvGeom& g) {
  return g.G == 1 && g.C <= kFewChannels && !is_pointwise(g) && g.O % kConvRowsChannels == 0 && g.dh == 1 &&
         g.dw == 1 && (g.sw == 1 || g.sw == 2) && g.sh == g.sw;
}

// The few-channel rows of one convolution: its weights tap-major, and each output row's sums
// (row_sums) from a thread's buffers (RowBuffers).
class FewChannelRows {
 public:
  FewChannelRows(const float* w, const ConvGeom& g)
      : g_(g),
        n_((g.Wo + conv_rows_lanes() - 1) / conv_rows_lanes() * conv_rows_lanes()),
        part_(n_ + g.kw + 2 * conv_rows_lanes()),
        Wp_(g.W + 2 * g.pw),
        wt_(g.K * g.O) {
    for (int64_t o = 0; o < g.O; ++o)
      for (int64_t t = 0; t < g.K; ++t) wt_[t * g.O + o] = w[o * g.K + t];
  }
  // The sums' row length: Wo rounded up to whole vectors.
  int64_t n() const { return n_; }
  // A thread's rows of input: a tap reads its row from position j / stride of one of the row's
  // parts (both parts for stride 2: even and odd positions), n + kw positions and slack long. Each
  // channel's input rows are kept in a ring of kh places (input row ih at ih % kh), so that an
  // output row makes only the rows its window has beyond the last one's (stride 2: 2 of 7 for
  // ResNet's stem); rows of padding read one zero row. Measured on Sapphire Rapids, 2 threads,
  // against every row made for every output row: MobileNet's 3x3 stride-2 stem to 32 channels at
  // batch 8 1.35-1.40 -> 1.17-1.19 ms, ResNet's 7x7 stem 8.55 -> 8.22-8.27 ms (batch 1 unchanged).
  struct RowBuffers {
    float* parts;
    float* zeros;               // a padding row's parts
    float* padded;              // one input row, zero-padded
    std::vector<int64_t> held;  // the row each place holds, s * H + ih (-1: none)
    std::vector<const float*> rows;
  };
  RowBuffers row_buffers() const {
    const int64_t ring = g_.C * g_.kh * g_.sw * part_, floats = ring + g_.sw * part_ + Wp_ + part_;
    float* parts = thread_scratch<float, 15>(floats);
    std::fill(parts, parts + floats, 0.f);
    return {parts, parts + ring, parts + ring + g_.sw * part_, std::vector<int64_t>(g_.C * g_.kh, -1),
            std::vector<const float*>(g_.K)};
  }
  // Output row oh of sample s: every output channel's sums, sums[o * n() + j].
  void row_sums(const Operand<const float>& x, int64_t s, int64_t oh, RowBuffers& b, float* sums) const {
    for (int64_t c = 0; c < g_.C; ++c)
      for (int64_t i = 0; i < g_.kh; ++i) {
        const int64_t ih = oh * g_.sh - g_.ph + i, place = c * g_.kh + (ih % g_.kh + g_.kh) % g_.kh;
        const float* row = b.zeros;
        if (ih >= 0 && ih < g_.H) {
          float* kept = b.parts + place * g_.sw * part_;
          if (b.held[place] != s * g_.H + ih) {
            const float* src = x.p + s * x.s[0] + c * x.s[1] + ih * x.s[2];
            float* dst = g_.sw == 1 ? kept : b.padded;  // stride 2: de-interleaved from padded
            if (x.s[3] == 1)
              std::copy_n(src, g_.W, dst + g_.pw);
            else
              for (int64_t v = 0; v < g_.W; ++v) dst[g_.pw + v] = src[v * x.s[3]];
            if (g_.sw == 2) {
              even_copy((Wp_ + 1) / 2, b.padded, kept);
              even_copy(Wp_ / 2, b.padded + 1, kept + part_);
            }
            b.held[place] = s * g_.H + ih;
          }
          row = kept;
        }
        for (int64_t j = 0; j < g_.kw; ++j) b.rows[(c * g_.kh + i) * g_.kw + j] = row + j % g_.sw * part_ + j / g_.sw;
      }
    conv_rows(n_, g_.K, b.rows.data(), wt_.data(), g_.O, sums, n_);
  }

 private:
  const ConvGeom& g_;
  int64_t n_, part_, Wp_;
  std::vector<float> wt_;  // tap-major
};

void few_channel_rows_forward(const Operand<const float>& x, const float* w, const Epilogue<float>& e,
                              const Operand<float>& y, const ConvGeom& g) {
  note_kernel_path("few-channel rows");
  const FewChannelRows conv(w, g);
  const ConvBlockOutput<float, float> out{&e, y, 0, 0, g.P, g.Wo};
  const bool streamed = streamed_output(y, g, kStreamedFirstLayerBytes);
  parallel_for(g.N * g.Ho, g.O * g.K * g.Wo, [&](int64_t first, int64_t last) {
    FewChannelRows::RowBuffers buffers = conv.row_buffers();
    float* sums = thread_scratch<float, 16>(g.O * conv.n());
    for (int64_t it = first; it < last; ++it) {
      const int64_t s = it / g.Ho, oh = it % g.Ho;
      conv.row_sums(x, s, oh, buffers, sums);
      if (streamed) {
        const StreamedOutput row{out, s * g.P + oh * g.Wo};
        epilogue_streamed(&row, sums, conv.n(), 1, 0, g.O, 0, g.Wo);
      } else {
        epilogue_into<float, float>(&out, sums, conv.n(), 1, 0, g.O, s * g.P + oh * g.Wo, g.Wo);
      }
    }
  });
}

// The convolution's output rows through its epilogue and a max pool (p, values only) into y (N,
// O, Hp, Wp), dense NCHW, on the few-channel rows: each thread takes whole pooled rows in order,
// makes each convolution row the next pooled row's window needs (once: a ring of the window's
// rows, O x Wo values each, stays in the thread's cache) and pools each channel's rows from there
// (max_pool_row). The convolution's rows get the few-channel rows' sums and epilogue_into's
// epilogue (epilogue_positions, no residual) and the pool the max_pool2d kernel's comparisons, so y
// has the bits of the two ops one after the other; the convolution's output (O x Ho x Wo values a
// sample) never goes to memory. Measured on Sapphire Rapids, 2 threads, ResNet's stem (7x7 stride
// 2 to 64 channels, then 3x3 stride 2) against the two ops: alone 1.14-1.15 ms against 1.24-1.26 at
// batch 1, 9.6-9.95 against 10.6-11.2 at batch 8; in ResNet-18 (the two ways alternating, 3 runs
// each) 14.6 ms against 15.1 at batch 1, 88.6 against 91.2 at batch 8, as the layers after the
// stem also find more of their data in cache.
void few_channel_rows_max_pool_forward(const Operand<const float>& x, const float* w, const Epilogue<float>& e,
                                       const Operand<float>& y, const ConvGeom& g, const Pool2dParams& pool, int64_t Hp,
                                       int64_t Wp) {
  note_kernel_path("few-channel rows, max pool rows");
  const FewChannelRows conv(w, g);
  const int64_t ring = (pool.kernel[0] - 1) * pool.dilation[0] + 1, row_floats = g.O * g.Wo;
  const int64_t per_pooled_row = g.O * g.K * g.Wo * std::min(pool.stride[0], ring);
  parallel_for(g.N * Hp, per_pooled_row, [&](int64_t first, int64_t last) {
    FewChannelRows::RowBuffers buffers = conv.row_buffers();
    float* sums = thread_scratch<float, 16>(g.O * conv.n());
    float* rows = thread_scratch<float, 13>(ring * row_floats);
    const int64_t rows_max_floats = max_pool_row_floats(pool, g.Wo, Wp);
    float* rows_max = thread_scratch<float, 21>(rows_max_floats);
    std::fill(rows_max, rows_max + rows_max_floats, -std::numeric_limits<float>::infinity());
    std::vector<const float*> window(pool.kernel[0]);
    std::vector<int64_t> held(ring, -1);  // the row each place of the ring holds, s * Ho + h
    for (int64_t it = first; it < last; ++it) {
      const int64_t s = it / Hp, ph = it % Hp;
      const MaxPoolRows in = max_pool_rows(pool, g.Ho, ph);
      // A window's rows lie within `ring` rows, each at its own place h % ring.
      for (int64_t h = in.first; h < in.end; h += in.step) {
        if (held[h % ring] == s * g.Ho + h) continue;
        conv.row_sums(x, s, h, buffers, sums);
        float* row = rows + h % ring * row_floats;
        for (int64_t o = 0; o < g.O; ++o)
          epilogue_positions(e, s, o, h * g.Wo, g.Wo, sums + o * conv.n(), row + o * g.Wo, g.Wo);
        held[h % ring] = s * g.Ho + h;
      }
      for (int64_t o = 0; o < g.O; ++o)
        max_pool_output_row(
            pool, g.Ho, ph, [&](int64_t h) { return rows + h % ring * row_floats + o * g.Wo; }, g.Wo, Wp, window.data(),
            rows_max, y.p + s * y.s[0] + o * y.s[1] + ph * y.s[2]);
    }
  });
}

// The forward convolution of x by the weight w (O, Cg, kh, kw), contiguous.
template <typename T>
void conv_forward(const Operand<const T>& x, const Tensor& weight, const Epilogue<T>& e, const Operand<T>& y,
                  const ConvGeom& g) {
  if (g.kh == 1 && g.kw == 1 && g.ph == 0 && g.pw == 0 && (g.sh > 1 || g.sw > 1)) {
    // A strided 1x1 convolution without padding (ResNet's downsampling) is the pointwise one of
    // the input's every stride-th row and column, a view the pointwise paths gather densely: the
    // same sums. Measured on Sapphire Rapids, 1 thread, 256 -> 512 channels from 56x56: batch 8
    // 22.1 -> 13.0 ms, batch 1 2.48 -> 1.33 ms (it copied the whole input, padded, and read it
    // through offsets).
    ConvGeom pointwise = g;
    pointwise.H = g.Ho, pointwise.W = g.Wo, pointwise.sh = pointwise.sw = 1;
    return conv_forward(Operand<const T>{x.p, {x.s[0], x.s[1], x.s[2] * g.sh, x.s[3] * g.sw}}, weight, e, y, pointwise);
  }
  const T* w = weight.data_ptr<T>();
  if (g.Cg == 1 && g.G > 1) return depthwise_forward(x, w, e, y, g);
  std::shared_ptr<const void> hold;
  if constexpr (std::is_same_v<T, float>) {
    if (use_winograd(g)) {
      const float* u = weight_form<7>(
          weight, g.keep_weight_forms, WeightForm::winograd, g.O, g.K, 36 * winograd_u_stride(g),
          [&](const float* w32, float* dst) { winograd_weights(w32, g, dst); }, hold);
      return winograd_forward(x, u, e, y, g);
    }
    if (use_few_channel_rows(g)) return few_channel_rows_forward(x, w, e, y, g);
    if (use_position_rows(g)) {
      const float* panels = weight_form<12>(
          weight, g.keep_weight_forms, WeightForm::rows_of_7_panels, g.O, g.K,
          packed_b_floats(GemmTile::rows_of_7, g.K, g.O),
          [&](const float* w32, float* dst) { pack_b_panels(GemmTile::rows_of_7, g.K, g.O, w32, 1, g.K, dst); }, hold);
      return position_rows_forward(x, panels, e, y, g);
    }
  }
  // Where the weight's forms are kept, each group's weight packed once as gemm_a_panels' A, read
  // by every call instead of packed by it (a weight whose rows gemm read in place, as at batch 1
  // on small maps, is read in the same panels: one stream per K block rather than a stream per
  // row of a tile). Measured on Zen 3 (AVX2), 2 threads, one process alternating: 1x1 layers
  // with 1-8 MB weights on 7x7 and 14x14 maps 0.77-0.92x the time (those whose rows are 4 KiB
  // apart, K = 1024 or 2048, gemm packed on every call), 3x3 layers 0.96-1.03x; resnet50 0.93x
  // at batch 1 and 0.92x at batch 8, densenet121 0.96x and 0.94x, mobilenet_v2 0.98x and 0.95x,
  // efficientnet_b0's kernels 0.95x at batch 1; the panels are one more copy of these weights
  // (resnet50 at batch 1: 152 -> 235 MiB peak resident memory). Made (or found kept) by the first
  // product that takes them: none for a channels-last output, whose products gemm computes
  // transposed, nor for dot products (1x1 maps).
  const bool keeps_a_panels = std::is_same_v<T, float> && keeps_weight_forms(weight, g.keep_weight_forms);
  const int64_t group_a_floats = packed_a_floats(g.Og, g.K);
  std::once_flag a_panels_made;
  const float* a_panels = nullptr;
  auto kept_a_panels = [&] {
    std::call_once(a_panels_made, [&] {
      a_panels = weight_form<21>(
          weight, true, a_panels_form(gemm_tile_rows(), gemm_k_block()), g.Og, g.K, g.G * group_a_floats,
          [&](const float* w32, float* dst) {
            for (int64_t gi = 0; gi < g.G; ++gi)
              pack_a_panels(g.Og, g.K, w32 + gi * g.Og * g.K, g.K, 1, dst + gi * group_a_floats);
          },
          hold);
    });
    return a_panels;
  };
  bool streamed = false;
  if constexpr (std::is_same_v<T, float>) streamed = streamed_output(y, g);
  for_gemm_items(g, false, streamed, [&](int64_t n0, int64_t m, int64_t gi) {
    const int64_t cols = m * g.P;
    const Columns<T> B = input_columns(x, n0, m, gi, g);  // (K, cols)
    const T* wg = w + gi * g.Og * g.K;
    T* yg = y.p + n0 * y.s[0] + gi * g.Og * y.s[1];
    // C (Og, n) = W_g (Og, K) @ B's columns from b, from the kept A panels where gemm takes them.
    auto weight_product = [&](int64_t n, const T* b, T* c, int64_t c_rs, int64_t c_cs, const GemmEpilogue<T>* epilogue,
                              bool b_in_cache) {
      if constexpr (std::is_same_v<T, float>) {
        if (keeps_a_panels && gemm_takes_a_panels(g.Og, n, g.K, B.rs, c_rs, c_cs))
          return gemm_a_panels(g.Og, n, g.K, kept_a_panels() + gi * group_a_floats, b, B.rs, B.cs, c, c_rs, c_cs, 0.f,
                               epilogue, b_in_cache);
      }
      gemm<T>(g.Og, n, g.K, wg, g.K, 1, b, B.rs, B.cs, c, c_rs, c_cs, T(0), epilogue, b_in_cache);
    };
    // Y (Og, cols) = W_g (Og, K) @ B, into y itself when one dense sample, else into a block
    // stored into y by epilogue_into; either way the epilogue is applied inside the GEMM, on
    // blocks still in cache.
    // (channels-last samples follow each other: one matrix of m * P columns)
    bool in_place = y.s[2] == g.Wo * y.s[3] && (m == 1 || y.s[0] == g.P * y.s[3]);
    if constexpr (std::is_same_v<T, float>) {
      if (streamed) {  // in chunks of columns, so that the sums stay in cache
        float* sums = thread_scratch<float, 1>(g.Og * kStreamedColumns);
        for (int64_t c0 = 0; c0 < cols; c0 += kStreamedColumns) {
          const int64_t nc = std::min(kStreamedColumns, cols - c0);
          const StreamedOutput out{{&e, y, n0, gi * g.Og, g.P, g.Wo}, c0};
          const GemmEpilogue<float> epilogue{epilogue_streamed, &out};
          weight_product(nc, B.p + c0 * B.cs, sums, nc, 1, &epilogue, false);
        }
        return;
      }
    }
    if (in_place) {
      const GemmOutput<T> block_out{&e, n0, gi * g.Og, g.Wo, g.P};
      GemmEpilogue<T> epilogue{epilogue_gemm_block<T>, &block_out};
      // One dense NCHW sample, its residual's rows dense too: the GEMM's kernels may apply the
      // epilogue to whole tiles themselves (GemmRowsEpilogue), as epilogue_gemm_block would, with
      // no pass over the output after them. Measured on Sapphire Rapids, 2 threads, batch 1:
      // MobileNet v2's expansions 16 -> 96 at 112x112 0.246 -> 0.183 ms, 24 -> 144 at 56x56 0.11
      // -> 0.089, 32 -> 192 at 28x28 0.056 -> 0.04; ResNet-50's 64 -> 256 at 56x56 with its
      // residual 0.48 -> 0.41 ms.
      GemmRowsEpilogue rows{};
      if constexpr (std::is_same_v<T, float>) {
        if (m == 1 && y.s[3] == 1 && (!e.residual || (e.rs[3] == 1 && e.rs[2] == g.Wo))) {
          const int64_t o0 = gi * g.Og;
          rows = {{e.scale ? e.scale + o0 : nullptr, e.shift ? e.shift + o0 : nullptr,
                   e.residual ? e.residual + n0 * e.rs[0] + o0 * e.rs[1] : nullptr, e.rs[1]},
                  row_activation(e.activation)};
          epilogue.rows = &rows;
        }
      }
      weight_product(cols, B.p, yg, y.s[1], y.s[3], e.is_identity() ? nullptr : &epilogue, input_in_cache<T>(g));
      return;
    }
    T* sums = thread_scratch<T, 1>(g.Og * cols);
    const ConvBlockOutput<T, T> out{&e, y, n0, gi * g.Og, g.P, g.Wo};
    const GemmEpilogue<T> epilogue{epilogue_into<T, T>, &out};
    weight_product(cols, B.p, sums, cols, 1, &epilogue, input_in_cache<T>(g));
  });
}

// A convolution of a bfloat16 input and weight other than depthwise: gemm's bfloat16 form
// (float32 sums) into a float32 block per item, then epilogue_into y.
template <typename Y>
void conv_forward_bf16(const Operand<const BFloat16>& x, const BFloat16* w, const Epilogue<float, Y>& e,
                       const Operand<Y>& y, const ConvGeom& g) {
  for_gemm_items(g, true, false, [&](int64_t n0, int64_t m, int64_t gi) {
    const int64_t cols = m * g.P;
    const Columns<BFloat16> B = input_columns(x, n0, m, gi, g);  // (K, cols)
    float* sums = thread_scratch<float, 1>(g.Og * cols);
    const ConvBlockOutput<float, Y> out{&e, y, n0, gi * g.Og, g.P, g.Wo};
    const GemmEpilogue<float> epilogue{epilogue_into<float, Y>, &out};
    gemm(g.Og, cols, g.K, w + gi * g.Og * g.K, g.K, 1, B.p, B.rs, B.cs, sums, cols, 1, 0.f, &epilogue);
  });
}

// ---------------------------------------------------------------- inverted residual blocks

// The layers of an inverted residual block (ops.h, inverted_residual), float32: the expansion
// (absent: null), the depthwise layer with g its geometry over the whole input (N, E, H, W) ->
// (N, E, Ho, Wo), the projection (absent: null) with its epilogue's residual the block's input.
struct InvertedResidualLayers {
  const Tensor* expand;
  Epilogue<float> expand_e;
  const Tensor& depthwise;
  Epilogue<float> depthwise_e;
  ConvGeom g;
  const Tensor* project;
  Epilogue<float> project_e;
  bool add_input;
  int64_t C, O;  // channels in and out of the block
};

// A 1x1 convolution's geometry in an inverted residual block: n samples of (C, H, W) -> (O, H, W).
// Its weight's forms may be kept: the op runs the block only where no input requires grad.
ConvGeom pointwise_geom(int64_t n, int64_t C, int64_t O, int64_t H, int64_t W) {
  return ConvGeom{n, C, H, W, O, 1, C, O, 1, 1, H, W, H * W, C, 1, 1, 0, 0, 1, 1, true};
}

// The input rows [first, first + count) of the map the depthwise layer reads for its output rows
// [r0, r1) of m samples, and its geometry g over them (kept: g's output row of output row r0):
// - all of them: the layer's own geometry;
// - with stride 1 and "same" padding, the rows it reaches inside the map: g keeps their count,
//   its padding the map's edges, and the outputs of the rows past [r0, r1) are dropped;
// - else exactly the rows it reads, those outside the map zeros in the buffer (zero_rows): g
//   without vertical padding.
// (Each depthwise path needs a consistent geometry: as many output rows as the input rows and
// padding make, the same padding above and below.)
struct BandRows {
  int64_t first, count;
  ConvGeom g;
  int64_t kept;
  bool zero_rows;
};
bool same_rows(const ConvGeom& g) { return g.sh == 1 && g.Ho == g.H; }
int64_t band_rows_read(const ConvGeom& g, int64_t band) {
  if (band == g.Ho) return g.H;
  return same_rows(g) ? std::min(g.H, band + (g.kh - 1) * g.dh) : (band - 1) * g.sh + (g.kh - 1) * g.dh + 1;
}
BandRows band_rows(const ConvGeom& g, int64_t m, int64_t r0, int64_t r1) {
  BandRows in{0, g.H, g, 0, false};
  in.g.N = m;
  if (r0 == 0 && r1 == g.Ho) return in;
  if (same_rows(g)) {
    in.first = std::max<int64_t>(0, r0 - g.ph);
    in.count = std::min(g.H, r1 - 1 - g.ph + (g.kh - 1) * g.dh + 1) - in.first;
    in.g.H = in.g.Ho = in.count;
    in.kept = r0 - in.first;
  } else {
    in.first = r0 * g.sh - g.ph;
    in.count = band_rows_read(g, r1 - r0);
    in.g.H = in.count, in.g.ph = 0, in.g.Ho = r1 - r0;
    in.zero_rows = in.first < 0 || in.first + in.count > g.H;
  }
  in.g.P = in.g.Ho * in.g.Wo;
  return in;
}

// The block's output rows [r0, r1) of samples [n0, n0 + m): the expansion of the input rows
// they reach into ex (E, m, rows, W; or those rows copied there, where rows outside the map are
// zeros), the depthwise layer into dw (E, m, its output rows, Wo), the projection (with the
// input's rows as its residual) into y; without a projection the depthwise rows go to y (then
// they must be all it computes). (ex and dw hold the m samples side by side, so that each 1x1
// convolution of several whole maps is one GEMM over their positions, reading and writing them
// in place.)
void inverted_residual_rows(const InvertedResidualLayers& b, const Operand<const float>& x, const Operand<float>& y,
                            int64_t n0, int64_t m, int64_t r0, int64_t r1, float* ex, float* dw) {
  const ConvGeom& g = b.g;
  const BandRows in = band_rows(g, m, r0, r1);
  const int64_t E = g.O, first = std::max<int64_t>(in.first, 0), end = std::min(in.first + in.count, g.H);
  const Operand<const float> x_rows{x.p + n0 * x.s[0] + first * x.s[2], {x.s[0], x.s[1], x.s[2], x.s[3]}};
  Operand<const float> dw_in = x_rows;
  if (b.expand || in.zero_rows) {
    const Operand<float> ex_rows{ex, {in.count * g.W, m * in.count * g.W, g.W, 1}};
    const int64_t above = (first - in.first) * g.W, inside = (end - first) * g.W;  // floats of a plane
    if (b.expand) {
      const Operand<float> ex_inside{ex + above, {ex_rows.s[0], ex_rows.s[1], ex_rows.s[2], ex_rows.s[3]}};
      conv_forward<float>(x_rows, *b.expand, b.expand_e, ex_inside, pointwise_geom(m, b.C, E, end - first, g.W));
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < E; ++c) {
        float* plane = ex + i * ex_rows.s[0] + c * ex_rows.s[1];
        if (!b.expand) std::copy_n(x_rows.p + i * x.s[0] + c * x.s[1], inside, plane + above);  // rows dense
        std::fill(plane, plane + above, 0.f);
        std::fill(plane + above + inside, plane + in.count * g.W, 0.f);
      }
    dw_in = {ex, {ex_rows.s[0], ex_rows.s[1], ex_rows.s[2], ex_rows.s[3]}};
  }
  const Operand<float> y_rows{y.p + n0 * y.s[0] + r0 * y.s[2], {y.s[0], y.s[1], y.s[2], y.s[3]}};
  if (!b.project) {  // (inverted_residual_forward runs no band of extra rows without a projection)
    conv_forward<float>(dw_in, b.depthwise, b.depthwise_e, y_rows, in.g);
    return;
  }
  const Operand<float> dw_out{dw, {in.g.P, m * in.g.P, in.g.Wo, 1}};
  conv_forward<float>(dw_in, b.depthwise, b.depthwise_e, dw_out, in.g);
  Epilogue<float> e = b.project_e;
  if (b.add_input) {
    e.residual = x.p + n0 * x.s[0] + r0 * x.s[2];
    std::copy(x.s, x.s + 4, e.rs);
  }
  const Operand<const float> dw_rows{dw + in.kept * in.g.Wo, {dw_out.s[0], dw_out.s[1], dw_out.s[2], dw_out.s[3]}};
  conv_forward<float>(dw_rows, *b.project, e, y_rows, pointwise_geom(m, E, b.O, r1 - r0, g.Wo));
}

// A band's expanded and depthwise rows at most this many bytes, so that they stay in a core's L2
// cache (1 MB on Zen 4, 2 MB on Sapphire Rapids) between the layers.
constexpr int64_t kInvertedResidualBandBytes = int64_t{1} << 20;
// Bands whose input rows are more than this share above their own (the rows the depthwise
// window reaches past a band, expanded for each of the two bands) cost more than they save: the
// block runs layer by layer.
constexpr double kMostExtraRows = 0.25;

// The floats of the expanded (or copied) rows (ex) and depthwise rows (dw) of any band of at most
// `band` output rows of m samples (band_rows).
std::pair<int64_t, int64_t> inverted_residual_band_floats(const InvertedResidualLayers& b, int64_t m, int64_t band) {
  const ConvGeom& g = b.g;
  const int64_t rows = band_rows_read(g, band);
  const bool copied = !same_rows(g) && band < g.Ho;  // where a band reaches past the map's edge
  return {b.expand || copied ? m * g.O * rows * g.W : 0, b.project ? m * g.O * (same_rows(g) ? rows : band) * g.Wo : 0};
}

// y = the block over x, one of these ways:
// - maps whose whole expanded and depthwise maps (of one sample) fit kInvertedResidualBandBytes:
//   groups of samples side by side, about kGemmColumns output positions a group, at least as
//   many groups as threads, each thread its share of groups;
// - larger maps: bands of output rows of one sample, each of the most rows whose expanded and
//   depthwise rows fit kInvertedResidualBandBytes, as many as make the bands of all samples a
//   multiple of the threads, each thread its share of bands;
// - layer by layer, all samples at once (each layer over the threads), where there would be
//   fewer groups than threads, or the bands would read too many extra rows (kMostExtraRows), or
//   compute extra depthwise rows without a projection (its rows go to y).
// Each group or band runs its layers on its thread.
void inverted_residual_forward(const InvertedResidualLayers& b, const Operand<const float>& x,
                               const Operand<float>& y) {
  const ConvGeom& g = b.g;
  auto band_bytes = [&](int64_t rows) {
    const auto [ex, dw] = inverted_residual_band_floats(b, 1, rows);
    return (ex + dw) * static_cast<int64_t>(sizeof(float));
  };
  const int64_t threads = available_threads();
  int64_t samples = 1, band = g.Ho;
  if (band_bytes(g.Ho) <= kInvertedResidualBandBytes) {
    samples = std::clamp<int64_t>(kGemmColumns / g.P, 1, g.N);
    while (samples > 1 && (g.N + samples - 1) / samples < threads) --samples;
    const int64_t groups = (g.N + samples - 1) / samples;
    samples = (g.N + groups - 1) / groups;  // equal groups
  } else {
    while (band > 1 && band_bytes(band) > kInvertedResidualBandBytes) --band;
    int64_t bands = (g.Ho + band - 1) / band;
    while (g.N * bands % threads != 0) ++bands;
    band = (g.Ho + bands - 1) / bands;
  }
  const int64_t bands = (g.Ho + band - 1) / band, items = (g.N + samples - 1) / samples * bands;
  const double extra_rows = static_cast<double>((g.kh - 1) * g.dh + 1 - g.sh) / static_cast<double>(band * g.sh);
  // (bands of "same" rows compute extra depthwise rows)
  if ((bands > 1 && (extra_rows > kMostExtraRows || (same_rows(g) && !b.project))) || items < threads) {
    const auto [ex, dw] = inverted_residual_band_floats(b, g.N, g.Ho);
    inverted_residual_rows(b, x, y, 0, g.N, 0, g.Ho, thread_scratch<float, 18>(ex), thread_scratch<float, 19>(dw));
    note_kernel_path("inverted residual, layer by layer");  // after the layers' own notes
    return;
  }
  const int64_t work = g.N * g.O * g.P * (b.C + g.kh * g.kw + b.O) / items;
  parallel_for(items, work, [&](int64_t begin, int64_t end) {
    const auto [ex, dw] = inverted_residual_band_floats(b, samples, band);
    float* const ex_rows = thread_scratch<float, 18>(ex);
    float* const dw_rows = thread_scratch<float, 19>(dw);
    for (int64_t it = begin; it < end; ++it) {
      const int64_t n0 = it / bands * samples, r0 = it % bands * band;
      inverted_residual_rows(b, x, y, n0, std::min(samples, g.N - n0), r0, std::min(g.Ho, r0 + band), ex_rows, dw_rows);
    }
  });
  note_kernel_path(samples > 1 ? "inverted residual, samples side by side" : "inverted residual, bands of rows");
}

template <typename T>
void conv_backward_input(const Operand<const T>& dy, const T* w, const Operand<T>& dx, const ConvGeom& g) {
  if (g.Cg == 1 && g.G > 1) return depthwise_backward_input(dy, w, dx, g);
  if constexpr (std::is_same_v<T, float>)
    if (winograd_backward_input(dy, w, dx, g)) return;
  const int64_t nb = samples_per_gemm(g, g.N), batches = (g.N + nb - 1) / nb;
  for_items(batches * g.G, nb * g.Og * g.K * g.P, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      int64_t n0 = it / g.G * nb, gi = it % g.G, m = std::min(nb, g.N - n0), cols = m * g.P;
      Columns<T> dY = gather_columns<T, 1>(dy, n0, m, gi * g.Og, g.Og, g.Ho, g.Wo);
      const T* wg = w + gi * g.Og * g.K;
      T* dxg = dx.p + n0 * dx.s[0] + gi * g.Cg * dx.s[1];
      // (K, cols) = W_g^T (K, Og) @ dY_g (Og, cols), straight into dx for one dense pointwise
      // sample, else into col scattered back by col2im.
      if (m == 1 && is_pointwise(g) && dx.s[2] == g.W * dx.s[3]) {
        gemm<T>(g.K, g.P, g.Og, wg, 1, g.K, dY.p, dY.rs, dY.cs, dxg, dx.s[1], dx.s[3], T(0));
        continue;
      }
      T* col = thread_scratch<T, 0>(g.K * cols);
      gemm<T>(g.K, cols, g.Og, wg, 1, g.K, dY.p, dY.rs, dY.cs, col, cols, 1, T(0));
      for (int64_t i = 0; i < m; ++i) {
        T* dxi = dxg + i * dx.s[0];
        for (int64_t c = 0; c < g.Cg; ++c)
          for (int64_t h = 0; h < g.H; ++h)
            for (int64_t x = 0; x < g.W; ++x) dxi[c * dx.s[1] + h * dx.s[2] + x * dx.s[3]] = T(0);
        col2im(col + i * g.P, cols, g, dxi, dx.s);
      }
    }
  });
}

// The batch is cut into at most this many fixed chunks for the weight gradient.
constexpr int64_t kWeightChunks = 8;
// Small maps' weight gradients sum over about this many columns (several samples' positions)
// per GEMM.
constexpr int64_t kWeightGradientColumns = 1024;

// The weight gradient of group gi is summed transposed, dW_g^T (K, Og) (+)= X (K, cols) @ dY_g^T
// (cols, Og), X the input's (K, cols) columns, when it has at least this many output channels, no
// more than K, and maps of at least kGemmColumns positions or at most kSmallMapTransposedChannels
// output channels: the GEMM then reads X (the im2col matrix, the larger operand) in place along
// its rows instead of packing it transposed, packs only dY's fewer rows so, and its tiles fit Og
// (64 output channels are two whole tile columns, where as rows they were five tiles and a
// third). Each element's sum over the positions is the same as in dW_g (Og, K) = dY_g @ X^T (the
// same blocks of k, each product and addition the same), so the gradient keeps its bits; only a
// final copy into dW's (Og, K) layout is added.
// Measured on Zen 4 (batch 8, 2 threads, the two binaries alternating): resnet18's four 3x3
// 64 -> 64 at 56x56 45.8 -> 38.5-38.9 ms, its 7x7 stem 12.9 -> 11.3, resnet50's 1x1 256 -> 64
// 10.3 -> 8.3; all weight gradients of resnet18 180 -> 169 ms, resnet50 395 -> 383, densenet121
// 360 -> 273-333. Slower transposed, so kept as they were: expansions (Og > K: resnet50's 1x1 64
// -> 256 16.3 -> 20.0 ms), small maps with many output channels (their GEMM runs over all
// threads: 3x3 512 -> 512 at 7x7 10.4 -> 20.1 ms, 256 -> 256 at 14x14 10.1 -> 11.0; DenseNet's
// 3x3 128 -> 32 at 14x14 took 0.89 -> 0.74, 64 -> 64 1.39 -> 1.16, 128 -> 128 2.64 -> 2.54: up to
// 64 channels transposed) and few channels per group (ResNeXt's 4, whose few rows take dot
// products).
constexpr int64_t kTransposedWeightGradientChannels = 16, kSmallMapTransposedChannels = 64;
bool transposed_weight_gradient(const ConvGeom& g) {
  return g.Og >= kTransposedWeightGradientChannels && g.Og <= g.K &&
         (g.P >= kGemmColumns || g.Og <= kSmallMapTransposedChannels);
}

// The buffer a weight gradient bound for dw (G, Og, K) is summed in: dw itself, or for the
// transposed sums a (G, K, Og) scratch buffer of the thread (store_weight_gradient copies it).
template <typename T>
T* weight_gradient_sums(const ConvGeom& g, T* dw) {
  return transposed_weight_gradient(g) ? thread_scratch<T, 17>(g.O * g.K) : dw;
}

// sums (+)= group gi's gradient from X (K, cols) and dY (Og, cols) (beta 0 when first).
template <typename T>
void weight_gradient_gemm(const Columns<T>& X, const Columns<T>& dY, int64_t cols, int64_t gi, const ConvGeom& g,
                          T* sums, bool first) {
  const T beta = first ? T(0) : T(1);
  if (transposed_weight_gradient(g))
    return gemm<T>(g.K, g.Og, cols, X.p, X.rs, X.cs, dY.p, dY.cs, dY.rs, sums + gi * g.K * g.Og, g.Og, 1, beta);
  gemm<T>(g.Og, g.K, cols, dY.p, dY.rs, dY.cs, X.p, X.cs, X.rs, sums + gi * g.Og * g.K, g.K, 1, beta);
}

// dw (G, Og, K) = the sums (weight_gradient_sums), transposed back where they are.
template <typename T>
void store_weight_gradient(const T* sums, const ConvGeom& g, T* dw) {
  if (sums == dw) return;
  for (int64_t gi = 0; gi < g.G; ++gi)
    for (int64_t o = 0; o < g.Og; ++o)
      for (int64_t k = 0; k < g.K; ++k) dw[(gi * g.Og + o) * g.K + k] = sums[(gi * g.K + k) * g.Og + o];
}

// One sample's weight gradient of group gi into sums (weight_gradient_gemm), its positions in
// bands of whole output rows of about kWeightGradientBand columns: each band's im2col (K, band) is
// still in cache when the GEMM reads it, where the whole sample's (1152 x 3136 floats for
// DenseNet's 3x3 growth convolution at 56x56) went to memory and back. Measured on Zen 4 (batch
// 8, 2 threads, min of three alternating runs): that convolution's weight gradient 18.6 -> 15.0
// ms; maps up to 1024 positions (28x28) are one band, as before.
constexpr int64_t kWeightGradientBand = 1024;
template <typename T>
void weight_gradient_in_bands(const Operand<const T>& dy, const Operand<const T>& x, int64_t s, int64_t gi,
                              const ConvGeom& g, T* sums, bool first) {
  const int64_t rows = std::clamp<int64_t>(kWeightGradientBand / g.Wo, 1, g.Ho);
  T* col = thread_scratch<T, 0>(g.K * rows * g.Wo);
  const Columns<T> dY = gather_columns<T, 1>(dy, s, 1, gi * g.Og, g.Og, g.Ho, g.Wo);
  for (int64_t oh0 = 0; oh0 < g.Ho; oh0 += rows) {
    const int64_t oh1 = std::min(oh0 + rows, g.Ho), cols = (oh1 - oh0) * g.Wo;
    im2col(x.p + s * x.s[0] + gi * g.Cg * x.s[1], x.s, g, col, cols, oh0, oh1);
    weight_gradient_gemm<T>({col, cols, 1}, {dY.p + oh0 * g.Wo * dY.cs, dY.rs, dY.cs}, cols, gi, g, sums,
                            first && oh0 == 0);
  }
}

template <typename T>
void conv_backward_weight(const Operand<const T>& dy, const Operand<const T>& x, T* dw, const ConvGeom& g) {
  if (g.Cg == 1 && g.G > 1) return depthwise_backward_weight(dy, x, dw, g);
  int64_t chunks = std::min(g.N, kWeightChunks);
  int64_t wsize = g.O * g.K;
  if (chunks == 0) {
    std::fill(dw, dw + wsize, T(0));
    return;
  }
  if (g.G == 1 && g.P < kGemmColumns) {
    // Small maps of one group: the samples in order, several per GEMM so that its sums (over
    // their positions) are long enough, each GEMM over all threads and accumulating. The chunks
    // below would give each thread's chunk its own (O, K) partial gradient, written and summed
    // again, with sums as short as one sample's positions (7x7 maps: 49). Measured on resnet18's
    // training step (Zen 4, batch 8, 2 threads): layer4's 3x3 weight gradients 171 -> 33 ms;
    // maps of 256 positions and more stay faster in chunks.
    T* sums = weight_gradient_sums(g, dw);
    const int64_t nb = std::clamp<int64_t>(kWeightGradientColumns / g.P, 1, g.N);
    for (int64_t s = 0; s < g.N; s += nb) {
      const int64_t m = std::min(nb, g.N - s), cols = m * g.P;
      weight_gradient_gemm<T>(input_columns(x, s, m, 0, g), gather_columns<T, 1>(dy, s, m, 0, g.Og, g.Ho, g.Wo), cols,
                              0, g, sums, s == 0);
    }
    return store_weight_gradient(sums, g, dw);
  }
  const int64_t nb = samples_per_gemm(g, (g.N + chunks - 1) / chunks);
  // Chunk 0 goes to dw, the others to partials summed in chunk order afterwards.
  std::vector<T> partial((chunks - 1) * wsize);
  auto run_chunk = [&](int64_t ch) {
    T* dest = ch == 0 ? dw : partial.data() + (ch - 1) * wsize;
    T* sums = weight_gradient_sums(g, dest);
    int64_t n0 = g.N * ch / chunks, n1 = g.N * (ch + 1) / chunks;
    for (int64_t s = n0; s < n1; s += nb) {
      int64_t m = std::min(nb, n1 - s), cols = m * g.P;
      for (int64_t gi = 0; gi < g.G; ++gi) {
        if (m == 1 && !is_pointwise(g)) {
          weight_gradient_in_bands(dy, x, s, gi, g, sums, s == n0);
          continue;
        }
        weight_gradient_gemm<T>(input_columns(x, s, m, gi, g),
                                gather_columns<T, 1>(dy, s, m, gi * g.Og, g.Og, g.Ho, g.Wo), cols, gi, g, sums,
                                s == n0);
      }
    }
    store_weight_gradient(sums, g, dest);
  };
  parallel_for(chunks, g.N / chunks * g.O * g.K * g.P, [&](int64_t b, int64_t e) {
    for (int64_t ch = b; ch < e; ++ch) run_chunk(ch);
  });
  for (int64_t ch = 1; ch < chunks; ++ch) {
    const T* src = partial.data() + (ch - 1) * wsize;
    for (int64_t i = 0; i < wsize; ++i) dw[i] += src[i];
  }
}

// ---------------------------------------------------------------- kernels

// Runs f<T>(in, out) for float32/float64 tensors; float16 operands (and bfloat16 ones outside
// conv_bf16: depthwise, backward) are converted to float32, computed, and the outputs converted
// back.
template <typename F>
void dispatch_conv(Op op, const KernelArgs& args, F&& f) {
  DType dt = args.in[0].dtype();
  switch (dt) {
    case DType::Float32:
      return f.template operator()<float>(args.in, args.out);
    case DType::Float64:
      return f.template operator()<double>(args.in, args.out);
    case DType::Float16:
    case DType::BFloat16: {
      std::vector<Tensor> in, out;
      for (const Tensor& t : args.in) in.push_back(t.to(DType::Float32));
      for (const Tensor& t : args.out) out.push_back(empty_strided(t.shape(), t.strides(), {.dtype = DType::Float32}));
      f.template operator()<float>(std::span<const Tensor>(in), std::span<Tensor>(out));
      for (size_t i = 0; i < out.size(); ++i) Tensor(args.out[i]).copy_(out[i]);
      return;
    }
    default:
      unsupported_dtype(op, dt, Device::CPU);
  }
}

// A convolution of a bfloat16 input and weight other than depthwise (those are converted by
// dispatch_conv), into a bfloat16 output or a float32 one (a float32 input's bfloat16 GEMM, the
// input rounded by the op): scale, shift and residual may be undefined; scale and shift are
// used in float32, the residual has the output's dtype.
bool conv_bf16(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor& shift, const Tensor& residual,
               EpilogueActivation activation, const Tensor& y, const Conv2dParams& p) {
  if (x.dtype() != DType::BFloat16 || (weight.shape()[1] == 1 && p.groups > 1)) return false;
  const Tensor w = weight.contiguous();
  const Tensor scale32 = scale.defined() ? scale.to(DType::Float32).contiguous() : Tensor();
  const Tensor shift32 = shift.defined() ? shift.to(DType::Float32).contiguous() : Tensor();
  const ConvGeom g = conv_geom(x.shape(), w.shape(), y.shape(), p);
  auto run = [&]<typename Y>() {
    Epilogue<float, Y> e;
    if (scale32.defined()) e.scale = scale32.data_ptr<float>();
    if (shift32.defined()) e.shift = shift32.data_ptr<float>();
    e.activation = activation;
    if (residual.defined()) {
      const Operand<const Y> r = operand<const Y>(residual);
      e.residual = r.p;
      std::copy(r.s, r.s + 4, e.rs);
    }
    conv_forward_bf16<Y>(operand<const BFloat16>(x), w.data_ptr<BFloat16>(), e, operand<Y>(y), g);
  };
  if (y.dtype() == DType::Float32)
    run.template operator()<float>();
  else
    run.template operator()<BFloat16>();
  return true;
}

// in = (input, weight[, bias]) -> out (output).
void conv2d_kernel(const KernelArgs& args) {
  const auto& p = args.p<Conv2dParams>();
  if (conv_bf16(args.in[0], args.in[1], Tensor(), args.in.size() > 2 ? args.in[2] : Tensor(), Tensor(),
                EpilogueActivation::None, args.out[0], p))
    return;
  dispatch_conv(Op::conv2d, args, [&]<typename T>(std::span<const Tensor> in, std::span<Tensor> out) {
    Tensor w = contiguous_weight(in[1], p.keep_weight_forms);
    Tensor bias = in.size() > 2 ? in[2].contiguous() : Tensor();
    ConvGeom g = conv_geom(in[0].shape(), w.shape(), out[0].shape(), p);
    Epilogue<T> e;
    if (bias.defined()) e.shift = bias.data_ptr<T>();
    conv_forward<T>(operand<const T>(in[0]), w, e, operand<T>(out[0]), g);
  });
}

// in = (input, weight, scale, shift[, residual]) -> out (output).
void conv2d_epilogue_kernel(const KernelArgs& args) {
  const auto& p = args.p<Conv2dEpilogueParams>();
  if (conv_bf16(args.in[0], args.in[1], args.in[2], args.in[3], args.in.size() > 4 ? args.in[4] : Tensor(),
                p.activation, args.out[0], p.conv))
    return;
  dispatch_conv(Op::conv2d_epilogue, args, [&]<typename T>(std::span<const Tensor> in, std::span<Tensor> out) {
    Tensor w = contiguous_weight(in[1], p.conv.keep_weight_forms), scale = in[2].contiguous(),
           shift = in[3].contiguous();
    ConvGeom g = conv_geom(in[0].shape(), w.shape(), out[0].shape(), p.conv);
    Epilogue<T> e;
    e.scale = scale.data_ptr<T>();
    e.shift = shift.data_ptr<T>();
    e.activation = p.activation;
    if (in.size() > 4) {
      const Operand<const T> r = operand<const T>(in[4]);
      e.residual = r.p;
      std::copy(r.s, r.s + 4, e.rs);
    }
    conv_forward<T>(operand<const T>(in[0]), w, e, operand<T>(out[0]), g);
  });
}

// in = (input[, expand weight, scale, shift], depthwise weight, scale, shift[, project weight,
// scale, shift]) -> out (output); float32, dense NCHW (the op checks).
void inverted_residual_kernel(const KernelArgs& args) {
  const auto& p = args.p<InvertedResidualParams>();
  // Each layer's weight, scale and shift, dense (held while the kernel runs): expand, depthwise,
  // project; none for an absent layer.
  std::vector<Tensor> layer[3];
  for (size_t i = 0, next = 1; i < 3; ++i)
    if (i == 1 || (i == 0 && p.expand) || (i == 2 && p.project))
      for (int k = 0; k < 3; ++k) layer[i].push_back(contiguous_weight(args.in[next++], true));  // (no grad)
  auto weight = [&](int i) { return layer[i].empty() ? nullptr : &layer[i][0]; };
  auto epilogue = [&](int i, EpilogueActivation activation) {
    Epilogue<float> e;
    if (!layer[i].empty())
      e.scale = layer[i][1].data_ptr<float>(), e.shift = layer[i][2].data_ptr<float>(), e.activation = activation;
    return e;
  };
  const Tensor &x = args.in[0], &y = args.out[0], &dw = layer[1][0];
  const int64_t E = dw.shape()[0];
  const Conv2dParams cp{{p.stride[0], p.stride[1]}, {p.padding[0], p.padding[1]}, {1, 1}, E, true};  // (no grad)
  const InvertedResidualLayers b{weight(0),
                                 epilogue(0, p.expand_activation),
                                 dw,
                                 epilogue(1, p.depthwise_activation),
                                 conv_geom({x.shape()[0], E, x.shape()[2], x.shape()[3]}, dw.shape(), y.shape(), cp),
                                 weight(2),
                                 epilogue(2, p.project_activation),
                                 p.add_input,
                                 x.shape()[1],
                                 y.shape()[1]};
  inverted_residual_forward(b, operand<const float>(x), operand<float>(y));
}

// in = (input, weight, scale, shift) -> out (the max pool of the convolution's output); float32,
// input and output dense NCHW (the op checks). Other than on the few-channel rows the convolution
// goes into a buffer of its own (conv_forward, as conv2d_epilogue's kernel) and is pooled from there
// row by row (max_pool_row: the max_pool2d kernel's bits).
void conv2d_epilogue_max_pool2d_kernel(const KernelArgs& args) {
  const auto& p = args.p<Conv2dEpilogueMaxPoolParams>();
  const Tensor &x = args.in[0], &y = args.out[0];
  const Tensor w = contiguous_weight(args.in[1], p.conv.conv.keep_weight_forms), scale = args.in[2].contiguous(),
               shift = args.in[3].contiguous();
  const int64_t N = x.shape()[0], O = w.shape()[0], Ho = p.conv_height, Wo = p.conv_width;
  const int64_t Hp = y.shape()[2], Wp = y.shape()[3];
  const ConvGeom g = conv_geom(x.shape(), w.shape(), {N, O, Ho, Wo}, p.conv.conv);
  Epilogue<float> e;
  e.scale = scale.data_ptr<float>();
  e.shift = shift.data_ptr<float>();
  e.activation = p.conv.activation;
  if (use_few_channel_rows(g))
    return few_channel_rows_max_pool_forward(operand<const float>(x), w.data_ptr<float>(), e, operand<float>(y), g,
                                             p.pool, Hp, Wp);
  const Tensor conv = empty({N, O, Ho, Wo});
  conv_forward<float>(operand<const float>(x), w, e, operand<float>(conv), g);
  const float* planes = conv.data_ptr<float>();
  float* out = y.data_ptr<float>();
  parallel_for(N * O, Ho * Wo * p.pool.kernel[0], [&](int64_t first, int64_t last) {
    std::vector<float> rows_max(max_pool_row_floats(p.pool, Wo, Wp), -std::numeric_limits<float>::infinity());
    std::vector<const float*> window(p.pool.kernel[0]);
    for (int64_t plane = first; plane < last; ++plane)
      for (int64_t ph = 0; ph < Hp; ++ph)
        max_pool_output_row(
            p.pool, Ho, ph, [&](int64_t h) { return planes + (plane * Ho + h) * Wo; }, Wo, Wp, window.data(),
            rows_max.data(), out + (plane * Hp + ph) * Wp);
  });
}

// in = (grad_output, weight) -> out (grad_input).
void conv2d_backward_input_kernel(const KernelArgs& args) {
  const auto& p = args.p<Conv2dParams>();
  dispatch_conv(Op::conv2d_backward_input, args, [&]<typename T>(std::span<const Tensor> in, std::span<Tensor> out) {
    Tensor w = in[1].contiguous();
    ConvGeom g = conv_geom(out[0].shape(), w.shape(), in[0].shape(), p);
    conv_backward_input<T>(operand<const T>(in[0]), w.data_ptr<T>(), operand<T>(out[0]), g);
  });
}

// in = (grad_output, input) -> out (grad_weight).
void conv2d_backward_weight_kernel(const KernelArgs& args) {
  const auto& p = args.p<Conv2dParams>();
  dispatch_conv(Op::conv2d_backward_weight, args, [&]<typename T>(std::span<const Tensor> in, std::span<Tensor> out) {
    Tensor dw = out[0].is_contiguous() ? out[0] : empty(out[0].shape(), {.dtype = out[0].dtype()});
    ConvGeom g = conv_geom(in[1].shape(), dw.shape(), in[0].shape(), p);
    conv_backward_weight<T>(operand<const T>(in[0]), operand<const T>(in[1]), dw.data_ptr<T>(), g);
    if (!dw.is_same(out[0])) Tensor(out[0]).copy_(dw);
  });
}

}  // namespace

void register_conv_kernels(KernelRegistry& r) {
  r.set(Op::conv2d, Device::CPU, conv2d_kernel);
  r.set(Op::conv2d_epilogue, Device::CPU, conv2d_epilogue_kernel);
  r.set(Op::inverted_residual, Device::CPU, inverted_residual_kernel);
  r.set(Op::conv2d_epilogue_max_pool2d, Device::CPU, conv2d_epilogue_max_pool2d_kernel);
  r.set(Op::conv2d_backward_input, Device::CPU, conv2d_backward_input_kernel);
  r.set(Op::conv2d_backward_weight, Device::CPU, conv2d_backward_weight_kernel);
}

}  // namespace tvc::cpu
