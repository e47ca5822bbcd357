// What the builder's parts share (hybrid/src only).
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "tvc/hybrid/hybrid.h"
#include "tvc/models/models.h"

namespace tvc::hybrid::detail {

struct BuiltHybrid {
  HybridModelPtr model;
  // Each key of the torchvision model's state_dict (before patches) -> the hybrid's key of the
  // same tensor; the classifier's keys -> the new Linear's.
  std::map<std::string, std::string> torchvision_names;
};

// The hybrid of model (a torchvision backbone, consumed: its modules move into the hybrid) with
// patches applied and a new head; what was patched and initialised is written to log.
BuiltHybrid build_hybrid(models::BackbonePtr model, const std::vector<Patch>& patches, int64_t num_classes,
                         double dropout, std::ostream* log);

// The number of parameter elements of module (recursively).
int64_t parameter_count(const nn::Module& module);
// 1234567 -> "1,234,567" (Python's f"{n:,}").
std::string thousands(int64_t n);

}  // namespace tvc::hybrid::detail
