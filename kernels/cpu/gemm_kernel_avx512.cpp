// GEMM micro-kernels for AVX-512 (built with -mavx512f -mavx512bw -mavx512vl -mavx512dq).
// 12 x 32 floats / 12 x 16 doubles: 24 zmm accumulators, 2 for B, broadcasts of A.
#include <immintrin.h>

#include "gemm_kernel_impl.h"

namespace tvc::cpu {
namespace {

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

}  // namespace

extern const GemmKernels gemm_kernels_avx512 = {
    {12,
     32,
     384,
     1536,
     384,
     gemm_micro_kernel<float, 16, 12, 2>,
     gemm_micro_kernel<float, 16, 12, 2, true>,
     16,
     {gemm_micro_kernel<float, 16, 12, 1>},
     {gemm_micro_kernel<float, 16, 12, 1, true>}},
    {{7,
      64,
      384,
      1536,
      384,
      gemm_micro_kernel<float, 16, 7, 4, false, true>,
      gemm_micro_kernel<float, 16, 7, 4, true, true>,
      16,
      {gemm_micro_kernel<float, 16, 7, 1, false, true>, gemm_micro_kernel<float, 16, 7, 2, false, true>,
       gemm_micro_kernel<float, 16, 7, 3, false, true>},
      {}},
     gemm_micro_kernel_offsets<16, 7, 4>,
     {gemm_micro_kernel_offsets<16, 7, 1>, gemm_micro_kernel_offsets<16, 7, 2>, gemm_micro_kernel_offsets<16, 7, 3>},
     {gemm_micro_kernel_offsets_pair<16, 1>, gemm_micro_kernel_offsets_pair<16, 2>}},
    {12, 16, 192, 1536, 384, gemm_micro_kernel<double, 8, 12, 2>, gemm_micro_kernel<double, 8, 12, 2, true>},
    {12, 32, 768, 1536, 384, gemm_micro_kernel_bf16<16, 12, 2, PairDotEmulated<16>>,
     gemm_micro_kernel_bf16<16, 12, 2, PairDotEmulated<16>, true>},
    {16, 24, fma_peak_loop<16, 24>},
    {16, 24, fma_peak_loop<16, 24>},
    depthwise_row<16>,
    depthwise_channels<16>,
    depthwise_planes,
    conv_rows_f32<16, 8>,
    dot<16>,
    exp_f32<16>,
    sigmoid_f32<16>,
    silu_f32<16>,
    gelu_f32<16>,
    softmax_f32<16>,
    gelu_backward_f32<16>,
    epilogue_f32<16>,
    epilogue_channels_f32<16>,
    layer_norm_f32<16>,
    layer_norm_backward_f32<16>,
    pack_transposed<16>,
    even_copy<16>,
    stream_rows<16>,
    max_into<16>,
    {winograd_input_f43<16>, winograd_output_f43<16>, winograd_weight_f43<16>},
};

}  // namespace tvc::cpu
