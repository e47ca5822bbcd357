#include "tvc/storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include "tvc/error.h"
#include "tvc/internal/kernel.h"

namespace tvc {

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  constexpr size_t kAlign = 64;
  TVC_CHECK(nbytes <= (size_t{1} << 46), "Storage::allocate: ", nbytes, " bytes is beyond any real allocation");
  if (device != Device::CPU) {
    // Device memory comes from the backend that registered it (kernels/<device>).
    const DeviceMemory& memory = device_memory(device, "Storage::allocate");
    void* data = nbytes ? memory.allocate(nbytes) : nullptr;
    return std::shared_ptr<Storage>(new Storage(data, nbytes, memory.release, device));
  }
  size_t rounded = (nbytes + kAlign - 1) / kAlign * kAlign;
  void* data = rounded ? std::aligned_alloc(kAlign, rounded) : nullptr;
  TVC_CHECK(data != nullptr || rounded == 0, "Storage::allocate: out of memory allocating ", nbytes, " bytes");
  return std::shared_ptr<Storage>(new Storage(
      data, nbytes, [](void* p) { std::free(p); }, device));
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, Deleter deleter, Device device) {
  return std::shared_ptr<Storage>(new Storage(data, nbytes, std::move(deleter), device));
}

std::shared_ptr<Storage> Storage::map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TVC_CHECK(fd >= 0, "map_file: cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(cat_str("map_file: cannot stat '", path, "': ", std::strerror(err)));
  }
  auto size = static_cast<size_t>(st.st_size);
  void* data = nullptr;
  if (size > 0) {
    data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw Error(cat_str("map_file: cannot map '", path, "' (", size, " bytes): ", std::strerror(err)));
    }
  }
  ::close(fd);  // the mapping stays valid
  return wrap(data, size, [size](void* p) { ::munmap(p, size); });
}

Storage::~Storage() {
  if (deleter_ && data_) deleter_(data_);
}

}  // namespace tvc
