// The CUDA backend's single registration point and its public entry (tvc/cuda.h).
#include "cuda_kernels.h"
#include "tvc/cuda.h"

namespace tvc::cuda {

namespace {

void register_kernels(KernelRegistry& registry) {
  register_memory(registry);
  register_elementwise_kernels(registry);
}

}  // namespace

void enable() { add_backend(register_kernels); }

bool is_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace tvc::cuda
