// Batch statistics over the ranks of a data-parallel job (PyTorch's SyncBatchNorm), and the
// differentiable all-reduce it is built from.
#pragma once

#include "tvc/dist/communicator.h"
#include "tvc/nn/layers.h"

namespace tvc::dist {

// x summed over the ranks as a differentiable op: every rank gets the sum, and the gradient of
// each rank's x is the sum over the ranks of the output's gradients. Every rank must call it
// (and run backward) in the same order. x: float32 or float64.
Tensor all_reduce_sum(const Tensor& x, const CommunicatorPtr& comm);

// Batch norm of x (N, C, ...) whose statistics are those of all ranks' batches together: in
// training, the per-channel mean, then the mean squared deviation from it (two all-reduces, as
// a single process computes them), running statistics updated with the whole batch's unbiased
// variance (momentum as nn::BatchNorm2d's); gradients flow through the shared statistics. In
// eval, the running statistics (no communication). N may differ between ranks.
Tensor sync_batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps, const CommunicatorPtr& comm);

// PyTorch's SyncBatchNorm: a BatchNorm of x (N, C, ...) that, in training, normalises with the
// statistics of every rank's batch together (sync_batch_norm) and updates its running
// statistics with them; in eval, a BatchNorm. The same parameters, buffers and state_dict names
// as nn::BatchNorm1d/2d (weight, bias, running_mean, running_var, num_batches_tracked).
class SyncBatchNorm : public nn::Cloneable<SyncBatchNorm, nn::BatchNorm> {
 public:
  SyncBatchNorm(int64_t num_features, const nn::BatchNormOptions& options, CommunicatorPtr comm);
  Tensor forward(const Tensor& x) override;

 protected:
  void check_input_dim(const Tensor& x) const override;

 private:
  CommunicatorPtr comm_;
};

// Replaces every BatchNorm1d/2d inside module (not module itself) with a SyncBatchNorm of the
// same options holding the same parameter and buffer tensors (so an optimizer made before keeps
// working) and the same training mode (PyTorch's convert_sync_batchnorm). Returns how many.
int64_t convert_sync_batchnorm(nn::Module& module, const CommunicatorPtr& comm);

}  // namespace tvc::dist
