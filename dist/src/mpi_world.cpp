// MPI_COMM_WORLD as a Communicator. The sum of all_reduce_sum is made in rank order on every
// rank from an all-gather of the ranks' tensors, so it is bit-identical on every rank whatever
// reduction tree the MPI library would have chosen (at the cost of size() copies in memory).
// Collectives are MPI's non-blocking ones, polled until done or the timeout.
#include "mpi_world.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
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

// Sleeps a little between polls once a wait has lasted a while (ranks share cores).
void pause_between_polls(int64_t polls) {
  if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(100));
}

// One collective in flight: its MPI request and the arrival messages exchanged with every peer.
// Each rank, entering its collective number seq, sends seq to every peer; a wait that times out
// names the peers whose arrival has not come (they died or hang before reaching it).
struct Collective {
  const char* what = "";
  int64_t seq = 0;
  std::vector<MPI_Request> requests;    // [the collective, arrivals sent..., arrivals received...]
  std::vector<int> peers;               // the rank of each arrival received, in order
  std::vector<int64_t> sent, received;  // heap buffers: they stay put when the Collective moves
};

constexpr int kArrivalTag = 7301;
constexpr int kHeartbeatTag = 7302;

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

  std::unique_ptr<PendingSum> start_all_reduce_sum(Tensor& t) override {
    check_collective(t, "all_reduce_sum");
    const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
    TVC_CHECK(bytes <= static_cast<size_t>(INT32_MAX), "all_reduce_sum: ", bytes,
              " bytes in one call is more than MPI's int count allows; reduce in buckets");
    auto sum = std::make_unique<MpiSum>(*this, t, bytes * static_cast<size_t>(size_));
    sum->op = start("all_reduce_sum", [&](MPI_Request* r) {
      return MPI_Iallgather(t.raw_data(), static_cast<int>(bytes), MPI_BYTE, sum->gathered.data(),
                            static_cast<int>(bytes), MPI_BYTE, MPI_COMM_WORLD, r);
    });
    return sum;
  }

  void progress() override {
    int flag = 0;  // any MPI call moves the library's pending transfers on
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
  }

  void broadcast(Tensor& t, int root) override {
    check_collective(t, "broadcast");
    TVC_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of ", size_);
    const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
    TVC_CHECK(bytes <= static_cast<size_t>(INT32_MAX), "broadcast: ", bytes, " bytes in one call is too many");
    Collective op = start("broadcast", [&](MPI_Request* r) {
      return MPI_Ibcast(t.raw_data(), static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, r);
    });
    complete(op);
    t.storage()->bump_version();  // written in place (Storage::derived)
  }

  void barrier() override {
    Collective op = start("barrier", [&](MPI_Request* r) { return MPI_Ibarrier(MPI_COMM_WORLD, r); });
    complete(op);
  }

 private:
  // The all-gather of a sum, summed in rank order by wait().
  struct MpiSum final : PendingSum {
    MpiSum(MpiWorld& world, Tensor& t, size_t gathered_bytes) : world(world), t(t), gathered(gathered_bytes) {}
    void wait() override {
      world.complete(op);
      const int64_t n = t.numel();
      switch (t.dtype()) {
        case DType::Float32:
          sum_in_rank_order(t.data_ptr<float>(), reinterpret_cast<const float*>(gathered.data()), n, world.size_);
          break;
        case DType::Float64:
          sum_in_rank_order(t.data_ptr<double>(), reinterpret_cast<const double*>(gathered.data()), n, world.size_);
          break;
        default:
          sum_in_rank_order(t.data_ptr<int64_t>(), reinterpret_cast<const int64_t*>(gathered.data()), n, world.size_);
      }
      t.storage()->bump_version();  // written in place (Storage::derived)
    }
    MpiWorld& world;
    Tensor t;
    std::vector<uint8_t> gathered;
    Collective op;
  };

  // Posts the arrival messages, then the collective (post(&request) returns MPI's code).
  template <typename Post>
  Collective start(const char* what, Post post) {
    TVC_CHECK(!broken_, what, ": an earlier collective timed out; the job cannot go on (abort_world)");
    Collective op;
    op.what = what;
    op.seq = ++sequence_;
    op.requests.resize(1);
    check_mpi(post(&op.requests[0]), what);
    op.sent.assign(1, op.seq);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      op.requests.emplace_back();
      check_mpi(MPI_Isend(op.sent.data(), 1, MPI_INT64_T, peer, kArrivalTag, MPI_COMM_WORLD, &op.requests.back()),
                "MPI_Isend");
    }
    op.received.resize(static_cast<size_t>(size_ - 1));
    for (int peer = 0, i = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      op.peers.push_back(peer);
      op.requests.emplace_back();
      check_mpi(MPI_Irecv(&op.received[static_cast<size_t>(i++)], 1, MPI_INT64_T, peer, kArrivalTag, MPI_COMM_WORLD,
                          &op.requests.back()),
                "MPI_Irecv");
    }
    return op;
  }

  // Polls op's requests until all are done, or throws Timeout naming the ranks that went
  // silent: those whose arrival at op has not come, or that stopped sending the heartbeats a
  // waiting rank sends every second with the number of its collective (a stopped or stuck
  // process sends nothing; the ranks waiting in this collective or a later one keep sending).
  void complete(Collective& op) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const double timeout = timeout_seconds();
    std::vector<Clock::time_point> heard(static_cast<size_t>(size_), start - std::chrono::hours(1));  // never
    std::vector<bool> arrived(op.peers.size(), false);
    auto last_heartbeat = start;
    for (int64_t polls = 0;; ++polls) {
      int done = 0;
      check_mpi(MPI_Testall(static_cast<int>(op.requests.size()), op.requests.data(), &done, MPI_STATUSES_IGNORE),
                op.what);
      if (done) return;
      const auto now = Clock::now();
      for (size_t i = 0; i < op.peers.size(); ++i) {  // a completed request is freed: Testall skips it
        int received = 0;
        if (!arrived[i]) MPI_Test(&op.requests[1 + op.peers.size() + i], &received, MPI_STATUS_IGNORE);
        if (received) arrived[i] = true, heard[static_cast<size_t>(op.peers[i])] = now;
      }
      if (now - last_heartbeat > std::chrono::seconds(1)) {
        last_heartbeat = now;
        send_heartbeats(op.seq);
      }
      receive_heartbeats(op.seq, heard, now);
      const double waited = std::chrono::duration<double>(now - start).count();
      if (timeout > 0 && waited > timeout) throw_timeout(op, waited, arrived, heard, now);
      pause_between_polls(polls);
    }
  }

  void send_heartbeats(int64_t seq) {
    heartbeats_.push_back(seq);  // a deque: the value stays put until MPI has sent it
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      MPI_Request request;
      if (MPI_Isend(&heartbeats_.back(), 1, MPI_INT64_T, peer, kHeartbeatTag, MPI_COMM_WORLD, &request) == MPI_SUCCESS)
        MPI_Request_free(&request);
    }
  }

  // Drains the heartbeats that came; those of peers waiting in collective seq or a later one
  // count (older ones are stale: sent while waiting in an earlier collective).
  void receive_heartbeats(int64_t seq, std::vector<std::chrono::steady_clock::time_point>& heard,
                          std::chrono::steady_clock::time_point now) {
    for (;;) {
      int pending = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kHeartbeatTag, MPI_COMM_WORLD, &pending, &status) != MPI_SUCCESS || !pending)
        return;
      int64_t beat = 0;
      MPI_Recv(&beat, 1, MPI_INT64_T, status.MPI_SOURCE, kHeartbeatTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (beat >= seq) heard[static_cast<size_t>(status.MPI_SOURCE)] = now;
    }
  }

  [[noreturn]] void throw_timeout(const Collective& op, double waited, const std::vector<bool>& arrived,
                                  const std::vector<std::chrono::steady_clock::time_point>& heard,
                                  std::chrono::steady_clock::time_point now) {
    broken_ = true;
    std::string absent, silent;  // not arrived; arrived, then no heartbeat
    for (size_t i = 0; i < op.peers.size(); ++i) {
      if (now - heard[static_cast<size_t>(op.peers[i])] < std::chrono::milliseconds(2500)) continue;
      std::string& list = arrived[i] ? silent : absent;
      list += cat_str(list.empty() ? "" : ", ", op.peers[i]);
    }
    const std::string what = cat_str(op.what, " #", op.seq), seconds = cat_str(static_cast<int64_t>(waited), " s");
    if (!absent.empty())
      throw Timeout(cat_str("rank ", rank_, ": rank ", absent, " did not reach ", what, " within ", seconds,
                            ": it died or hangs"));
    if (!silent.empty())
      throw Timeout(cat_str("rank ", rank_, ": rank ", silent, " reached ", what, ", then stopped responding for ",
                            seconds, ": it died or hangs"));
    throw Timeout(cat_str("rank ", rank_, ": ", what, " did not complete within ", seconds,
                          " although every rank is waiting in it"));
  }

  int rank_ = 0, size_ = 1;
  bool owns_ = false;
  bool broken_ = false;
  int64_t sequence_ = 0;
  std::deque<int64_t> heartbeats_;  // the values of the heartbeats sent
};

}  // namespace

namespace detail {

bool mpi_built() { return true; }

CommunicatorPtr mpi_world() { return std::make_shared<MpiWorld>(); }

void mpi_abort(int code) {
  std::fflush(nullptr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();
}

}  // namespace detail

}  // namespace tvc::dist
