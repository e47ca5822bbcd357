// The distributed layer on one process (tvc/dist/communicator.h): PyTorch's DistributedSampler
// shares, the single-process world and launcher detection. test_dist_mpi.cpp runs the MPI world
// under mpirun.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "test_helpers.h"
#include "torch_golden.h"
#include "tvc/dist/communicator.h"
#include "tvc/ops.h"

namespace tvc::dist {
namespace {

using ::testing::HasSubstr;

TEST(Dist, ShardsAreDistributedSamplers) {
  // list(DistributedSampler(range(n), R, rank, shuffle=False, drop_last=d)) for every case.
  nlohmann::json expected = test::torch_json(
      "import json\n"
      "from torch.utils.data import DistributedSampler\n"
      "out = {}\n"
      "for n in (1, 2, 5, 10, 12):\n"
      "  for R in (1, 2, 3, 4):\n"
      "    for rank in range(R):\n"
      "      for d in (False, True):\n"
      "        out[f'{n},{R},{rank},{int(d)}'] = list(DistributedSampler(range(n), R, rank, shuffle=False, "
      "drop_last=d))\n"
      "print(json.dumps(out))\n");
  ASSERT_FALSE(expected.empty());
  for (const auto& [key, indices] : expected.items()) {
    int n = 0, replicas = 0, rank = 0, drop_last = 0;
    ASSERT_EQ(std::sscanf(key.c_str(), "%d,%d,%d,%d", &n, &replicas, &rank, &drop_last), 4);
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    EXPECT_EQ(shard(order, replicas, rank, drop_last != 0), indices.get<std::vector<int64_t>>()) << key;
  }
  // The ranks' k-th batches of b together are the k-th batch of R * b of the padded order.
  std::vector<int64_t> order = {7, 3, 9, 1, 4, 0, 8, 2, 6, 5};
  std::vector<int64_t> r0 = shard(order, 2, 0), r1 = shard(order, 2, 1);
  std::vector<int64_t> first_global = {r0[0], r0[1], r1[0], r1[1]};
  std::sort(first_global.begin(), first_global.end());
  EXPECT_EQ(first_global, (std::vector<int64_t>{1, 3, 7, 9}));
  EXPECT_THAT(test::error_of([&] { shard(order, 2, 2); }), HasSubstr("shard: rank 2 of 2 replicas"));
}

TEST(Dist, SingleProcessWorld) {
  CommunicatorPtr w = single_process();
  EXPECT_EQ(w->rank(), 0);
  EXPECT_EQ(w->size(), 1);
  Tensor t = randn({5});
  Tensor before = t.clone();
  w->all_reduce_sum(t);
  EXPECT_EQ(t.to_vector(), before.to_vector());
  w->broadcast(t, 0);
  EXPECT_THAT(test::error_of([&] { w->broadcast(t, 1); }), HasSubstr("root 1 is not a rank"));
  Tensor half = randn({3}).to(DType::Float16);
  EXPECT_THAT(test::error_of([&] { w->all_reduce_sum(half); }), HasSubstr("float16 is not float32, float64 or int64"));
  Tensor strided = randn({4, 4}).t();
  EXPECT_THAT(test::error_of([&] { w->all_reduce_sum(strided); }), HasSubstr("contiguous CPU tensor"));
  // A test process is not launched by mpirun: its world is one process.
  EXPECT_FALSE(launched_with_ranks());
  EXPECT_EQ(world()->size(), 1);
}

TEST(Dist, LaunchersAreRecognised) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    setenv(name, "4", 1);
    EXPECT_TRUE(launched_with_ranks()) << name;
    setenv(name, "1", 1);
    EXPECT_FALSE(launched_with_ranks()) << name;
    unsetenv(name);
  }
}

}  // namespace
}  // namespace tvc::dist
