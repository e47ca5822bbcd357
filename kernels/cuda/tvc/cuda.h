// The CUDA backend (library tvc-cuda, pkg-config tvc-cuda; built when tvc is configured with
// CUDA). A program that uses it links tvc-cuda and calls tvc::cuda::enable() once; programs
// that do not never link or load the CUDA runtime.
//
//   tvc::cuda::enable();
//   tvc::Tensor x = tvc::randn({2, 3}).to(tvc::Device::CUDA);
#pragma once

namespace tvc::cuda {

// Adds the CUDA kernels and device memory to tvc's kernel registry (once; later calls do
// nothing), so tensors can be moved to and computed on Device::CUDA. Safe to call from any
// thread. Before it, using Device::CUDA is an error saying so.
void enable();

// Whether the CUDA runtime finds at least one usable device.
bool is_available();

}  // namespace tvc::cuda
