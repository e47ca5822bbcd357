// GEMM micro-kernels for AVX-512 (built with -mavx512f -mavx512bw -mavx512vl -mavx512dq).
// 12 x 32 floats / 12 x 16 doubles: 24 zmm accumulators, 2 for B, broadcasts of A.
#include <immintrin.h>

#include "gemm_kernel_impl.h"

namespace tvc::cpu {
namespace {

// Stores past the caches for stream_rows (vmovntps, 64-byte aligned), then a store fence.
struct StreamingStores {
  static constexpr bool kAligned = true;
  static void store(float* p, FloatVector<16>::type v) { _mm512_stream_ps(p, (__m512)v); }
  static void fence() { _mm_sfence(); }
};

// R vectors of positions from vector v0 of Planes (1 or 2) planes of a DepthwisePlanesF32 call
// from plane i, Planes * R sums in registers (independent chains over the taps): each tap's masks
// are loaded once for the planes together.
template <int R, int Planes, RowActivation Act>
void depthwise_plane_vectors(int64_t v0, int64_t i, const DepthwisePlanes& d) {
  typedef FloatVector<16>::type V;
  const float* x[Planes];
  const float* w[Planes];
  V acc[Planes][R], scale[Planes], shift[Planes];
#pragma GCC unroll 2
  for (int p = 0; p < Planes; ++p) {
    x[p] = d.x + (i + p) * d.x_stride;
    w[p] = d.w + (i + p) * d.taps;
    scale[p] = (V)_mm512_set1_ps(d.scale ? d.scale[i + p] : 0.f);
    shift[p] = (V)_mm512_set1_ps(d.shift ? d.shift[i + p] : 0.f);
    const V start = (V)_mm512_set1_ps(d.start ? d.start[i + p] : 0.f);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[p][r] = start;
  }
  const int64_t vectors = (d.P + 15) / 16;
  for (int64_t t = 0; t < d.taps; ++t) {
    const uint16_t* masks = d.masks + t * vectors + v0;
    const int64_t from = v0 * 16 + d.offsets[t];
    V wv[Planes];
#pragma GCC unroll 2
    for (int p = 0; p < Planes; ++p) wv[p] = (V)_mm512_set1_ps(w[p][t]);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __mmask16 mask = masks[r];
#pragma GCC unroll 2
      for (int p = 0; p < Planes; ++p) acc[p][r] += wv[p] * (V)_mm512_maskz_loadu_ps(mask, x[p] + from + r * 16);
    }
  }
#pragma GCC unroll 2
  for (int p = 0; p < Planes; ++p) {
    float* y = d.y + (i + p) * d.y_stride;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      V v = acc[p][r];
      if (d.scale) v = v * scale[p] + shift[p];  // one FMA, as EpilogueRowF32's
      v = activation_lanes<16, Act>(v);
      const int64_t q = (v0 + r) * 16;
      if (q + 16 <= d.P)
        __builtin_memcpy(y + q, &v, sizeof(V));
      else
        _mm512_mask_storeu_ps(y + q, static_cast<__mmask16>((1u << (d.P - q)) - 1), (__m512)v);
    }
  }
}

// Planes planes from plane i: blocks of 8 vectors, then the rest (up to 7) as one block.
template <int Planes, RowActivation Act>
void depthwise_planes_from(int64_t i, const DepthwisePlanes& d) {
  using Vectors = void (*)(int64_t, int64_t, const DepthwisePlanes&);
  static constexpr Vectors last[7] = {depthwise_plane_vectors<1, Planes, Act>, depthwise_plane_vectors<2, Planes, Act>,
                                      depthwise_plane_vectors<3, Planes, Act>, depthwise_plane_vectors<4, Planes, Act>,
                                      depthwise_plane_vectors<5, Planes, Act>, depthwise_plane_vectors<6, Planes, Act>,
                                      depthwise_plane_vectors<7, Planes, Act>};
  const int64_t vectors = (d.P + 15) / 16;
  int64_t v = 0;
  for (; v + 8 <= vectors; v += 8) depthwise_plane_vectors<8, Planes, Act>(v, i, d);
  if (v < vectors) last[vectors - v - 1](v, i, d);
}

// See DepthwisePlanesF32: two planes at a time (the last alone when their count is odd).
void depthwise_planes(const DepthwisePlanes& d) {
  with_activation(d.act, [&]<RowActivation Act>() {
    int64_t i = 0;
    for (; i + 2 <= d.planes; i += 2) depthwise_planes_from<2, Act>(i, d);
    if (i < d.planes) depthwise_planes_from<1, Act>(i, d);
  });
}

// G outputs from ow (the first m stored) of a DepthwiseChannelRowsF32 call with windows KW wide
// (one vector of the block's 16 channels each): per window row, its KW weights in registers, then
// its G + KW - 1 input columns in turn, each inside the row loaded once and added to the outputs
// whose window holds it (output g gets column c as tap c - g: in tap order).
template <int KW, int G, RowActivation Act>
void depthwise_channel_rows_group(int64_t ow, int64_t m, int64_t rows, int64_t pad, int64_t width, const float* x,
                                  const int64_t* row_offsets, int64_t step, const float* w, const float* bias,
                                  const float* scale, const float* shift, float* y, int64_t y_step) {
  typedef FloatVector<16>::type V;
  static_assert(kDepthwiseBlock == 16);
  V acc[G];
  const V b = load_lanes<16>(bias);
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g) acc[g] = b;
  for (int64_t i = 0; i < rows; ++i) {
    V wv[KW];
#pragma GCC unroll 8
    for (int j = 0; j < KW; ++j) wv[j] = load_lanes<16>(w + (i * KW + j) * 16);
    const float* xr = x + row_offsets[i];
#pragma GCC unroll 32
    for (int c = 0; c < G + KW - 1; ++c) {
      const int64_t column = ow + c - pad;
      if (column < 0 || column >= width) continue;
      V xv = load_lanes<16>(xr + column * step);
      // In a register, loaded once: else the compiler may fold it into each FMA as a memory
      // operand, a load per FMA again.
      __asm__("" : "+v"(xv));
#pragma GCC unroll 8
      for (int j = 0; j < KW; ++j)
        if (c - j >= 0 && c - j < G) acc[c - j] += wv[j] * xv;
    }
  }
  // The same arithmetic as EpilogueRowF32's with one channel's scale and shift.
  const V sv = scale ? load_lanes<16>(scale) : V{}, hv = shift ? load_lanes<16>(shift) : V{};
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g) {
    V v = acc[g];
    if (scale) v = v * sv + hv;
    v = activation_lanes<16, Act>(v);
    if (g < m) __builtin_memcpy(y + (ow + g) * y_step, &v, sizeof(V));
  }
}

// See DepthwiseChannelRowsF32: windows 3, 5 and 7 wide, in groups of 16 outputs, the rest in
// groups of 8.
template <int KW, RowActivation Act>
void depthwise_channel_rows_of(int64_t n, int64_t rows, int64_t pad, int64_t width, const float* x,
                               const int64_t* row_offsets, int64_t step, const float* w, const float* bias,
                               const float* scale, const float* shift, float* y, int64_t y_step) {
  int64_t ow = 0;
  for (; ow + 16 <= n; ow += 16)
    depthwise_channel_rows_group<KW, 16, Act>(ow, 16, rows, pad, width, x, row_offsets, step, w, bias, scale, shift, y,
                                              y_step);
  for (; ow < n; ow += 8)
    depthwise_channel_rows_group<KW, 8, Act>(ow, n - ow < 8 ? n - ow : 8, rows, pad, width, x, row_offsets, step, w,
                                             bias, scale, shift, y, y_step);
}
bool depthwise_channel_rows(int64_t n, int64_t rows, int64_t kw, int64_t pad, int64_t width, const float* x,
                            const int64_t* row_offsets, int64_t step, const float* w, const float* bias,
                            const float* scale, const float* shift, RowActivation act, float* y, int64_t y_step) {
  if (kw != 3 && kw != 5 && kw != 7) return false;
  with_activation(act, [&]<RowActivation Act>() {
    auto run = [&]<int KW>() {
      depthwise_channel_rows_of<KW, Act>(n, rows, pad, width, x, row_offsets, step, w, bias, scale, shift, y, y_step);
    };
    if (kw == 3) run.template operator()<3>();
    if (kw == 5) run.template operator()<5>();
    if (kw == 7) run.template operator()<7>();
  });
  return true;
}

// The lanes l of a vector of 16 floats from x + s that fall inside [0, W).
__mmask16 lanes_inside(int64_t s, int64_t W) {
  const int64_t first = s < 0 ? -s : 0, end = W - s < 16 ? W - s : 16;
  return end <= first ? 0 : static_cast<__mmask16>(((1u << end) - 1) & ~((1u << first) - 1));
}

// Where tap column c finds its 16 inputs in a vector's windows (see depthwise_stride2_vectors),
// as _mm512_permutex2var_ps numbers lanes (the second operand's from 16): one output row's lane l
// reads its window's column c + 2 l, which is lane c / 2 + l of the window's even (c even) or odd
// (c odd) columns while below 32, else lane c + 2 l - 32 of the window's third load. With two
// rows to a vector (Pair), lanes 8 + m the second row's, each row's window 32 columns: row lane m
// reads column c + 2 m, lane c / 2 + m of the row's half of the even or odd columns while below
// 16, else lane c + 2 m - 16 of the row's half of the third vector (its two rows' upper columns).
template <bool Pair>
struct WindowTaps {
  int32_t lanes[kDepthwiseStride2MaxWidth][16];
};
template <bool Pair>
constexpr WindowTaps<Pair> window_taps() {
  WindowTaps<Pair> taps{};
  constexpr int RowLanes = Pair ? 8 : 16, Split = 2 * RowLanes;
  for (int c = 0; c < kDepthwiseStride2MaxWidth; ++c)
    for (int l = 0; l < 16; ++l) {
      const int row = l / RowLanes, m = l % RowLanes, column = c + 2 * m;
      taps.lanes[c][l] = row * RowLanes + (column < Split ? c / 2 + m : 16 + column - Split);
    }
  return taps;
}
template <bool Pair>
alignas(64) constexpr WindowTaps<Pair> kWindowTaps = window_taps<Pair>();
alignas(64) constexpr int32_t kOddLanes[16] = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};

// R vectors of outputs of Planes (1 or 2) planes from plane i of a DepthwiseStride2PlanesF32
// call, Planes * R sums in registers (independent chains over the taps). Vector r holds output
// row oh0 + r from column ow0 (16 columns), or with Pair (rows of at most 8) the rows
// oh0 + 2r and oh0 + 2r + 1 in its two halves. Each tap (r, c) reads every other column of input
// row 2 oh + r - ph from column 2 ow0 + c - pw, picked from the row's window from the first tap's:
// 48 columns in three loads (with Pair, 32 of each of the two rows, in four), the first two loads'
// even and odd columns taps 0 and 1 and each further tap one permutation of those with the third
// (kWindowTaps): a third of a load per tap (two thirds with Pair) against two when each tap loaded
// its own columns, 0.5-0.65x the time on Sapphire Rapids, where the loads bounded it. Input rows
// outside the map (and the rows under a missing last output row) read nothing (their masks
// cleared) and add w * 0.
template <int R, int Planes, bool Pair, int Kw, RowActivation Act>
void depthwise_stride2_vectors(int64_t oh0, int64_t ow0, int64_t i, const DepthwiseStride2Planes& d) {
  typedef FloatVector<16>::type V;
  constexpr int64_t Rows = Pair ? 2 : 1;
  const int64_t kw = Kw ? Kw : d.kw;
  __mmask16 window[3];  // the columns of a row's window inside the map, per load
  for (int64_t k = 0; k < 3; ++k) window[k] = lanes_inside(2 * ow0 - d.pw + 16 * k, d.W);
  const float* x[Planes];
  const float* w[Planes];
  V acc[Planes][R], scale[Planes], shift[Planes];
#pragma GCC unroll 2
  for (int p = 0; p < Planes; ++p) {
    x[p] = d.x + (i + p) * d.x_stride + 2 * ow0 - d.pw;
    w[p] = d.w + (i + p) * d.kh * d.kw;
    scale[p] = (V)_mm512_set1_ps(d.scale ? d.scale[i + p] : 0.f);
    shift[p] = (V)_mm512_set1_ps(d.shift ? d.shift[i + p] : 0.f);
    const V start = (V)_mm512_set1_ps(d.start ? d.start[i + p] : 0.f);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[p][r] = start;
  }
  const __m512i odd_lanes = _mm512_load_si512(kOddLanes);
  for (int64_t t = 0, kr = 0; kr < d.kh; ++kr, t += kw) {
    int64_t first[R], second[R];  // where each vector's rows start (in x[p]); without Pair one row
    __mmask16 first_inside[R], second_inside[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int64_t oh = oh0 + r * Rows, ih = 2 * oh + kr - d.ph, ih2 = ih + 2;
      const bool in = ih >= 0 && ih < d.H, in2 = ih2 >= 0 && ih2 < d.H && oh + 1 < d.Ho;
      first_inside[r] = in ? 0xFFFF : 0;
      second_inside[r] = in2 ? 0xFFFF : 0;
      first[r] = in ? ih * d.W : 0;
      second[r] = in2 ? ih2 * d.W : 0;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
      for (int p = 0; p < Planes; ++p) {
        // The window's first 32 columns (of each row with Pair) in lo and hi, the rest in third.
        const float* row = x[p] + first[r];
        const __mmask16 in = first_inside[r];
        __m512 lo, hi, third;
        if constexpr (Pair) {
          const float* row2 = x[p] + second[r];
          const __mmask16 in2 = second_inside[r];
          lo = _mm512_maskz_loadu_ps(window[0] & in, row);
          hi = _mm512_maskz_loadu_ps(window[0] & in2, row2);
          // Each row's columns 16-23 (the 256-bit load takes the mask's low 8 bits).
          third = kw > 2 ? _mm512_insertf32x8(_mm512_maskz_loadu_ps(window[1] & in, row + 16),
                                              _mm256_maskz_loadu_ps(window[1] & in2, row2 + 16), 1)
                         : _mm512_setzero_ps();
        } else {
          lo = _mm512_maskz_loadu_ps(window[0] & in, row);
          hi = _mm512_maskz_loadu_ps(window[1] & in, row + 16);
          third = kw > 2 ? _mm512_maskz_loadu_ps(window[2] & in, row + 32) : _mm512_setzero_ps();
        }
        const V even = even_lanes<16>((V)lo, (V)hi), odd = (V)_mm512_permutex2var_ps(lo, odd_lanes, hi);
#pragma GCC unroll 8
        for (int64_t c = 0; c < kw; ++c) {
          const V tap = c == 0   ? even
                        : c == 1 ? odd
                                 : (V)_mm512_permutex2var_ps((__m512)(c % 2 ? odd : even),
                                                             _mm512_load_si512(kWindowTaps<Pair>.lanes[c]), third);
          acc[p][r] += (V)_mm512_set1_ps(w[p][t + c]) * tap;
        }
      }
    }
  }
  const int64_t n = d.Wo - ow0 < 16 ? d.Wo - ow0 : 16;
  const __mmask16 row_lanes = static_cast<__mmask16>((1u << n) - 1);
#pragma GCC unroll 2
  for (int p = 0; p < Planes; ++p) {
    float* y = d.y + (i + p) * d.y_stride + oh0 * d.Wo + ow0;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      V v = acc[p][r];
      if (d.scale) v = v * scale[p] + shift[p];  // one FMA, as EpilogueRowF32's
      v = activation_lanes<16, Act>(v);
      _mm512_mask_storeu_ps(y + r * Rows * d.Wo, row_lanes, (__m512)v);
      if (Pair && oh0 + r * 2 + 1 < d.Ho)  // the second row from lane 8
        _mm512_mask_storeu_ps(y + (r * 2 + 1) * d.Wo - 8, static_cast<__mmask16>(row_lanes << 8), (__m512)v);
    }
  }
}

// Planes planes from plane i: blocks of 4 vectors of rows (8 rows with Pair), then the rest (up to
// 4 vectors with Pair) as one block, each row in vectors of 16 columns (the last partial).
template <int Planes, bool Pair, int Kw, RowActivation Act>
void depthwise_stride2_from(int64_t i, const DepthwiseStride2Planes& d) {
  using Vectors = void (*)(int64_t, int64_t, int64_t, const DepthwiseStride2Planes&);
  static constexpr Vectors last[4] = {
      depthwise_stride2_vectors<1, Planes, Pair, Kw, Act>, depthwise_stride2_vectors<2, Planes, Pair, Kw, Act>,
      depthwise_stride2_vectors<3, Planes, Pair, Kw, Act>, depthwise_stride2_vectors<4, Planes, Pair, Kw, Act>};
  constexpr int64_t Rows = Pair ? 2 : 1;
  int64_t oh = 0;
  for (; oh + 4 * Rows <= d.Ho; oh += 4 * Rows)
    for (int64_t ow = 0; ow < d.Wo; ow += 16) depthwise_stride2_vectors<4, Planes, Pair, Kw, Act>(oh, ow, i, d);
  if (oh < d.Ho)
    for (int64_t ow = 0; ow < d.Wo; ow += 16) last[(d.Ho - oh + Rows - 1) / Rows - 1](oh, ow, i, d);
}

// See DepthwiseStride2PlanesF32: two planes at a time (the last alone when their count is odd);
// rows of at most 8 outputs two to a vector; windows 3 and 5 wide known when compiled (Kw, else 0:
// d.kw at run time).
template <bool Pair, int Kw>
void depthwise_stride2_pairs(const DepthwiseStride2Planes& d) {
  with_activation(d.act, [&]<RowActivation Act>() {
    int64_t i = 0;
    for (; i + 2 <= d.planes; i += 2) depthwise_stride2_from<2, Pair, Kw, Act>(i, d);
    if (i < d.planes) depthwise_stride2_from<1, Pair, Kw, Act>(i, d);
  });
}
void depthwise_stride2_planes(const DepthwiseStride2Planes& d) {
  if (d.Wo <= 8)
    d.kw == 3 ? depthwise_stride2_pairs<true, 3>(d) : depthwise_stride2_pairs<true, 0>(d);
  else if (d.kw == 3)
    depthwise_stride2_pairs<false, 3>(d);
  else if (d.kw == 5)
    depthwise_stride2_pairs<false, 5>(d);
  else
    depthwise_stride2_pairs<false, 0>(d);
}

}  // namespace

extern const GemmKernels gemm_kernels_avx512 = {
    {12,
     32,
     384,
     1536,
     384,
     gemm_micro_kernel<float, 16, 12, 2, false, true>,
     gemm_micro_kernel<float, 16, 12, 2, true>,
     16,
     {gemm_micro_kernel<float, 16, 12, 1>},
     {gemm_micro_kernel<float, 16, 12, 1, true>},
     {gemm_micro_kernel<float, 16, 4, 2>, gemm_micro_kernel<float, 16, 8, 2>},
     gemm_micro_kernel_pack_b<16, 12, 2, false, true>,
     gemm_micro_kernel_pack_b<16, 12, 2, true>,
     {gemm_micro_kernel_epilogue<16, 12, 2, false, true, RowActivation::none>,
      gemm_micro_kernel_epilogue<16, 12, 2, false, true, RowActivation::relu>,
      gemm_micro_kernel_epilogue<16, 12, 2, false, true, RowActivation::relu6>,
      gemm_micro_kernel_epilogue<16, 12, 2, false, true, RowActivation::silu>,
      gemm_micro_kernel_epilogue<16, 12, 2, false, true, RowActivation::hardswish>},
     {gemm_micro_kernel_epilogue<16, 12, 2, true, false, RowActivation::none>,
      gemm_micro_kernel_epilogue<16, 12, 2, true, false, RowActivation::relu>,
      gemm_micro_kernel_epilogue<16, 12, 2, true, false, RowActivation::relu6>,
      gemm_micro_kernel_epilogue<16, 12, 2, true, false, RowActivation::silu>,
      gemm_micro_kernel_epilogue<16, 12, 2, true, false, RowActivation::hardswish>}},
    // The 7-row kernel's B block is 128 columns: at a batch-1 linear layer's ~200 rows, A's
    // 384-deep block (322 KB) and a 384-column B block (576 KB) filled Zen 4's 1 MB L2; with 128
    // (196 KB) ViT-B/16's linear layers at batch 1 take 0.94-0.97x the time (its weights streamed
    // in the network's order, one process alternating), the network 0.97-0.98x, Swin-T and
    // ConvNeXt-T at batch 1 0.98-0.99x, batch 8 within the noise.
    {{7,
      64,
      384,
      1536,
      128,
      gemm_micro_kernel<float, 16, 7, 4, false, true>,
      gemm_micro_kernel<float, 16, 7, 4, true, true>,
      16,
      {gemm_micro_kernel<float, 16, 7, 1, false, true>, gemm_micro_kernel<float, 16, 7, 2, false, true>,
       gemm_micro_kernel<float, 16, 7, 3, false, true>},
      {},
      {}},
     gemm_micro_kernel_offsets<16, 7, 4>,
     {gemm_micro_kernel_offsets<16, 7, 1>, gemm_micro_kernel_offsets<16, 7, 2>, gemm_micro_kernel_offsets<16, 7, 3>},
     {gemm_micro_kernel_offsets_pair<16, 1>, gemm_micro_kernel_offsets_pair<16, 2>},
     gemm_micro_kernel<float, 16, 14, 2, false, true>,
     gemm_micro_kernel<float, 16, 14, 2, true, true>,
     {gemm_micro_kernel<float, 16, 1, 4, false, true>, gemm_micro_kernel<float, 16, 2, 4, false, true>,
      gemm_micro_kernel<float, 16, 3, 4, false, true>, gemm_micro_kernel<float, 16, 4, 4, false, true>,
      gemm_micro_kernel<float, 16, 5, 4, false, true>, gemm_micro_kernel<float, 16, 6, 4, false, true>}},
    {12, 16, 192, 1536, 384, gemm_micro_kernel<double, 8, 12, 2>, gemm_micro_kernel<double, 8, 12, 2, true>},
    {12, 32, 768, 1536, 384, gemm_micro_kernel_bf16<16, 12, 2, PairDotEmulated<16>>,
     gemm_micro_kernel_bf16<16, 12, 2, PairDotEmulated<16>, true>},
    {16, 24, fma_peak_loop<16, 24>},
    {16, 24, fma_peak_loop<16, 24>},
    depthwise_row<16>,
    depthwise_channels<16>,
    depthwise_channel_rows,
    depthwise_planes,
    depthwise_stride2_planes,
    conv_rows_f32<16, 8>,
    dot_rows<16>,
    exp_f32<16>,
    sigmoid_f32<16>,
    silu_f32<16>,
    gelu_f32<16>,
    softmax_f32<16>,
    attention_short_f32<16>,
    gelu_backward_f32<16>,
    epilogue_f32<16>,
    epilogue_channels_f32<16>,
    layer_norm_f32<16>,
    layer_norm_backward_f32<16>,
    {batch_norm_sum_f32, batch_norm_squares_f32, batch_norm_grad_sums_f32, batch_norm_grad_f32<16>},
    column_sums_f32,
    pack_transposed<16>,
    even_copy<16>,
    stream_rows<16, StreamingStores>,
    max_into<16>,
    {winograd_input_f43<16>, winograd_output_f43<16>, winograd_weight_f43<16>},
};

}  // namespace tvc::cpu
