// Elementwise CUDA kernels. Shape legend: any shape up to kMaxDims dims; operands arrive
// broadcast (expanded) to the output's shape and may have any strides, including 0.
#include <algorithm>
#include <cstdint>

#include "cuda_kernels.h"

namespace tvc::cuda {

namespace {

constexpr int kMaxDims = 8;

// The geometry of one elementwise launch, passed by value to the kernel.
struct Geometry {
  int ndim;
  int64_t numel;
  int64_t shape[kMaxDims];
  int64_t stride[3][kMaxDims];  // out, a, b
};

__global__ void add_f32_kernel(float* out, const float* a, const float* b, Geometry g) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < g.numel; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = i, off_out = 0, off_a = 0, off_b = 0;
    for (int d = g.ndim - 1; d >= 0; --d) {
      int64_t idx = rest % g.shape[d];
      rest /= g.shape[d];
      off_out += idx * g.stride[0][d];
      off_a += idx * g.stride[1][d];
      off_b += idx * g.stride[2][d];
    }
    out[off_out] = a[off_a] + b[off_b];
  }
}

void add_kernel(const KernelArgs& args) {
  const Tensor &a = args.in[0], &b = args.in[1];
  Tensor& out = args.out[0];
  TVC_CHECK(out.device() == Device::CUDA, "add: the output is on ", device_name(out.device()), ", the inputs on cuda");
  if (a.dtype() != DType::Float32) unsupported_dtype(Op::add, a.dtype(), Device::CUDA);
  TVC_CHECK(out.dim() <= kMaxDims, "add: cuda kernel takes at most ", kMaxDims, " dims, got shape ", out.shape());
  Geometry g{};
  g.ndim = static_cast<int>(out.dim());
  g.numel = out.numel();
  if (g.numel == 0) return;
  const Tensor* operands[3] = {&out, &a, &b};
  for (int d = 0; d < g.ndim; ++d) {
    g.shape[d] = out.shape()[d];
    for (int k = 0; k < 3; ++k) g.stride[k][d] = operands[k]->strides()[d];
  }
  constexpr int kThreads = 256;
  int64_t blocks = std::min<int64_t>((g.numel + kThreads - 1) / kThreads, 65535);
  add_f32_kernel<<<static_cast<unsigned>(blocks), kThreads>>>(out.data_ptr<float>(), a.data_ptr<float>(),
                                                              b.data_ptr<float>(), g);
  TVC_CUDA_CHECK(cudaGetLastError());
  TVC_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

void register_elementwise_kernels(KernelRegistry& registry) { registry.set(Op::add, Device::CUDA, add_kernel); }

}  // namespace tvc::cuda
