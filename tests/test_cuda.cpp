// The CUDA device axis: device storage, host<->device copies (Tensor::to) and the float32 add
// kernel registered for Device::CUDA, compared with the CPU result on random inputs. Without a
// GPU the device tests are skipped and the allocation error is checked instead.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "tvc/cuda.h"
#include "tvc/internal/kernel.h"
#include "tvc/ops.h"

namespace {

// Why there is no usable GPU, or "" when there is one.
std::string no_gpu_reason() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
  if (count == 0) return "no CUDA device";
  EXPECT_TRUE(tvc::cuda::is_available());
  return "";
}

// out = a + b by the CUDA kernel, all three on the device.
tvc::Tensor cuda_add(const tvc::Tensor& a, const tvc::Tensor& b) {
  tvc::Tensor out = tvc::empty(a.shape(), {.dtype = a.dtype(), .device = tvc::Device::CUDA});
  tvc::Tensor in[2] = {a, b};
  tvc::run_kernel(tvc::Op::add, in, std::span<tvc::Tensor>(&out, 1));
  return out;
}

// Before tvc::cuda::enable() (this test runs first), Device::CUDA is an error that says how to
// get it.
TEST(Cuda, NeedsEnable) {
  EXPECT_FALSE(tvc::kernel_registry().supports(tvc::Op::add, tvc::Device::CUDA));
  try {
    tvc::empty({16}, {.device = tvc::Device::CUDA});
    FAIL() << "a CUDA tensor was made before tvc::cuda::enable()";
  } catch (const tvc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tvc::cuda::enable()"), std::string::npos) << e.what();
  }
}

TEST(Cuda, RegistersAddAndMemory) {
  tvc::cuda::enable();
  tvc::cuda::enable();  // once is enough; again does nothing
  EXPECT_TRUE(tvc::kernel_registry().supports(tvc::Op::add, tvc::Device::CUDA));
  EXPECT_NE(tvc::kernel_registry().memory(tvc::Device::CUDA), nullptr);
}

TEST(Cuda, AllocationFailsClearlyWithoutGpu) {
  tvc::cuda::enable();
  std::string reason = no_gpu_reason();
  if (reason.empty()) GTEST_SKIP() << "a GPU is present";
  try {
    tvc::empty({16}, {.device = tvc::Device::CUDA});
    FAIL() << "allocating CUDA memory without a GPU did not throw";
  } catch (const tvc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda: cudaMalloc"), std::string::npos) << e.what();
  }
}

TEST(Cuda, CopyRoundTrip) {
  tvc::cuda::enable();
  std::string reason = no_gpu_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  tvc::Generator gen(1);
  tvc::Tensor a = tvc::randn({3, 5, 7}, {}, &gen);
  tvc::Tensor d = a.to(tvc::Device::CUDA);
  EXPECT_EQ(d.device(), tvc::Device::CUDA);
  EXPECT_EQ(d.shape(), a.shape());
  tvc::Tensor back = d.to(tvc::Device::CPU);
  EXPECT_EQ(back.device(), tvc::Device::CPU);
  EXPECT_EQ(back.to_vector(), a.to_vector());
  // A non-contiguous source is copied in logical order.
  tvc::Tensor t = a.transpose(0, 2);
  EXPECT_EQ(t.to(tvc::Device::CUDA).to(tvc::Device::CPU).to_vector(), t.to_vector());
}

TEST(Cuda, AddMatchesCpu) {
  tvc::cuda::enable();
  std::string reason = no_gpu_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  tvc::Generator gen(2);
  for (const tvc::Shape& shape : {tvc::Shape{1000003}, tvc::Shape{4, 33, 65}, tvc::Shape{}}) {
    tvc::Tensor a = tvc::randn(shape, {}, &gen), b = tvc::randn(shape, {}, &gen);
    tvc::Tensor got = cuda_add(a.to(tvc::Device::CUDA), b.to(tvc::Device::CUDA));
    EXPECT_EQ(got.to(tvc::Device::CPU).to_vector(), tvc::add(a, b).to_vector()) << "shape " << tvc::shape_str(shape);
  }
  // Broadcast (stride 0) operands, as ops hand them to kernels.
  tvc::Tensor a = tvc::randn({4, 6}, {}, &gen), row = tvc::randn({1, 6}, {}, &gen);
  tvc::Tensor got = cuda_add(a.to(tvc::Device::CUDA), row.to(tvc::Device::CUDA).expand({4, 6}));
  EXPECT_EQ(got.to(tvc::Device::CPU).to_vector(), tvc::add(a, row).to_vector());
}

TEST(Cuda, AddRejectsOtherDtypes) {
  tvc::cuda::enable();
  std::string reason = no_gpu_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  tvc::Tensor a = tvc::arange(6).to(tvc::Device::CUDA);
  try {
    cuda_add(a, a);
    FAIL() << "int64 add on cuda did not throw";
  } catch (const tvc::Error& e) {
    EXPECT_STREQ(e.what(), "add: dtype int64 is not supported on cuda");
  }
}

}  // namespace
