// tvc::nn::Module: the base of every layer and model, with torch.nn.Module's API.
//
// A module owns, in registration order:
//   - parameters: leaf tensors (requires_grad by default) reached by name ("weight", "bias");
//     an undefined tensor registered as a parameter stands for Python's None;
//   - buffers: tensors that are state but not parameters (BatchNorm's running_mean); a buffer is
//     persistent (saved in state_dict) unless registered with persistent = false;
//   - children: submodules, held by std::shared_ptr (a child may be shared by several parents,
//     or be null = None).
// Names join with "." into PyTorch's state_dict keys ("layer1.0.conv1.weight").
//
// The registries are the single source of truth, as Python's _parameters/_buffers/_modules:
// forward() must reach children and tensors through them (child("conv1"), parameter("weight")),
// never through cached member pointers, so that set_submodule, load_state_dict(assign) and
// clone() act on what forward uses. Modules are used through std::shared_ptr (make_shared).
//
// Calling a module, module(x), runs forward pre-hooks, forward(x) and forward hooks, and wires
// backward hooks into the autograd graph (see call()).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tvc/tensor.h"

namespace tvc::nn {

class Module;
using ModulePtr = std::shared_ptr<Module>;
using TensorList = std::vector<Tensor>;

// A map that keeps insertion order (Python's dict / OrderedDict). Inserting an existing key
// replaces its value in place.
template <typename V>
class OrderedDict {
 public:
  using Item = std::pair<std::string, V>;

  // Inserts or replaces key; returns the stored value.
  V& insert(const std::string& key, V value) {
    auto it = index_.find(key);
    if (it != index_.end()) return items_[it->second].second = std::move(value);
    index_.emplace(key, items_.size());
    items_.emplace_back(key, std::move(value));
    return items_.back().second;
  }
  V* find(const std::string& key) {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  const V* find(const std::string& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  bool contains(const std::string& key) const { return index_.count(key) != 0; }
  // The value of key; throws tvc::Error naming the key when absent.
  const V& at(const std::string& key) const {
    const V* v = find(key);
    TVC_CHECK(v != nullptr, "OrderedDict: no key '", key, "'");
    return *v;
  }
  V& at(const std::string& key) { return const_cast<V&>(std::as_const(*this).at(key)); }
  // Removes key; returns whether it was present.
  bool erase(const std::string& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    size_t pos = it->second;
    index_.erase(it);
    items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(pos));
    for (size_t i = pos; i < items_.size(); ++i) index_[items_[i].first] = i;
    return true;
  }
  void clear() { items_.clear(), index_.clear(); }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  std::vector<std::string> keys() const {
    std::vector<std::string> k;
    for (const Item& it : items_) k.push_back(it.first);
    return k;
  }
  const Item& item(size_t i) const { return items_.at(i); }
  Item& item(size_t i) { return items_.at(i); }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;
};

// Parameters and persistent buffers by dotted name, in PyTorch's order.
using StateDict = OrderedDict<Tensor>;

// What load_state_dict found: keys the module expects but the dict lacks, and keys the dict
// has that the module does not expect.
struct IncompatibleKeys {
  std::vector<std::string> missing_keys{};
  std::vector<std::string> unexpected_keys{};
};

// Hooks. A hook returning std::nullopt leaves things as they are; a returned list replaces
// the inputs (pre-hook), the output (forward hook), grad_output (backward pre-hook) or
// grad_input (backward hook). Entries of grad lists are undefined where PyTorch gives None.
using ForwardPreHook = std::function<std::optional<TensorList>(Module& module, const TensorList& args)>;
using ForwardHook =
    std::function<std::optional<TensorList>(Module& module, const TensorList& args, const TensorList& output)>;
using BackwardHook = std::function<std::optional<TensorList>(Module& module, const TensorList& grad_input,
                                                             const TensorList& grad_output)>;
using BackwardPreHook = std::function<std::optional<TensorList>(Module& module, const TensorList& grad_output)>;
using StateDictPreHook = std::function<void(Module& module, const std::string& prefix, bool keep_vars)>;
// May modify state_dict in place.
using StateDictPostHook = std::function<void(Module& module, StateDict& state_dict, const std::string& prefix)>;
// Runs before the module's keys are checked; may modify state_dict (rename keys, convert
// values) and add to missing_keys, unexpected_keys or error_msgs (an error message fails the load).
using LoadStateDictPreHook =
    std::function<void(Module& module, StateDict& state_dict, const std::string& prefix, bool strict,
                       std::vector<std::string>& missing_keys, std::vector<std::string>& unexpected_keys,
                       std::vector<std::string>& error_msgs)>;
// May edit incompatible_keys; a strict load checks the edited keys.
using LoadStateDictPostHook = std::function<void(Module& module, IncompatibleKeys& incompatible_keys)>;

struct HookStore;

// Returned by every register_*_hook; remove() unregisters the hook (torch.utils.hooks.RemovableHandle).
class RemovableHandle {
 public:
  RemovableHandle() = default;
  RemovableHandle(std::weak_ptr<HookStore> store, int id) : store_(std::move(store)), id_(id) {}
  void remove();
  int id() const { return id_; }

 private:
  std::weak_ptr<HookStore> store_;
  int id_ = 0;
};

// Hooks registered for the length of a scope: every handle added is removed when this is
// destroyed, however the scope ends.
class ScopedHooks {
 public:
  ScopedHooks() = default;
  ScopedHooks(const ScopedHooks&) = delete;
  ScopedHooks& operator=(const ScopedHooks&) = delete;
  ~ScopedHooks() {
    for (RemovableHandle& h : handles_) h.remove();
  }
  void add(RemovableHandle handle) { handles_.push_back(std::move(handle)); }

 private:
  std::vector<RemovableHandle> handles_;
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  Module();
  virtual ~Module() = default;
  Module& operator=(const Module&) = delete;

  // ---- the forward pass ----
  // The computation; modules taking one tensor override this. The base raises.
  virtual Tensor forward(const Tensor& x);
  // forward(x) with hooks (torch's module(x)).
  Tensor operator()(const Tensor& x);
  // Runs forward_fn on args with this module's hooks: forward pre-hooks (may replace args),
  // backward-hook wiring of the inputs, forward_fn, forward hooks (may replace the output),
  // backward-hook wiring of the outputs. Modules with several inputs or outputs call this from
  // their own call operators.
  TensorList call(const TensorList& args, const std::function<TensorList(const TensorList&)>& forward_fn);
  // Whether calling this module runs hooks: forward pre-hooks, forward hooks or backward hooks.
  bool has_call_hooks() const;

  // ---- registration ----
  // Registers (or replaces, keeping its position) a parameter. tensor must be a leaf; it is set
  // to require grad unless requires_grad is false. An undefined tensor registers None.
  Tensor register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  // Registers (or replaces) a buffer; persistent buffers are part of state_dict.
  Tensor register_buffer(const std::string& name, Tensor tensor, bool persistent = true);
  // Registers (or replaces, keeping its position) a child; module may be null (None).
  template <typename T>
  std::shared_ptr<T> register_module(const std::string& name, std::shared_ptr<T> module) {
    add_child(name, module);
    return module;
  }
  template <typename T>
  std::shared_ptr<T> add_module(const std::string& name, std::shared_ptr<T> module) {
    return register_module(name, std::move(module));
  }

  // ---- direct lookup (one level, for forward()) ----
  // The child registered as name; throws when absent or None.
  Module& child(const std::string& name) const;
  // The child as type T; throws when absent, None or of another type.
  template <typename T>
  T& child_as(const std::string& name) const {
    T* t = dynamic_cast<T*>(&child(name));
    TVC_CHECK(t != nullptr, type_name(), ": child '", name, "' is a ", child(name).type_name(),
              ", not the expected type");
    return *t;
  }
  // The parameter / buffer registered as name (undefined when registered None); throws when
  // name is not registered.
  Tensor parameter(const std::string& name) const;
  Tensor buffer(const std::string& name) const;
  bool has_parameter(const std::string& name) const { return parameters_.contains(name); }
  bool has_buffer(const std::string& name) const { return buffers_.contains(name); }
  bool has_child(const std::string& name) const { return children_.contains(name); }

  // ---- iteration (torch names; vectors instead of iterators) ----
  // With remove_duplicate a tensor or module reached twice is listed once (the first name).
  std::vector<std::pair<std::string, Tensor>> named_parameters(const std::string& prefix = "", bool recurse = true,
                                                               bool remove_duplicate = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(const std::string& prefix = "", bool recurse = true,
                                                            bool remove_duplicate = true) const;
  // Direct children that are not None, each once.
  std::vector<std::pair<std::string, ModulePtr>> named_children() const;
  // This module (named prefix) and all descendants, pre-order. memo, when given, holds modules
  // already listed (and receives the new ones), as PyTorch's memo argument.
  std::vector<std::pair<std::string, ModulePtr>> named_modules(const std::string& prefix = "",
                                                               bool remove_duplicate = true,
                                                               std::unordered_set<const Module*>* memo = nullptr) const;
  TensorList parameters(bool recurse = true) const;
  TensorList buffers(bool recurse = true) const;
  std::vector<ModulePtr> children() const;
  std::vector<ModulePtr> modules() const;

  // ---- dotted paths ----
  // target "a.b.c"; "" is this module. Errors name the path and the missing part.
  ModulePtr get_submodule(const std::string& target) const;
  // Replaces (or, unless strict, adds) the submodule at target; its parent must exist.
  void set_submodule(const std::string& target, ModulePtr module, bool strict = false);
  Tensor get_parameter(const std::string& target) const;
  Tensor get_buffer(const std::string& target) const;

  // ---- state ----
  // Parameters then persistent buffers of each module, then its children, keys prefixed with
  // prefix. Values are detached aliases of the module's tensors unless keep_vars.
  StateDict state_dict(const std::string& prefix = "", bool keep_vars = false) const;
  // As above, adding into destination (PyTorch's destination argument).
  void state_dict(StateDict& destination, const std::string& prefix = "", bool keep_vars = false) const;
  // Copies values from state_dict (PyTorch's rules and messages). Everything is validated
  // before anything is written: a shape mismatch, or with strict a missing or unexpected key,
  // raises tvc::Error naming the keys (and shapes) and leaves the module untouched. Values are
  // copied under NoGradGuard, converting dtype; with assign the module's tensors are replaced
  // by the dict's (parameters keep the module's requires_grad). Load post-hooks run after the
  // copy; when any is registered in the tree, strict key errors are raised after it (the hooks
  // may clear them), as in PyTorch.
  IncompatibleKeys load_state_dict(const StateDict& state_dict, bool strict = true, bool assign = false);
  // The same from a weight file of any format (safetensors, .pth zip or legacy), converting
  // tensors to the module's dtypes (a float16 file into a float32 model). tvc::io::load_into
  // (tvc/serialize.h) also unwraps training checkpoints.
  IncompatibleKeys load_state_dict(const std::string& path, bool strict = true, bool assign = false);
  // Extra state saved under "<prefix>_extra_state". tvc's extra state is a Tensor: a module
  // that has some overrides both; an undefined result means "no extra state" (the default).
  virtual Tensor get_extra_state() const { return Tensor(); }
  virtual void set_extra_state(const Tensor& state);

  // ---- modes and conversions (return *this for chaining) ----
  virtual Module& train(bool mode = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }
  // Sets requires_grad of every parameter.
  Module& requires_grad_(bool requires_grad = true);
  // Drops (set_to_none) or zeroes the gradients of every parameter.
  void zero_grad(bool set_to_none = true);
  // fn on every submodule (children first), then on this module.
  Module& apply(const std::function<void(Module&)>& fn);

  // Casts floating parameters and buffers (and their grads) to dtype IN PLACE: every tensor
  // handle keeps its identity (its TensorImpl gets new storage and dtype), as PyTorch's
  // param.data = ... does, so optimizers keep working.
  Module& to(DType dtype);
  // Moves to device (CPU only in this build: CUDA raises as Tensor::to does).
  Module& to(Device device);
  Module& to(Device device, DType dtype);
  // Device and dtype of other (which must be floating).
  Module& to(const Tensor& other);
  // Lays 4-d parameters and buffers out in format (ChannelsLast or Contiguous).
  Module& to(MemoryFormat format);
  // Replaces every parameter and buffer by an uninitialised tensor on device (same shapes).
  Module& to_empty(Device device, bool recurse = true);
  Module& cpu() { return to(Device::CPU); }
  Module& float_() { return to(DType::Float32); }
  Module& double_() { return to(DType::Float64); }
  Module& half() { return to(DType::Float16); }
  Module& bfloat16() { return to(DType::BFloat16); }
  // Casts ALL parameters and buffers (integer ones too) to dtype.
  Module& type(DType dtype);
  // Replaces every parameter and buffer t (and its grad) by fn(t) IN PLACE, keeping each handle's
  // identity, as the conversions above do (PyTorch's _apply); fn returns t itself to leave it.
  Module& convert_tensors(const std::function<Tensor(const Tensor&)>& fn);

  // ---- hooks ----
  RemovableHandle register_forward_pre_hook(ForwardPreHook hook, bool prepend = false);
  // always_call: also run when forward (or an earlier hook) throws; output is then empty.
  RemovableHandle register_forward_hook(ForwardHook hook, bool prepend = false, bool always_call = false);
  // Full backward hooks (see call()). The module must be owned by a std::shared_ptr.
  RemovableHandle register_full_backward_hook(BackwardHook hook, bool prepend = false);
  RemovableHandle register_full_backward_pre_hook(BackwardPreHook hook, bool prepend = false);
  // PyTorch's deprecated register_backward_hook; tvc gives it the full hook's behaviour.
  RemovableHandle register_backward_hook(BackwardHook hook) { return register_full_backward_hook(std::move(hook)); }
  RemovableHandle register_state_dict_pre_hook(StateDictPreHook hook);
  RemovableHandle register_state_dict_post_hook(StateDictPostHook hook);
  RemovableHandle register_load_state_dict_pre_hook(LoadStateDictPreHook hook);
  RemovableHandle register_load_state_dict_post_hook(LoadStateDictPostHook hook);

  // ---- printing ----
  // The class name shown by repr (the C++ class name without namespaces by default).
  virtual std::string type_name() const;
  // Constructor arguments shown inside the parentheses; may span several lines.
  virtual std::string extra_repr() const { return ""; }
  // PyTorch's repr: "Name(extra)" or the nested "(name): Child(...)" tree.
  std::string repr() const;

  // ---- copying ----
  // A deep copy: a new module tree with copies of every parameter and buffer (requires_grad
  // kept, gradients not copied) and the hooks; modules and tensors shared within the tree stay
  // shared in the copy. Classes support it by deriving from Cloneable<Self>.
  ModulePtr clone() const;
  // A shallow copy of this object (same tensors and children); used by clone().
  virtual ModulePtr make_copy() const;

 protected:
  Module(const Module& other);
  // Registers a child (null = None); checks the name as PyTorch does.
  void add_child(const std::string& name, ModulePtr module);

  OrderedDict<Tensor> parameters_;
  OrderedDict<Tensor> buffers_;
  std::set<std::string> non_persistent_buffers_;
  OrderedDict<ModulePtr> children_;
  bool training_ = true;

 private:
  friend struct LoadPlan;
  void check_new_name(const std::string& name, const char* what, const char* own_dict) const;
  // Replaces every tensor t of the tree (parameters, buffers, their grads) selected by
  // select(t, is_param) by fn(t), keeping each handle's identity.
  void apply_to_tensors(const std::function<Tensor(const Tensor&)>& fn,
                        const std::function<bool(const Tensor&)>& select, bool with_grads, bool recurse);
  void save_to_state_dict(StateDict& destination, const std::string& prefix, bool keep_vars) const;
  std::shared_ptr<HookStore> hooks_;
};

std::ostream& operator<<(std::ostream& os, const Module& module);

// Base for classes that support clone(): make_copy() copy-constructs a Derived. A class that
// derives from a Cloneable class must itself derive from Cloneable (checked at clone time).
template <typename Derived, typename Base = Module>
class Cloneable : public Base {
 public:
  using Base::Base;
  ModulePtr make_copy() const override {
    TVC_CHECK(typeid(*this) == typeid(Derived), "clone: ", this->type_name(), " must derive from nn::Cloneable<",
              this->type_name(), ", ...> to be cloned");
    return std::make_shared<Derived>(static_cast<const Derived&>(*this));
  }
};

// Python's float repr (shortest round-trip, "1e-05", "0.1", "3.0"), used by extra_repr.
std::string py_float_repr(double v);
// A Scalar as Python prints it: ints without a point, floats as py_float_repr.
std::string py_repr(Scalar v);

}  // namespace tvc::nn
