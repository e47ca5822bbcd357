#include "registry.h"

namespace tvc::models::detail {

std::vector<std::pair<std::string, Tensor>> sequential_stages(nn::Module& features, const std::string& prefix,
                                                              const Tensor& x, const std::vector<std::string>& stages) {
  std::vector<std::pair<std::string, Tensor>> out;
  Tensor y = x;
  size_t next = 0;
  for (const auto& [name, child] : features.named_children()) {
    if (next == stages.size()) break;
    y = child->forward(y);
    if (name == stages[next]) out.emplace_back(prefix + "." + name, y), ++next;
  }
  TVC_CHECK(next == stages.size(), "forward_stages: ", prefix, " has no child '", stages[next], "'");
  return out;
}

}  // namespace tvc::models::detail
