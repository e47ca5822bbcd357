// Learning-rate schedulers (see tvc/lr_scheduler.h). Formulas follow PyTorch 1.13's
// torch/optim/lr_scheduler.py with the same order of floating-point operations, so the lrs agree
// bit for bit where the C library's cos and pow do.
#include "tvc/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tvc::optim::lr_scheduler {

namespace {

constexpr double kPi = std::numbers::pi;

// Python's a % b for b > 0 (never negative).
int64_t floor_mod(int64_t a, int64_t b) { return ((a % b) + b) % b; }
// Python's a // b for b > 0.
int64_t floor_div(int64_t a, int64_t b) { return (a - floor_mod(a, b)) / b; }

// One value per group from a list holding one per group or one for all.
std::vector<double> per_group(const std::vector<double>& values, size_t groups, const char* name) {
  TVC_CHECK(values.size() == 1 || values.size() == groups, "OneCycleLR: expected 1 or ", groups, " values for ", name,
            " (one per parameter group), got ", values.size());
  return values.size() == 1 ? std::vector<double>(groups, values[0]) : values;
}

}  // namespace

// ---------------------------------------------------------------- LRScheduler

LRScheduler::LRScheduler(Optimizer& optimizer, int64_t last_epoch) : optimizer_(&optimizer), last_epoch_(last_epoch) {
  auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    Options& o = groups[i].options;
    if (last_epoch == -1) {
      if (!o.contains("initial_lr")) o.set("initial_lr", o.get_double("lr"));
    } else {
      TVC_CHECK(o.contains("initial_lr"), "lr scheduler: param_groups[", i,
                "] has no 'initial_lr', needed to resume at last_epoch ", last_epoch);
    }
    base_lrs_.push_back(o.get_double("initial_lr"));
  }
}

std::vector<double> LRScheduler::group_lrs() const {
  std::vector<double> lrs;
  for (const ParamGroup& g : optimizer_->param_groups()) lrs.push_back(g.options.get_double("lr"));
  return lrs;
}

void LRScheduler::check_group_count() const {
  TVC_CHECK(optimizer_->param_groups().size() == base_lrs_.size(), "lr scheduler step: the ", optimizer_->name(),
            " optimizer has ", optimizer_->param_groups().size(), " parameter groups, the scheduler was made for ",
            base_lrs_.size());
}

void LRScheduler::apply(const std::vector<double>& lrs) {
  auto& groups = optimizer_->param_groups();
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options.set("lr", lrs.at(i));
  last_lr_ = group_lrs();
}

void LRScheduler::initial_step() {
  step_count_ = 0;
  step();
}

void LRScheduler::step() {
  check_group_count();
  ++step_count_;
  ++last_epoch_;
  apply(get_lr());
}

void LRScheduler::step_to(int64_t epoch) {
  check_group_count();
  ++step_count_;
  last_epoch_ = epoch;
  std::optional<std::vector<double>> closed = get_closed_form_lr();
  apply(closed ? *closed : get_lr());
}

SchedulerStateDict LRScheduler::state_dict() const { return {last_epoch_, step_count_, base_lrs_, last_lr_, {}}; }

void LRScheduler::check_state_dict(const SchedulerStateDict& dict) const {
  const size_t groups = optimizer_->param_groups().size();
  TVC_CHECK(dict.base_lrs.size() == groups && dict.last_lr.size() == groups,
            "lr scheduler load_state_dict: the state dict has ", dict.base_lrs.size(), " base_lrs and ",
            dict.last_lr.size(), " last_lr values, the optimizer has ", groups, " parameter groups");
}

void LRScheduler::load_state_dict(const SchedulerStateDict& dict) {
  check_state_dict(dict);
  last_epoch_ = dict.last_epoch;
  step_count_ = dict.step_count;
  base_lrs_ = dict.base_lrs;
  last_lr_ = dict.last_lr;
}

// ---------------------------------------------------------------- StepLR

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma, int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), step_size_(step_size), gamma_(gamma) {
  TVC_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  initial_step();
}

std::vector<double> StepLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  if (last_epoch_ == 0 || floor_mod(last_epoch_, step_size_) != 0) return lrs;
  for (double& lr : lrs) lr = lr * gamma_;
  return lrs;
}

std::optional<std::vector<double>> StepLR::get_closed_form_lr() const {
  std::vector<double> lrs;
  const double factor = std::pow(gamma_, static_cast<double>(floor_div(last_epoch_, step_size_)));
  for (double base : base_lrs_) lrs.push_back(base * factor);
  return lrs;
}

// ---------------------------------------------------------------- MultiStepLR

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma, int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), milestones_(std::move(milestones)), gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());
  initial_step();
}

std::vector<double> MultiStepLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  const auto count = std::count(milestones_.begin(), milestones_.end(), last_epoch_);
  if (count == 0) return lrs;
  for (double& lr : lrs) lr = lr * std::pow(gamma_, static_cast<double>(count));
  return lrs;
}

std::optional<std::vector<double>> MultiStepLR::get_closed_form_lr() const {
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(base * std::pow(gamma_, static_cast<double>(passed)));
  return lrs;
}

// ---------------------------------------------------------------- LinearLR

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters,
                   int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch),
      start_factor_(start_factor),
      end_factor_(end_factor),
      total_iters_(total_iters) {
  TVC_CHECK(start_factor > 0 && start_factor <= 1, "LinearLR: start_factor must be in (0, 1], got ", start_factor);
  TVC_CHECK(end_factor >= 0 && end_factor <= 1, "LinearLR: end_factor must be in [0, 1], got ", end_factor);
  TVC_CHECK(total_iters > 0, "LinearLR: total_iters must be positive, got ", total_iters);
  initial_step();
}

std::vector<double> LinearLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  if (last_epoch_ == 0) {
    for (double& lr : lrs) lr = lr * start_factor_;
  } else if (last_epoch_ <= total_iters_) {
    const double span = end_factor_ - start_factor_;
    const double factor =
        1.0 + span / (static_cast<double>(total_iters_) * start_factor_ + static_cast<double>(last_epoch_ - 1) * span);
    for (double& lr : lrs) lr = lr * factor;
  }
  return lrs;
}

std::optional<std::vector<double>> LinearLR::get_closed_form_lr() const {
  const double done = static_cast<double>(std::min(total_iters_, last_epoch_));
  const double factor = start_factor_ + (end_factor_ - start_factor_) * done / static_cast<double>(total_iters_);
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(base * factor);
  return lrs;
}

// ---------------------------------------------------------------- CosineAnnealingLR

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min, int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), T_max_(T_max), eta_min_(eta_min) {
  TVC_CHECK(T_max > 0, "CosineAnnealingLR: T_max must be positive, got ", T_max);
  initial_step();
}

std::vector<double> CosineAnnealingLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  const double epoch = static_cast<double>(last_epoch_), t_max = static_cast<double>(T_max_);
  if (last_epoch_ == 0) return lrs;
  if (step_count_ == 1 && last_epoch_ > 0) {  // resumed: closed form
    for (size_t i = 0; i < lrs.size(); ++i)
      lrs[i] = eta_min_ + (base_lrs_[i] - eta_min_) * (1 + std::cos(epoch * kPi / t_max)) / 2;
  } else if (floor_mod(last_epoch_ - 1 - T_max_, 2 * T_max_) == 0) {  // bottom of the cosine
    for (size_t i = 0; i < lrs.size(); ++i)
      lrs[i] = lrs[i] + (base_lrs_[i] - eta_min_) * (1 - std::cos(kPi / t_max)) / 2;
  } else {
    const double ratio = (1 + std::cos(kPi * epoch / t_max)) / (1 + std::cos(kPi * (epoch - 1) / t_max));
    for (double& lr : lrs) lr = ratio * (lr - eta_min_) + eta_min_;
  }
  return lrs;
}

std::optional<std::vector<double>> CosineAnnealingLR::get_closed_form_lr() const {
  const double epoch = static_cast<double>(last_epoch_), t_max = static_cast<double>(T_max_);
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(eta_min_ + (base - eta_min_) * (1 + std::cos(kPi * epoch / t_max)) / 2);
  return lrs;
}

// ---------------------------------------------------------------- OneCycleLR

OneCycleLR::OneCycleLR(Optimizer& optimizer, OneCycleLROptions o)
    : LRScheduler(optimizer, o.last_epoch), cosine_(o.anneal_strategy == "cos"), cycle_momentum_(o.cycle_momentum) {
  TVC_CHECK(o.total_steps >= 0, "OneCycleLR: total_steps must be positive, got ", o.total_steps);
  if (o.total_steps > 0) {
    total_steps_ = o.total_steps;
  } else {
    TVC_CHECK(o.epochs > 0 && o.steps_per_epoch > 0,
              "OneCycleLR: give total_steps, or epochs and steps_per_epoch (both positive); got "
              "epochs ",
              o.epochs, " and steps_per_epoch ", o.steps_per_epoch);
    total_steps_ = o.epochs * o.steps_per_epoch;
  }
  TVC_CHECK(o.pct_start >= 0 && o.pct_start <= 1, "OneCycleLR: pct_start must be in [0, 1], got ", o.pct_start);
  TVC_CHECK(o.anneal_strategy == "cos" || o.anneal_strategy == "linear",
            "OneCycleLR: anneal_strategy must be 'cos' or 'linear', got '", o.anneal_strategy, "'");
  const double total = static_cast<double>(total_steps_);
  if (o.three_phase) {
    phases_ = {{o.pct_start * total - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"},
               {2 * o.pct_start * total - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"},
               {total - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"}};
  } else {
    phases_ = {{o.pct_start * total - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"},
               {total - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"}};
  }
  auto& groups = optimizer.param_groups();
  const std::vector<double> max_lrs = per_group(o.max_lr, groups.size(), "max_lr");
  if (o.last_epoch == -1) {
    for (size_t i = 0; i < groups.size(); ++i) {
      Options& g = groups[i].options;
      g.set("initial_lr", max_lrs[i] / o.div_factor);
      g.set("max_lr", max_lrs[i]);
      g.set("min_lr", g.get_double("initial_lr") / o.final_div_factor);
    }
  }
  if (cycle_momentum_) {
    const Options& defaults = optimizer.defaults();
    TVC_CHECK(defaults.contains("momentum") || defaults.contains("betas"), "OneCycleLR: ", optimizer.name(),
              " has neither momentum nor betas, needed by cycle_momentum");
    use_beta1_ = defaults.contains("betas");
    const std::vector<double> max_m = per_group(o.max_momentum, groups.size(), "max_momentum");
    const std::vector<double> base_m = per_group(o.base_momentum, groups.size(), "base_momentum");
    if (o.last_epoch == -1) {
      for (size_t i = 0; i < groups.size(); ++i) {
        Options& g = groups[i].options;
        if (use_beta1_) {
          std::vector<double> betas = g.get_list("betas");
          betas[0] = max_m[i];
          g.set("betas", betas);
        } else {
          g.set("momentum", max_m[i]);
        }
        g.set("max_momentum", max_m[i]);
        g.set("base_momentum", base_m[i]);
      }
    }
  }
  base_lrs_.clear();
  for (const ParamGroup& g : groups) base_lrs_.push_back(g.options.get_double("initial_lr"));
  initial_step();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (cosine_) return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1);
  return (end - start) * pct + start;
}

std::vector<double> OneCycleLR::get_lr() {
  const int64_t step_num = last_epoch_;
  TVC_CHECK(step_num <= total_steps_, "OneCycleLR: tried to step ", step_num + 1,
            " times; the specified number of total steps is ", total_steps_);
  std::vector<double> lrs;
  for (ParamGroup& group : optimizer_->param_groups()) {
    Options& g = group.options;
    double start_step = 0;
    for (size_t i = 0; i < phases_.size(); ++i) {
      const Phase& phase = phases_[i];
      if (static_cast<double>(step_num) <= phase.end_step || i + 1 == phases_.size()) {
        const double pct = (static_cast<double>(step_num) - start_step) / (phase.end_step - start_step);
        lrs.push_back(anneal(g.get_double(phase.start_lr), g.get_double(phase.end_lr), pct));
        if (cycle_momentum_) {
          const double m = anneal(g.get_double(phase.start_momentum), g.get_double(phase.end_momentum), pct);
          if (use_beta1_) {
            std::vector<double> betas = g.get_list("betas");
            betas[0] = m;
            g.set("betas", betas);
          } else {
            g.set("momentum", m);
          }
        }
        break;
      }
      start_step = phase.end_step;
    }
  }
  return lrs;
}

// ---------------------------------------------------------------- SequentialLR

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones, int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  TVC_CHECK(!schedulers_.empty(), "SequentialLR: got no schedulers");
  for (size_t i = 0; i < schedulers_.size(); ++i)
    TVC_CHECK(schedulers_[i] && &schedulers_[i]->optimizer() == &optimizer, "SequentialLR: scheduler ", i,
              " does not act on the optimizer given to SequentialLR");
  TVC_CHECK(milestones_.size() + 1 == schedulers_.size(), "SequentialLR: expected ", schedulers_.size() - 1,
            " milestones (one fewer than the ", schedulers_.size(), " schedulers), got ", milestones_.size());
  TVC_CHECK(std::is_sorted(milestones_.begin(), milestones_.end()),
            "SequentialLR: milestones must be in increasing order");
  last_epoch_ = last_epoch + 1;
  // Undo the initial steps of the schedulers and make only the first one's.
  for (ParamGroup& g : optimizer.param_groups()) g.options.set("lr", g.options.get_double("initial_lr"));
  for (auto& s : schedulers_) s->last_epoch_ -= 1;
  schedulers_[0]->initial_step();
  last_lr_ = schedulers_[0]->get_last_lr();
}

std::vector<double> SequentialLR::get_lr() {
  const size_t idx = std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  LRScheduler& active = *schedulers_[idx];
  if (idx > 0 && milestones_[idx - 1] == last_epoch_)
    active.step_to(0);
  else
    active.step();
  return active.get_last_lr();
}

SchedulerStateDict SequentialLR::state_dict() const {
  SchedulerStateDict dict = LRScheduler::state_dict();
  for (const auto& s : schedulers_) dict.schedulers.push_back(s->state_dict());
  return dict;
}

void SequentialLR::check_state_dict(const SchedulerStateDict& dict) const {
  LRScheduler::check_state_dict(dict);
  TVC_CHECK(dict.schedulers.size() == schedulers_.size(), "SequentialLR load_state_dict: the state dict has ",
            dict.schedulers.size(), " schedulers, this SequentialLR has ", schedulers_.size());
  for (size_t i = 0; i < schedulers_.size(); ++i) schedulers_[i]->check_state_dict(dict.schedulers[i]);
}

void SequentialLR::load_state_dict(const SchedulerStateDict& dict) {
  check_state_dict(dict);
  LRScheduler::load_state_dict(dict);
  for (size_t i = 0; i < schedulers_.size(); ++i) schedulers_[i]->load_state_dict(dict.schedulers[i]);
}

}  // namespace tvc::optim::lr_scheduler
