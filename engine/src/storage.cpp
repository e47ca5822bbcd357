#include "tvc/storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "tvc/error.h"
#include "tvc/internal/kernel.h"

#if defined(__SANITIZE_ADDRESS__)
#define TVC_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TVC_ASAN 1
#endif
#endif
#ifdef TVC_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace tvc {
namespace {

// The kept blocks, in the order they were given back (see set_cpu_cache_limit). A request takes
// the most recently given block that fits it, up to twice its size: the memory a model's last
// layer let go of is likely still in cache, where a block of the exact size, from the previous
// call, no longer is. Measured on Sapphire Rapids, 2 threads (against exact sizes within 1/8 from
// 1 MiB up): mobilenet_v2 0.94x the time at batch 1 and 0.96x at batch 8, densenet121 0.95x and
// 0.97x with 0.64x the peak memory at batch 8, resnet50 and vit_b_16 the same. Under
// AddressSanitizer a kept block is poisoned, so a use after its tensor died is still reported.
class BlockCache {
 public:
  static constexpr size_t kMinBlock = size_t{128} << 10;

  BlockCache() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const size_t physical = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
    limit_ = std::min(physical / 4, size_t{4} << 30);
  }

  struct Block {
    void* data;
    size_t size;
  };
  // The most recently kept block of size to 2 * size bytes, or {nullptr, 0}.
  Block take(size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = blocks_.size(); i-- > 0;) {
      if (blocks_[i].size < size || blocks_[i].size / 2 > size) continue;
      const Block block = blocks_[i];
      blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
      kept_ -= block.size;
#ifdef TVC_ASAN
      ASAN_UNPOISON_MEMORY_REGION(block.data, block.size);
#endif
      return block;
    }
    return {nullptr, 0};
  }

  // Keeps the block p of size bytes, or frees it when that would pass the limit.
  void give(void* p, size_t size) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (kept_ + size <= limit_) {
#ifdef TVC_ASAN
        ASAN_POISON_MEMORY_REGION(p, size);
#endif
        blocks_.push_back({p, size});
        kept_ += size;
        return;
      }
    }
    std::free(p);
  }

  void set_limit(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = bytes;
    trim_to(limit_);
  }
  size_t limit() {
    std::lock_guard<std::mutex> lock(mutex_);
    return limit_;
  }
  size_t kept() {
    std::lock_guard<std::mutex> lock(mutex_);
    return kept_;
  }
  void empty() {
    std::lock_guard<std::mutex> lock(mutex_);
    trim_to(0);
  }

 private:
  // Frees the largest blocks until at most bytes are kept (mutex_ held); the others keep their order.
  void trim_to(size_t bytes) {
    while (kept_ > bytes) {
      auto largest = std::max_element(blocks_.begin(), blocks_.end(),
                                      [](const Block& a, const Block& b) { return a.size < b.size; });
#ifdef TVC_ASAN
      ASAN_UNPOISON_MEMORY_REGION(largest->data, largest->size);
#endif
      std::free(largest->data);
      kept_ -= largest->size;
      blocks_.erase(largest);
    }
  }

  std::mutex mutex_;
  std::vector<Block> blocks_;  // in the order they were kept
  size_t kept_ = 0, limit_ = 0;
};

// Never destroyed: tensors that outlive static destruction still give their blocks back to it.
BlockCache& block_cache() {
  static BlockCache* cache = new BlockCache;
  return *cache;
}

}  // namespace

void set_cpu_cache_limit(size_t bytes) { block_cache().set_limit(bytes); }
size_t cpu_cache_limit() { return block_cache().limit(); }
size_t cpu_cached_bytes() { return block_cache().kept(); }
void empty_cpu_cache() { block_cache().empty(); }

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  constexpr size_t kAlign = 64;
  TVC_CHECK(nbytes <= (size_t{1} << 46), "Storage::allocate: ", nbytes, " bytes is beyond any real allocation");
  if (device != Device::CPU) {
    // Device memory comes from the backend that registered it (kernels/<device>).
    const DeviceMemory& memory = device_memory(device, "Storage::allocate");
    void* data = nbytes ? memory.allocate(nbytes) : nullptr;
    return std::shared_ptr<Storage>(new Storage(data, nbytes, memory.release, device, true));
  }
  size_t rounded = (nbytes + kAlign - 1) / kAlign * kAlign;
  if (rounded >= BlockCache::kMinBlock) {
    BlockCache& cache = block_cache();
    BlockCache::Block block = cache.take(rounded);
    if (!block.data) {
      block = {std::aligned_alloc(kAlign, rounded), rounded};
      TVC_CHECK(block.data != nullptr, "Storage::allocate: out of memory allocating ", nbytes, " bytes");
    }
    return std::shared_ptr<Storage>(new Storage(
        block.data, nbytes, [&cache, size = block.size](void* p) { cache.give(p, size); }, device, true));
  }
  void* data = rounded ? std::aligned_alloc(kAlign, rounded) : nullptr;
  TVC_CHECK(data != nullptr || rounded == 0, "Storage::allocate: out of memory allocating ", nbytes, " bytes");
  return std::shared_ptr<Storage>(new Storage(
      data, nbytes, [](void* p) { std::free(p); }, device, true));
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, Deleter deleter, Device device) {
  return std::shared_ptr<Storage>(new Storage(data, nbytes, std::move(deleter), device, false));
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
  return std::shared_ptr<Storage>(new Storage(
      data, size, [size](void* p) { ::munmap(p, size); }, Device::CPU, true));
}

Storage::~Storage() {
  if (deleter_ && data_) deleter_(data_);
}

namespace {
std::mutex& derived_mutex() {
  static std::mutex m;
  return m;
}
std::atomic<bool> g_keep_derived{true};
}  // namespace

void set_keep_derived_data(bool keep) { g_keep_derived.store(keep, std::memory_order_relaxed); }
bool keep_derived_data() { return g_keep_derived.load(std::memory_order_relaxed); }

bool Storage::keeps_derived() const { return owned_ && keep_derived_data(); }

std::shared_ptr<const void> Storage::derived(const DerivedKey& key) const {
  if (!keeps_derived()) return nullptr;
  const uint64_t now = version();
  std::lock_guard<std::mutex> lock(derived_mutex());
  for (const Derived& d : derived_)
    if (d.key == key && d.version == now) return d.data;
  return nullptr;
}

void Storage::set_derived(const DerivedKey& key, std::shared_ptr<const void> data) {
  if (!keeps_derived()) return;
  const uint64_t now = version();
  std::vector<Derived> dropped;  // freed after the lock is released
  std::lock_guard<std::mutex> lock(derived_mutex());
  for (auto it = derived_.begin(); it != derived_.end();) {
    if (it->version != now || it->key == key) {
      dropped.push_back(std::move(*it));
      it = derived_.erase(it);
    } else {
      ++it;
    }
  }
  derived_.push_back({key, now, std::move(data)});
  has_derived_.store(true, std::memory_order_relaxed);
}

void Storage::drop_derived() {
  std::vector<Derived> dropped;  // freed after the lock is released
  std::lock_guard<std::mutex> lock(derived_mutex());
  dropped.swap(derived_);
  has_derived_.store(false, std::memory_order_relaxed);
}

}  // namespace tvc
