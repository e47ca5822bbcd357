// Optimizers (SGD, Adam, AdamW) and gradient clipping, following PyTorch 1.13's torch.optim.
//
// An optimizer holds parameter groups: each group is a list of leaf tensors plus hyper-parameters
// (lr, momentum, betas, ...) that default to the optimizer's own and may be overridden per group.
// step() updates every parameter that has a gradient, in place and without recording history,
// with PyTorch's exact update formulas, so float64 trajectories match PyTorch's to rounding.
// Per-parameter state (momentum_buffer, exp_avg, ...) is created lazily on the first step.
//
//   tvc::optim::SGD opt({w, b}, {.lr = 0.1, .momentum = 0.9});
//   for (...) { opt.zero_grad(); loss(w, b).backward(); opt.step(); }
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "tvc/tensor.h"

namespace tvc::optim {

// A hyper-parameter value: a number (lr, momentum), a flag (nesterov, amsgrad) or a list of
// numbers (betas). Write numbers as doubles (0.0, not 0).
using HyperValue = std::variant<double, bool, std::vector<double>>;

// Hyper-parameters by name in insertion order: a PyTorch param_group dict without "params".
// Schedulers add their own entries (initial_lr, max_lr, ...) as PyTorch's do.
class Options {
 public:
  Options() = default;
  Options(std::initializer_list<std::pair<std::string, HyperValue>> entries);

  bool contains(const std::string& name) const;
  // The value of name; throws naming the key when absent or of another kind.
  const HyperValue& at(const std::string& name) const;
  double get_double(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  const std::vector<double>& get_list(const std::string& name) const;
  // Adds name or replaces its value.
  Options& set(const std::string& name, HyperValue value);
  const std::vector<std::pair<std::string, HyperValue>>& items() const { return items_; }

 private:
  std::vector<std::pair<std::string, HyperValue>> items_;
};

// A group of parameters sharing hyper-parameters. Entries missing from options are filled from
// the optimizer's defaults when the group is added.
struct ParamGroup {
  std::vector<Tensor> params{};
  Options options{};
};

// The state of one parameter by name ("step", "momentum_buffer", "exp_avg", ...). An undefined
// tensor stands for PyTorch's None (SGD's momentum_buffer without momentum).
using ParamState = std::map<std::string, Tensor>;

// An optimizer's state in PyTorch's state_dict layout: state keyed by the parameter's index
// counted across groups in order, and each group's hyper-parameters with its parameter indices.
struct OptimizerStateDict {
  struct Group {
    Options options;
    std::vector<int64_t> params;
  };
  std::map<int64_t, ParamState> state{};
  std::vector<Group> param_groups{};
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates the parameters once. closure, when given, is run with grad mode on first (it
  // should zero the gradients, compute the loss and call backward) and its result returned.
  Tensor step(const std::function<Tensor()>& closure = {});
  // Sets the parameters' gradients to undefined (set_to_none) or to zeros.
  void zero_grad(bool set_to_none = true);
  // Adds a group; its parameters must be floating leaf tensors found in no other group.
  void add_param_group(ParamGroup group);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  const Options& defaults() const { return defaults_; }
  const std::string& name() const { return name_; }
  // The state of param (empty before its first step).
  ParamState& state(const Tensor& param);

  // A copy of the state (tensors cloned) in PyTorch's layout.
  OptimizerStateDict state_dict() const;
  // Replaces state and hyper-parameters by those of dict (tensors are copied and converted to
  // their parameter's dtype, except "step"). Throws tvc::Error naming what differs when the
  // group count, a group's size, a state index or shape, or a hyper-parameter does not match;
  // nothing is changed then.
  void load_state_dict(const OptimizerStateDict& dict);

 protected:
  // name: "SGD", "Adam", ... for messages. defaults: every hyper-parameter with its default.
  Optimizer(std::string name, Options defaults);
  void init_groups(std::vector<ParamGroup> groups);
  // Raises tvc::Error when a group's hyper-parameters are out of range.
  virtual void check_options(const Options& options) const = 0;
  // Updates the parameters of one group that have gradients (grad mode is off).
  virtual void update_group(ParamGroup& group) = 0;

 private:
  std::string name_;
  Options defaults_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<const TensorImpl*, ParamState> state_;
};

// ---- SGD ----
// With weight decay wd, momentum mu, dampening tau, the gradient g becomes g + wd*p, the buffer
// b = g on the first step and b = mu*b + (1-tau)*g after, and p -= lr * (nesterov ? g + mu*b : b)
// (momentum 0: p -= lr*g). maximize ascends instead. After the first step, the parameters of a
// group with a buffer (not Nesterov; dense, with the gradient laid out as the parameter) are
// updated in one pass over all of them (tvc::foreach_sgd_momentum_), with the same values.
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
  Options to_options() const;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options = {});
  SGD(std::vector<ParamGroup> groups, SGDOptions options = {});

 protected:
  void check_options(const Options& options) const override;
  void update_group(ParamGroup& group) override;
};

// ---- Adam and AdamW ----
// m = b1*m + (1-b1)*g, v = b2*v + (1-b2)*g^2 (v_max = max(v_max, v) with amsgrad), then
// p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). Adam adds weight_decay*p to g (L2);
// AdamW instead multiplies p by (1 - lr*weight_decay) first (decoupled weight decay).
struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
  Options to_options() const;
};

// AdamW's defaults differ from Adam's only in weight_decay.
struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
  Options to_options() const;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  Adam(std::vector<ParamGroup> groups, AdamOptions options = {});

 protected:
  // For AdamW: same hyper-parameters, decoupled weight decay.
  Adam(std::string name, Options defaults, std::vector<ParamGroup> groups, bool decoupled);
  void check_options(const Options& options) const override;
  void update_group(ParamGroup& group) override;

 private:
  bool decoupled_weight_decay_ = false;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});
};

// ---- gradient clipping ----
// Scales the gradients of params (those that have one) in place so that their joint norm (as if
// concatenated into one vector) is at most max_norm: each is multiplied by
// min(1, max_norm / (total_norm + 1e-6)). norm_type: p > 0, or infinity for the max-norm.
// Returns the total norm before clipping (0-d, in the gradients' dtype; 0 without gradients).
// error_if_nonfinite: throw instead of scaling by a NaN or infinite norm.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

}  // namespace tvc::optim
