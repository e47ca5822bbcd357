// DataParallel: parameter broadcast and bucketed gradient averaging.
#include "tvc/dist/data_parallel.h"

#include "tvc/autograd.h"
#include "tvc/ops.h"

namespace tvc::dist {

DataParallel::DataParallel(nn::Module& module, CommunicatorPtr comm, int64_t bucket_bytes)
    : module_(module), comm_(std::move(comm)) {
  TVC_CHECK(comm_ != nullptr, "DataParallel: no communicator");
  TVC_CHECK(bucket_bytes > 0, "DataParallel: bucket_bytes must be > 0, got ", bucket_bytes);
  int64_t filled = 0;
  for (const auto& [name, p] : module_.named_parameters()) {
    if (!p.requires_grad()) continue;
    TVC_CHECK(p.dtype() == DType::Float32 || p.dtype() == DType::Float64, "DataParallel: parameter '", name,
              "' has dtype ", dtype_name(p.dtype()), " (float32 or float64 only)");
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    if (buckets_.empty() || filled + bytes > bucket_bytes || buckets_.back().front().dtype() != p.dtype()) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().push_back(p);
    filled += bytes;
  }
  broadcast_state();
}

void DataParallel::broadcast_state() {
  NoGradGuard no_grad;
  auto send = [&](const Tensor& t) {
    Tensor buffer = t.contiguous().clone();
    if (buffer.dtype() != DType::Float32 && buffer.dtype() != DType::Float64 && buffer.dtype() != DType::Int64)
      buffer = buffer.to(DType::Float64);  // exact for the integer and low-precision types tvc has
    comm_->broadcast(buffer, 0);
    Tensor(t).copy_(buffer);
  };
  for (const auto& [name, p] : module_.named_parameters()) send(p);
  for (const auto& [name, b] : module_.named_buffers())
    if (b.defined()) send(b);
}

void DataParallel::average_gradients() {
  NoGradGuard no_grad;
  const double ranks = comm_->size();
  for (const std::vector<Tensor>& bucket : buckets_) {
    std::vector<Tensor> grads;
    for (const Tensor& p : bucket) {
      Tensor g = p.grad();
      grads.push_back(g.defined() ? g.reshape({-1}) : zeros({p.numel()}, {.dtype = p.dtype()}));
    }
    Tensor flat = cat(grads).contiguous();
    if (comm_->size() > 1) comm_->all_reduce_sum(flat);
    flat = flat / ranks;
    int64_t offset = 0;
    for (const Tensor& p : bucket) {
      Tensor mean = flat.narrow(0, offset, p.numel()).reshape(p.shape()).clone();
      p.set_grad(mean);
      offset += p.numel();
    }
  }
}

}  // namespace tvc::dist
