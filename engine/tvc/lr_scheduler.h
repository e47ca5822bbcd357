// Learning-rate schedulers, following PyTorch 1.13's torch.optim.lr_scheduler.
//
// A scheduler rewrites the "lr" of every parameter group of an optimizer once per step(). As in
// PyTorch, constructing one stores each group's "initial_lr" (when last_epoch is -1) and makes
// the initial step (last_epoch becomes 0), and step() uses the recursive ("chainable") form of
// the schedule, which computes the new lr from the group's current one, so several schedulers
// can act on one optimizer and the lrs equal PyTorch's to rounding.
//
//   tvc::optim::SGD opt(params, {.lr = 0.1});
//   tvc::optim::lr_scheduler::StepLR sched(opt, /*step_size=*/30);
//   for (epoch...) { train(opt); sched.step(); }
//
// A scheduler keeps a reference to its optimizer, which must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tvc/optim.h"

namespace tvc::optim::lr_scheduler {

// The progress of a scheduler. Its hyper-parameters (step_size, T_max, ...) are given at
// construction and not part of it.
struct SchedulerStateDict {
  int64_t last_epoch = -1;
  int64_t step_count = 0;
  std::vector<double> base_lrs{};                // one per parameter group
  std::vector<double> last_lr{};                 // one per parameter group
  std::vector<SchedulerStateDict> schedulers{};  // SequentialLR: those of its schedulers
};

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances last_epoch by one and sets every group's lr. Throws tvc::Error when parameter
  // groups were added to the optimizer since the scheduler was made.
  void step();
  // The lrs set by the last step, one per parameter group.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  Optimizer& optimizer() const { return *optimizer_; }

  virtual SchedulerStateDict state_dict() const;
  // Restores the progress saved by state_dict; throws tvc::Error when the group count differs.
  // The optimizer's lrs are restored by its own load_state_dict.
  virtual void load_state_dict(const SchedulerStateDict& dict);

 protected:
  // last_epoch -1 starts a schedule (storing "initial_lr" in groups that lack it); another value
  // resumes one and needs "initial_lr" in every group. base_lrs are the groups' initial_lr.
  LRScheduler(Optimizer& optimizer, int64_t last_epoch);
  // The initial step; the constructor of every concrete scheduler ends with it.
  void initial_step();
  // The new lr of each group in the recursive form (called by step() after last_epoch was
  // advanced; may also update other hyper-parameters, as OneCycleLR does with momentum).
  virtual std::vector<double> get_lr() = 0;
  // The lrs at last_epoch in closed form, for schedulers that have one (used by SequentialLR
  // when it switches to a scheduler, as PyTorch's step(epoch)).
  virtual std::optional<std::vector<double>> get_closed_form_lr() const { return std::nullopt; }
  // The current lr of every group.
  std::vector<double> group_lrs() const;
  // Throws tvc::Error when dict does not fit this scheduler (group count, sub-schedulers).
  virtual void check_state_dict(const SchedulerStateDict& dict) const;

  Optimizer* optimizer_;
  int64_t last_epoch_;
  int64_t step_count_ = 0;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;

 private:
  friend class SequentialLR;
  // Sets last_epoch to epoch and the lrs by the closed form (or get_lr() without one).
  void step_to(int64_t epoch);
  // Throws when groups were added to the optimizer after the scheduler was made.
  void check_group_count() const;
  void apply(const std::vector<double>& lrs);
};

// lr *= gamma every step_size epochs.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1, int64_t last_epoch = -1);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> get_closed_form_lr() const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr *= gamma at each milestone epoch (a milestone listed k times multiplies by gamma^k).
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1, int64_t last_epoch = -1);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> get_closed_form_lr() const override;

 private:
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

// The lr factor goes linearly from start_factor to end_factor over total_iters epochs, then
// stays. Factors in [0, 1], start_factor > 0.
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5,
           int64_t last_epoch = -1);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> get_closed_form_lr() const override;

 private:
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

// lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2, computed recursively
// as PyTorch does (beyond T_max it rises again).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0, int64_t last_epoch = -1);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> get_closed_form_lr() const override;

 private:
  int64_t T_max_;
  double eta_min_;
};

// The 1cycle policy. Values given as lists hold one per parameter group, or one for all.
struct OneCycleLROptions {
  std::vector<double> max_lr{};  // required
  int64_t total_steps = 0;       // or epochs * steps_per_epoch when 0
  int64_t epochs = 0;
  int64_t steps_per_epoch = 0;
  double pct_start = 0.3;               // fraction of the steps spent raising the lr
  std::string anneal_strategy = "cos";  // "cos" or "linear"
  bool cycle_momentum = true;           // momentum (or Adam's beta1) moves opposite to lr
  std::vector<double> base_momentum = {0.85};
  std::vector<double> max_momentum = {0.95};
  double div_factor = 25;         // initial_lr = max_lr / div_factor
  double final_div_factor = 1e4;  // min_lr = initial_lr / final_div_factor
  bool three_phase = false;       // lr back down to initial_lr before annihilating it
  int64_t last_epoch = -1;
};

// lr rises from initial_lr to max_lr, then falls to min_lr (two phases; three with three_phase)
// over total_steps steps. Stores initial_lr, max_lr, min_lr (and max_momentum, base_momentum)
// in the groups, as PyTorch does. Stepping past total_steps throws.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, OneCycleLROptions options);
  int64_t total_steps() const { return total_steps_; }

 protected:
  std::vector<double> get_lr() override;

 private:
  struct Phase {
    double end_step{};
    std::string start_lr{}, end_lr{}, start_momentum{}, end_momentum{};  // group option names
  };
  double anneal(double start, double end, double pct) const;
  int64_t total_steps_;
  std::vector<Phase> phases_;
  bool cosine_;
  bool cycle_momentum_;
  bool use_beta1_ = false;
};

// Runs schedulers one after another: schedulers[i] is active from milestones[i-1] on (given in
// increasing order; one fewer than schedulers). Switching to a scheduler restarts it at epoch 0.
// All schedulers must act on optimizer.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones, int64_t last_epoch = -1);

  SchedulerStateDict state_dict() const override;
  void load_state_dict(const SchedulerStateDict& dict) override;

 protected:
  void check_state_dict(const SchedulerStateDict& dict) const override;
  // Steps the active scheduler and returns its lrs.
  std::vector<double> get_lr() override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

}  // namespace tvc::optim::lr_scheduler
