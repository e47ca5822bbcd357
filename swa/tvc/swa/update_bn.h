// update_bn: recomputes BatchNorm running statistics for a model's current weights
// (torch.optim.swa_utils.update_bn), typically for an AveragedModel after SWA.
//
//   tvc::swa::update_bn(train_batches, *swa_model);   // batches: inputs or (input, target) pairs
#pragma once

#include <functional>
#include <optional>
#include <ranges>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tvc/nn/module.h"

namespace tvc::swa {

// The core: next_input() gives each batch's input tensor, std::nullopt at the end. Every
// BatchNorm of model (nn::BatchNorm: BatchNorm1d/2d) gets its running statistics reset
// (mean 0, var 1, num_batches_tracked 0) and momentum None (a cumulative average); model runs
// once over the batches in training mode without autograd; then each BatchNorm's momentum and
// the model's training flag are restored. Inputs are moved to device when given. A model
// without BatchNorm is left untouched and no batch is read. Returns the number of batches run.
int64_t update_bn(const std::function<std::optional<Tensor>()>& next_input, nn::Module& model,
                  std::optional<Device> device = std::nullopt);

namespace detail {
template <typename E>
const Tensor& batch_input(const E& batch) {
  if constexpr (std::is_convertible_v<const E&, const Tensor&>)
    return batch;
  else if constexpr (std::is_same_v<E, std::vector<Tensor>>) {
    TVC_CHECK(!batch.empty(), "update_bn: a batch is an empty list (expected [input, ...])");
    return batch.front();
  } else
    return std::get<0>(batch);  // std::pair / std::tuple: (input, target, ...)
}
}  // namespace detail

// Any range of batches: Tensor inputs, (input, target) pairs or tuples, or lists [input, ...]
// (Python's loader yielding tensors or lists/tuples; only the first element is used).
template <std::ranges::input_range Batches>
int64_t update_bn(Batches&& batches, nn::Module& model, std::optional<Device> device = std::nullopt) {
  auto it = std::ranges::begin(batches);
  auto end = std::ranges::end(batches);
  return update_bn(
      [&]() -> std::optional<Tensor> {
        if (it == end) return std::nullopt;
        Tensor input = detail::batch_input(*it);
        ++it;
        return input;
      },
      model, device);
}

}  // namespace tvc::swa
