// Python pickles of PyTorch checkpoints: a restricted unpickler and a protocol-2 pickler.
//
// The unpickler runs only the opcodes a state_dict or training checkpoint needs and resolves
// only the globals those use (OrderedDict, torch's tensor rebuild functions and storage types,
// sets, latin-1 bytes, NumPy's dtype, ndarray and scalar, which are decoded, not called);
// anything else is refused by name, never executed, or in opaque mode recorded as a placeholder
// (the global's name, the arguments, BUILD's state, the items put into it), still never run. Every container
// operation is type-checked, the stack, marks, memo, nesting depth and object count are bounded,
// and every length is checked against the remaining input before memory is allocated.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/file.h"
#include "tvc/serialize.h"

namespace tvc::io {

// The bytes a pickle is read from: a buffer in memory (zip data.pkl), or a file from an offset
// on (legacy .pth, where a pickle's length is only known once it is read), read in bounded
// chunks as the unpickler asks for them.
class PickleInput {
 public:
  PickleInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  PickleInput(const InputFile& file, uint64_t offset);

  uint64_t position() const { return position_; }  // bytes consumed
  uint64_t remaining() const { return size_ - position_; }
  // Copies the next n bytes to dst; the caller has checked n <= remaining().
  void read(void* dst, size_t n);

 private:
  const uint8_t* data_ = nullptr;    // memory input
  const InputFile* file_ = nullptr;  // file input: bytes [offset_, file size)
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
  uint64_t position_ = 0;
  std::vector<uint8_t> window_;  // file input: bytes [window_start_, +window_.size())
  uint64_t window_start_ = 0;
};

// A persistent id of a tensor storage: ('storage', torch.<X>Storage, key, location, numel),
// legacy files adding view_metadata (which must be None).
struct PersistentId {
  FileDType dtype;
  std::string key;
  std::string location;
  uint64_t numel = 0;
};
// Gives the storage a persistent id names: numel elements of dtype (its nbytes exactly
// numel * element size). Called once per BINPERSID; the caller shares storages by key.
using PersistentLoad = std::function<std::shared_ptr<Storage>(const PersistentId& id)>;

// Reads one pickle. load() runs it to STOP; value() then builds the Value, after the caller
// has filled the storages (a legacy file's storages follow its pickles).
class Unpickler {
 public:
  // file and source name the input in errors ("'model.pth': archive/data.pkl: ...").
  // Without persistent_load, a BINPERSID is an error. opaque_objects: ReadOptions'.
  Unpickler(std::string file, std::string source, PersistentLoad persistent_load = {}, bool opaque_objects = false);
  ~Unpickler();
  Unpickler(Unpickler&&) noexcept;
  Unpickler& operator=(Unpickler&&) noexcept;

  void load(PickleInput& input);
  // Tensors of file dtypes tvc lacks are an error naming their path, or with widen become
  // their widened_dtype (one converted copy per storage, shared by its tensors).
  Value value(bool widen = false) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A storage a pickle refers to, written as the zip entry "<stem>/data/<key>": numel elements
// of dtype from byte_offset of storage on.
struct PickledStorage {
  std::string key;  // "0", "1", ... in order of first use
  std::shared_ptr<Storage> storage;
  FileDType dtype;
  uint64_t numel = 0;
  uint64_t byte_offset = 0;
};

// Pickle protocol 2 of value, as torch.save writes data.pkl. Each tensor is
// _rebuild_tensor_v2 of a persistent id ('storage', torch.<X>Storage, key, 'cpu', numel) with
// its own offset, sizes and strides. Tensors of one dtype viewing one tvc Storage share one
// key, which holds the elements from the lowest to the highest one they use (the whole storage
// when they cover it; only the used part of, say, a memory-mapped file). Tensors must be on
// the CPU. storages receives the storages in key order.
std::string pickle_value(const Value& value, std::vector<PickledStorage>& storages);

}  // namespace tvc::io
