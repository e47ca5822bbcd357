// Backbone::forward_stages, derived from each model's stage_nodes() (see tvc/models/models.h).
#include "registry.h"

namespace tvc::models {

std::vector<std::pair<std::string, Tensor>> Backbone::forward_stages(const Tensor& x) {
  const std::vector<std::string> nodes = stage_nodes();
  std::vector<Tensor> outputs(nodes.size());
  nn::ScopedHooks hooks;  // removed however the forward pass ends
  for (size_t i = 0; i < nodes.size(); ++i)
    hooks.add(get_submodule(nodes[i])->register_forward_hook(
        [&outputs, i](nn::Module&, const nn::TensorList&,
                      const nn::TensorList& output) -> std::optional<nn::TensorList> {
          // The first call's output, copied: a later in-place op (ReLU(inplace)) must not change it.
          if (!outputs[i].defined() && !output.empty()) outputs[i] = output[0].clone();
          return std::nullopt;
        }));
  (*this)(x);
  std::vector<std::pair<std::string, Tensor>> stages;
  for (size_t i = 0; i < nodes.size(); ++i) {
    TVC_CHECK(outputs[i].defined(), model_name(), ".forward_stages: the stage node '", nodes[i], "' (",
              get_submodule(nodes[i])->type_name(), ") did not run in forward");
    stages.emplace_back(nodes[i], outputs[i]);
  }
  return stages;
}

}  // namespace tvc::models
