// Data-parallel training of one module replicated on every rank of a communicator:
//
//   tvc::dist::DataParallel dp(*model, tvc::dist::world());  // rank 0's weights on every rank
//   loss.backward();                                         // each rank on its share of the batch
//   dp.average_gradients();                                  // every rank: the mean gradient
//   optimizer.step();                                        // identical weights everywhere
//
// With equal shares of a global batch and a loss that is a mean over the share, the averaged
// gradient is the global batch's, up to the order of the sums.
#pragma once

#include <cstdint>
#include <vector>

#include "tvc/dist/communicator.h"
#include "tvc/nn/module.h"

namespace tvc::dist {

class DataParallel {
 public:
  // Keeps references to the module's parameters (registered at construction) and broadcasts
  // rank 0's parameters and buffers. bucket_bytes: gradients are exchanged in buckets of about
  // this size (each parameter whole), in registration order.
  DataParallel(nn::Module& module, CommunicatorPtr comm, int64_t bucket_bytes = int64_t{25} << 20);

  // Copies rank 0's parameters and buffers to every rank.
  void broadcast_state();
  // Each trainable parameter's gradient becomes its mean over the ranks (a rank without a
  // gradient for a parameter contributes zeros; afterwards every rank has one).
  void average_gradients();

  const Communicator& communicator() const { return *comm_; }

 private:
  nn::Module& module_;
  CommunicatorPtr comm_;
  std::vector<std::vector<Tensor>> buckets_;  // trainable parameters, grouped
};

}  // namespace tvc::dist
