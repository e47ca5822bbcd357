// The CPU backend's single registration point.
#include "cpu_kernels.h"

namespace tvc {

void register_cpu_kernels(KernelRegistry& registry, Isa isa) {
  cpu::register_elementwise_kernels(registry);
  cpu::register_reduce_kernels(registry);
  cpu::register_random_kernels(registry);
  cpu::register_gemm_kernels(registry, isa);
  cpu::register_conv_kernels(registry);
  cpu::register_pool_kernels(registry);
  cpu::register_index_kernels(registry);
  cpu::register_norm_kernels(registry);
}

}  // namespace tvc
