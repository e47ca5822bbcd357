// Containers of modules: Sequential, ModuleList, ModuleDict (torch.nn's, same child names).
//
// Sequential and ModuleList name their children "0", "1", ... in order, so state_dict keys are
// "<index>.<name>" as in PyTorch; insert and pop renumber the children as PyTorch does.
// Indices may be negative (counted from the end).
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "tvc/nn/module.h"

namespace tvc::nn {

namespace detail {
// index wrapped into [0, size) (or [0, size] when allow_end); throws naming owner's type and op
// (its name made only then: a Sequential indexed in a model's forward paid a demangling per call).
size_t wrap_index(int64_t index, size_t size, bool allow_end, const Module& owner, const char* op);
}  // namespace detail

// The list operations shared by Sequential and ModuleList.
template <typename Derived>
class ModuleSequence : public Cloneable<Derived> {
 public:
  size_t size() const { return this->children_.size(); }
  bool empty() const { return this->children_.empty(); }
  // The module at position index (null when a None was added).
  ModulePtr operator[](int64_t index) const {
    return this->children_.item(detail::wrap_index(index, size(), false, *this, "[]")).second;
  }
  // The module at index as type T; throws when it is another type.
  template <typename T>
  std::shared_ptr<T> at(int64_t index) const {
    auto m = std::dynamic_pointer_cast<T>((*this)[index]);
    TVC_CHECK(m != nullptr, this->type_name(), ".at(", index, "): the module is not of the asked type");
    return m;
  }
  // The modules in order.
  std::vector<ModulePtr> list() const {
    std::vector<ModulePtr> out;
    for (const auto& [name, m] : this->children_) out.push_back(m);
    return out;
  }
  Derived& append(ModulePtr module) {
    this->add_child(std::to_string(size()), std::move(module));
    return static_cast<Derived&>(*this);
  }
  Derived& push_back(ModulePtr module) { return append(std::move(module)); }
  Derived& extend(const std::vector<ModulePtr>& modules) {
    add_all(modules);
    return static_cast<Derived&>(*this);
  }
  // Inserts before position index (-size..size).
  Derived& insert(int64_t index, ModulePtr module) {
    std::vector<ModulePtr> ms = list();
    ms.insert(ms.begin() + static_cast<std::ptrdiff_t>(detail::wrap_index(index, size(), true, *this, ".insert")),
              std::move(module));
    renumber(ms);
    return static_cast<Derived&>(*this);
  }
  // Removes and returns the module at index.
  ModulePtr pop(int64_t index = -1) {
    std::vector<ModulePtr> ms = list();
    size_t i = detail::wrap_index(index, size(), false, *this, ".pop");
    ModulePtr m = ms[i];
    ms.erase(ms.begin() + static_cast<std::ptrdiff_t>(i));
    renumber(ms);
    return m;
  }

 protected:
  ModuleSequence() = default;
  // No Derived& here: the constructor runs before the Derived object exists.
  explicit ModuleSequence(const std::vector<ModulePtr>& modules) { add_all(modules); }

 private:
  void add_all(const std::vector<ModulePtr>& modules) {
    for (const auto& m : modules) this->add_child(std::to_string(size()), m);
  }
  void renumber(const std::vector<ModulePtr>& modules) {
    this->children_.clear();
    add_all(modules);
  }
};

// Runs its children in order: forward(x) = child_n(...child_0(x)).
class Sequential : public ModuleSequence<Sequential> {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<ModulePtr> modules) : ModuleSequence(modules) {}
  explicit Sequential(const std::vector<ModulePtr>& modules) : ModuleSequence(modules) {}
  // Named children, as Sequential(OrderedDict([...])).
  explicit Sequential(const std::vector<std::pair<std::string, ModulePtr>>& named);
  Tensor forward(const Tensor& x) override;
};

// Holds modules in a list; it has no forward of its own.
class ModuleList : public ModuleSequence<ModuleList> {
 public:
  ModuleList() = default;
  ModuleList(std::initializer_list<ModulePtr> modules) : ModuleSequence(modules) {}
  explicit ModuleList(const std::vector<ModulePtr>& modules) : ModuleSequence(modules) {}
};

// Holds modules by name in insertion order; it has no forward of its own.
class ModuleDict : public Cloneable<ModuleDict> {
 public:
  ModuleDict() = default;
  explicit ModuleDict(const std::vector<std::pair<std::string, ModulePtr>>& modules) { update(modules); }
  // The module under key; throws naming the key when absent.
  ModulePtr operator[](const std::string& key) const;
  // Adds or replaces key (keeping its position).
  ModuleDict& insert(const std::string& key, ModulePtr module);
  ModuleDict& update(const std::vector<std::pair<std::string, ModulePtr>>& modules);
  // Removes and returns the module under key.
  ModulePtr pop(const std::string& key);
  bool contains(const std::string& key) const { return children_.contains(key); }
  size_t size() const { return children_.size(); }
  bool empty() const { return children_.empty(); }
  void clear() { children_.clear(); }
  std::vector<std::string> keys() const { return children_.keys(); }
  std::vector<ModulePtr> values() const;
  std::vector<std::pair<std::string, ModulePtr>> items() const;
};

}  // namespace tvc::nn
