// The op list's name table, the kernel registry and the choice of CPU instruction set.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "internal.h"
#include "tvc/autograd.h"
#include "tvc/internal/kernel.h"
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
    case Isa::generic:
      return "generic";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
    case Isa::avx512_bf16:
      return "avx512_bf16";
  }
  return "?";
}

std::vector<Isa> available_isas() {
  std::vector<Isa> out{Isa::generic};
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) out.push_back(Isa::avx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    out.push_back(Isa::avx512);
  if (out.back() == Isa::avx512 && __builtin_cpu_supports("avx512bf16")) out.push_back(Isa::avx512_bf16);
#endif
  return out;
}

namespace {

Isa isa_from_env() {
  std::vector<Isa> have = available_isas();
  const char* env = std::getenv("TVC_ISA");
  if (!env || !*env) return have.back();
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512_bf16}) {
    if (std::strcmp(env, isa_name(isa)) != 0) continue;
    for (Isa h : have)
      if (h == isa) return isa;
    throw Error(cat_str("TVC_ISA=", env, ": this CPU does not support that instruction set"));
  }
  throw Error(cat_str("TVC_ISA=", env, ": expected generic, avx2, avx512 or avx512_bf16"));
}

struct RegistryState {
  std::mutex mutex;  // serialises the making of tables
  std::atomic<const KernelRegistry*> table{nullptr};
  // Every table published stays alive: a thread may still be running a kernel it looked up in
  // an older one (a few KB each; only set_isa and add_backend make new ones).
  std::vector<std::unique_ptr<KernelRegistry>> tables;
  Isa isa = Isa::generic;
  std::vector<BackendRegistration> backends;
};

RegistryState& state() {
  static RegistryState s;
  return s;
}

// Makes the table of isa with every added backend and publishes it. The caller holds s.mutex.
void publish(RegistryState& s, Isa isa) {
  auto table = std::make_unique<KernelRegistry>();
  register_cpu_kernels(*table, isa);
  for (BackendRegistration add : s.backends) add(*table);
  s.isa = isa;
  s.table.store(table.get(), std::memory_order_release);
  s.tables.push_back(std::move(table));
}

}  // namespace

const KernelRegistry& kernel_registry() {
  RegistryState& s = state();
  if (const KernelRegistry* table = s.table.load(std::memory_order_acquire)) return *table;
  std::lock_guard lock(s.mutex);
  if (!s.table.load(std::memory_order_relaxed)) publish(s, isa_from_env());
  return *s.table.load(std::memory_order_acquire);
}

std::string cpu_isa() { return isa_name(active_isa()); }
bool cpu_has_native_bfloat16() { return active_isa() == Isa::avx512_bf16; }

Isa active_isa() {
  kernel_registry();
  std::lock_guard lock(state().mutex);
  return state().isa;
}

void set_isa(Isa isa) {
  bool ok = false;
  for (Isa h : available_isas()) ok |= h == isa;
  TVC_CHECK(ok, "set_isa: this CPU does not support ", isa_name(isa));
  kernel_registry();
  std::lock_guard lock(state().mutex);
  publish(state(), isa);
}

void add_backend(BackendRegistration registration, uint64_t op_list_hash) {
  TVC_CHECK(op_list_hash == kOpListHash,
            "add_backend: the backend was built against another list of ops than this library (a stale object "
            "file: rebuild the backend, e.g. tvc-cuda, from clean)");
  kernel_registry();
  RegistryState& s = state();
  std::lock_guard lock(s.mutex);
  for (BackendRegistration added : s.backends)
    if (added == registration) return;
  s.backends.push_back(registration);
  publish(s, s.isa);
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

const DeviceMemory& device_memory(Device device, const char* op) {
  const DeviceMemory* memory = kernel_registry().memory(device);
  TVC_CHECK(memory != nullptr, op, ": device ", device_name(device), " is not enabled: link the tvc-",
            device_name(device), " library and call tvc::", device_name(device), "::enable() first");
  return *memory;
}

namespace {

bool misaligned(const Tensor& t) {
  return t.defined() && t.device() == Device::CPU && t.numel() > 0 &&
         reinterpret_cast<uintptr_t>(t.raw_data()) % t.element_size() != 0;
}

// Copies every element of src to dst (same shape and dtype, any strides) byte by byte, so
// neither needs to be aligned to its element size.
void copy_bytes(const Tensor& dst, const Tensor& src) {
  size_t es = src.element_size();
  auto* dbase = static_cast<char*>(dst.storage()->data());
  const auto* sbase = static_cast<const char*>(src.storage()->data());
  int64_t nd = src.dim(), n = src.numel();
  std::vector<int64_t> idx(nd, 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t so = src.storage_offset(), d_off = dst.storage_offset();
    for (int64_t d = 0; d < nd; ++d) {
      so += idx[d] * src.strides()[d];
      d_off += idx[d] * dst.strides()[d];
    }
    std::memcpy(dbase + d_off * static_cast<int64_t>(es), sbase + so * static_cast<int64_t>(es), es);
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[d] < src.shape()[d]) break;
      idx[d] = 0;
    }
  }
}

Tensor aligned_copy(const Tensor& t) {
  Tensor out = empty(t.shape(), {.dtype = t.dtype()});
  copy_bytes(out, t);
  return out;
}

}  // namespace

void run_kernel(Op op, std::span<const Tensor> in, std::span<Tensor> out, const void* params) {
  // Kernels may assume elements aligned to their size; external buffers (from_blob) need not
  // be, so such operands go through aligned copies (outputs are copied back).
  bool any_misaligned = false;
  for (const Tensor& t : in) any_misaligned |= misaligned(t);
  for (const Tensor& t : out) any_misaligned |= misaligned(t);
  if (any_misaligned) {
    std::vector<Tensor> in2, out2;
    for (const Tensor& t : in) in2.push_back(misaligned(t) ? aligned_copy(t) : t);
    for (const Tensor& t : out) out2.push_back(misaligned(t) ? aligned_copy(t) : t);
    run_kernel(op, in2, out2, params);
    for (size_t i = 0; i < out.size(); ++i)
      if (!out2[i].is_same(out[i])) copy_bytes(out[i], out2[i]);
    return;
  }
  Device device = !in.empty() ? in[0].device() : out[0].device();
  for (const Tensor& t : in)
    TVC_CHECK(!t.defined() || t.device() == device, op_name(op), ": inputs are on different devices (",
              device_name(device), " and ", device_name(t.device()), ")");
  NoGradGuard no_grad;  // kernels may build views of their operands; nothing is recorded
  KernelFn fn = kernel_registry().get(op, device);
  TVC_CHECK(fn != nullptr, op_name(op), ": no kernel for device ", device_name(device));
  apply_num_threads();
  detail::run_profiled(op, out, [&] { fn(KernelArgs{in, out, params}); });
}

void unsupported_dtype(Op op, DType dtype, Device device) {
  throw Error(cat_str(op_name(op), ": dtype ", dtype_name(dtype), " is not supported on ", device_name(device)));
}

// ---------------------------------------------------------------- threads

namespace {
// The thread count set by set_num_threads, for every thread; 0: OpenMP's default.
std::atomic<int> g_num_threads{0};
}  // namespace

void set_num_threads(int n) {
  TVC_CHECK(n >= 1, "set_num_threads: need at least 1 thread, got ", n);
  g_num_threads.store(n, std::memory_order_relaxed);
}

int get_num_threads() {
  if (int n = g_num_threads.load(std::memory_order_relaxed)) return n;
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void apply_num_threads() {
#ifdef _OPENMP
  // OpenMP's thread count is per thread (an ICV of the caller): each thread adopts the setting
  // before its kernels run.
  int n = g_num_threads.load(std::memory_order_relaxed);
  if (n != 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
#endif
}

}  // namespace tvc
