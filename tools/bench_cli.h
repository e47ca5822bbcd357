// `tvc bench`: how fast a model of the zoo runs on this machine, as a share of its measured peak.
#pragma once

#include <cstdint>
#include <string>

namespace tvc::tools {

struct BenchOptions {
  std::string model;              // a name of `tvc list`, randomly initialised (timing does not depend on the values)
  int64_t batch = 1;              // N of the input (N, 3, size, size)
  int64_t size = 224;             // the input's height and width
  bool train = false;             // time training steps (forward in train mode, cross-entropy, backward, an SGD step)
  std::string dtype = "float32";  // float32, or bfloat16: inference with the weights converted once to bfloat16
  int threads = 0;                // 0: OpenMP's default (all cores)
  int64_t iterations = 0;         // timed steps; 0: as many as fit in about 3 s, at least 5
  bool verbose = false;           // also each layer's mean time per step
};

// Times one warm-up step (reported as the first call), then the timed steps, each on a fresh
// random input whose output (the loss, when training) is checked finite, and prints
//   MODEL batch N size S eval|train[ bfloat16], T threads (ISA): median X ms (min A, max B), G GFLOP/s, P% of peak
//   first call F ms; peak resident memory M MiB; F GFLOP per step (convolutions, linear layers,
//   attention); peak Q GFLOP/s (ISA FMA loop, T threads)
// bfloat16 (evaluation only) converts the weights of the convolutions and linear layers to
// bfloat16 (tvc::nn::convert_weights_to_bfloat16), which then multiply bfloat16 with float32
// sums; activations stay float32, and the peak is the bfloat16 dot-product loop's. It needs a
// CPU with AVX512_BF16 (tvc::cpu_has_native_bfloat16) and says so elsewhere.
// GFLOP counts the multiply-adds of convolutions, linear layers and multi-head attention (2 per
// multiply-add) of one forward pass, three times that for a training step (forward, and the
// gradients of inputs and weights). Throws tvc::Error naming a bad option or a non-finite output.
void bench_model(const BenchOptions& options);

}  // namespace tvc::tools
