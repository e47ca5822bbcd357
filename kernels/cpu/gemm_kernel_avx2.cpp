// GEMM micro-kernels for AVX2 + FMA (built with -mavx2 -mfma).
// 6 x 16 floats / 6 x 8 doubles: 12 ymm accumulators, 2 for B, broadcasts of A.
#include <immintrin.h>

#include "gemm_kernel_impl.h"

namespace tvc::cpu {
namespace {

// Stores past the caches for stream_rows (vmovntps, 32-byte aligned), then a store fence.
struct StreamingStores {
  static constexpr bool kAligned = true;
  static void store(float* p, FloatVector<8>::type v) { _mm256_stream_ps(p, (__m256)v); }
  static void fence() { _mm_sfence(); }
};

}  // namespace

extern const GemmKernels gemm_kernels_avx2 = {
    {6,
     16,
     384,
     1536,
     384,
     gemm_micro_kernel<float, 8, 6, 2>,
     gemm_micro_kernel<float, 8, 6, 2, true>,
     8,
     {gemm_micro_kernel<float, 8, 6, 1>},
     {gemm_micro_kernel<float, 8, 6, 1, true>},
     {},
     gemm_micro_kernel_pack_b<8, 6, 2>,
     gemm_micro_kernel_pack_b<8, 6, 2, true>,
     {gemm_micro_kernel_epilogue<8, 6, 2, false, false, RowActivation::none>,
      gemm_micro_kernel_epilogue<8, 6, 2, false, false, RowActivation::relu>,
      gemm_micro_kernel_epilogue<8, 6, 2, false, false, RowActivation::relu6>,
      gemm_micro_kernel_epilogue<8, 6, 2, false, false, RowActivation::silu>,
      gemm_micro_kernel_epilogue<8, 6, 2, false, false, RowActivation::hardswish>},
     {gemm_micro_kernel_epilogue<8, 6, 2, true, false, RowActivation::none>,
      gemm_micro_kernel_epilogue<8, 6, 2, true, false, RowActivation::relu>,
      gemm_micro_kernel_epilogue<8, 6, 2, true, false, RowActivation::relu6>,
      gemm_micro_kernel_epilogue<8, 6, 2, true, false, RowActivation::silu>,
      gemm_micro_kernel_epilogue<8, 6, 2, true, false, RowActivation::hardswish>}},
    {},
    {6, 8, 192, 1536, 384, gemm_micro_kernel<double, 4, 6, 2>, gemm_micro_kernel<double, 4, 6, 2, true>},
    {6, 16, 768, 1536, 384, gemm_micro_kernel_bf16<8, 6, 2, PairDotEmulated<8>>,
     gemm_micro_kernel_bf16<8, 6, 2, PairDotEmulated<8>, true>},
    {8, 12, fma_peak_loop<8, 12>},
    {8, 12, fma_peak_loop<8, 12>},
    depthwise_row<8>,
    depthwise_channels<8>,
    nullptr,
    nullptr,
    nullptr,
    conv_rows_f32<8, 4>,
    dot_rows<8>,
    exp_f32<8>,
    sigmoid_f32<8>,
    silu_f32<8>,
    gelu_f32<8>,
    softmax_f32<8>,
    attention_short_f32<8>,
    gelu_backward_f32<8>,
    epilogue_f32<8>,
    epilogue_channels_f32<8>,
    layer_norm_f32<8>,
    layer_norm_backward_f32<8>,
    {batch_norm_sum_f32, batch_norm_squares_f32, batch_norm_grad_sums_f32, batch_norm_grad_f32<8>},
    column_sums_f32,
    pack_transposed<8>,
    even_copy<8>,
    stream_rows<8, StreamingStores>,
    max_into<8>,
    {winograd_input_f43<8>, winograd_output_f43<8>, winograd_weight_f43<8>},
};

}  // namespace tvc::cpu
