// nn::Module: registration, traversal, state dicts, conversions, hooks, printing and cloning.
#include "tvc/nn/module.h"

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <tuple>
#include <typeinfo>

#include "internal.h"
#include "tvc/autograd.h"
#include "tvc/internal/autograd.h"

namespace tvc::nn {

// ---------------------------------------------------------------- hooks storage

template <typename F>
struct HookEntry {
  int id;
  F fn;
  bool always_call = false;
};

struct HookStore {
  std::vector<HookEntry<ForwardPreHook>> forward_pre;
  std::vector<HookEntry<ForwardHook>> forward;
  std::vector<HookEntry<BackwardHook>> backward;
  std::vector<HookEntry<BackwardPreHook>> backward_pre;
  std::vector<HookEntry<StateDictPreHook>> state_dict_pre;
  std::vector<HookEntry<StateDictPostHook>> state_dict_post;
  std::vector<HookEntry<LoadStateDictPreHook>> load_pre;
  std::vector<HookEntry<LoadStateDictPostHook>> load_post;

  void remove(int id) {
    auto drop = [id](auto& v) {
      v.erase(std::remove_if(v.begin(), v.end(), [id](const auto& e) { return e.id == id; }), v.end());
    };
    drop(forward_pre), drop(forward), drop(backward), drop(backward_pre);
    drop(state_dict_pre), drop(state_dict_post), drop(load_pre), drop(load_post);
  }
};

void RemovableHandle::remove() {
  if (auto store = store_.lock()) store->remove(id_);
}

namespace {

template <typename F>
RemovableHandle add_hook(const std::shared_ptr<HookStore>& store, std::vector<HookEntry<F>>& list, F fn, bool prepend,
                         bool always_call = false) {
  static std::atomic<int> next_id{1};
  TVC_CHECK(fn != nullptr, "register hook: the hook is empty");
  HookEntry<F> e{next_id.fetch_add(1), std::move(fn), always_call};
  int id = e.id;
  if (prepend)
    list.insert(list.begin(), std::move(e));
  else
    list.push_back(std::move(e));
  return RemovableHandle(store, id);
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", \"" : "\"") + printable(keys[i]) + "\"";
  return s;
}

// Python's _addindent: indents every line but the first.
std::string add_indent(const std::string& s, int n) {
  std::string out, pad(static_cast<size_t>(n), ' ');
  for (char c : s) {
    out += c;
    if (c == '\n') out += pad;
  }
  return out;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (true) {
    size_t end = s.find('\n', start);
    lines.push_back(s.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return lines;
}

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace

// ---------------------------------------------------------------- python reprs

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string s(buf, res.ptr);  // shortest round-trip: "-1.2345e-05"
  std::string sign;
  if (s[0] == '-') sign = "-", s = s.substr(1);
  size_t epos = s.find('e');
  int exp = std::atoi(s.c_str() + epos + 1);
  std::string digits;
  for (size_t i = 0; i < epos; ++i)
    if (s[i] != '.') digits += s[i];
  std::string out;
  if (exp >= -4 && exp < 16) {  // Python's repr switches to exponent notation outside this
    if (exp >= 0) {
      std::string ip = digits.substr(0, std::min(digits.size(), static_cast<size_t>(exp + 1)));
      ip.resize(static_cast<size_t>(exp + 1), '0');
      std::string fp = digits.size() > static_cast<size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
      out = ip + "." + fp;
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  }
  return sign + out;
}

std::string py_repr(Scalar v) {
  if (v.kind() == Scalar::Kind::Float) return py_float_repr(v.to_double());
  return v.str();
}

// ---------------------------------------------------------------- construction

Module::Module() : hooks_(std::make_shared<HookStore>()) {}

Module::Module(const Module& other)
    : std::enable_shared_from_this<Module>(),
      parameters_(other.parameters_),
      buffers_(other.buffers_),
      non_persistent_buffers_(other.non_persistent_buffers_),
      children_(other.children_),
      training_(other.training_),
      hooks_(std::make_shared<HookStore>(*other.hooks_)) {}

std::string Module::type_name() const {
  const char* mangled = typeid(*this).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  name = name.substr(0, name.find('<'));
  size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

Tensor Module::forward(const Tensor&) {
  throw Error(cat_str("Module [", type_name(), "] is missing the required \"forward\" function"));
}

void Module::set_extra_state(const Tensor&) {
  throw Error(cat_str(type_name(),
                      ".set_extra_state: the module returns extra state from "
                      "get_extra_state() but does not override set_extra_state()"));
}

// ---------------------------------------------------------------- registration

void Module::check_new_name(const std::string& name, const char* what, const char* own_dict) const {
  TVC_CHECK(!name.empty(), type_name(), ": ", what, " name can't be empty string \"\"");
  TVC_CHECK(name.find('.') == std::string::npos, type_name(), ": ", what,
            " name can't contain \".\", got: ", printable(name));
  std::string own = own_dict;
  bool taken = (own != "parameter" && parameters_.contains(name)) || (own != "buffer" && buffers_.contains(name)) ||
               (own != "module" && children_.contains(name));
  TVC_CHECK(!taken, type_name(), ": attribute '", printable(name), "' already exists");
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_new_name(name, "parameter", "parameter");
  if (tensor.defined()) {
    TVC_CHECK(tensor.is_leaf(), type_name(), ": cannot assign non-leaf Tensor to parameter '", printable(name),
              "'; parameters must be leaves (detach() it or create it directly)");
    tensor.requires_grad_(requires_grad);
  }
  parameters_.insert(name, tensor);
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor, bool persistent) {
  check_new_name(name, "buffer", "buffer");
  buffers_.insert(name, tensor);
  if (persistent)
    non_persistent_buffers_.erase(name);
  else
    non_persistent_buffers_.insert(name);
  return tensor;
}

void Module::add_child(const std::string& name, ModulePtr module) {
  check_new_name(name, "module", "module");
  TVC_CHECK(module.get() != this, type_name(), ": cannot register a module as its own child '", printable(name), "'");
  children_.insert(name, std::move(module));
}

Module& Module::child(const std::string& name) const {
  const ModulePtr* c = children_.find(name);
  TVC_CHECK(c != nullptr, type_name(), " has no child module '", printable(name), "'");
  TVC_CHECK(*c != nullptr, type_name(), ": child module '", printable(name), "' is None");
  return **c;
}

Tensor Module::parameter(const std::string& name) const {
  const Tensor* t = parameters_.find(name);
  TVC_CHECK(t != nullptr, type_name(), " has no parameter '", printable(name), "'");
  return *t;
}

Tensor Module::buffer(const std::string& name) const {
  const Tensor* t = buffers_.find(name);
  TVC_CHECK(t != nullptr, type_name(), " has no buffer '", printable(name), "'");
  return *t;
}

// ---------------------------------------------------------------- traversal

namespace {
ModulePtr self_ptr(const Module* m) {
  ModulePtr p = const_cast<Module*>(m)->weak_from_this().lock();
  // A module not owned by a shared_ptr is listed through a non-owning pointer.
  return p ? p : ModulePtr(ModulePtr(), const_cast<Module*>(m));
}
}  // namespace

std::vector<std::pair<std::string, ModulePtr>> Module::named_modules(const std::string& prefix, bool remove_duplicate,
                                                                     std::unordered_set<const Module*>* memo) const {
  std::unordered_set<const Module*> local;
  if (!memo) memo = &local;
  std::vector<std::pair<std::string, ModulePtr>> out;
  if (memo->count(this)) return out;
  if (remove_duplicate) memo->insert(this);
  out.emplace_back(prefix, self_ptr(this));
  for (const auto& [name, c] : children_) {
    if (!c) continue;
    auto sub = c->named_modules(join_name(prefix, name), remove_duplicate, memo);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

namespace {
// PyTorch's _named_members over the parameter or buffer dict of each module.
std::vector<std::pair<std::string, Tensor>> named_members(
    const Module& root, const std::string& prefix, bool recurse, bool remove_duplicate,
    const std::function<std::vector<std::pair<std::string, Tensor>>(const Module&)>& members) {
  std::vector<std::pair<std::string, ModulePtr>> mods;
  if (recurse)
    mods = root.named_modules(prefix, remove_duplicate);
  else
    mods.emplace_back(prefix, self_ptr(&root));
  std::unordered_set<const TensorImpl*> seen;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [mprefix, m] : mods) {
    for (const auto& [name, t] : members(*m)) {
      if (!t.defined()) continue;
      if (remove_duplicate && !seen.insert(t.impl()).second) continue;
      out.emplace_back(join_name(mprefix, name), t);
    }
  }
  return out;
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(const std::string& prefix, bool recurse,
                                                                     bool remove_duplicate) const {
  return named_members(*this, prefix, recurse, remove_duplicate, [](const Module& m) {
    return std::vector<std::pair<std::string, Tensor>>(m.parameters_.begin(), m.parameters_.end());
  });
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(const std::string& prefix, bool recurse,
                                                                  bool remove_duplicate) const {
  return named_members(*this, prefix, recurse, remove_duplicate, [](const Module& m) {
    return std::vector<std::pair<std::string, Tensor>>(m.buffers_.begin(), m.buffers_.end());
  });
}

std::vector<std::pair<std::string, ModulePtr>> Module::named_children() const {
  std::unordered_set<const Module*> seen;
  std::vector<std::pair<std::string, ModulePtr>> out;
  for (const auto& [name, c] : children_)
    if (c && seen.insert(c.get()).second) out.emplace_back(name, c);
  return out;
}

TensorList Module::parameters(bool recurse) const {
  TensorList out;
  for (auto& [n, t] : named_parameters("", recurse)) out.push_back(t);
  return out;
}

TensorList Module::buffers(bool recurse) const {
  TensorList out;
  for (auto& [n, t] : named_buffers("", recurse)) out.push_back(t);
  return out;
}

std::vector<ModulePtr> Module::children() const {
  std::vector<ModulePtr> out;
  for (auto& [n, c] : named_children()) out.push_back(c);
  return out;
}

std::vector<ModulePtr> Module::modules() const {
  std::vector<ModulePtr> out;
  for (auto& [n, m] : named_modules()) out.push_back(m);
  return out;
}

// ---------------------------------------------------------------- dotted paths

ModulePtr Module::get_submodule(const std::string& target) const {
  ModulePtr mod = self_ptr(this);
  if (target.empty()) return mod;
  std::string path;
  size_t start = 0;
  while (true) {
    size_t end = target.find('.', start);
    std::string item = target.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const ModulePtr* c = mod->children_.find(item);
    std::string where = path.empty() ? "the root module" : "'" + printable(path) + "'";
    if (!c) {
      bool other = mod->parameters_.contains(item) || mod->buffers_.contains(item);
      TVC_CHECK(false, "get_submodule('", printable(target), "'): ", mod->type_name(), " at ", where,
                other ? " has '" : " has no attribute '", printable(item), other ? "' but it is not a module" : "'");
    }
    TVC_CHECK(*c != nullptr, "get_submodule('", printable(target), "'): '", printable(item), "' of ", mod->type_name(),
              " at ", where, " is None");
    mod = *c;
    path = join_name(path, item);
    if (end == std::string::npos) return mod;
    start = end + 1;
  }
}

void Module::set_submodule(const std::string& target, ModulePtr module, bool strict) {
  TVC_CHECK(!target.empty(), "set_submodule: cannot set the submodule without a target name");
  TVC_CHECK(module != nullptr, "set_submodule('", printable(target), "'): the module is null");
  size_t dot = target.rfind('.');
  ModulePtr parent = get_submodule(dot == std::string::npos ? "" : target.substr(0, dot));
  std::string name = dot == std::string::npos ? target : target.substr(dot + 1);
  TVC_CHECK(!strict || parent->children_.contains(name), "set_submodule('", printable(target),
            "'): ", parent->type_name(), " has no attribute '", printable(name), "' (strict)");
  TVC_CHECK(!parent->parameters_.contains(name) && !parent->buffers_.contains(name), "set_submodule('",
            printable(target), "'): '", printable(name), "' of ", parent->type_name(), " is not a module");
  parent->add_child(name, std::move(module));
}

namespace {
std::pair<ModulePtr, std::string> split_target(const Module& m, const std::string& target) {
  size_t dot = target.rfind('.');
  if (dot == std::string::npos) return {m.get_submodule(""), target};
  return {m.get_submodule(target.substr(0, dot)), target.substr(dot + 1)};
}
}  // namespace

Tensor Module::get_parameter(const std::string& target) const {
  auto [mod, name] = split_target(*this, target);
  TVC_CHECK(mod->has_parameter(name) || mod->has_buffer(name) || mod->has_child(name), "get_parameter('",
            printable(target), "'): ", mod->type_name(), " has no attribute '", printable(name), "'");
  TVC_CHECK(mod->has_parameter(name), "get_parameter('", printable(target), "'): '", printable(name), "' of ",
            mod->type_name(), " is not a parameter");
  Tensor t = mod->parameter(name);
  TVC_CHECK(t.defined(), "get_parameter('", printable(target), "'): parameter '", printable(name), "' of ",
            mod->type_name(), " is None");
  return t;
}

Tensor Module::get_buffer(const std::string& target) const {
  auto [mod, name] = split_target(*this, target);
  TVC_CHECK(mod->has_parameter(name) || mod->has_buffer(name) || mod->has_child(name), "get_buffer('",
            printable(target), "'): ", mod->type_name(), " has no attribute '", printable(name), "'");
  TVC_CHECK(mod->has_buffer(name), "get_buffer('", printable(target), "'): '", printable(name), "' of ",
            mod->type_name(), " is not a buffer");
  Tensor t = mod->buffer(name);
  TVC_CHECK(t.defined(), "get_buffer('", printable(target), "'): buffer '", printable(name), "' of ", mod->type_name(),
            " is None");
  return t;
}

// ---------------------------------------------------------------- state dict

void Module::save_to_state_dict(StateDict& destination, const std::string& prefix, bool keep_vars) const {
  for (const auto& [name, t] : parameters_)
    if (t.defined()) destination.insert(prefix + name, keep_vars ? t : t.detach());
  for (const auto& [name, t] : buffers_)
    if (t.defined() && !non_persistent_buffers_.count(name))
      destination.insert(prefix + name, keep_vars ? t : t.detach());
  Tensor extra = get_extra_state();
  if (extra.defined()) destination.insert(prefix + "_extra_state", extra);
}

void Module::state_dict(StateDict& destination, const std::string& prefix, bool keep_vars) const {
  Module& self = const_cast<Module&>(*this);  // hooks receive the module, as in PyTorch
  for (const auto& h : std::vector(hooks_->state_dict_pre)) h.fn(self, prefix, keep_vars);
  save_to_state_dict(destination, prefix, keep_vars);
  for (const auto& [name, c] : children_)
    if (c) c->state_dict(destination, prefix + name + ".", keep_vars);
  for (const auto& h : std::vector(hooks_->state_dict_post)) h.fn(self, destination, prefix);
}

StateDict Module::state_dict(const std::string& prefix, bool keep_vars) const {
  StateDict sd;
  state_dict(sd, prefix, keep_vars);
  return sd;
}

// Validates a whole load first (PyTorch's _load_from_state_dict walk, without writing), so
// that nothing is written when the load fails.
struct LoadPlan {
  StateDict sd;
  bool strict = true;
  std::vector<std::string> missing, unexpected, errors;
  struct Write {
    Module* module;
    bool is_param;
    std::string name;
    Tensor src;
  };
  std::vector<Write> writes;
  std::vector<std::pair<Module*, Tensor>> extra_states;
  std::vector<Module*> post_order;

  void visit(Module& m, const std::string& prefix) {
    for (const auto& h : std::vector(m.hooks_->load_pre)) h.fn(m, sd, prefix, strict, missing, unexpected, errors);
    std::vector<std::tuple<std::string, Tensor, bool>> local;
    for (const auto& [name, t] : m.parameters_)
      if (t.defined()) local.emplace_back(name, t, true);
    for (const auto& [name, t] : m.buffers_)
      if (t.defined() && !m.non_persistent_buffers_.count(name)) local.emplace_back(name, t, false);
    std::unordered_set<std::string> local_names;
    for (const auto& [name, t, is_param] : local) {
      local_names.insert(name);
      std::string key = prefix + name;
      const Tensor* src = sd.find(key);
      if (!src) {
        missing.push_back(key);
      } else if (!src->defined()) {
        errors.push_back(cat_str("While copying the parameter named \"", printable(key),
                                 "\": the value in state_dict is an undefined tensor."));
      } else if (src->shape() != t.shape()) {
        errors.push_back(cat_str("size mismatch for ", printable(key), ": copying a param with shape ", src->shape(),
                                 " from checkpoint, the shape in current model is ", t.shape(), "."));
      } else {
        writes.push_back({&m, is_param, name, *src});
      }
    }
    std::string extra_key = prefix + "_extra_state";
    if (m.get_extra_state().defined()) {
      if (const Tensor* src = sd.find(extra_key))
        extra_states.emplace_back(&m, *src);
      else
        missing.push_back(extra_key);
    } else if (sd.contains(extra_key)) {
      unexpected.push_back(extra_key);
    }
    for (const auto& [key, v] : sd) {
      if (key.compare(0, prefix.size(), prefix) != 0 || key == extra_key) continue;
      std::string rest = key.substr(prefix.size());
      std::string input_name = rest.substr(0, rest.find('.'));
      if (!m.children_.contains(input_name) && !local_names.count(input_name)) unexpected.push_back(key);
    }
    for (const auto& [name, c] : m.children_)
      if (c) visit(*c, prefix + name + ".");
    post_order.push_back(&m);
  }

  void raise_if_failed(const Module& root, const IncompatibleKeys& keys) const {
    std::vector<std::string> msgs;
    if (strict && !keys.missing_keys.empty())
      msgs.push_back("Missing key(s) in state_dict: " + join_keys(keys.missing_keys) + ". ");
    if (strict && !keys.unexpected_keys.empty())
      msgs.push_back("Unexpected key(s) in state_dict: " + join_keys(keys.unexpected_keys) + ". ");
    msgs.insert(msgs.end(), errors.begin(), errors.end());
    if (msgs.empty()) return;
    std::string text = "Error(s) in loading state_dict for " + root.type_name() + ":";
    for (const auto& m : msgs) text += "\n\t" + m;
    throw Error(text);
  }
};

IncompatibleKeys Module::load_state_dict(const StateDict& state_dict, bool strict, bool assign) {
  LoadPlan plan;
  plan.sd = state_dict;
  plan.strict = strict;
  plan.visit(*this, "");
  IncompatibleKeys keys{plan.missing, plan.unexpected};
  bool post_hooks = std::any_of(plan.post_order.begin(), plan.post_order.end(),
                                [](Module* m) { return !m->hooks_->load_post.empty(); });
  if (!plan.errors.empty() || !post_hooks) plan.raise_if_failed(*this, keys);
  {
    NoGradGuard no_grad;
    for (auto& w : plan.writes) {
      OrderedDict<Tensor>& dict = w.is_param ? w.module->parameters_ : w.module->buffers_;
      Tensor& dst = dict.at(w.name);
      if (!assign) {
        dst.copy_(w.src);
      } else if (w.is_param) {
        // A new leaf sharing the dict tensor's storage, with the module's requires_grad.
        Tensor p = w.src.detach();
        if (dst.requires_grad()) p.requires_grad_(true);
        dst = p;
      } else {
        dst = w.src;
      }
    }
  }
  for (auto& [m, state] : plan.extra_states) m->set_extra_state(state);
  for (Module* m : plan.post_order)
    for (const auto& h : std::vector(m->hooks_->load_post)) h.fn(*m, keys);
  if (post_hooks) plan.raise_if_failed(*this, keys);
  return keys;
}

// ---------------------------------------------------------------- modes

Module& Module::train(bool mode) {
  training_ = mode;
  for (auto& c : children()) c->train(mode);
  return *this;
}

Module& Module::requires_grad_(bool requires_grad) {
  for (Tensor p : parameters()) p.requires_grad_(requires_grad);
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
      continue;
    }
    if (g.grad_fn())
      g.detach_();
    else
      g.requires_grad_(false);
    g.zero_();
  }
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& c : children()) c->apply(fn);
  fn(*this);
  return *this;
}

// ---------------------------------------------------------------- conversions

void Module::apply_to_tensors(const std::function<Tensor(const Tensor&)>& fn,
                              const std::function<bool(const Tensor&)>& select, bool with_grads, bool recurse) {
  if (recurse)
    for (auto& c : children()) c->apply_to_tensors(fn, select, with_grads, recurse);
  auto convert = [&](const Tensor& t) {
    if (!t.defined() || !select(t)) return;
    Tensor n;
    {
      NoGradGuard no_grad;
      n = fn(t);
    }
    if (n.is_same(t)) return;
    // The handle keeps its TensorImpl (and so its identity for optimizers and hooks).
    TensorImpl& impl = *t.impl();
    impl.storage = n.storage();
    impl.shape = n.shape();
    impl.strides = n.strides();
    impl.offset = n.storage_offset();
    impl.dtype = n.dtype();
    impl.grad_accumulator.reset();
  };
  for (const auto& [name, p] : parameters_) {
    convert(p);
    if (with_grads && p.defined() && p.grad().defined()) convert(p.grad());
  }
  for (const auto& [name, b] : buffers_) convert(b);
}

namespace {
bool floating(const Tensor& t) { return is_floating(t.dtype()); }
bool any_tensor(const Tensor&) { return true; }
void check_floating_target(DType dtype) {
  TVC_CHECK(is_floating(dtype),
            "Module.to only accepts floating point dtypes, but got desired dtype=", dtype_name(dtype));
}
}  // namespace

Module& Module::to(DType dtype) {
  check_floating_target(dtype);
  apply_to_tensors([dtype](const Tensor& t) { return t.to(dtype); }, floating, true, true);
  return *this;
}

Module& Module::to(Device device) {
  apply_to_tensors([device](const Tensor& t) { return t.to(device); }, any_tensor, true, true);
  return *this;
}

Module& Module::to(Device device, DType dtype) {
  check_floating_target(dtype);
  to(device);
  return to(dtype);
}

Module& Module::to(const Tensor& other) { return to(other.device(), other.dtype()); }

Module& Module::to(MemoryFormat format) {
  TVC_CHECK(format != MemoryFormat::Preserve, "Module.to: memory format must be Contiguous or ChannelsLast");
  apply_to_tensors([format](const Tensor& t) { return t.contiguous(format); },
                   [](const Tensor& t) { return t.dim() == 4; }, true, true);
  return *this;
}

Module& Module::to_empty(Device device, bool recurse) {
  apply_to_tensors([device](const Tensor& t) { return empty(t.shape(), {.dtype = t.dtype(), .device = device}); },
                   any_tensor, true, recurse);
  return *this;
}

Module& Module::type(DType dtype) {
  apply_to_tensors([dtype](const Tensor& t) { return t.to(dtype); }, any_tensor, true, true);
  return *this;
}

Module& Module::convert_tensors(const std::function<Tensor(const Tensor&)>& fn) {
  apply_to_tensors(fn, any_tensor, true, true);
  return *this;
}

// ---------------------------------------------------------------- hooks

RemovableHandle Module::register_forward_pre_hook(ForwardPreHook hook, bool prepend) {
  return add_hook(hooks_, hooks_->forward_pre, std::move(hook), prepend);
}
RemovableHandle Module::register_forward_hook(ForwardHook hook, bool prepend, bool always_call) {
  return add_hook(hooks_, hooks_->forward, std::move(hook), prepend, always_call);
}
RemovableHandle Module::register_full_backward_hook(BackwardHook hook, bool prepend) {
  return add_hook(hooks_, hooks_->backward, std::move(hook), prepend);
}
RemovableHandle Module::register_full_backward_pre_hook(BackwardPreHook hook, bool prepend) {
  return add_hook(hooks_, hooks_->backward_pre, std::move(hook), prepend);
}
RemovableHandle Module::register_state_dict_pre_hook(StateDictPreHook hook) {
  return add_hook(hooks_, hooks_->state_dict_pre, std::move(hook), false);
}
RemovableHandle Module::register_state_dict_post_hook(StateDictPostHook hook) {
  return add_hook(hooks_, hooks_->state_dict_post, std::move(hook), false);
}
RemovableHandle Module::register_load_state_dict_pre_hook(LoadStateDictPreHook hook) {
  return add_hook(hooks_, hooks_->load_pre, std::move(hook), false);
}
RemovableHandle Module::register_load_state_dict_post_hook(LoadStateDictPostHook hook) {
  return add_hook(hooks_, hooks_->load_post, std::move(hook), false);
}

// ---------------------------------------------------------------- calling

namespace {

// One module call's backward-hook state, shared by the identity nodes wrapped around the
// call's inputs and outputs (PyTorch's torch.utils.hooks.BackwardHook).
struct BackwardHookState {
  std::weak_ptr<Module> module;
  std::vector<BackwardHook> hooks;
  std::vector<BackwardPreHook> pre_hooks;
  size_t n_args = 0;
  bool input_requires_grad = false;
  TensorList grad_outputs;
};

// Indices of the tensors that carry gradient.
std::vector<size_t> grad_indices(const TensorList& ts) {
  std::vector<size_t> idx;
  if (!is_grad_enabled()) return idx;
  for (size_t i = 0; i < ts.size(); ++i)
    if (ts[i].defined() && ts[i].requires_grad()) idx.push_back(i);
  return idx;
}

// Replaces ts[idx] by aliases produced by one identity node; returns the node.
std::shared_ptr<autograd::Node> wrap_identity(TensorList& ts, const std::vector<size_t>& idx) {
  TensorList ins, outs;
  for (size_t i : idx) ins.push_back(ts[i]), outs.push_back(ts[i].detach());
  auto node =
      autograd::record("BackwardHookFunctionBackward", ins, outs, [](const autograd::GradList& g) { return g; });
  for (size_t k = 0; k < idx.size(); ++k) ts[idx[k]] = outs[k];
  return node;
}

TensorList scatter(const autograd::GradList& part, const std::vector<size_t>& idx, size_t n) {
  TensorList full(n);
  for (size_t k = 0; k < idx.size(); ++k) full[idx[k]] = part[k];
  return full;
}

autograd::GradList gather(const TensorList& full, const std::vector<size_t>& idx) {
  autograd::GradList part;
  for (size_t i : idx) part.push_back(full[i]);
  return part;
}

void wrap_inputs(TensorList& args, const std::shared_ptr<BackwardHookState>& state) {
  state->n_args = args.size();
  std::vector<size_t> idx = grad_indices(args);
  state->input_requires_grad = !idx.empty();
  if (idx.empty() || state->hooks.empty()) return;
  auto node = wrap_identity(args, idx);
  node->post_hooks.push_back(
      [state, idx](const autograd::GradList& grad_inputs, const autograd::GradList&) -> autograd::GradList {
        ModulePtr m = state->module.lock();
        if (!m) return grad_inputs;
        TensorList full = scatter(grad_inputs, idx, state->n_args);
        for (const auto& hook : state->hooks) {
          if (auto r = hook(*m, full, state->grad_outputs)) {
            TVC_CHECK(r->size() == state->n_args, m->type_name(), ": backward hook returned ", r->size(),
                      " gradients for ", state->n_args, " inputs");
            full = *r;
          }
        }
        return gather(full, idx);
      });
}

void wrap_outputs(TensorList& out, const std::shared_ptr<BackwardHookState>& state) {
  std::vector<size_t> idx = grad_indices(out);
  if (idx.empty()) return;  // no output needs a gradient: the hooks never fire
  size_t n_out = out.size();
  auto node = wrap_identity(out, idx);
  node->pre_hooks.push_back([state, idx, n_out](const autograd::GradList& grads) -> autograd::GradList {
    ModulePtr m = state->module.lock();
    if (!m) return grads;
    TensorList full = scatter(grads, idx, n_out);
    for (const auto& hook : state->pre_hooks) {
      if (auto r = hook(*m, full)) {
        TVC_CHECK(r->size() == n_out, m->type_name(), ": backward pre-hook returned ", r->size(), " gradients for ",
                  n_out, " outputs");
        full = *r;
      }
    }
    state->grad_outputs = full;
    if (!state->input_requires_grad) {
      // No input needs a gradient: the hooks fire here, with grad_input all None.
      TensorList none(state->n_args);
      for (const auto& hook : state->hooks) {
        auto r = hook(*m, none, full);
        TVC_CHECK(!r || std::none_of(r->begin(), r->end(), [](const Tensor& t) { return t.defined(); }), m->type_name(),
                  ": a backward hook of a module whose inputs need no gradient must "
                  "return nothing or only undefined gradients");
      }
    }
    return gather(full, idx);
  });
}

}  // namespace

bool Module::has_call_hooks() const {
  const HookStore& h = *hooks_;
  return !h.forward_pre.empty() || !h.forward.empty() || !h.backward.empty() || !h.backward_pre.empty();
}

TensorList Module::call(const TensorList& args_in, const std::function<TensorList(const TensorList&)>& forward_fn) {
  detail::ProfiledModule profiled(this);
  if (!has_call_hooks()) return forward_fn(args_in);
  const HookStore& h = *hooks_;
  // Copies: hooks may add or remove hooks while they run.
  auto pre_hooks = h.forward_pre;
  auto fwd_hooks = h.forward;
  TensorList args = args_in;
  for (const auto& e : pre_hooks)
    if (auto r = e.fn(*this, args)) args = *r;
  std::shared_ptr<BackwardHookState> bw;
  if (!h.backward.empty() || !h.backward_pre.empty()) {
    bw = std::make_shared<BackwardHookState>();
    bw->module = weak_from_this();
    TVC_CHECK(!bw->module.expired(), type_name(),
              ": backward hooks need the module to be owned by a "
              "std::shared_ptr");
    for (const auto& e : h.backward) bw->hooks.push_back(e.fn);
    for (const auto& e : h.backward_pre) bw->pre_hooks.push_back(e.fn);
    wrap_inputs(args, bw);
  }
  TensorList out;
  std::unordered_set<int> called;
  try {
    out = forward_fn(args);
    for (const auto& e : fwd_hooks) {
      called.insert(e.id);
      if (auto r = e.fn(*this, args, out)) out = *r;
    }
  } catch (...) {
    for (const auto& e : fwd_hooks) {
      if (!e.always_call || called.count(e.id)) continue;
      try {
        e.fn(*this, args, {});
      } catch (...) {
        // As PyTorch, a failing always_call hook does not hide the original error.
      }
    }
    throw;
  }
  if (bw) wrap_outputs(out, bw);
  return out;
}

Tensor Module::operator()(const Tensor& x) {
  TensorList out = call({x}, [this](const TensorList& args) {
    TVC_CHECK(args.size() == 1, type_name(), ": forward takes 1 tensor, a pre-hook gave ", args.size());
    return TensorList{forward(args[0])};
  });
  TVC_CHECK(out.size() == 1, type_name(), ": a forward hook returned ", out.size(), " outputs where 1 is expected");
  return out[0];
}

// ---------------------------------------------------------------- printing

std::string Module::repr() const {
  std::vector<std::string> lines;
  std::string extra = extra_repr();
  if (!extra.empty()) lines = split_lines(extra);
  size_t n_extra = lines.size();
  for (const auto& [name, c] : children_) lines.push_back("(" + name + "): " + add_indent(c ? c->repr() : "None", 2));
  std::string s = type_name() + "(";
  if (!lines.empty()) {
    if (n_extra == 1 && lines.size() == 1) {
      s += lines[0];
    } else {
      s += "\n  ";
      for (size_t i = 0; i < lines.size(); ++i) s += (i ? "\n  " : "") + lines[i];
      s += "\n";
    }
  }
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const Module& module) { return os << module.repr(); }

// ---------------------------------------------------------------- cloning

ModulePtr Module::make_copy() const {
  TVC_CHECK(typeid(*this) == typeid(Module), "clone: ", type_name(), " must derive from nn::Cloneable<", type_name(),
            "> to be cloned");
  return ModulePtr(new Module(*this));
}

namespace {

Tensor clone_tensor(const Tensor& t, std::unordered_map<const TensorImpl*, Tensor>& memo) {
  auto it = memo.find(t.impl());
  if (it != memo.end()) return it->second;
  Tensor c;
  {
    NoGradGuard no_grad;
    c = t.clone();
  }
  if (t.requires_grad()) c.requires_grad_(true);
  memo.emplace(t.impl(), c);
  return c;
}

}  // namespace

ModulePtr Module::clone() const {
  std::unordered_map<const Module*, ModulePtr> modules;
  std::unordered_map<const TensorImpl*, Tensor> tensors;
  std::function<ModulePtr(const Module&)> deep = [&](const Module& m) -> ModulePtr {
    ModulePtr copy = m.make_copy();
    modules.emplace(&m, copy);
    for (auto& [name, t] : copy->parameters_)
      if (t.defined()) t = clone_tensor(t, tensors);
    for (auto& [name, t] : copy->buffers_)
      if (t.defined()) t = clone_tensor(t, tensors);
    for (auto& [name, c] : copy->children_) {
      if (!c) continue;
      auto it = modules.find(c.get());
      c = it != modules.end() ? it->second : deep(*c);
    }
    return copy;
  };
  return deep(*this);
}

}  // namespace tvc::nn
