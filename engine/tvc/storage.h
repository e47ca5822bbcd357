// Reference-counted memory that tensors view.
//
// A Storage owns (or borrows, or maps) one buffer and calls its deleter when the last tensor
// viewing it goes away. It also carries the version counter that every view of it shares: each
// in-place write bumps it, and autograd compares it with the version saved for backward.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tvc/dtype.h"

namespace tvc {

class Storage {
 public:
  using Deleter = std::function<void(void*)>;

  // Fresh, uninitialised, 64-byte aligned memory. Throws tvc::Error when nbytes cannot be had.
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device = Device::CPU);
  // An existing buffer, not copied; deleter (may be empty) runs when the storage dies. No
  // alignment is assumed of data. Used for external buffers and memory maps.
  static std::shared_ptr<Storage> wrap(void* data, size_t nbytes, Deleter deleter, Device device = Device::CPU);
  // The whole file at path mapped privately (copy-on-write: writes never reach the file), read
  // lazily by the kernel's page cache; unmapped when the storage dies. Throws tvc::Error naming
  // the file when it cannot be opened or mapped.
  static std::shared_ptr<Storage> map_file(const std::string& path);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  // A write's new version; what was derived from the old contents (below) is freed.
  void bump_version() {
    version_.fetch_add(1, std::memory_order_relaxed);
    if (has_derived_.load(std::memory_order_relaxed)) drop_derived();
  }

  // Data a kernel derives from this storage's contents and keeps with it: a convolution's weight
  // in the layout its fastest kernel reads, made on the first call and reused by the next ones.
  // The key names what was derived and from which part (the kernel's choice of four numbers).
  // derived(key) is the data stored under key at the storage's present version, or null;
  // set_derived(key, data) stores data for the present version, dropping every entry of an older
  // one; bump_version drops them all (a training step's weights hold no stale copies). Tensor ops
  // that write in place bump the version; a write through a raw pointer
  // (data_ptr) must be followed by bump_version(), as for autograd's saved tensors. Memory that a
  // caller wrapped (wrap, from_blob) can change behind tvc's back: nothing is kept for it (derived
  // is always null). Thread-safe; the data dies with the storage. set_keep_derived_data(false)
  // keeps nothing more (see below).
  using DerivedKey = std::array<int64_t, 4>;
  std::shared_ptr<const void> derived(const DerivedKey& key) const;
  void set_derived(const DerivedKey& key, std::shared_ptr<const void> data);
  // Whether derived data is kept for this storage now: tvc's own memory (not wrapped), and
  // keeping on. Where not, derived is always null and set_derived keeps nothing.
  bool keeps_derived() const;

 private:
  Storage(void* data, size_t nbytes, Deleter deleter, Device device, bool owned)
      : data_(data), nbytes_(nbytes), deleter_(std::move(deleter)), device_(device), owned_(owned) {}
  void drop_derived();  // frees every entry of derived_
  struct Derived {
    DerivedKey key;
    uint64_t version;
    std::shared_ptr<const void> data;
  };
  void* data_;
  size_t nbytes_;
  Deleter deleter_;
  Device device_;
  bool owned_;  // allocated or mapped by tvc (not wrapped): kernels may keep derived data
  std::atomic<uint64_t> version_{0};
  std::vector<Derived> derived_;          // under a mutex of storage.cpp
  std::atomic<bool> has_derived_{false};  // derived_ not empty (read without the mutex)
};

// Whether kernels keep data derived from storages (Storage::derived): on by default. A model run
// without autograd then holds a second copy of the weights of its convolutions and linear layers
// in their kernels' layouts (packed once instead of on every call). Off, nothing more is kept:
// every call derives what it reads (less memory, slower small-batch inference); what is kept
// already goes when its storage dies or is written.
void set_keep_derived_data(bool keep);
bool keep_derived_data();

// Large CPU blocks (128 KiB and up) that tensors free are kept for reuse, so that a model's
// activations do not fault their pages in afresh on every call: a request takes the most recently
// kept block of its size up to twice its size (likely still in the processor's cache), and at most
// cpu_cache_limit() bytes are kept (by default a quarter of the physical memory, at most 4 GiB; 0
// keeps none). Thread-safe.
void set_cpu_cache_limit(size_t bytes);  // also frees what is kept beyond the new limit
size_t cpu_cache_limit();
size_t cpu_cached_bytes();  // kept now, not in use by any tensor
void empty_cpu_cache();     // returns every kept block to the system

}  // namespace tvc
