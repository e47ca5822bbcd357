// `tvc train`: trains a small CNN on Fashion-MNIST and reports the test accuracy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tvc::tools {

struct TrainOptions {
  int64_t epochs = 1;
  uint64_t seed = 0;
  int64_t batch_size = 64;
  double lr = 2e-3;         // Adam's peak learning rate, decayed to 0 by a cosine over the run
  int threads = 0;          // 0: OpenMP's default (all cores)
  int64_t max_batches = 0;  // > 0: stop each epoch after this many batches (quick checks)
  std::string data_dir;
  // Also keep an exponential moving average of the weights and buffers with this decay (timm's
  // warm-up), updated after every optimizer step, and report its test accuracy.
  std::optional<double> ema_decay;
};

// Trains, printing progress on stderr and, on stdout, one line per epoch (mean loss), the
// FNV-1a hash of the trained parameters (equal hashes: bit-identical training), with an EMA
// `EMA test accuracy: NN.NN%` and, last, `test accuracy: NN.NN%` (the trained model's). Throws tvc::Error on missing or
// malformed data.
void train_fashion_mnist(const TrainOptions& options);

}  // namespace tvc::tools
