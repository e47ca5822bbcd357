// Conformance of a tvc backbone with torchvision's, on goldens made by tools/model_goldens.py
// (random weights with every BatchNorm buffer and bias randomised, saved with torch.save and
// read through tvc's .pth reader):
//   - state_dict keys, order, shapes and dtypes equal to torchvision's (shapes not compared
//     with weights made for another image size)
//   - eval-mode outputs for each batch size x resolution: err <= 1e-4
//   - train-mode output (batch statistics, dropout and stochastic depth off) err <= 1e-3,
//     updated running statistics err <= 1e-4 each (where PyTorch's own float32 error on a
//     running statistic is larger, ours against float64 within 3x of PyTorch's own, as for the
//     gradients)
//   - unless grad_size is 0: float64 gradients of every parameter err <= 1e-8 (denominator
//     floored at 1e-10 of the norm of all gradients); float32 gradients, all together, within
//     3x of PyTorch's own float32-vs-float64 error (per tensor that ratio is noise on tensors
//     of a few elements; PyTorch's is the larger of its contiguous and channels_last runs), both
//     sides' float32 runs taking the float64 run's ReLU and max-pool decisions (see the .cpp)
// where err = ||a - b||2 / ||b||2 per tensor. Failures are recorded with GoogleTest.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tvc::test {

struct ModelCheck {
  std::string model;
  int64_t num_classes = 1000;
  std::string eval_shapes = "2x224,1x161";  // batch x size, comma-separated; the first is also trained
  int64_t grad_size = 64;                   // pixels of the gradient check's (2, 3, S, S) input; 0: none
  // Options::image_size (ViT: the only input size the model takes, so eval_shapes and grad_size
  // must be it). With weights_image_size, the weights are those of a model built for that size,
  // which torchvision's side adapts with interpolate_embeddings and ours on load.
  std::optional<int64_t> image_size{};
  std::optional<int64_t> weights_image_size{};
};

// The largest errors seen, for docs/conformance.md.
struct ModelErrors {
  double eval = 0;            // over the eval shapes
  double train = 0;           // train-mode output
  double running = 0;         // over the running statistics, against PyTorch's float32
  double running_torch = 0;   // PyTorch's own float32 error on them (against its float64)
  double grad64 = 0;          // over the float64 parameter gradients
  std::string grad64_worst;   // the parameter whose float64 gradient has that error
  double grad32 = 0;          // our float32 gradients against float64, all parameters together
  double grad32_torch = 0;    // PyTorch's (the larger of contiguous and channels_last)
  double grad32_ratio = 0;    // grad32 / grad32_torch
  int64_t grad32_pinned = 0;  // ReLU and max-pool decisions our float32 run took otherwise than float64
  double seconds = 0;         // tvc's time for all of the above
};

ModelErrors check_model(const ModelCheck& check);

// The gradient errors alone (grad64, grad32, grad32_torch, grad32_ratio, grad32_pinned), checked
// against nothing: the mutation test shows with it that the float32 criterion fails a kernel
// that rounds to bfloat16.
ModelErrors gradient_errors(const ModelCheck& check);

// The folder of check's goldens (weights.pth, goldens.safetensors), made on first use.
std::string golden_folder(const ModelCheck& check);

// forward_stages against torchvision's create_feature_extractor(model, return_nodes=nodes) on the
// same random weights and a (1, 3, 224, 224) input: the node names, in order, and each output
// (err <= 1e-4). Returns the largest error.
double check_stages(const std::string& model, const std::vector<std::string>& nodes);

}  // namespace tvc::test
