// The MPI world under mpirun (tests/meson.build runs it with 2 ranks): all_reduce_sum gives
// every rank the exact sum, identical bit for bit on every rank; broadcast copies the root's
// tensor; errors are tvc::Error, not aborts.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tvc/dist/communicator.h"
#include "tvc/dist/data_parallel.h"
#include "tvc/dist/sync_batch_norm.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"
#include "tvc/optim.h"

namespace tvc::dist {
namespace {

TEST(DistMpi, AllReduceAndBroadcast) {
  ASSERT_TRUE(launched_with_ranks()) << "run under mpirun with 2 or more ranks";
  CommunicatorPtr w = world();
  ASSERT_EQ(w->backend(), "mpi");
  const int rank = w->rank(), size = w->size();
  ASSERT_GE(size, 2);

  // Integers sum exactly: rank r contributes r * 1000 + i.
  Tensor ints = arange(rank * 1000.0, rank * 1000.0 + 100);
  w->all_reduce_sum(ints);
  for (int64_t i = 0; i < 100; ++i)
    EXPECT_EQ(ints[i].item<int64_t>(), i * size + 1000 * static_cast<int64_t>(size) * (size - 1) / 2);

  // Floats: the same bits on every rank (rank 0's result broadcast and compared).
  manual_seed(100 + static_cast<uint64_t>(rank));
  Tensor x = randn({1000});
  w->all_reduce_sum(x);
  Tensor from_root = x.clone();
  w->broadcast(from_root, 0);
  EXPECT_EQ(x.to_vector(), from_root.to_vector());
  // And the sum in rank order of the ranks' own values (gathered through broadcasts).
  std::vector<double> expected(1000, 0.0);
  for (int r = 0; r < size; ++r) {
    manual_seed(100 + static_cast<uint64_t>(r));
    Tensor theirs = randn({1000});
    std::vector<double> v = theirs.to_vector();
    for (size_t i = 0; i < v.size(); ++i)
      expected[i] = r == 0 ? v[i] : static_cast<double>(static_cast<float>(expected[i]) + static_cast<float>(v[i]));
  }
  EXPECT_EQ(x.to_vector(), expected);

  // broadcast from the last rank.
  Tensor b = full({3}, rank, {.dtype = DType::Float64});
  w->broadcast(b, size - 1);
  EXPECT_EQ(b.to_vector(), std::vector<double>(3, size - 1.0));
  w->barrier();
}

// A small MLP; seed picks its initial weights.
std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 4)});
}

double rel_error(const Tensor& a, const Tensor& b) {  // ||a - b||2 / ||b||2
  std::vector<double> x = a.to_vector(), y = b.to_vector();
  double diff = 0, ref = 0;
  for (size_t i = 0; i < x.size(); ++i) diff += (x[i] - y[i]) * (x[i] - y[i]), ref += y[i] * y[i];
  return std::sqrt(diff / ref);
}

TEST(DistMpi, DataParallelStepsEqualTheGlobalBatch) {
  CommunicatorPtr w = world();
  const int rank = w->rank(), size = w->size();
  constexpr int64_t kBatch = 8;
  ASSERT_EQ(kBatch % size, 0);
  // Every rank starts from different weights: DataParallel gives them rank 0's.
  auto model = mlp(rank == 0 ? 1 : 50 + static_cast<uint64_t>(rank));
  DataParallel dp(*model, w, /*bucket_bytes=*/256);  // several buckets
  auto reference = mlp(1);                           // the single process, on the whole batch
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
  manual_seed(7);  // the same data on every rank
  for (int step = 0; step < 5; ++step) {
    Tensor x = randn({kBatch, 6}), y = randint(0, 4, {kBatch});
    std::vector<int64_t> order(kBatch);
    for (int64_t i = 0; i < kBatch; ++i) order[static_cast<size_t>(i)] = i;
    std::vector<int64_t> mine = shard(order, size, rank);
    Tensor idx = tensor(mine);
    opt.zero_grad();
    cross_entropy((*model)(index_select(x, 0, idx)), index_select(y, 0, idx)).backward();
    dp.average_gradients();
    opt.step();
    ref_opt.zero_grad();
    cross_entropy((*reference)(x), y).backward();
    ref_opt.step();
  }
  auto params = model->named_parameters(), ref = reference->named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LT(rel_error(params[i].second, ref[i].second), 1e-6) << params[i].first;
    // Identical bits on every rank: rank 0's copy compared.
    Tensor root = params[i].second.detach().clone();
    w->broadcast(root, 0);
    EXPECT_EQ(params[i].second.to_vector(), root.to_vector()) << params[i].first;
  }
}

TEST(DistMpi, SyncBatchNormEqualsTheGlobalBatch) {
  // conv -> batch norm -> relu -> mean -> linear, float64: each rank's share with SyncBatchNorm
  // and averaged gradients equals one process on the whole batch with batch_norm.
  CommunicatorPtr w = world();
  const int rank = w->rank(), size = w->size();
  constexpr int64_t kBatch = 8;
  manual_seed(3);
  const TensorOptions f64{.dtype = DType::Float64};
  Tensor x = randn({kBatch, 3, 6, 6}, f64), y = randint(0, 5, {kBatch});
  Tensor conv = randn({4, 3, 3, 3}, f64), gamma = add(rand({4}, f64), full({4}, 0.5, f64)), beta = randn({4}, f64),
         fc = randn({5, 4}, f64);
  std::vector<Tensor> params{conv, gamma, beta, fc};
  auto loss_of = [&](const Tensor& images, const Tensor& labels, bool sync, Tensor& rm, Tensor& rv) {
    Tensor h = conv2d(images, params[0], Tensor(), {1, 1}, {1, 1});
    h = sync ? sync_batch_norm(h, rm, rv, params[1], params[2], true, 0.1, 1e-5, w)
             : batch_norm(h, rm, rv, params[1], params[2], true, 0.1, 1e-5);
    return cross_entropy(linear(relu(h).mean({2, 3}), params[3]), labels);
  };
  auto grads = [&](bool sync, const Tensor& images, const Tensor& labels, Tensor& rm, Tensor& rv) {
    std::vector<Tensor> leaves;
    for (Tensor& p : params) leaves.push_back(p.detach().clone().requires_grad_(true));
    std::swap(leaves, params);
    loss_of(images, labels, sync, rm, rv).backward();
    std::vector<Tensor> out;
    for (const Tensor& p : params) out.push_back(p.grad());
    std::swap(leaves, params);
    return out;
  };
  std::vector<int64_t> order(kBatch);
  for (int64_t i = 0; i < kBatch; ++i) order[static_cast<size_t>(i)] = i;
  Tensor idx = tensor(shard(order, size, rank));
  Tensor rm = zeros({4}, f64), rv = ones({4}, f64), ref_rm = zeros({4}, f64), ref_rv = ones({4}, f64);
  std::vector<Tensor> mine = grads(true, index_select(x, 0, idx), index_select(y, 0, idx), rm, rv);
  std::vector<Tensor> whole = grads(false, x, y, ref_rm, ref_rv);
  for (size_t i = 0; i < mine.size(); ++i) {
    Tensor g = mine[i].contiguous().clone();
    w->all_reduce_sum(g);  // DataParallel's average
    EXPECT_LT(rel_error(g / static_cast<double>(size), whole[i]), 1e-12) << "parameter " << i;
  }
  EXPECT_LT(rel_error(rm, ref_rm), 1e-12);
  EXPECT_LT(rel_error(rv, ref_rv), 1e-12);
}

// conv -> BatchNorm2d -> relu -> pool -> linear; seed picks the initial weights.
std::shared_ptr<nn::Sequential> conv_net(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(3, 4, 3, nn::ConvOptions{.padding = 1}), std::make_shared<nn::BatchNorm2d>(4),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::AdaptiveAvgPool2d>(1), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(4, 5)});
}

TEST(DistMpi, SyncBatchNormModulesTrainLikeTheGlobalBatch) {
  // convert_sync_batchnorm + DataParallel, three SGD steps on each rank's share of a batch whose
  // size the ranks do not divide (each loss scaled by share * ranks / batch): the weights and
  // running statistics of one process on the whole batch, on every rank.
  CommunicatorPtr w = world();
  const int rank = w->rank(), size = w->size();
  const int64_t batch = 4 * size + 1;
  auto model = conv_net(5);
  ASSERT_EQ(convert_sync_batchnorm(*model, w), 1);
  EXPECT_EQ((*model)[1]->type_name(), "SyncBatchNorm");
  DataParallel dp(*model, w);
  auto reference = conv_net(5);
  EXPECT_EQ(model->state_dict().keys(), reference->state_dict().keys());
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
  manual_seed(9);
  std::vector<int64_t> order(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) order[static_cast<size_t>(i)] = i;
  std::vector<int64_t> mine;  // positions rank, rank + size, ...: unequal shares
  for (int64_t i = rank; i < batch; i += size) mine.push_back(i);
  for (int step = 0; step < 3; ++step) {
    Tensor x = randn({batch, 3, 5, 5}), y = randint(0, 5, {batch});
    Tensor idx = tensor(mine);
    opt.zero_grad();
    Tensor loss = cross_entropy((*model)(index_select(x, 0, idx)), index_select(y, 0, idx));
    (loss * (static_cast<double>(mine.size()) * size / static_cast<double>(batch))).backward();
    dp.average_gradients();
    opt.step();
    ref_opt.zero_grad();
    cross_entropy((*reference)(x), y).backward();
    ref_opt.step();
  }
  nn::StateDict got = model->state_dict(), want = reference->state_dict();
  for (const auto& [name, t] : want) {
    if (t.dtype() == DType::Int64) {
      EXPECT_EQ(got.at(name).item<int64_t>(), t.item<int64_t>()) << name;
      continue;
    }
    EXPECT_LT(rel_error(got.at(name), t), 1e-5) << name;
    Tensor root = got.at(name).detach().clone();
    w->broadcast(root, 0);
    EXPECT_EQ(got.at(name).to_vector(), root.to_vector()) << name;
  }
}

}  // namespace
}  // namespace tvc::dist
