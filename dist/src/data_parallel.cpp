// DataParallel: parameter broadcast and gradient averaging in buckets started from autograd's
// gradient hooks.
#include "tvc/dist/data_parallel.h"

#include <chrono>

#include "tvc/autograd.h"
#include "tvc/ops.h"

namespace tvc::dist {

DataParallel::DataParallel(nn::Module& module, CommunicatorPtr comm, int64_t bucket_bytes)
    : module_(module), comm_(std::move(comm)) {
  TVC_CHECK(comm_ != nullptr, "DataParallel: no communicator");
  TVC_CHECK(bucket_bytes > 0, "DataParallel: bucket_bytes must be > 0, got ", bucket_bytes);
  std::vector<std::pair<std::string, Tensor>> trainable;
  for (const auto& [name, p] : module_.named_parameters())
    if (p.requires_grad()) trainable.emplace_back(name, p);
  int64_t filled = 0;
  for (auto it = trainable.rbegin(); it != trainable.rend(); ++it) {
    const auto& [name, p] = *it;
    TVC_CHECK(p.dtype() == DType::Float32 || p.dtype() == DType::Float64, "DataParallel: parameter '", name,
              "' has dtype ", dtype_name(p.dtype()), " (float32 or float64 only)");
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    if (buckets_.empty() || filled + bytes > bucket_bytes || buckets_.back().params.front().dtype() != p.dtype()) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().params.push_back(p);
    filled += bytes;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].grads.resize(buckets_[b].params.size());
    for (size_t i = 0; i < buckets_[b].params.size(); ++i) {
      const Tensor& p = buckets_[b].params[i];
      hooks_.emplace_back(p, p.register_hook([this, b, i](const Tensor& grad) {
        on_gradient(b, i, grad);
        return Tensor();
      }));
    }
  }
  broadcast_state();
}

DataParallel::~DataParallel() {
  for (const auto& [p, handle] : hooks_) p.remove_hook(handle);
}

void DataParallel::broadcast_from_root(const std::vector<Tensor>& tensors) {
  NoGradGuard no_grad;
  // One broadcast per dtype: the tensors flattened into one buffer (other dtypes as float64,
  // exact for the integer and low-precision types tvc has).
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int64}) {
    std::vector<Tensor> group, flat;
    for (const Tensor& t : tensors) {
      const bool native = t.dtype() == DType::Float32 || t.dtype() == DType::Float64 || t.dtype() == DType::Int64;
      if (t.defined() && (native ? t.dtype() == dtype : dtype == DType::Float64)) {
        group.push_back(t);
        flat.push_back(t.reshape({-1}).to(dtype));
      }
    }
    if (group.empty()) continue;
    Tensor buffer = cat(flat).contiguous();
    comm_->broadcast(buffer, 0);
    int64_t offset = 0;
    for (const Tensor& t : group) {
      Tensor(t).copy_(buffer.narrow(0, offset, t.numel()).reshape(t.shape()));
      offset += t.numel();
    }
  }
}

void DataParallel::broadcast_state() {
  std::vector<Tensor> state = module_.parameters();
  for (const Tensor& b : module_.buffers()) state.push_back(b);
  broadcast_from_root(state);
}

void DataParallel::broadcast_buffers() { broadcast_from_root(module_.buffers()); }

void DataParallel::on_gradient(size_t bucket, size_t index, const Tensor& grad) {
  Bucket& b = buckets_[bucket];
  if (b.sum || b.grads[index].defined()) return;  // a second backward before average_gradients: kept out
  b.grads[index] = grad;
  b.ready += 1;
  start_ready_buckets();
  comm_->progress();
}

void DataParallel::start_ready_buckets() {
  while (next_bucket_ < buckets_.size() &&
         buckets_[next_bucket_].ready == static_cast<int64_t>(buckets_[next_bucket_].params.size()))
    start_bucket(buckets_[next_bucket_++]);
}

void DataParallel::start_bucket(Bucket& b) {
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (size_t i = 0; i < b.params.size(); ++i) {
    const Tensor& p = b.params[i];
    Tensor g = b.grads[i].defined() ? b.grads[i] : p.grad();
    grads.push_back(g.defined() ? g.reshape({-1}) : zeros({p.numel()}, {.dtype = p.dtype()}));
  }
  b.flat = cat(grads).contiguous();
  b.sum = comm_->start_all_reduce_sum(b.flat);
}

void DataParallel::average_gradients() {
  NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  while (next_bucket_ < buckets_.size()) start_bucket(buckets_[next_bucket_++]);
  const double ranks = comm_->size();
  for (Bucket& b : buckets_) {
    b.sum->wait();
    Tensor mean = b.flat / ranks;
    int64_t offset = 0;
    for (const Tensor& p : b.params) {
      p.set_grad(mean.narrow(0, offset, p.numel()).reshape(p.shape()).clone());
      offset += p.numel();
    }
    b.grads.assign(b.params.size(), Tensor());
    b.ready = 0;
    b.flat = Tensor();
    b.sum.reset();
  }
  next_bucket_ = 0;
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace tvc::dist
