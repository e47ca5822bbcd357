// Reverse-mode automatic differentiation: grad mode, backward() and grad() (the graph's nodes
// are internal: tvc/internal/autograd.h).
//
// Every differentiable op run while grad mode is on records a Node: its backward function and
// edges to the nodes that produced its inputs (or to the AccumulateGrad node of a leaf).
// backward() walks the graph from the roots, newest node first, summing gradients that meet,
// and accumulates into the .grad of leaves that require grad. Saved tensors are freed after use
// unless retain_graph is set; a tensor modified in place after being saved raises on backward.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tvc/tensor.h"

namespace tvc {

// Grad mode is thread-local and on by default.
bool is_grad_enabled();
void set_grad_enabled(bool enabled);

// Turns grad mode off for its lifetime (torch.no_grad()).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Sets grad mode to a given value for its lifetime (torch.set_grad_enabled(mode)).
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : previous_(is_grad_enabled()) { set_grad_enabled(enabled); }
  ~GradModeGuard() { set_grad_enabled(previous_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

// Computes the gradients of roots (with the given grads; undefined = ones for one-element roots).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {}, bool retain_graph = false);

// Gradients of outputs w.r.t. inputs, returned instead of accumulated into .grad
// (torch.autograd.grad). An input not reached gets an undefined tensor when allow_unused.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool allow_unused = false);

// A differentiable function of one's own (PyTorch's autograd.Function): the caller computes
// outputs from inputs (fresh tensors, not views of the inputs), and backward maps the outputs'
// gradients (zeros for outputs that received none) to one gradient per input (undefined where
// an input needs none). When grad mode is on and an input requires grad, the outputs become
// the results of a node named name whose backward is backward; the outputs are returned.
using FunctionBackward = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;
std::vector<Tensor> record_function(const std::string& name, const std::vector<Tensor>& inputs,
                                    std::vector<Tensor> outputs, FunctionBackward backward);

}  // namespace tvc
