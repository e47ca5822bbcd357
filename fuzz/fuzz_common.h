// What the fuzzers share: the input as a file, and checks of the tensors they get.
//
// The readers take paths, so each input is written into an anonymous in-memory file
// (memfd_create) and read back through /proc/self/fd/N: the real path-based code runs (open,
// fstat, pread, mmap), nothing touches the disk and nothing is left behind.
#pragma once

#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "tvc/error.h"
#include "tvc/serialize.h"
#include "tvc/tensor.h"

namespace tvc_fuzz {

// A finding that is neither a crash nor a sanitizer report: say what and abort, so libFuzzer
// saves the input as crash-*.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Open file descriptors of this process. A reader that leaks one on an error path would run
// the fuzzer (and any long-lived program) out of descriptors.
inline int open_fds() {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) finding(std::string("cannot list /proc/self/fd: ") + std::strerror(errno));
  int n = 0;
  while (const dirent* e = readdir(dir))
    if (e->d_name[0] != '.') ++n;
  closedir(dir);
  return n - 1;  // the descriptor of dir itself
}

// The input as a file, closed (and so freed) at the end of the run.
class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("tvc-fuzz-input", MFD_CLOEXEC);
    if (fd_ < 0) finding(std::string("memfd_create: ") + std::strerror(errno));
    for (size_t done = 0; done < size;) {
      ssize_t n = write(fd_, data + done, size - done);
      if (n <= 0) finding(std::string("writing the memfd: ") + std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  ~MemoryFile() { close(fd_); }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Every element of a tensor must lie inside its storage (the readers promise to check offsets
// and strides against the file; views against their base).
inline void check_in_storage(const tvc::Tensor& t, const std::string& name) {
  if (!t.defined()) finding("an undefined tensor '" + name + "'");
  if (t.numel() == 0) return;
  const auto& storage = t.storage();
  if (!storage) finding("tensor '" + name + "' has no storage");
  const auto elem = static_cast<__int128>(t.element_size());
  __int128 lo = t.storage_offset(), hi = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    __int128 span = static_cast<__int128>(t.shape()[d] - 1) * t.strides()[d];
    (span < 0 ? lo : hi) += span;
  }
  if (lo < 0 || (hi + 1) * elem > static_cast<__int128>(storage->nbytes()))
    finding("tensor '" + name + "' reaches outside its storage of " + std::to_string(storage->nbytes()) +
            " bytes (shape " + tvc::shape_str(t.shape()) + ", strides " + tvc::shape_str(t.strides()) + ", offset " +
            std::to_string(t.storage_offset()) + ")");
}

// check_in_storage, then all its bytes are read, so that a view of memory that is not there
// (freed, unmapped, past a buffer) shows up under ASan.
inline void check_tensor(const tvc::Tensor& t, const std::string& name) {
  check_in_storage(t, name);
  if (t.numel() == 0) return;
  // A contiguous copy reads every element through the strides; summing its bytes makes sure
  // they are all touched and the compiler cannot drop the reads.
  tvc::Tensor c = t.contiguous();
  const auto* bytes = static_cast<const volatile uint8_t*>(c.raw_data());
  size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  uint8_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum = static_cast<uint8_t>(sum + bytes[i]);
  (void)sum;
}

// One fuzzer input: read(path) runs on the input as a file. tvc::Error is the expected answer
// to a malformed file; another exception or a leaked file descriptor is a finding.
template <typename Read>
int run_on_file(const uint8_t* data, size_t size, Read read) {
  int fds_before = open_fds();
  {
    MemoryFile input(data, size);
    try {
      read(input.path());
    } catch (const tvc::Error&) {
      // the expected answer to a malformed file
    } catch (const std::exception& e) {
      finding(std::string("an exception other than tvc::Error: ") + e.what());
    } catch (...) {
      finding("an exception that is not a std::exception");
    }
  }
  int fds_after = open_fds();
  if (fds_after != fds_before)
    finding("open file descriptors went from " + std::to_string(fds_before) + " to " + std::to_string(fds_after) +
            " (a leak)");
  return 0;
}

}  // namespace tvc_fuzz
