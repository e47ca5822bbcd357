// Helpers shared by the op implementations in engine/src (not installed).
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "tvc/autograd.h"
#include "tvc/internal/autograd.h"
#include "tvc/internal/kernel.h"
#include "tvc/internal/tensor_impl.h"
#include "tvc/ops.h"
#include "tvc/profiler.h"
#include "tvc/tensor.h"

namespace tvc::detail {

// A new tensor over base's storage with the given geometry (no autograd recorded).
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset);
// An uninitialised tensor of shape and dtype laid out as `like` suggests (channels-last stays
// channels-last for 4-d shapes).
Tensor empty_with_format(const Shape& shape, DType dtype, MemoryFormat format);
// Whether a kernel may keep forms of weight (LinearParams' and Conv2dParams' keep_weight_forms),
// decided before the op detaches it: not in a training forward (grad mode on and weight requires
// grad), where each optimizer step changes the weight, so that a kept form would be made anew
// (a new allocation of the weight's size) every step and hold one more copy of the weight.
inline bool may_keep_weight_forms(const Tensor& weight) { return !(is_grad_enabled() && weight.requires_grad()); }
// Runs op's kernel with the given inputs and outputs.
inline void run(Op op, std::vector<Tensor> in, std::vector<Tensor> out, const void* params = nullptr) {
  run_kernel(op, in, out, params);
}
// Runs kernel, op's kernel with outputs out, recording it with the thread's KernelProfiler when
// one is active and no other kernel is running on the thread (tvc/profiler.h).
void run_profiled(Op op, std::span<const Tensor> out, const std::function<void()>& kernel);
// Marks module as being called for KernelProfiler's records while it lives (Module::call).
class ProfiledModule {
 public:
  explicit ProfiledModule(const nn::Module* module);
  ~ProfiledModule();
  ProfiledModule(const ProfiledModule&) = delete;
  ProfiledModule& operator=(const ProfiledModule&) = delete;

 private:
  bool active_;
};
// Sorted, wrapped, de-duplicated reduction dims (empty = all).
std::vector<int64_t> reduction_dims(const Shape& dims, int64_t ndim, const char* op);
// The shape after reducing dims, with or without keepdim.
Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim);
// Makes a reduced tensor's shape keepdim by inserting size-1 dims at dims (sorted).
Tensor unsqueeze_dims(const Tensor& t, const std::vector<int64_t>& dims);
// Suggests the memory format for a result computed from inputs: ChannelsLast when any 4-d input
// is channels-last.
MemoryFormat result_format(const std::vector<Tensor>& inputs);

}  // namespace tvc::detail
