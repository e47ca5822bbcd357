// GEMM micro-kernels for AVX-512 (built with -mavx512f -mavx512bw -mavx512vl -mavx512dq).
// 12 x 32 floats / 12 x 16 doubles: 24 zmm accumulators, 2 for B, broadcasts of A.
#include "gemm_kernel_impl.h"

namespace tvc::cpu {

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
      gemm_micro_kernel<float, 16, 7, 4>,
      gemm_micro_kernel<float, 16, 7, 4, true>,
      16,
      {gemm_micro_kernel<float, 16, 7, 1>, gemm_micro_kernel<float, 16, 7, 2>, gemm_micro_kernel<float, 16, 7, 3>},
      {}},
     gemm_micro_kernel_offsets<16, 7, 4>,
     {gemm_micro_kernel_offsets<16, 7, 1>, gemm_micro_kernel_offsets<16, 7, 2>, gemm_micro_kernel_offsets<16, 7, 3>}},
    {12, 16, 192, 1536, 384, gemm_micro_kernel<double, 8, 12, 2>, gemm_micro_kernel<double, 8, 12, 2, true>},
    {12, 32, 768, 1536, 384, gemm_micro_kernel_bf16<16, 12, 2, PairDotEmulated<16>>,
     gemm_micro_kernel_bf16<16, 12, 2, PairDotEmulated<16>, true>},
    {16, 24, fma_peak_loop<16, 24>},
    {16, 24, fma_peak_loop<16, 24>},
    depthwise_row<16>,
    depthwise_channels<16>,
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
    {winograd_input_f43<16>, winograd_output_f43<16>, winograd_weight_f43<16>},
};

}  // namespace tvc::cpu
