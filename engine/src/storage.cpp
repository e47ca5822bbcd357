#include "tvc/storage.h"

#include <cstdlib>
#include <new>

#include "tvc/error.h"

namespace tvc {

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  TVC_CHECK(device == Device::CPU, "Storage::allocate: device ", device_name(device),
            " has no allocator in this build");
  constexpr size_t kAlign = 64;
  TVC_CHECK(nbytes <= (size_t{1} << 46), "Storage::allocate: ", nbytes,
            " bytes is beyond any real allocation");
  size_t rounded = (nbytes + kAlign - 1) / kAlign * kAlign;
  void* data = rounded ? std::aligned_alloc(kAlign, rounded) : nullptr;
  TVC_CHECK(data != nullptr || rounded == 0, "Storage::allocate: out of memory allocating ",
            nbytes, " bytes");
  return std::shared_ptr<Storage>(new Storage(data, nbytes, [](void* p) { std::free(p); }, device));
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, Deleter deleter, Device device) {
  return std::shared_ptr<Storage>(new Storage(data, nbytes, std::move(deleter), device));
}

Storage::~Storage() {
  if (deleter_ && data_) deleter_(data_);
}

}  // namespace tvc
