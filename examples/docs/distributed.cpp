// The example of docs/distributed.md, compiled by the build (tools/check_doc_examples.py).
#include "tvc/dist/communicator.h"
#include "tvc/dist/data_parallel.h"
#include "tvc/dist/sync_batch_norm.h"
#include "tvc/ops.h"
#include "tvc/optim.h"

// A step on this rank's share of the global batch.
void train_step(const tvc::nn::ModulePtr& model, tvc::optim::Optimizer& optimizer, tvc::dist::DataParallel& dp,
                const tvc::Tensor& images, const tvc::Tensor& labels);
void data_parallel(const tvc::nn::ModulePtr& model);

void data_parallel(const tvc::nn::ModulePtr& model) {
  // [doc]
  auto world = tvc::dist::world();                   // MPI's under mpirun/srun, else one process
  tvc::dist::convert_sync_batchnorm(*model, world);  // optional: BatchNorm over all ranks' shares
  tvc::dist::DataParallel dp(*model, world);         // rank 0's weights and buffers everywhere
  tvc::optim::SGD optimizer(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  // each step: train_step(model, optimizer, dp, images, labels) on rank world->rank()'s share
  // [end doc]
}

void train_step(const tvc::nn::ModulePtr& model, tvc::optim::Optimizer& optimizer, tvc::dist::DataParallel& dp,
                const tvc::Tensor& images, const tvc::Tensor& labels) {
  // [doc]
  optimizer.zero_grad();
  tvc::cross_entropy((*model)(images), labels).backward();  // buckets are summed as it goes
  dp.average_gradients();                                   // the mean over the ranks
  optimizer.step();                                         // the same weights on every rank
  // [end doc]
}
