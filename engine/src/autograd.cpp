// The autograd engine: recording nodes, in-place checks, and the backward pass.
#include "tvc/autograd.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "internal.h"

namespace tvc {

namespace {
thread_local bool g_grad_enabled = true;
std::atomic<uint64_t> g_next_sequence_nr{0};
}  // namespace

bool is_grad_enabled() { return g_grad_enabled; }
void set_grad_enabled(bool enabled) { g_grad_enabled = enabled; }

namespace autograd {

Node::Node() : sequence_nr(g_next_sequence_nr.fetch_add(1)) {}

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  tensor_ = t.detach();
  version_ = t.version();
}

Tensor SavedTensor::unpack(const std::string& node_name) const {
  if (!tensor_.defined()) return tensor_;
  TVC_CHECK(tensor_.version() == version_,
            "one of the tensors needed for gradient computation has been modified by an in-place "
            "operation: a tensor of shape ",
            tensor_.shape(), " saved by ", node_name, " is at version ", tensor_.version(), "; expected version ",
            version_);
  return tensor_;
}

GradList FunctionNode::apply(GradList&& grad_outputs) {
  TVC_CHECK(fn_ != nullptr, "trying to backward through ", name_,
            " a second time: its saved tensors were freed after the first backward; pass "
            "retain_graph=true to the first backward");
  return fn_(grad_outputs);
}

namespace {

// Whether t alone holds its TensorImpl and its memory, as a fresh result does. A view (a gradient
// reshaped from a product's or a sum's result: linear's weight and bias gradients) shares its
// memory with its base (view_base); where nothing but t holds that base, t is made to hold the
// memory alone (the base dropped), so that backward takes it as it takes a fresh result rather
// than copying it.
bool holds_memory_alone(const Tensor& t) {
  TensorImpl* impl = t.impl();
  if (t.impl_ptr().use_count() != 1) return false;
  if (impl->view_base && impl->view_base.use_count() == 1 && impl->view_base->storage == impl->storage &&
      impl->storage.use_count() == 2)
    impl->view_base.reset();
  return impl->storage.use_count() == 1;
}

}  // namespace

// Accumulates the gradient of a leaf into its .grad, after running the leaf's hooks.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf) : leaf_(leaf) {
    outputs.push_back({leaf->shape, leaf->dtype});
  }
  std::string name() const override { return "AccumulateGrad"; }
  GradList apply(GradList&& grads) override {
    auto leaf = leaf_.lock();
    if (!leaf) return {};
    Tensor g = std::move(grads[0]);
    for (auto& [handle, hook] : leaf->leaf_hooks) {
      Tensor r = hook(g);
      if (r.defined()) g = r;
    }
    if (!leaf->grad) {
      // Own the gradient, never an alias of another: g itself where nothing else holds it or its
      // memory and it is laid out as a fresh tensor in the leaf's layout would be (as PyTorch's
      // AccumulateGrad steals it; no copy of every parameter's gradient per step), else a copy.
      const Tensor like(leaf);
      const bool sole = holds_memory_alone(g) && g.storage_offset() == 0 &&
                        g.storage()->nbytes() == static_cast<size_t>(g.numel()) * g.element_size() &&
                        g.dtype() == like.dtype() && g.device() == like.device() && g.shape() == like.shape() &&
                        g.is_contiguous(like.suggest_memory_format());
      if (sole) {
        leaf->grad = g.impl_ptr();
        return {};
      }
      Tensor owned = empty_like(like);
      owned.copy_(g);
      leaf->grad = owned.impl_ptr();
    } else {
      Tensor(leaf->grad).add_(g);
    }
    return {};
  }

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!is_grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  TensorImpl* impl = t.impl();
  if (impl->grad_fn) return {impl->grad_fn, impl->output_nr};
  // Threads recording graphs through one model at once share its parameters' accumulators.
  static std::mutex accumulator_mutex;
  std::lock_guard lock(accumulator_mutex);
  auto acc = impl->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    impl->grad_accumulator = acc;
  }
  return {acc, 0};
}

std::shared_ptr<Node> record(const std::string& name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& outputs, BackwardFn fn) {
  if (!any_requires_grad(inputs)) return nullptr;
  auto node = std::make_shared<FunctionNode>(name, std::move(fn));
  for (const Tensor& t : inputs) node->next_edges.push_back(gradient_edge(t));
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    node->outputs.push_back({out.shape(), out.dtype()});
    if (!is_floating(out.dtype())) continue;  // integer outputs (indices) carry no gradient
    out.impl()->requires_grad = true;
    out.impl()->grad_fn = node;
    out.impl()->output_nr = static_cast<uint32_t>(i);
  }
  return node;
}

void check_inplace(const Tensor& self, const char* op) {
  if (!is_grad_enabled()) return;
  TVC_CHECK(!(self.is_leaf() && self.requires_grad()), op, ": a leaf tensor that requires grad (shape ", self.shape(),
            ") is being used in an in-place operation; use NoGradGuard or a copy");
  const auto& base = self.impl()->view_base;
  if (base) {
    TVC_CHECK(!self.requires_grad() && !base->requires_grad, op, ": in-place operation on a view (shape ", self.shape(),
              ") of a tensor that requires grad is not supported; apply it to a clone");
  }
}

void record_inplace(const std::string& name, Tensor& self, const std::vector<Tensor>& others, BackwardFn fn) {
  self.storage()->bump_version();
  std::vector<Tensor> inputs{self};
  inputs.insert(inputs.end(), others.begin(), others.end());
  if (!any_requires_grad(inputs)) return;
  // The node's first input is self's previous history; self then points at the node.
  auto node = std::make_shared<FunctionNode>(name, std::move(fn));
  for (const Tensor& t : inputs) node->next_edges.push_back(gradient_edge(t));
  node->outputs.push_back({self.shape(), self.dtype()});
  self.impl()->requires_grad = true;
  self.impl()->grad_fn = node;
  self.impl()->output_nr = 0;
}

namespace {

struct NodeTask {
  GradList grads;  // one per output
  int dependencies = 0;
};

// Whether a gathered gradient can take g (or part of it) in place: the slot's tensor and its
// memory are held by nothing else and it is dense (no allocation and fresh pages per sum).
bool adds_in_place(const Tensor& slot, const Tensor& g) {
  return slot.defined() && holds_memory_alone(slot) &&
         (slot.is_contiguous() || slot.is_contiguous(MemoryFormat::ChannelsLast)) && slot.dtype() == g.dtype() &&
         slot.device() == g.device();
}

void add_into(Tensor& slot, const Tensor& g) {
  if (!g.defined()) return;
  if (!slot.defined()) {
    slot = g;
    return;
  }
  if (adds_in_place(slot, g) && slot.shape() == g.shape())
    slot.add_(g);  // the same values as add
  else
    slot = add(slot, g);
}

// Runs the backward pass from root edges. When capture is non-null, gradients arriving at the
// listed edges are stored there instead of flowing on (autograd::grad).
void run_backward(const std::vector<Edge>& roots, const GradList& root_grads, bool retain_graph,
                  std::unordered_map<Node*, std::vector<std::pair<uint32_t, Tensor*>>>* capture) {
  NoGradGuard no_grad;
  std::unordered_map<Node*, NodeTask> tasks;
  // Count dependencies of every reachable node.
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const Edge& e : roots)
    if (e.fn && seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    tasks[n];
    for (const Edge& e : n->next_edges) {
      if (!e.fn) continue;
      tasks[e.fn.get()].dependencies++;
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!roots[i].fn) continue;
    NodeTask& t = tasks[roots[i].fn.get()];
    t.grads.resize(roots[i].fn->outputs.size());
    add_into(t.grads[roots[i].input_nr], root_grads[i]);
  }
  auto newer_first = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(newer_first)> ready(newer_first);
  for (Node* n : seen)
    if (tasks[n].dependencies == 0) ready.push(n);
  // Keep nodes alive while they run even if their owners drop them.
  std::vector<std::shared_ptr<Node>> keep;
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    keep.push_back(node->shared_from_this());
    NodeTask& task = tasks[node];
    GradList grads = std::move(task.grads);
    grads.resize(node->outputs.size());
    for (const auto& h : node->tensor_pre_hooks) {
      if (!grads[h.output_nr].defined()) continue;
      Tensor r = h.hook(grads[h.output_nr]);
      if (r.defined()) grads[h.output_nr] = r;
    }
    for (const auto& [nr, weak] : node->retained) {
      auto impl = weak.lock();
      if (impl && grads[nr].defined()) {
        Tensor owned = grads[nr].clone();
        if (impl->grad) owned = add(Tensor(impl->grad), owned);
        impl->grad = owned.impl_ptr();
      }
    }
    bool captured = false;
    if (capture) {
      auto it = capture->find(node);
      if (it != capture->end()) {
        for (auto& [nr, dst] : it->second) add_into(*dst, grads[nr]);
        captured = true;
      }
    }
    GradList next;
    if (!captured) {
      for (auto& h : node->pre_hooks) grads = h(grads);
      for (size_t i = 0; i < grads.size(); ++i)
        if (!grads[i].defined()) grads[i] = zeros(node->outputs[i].shape, {.dtype = node->outputs[i].dtype});
      // A view of part of its input whose input already has a gradient of its own: the part added
      // into it (next stays empty).
      const Edge* part_of =
          node->add_part_into && node->post_hooks.empty() && node->next_edges.size() == 1 && node->next_edges[0].fn
              ? &node->next_edges[0]
              : nullptr;
      if (part_of) {
        NodeTask& input = tasks[part_of->fn.get()];
        if (part_of->input_nr < input.grads.size() && adds_in_place(input.grads[part_of->input_nr], grads[0]))
          node->add_part_into(input.grads[part_of->input_nr], grads[0]);
        else
          part_of = nullptr;
      }
      if (!part_of) {
        GradList grad_outputs = node->post_hooks.empty() ? GradList{} : grads;
        next = node->apply(std::move(grads));
        for (auto& h : node->post_hooks) next = h(next, grad_outputs);
      }
      if (!retain_graph) node->release_saved();
    }
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.fn) continue;
      NodeTask& nt = tasks[e.fn.get()];
      if (i < next.size() && next[i].defined()) {
        nt.grads.resize(e.fn->outputs.size());
        const OutputMeta& meta = e.fn->outputs[e.input_nr];
        TVC_CHECK(next[i].shape() == meta.shape, "backward of ", node->name(), " returned a gradient of shape ",
                  next[i].shape(), " for input ", i, " of shape ", meta.shape);
        Tensor g = next[i].dtype() == meta.dtype ? next[i] : next[i].to(meta.dtype);
        add_into(nt.grads[e.input_nr], g);
      }
      if (--nt.dependencies == 0) ready.push(e.fn.get());
    }
  }
}

Tensor default_root_grad(const Tensor& root, const Tensor& given) {
  if (given.defined()) {
    TVC_CHECK(given.shape() == root.shape(), "backward: grad of shape ", given.shape(),
              " does not match the output's shape ", root.shape());
    return given;
  }
  TVC_CHECK(root.numel() == 1,
            "backward: grad can be implicitly created only for one-element "
            "outputs, got shape ",
            root.shape());
  return ones_like(root);
}

}  // namespace
}  // namespace autograd

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  std::vector<autograd::Edge> edges;
  autograd::GradList root_grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    TVC_CHECK(roots[i].requires_grad(), "backward: tensor ", i, " of shape ", roots[i].shape(),
              " does not require grad and has no grad_fn");
    edges.push_back(autograd::gradient_edge(roots[i]));
    root_grads.push_back(autograd::default_root_grad(roots[i], i < grads.size() ? grads[i] : Tensor()));
  }
  autograd::run_backward(edges, root_grads, retain_graph, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph, bool allow_unused) {
  std::vector<autograd::Edge> edges;
  autograd::GradList root_grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    TVC_CHECK(outputs[i].requires_grad(), "grad: output ", i, " does not require grad");
    edges.push_back(autograd::gradient_edge(outputs[i]));
    root_grads.push_back(autograd::default_root_grad(outputs[i], i < grad_outputs.size() ? grad_outputs[i] : Tensor()));
  }
  std::vector<Tensor> result(inputs.size());
  std::unordered_map<autograd::Node*, std::vector<std::pair<uint32_t, Tensor*>>> capture;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TVC_CHECK(inputs[i].requires_grad(), "grad: input ", i, " does not require grad");
    autograd::Edge e = autograd::gradient_edge(inputs[i]);
    capture[e.fn.get()].push_back({e.input_nr, &result[i]});
  }
  autograd::run_backward(edges, root_grads, retain_graph, &capture);
  for (size_t i = 0; i < inputs.size(); ++i)
    TVC_CHECK(allow_unused || result[i].defined(), "grad: input ", i,
              " was not used in the graph; pass allow_unused=true");
  return result;
}

// ---------------------------------------------------------------- Tensor autograd methods

Tensor& Tensor::requires_grad_(bool value) {
  TVC_CHECK(!value || is_floating(dtype()),
            "requires_grad_: only floating point tensors can "
            "require gradients, got ",
            dtype_name(dtype()));
  TVC_CHECK(value || is_leaf(),
            "requires_grad_: cannot turn off requires_grad of a non-leaf "
            "tensor; use detach()");
  impl_->requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const { return Tensor(checked().grad); }

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined())
    TVC_CHECK(g.shape() == shape(), "set_grad: gradient of shape ", g.shape(), " does not match the tensor's shape ",
              shape());
  checked().grad = g.impl_ptr();
}

void Tensor::retain_grad() const {
  TVC_CHECK(requires_grad(), "retain_grad: the tensor does not require grad");
  if (is_leaf() || retains_grad()) return;
  impl_->retains_grad = true;
  grad_fn()->retained.push_back({impl_->output_nr, impl_});
}

void Tensor::backward(const Tensor& g, bool retain_graph) const { tvc::backward({*this}, {g}, retain_graph); }

namespace {
std::atomic<int> g_next_hook_handle{1};
}

int Tensor::register_hook(TensorHook hook) const {
  TVC_CHECK(requires_grad(),
            "register_hook: cannot register a hook on a tensor that does not "
            "require grad");
  int handle = g_next_hook_handle.fetch_add(1);
  if (is_leaf())
    impl_->leaf_hooks.push_back({handle, std::move(hook)});
  else
    grad_fn()->tensor_pre_hooks.push_back({impl_->output_nr, handle, std::move(hook)});
  return handle;
}

void Tensor::remove_hook(int handle) const {
  auto& lh = impl_->leaf_hooks;
  lh.erase(std::remove_if(lh.begin(), lh.end(), [&](const auto& p) { return p.first == handle; }), lh.end());
  if (grad_fn()) {
    auto& th = grad_fn()->tensor_pre_hooks;
    th.erase(std::remove_if(th.begin(), th.end(), [&](const auto& h) { return h.handle == handle; }), th.end());
  }
}

std::vector<Tensor> record_function(const std::string& name, const std::vector<Tensor>& inputs,
                                    std::vector<Tensor> outputs, FunctionBackward backward) {
  TVC_CHECK(backward != nullptr, "record_function '", name, "': no backward function");
  autograd::record(name, inputs, outputs,
                   [name, backward = std::move(backward), n = inputs.size()](const autograd::GradList& grads) {
                     std::vector<Tensor> in = backward(grads);
                     TVC_CHECK(in.size() == n, "record_function '", name, "': backward gave ", in.size(),
                               " gradients for ", n, " inputs");
                     return in;
                   });
  return outputs;
}

}  // namespace tvc
