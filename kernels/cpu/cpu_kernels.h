// Registration entry points of the CPU kernel families (one file each in kernels/cpu).
#pragma once

#include "tvc/internal/kernel.h"

namespace tvc::cpu {

void register_elementwise_kernels(KernelRegistry& registry);
void register_reduce_kernels(KernelRegistry& registry);
void register_random_kernels(KernelRegistry& registry);
void register_gemm_kernels(KernelRegistry& registry, Isa isa);
void register_conv_kernels(KernelRegistry& registry);
void register_pool_kernels(KernelRegistry& registry);
void register_index_kernels(KernelRegistry& registry);
void register_norm_kernels(KernelRegistry& registry);

}  // namespace tvc::cpu
