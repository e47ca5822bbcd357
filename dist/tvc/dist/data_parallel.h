// Data-parallel training of one module replicated on every rank of a communicator:
//
//   tvc::dist::DataParallel dp(*model, tvc::dist::world());  // rank 0's weights on every rank
//   optimizer.zero_grad();
//   loss.backward();                                         // each rank on its share of the batch;
//                                                            // buckets are summed as backward goes
//   dp.average_gradients();                                  // every rank: the mean gradient
//   optimizer.step();                                        // identical weights everywhere
//
// With equal shares of a global batch and a loss that is a mean over the share, the averaged
// gradient is the global batch's, up to the order of the sums (unequal shares: scale each
// rank's loss by share * ranks / batch).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tvc/dist/communicator.h"
#include "tvc/nn/module.h"

namespace tvc::dist {

class DataParallel {
 public:
  // Keeps references to the module's trainable parameters (those at construction), groups them
  // into buckets of about bucket_bytes (each parameter whole, in reverse registration order:
  // the order backward produces their gradients), hooks them, and broadcasts rank 0's
  // parameters and buffers.
  DataParallel(nn::Module& module, CommunicatorPtr comm, int64_t bucket_bytes = int64_t{25} << 20);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Copies rank 0's parameters and buffers to every rank.
  void broadcast_state();
  // Copies rank 0's buffers (BatchNorm's running statistics) to every rank: with BatchNorm
  // statistics per rank, PyTorch DDP's broadcast_buffers.
  void broadcast_buffers();
  // Each trainable parameter's gradient becomes its mean over the ranks. During backward, a
  // bucket's sum starts as soon as autograd has computed all its gradients (buckets always
  // start in the same order on every rank); this completes them. A parameter backward gave no
  // gradient contributes its .grad as it is, or zeros without one; afterwards every rank has
  // one. Gradients must be cleared (zero_grad) before each backward: the sums carry that
  // backward's gradients.
  void average_gradients();

  const Communicator& communicator() const { return *comm_; }
  // Seconds average_gradients has spent waiting for the ranks' sums, since construction.
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Bucket {
    std::vector<Tensor> params;
    std::vector<Tensor> grads;  // this backward's, filled by the hooks
    int64_t ready = 0;
    Tensor flat;
    std::unique_ptr<PendingSum> sum;
  };
  void on_gradient(size_t bucket, size_t index, const Tensor& grad);
  void start_ready_buckets();
  void start_bucket(Bucket& b);
  void broadcast_from_root(const std::vector<Tensor>& tensors);

  nn::Module& module_;
  CommunicatorPtr comm_;
  std::vector<Bucket> buckets_;
  size_t next_bucket_ = 0;  // the next bucket to start (buckets start in order)
  std::vector<std::pair<Tensor, int>> hooks_;
  double wait_seconds_ = 0;
};

}  // namespace tvc::dist
