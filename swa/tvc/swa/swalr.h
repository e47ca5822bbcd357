// SWALR: the learning-rate schedule of the SWA phase (torch.optim.swa_utils.SWALR).
//
// Anneals each parameter group's lr from its value when the scheduler starts to that group's
// swa_lr over anneal_epochs steps, then holds it:
//   t = clamp(step / max(1, anneal_epochs), 0, 1), alpha = anneal(t) with
//   anneal = (1 - cos(pi t)) / 2 (cos) or t (linear), lr = swa_lr * alpha + lr_0 * (1 - alpha),
// in PyTorch's recursive form (lr_0 is recovered from the group's current lr and the previous
// alpha), so it composes with other schedulers on the same optimizer (SequentialLR) and its lrs
// equal PyTorch's to rounding. Each group gets "swa_lr" among its options, as in PyTorch.
//
//   tvc::swa::SWALR swa_scheduler(optimizer, /*swa_lr=*/0.05, /*anneal_epochs=*/5);
//   for (epoch...) { train(); if (epoch > swa_start) { swa.update_parameters(model); swa_scheduler.step(); } }
#pragma once

#include <cstdint>
#include <vector>

#include "tvc/lr_scheduler.h"

namespace tvc::swa {

enum class AnnealStrategy { cos, linear };

class SWALR : public optim::lr_scheduler::LRScheduler {
 public:
  // One swa_lr for every group.
  SWALR(optim::Optimizer& optimizer, double swa_lr, int64_t anneal_epochs = 10,
        AnnealStrategy anneal_strategy = AnnealStrategy::cos, int64_t last_epoch = -1);
  // One swa_lr per parameter group (the count must match).
  SWALR(optim::Optimizer& optimizer, const std::vector<double>& swa_lrs, int64_t anneal_epochs = 10,
        AnnealStrategy anneal_strategy = AnnealStrategy::cos, int64_t last_epoch = -1);

  int64_t anneal_epochs() const { return anneal_epochs_; }
  AnnealStrategy anneal_strategy() const { return anneal_strategy_; }

 protected:
  std::vector<double> get_lr() override;

 private:
  double anneal(double t) const;
  int64_t anneal_epochs_;
  AnnealStrategy anneal_strategy_;
};

}  // namespace tvc::swa
