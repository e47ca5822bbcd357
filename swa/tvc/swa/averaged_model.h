// Weight averaging of any nn::Module: stochastic weight averaging (SWA) and exponential moving
// averages (EMA), torch.optim.swa_utils' AveragedModel and averaging functions in C++.
//
//   auto swa_model = std::make_shared<tvc::swa::AveragedModel>(*model);          // SWA
//   auto ema_model = std::make_shared<tvc::swa::AveragedModel>(
//       *model, tvc::swa::AveragedModelOptions{
//                   .multi_avg_fn = tvc::swa::get_ema_multi_avg_fn(0.999), .use_buffers = true});
//   for (...) { train_step(); ema_model->update_parameters(*model); }
//   Tensor y = (*ema_model)(x);                        // forward through the averaged copy
//
// The rules, as PyTorch 2.x (which torch 1.13 differs from where noted):
//  - the first update_parameters copies the model's parameters (n_averaged == 0); each later one
//    averages them in with the averaging function, then n_averaged grows by one;
//  - without use_buffers the averaged copy's buffers are set to the model's at every update
//    (torch 1.13 left them as they were); run update_bn afterwards to fit BatchNorm statistics
//    to the averaged weights. With use_buffers the floating buffers are averaged like parameters;
//  - integer buffers (BatchNorm's num_batches_tracked) are always copied from the model, never
//    averaged (PyTorch would average them and truncate);
//  - the averaging functions are not part of state_dict(): its keys are "module.<name>" for the
//    copy's state and "n_averaged" (0-d int64), as PyTorch's, so the two load each other's dicts.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "tvc/nn/module.h"

namespace tvc::swa {

// A per-tensor averaging function: the new average from the current average, the model's
// current value (converted to the average's dtype and device) and the number of models already
// averaged in (>= 1 when called).
using AvgFn = std::function<Tensor(const Tensor& averaged, const Tensor& current, int64_t num_averaged)>;
// A multi-tensor averaging function: updates averaged[i] in place from current[i] for every i
// (tensors of one dtype and device per call; current[i] already in that dtype).
using MultiAvgFn =
    std::function<void(const std::vector<Tensor>& averaged, const std::vector<Tensor>& current, int64_t num_averaged)>;

// A warm-up of the EMA decay, for averages started from a model far from converged.
// With t the number of models already averaged in (t = step - 1 when updating every step):
//  - timm (ModelEmaV3): decay_t = max(min_decay, min(decay, 1 - (1 + t / gamma)^(-power)));
//  - tensorflow (tf.train.ExponentialMovingAverage's num_updates): min(decay, (1 + t) / (10 + t)).
struct EmaWarmup {
  enum class Kind { none, timm, tensorflow };
  Kind kind = Kind::none;
  double gamma = 1.0;        // timm
  double power = 2.0 / 3.0;  // timm
  double min_decay = 0.0;    // timm
};
// The decay used for the update that finds t models already averaged in.
double ema_decay(double decay, const EmaWarmup& warmup, int64_t t);

// EMA: a <- decay * a + (1 - decay) * x; the multi form updates every tensor in one fused pass
// (foreach_lerp_ with weight 1 - decay). decay in [0, 1].
MultiAvgFn get_ema_multi_avg_fn(double decay = 0.999, EmaWarmup warmup = {});
AvgFn get_ema_avg_fn(double decay = 0.999, EmaWarmup warmup = {});
// SWA, the equal-weight running mean: a <- a + (x - a) / (n + 1); the multi form is one fused
// foreach_lerp_ pass with weight 1 / (n + 1).
MultiAvgFn get_swa_multi_avg_fn();
AvgFn get_swa_avg_fn();

struct AveragedModelOptions {
  // Where the average lives (default: where the model is).
  std::optional<Device> device{};
  // Averaging: multi_avg_fn if given, else avg_fn if given, else SWA (the fused multi form).
  AvgFn avg_fn{};
  MultiAvgFn multi_avg_fn{};
  // Average the floating buffers too (else they follow the model's at each update).
  bool use_buffers = false;
  // The dtype of the average's floating tensors. Default: the model's, except that float16 and
  // bfloat16 tensors are averaged in float32. Float64 keeps the average in double precision.
  std::optional<DType> dtype{};
  // Update only on every k-th call of update_parameters (calls k, 2k, ...), e.g. an EMA kept
  // every 4 optimizer steps. The call counter is not part of state_dict.
  int64_t update_every = 1;
};

// A deep copy of a module (child "module") whose weights are averaged by update_parameters,
// with a 0-d int64 buffer n_averaged. It is an nn::Module with the whole module API; forward
// runs the averaged copy (inputs in the average's dtype and on its device).
class AveragedModel : public nn::Cloneable<AveragedModel> {
 public:
  explicit AveragedModel(const nn::Module& model, AveragedModelOptions options = {});

  Tensor forward(const Tensor& x) override;
  // Averages model's current weights into the copy (see the rules at the top of this file).
  // model must have the copy's structure: the same parameter and buffer names in the same
  // order, shapes, the dtypes the copy was made from, and one device per tensor as at
  // construction. Otherwise throws tvc::Error naming the first tensor that differs, with the
  // average left unchanged (everything is checked before anything is written).
  void update_parameters(const nn::Module& model);

  // The averaged copy.
  nn::Module& module() const { return child("module"); }
  int64_t n_averaged() const;
  // Calls of update_parameters so far (counted for update_every).
  int64_t update_calls() const { return update_calls_; }
  const AveragedModelOptions& options() const { return options_; }
  std::string extra_repr() const override;

 private:
  struct Slot;
  // The copy's tensors paired with model's, checked against the recorded structure.
  std::vector<Slot> pair_tensors(const nn::Module& model) const;

  // The dtype and device of each parameter and buffer of the model the copy was made from.
  struct SourceTensor {
    DType dtype{};
    Device device{};
  };

  AveragedModelOptions options_;
  std::vector<SourceTensor> source_parameters_, source_buffers_;
  int64_t update_calls_ = 0;
};

}  // namespace tvc::swa
