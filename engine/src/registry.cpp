// The op list's name table, the kernel registry and the choice of CPU instruction set.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "tvc/autograd.h"
#include "tvc/kernel.h"
#include "tvc/ops.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tvc {

namespace {
struct OpInfo {
  const char* name;
  OpKind kind;
};
constexpr OpInfo kOps[] = {
#define TVC_OP_INFO(name, kind) {#name, OpKind::kind},
    TVC_OP_LIST(TVC_OP_INFO)
#undef TVC_OP_INFO
};
static_assert(sizeof(kOps) / sizeof(kOps[0]) == kNumOps, "op name table out of step with Op");
}  // namespace

const char* op_name(Op op) { return kOps[static_cast<int>(op)].name; }
OpKind op_kind(Op op) { return kOps[static_cast<int>(op)].kind; }

// ---------------------------------------------------------------- instruction sets

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::generic: return "generic";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

std::vector<Isa> available_isas() {
  std::vector<Isa> out{Isa::generic};
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) out.push_back(Isa::avx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    out.push_back(Isa::avx512);
#endif
  return out;
}

namespace {

Isa isa_from_env() {
  std::vector<Isa> have = available_isas();
  const char* env = std::getenv("TVC_ISA");
  if (!env || !*env) return have.back();
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512}) {
    if (std::strcmp(env, isa_name(isa)) != 0) continue;
    for (Isa h : have)
      if (h == isa) return isa;
    throw Error(cat_str("TVC_ISA=", env, ": this CPU does not support that instruction set"));
  }
  throw Error(cat_str("TVC_ISA=", env, ": expected generic, avx2 or avx512"));
}

struct RegistryState {
  KernelRegistry registry;
  Isa isa = Isa::generic;
  std::once_flag once;
};

RegistryState& state() {
  static RegistryState s;
  return s;
}

void fill(RegistryState& s, Isa isa) {
  s.registry = KernelRegistry();
  s.isa = isa;
  register_cpu_kernels(s.registry, isa);
#ifdef TVC_HAVE_CUDA
  register_cuda_kernels(s.registry);
#endif
}

}  // namespace

KernelRegistry& kernel_registry() {
  RegistryState& s = state();
  std::call_once(s.once, [&] { fill(s, isa_from_env()); });
  return s.registry;
}

Isa active_isa() {
  kernel_registry();
  return state().isa;
}

void set_isa(Isa isa) {
  bool ok = false;
  for (Isa h : available_isas()) ok |= h == isa;
  TVC_CHECK(ok, "set_isa: this CPU does not support ", isa_name(isa));
  kernel_registry();
  fill(state(), isa);
}

// ---------------------------------------------------------------- registry

void KernelRegistry::set(Op op, Device device, KernelFn fn) {
  table_[static_cast<int>(op)][static_cast<int>(device)] = fn;
}

KernelFn KernelRegistry::get(Op op, Device device) const {
  return table_[static_cast<int>(op)][static_cast<int>(device)];
}

void KernelRegistry::set_memory(Device device, const DeviceMemory& memory) {
  TVC_CHECK(device != Device::CPU && memory.allocate && memory.release && memory.copy,
            "KernelRegistry::set_memory: needs all three functions, for a device other than cpu");
  memory_[static_cast<int>(device)] = memory;
}

const DeviceMemory* KernelRegistry::memory(Device device) const {
  const DeviceMemory& m = memory_[static_cast<int>(device)];
  return m.allocate ? &m : nullptr;
}

void run_kernel(Op op, std::span<const Tensor> in, std::span<Tensor> out, const void* params) {
  Device device = !in.empty() ? in[0].device() : out[0].device();
  for (const Tensor& t : in)
    TVC_CHECK(!t.defined() || t.device() == device, op_name(op), ": inputs are on different devices (",
              device_name(device), " and ", device_name(t.device()), ")");
  NoGradGuard no_grad;  // kernels may build views of their operands; nothing is recorded
  KernelFn fn = kernel_registry().get(op, device);
  TVC_CHECK(fn != nullptr, op_name(op), ": no kernel for device ", device_name(device));
  fn(KernelArgs{in, out, params});
}

void unsupported_dtype(Op op, DType dtype, Device device) {
  throw Error(cat_str(op_name(op), ": dtype ", dtype_name(dtype), " is not supported on ",
                      device_name(device)));
}

// ---------------------------------------------------------------- threads

void set_num_threads(int n) {
  TVC_CHECK(n >= 1, "set_num_threads: need at least 1 thread, got ", n);
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

int get_num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace tvc
