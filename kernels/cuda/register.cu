// The CUDA backend's single registration point.
#include "cuda_kernels.h"

namespace tvc {

void register_cuda_kernels(KernelRegistry& registry) {
  cuda::register_memory(registry);
  cuda::register_elementwise_kernels(registry);
}

}  // namespace tvc
