// Sequential, ModuleList and ModuleDict.
#include "tvc/nn/containers.h"

#include "tvc/nn/layers.h"

namespace tvc::nn {

size_t detail::wrap_index(int64_t index, size_t size, bool allow_end, const Module& owner, const char* op) {
  int64_t n = static_cast<int64_t>(size);
  int64_t hi = allow_end ? n : n - 1;
  TVC_CHECK(index >= -n && index <= hi, owner.type_name(), op, ": index ", index, " is out of range for ", n,
            " modules");
  return static_cast<size_t>(index < 0 ? index + n : index);
}

Sequential::Sequential(const std::vector<std::pair<std::string, ModulePtr>>& named) {
  for (const auto& [name, m] : named) add_child(name, m);
}

Tensor Sequential::forward(const Tensor& x) {
  // The child at i, or null past the end.
  auto at = [this](size_t i) { return i < children_.size() ? children_.item(i).second.get() : nullptr; };
  Tensor y = x;
  for (size_t i = 0; i < children_.size(); ++i) {
    const auto& [name, m] = children_.item(i);
    TVC_CHECK(m != nullptr, "Sequential: module '", name, "' is None and cannot be called");
    // A convolution and a batch norm, with the activation after them, go through
    // conv_norm_activation, which fuses them in evaluation mode; with a max pool after those,
    // conv_norm_activation_max_pool.
    if (dynamic_cast<const Conv2d*>(m.get()) && dynamic_cast<const BatchNorm2d*>(at(i + 1))) {
      // Owned here while they run (a hook may change the children meanwhile).
      ModulePtr conv = m, norm = children_.item(i + 1).second;
      Module* act = dynamic_cast<Activation*>(at(i + 2));
      ModulePtr act_owner = act ? children_.item(i + 2).second : nullptr;
      i += act ? 2 : 1;
      if (dynamic_cast<const MaxPool2d*>(at(i + 1))) {
        ModulePtr pool = children_.item(++i).second;
        y = conv_norm_activation_max_pool(*conv, *norm, act, *pool, y);
        continue;
      }
      y = conv_norm_activation(*conv, *norm, act, y);
      continue;
    }
    // A Linear and a GELU go through linear_activation, and with a Linear after them (past a
    // Dropout that passes its input through) linear_activation_linear: they fuse in inference.
    if (dynamic_cast<const Linear*>(m.get()) && dynamic_cast<const GELU*>(at(i + 1))) {
      ModulePtr linear = m, act = children_.item(i + 1).second;
      const auto* dropout = dynamic_cast<const Dropout*>(at(i + 2));
      const size_t next = dropout && typeid(*dropout) == typeid(Dropout) && !dropout->has_call_hooks() &&
                                  (!dropout->is_training() || dropout->p.to_double() == 0)
                              ? i + 3
                              : i + 2;
      if (dynamic_cast<const Linear*>(at(next))) {
        ModulePtr linear2 = children_.item(next).second;
        y = linear_activation_linear(*linear, *act, *linear2, y);
        i = next;
        continue;
      }
      y = linear_activation(*linear, *act, y);
      ++i;
      continue;
    }
    y = (*m)(y);
  }
  return y;
}

ModulePtr ModuleDict::operator[](const std::string& key) const {
  const ModulePtr* m = children_.find(key);
  TVC_CHECK(m != nullptr, "ModuleDict: no module under key '", key, "'");
  return *m;
}

ModuleDict& ModuleDict::insert(const std::string& key, ModulePtr module) {
  add_child(key, std::move(module));
  return *this;
}

ModuleDict& ModuleDict::update(const std::vector<std::pair<std::string, ModulePtr>>& modules) {
  for (const auto& [key, m] : modules) insert(key, m);
  return *this;
}

ModulePtr ModuleDict::pop(const std::string& key) {
  ModulePtr m = (*this)[key];
  children_.erase(key);
  return m;
}

std::vector<ModulePtr> ModuleDict::values() const {
  std::vector<ModulePtr> out;
  for (const auto& [k, m] : children_) out.push_back(m);
  return out;
}

std::vector<std::pair<std::string, ModulePtr>> ModuleDict::items() const {
  return {children_.begin(), children_.end()};
}

}  // namespace tvc::nn
