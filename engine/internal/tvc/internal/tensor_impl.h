// The state behind a tvc::Tensor handle (internal to the engine, its kernels and tests).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "tvc/tensor.h"

namespace tvc {

// The state behind a Tensor handle.
struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;
  DType dtype = DType::Float32;

  // autograd
  bool requires_grad = false;
  bool retains_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;                   // which output of grad_fn this is
  std::weak_ptr<autograd::Node> grad_accumulator;
  std::vector<std::pair<int, TensorHook>> leaf_hooks;  // hooks of a leaf, by handle
  std::shared_ptr<TensorImpl> view_base;               // set on views made by view ops
};

}  // namespace tvc
