// The differentiable all-reduce and SyncBatchNorm's forward, from differentiable ops.
#include "tvc/dist/sync_batch_norm.h"

#include "tvc/autograd.h"
#include "tvc/ops.h"

namespace tvc::dist {

Tensor all_reduce_sum(const Tensor& x, const CommunicatorPtr& comm) {
  TVC_CHECK(comm != nullptr, "all_reduce_sum: no communicator");
  Tensor sum = x.detach().contiguous().clone();
  comm->all_reduce_sum(sum);
  return record_function("AllReduceSumBackward", {x}, {sum}, [comm](const std::vector<Tensor>& grads) {
    Tensor g = grads[0].contiguous().clone();
    comm->all_reduce_sum(g);
    return std::vector<Tensor>{g};
  })[0];
}

Tensor sync_batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps, const CommunicatorPtr& comm) {
  TVC_CHECK(x.dim() >= 2, "sync_batch_norm: input of shape ", x.shape(), " has no channel dimension");
  if (!training) return batch_norm(x, running_mean, running_var, weight, bias, false, momentum, eps);
  const int64_t channels = x.shape()[1];
  Shape reduce_dims{0}, channel_shape(static_cast<size_t>(x.dim()), 1);
  for (int64_t d = 2; d < x.dim(); ++d) reduce_dims.push_back(d);
  channel_shape[1] = channels;
  // The count travels with the sums, so ranks with different batch sizes agree on it.
  Tensor count = full({1}, static_cast<double>(x.numel() / std::max<int64_t>(channels, 1)), {.dtype = x.dtype()});
  Tensor sums = all_reduce_sum(cat({x.sum(reduce_dims), count}), comm);
  const double total = sums.narrow(0, channels, 1).item<double>();
  TVC_CHECK(total > 0, "sync_batch_norm: no element in any rank's batch");
  Tensor mean = sums.narrow(0, 0, channels) / total;
  Tensor centered = x - mean.reshape(channel_shape);
  Tensor var = all_reduce_sum((centered * centered).sum(reduce_dims), comm) / total;  // biased
  Tensor y = centered * rsqrt(var + eps).reshape(channel_shape);
  if (weight.defined()) y = y * weight.reshape(channel_shape);
  if (bias.defined()) y = y + bias.reshape(channel_shape);
  if (running_mean.defined() && running_var.defined()) {
    NoGradGuard no_grad;
    Tensor(running_mean).copy_(running_mean * (1 - momentum) + mean.detach() * momentum);
    const double unbiased = total > 1 ? total / (total - 1) : 1.0;
    Tensor(running_var).copy_(running_var * (1 - momentum) + var.detach() * (momentum * unbiased));
  }
  return y;
}

SyncBatchNorm::SyncBatchNorm(int64_t num_features, const nn::BatchNormOptions& options, CommunicatorPtr comm)
    : Cloneable(num_features, options), comm_(std::move(comm)) {
  TVC_CHECK(comm_ != nullptr, "SyncBatchNorm: no communicator");
}

void SyncBatchNorm::check_input_dim(const Tensor& x) const {
  TVC_CHECK(x.dim() >= 2, "SyncBatchNorm: expected an input of 2 or more dimensions (got shape ", x.shape(), ")");
}

Tensor SyncBatchNorm::forward(const Tensor& x) {
  if (!is_training()) return BatchNorm::forward(x);
  check_input_dim(x);
  double factor = 0;  // the running statistics' update factor, as BatchNorm's
  if (track_running_stats) {
    NoGradGuard no_grad;
    Tensor(num_batches_tracked()).add_(1);
    factor = momentum ? momentum->to_double() : 1.0 / static_cast<double>(num_batches_tracked().item<int64_t>());
  }
  return sync_batch_norm(x, running_mean(), running_var(), weight(), bias(), true, factor, eps.to_double(), comm_);
}

int64_t convert_sync_batchnorm(nn::Module& module, const CommunicatorPtr& comm) {
  int64_t converted = 0;
  for (const auto& [name, child] : module.named_modules()) {
    auto* bn = dynamic_cast<nn::BatchNorm*>(child.get());
    if (name.empty() || bn == nullptr || dynamic_cast<SyncBatchNorm*>(bn) != nullptr) continue;
    auto sync = std::make_shared<SyncBatchNorm>(bn->num_features,
                                                nn::BatchNormOptions{.eps = bn->eps,
                                                                     .momentum = bn->momentum,
                                                                     .affine = bn->affine,
                                                                     .track_running_stats = bn->track_running_stats},
                                                comm);
    for (const auto& [key, p] : bn->named_parameters("", /*recurse=*/false))
      sync->register_parameter(key, p, p.requires_grad());
    for (const auto& [key, b] : bn->named_buffers("", /*recurse=*/false)) sync->register_buffer(key, b);
    sync->train(bn->is_training());
    module.set_submodule(name, sync);
    ++converted;
  }
  return converted;
}

}  // namespace tvc::dist
