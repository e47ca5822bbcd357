// MPI_COMM_WORLD as a Communicator. The sum of all_reduce_sum is made in rank order on every
// rank from an all-gather of the ranks' tensors, so it is bit-identical on every rank whatever
// reduction tree the MPI library would have chosen (at the cost of size() copies in memory).
#include "mpi_world.h"

#include <mpi.h>

#include <cstring>
#include <vector>

#include "tvc/error.h"

namespace tvc::dist {

namespace {

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw Error(cat_str(call, " failed: ", std::string(text, static_cast<size_t>(length))));
}

template <typename T>
void sum_in_rank_order(T* out, const T* gathered, int64_t n, int ranks) {
  for (int64_t i = 0; i < n; ++i) {
    T s = gathered[i];
    for (int r = 1; r < ranks; ++r) s += gathered[static_cast<int64_t>(r) * n + i];
    out[i] = s;
  }
}

class MpiWorld final : public Communicator {
 public:
  MpiWorld() {
    int initialised = 0;
    check_mpi(MPI_Initialized(&initialised), "MPI_Initialized");
    if (!initialised) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      owns_ = true;
    }
    // Errors come back as codes (thrown as tvc::Error) instead of aborting the job silently.
    check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  }
  ~MpiWorld() override {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (owns_ && !finalised) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce_sum(Tensor& t) override {
    check_collective(t, "all_reduce_sum");
    const int64_t n = t.numel();
    const size_t bytes = static_cast<size_t>(n) * t.element_size();
    TVC_CHECK(bytes <= static_cast<size_t>(INT32_MAX), "all_reduce_sum: ", bytes,
              " bytes in one call is more than MPI's int count allows; reduce in buckets");
    std::vector<uint8_t> gathered(bytes * static_cast<size_t>(size_));
    check_mpi(MPI_Allgather(t.raw_data(), static_cast<int>(bytes), MPI_BYTE, gathered.data(), static_cast<int>(bytes),
                            MPI_BYTE, MPI_COMM_WORLD),
              "MPI_Allgather");
    switch (t.dtype()) {
      case DType::Float32:
        sum_in_rank_order(t.data_ptr<float>(), reinterpret_cast<const float*>(gathered.data()), n, size_);
        break;
      case DType::Float64:
        sum_in_rank_order(t.data_ptr<double>(), reinterpret_cast<const double*>(gathered.data()), n, size_);
        break;
      default:
        sum_in_rank_order(t.data_ptr<int64_t>(), reinterpret_cast<const int64_t*>(gathered.data()), n, size_);
    }
  }

  void broadcast(Tensor& t, int root) override {
    check_collective(t, "broadcast");
    TVC_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of ", size_);
    const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
    TVC_CHECK(bytes <= static_cast<size_t>(INT32_MAX), "broadcast: ", bytes, " bytes in one call is too many");
    check_mpi(MPI_Bcast(t.raw_data(), static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }

  void barrier() override { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

 private:
  int rank_ = 0, size_ = 1;
  bool owns_ = false;
};

}  // namespace

namespace detail {

bool mpi_built() { return true; }

CommunicatorPtr mpi_world() { return std::make_shared<MpiWorld>(); }

}  // namespace detail

}  // namespace tvc::dist
