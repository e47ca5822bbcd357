// Which kernels ran, on which path, inside which module, and for how long.
//
//   tvc::KernelProfiler profiler;   // records the kernels this thread runs while it lives
//   model(x);
//   for (const tvc::KernelRecord& r : profiler.records())
//     std::printf("%s %s %.3f ms\n", r.op.c_str(), r.path.c_str(), 1000 * r.seconds);
//
// A record is made per kernel an op runs on the profiling thread (the kernel's own threads
// included in its time; kernels started by another kernel count in that one). Without an active
// profiler nothing is recorded and the cost is one thread-local read per kernel and module call.
#pragma once

#include <string>
#include <vector>

#include "tvc/tensor.h"

namespace tvc {

namespace nn {
class Module;
}

struct KernelRecord {
  std::string op;    // the op whose kernel ran (tvc/internal/op_list.h), e.g. "conv2d_epilogue"
  std::string path;  // the way the kernel computed it where it says (e.g. "im2col+gemm"), else empty
  // The innermost module being called (through its call operator) when the kernel ran, or null
  // outside any: compare with the pointers of named_modules() for its name.
  const nn::Module* module;
  Shape shape;     // the kernel's first output's shape
  double seconds;  // wall time of the kernel
};

// Records this thread's kernels from construction to destruction; profilers nest (the innermost
// one records).
class KernelProfiler {
 public:
  KernelProfiler();
  ~KernelProfiler();
  KernelProfiler(const KernelProfiler&) = delete;
  KernelProfiler& operator=(const KernelProfiler&) = delete;

  // The kernels run so far, in order.
  const std::vector<KernelRecord>& records() const { return records_; }
  void clear() { records_.clear(); }

 private:
  friend struct ProfilerAccess;
  std::vector<KernelRecord> records_;
  KernelProfiler* outer_;
};

}  // namespace tvc
