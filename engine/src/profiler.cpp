// KernelProfiler (tvc/profiler.h) and the hooks run_kernel and Module::call use for it.
#include "tvc/profiler.h"

#include <chrono>

#include "internal.h"

namespace tvc {

namespace {

thread_local KernelProfiler* t_profiler = nullptr;
thread_local std::vector<const nn::Module*> t_modules;  // being called, innermost last
thread_local int t_kernel_depth = 0;                    // kernels running on this thread
thread_local const char* t_path = nullptr;              // the running kernel's note

}  // namespace

struct ProfilerAccess {
  static void add(KernelProfiler& p, KernelRecord r) { p.records_.push_back(std::move(r)); }
};

KernelProfiler::KernelProfiler() : outer_(t_profiler) { t_profiler = this; }
KernelProfiler::~KernelProfiler() { t_profiler = outer_; }

void note_kernel_path(const char* path) {
  if (t_profiler && t_kernel_depth == 1) t_path = path;
}

namespace detail {

ProfiledModule::ProfiledModule(const nn::Module* module) : active_(t_profiler != nullptr) {
  if (active_) t_modules.push_back(module);
}
ProfiledModule::~ProfiledModule() {
  if (active_) t_modules.pop_back();
}

void run_profiled(Op op, std::span<const Tensor> out, const std::function<void()>& kernel) {
  KernelProfiler* profiler = t_kernel_depth == 0 ? t_profiler : nullptr;
  if (!profiler) {
    kernel();
    return;
  }
  struct Depth {
    Depth() { ++t_kernel_depth, t_path = nullptr; }
    ~Depth() { --t_kernel_depth; }
  } depth;
  const auto start = std::chrono::steady_clock::now();
  kernel();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ProfilerAccess::add(*profiler,
                      {std::string(op_name(op)), t_path ? t_path : "", t_modules.empty() ? nullptr : t_modules.back(),
                       out.empty() ? Shape{} : out[0].shape(), seconds});
}

}  // namespace detail

}  // namespace tvc
