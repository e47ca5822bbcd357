// Data-parallel training across processes: the communicator that ranks exchange tensors
// through, behind an interface a later NCCL backend (GPU ranks) implements as well.
//
//   auto world = tvc::dist::world();   // MPI's world under mpirun/srun, else one process
//   world->all_reduce_sum(grad);        // every rank gets the sum
//   world->broadcast(weights, 0);       // rank 0's values on every rank
//
// Collective calls (all_reduce_sum, start_all_reduce_sum, broadcast, barrier) must be made by
// every rank, in the same order, with tensors of the same dtype and shape. Tensors are CPU
// tensors, contiguous. A collective that waits longer than the timeout for another rank throws
// dist::Timeout naming the ranks that never arrived (they died or hang); the world is then
// broken: end the job with abort_world().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tvc/error.h"
#include "tvc/tensor.h"

namespace tvc::dist {

// Thrown when a collective waited longer than Communicator::timeout_seconds() for other ranks.
class Timeout : public Error {
 public:
  using Error::Error;
};

// A sum started by Communicator::start_all_reduce_sum; wait() completes it.
class PendingSum {
 public:
  virtual ~PendingSum() = default;
  // Blocks until every rank's tensor has arrived; the tensor then holds the sum.
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "single", "mpi"

  // Sums t over all ranks in place: every rank ends with the same sum, summed in rank order
  // (so the result is bit-identical on every rank and from run to run). float32, float64,
  // int64; contiguous.
  void all_reduce_sum(Tensor& t) { start_all_reduce_sum(t)->wait(); }
  // Starts all_reduce_sum(t) without waiting: t (its storage) must stay alive and untouched
  // until the returned sum's wait(). Sums complete in the order they were started; a started
  // sum must be waited for before the next broadcast or barrier.
  virtual std::unique_ptr<PendingSum> start_all_reduce_sum(Tensor& t) = 0;
  // Lets started sums advance (MPI moves data only inside its calls): call it now and then
  // while computing, e.g. from gradient hooks.
  virtual void progress() {}
  // Copies root's t into every rank's t.
  virtual void broadcast(Tensor& t, int root) = 0;
  virtual void barrier() = 0;

  // How long a collective waits for the other ranks before throwing Timeout (seconds; <= 0:
  // forever). Default 600.
  double timeout_seconds() const { return timeout_seconds_; }
  void set_timeout_seconds(double seconds) { timeout_seconds_ = seconds; }

 private:
  double timeout_seconds_ = 600;
};
using CommunicatorPtr = std::shared_ptr<Communicator>;

// One process alone: rank 0 of 1; the collectives leave tensors as they are.
CommunicatorPtr single_process();

// Whether this process was started by a launcher of several ranks (mpirun, mpiexec, srun): the
// environment variables Open MPI, MPICH/PMI and Slurm set.
bool launched_with_ranks();

// Whether tvc was built with MPI (the meson feature `mpi`).
bool mpi_available();

// The world of this process: single_process() unless launched_with_ranks(); then MPI's
// (initialised on first call, finalised at exit) when tvc was built with MPI, else an error
// saying that distributed runs need the MPI build (each rank would otherwise train alone).
CommunicatorPtr world();

// Ends every rank of the job with exit status code (MPI_Abort) when world() is MPI's; else
// returns. For a rank that cannot go on (an error, a Timeout) while the others wait in a
// collective: returning from main would leave them waiting.
void abort_world(int code);

// PyTorch's DistributedSampler share of an epoch's order for rank of num_replicas: the order
// padded to a multiple of num_replicas by repeating its start (or, with drop_last, cut to one),
// then every num_replicas-th index from rank on. Each rank taking batch/num_replicas of its
// share at a time, the union of the ranks' k-th batches is the k-th batch of the padded order.
std::vector<int64_t> shard(const std::vector<int64_t>& order, int num_replicas, int rank, bool drop_last = false);

}  // namespace tvc::dist
