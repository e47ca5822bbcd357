// The CUDA backend: registration entry points of its parts and the error check every CUDA call
// goes through. Only kernels/cuda includes this header.
#pragma once

#include <cuda_runtime.h>

#include "tvc/error.h"
#include "tvc/internal/kernel.h"

// Raises tvc::Error naming the call and CUDA's message when a runtime call fails.
#define TVC_CUDA_CHECK(call)                                                                                  \
  do {                                                                                                        \
    cudaError_t tvc_cuda_status_ = (call);                                                                    \
    if (tvc_cuda_status_ != cudaSuccess)                                                                      \
      throw ::tvc::Error(::tvc::cat_str("cuda: ", #call, " failed: ", cudaGetErrorString(tvc_cuda_status_))); \
  } while (0)

namespace tvc::cuda {

// Device memory: cudaMalloc / cudaFree / cudaMemcpy behind tvc::DeviceMemory.
void register_memory(KernelRegistry& registry);
// Elementwise kernels (add, float32).
void register_elementwise_kernels(KernelRegistry& registry);

}  // namespace tvc::cuda
