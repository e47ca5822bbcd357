// GEMM micro-kernels for baseline x86-64 (SSE2 vectors of the plain build).
// 4 x 8 floats / 4 x 4 doubles: 8 xmm accumulators.
#include "gemm_kernel_impl.h"

namespace tvc::cpu {

extern const GemmKernels gemm_kernels_generic = {
    {4,
     8,
     256,
     1536,
     256,
     gemm_micro_kernel<float, 4, 4, 2>,
     gemm_micro_kernel<float, 4, 4, 2, true>,
     4,
     {gemm_micro_kernel<float, 4, 4, 1>},
     {gemm_micro_kernel<float, 4, 4, 1, true>},
     {}},
    {},
    {4, 4, 256, 1536, 256, gemm_micro_kernel<double, 2, 4, 2>, gemm_micro_kernel<double, 2, 4, 2, true>},
    {4, 8, 512, 1536, 256, gemm_micro_kernel_bf16<4, 4, 2, PairDotEmulated<4>>,
     gemm_micro_kernel_bf16<4, 4, 2, PairDotEmulated<4>, true>},
    {4, 12, fma_peak_loop<4, 12>},
    {4, 12, fma_peak_loop<4, 12>},
    depthwise_row<4>,
    depthwise_channels<4>,
    nullptr,
    nullptr,
    nullptr,
    conv_rows_f32<4, 4>,
    dot_rows<4>,
    exp_f32<4>,
    sigmoid_f32<4>,
    silu_f32<4>,
    gelu_f32<4>,
    softmax_f32<4>,
    nullptr,
    gelu_backward_f32<4>,
    epilogue_f32<4>,
    epilogue_channels_f32<4>,
    layer_norm_f32<4>,
    layer_norm_backward_f32<4>,
    {batch_norm_sum_f32, batch_norm_squares_f32, batch_norm_grad_sums_f32, batch_norm_grad_f32<4>},
    column_sums_f32,
    pack_transposed<4>,
    even_copy<4>,
    stream_rows<4, CachedStores>,
    max_into<4>,
    {winograd_input_f43<4>, winograd_output_f43<4>, winograd_weight_f43<4>},
};

}  // namespace tvc::cpu
