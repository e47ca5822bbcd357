// update_bn (see tvc/swa/update_bn.h).
#include "tvc/swa/update_bn.h"

#include "tvc/autograd.h"
#include "tvc/nn/layers.h"

namespace tvc::swa {

int64_t update_bn(const std::function<std::optional<Tensor>()>& next_input, nn::Module& model,
                  std::optional<Device> device) {
  std::vector<std::pair<nn::BatchNorm*, std::optional<Scalar>>> momenta;
  for (const auto& [name, m] : model.named_modules())
    if (auto* bn = dynamic_cast<nn::BatchNorm*>(m.get())) {
      bn->reset_running_stats();
      momenta.emplace_back(bn, bn->momentum);
    }
  if (momenta.empty()) return 0;

  // Restores the momenta and the training flag however the pass ends.
  struct Restore {
    nn::Module& model;
    std::vector<std::pair<nn::BatchNorm*, std::optional<Scalar>>>& momenta;
    bool was_training;
    ~Restore() {
      for (auto& [bn, momentum] : momenta) bn->momentum = momentum;
      model.train(was_training);
    }
  } restore{model, momenta, model.is_training()};

  NoGradGuard no_grad;
  model.train();
  for (auto& [bn, momentum] : momenta) bn->momentum = std::nullopt;
  int64_t batches = 0;
  while (std::optional<Tensor> input = next_input()) {
    model(device ? input->to(*device) : *input);
    ++batches;
  }
  return batches;
}

}  // namespace tvc::swa
