// CPU kernels: uniform, normal and randint draws from the Philox 4x32-10 counter-based
// generator. Element i of a draw uses counter (offset + i) under key seed, so a value depends
// only on (seed, offset, i), never on the thread count or the order of evaluation.
#include <cmath>

#include "cpu_kernels.h"
#include "loops.h"

namespace tvc::cpu {
namespace {

struct Philox {
  uint32_t out[4];
  Philox(uint64_t seed, uint64_t counter) {
    uint32_t c[4] = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0};
    uint32_t k[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
    for (int round = 0; round < 10; ++round) {
      uint64_t p0 = uint64_t{0xD2511F53u} * c[0];
      uint64_t p1 = uint64_t{0xCD9E8D57u} * c[2];
      uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0];
      uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1];
      c[0] = n0, c[1] = static_cast<uint32_t>(p1), c[2] = n2, c[3] = static_cast<uint32_t>(p0);
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    for (int i = 0; i < 4; ++i) out[i] = c[i];
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform(int which = 0) const {
    uint64_t bits = (uint64_t{out[2 * which]} << 21) ^ out[2 * which + 1];
    return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * (1.0 / 9007199254740992.0);
  }
};

// Fills out (contiguous) with gen(philox_for_element_i) (a double, or an int64 for randint) cast
// to its dtype.
template <typename Gen>
void fill_random(const KernelArgs& args, Op op, Gen gen) {
  const Tensor& out = args.out[0];
  TVC_CHECK(out.is_contiguous(), op_name(op), ": output must be contiguous");
  const auto& p = args.p<FillParams>();
  dispatch_all(out.dtype(), op, [&]<typename T>() {
    T* o = out.data_ptr<T>();
    parallel_for(out.numel(), 64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        Philox ph(p.seed, p.offset + static_cast<uint64_t>(i));
        o[i] = static_cast<T>(static_cast<compute_t<T>>(gen(ph, p)));
      }
    });
  });
}

void uniform_kernel(const KernelArgs& args) {
  fill_random(args, Op::uniform,
              [](const Philox& ph, const FillParams& p) { return p.a + (p.b - p.a) * ph.uniform(); });
}

void normal_kernel(const KernelArgs& args) {
  fill_random(args, Op::normal, [](const Philox& ph, const FillParams& p) {
    double u1 = 1.0 - ph.uniform(0);  // (0, 1]
    double u2 = ph.uniform(1);
    return p.a + p.b * (std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  });
}

// low + (64 random bits mod (high - low)), in integers: exact for every int64 range (up to
// [INT64_MIN, INT64_MAX)), the modulo bias of PyTorch's own randint.
void randint_kernel(const KernelArgs& args) {
  fill_random(args, Op::randint, [](const Philox& ph, const FillParams& p) {
    uint64_t range = static_cast<uint64_t>(p.high) - static_cast<uint64_t>(p.low);
    uint64_t bits = (uint64_t{ph.out[0]} << 32) | ph.out[1];
    return static_cast<int64_t>(static_cast<uint64_t>(p.low) + bits % range);
  });
}

}  // namespace

void register_random_kernels(KernelRegistry& r) {
  r.set(Op::uniform, Device::CPU, uniform_kernel);
  r.set(Op::normal, Device::CPU, normal_kernel);
  r.set(Op::randint, Device::CPU, randint_kernel);
}

}  // namespace tvc::cpu
