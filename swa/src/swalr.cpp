// SWALR (see tvc/swa/swalr.h), with torch/optim/swa_utils.py's order of operations.
#include "tvc/swa/swalr.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tvc::swa {

namespace {

// Stores each group's swa_lr; the base constructor then reads the groups' lrs.
optim::Optimizer& with_swa_lrs(optim::Optimizer& optimizer, const std::vector<double>& swa_lrs, int64_t anneal_epochs) {
  auto& groups = optimizer.param_groups();
  TVC_CHECK(swa_lrs.size() == 1 || swa_lrs.size() == groups.size(), "SWALR: got ", swa_lrs.size(),
            " swa_lr values for ", groups.size(), " parameter groups (give one, or one per group)");
  TVC_CHECK(anneal_epochs >= 0, "SWALR: anneal_epochs must be >= 0, got ", anneal_epochs);
  for (size_t i = 0; i < groups.size(); ++i) {
    double lr = swa_lrs.size() == 1 ? swa_lrs[0] : swa_lrs[i];
    TVC_CHECK(std::isfinite(lr) && lr >= 0, "SWALR: swa_lr of param_groups[", i, "] must be >= 0, got ", lr);
    groups[i].options.set("swa_lr", lr);
  }
  return optimizer;
}

}  // namespace

SWALR::SWALR(optim::Optimizer& optimizer, double swa_lr, int64_t anneal_epochs, AnnealStrategy anneal_strategy,
             int64_t last_epoch)
    : SWALR(optimizer, std::vector<double>{swa_lr}, anneal_epochs, anneal_strategy, last_epoch) {}

SWALR::SWALR(optim::Optimizer& optimizer, const std::vector<double>& swa_lrs, int64_t anneal_epochs,
             AnnealStrategy anneal_strategy, int64_t last_epoch)
    : LRScheduler(with_swa_lrs(optimizer, swa_lrs, anneal_epochs), last_epoch),
      anneal_epochs_(anneal_epochs),
      anneal_strategy_(anneal_strategy) {
  initial_step();
}

double SWALR::anneal(double t) const {
  return anneal_strategy_ == AnnealStrategy::cos ? (1 - std::cos(std::numbers::pi * t)) / 2 : t;
}

std::vector<double> SWALR::get_lr() {
  int64_t step = step_count_ - 1;
  if (anneal_epochs_ == 0) step = std::max<int64_t>(1, step);
  const double span = static_cast<double>(std::max<int64_t>(1, anneal_epochs_));
  const double prev_t = std::max(0.0, std::min(1.0, static_cast<double>(step - 1) / span));
  const double prev_alpha = anneal(prev_t);
  const double t = std::max(0.0, std::min(1.0, static_cast<double>(step) / span));
  const double alpha = anneal(t);
  std::vector<double> lrs;
  for (const optim::ParamGroup& g : optimizer_->param_groups()) {
    const double lr = g.options.get_double("lr"), swa_lr = g.options.get_double("swa_lr");
    // The lr the annealing started from, recovered from the current lr and the previous alpha.
    const double initial = prev_alpha == 1 ? swa_lr : (lr - prev_alpha * swa_lr) / (1 - prev_alpha);
    lrs.push_back(swa_lr * alpha + initial * (1 - alpha));
  }
  return lrs;
}

}  // namespace tvc::swa
