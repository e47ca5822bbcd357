// Optimizers and gradient clipping (see tvc/optim.h). The update formulas follow PyTorch 1.13's
// single-tensor implementations (torch/optim/sgd.py, adam.py, adamw.py), including the order of
// the floating-point operations, so that float64 trajectories agree to rounding.
#include "tvc/optim.h"

#include <cmath>
#include <unordered_set>

#include "tvc/autograd.h"
#include "tvc/internal/kernel.h"
#include "tvc/ops.h"

namespace tvc::optim {

namespace {

const char* kind_name(const HyperValue& v) {
  switch (v.index()) {
    case 0:
      return "number";
    case 1:
      return "flag";
    default:
      return "list";
  }
}

}  // namespace

// ---------------------------------------------------------------- Options

Options::Options(std::initializer_list<std::pair<std::string, HyperValue>> entries) {
  for (const auto& [name, value] : entries) set(name, value);
}

bool Options::contains(const std::string& name) const {
  for (const auto& item : items_)
    if (item.first == name) return true;
  return false;
}

const HyperValue& Options::at(const std::string& name) const {
  for (const auto& item : items_)
    if (item.first == name) return item.second;
  throw Error(cat_str("optimizer options: no hyper-parameter named '", name, "'"));
}

double Options::get_double(const std::string& name) const {
  const HyperValue& v = at(name);
  TVC_CHECK(std::holds_alternative<double>(v), "optimizer options: '", name, "' is a ", kind_name(v), ", not a number");
  return std::get<double>(v);
}

bool Options::get_bool(const std::string& name) const {
  const HyperValue& v = at(name);
  TVC_CHECK(std::holds_alternative<bool>(v), "optimizer options: '", name, "' is a ", kind_name(v), ", not a flag");
  return std::get<bool>(v);
}

const std::vector<double>& Options::get_list(const std::string& name) const {
  const HyperValue& v = at(name);
  TVC_CHECK(std::holds_alternative<std::vector<double>>(v), "optimizer options: '", name, "' is a ", kind_name(v),
            ", not a list");
  return std::get<std::vector<double>>(v);
}

Options& Options::set(const std::string& name, HyperValue value) {
  for (auto& item : items_) {
    if (item.first == name) {
      item.second = std::move(value);
      return *this;
    }
  }
  items_.emplace_back(name, std::move(value));
  return *this;
}

// ---------------------------------------------------------------- Optimizer

Optimizer::Optimizer(std::string name, Options defaults) : name_(std::move(name)), defaults_(std::move(defaults)) {}

void Optimizer::init_groups(std::vector<ParamGroup> groups) {
  TVC_CHECK(!groups.empty(), name_, ": got an empty parameter list");
  for (ParamGroup& g : groups) add_param_group(std::move(g));
}

void Optimizer::add_param_group(ParamGroup group) {
  std::unordered_set<const TensorImpl*> seen;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) seen.insert(p.impl());
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    TVC_CHECK(p.defined(), name_, ": parameter ", i, " of group ", groups_.size(), " is an undefined tensor");
    TVC_CHECK(is_floating(p.dtype()), name_, ": parameter ", i, " of group ", groups_.size(), " (shape ", p.shape(),
              ") has dtype ", dtype_name(p.dtype()), "; only floating tensors can be optimized");
    TVC_CHECK(p.is_leaf() || p.retains_grad(), name_, ": parameter ", i, " of group ", groups_.size(), " (shape ",
              p.shape(), ") is not a leaf tensor");
    TVC_CHECK(seen.insert(p.impl()).second, name_, ": parameter ", i, " of group ", groups_.size(), " (shape ",
              p.shape(), ") appears more than once among the parameter groups");
  }
  for (const auto& [key, value] : defaults_.items()) {
    if (!group.options.contains(key)) {
      group.options.set(key, value);
      continue;
    }
    const HyperValue& given = group.options.at(key);
    TVC_CHECK(given.index() == value.index(), name_, ": hyper-parameter '", key, "' of group ", groups_.size(),
              " must be a ", kind_name(value), ", got a ", kind_name(given));
  }
  check_options(group.options);
  groups_.push_back(std::move(group));
}

ParamState& Optimizer::state(const Tensor& param) { return state_[param.impl()]; }

Tensor Optimizer::step(const std::function<Tensor()>& closure) {
  Tensor loss;
  if (closure) {
    GradModeGuard grad_on(true);
    loss = closure();
  }
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) update_group(group);
  return loss;
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    for (Tensor& p : group.params) {
      Tensor g = p.grad();
      if (!g.defined()) continue;
      if (set_to_none) {
        p.set_grad(Tensor());
      } else {
        g.detach_();
        g.zero_();
      }
    }
  }
}

OptimizerStateDict Optimizer::state_dict() const {
  OptimizerStateDict dict;
  std::unordered_map<const TensorImpl*, int64_t> index;
  int64_t next = 0;
  for (const ParamGroup& group : groups_) {
    OptimizerStateDict::Group packed{group.options, {}};
    for (const Tensor& p : group.params) {
      index[p.impl()] = next;
      packed.params.push_back(next++);
    }
    dict.param_groups.push_back(std::move(packed));
  }
  for (const auto& [impl, param_state] : state_) {
    if (param_state.empty()) continue;
    ParamState copy;
    for (const auto& [key, t] : param_state) copy[key] = t.defined() ? t.clone() : Tensor();
    dict.state[index.at(impl)] = std::move(copy);
  }
  return dict;
}

void Optimizer::load_state_dict(const OptimizerStateDict& dict) {
  const std::string op = name_ + ".load_state_dict";
  TVC_CHECK(dict.param_groups.size() == groups_.size(), op, ": the state dict has ", dict.param_groups.size(),
            " parameter groups, the optimizer has ", groups_.size());
  // Saved parameter index -> our parameter, pairing both flattened group lists in order.
  std::map<int64_t, const Tensor*> id_map;
  std::vector<Options> options;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const OptimizerStateDict::Group& saved = dict.param_groups[i];
    TVC_CHECK(saved.params.size() == groups_[i].params.size(), op, ": parameter group ", i, " of the state dict has ",
              saved.params.size(), " parameters, the optimizer's has ", groups_[i].params.size());
    for (size_t j = 0; j < saved.params.size(); ++j)
      TVC_CHECK(id_map.emplace(saved.params[j], &groups_[i].params[j]).second, op, ": parameter index ",
                saved.params[j], " appears twice in the state dict");
    for (const auto& [key, value] : defaults_.items()) {
      TVC_CHECK(saved.options.contains(key), op, ": parameter group ", i, " of the state dict lacks hyper-parameter '",
                key, "'");
      const HyperValue& given = saved.options.at(key);
      TVC_CHECK(given.index() == value.index(), op, ": hyper-parameter '", key, "' of parameter group ", i,
                " must be a ", kind_name(value), ", got a ", kind_name(given));
    }
    check_options(saved.options);
    options.push_back(saved.options);
  }
  std::unordered_map<const TensorImpl*, ParamState> state;
  for (const auto& [index, saved_state] : dict.state) {
    auto it = id_map.find(index);
    TVC_CHECK(it != id_map.end(), op, ": the state dict has state for parameter index ", index,
              ", which is in none of its parameter groups");
    const Tensor& param = *it->second;
    ParamState loaded;
    for (const auto& [key, t] : saved_state) {
      if (!t.defined()) {
        loaded[key] = Tensor();
      } else if (key == "step") {
        loaded[key] = t.clone();
      } else {
        TVC_CHECK(t.shape() == param.shape(), op, ": state '", key, "' of parameter ", index, " has shape ", t.shape(),
                  ", the parameter has shape ", param.shape());
        loaded[key] = t.to(param.dtype()).clone();
      }
    }
    state[param.impl()] = std::move(loaded);
  }
  // Everything is validated: commit.
  state_ = std::move(state);
  for (size_t i = 0; i < groups_.size(); ++i) groups_[i].options = std::move(options[i]);
}

// ---------------------------------------------------------------- SGD

Options SGDOptions::to_options() const {
  return {{"lr", lr},
          {"momentum", momentum},
          {"dampening", dampening},
          {"weight_decay", weight_decay},
          {"nesterov", nesterov},
          {"maximize", maximize}};
}

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : SGD(std::vector<ParamGroup>{ParamGroup{std::move(params), {}}}, options) {
  TVC_CHECK(!param_groups()[0].params.empty(), "SGD: got an empty parameter list");
}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options) : Optimizer("SGD", options.to_options()) {
  init_groups(std::move(groups));
}

void SGD::check_options(const Options& o) const {
  TVC_CHECK(o.get_double("lr") >= 0, "SGD: invalid learning rate ", o.get_double("lr"), " (lr must be >= 0)");
  TVC_CHECK(o.get_double("momentum") >= 0, "SGD: invalid momentum ", o.get_double("momentum"), " (must be >= 0)");
  TVC_CHECK(o.get_double("weight_decay") >= 0, "SGD: invalid weight_decay ", o.get_double("weight_decay"),
            " (must be >= 0)");
  TVC_CHECK(!o.get_bool("nesterov") || (o.get_double("momentum") > 0 && o.get_double("dampening") == 0),
            "SGD: nesterov momentum requires momentum > 0 and dampening 0, got momentum ", o.get_double("momentum"),
            " and dampening ", o.get_double("dampening"));
}

void SGD::update_group(ParamGroup& group) {
  const Options& o = group.options;
  const double lr = o.get_double("lr"), momentum = o.get_double("momentum");
  const double dampening = o.get_double("dampening"), weight_decay = o.get_double("weight_decay");
  const bool nesterov = o.get_bool("nesterov"), maximize = o.get_bool("maximize");
  // The parameters with a momentum buffer that one foreach_sgd_momentum_ call can take (those of
  // the first such parameter's dtype and device, each with its gradient and buffer laid out as
  // itself): their updates in one pass at the end, with the same values.
  std::vector<Tensor> fused_params, fused_grads, fused_buffers;
  auto fuses = [&](const Tensor& p, const Tensor& d_p, const Tensor& buf) {
    if (nesterov || !kernel_registry().supports(Op::sgd_momentum, p.device())) return false;
    if (!fused_params.empty() && (p.dtype() != fused_params[0].dtype() || p.device() != fused_params[0].device()))
      return false;
    const bool dense = p.is_contiguous() || p.is_contiguous(MemoryFormat::ChannelsLast);
    return dense && is_floating(p.dtype()) && d_p.dtype() == p.dtype() && buf.dtype() == p.dtype() &&
           d_p.strides() == p.strides() && buf.strides() == p.strides() && d_p.storage() != p.storage() &&
           buf.storage() != p.storage() && buf.storage() != d_p.storage();
  };
  for (Tensor& p : group.params) {
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    Tensor d_p = maximize ? neg(grad) : grad;
    if (weight_decay != 0) d_p = add(d_p, p, weight_decay);
    ParamState& st = state(p);
    if (momentum != 0) {
      Tensor& buf = st["momentum_buffer"];
      if (!buf.defined()) {
        buf = d_p.clone();
      } else if (fuses(p, d_p, buf)) {
        fused_params.push_back(p);
        fused_grads.push_back(d_p);
        fused_buffers.push_back(buf);
        continue;
      } else {
        buf.mul_(momentum).add_(d_p, 1 - dampening);
      }
      d_p = nesterov ? add(d_p, buf, momentum) : buf;
    } else {
      st.emplace("momentum_buffer", Tensor());  // PyTorch keeps None (or an older buffer)
    }
    p.add_(d_p, -lr);
  }
  foreach_sgd_momentum_(fused_params, fused_grads, fused_buffers, lr, momentum, dampening);
}

// ---------------------------------------------------------------- Adam, AdamW

namespace {

Options adam_options(double lr, std::pair<double, double> betas, double eps, double weight_decay, bool amsgrad,
                     bool maximize) {
  return {{"lr", lr},           {"betas", std::vector<double>{betas.first, betas.second}},
          {"eps", eps},         {"weight_decay", weight_decay},
          {"amsgrad", amsgrad}, {"maximize", maximize}};
}

}  // namespace

Options AdamOptions::to_options() const { return adam_options(lr, betas, eps, weight_decay, amsgrad, maximize); }
Options AdamWOptions::to_options() const { return adam_options(lr, betas, eps, weight_decay, amsgrad, maximize); }

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Adam(std::vector<ParamGroup>{ParamGroup{std::move(params), {}}}, options) {
  TVC_CHECK(!param_groups()[0].params.empty(), "Adam: got an empty parameter list");
}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions options)
    : Adam("Adam", options.to_options(), std::move(groups), false) {}

Adam::Adam(std::string name, Options defaults, std::vector<ParamGroup> groups, bool decoupled)
    : Optimizer(std::move(name), std::move(defaults)), decoupled_weight_decay_(decoupled) {
  init_groups(std::move(groups));
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{ParamGroup{std::move(params), {}}}, options) {
  TVC_CHECK(!param_groups()[0].params.empty(), "AdamW: got an empty parameter list");
}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : Adam("AdamW", options.to_options(), std::move(groups), true) {}

void Adam::check_options(const Options& o) const {
  const std::string& op = name();
  TVC_CHECK(o.get_double("lr") >= 0, op, ": invalid learning rate ", o.get_double("lr"), " (lr must be >= 0)");
  TVC_CHECK(o.get_double("eps") >= 0, op, ": invalid eps ", o.get_double("eps"), " (must be >= 0)");
  const std::vector<double>& betas = o.get_list("betas");
  TVC_CHECK(betas.size() == 2, op, ": betas must hold 2 values, got ", betas.size());
  for (int i = 0; i < 2; ++i)
    TVC_CHECK(betas[i] >= 0 && betas[i] < 1, op, ": invalid beta parameter at index ", i, ": ", betas[i],
              " (must be in [0, 1))");
  TVC_CHECK(o.get_double("weight_decay") >= 0, op, ": invalid weight_decay ", o.get_double("weight_decay"),
            " (must be >= 0)");
}

void Adam::update_group(ParamGroup& group) {
  const Options& o = group.options;
  const double lr = o.get_double("lr"), eps = o.get_double("eps");
  const double weight_decay = o.get_double("weight_decay");
  const double beta1 = o.get_list("betas")[0], beta2 = o.get_list("betas")[1];
  const bool amsgrad = o.get_bool("amsgrad"), maximize = o.get_bool("maximize");
  for (Tensor& p : group.params) {
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    if (maximize) grad = neg(grad);
    ParamState& st = state(p);
    if (st.empty()) {
      st["step"] = scalar_tensor(0.0, {.dtype = DType::Float32});  // as PyTorch: float32
      st["exp_avg"] = zeros_like(p);
      st["exp_avg_sq"] = zeros_like(p);
      if (amsgrad) st["max_exp_avg_sq"] = zeros_like(p);
    }
    Tensor& exp_avg = st.at("exp_avg");
    Tensor& exp_avg_sq = st.at("exp_avg_sq");
    st.at("step").add_(1);
    if (decoupled_weight_decay_)
      p.mul_(1 - lr * weight_decay);
    else if (weight_decay != 0)
      grad = add(grad, p, weight_decay);

    exp_avg.mul_(beta1).add_(grad, 1 - beta1);
    exp_avg_sq.mul_(beta2).add_(grad * (1 - beta2) * grad);  // addcmul's order: (v*g)*g

    const double step = st.at("step").item_double();
    const double bias_correction1 = 1 - std::pow(beta1, step);
    const double bias_correction2 = 1 - std::pow(beta2, step);
    const double step_size = lr / bias_correction1;
    const double bias_correction2_sqrt = std::sqrt(bias_correction2);
    Tensor second = exp_avg_sq;
    if (amsgrad) {
      TVC_CHECK(st.count("max_exp_avg_sq"), name(),
                ": amsgrad was switched on after the first "
                "step of a parameter of shape ",
                p.shape(), "; its max_exp_avg_sq state is missing");
      Tensor& max_sq = st.at("max_exp_avg_sq");
      max_sq.copy_(maximum(max_sq, exp_avg_sq));
      second = max_sq;
    }
    Tensor denom = (sqrt(second) / bias_correction2_sqrt).add_(eps);
    p.add_(exp_avg * (-step_size) / denom);  // addcdiv's order: (v*m)/d
  }
}

// ---------------------------------------------------------------- clipping

namespace {

// The p-norm of all elements of t (p > 0 or infinity), in t's dtype.
Tensor vector_norm(const Tensor& t, double p) {
  if (std::isinf(p)) return amax(abs(t));
  if (p == 2) return sqrt(sum(t * t));
  if (p == 1) return sum(abs(t));
  return pow(sum(pow(abs(t), p)), 1.0 / p);
}

}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  TVC_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be > 0 or infinity, got ", norm_type);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    TVC_CHECK(p.defined(), "clip_grad_norm_: a parameter is an undefined tensor");
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return scalar_tensor(0.0);
  // Norm of the per-gradient norms, computed in the first gradient's dtype as PyTorch's stack.
  std::vector<double> norms;
  for (const Tensor& g : grads) norms.push_back(vector_norm(g.detach(), norm_type).item_double());
  Tensor total = vector_norm(tensor<double>(norms).to(grads[0].dtype()), norm_type);
  const double total_value = total.item_double();
  TVC_CHECK(!error_if_nonfinite || std::isfinite(total_value), "clip_grad_norm_: the total norm of order ", norm_type,
            " of the gradients is ", total_value,
            ", so it cannot be clipped; pass error_if_nonfinite=false to scale by it anyway");
  Tensor clip_coef = clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (Tensor& g : grads) g.mul_(clip_coef);
  return total;
}

}  // namespace tvc::optim
