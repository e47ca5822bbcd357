// CPU GEMM and the bmm kernel. Shape legend: A (M,K), B (K,N), C (M,N), batch B.
#include "gemm.h"

#include <vector>

#include "cpu_kernels.h"
#include "loops.h"

namespace tvc::cpu {

template <typename T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B,
          int64_t b_rs, int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, T beta) {
  parallel_for(M, N * K, [&](int64_t m0, int64_t m1) {
    std::vector<T> row(N);
    for (int64_t i = m0; i < m1; ++i) {
      for (int64_t j = 0; j < N; ++j) row[j] = 0;
      for (int64_t k = 0; k < K; ++k) {
        T a = A[i * a_rs + k * a_cs];
        const T* b = B + k * b_rs;
        for (int64_t j = 0; j < N; ++j) row[j] += a * b[j * b_cs];
      }
      for (int64_t j = 0; j < N; ++j) {
        T& c = C[i * c_rs + j * c_cs];
        c = beta == T(0) ? row[j] : row[j] + beta * c;
      }
    }
  });
}
template void gemm<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*,
                          int64_t, int64_t, float*, int64_t, int64_t, float);
template void gemm<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t,
                           const double*, int64_t, int64_t, double*, int64_t, int64_t, double);

namespace {

// in = (a (B,M,K), b (B,K,N)) -> out (B,M,N); float16/bfloat16 compute in float32.
void bmm_kernel(const KernelArgs& args) {
  const Tensor& a = args.in[0];
  const Tensor& b = args.in[1];
  const Tensor& out = args.out[0];
  int64_t batch = a.shape()[0], M = a.shape()[1], K = a.shape()[2], N = b.shape()[2];
  auto run = [&]<typename T>(const Tensor& ta, const Tensor& tb, const Tensor& tc) {
    const T* pa = static_cast<const T*>(ta.raw_data());
    const T* pb = static_cast<const T*>(tb.raw_data());
    T* pc = static_cast<T*>(tc.raw_data());
    for (int64_t i = 0; i < batch; ++i)
      gemm<T>(M, N, K, pa + i * ta.strides()[0], ta.strides()[1], ta.strides()[2],
              pb + i * tb.strides()[0], tb.strides()[1], tb.strides()[2], pc + i * tc.strides()[0],
              tc.strides()[1], tc.strides()[2], T(0));
  };
  switch (a.dtype()) {
    case DType::Float32: return run.template operator()<float>(a, b, out);
    case DType::Float64: return run.template operator()<double>(a, b, out);
    case DType::Float16:
    case DType::BFloat16: {
      Tensor a32 = a.to(DType::Float32), b32 = b.to(DType::Float32);
      Tensor c32 = empty(out.shape());
      run.template operator()<float>(a32, b32, c32);
      Tensor(out).copy_(c32);
      return;
    }
    default: unsupported_dtype(Op::bmm, a.dtype(), Device::CPU);
  }
}

}  // namespace

void register_gemm_kernels(KernelRegistry& r, Isa) { r.set(Op::bmm, Device::CPU, bmm_kernel); }

}  // namespace tvc::cpu
