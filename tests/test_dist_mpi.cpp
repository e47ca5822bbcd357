// The MPI world under mpirun (tests/meson.build runs it with 2 ranks): all_reduce_sum gives
// every rank the exact sum, identical bit for bit on every rank; broadcast copies the root's
// tensor; errors are tvc::Error, not aborts.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tvc/dist/communicator.h"
#include "tvc/ops.h"

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

}  // namespace
}  // namespace tvc::dist
