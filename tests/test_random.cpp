// Random numbers: distributions, seeding, saved/restored state, thread-count independence.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "compare.h"
#include "tvc/ops.h"

using namespace tvc;

TEST(Random, Distributions) {
  Generator gen(123);
  const int64_t n = 200000;
  Tensor u = rand({n}, {.dtype = DType::Float64}, &gen);
  EXPECT_NEAR(mean(u).item<double>(), 0.5, 0.005);
  EXPECT_NEAR(var(u).item<double>(), 1.0 / 12, 0.002);
  EXPECT_GE(amin(u).item<double>(), 0.0);
  EXPECT_LT(amax(u).item<double>(), 1.0);
  Tensor z = randn({n}, {.dtype = DType::Float64}, &gen);
  EXPECT_NEAR(mean(z).item<double>(), 0.0, 0.01);
  EXPECT_NEAR(tvc::std(z).item<double>(), 1.0, 0.01);
  Tensor r = randint(-3, 4, {n}, {.dtype = DType::Int64}, &gen);
  EXPECT_EQ(amin(r).item<int64_t>(), -3);
  EXPECT_EQ(amax(r).item<int64_t>(), 3);
  EXPECT_NEAR(mean(r.to(DType::Float64)).item<double>(), 0.0, 0.02);
  Tensor b = bernoulli(full({n}, 0.3, {.dtype = DType::Float64}), &gen);
  EXPECT_NEAR(mean(b).item<double>(), 0.3, 0.005);
  Tensor p = randperm(1000, &gen);
  EXPECT_EQ(sum(p).item<int64_t>(), 999 * 1000 / 2);
  EXPECT_EQ(topk(p, 1000, 0, false).first.to_vector(), arange(1000).to_vector());
}

// randint is exact for int64 ranges a double cannot hold: 2^62 + {0, 1, 2} are told apart, and
// the whole int64 range gives both signs.
TEST(Random, RandintIsExactForWideInt64Ranges) {
  Generator gen(5);
  const int64_t base = int64_t{1} << 62;
  Tensor r = randint(base, base + 3, {300}, {.dtype = DType::Int64}, &gen);
  const int64_t* v = r.data_ptr<int64_t>();
  int counts[3] = {0, 0, 0};
  for (int64_t i = 0; i < r.numel(); ++i) {
    ASSERT_TRUE(v[i] >= base && v[i] < base + 3) << v[i];
    ++counts[v[i] - base];
  }
  for (int c : counts) EXPECT_GT(c, 50);
  Tensor all = randint(INT64_MIN, INT64_MAX, {1000}, {.dtype = DType::Int64}, &gen);
  EXPECT_LT(amin(all).item<int64_t>(), -(int64_t{1} << 60));
  EXPECT_GT(amax(all).item<int64_t>(), int64_t{1} << 60);
  Tensor odd = randint(-(int64_t{1} << 53) - 1, -(int64_t{1} << 53) + 1, {200}, {.dtype = DType::Int64}, &gen);
  EXPECT_EQ(amin(odd).item<int64_t>(), -(int64_t{1} << 53) - 1);  // not representable as a double
}

TEST(Random, SeedAndStateReproduce) {
  manual_seed(7);
  Tensor a = randn({5});
  Generator::State s = default_generator().state();
  Tensor b = randn({5});
  default_generator().set_state(s);
  Tensor c = randn({5});
  manual_seed(7);
  Tensor d = randn({5});
  EXPECT_EQ(tvc::test::relative_error(b, c), 0);
  EXPECT_EQ(tvc::test::relative_error(a, d), 0);
  EXPECT_GT(tvc::test::relative_error(a, b), 0.1);
}

TEST(Random, IndependentOfThreadCount) {
  Generator g1(99), g2(99);
  set_num_threads(1);
  Tensor a = randn({100000}, {}, &g1);
  set_num_threads(2);
  Tensor b = randn({100000}, {}, &g2);
  EXPECT_EQ(tvc::test::relative_error(a, b), 0);
}

TEST(Random, DropoutScalesKeptElements) {
  Generator gen(5);
  Tensor x = ones({10000}, {.dtype = DType::Float64});
  Tensor y = dropout(x, 0.25, true, &gen);
  double kept = mean(gt(y, scalar_like(0, DType::Float64)).to(DType::Float64)).item<double>();
  EXPECT_NEAR(kept, 0.75, 0.02);
  EXPECT_NEAR(amax(y).item<double>(), 1 / 0.75, 1e-12);
  EXPECT_EQ(tvc::test::relative_error(dropout(x, 0.25, false, &gen), x), 0);
  EXPECT_THROW(dropout(x, 1.5, true), Error);
}
