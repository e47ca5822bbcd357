// The single-process world, launcher detection, the choice of world() and the sampler's shards.
#include "tvc/dist/communicator.h"

#include <atomic>
#include <cstdlib>

#include "mpi_world.h"
#include "tvc/error.h"

namespace tvc::dist {

namespace {

// The sum of one rank: there from the start.
class DoneSum final : public PendingSum {
 public:
  void wait() override {}
};

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }
  std::unique_ptr<PendingSum> start_all_reduce_sum(Tensor& t) override {
    check_collective(t, "all_reduce_sum");
    return std::make_unique<DoneSum>();
  }
  void broadcast(Tensor& t, int root) override {
    check_collective(t, "broadcast");
    TVC_CHECK(root == 0, "broadcast: root ", root, " is not a rank of a single process");
  }
  void barrier() override {}
};

std::atomic<bool> mpi_started{false};  // world() is MPI's

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : 0;
}

}  // namespace

void check_collective(const Tensor& t, const char* what) {
  TVC_CHECK(t.defined() && t.device() == Device::CPU && t.is_contiguous(), what,
            ": the tensor must be a contiguous CPU tensor");
  TVC_CHECK(t.dtype() == DType::Float32 || t.dtype() == DType::Float64 || t.dtype() == DType::Int64, what, ": dtype ",
            dtype_name(t.dtype()), " is not float32, float64 or int64");
}

CommunicatorPtr single_process() { return std::make_shared<SingleProcess>(); }

bool launched_with_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS"})
    if (env_int(name) > 1) return true;
  return false;
}

bool mpi_available() { return detail::mpi_built(); }

CommunicatorPtr world() {
  static const CommunicatorPtr w = [] {
    if (!launched_with_ranks()) return single_process();  // no MPI_Init outside a launcher
    TVC_CHECK(detail::mpi_built(),
              "this process was launched as one of several ranks (mpirun/srun), but tvc was built without MPI: "
              "distributed runs need the MPI build (install libopenmpi-dev and rebuild; meson option -Dmpi=enabled)");
    CommunicatorPtr mpi = detail::mpi_world();
    mpi_started.store(true);
    return mpi;
  }();
  return w;
}

void abort_world(int code) {
  if (mpi_started.load()) detail::mpi_abort(code);
}

std::vector<int64_t> shard(const std::vector<int64_t>& order, int num_replicas, int rank, bool drop_last) {
  TVC_CHECK(num_replicas >= 1 && rank >= 0 && rank < num_replicas, "shard: rank ", rank, " of ", num_replicas,
            " replicas");
  const auto n = static_cast<int64_t>(order.size()), replicas = static_cast<int64_t>(num_replicas);
  // DistributedSampler: drop_last cuts to a multiple of the replicas, else the start repeats.
  const int64_t per_rank = drop_last ? n / replicas : (n + replicas - 1) / replicas;
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(per_rank));
  for (int64_t i = 0; i < per_rank && n > 0; ++i) out.push_back(order[static_cast<size_t>((rank + i * replicas) % n)]);
  return out;
}

}  // namespace tvc::dist
