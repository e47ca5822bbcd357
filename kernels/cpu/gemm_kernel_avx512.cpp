// GEMM micro-kernels for AVX-512 (built with -mavx512f -mavx512bw -mavx512vl -mavx512dq).
// 12 x 32 floats / 12 x 16 doubles: 24 zmm accumulators, 2 for B, broadcasts of A.
#include <immintrin.h>

#include "gemm_kernel_impl.h"

namespace tvc::cpu {
namespace {

// R vectors of positions from vector v0 of a DepthwisePlaneF32 plane, R sums in registers (R
// independent chains over the taps).
template <int R, RowActivation Act>
void depthwise_plane_vectors(int64_t v0, int64_t P, int64_t taps, const float* x, const int64_t* offsets,
                             const uint16_t* masks, const float* w, float start, const float* scale_shift, float* y) {
  typedef FloatVector<16>::type V;
  V acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = V{} + start;
  for (int64_t t = 0; t < taps; ++t) {
    const V wv = V{} + w[t];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int64_t q = (v0 + r) * 16;
      acc[r] += wv * (V)_mm512_maskz_loadu_ps(masks[(v0 + r) * taps + t], x + (q + offsets[t]));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    V v = acc[r];
    if (scale_shift) v = v * (V{} + scale_shift[0]) + (V{} + scale_shift[1]);
    v = activation_lanes<16, Act>(v);
    const int64_t q = (v0 + r) * 16;
    if (q + 16 <= P)
      __builtin_memcpy(y + q, &v, sizeof(V));
    else
      _mm512_mask_storeu_ps(y + q, static_cast<__mmask16>((1u << (P - q)) - 1), (__m512)v);
  }
}

template <RowActivation Act>
void depthwise_plane_act(int64_t P, int64_t taps, const float* x, const int64_t* offsets, const uint16_t* masks,
                         const float* w, float start, const float* scale_shift, float* y) {
  using Vectors = void (*)(int64_t, int64_t, int64_t, const float*, const int64_t*, const uint16_t*, const float*,
                           float, const float*, float*);
  static constexpr Vectors last[7] = {depthwise_plane_vectors<1, Act>, depthwise_plane_vectors<2, Act>,
                                      depthwise_plane_vectors<3, Act>, depthwise_plane_vectors<4, Act>,
                                      depthwise_plane_vectors<5, Act>, depthwise_plane_vectors<6, Act>,
                                      depthwise_plane_vectors<7, Act>};
  const int64_t vectors = (P + 15) / 16;
  int64_t v = 0;
  for (; v + 8 <= vectors; v += 8)
    depthwise_plane_vectors<8, Act>(v, P, taps, x, offsets, masks, w, start, scale_shift, y);
  if (v < vectors) last[vectors - v - 1](v, P, taps, x, offsets, masks, w, start, scale_shift, y);
}

// See DepthwisePlaneF32.
void depthwise_plane(int64_t P, int64_t taps, const float* x, const int64_t* offsets, const uint16_t* masks,
                     const float* w, float start, const float* scale_shift, RowActivation act, float* y) {
  with_activation(act, [&]<RowActivation Act>() {
    depthwise_plane_act<Act>(P, taps, x, offsets, masks, w, start, scale_shift, y);
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
    depthwise_plane,
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
    max_into<16>,
    {winograd_input_f43<16>, winograd_output_f43<16>, winograd_weight_f43<16>},
};

}  // namespace tvc::cpu
