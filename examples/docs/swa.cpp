// The example of docs/swa.md, compiled by the build (tools/check_doc_examples.py).
#include <memory>
#include <vector>

#include "tvc/lr_scheduler.h"
#include "tvc/optim.h"
#include "tvc/swa/averaged_model.h"
#include "tvc/swa/swalr.h"
#include "tvc/swa/update_bn.h"

void train_one_epoch(tvc::nn::Module& model, tvc::optim::Optimizer& optimizer);
void average(const tvc::nn::ModulePtr& model, tvc::optim::Optimizer& optimizer,
             const std::vector<tvc::Tensor>& train_batches);

void average(const tvc::nn::ModulePtr& model, tvc::optim::Optimizer& optimizer,
             const std::vector<tvc::Tensor>& train_batches) {
  // [doc]
  auto swa_model = std::make_shared<tvc::swa::AveragedModel>(*model);  // SWA
  tvc::optim::lr_scheduler::CosineAnnealingLR scheduler(optimizer, 300);
  tvc::swa::SWALR swa_scheduler(optimizer, /*swa_lr=*/0.05);
  for (int epoch = 0; epoch < 300; ++epoch) {
    train_one_epoch(*model, optimizer);
    if (epoch > 160) {
      swa_model->update_parameters(*model);
      swa_scheduler.step();
    } else
      scheduler.step();
  }
  tvc::swa::update_bn(train_batches, *swa_model);  // statistics that fit the averaged weights

  // An EMA of weights and buffers, with timm's warm-up, kept every 4 steps.
  auto ema = std::make_shared<tvc::swa::AveragedModel>(
      *model, tvc::swa::AveragedModelOptions{
                  .multi_avg_fn = tvc::swa::get_ema_multi_avg_fn(0.999, {.kind = tvc::swa::EmaWarmup::Kind::timm}),
                  .use_buffers = true,
                  .update_every = 4});
  // [end doc]
}
