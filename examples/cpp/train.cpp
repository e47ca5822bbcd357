// A training loop with tvc's core library alone: a small network, cross-entropy, SGD with
// momentum and a cosine schedule, then the weights saved and loaded back. The data is synthetic
// (two Gaussian blobs per class), so the program needs no file.
//
//   c++ -std=c++20 train.cpp $(pkg-config --cflags --static --libs tvc) -o train && ./train
#include <tvc/tvc.h>

#include <cstdio>
#include <exception>
#include <memory>

int main() {
  try {
    tvc::manual_seed(0);
    constexpr int64_t kClasses = 3, kFeatures = 8, kBatch = 64;
    tvc::Tensor centres = tvc::randn({kClasses, kFeatures}) * 3.0;

    auto model = std::make_shared<tvc::nn::Sequential>(std::initializer_list<tvc::nn::ModulePtr>{
        std::make_shared<tvc::nn::Linear>(kFeatures, 32), std::make_shared<tvc::nn::ReLU>(),
        std::make_shared<tvc::nn::Linear>(32, kClasses)});
    tvc::optim::SGD optimizer(model->parameters(), {.lr = 0.1, .momentum = 0.9});
    constexpr int64_t kSteps = 200;
    tvc::optim::lr_scheduler::CosineAnnealingLR schedule(optimizer, kSteps);

    model->train();
    for (int64_t step = 0; step < kSteps; ++step) {
      tvc::Tensor labels = tvc::randint(0, kClasses, {kBatch});
      tvc::Tensor inputs = tvc::index_select(centres, 0, labels) + tvc::randn({kBatch, kFeatures});
      tvc::Tensor loss = tvc::cross_entropy((*model)(inputs), labels);
      optimizer.zero_grad();
      loss.backward();
      optimizer.step();
      schedule.step();
      if (step % 50 == 0) std::printf("step %3lld: loss %.4f\n", static_cast<long long>(step), loss.item<double>());
    }

    tvc::io::save_safetensors("classifier.safetensors", model->state_dict());
    auto restored = model->clone();
    restored->load_state_dict("classifier.safetensors");
    restored->eval();
    tvc::NoGradGuard no_grad;
    tvc::Tensor labels = tvc::randint(0, kClasses, {1000});
    tvc::Tensor inputs = tvc::index_select(centres, 0, labels) + tvc::randn({1000, kFeatures});
    double accuracy = tvc::eq((*restored)(inputs).argmax(1), labels).to(tvc::DType::Float64).mean().item<double>();
    std::printf("accuracy of the reloaded model: %.1f%%\n", 100 * accuracy);
    return accuracy > 0.9 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
