// Concurrency (docs/embedding.md, "Threads"): one model serves eval forward passes from several
// threads at once, with and without grad mode, while other threads change the kernels' thread
// count, draw from the default generator and republish the kernel table (set_isa); every output
// equals the serial one, and concurrent draws share out the generator's counters exactly.
// tools/sanitize.sh runs this test under ThreadSanitizer (clang, LLVM's OpenMP with its Archer
// tool so that OpenMP's own synchronisation is understood), where it must be clean.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "tvc/autograd.h"
#include "tvc/internal/kernel.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"

namespace {

using namespace tvc;

std::vector<double> values(const Tensor& t) { return t.to_vector(); }

// A small ResNet-like stem and head: the convolution, batch norm, ReLU, pooling and linear
// kernels a backbone's forward runs, from the core alone (the TSan build compiles nothing else).
std::shared_ptr<nn::Sequential> small_cnn() {
  using std::make_shared;
  return make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      make_shared<nn::Conv2d>(3, 16, 3, nn::ConvOptions{.stride = 2, .padding = 1, .bias = false}),
      make_shared<nn::BatchNorm2d>(16), make_shared<nn::ReLU>(),
      make_shared<nn::MaxPool2d>(3, nn::MaxPool2dOptions{.stride = 2, .padding = 1}),
      make_shared<nn::Conv2d>(16, 32, 3, nn::ConvOptions{.padding = 1}), make_shared<nn::BatchNorm2d>(32),
      make_shared<nn::ReLU>(), make_shared<nn::AdaptiveAvgPool2d>(1), make_shared<nn::Flatten>(),
      make_shared<nn::Linear>(32, 10)});
}

TEST(Threads, OneModelServesEvalForwardsWhileSettingsChange) {
  manual_seed(11);
  auto model = small_cnn();
  model->eval();
  constexpr int kForwardThreads = 4, kPasses = 8;
  // Even threads run without autograd (convolution, batch norm and ReLU fused), odd ones with it
  // (the separate ops, which round differently): each is compared with a serial run in its mode.
  auto records_autograd = [](int t) { return t % 2 == 1; };
  std::vector<Tensor> inputs;
  std::vector<std::vector<double>> serial;
  for (int t = 0; t < kForwardThreads; ++t) {
    inputs.push_back(randn({2, 3, 64, 64}));
    std::optional<NoGradGuard> no_grad;
    if (!records_autograd(t)) no_grad.emplace();
    serial.push_back(values((*model)(inputs[t])));
  }

  std::atomic<bool> done{false};
  std::vector<int> equal(kForwardThreads, 0);
  std::vector<std::thread> forwards, others;
  for (int t = 0; t < kForwardThreads; ++t)
    forwards.emplace_back([&, t] {
      std::optional<NoGradGuard> no_grad;  // half the threads record autograd graphs meanwhile
      if (!records_autograd(t)) no_grad.emplace();
      for (int pass = 0; pass < kPasses; ++pass)
        if (values((*model)(inputs[t])) == serial[t]) ++equal[t];
    });
  others.emplace_back([&] {
    for (int i = 0; !done.load(); ++i) set_num_threads(1 + i % 2);
  });
  others.emplace_back([&] {
    while (!done.load()) EXPECT_EQ(rand({256}).numel(), 256);
  });
  others.emplace_back([&] {
    Isa isa = active_isa();  // the same kernels, so outputs stay comparable; the table is new
    while (!done.load()) set_isa(isa);
  });
  for (std::thread& t : forwards) t.join();
  done = true;
  for (std::thread& t : others) t.join();
  for (int t = 0; t < kForwardThreads; ++t) EXPECT_EQ(equal[t], kPasses) << "forward thread " << t;
  set_num_threads(2);
}

// Each draw reserves its own counters of the default generator: four threads drawing at once
// get, together, exactly the values of the same draws made one after another.
TEST(Threads, ConcurrentDrawsShareTheDefaultGeneratorExactly) {
  constexpr int kThreads = 4, kDraws = 25;
  constexpr int64_t kSize = 64;
  manual_seed(5);
  std::vector<double> serial;
  for (int i = 0; i < kThreads * kDraws; ++i) {
    std::vector<double> v = rand({kSize}).to_vector();
    serial.insert(serial.end(), v.begin(), v.end());
  }
  manual_seed(5);
  std::vector<std::vector<double>> drawn(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kDraws; ++i) {
        std::vector<double> v = rand({kSize}).to_vector();
        drawn[t].insert(drawn[t].end(), v.begin(), v.end());
      }
    });
  for (std::thread& t : threads) t.join();
  std::vector<double> together;
  for (const auto& d : drawn) together.insert(together.end(), d.begin(), d.end());
  std::sort(serial.begin(), serial.end());
  std::sort(together.begin(), together.end());
  EXPECT_EQ(together, serial);
  EXPECT_EQ(default_generator().state().offset, serial.size());
}

}  // namespace
