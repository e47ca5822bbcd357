// The autograd graph (internal to the engine and its tests): nodes, edges, saved tensors, and
// how ops record themselves. The public part is tvc/autograd.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tvc/autograd.h"
#include "tvc/internal/tensor_impl.h"

namespace tvc {
namespace autograd {

struct Edge {
  std::shared_ptr<Node> fn;  // null: this input needs no gradient
  uint32_t input_nr = 0;     // which output of fn the gradient belongs to
};

// Shape and dtype of one node output, used to make zero gradients for unused outputs.
struct OutputMeta {
  Shape shape;
  DType dtype;
};

// A tensor kept for backward with the storage version it had when saved.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  // The saved tensor; throws if it was modified in place since it was saved.
  Tensor unpack(const std::string& node_name) const;

 private:
  Tensor tensor_;
  uint64_t version_ = 0;
};

using GradList = std::vector<Tensor>;

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  virtual std::string name() const = 0;
  // Gradients w.r.t. each output in, gradients w.r.t. each next edge out.
  virtual GradList apply(GradList&& grad_outputs) = 0;
  virtual void release_saved() {}

  std::vector<Edge> next_edges;
  std::vector<OutputMeta> outputs;
  uint64_t sequence_nr;  // creation order; the engine runs newer nodes first
  // Tensor hooks of non-leaf outputs: (output_nr, handle, hook).
  struct TensorPreHook {
    uint32_t output_nr;
    int handle;
    TensorHook hook;
  };
  std::vector<TensorPreHook> tensor_pre_hooks;
  // Hooks on all grad outputs before apply (may replace them) and on (grad_inputs,
  // grad_outputs) after apply (may replace grad_inputs). Used by module backward hooks.
  std::vector<std::function<GradList(const GradList& grad_outputs)>> pre_hooks;
  std::vector<std::function<GradList(const GradList& grad_inputs, const GradList& grad_outputs)>> post_hooks;
  // Tensors whose .grad should receive output i's gradient (retain_grad).
  std::vector<std::pair<uint32_t, std::weak_ptr<TensorImpl>>> retained;
  // For a view of part of its one input (select, slice; null for other nodes): adds the view's
  // gradient into `slot`, the input's gradient gathered so far, in place, as apply's result (zeros
  // but for the part) would be added to it. The engine uses it where slot is its own dense
  // tensor (held by nothing else): one add over the part where apply would fill and copy a whole
  // input-sized tensor and then add it (Swin's q, k and v: three selects of one tensor).
  std::function<void(Tensor& slot, const Tensor& grad)> add_part_into;
};

using BackwardFn = std::function<GradList(const GradList& grad_outputs)>;

// A node whose backward is a function; releasing it drops everything the function captured.
class FunctionNode : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  GradList apply(GradList&& grad_outputs) override;
  void release_saved() override { fn_ = nullptr; }

 private:
  std::string name_;
  BackwardFn fn_;
};

// True when grad mode is on and any input requires grad.
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Records outputs as produced by a node named name from inputs, with backward fn (returning
// one gradient per input; undefined for inputs that need none). Does nothing unless
// any_requires_grad(inputs). Returns the node (or null).
std::shared_ptr<Node> record(const std::string& name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& outputs, BackwardFn fn);

// The edge through which a gradient flows into t (its grad_fn or its leaf accumulator).
Edge gradient_edge(const Tensor& t);

// Prepares an in-place op on self: raises for leaves that require grad and for views of tensors
// that require grad (while grad mode is on). Call before writing.
void check_inplace(const Tensor& self, const char* op);
// After an in-place op on self that used other inputs: bumps the version and, when grad is
// needed, makes self's history go through a node with backward fn.
void record_inplace(const std::string& name, Tensor& self, const std::vector<Tensor>& others, BackwardFn fn);

}  // namespace autograd
}  // namespace tvc
