// Device memory for Storage (allocation) and Tensor::to(Device) (copies), through the CUDA
// runtime. Every call is checked; the failure (no device, out of memory, ...) is a tvc::Error.
#include "cuda_kernels.h"

namespace tvc::cuda {

namespace {

void* cuda_allocate(size_t nbytes) {
  void* data = nullptr;
  TVC_CUDA_CHECK(cudaMalloc(&data, nbytes));
  return data;
}

// A deleter runs in a destructor and must not throw: a failing cudaFree (the context is gone
// at process exit) leaves nothing to do.
void cuda_release(void* data) { (void)cudaFree(data); }

void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  cudaMemcpyKind kind = src_device == Device::CPU   ? cudaMemcpyHostToDevice
                        : dst_device == Device::CPU ? cudaMemcpyDeviceToHost
                                                    : cudaMemcpyDeviceToDevice;
  TVC_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, kind));
}

}  // namespace

void register_memory(KernelRegistry& registry) {
  registry.set_memory(Device::CUDA,
                      DeviceMemory{.allocate = cuda_allocate, .release = cuda_release, .copy = cuda_copy});
}

}  // namespace tvc::cuda
