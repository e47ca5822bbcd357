// Weight files: safetensors and PyTorch .pth (zip and legacy formats), read and written.
//
// Readers never trust a size they read: every length, offset, shape product and storage size is
// checked against the file before memory is allocated, and a malformed file raises tvc::Error
// naming the file and the fault (the tensor, pickle opcode, zip entry or header field). Pickles
// go through a restricted unpickler that builds only dicts, lists, tuples, sets, numbers,
// strings, bytes, tensors and NumPy arrays and scalars; any other global is refused by name,
// never executed, or with ReadOptions::opaque_objects read as a named placeholder holding the
// arguments and state the pickle gave it (OpaqueObject), still without importing or calling
// anything.
//
// Writers are crash-safe: the file is written under a temporary name in the same folder,
// fsynced, renamed over the real name, and the folder fsynced, so an interrupted save leaves the
// previous file (or none) and never a truncated one.
//
//   auto weights = tvc::io::load_state_dict("resnet50-11ad3fa6.pth");   // name -> tensor
//   model.load_state_dict("finetuned.safetensors");                      // nn::Module overload
//   tvc::io::load_into(model, "ckpt.pth", {.unwrap = true});             // training checkpoint
//   tvc::io::save_safetensors("out.safetensors", model.state_dict());
//   tvc::io::save_pth("out.pth", tvc::io::Value(model.state_dict()));  // torch.load reads it
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tvc/nn/module.h"
#include "tvc/tensor.h"

namespace tvc::io {

class InputFile;

// ---------------------------------------------------------------- element types of files

// Every element type safetensors and torch.save store. Those with a tvc DType load as tensors
// directly; the others (unsigned 16/32/64-bit, 8/6/4-bit floats, complex) load only widened
// (ReadOptions::widen) or are copied as bytes between safetensors files.
enum class FileDType : uint8_t {
  Bool,
  UInt8,
  Int8,
  Int16,
  UInt16,
  Int32,
  UInt32,
  Int64,
  UInt64,
  Float16,
  BFloat16,
  Float32,
  Float64,
  Float8E4M3,
  Float8E5M2,
  Float8E4M3Fnuz,
  Float8E5M2Fnuz,
  Float8E8M0,
  Float6E2M3,
  Float6E3M2,
  Float4E2M1,
  Complex64,
  Complex128,
};

// "F32", "F8_E4M3", ... as safetensors headers spell them; "C128" for Complex128 (torch only).
const char* safetensors_name(FileDType dtype);
std::optional<FileDType> file_dtype_from_safetensors(const std::string& name);
// "FloatStorage", "Float8_e4m3fnStorage", ... as torch.save names storage types; null where
// torch has none (Float6*, Float4E2M1, Float8E8M0).
const char* torch_storage_name(FileDType dtype);
std::optional<FileDType> file_dtype_from_torch_storage(const std::string& name);
// Bits of one element (4 for Float4E2M1, 6 for the Float6 types).
int bit_size(FileDType dtype);
// The tvc dtype holding these values exactly, if tvc has one.
std::optional<DType> exact_dtype(FileDType dtype);
// The tvc dtype a widened load gives: UInt16 -> Int32, UInt32/UInt64 -> Int64 (UInt64 values
// beyond int64 are an error), every 8/6/4-bit float -> Float32. Complex: none.
std::optional<DType> widened_dtype(FileDType dtype);
FileDType file_dtype(DType dtype);

// Decodes one float8/float6/float4 element (its bits in the low bits of `bits`) to float32,
// exactly as the OCP / torch definitions give it (NaN, infinities, subnormals included).
float decode_small_float(FileDType dtype, uint8_t bits);

// ---------------------------------------------------------------- options

struct ReadOptions {
  // Load element types tvc lacks as their widened dtype (see widened_dtype) instead of failing.
  bool widen = false;
  // Safetensors only: tensors are views of the file's private memory map (zero copy; pages are
  // read when touched) instead of copies. A view keeps the mapping alive. Caveat of any mmap: a
  // file truncated by another process while mapped views exist makes touching them fault, so
  // the default copies, which reads with pread() and reports a shrunk file as an error.
  bool map = false;
  // .pth only: a class or function outside the allow-list (argparse.Namespace, a model's own
  // classes, os.system...) becomes an OpaqueObject recording its name and what the pickle passed
  // to it (REDUCE/NEWOBJ arguments, BUILD state, items), instead of failing the load. Nothing is
  // imported or called; a placeholder never becomes a tensor, a storage or a callable. Reads
  // Lightning and timm training checkpoints and whole-model saves (torch.save(model)).
  bool opaque_objects = false;
};

// ---------------------------------------------------------------- checkpoint values

struct OpaqueObject;

// A value of a PyTorch checkpoint: what torch.load(weights_only=True) returns, restricted to
// what tvc represents, plus the placeholders of ReadOptions::opaque_objects. Dicts keep
// insertion order; keys are strings or ints. Tensors read from one storage share one tvc Storage
// (views keep their offsets and strides). NumPy arrays whose dtype tvc has (or widens to) are
// tensors, NumPy scalars are numbers; other NumPy data is an OpaqueObject "numpy.ndarray" or
// "numpy.scalar" whose state is {"dtype": "<c16", "shape": (...), "fortran_order": bool, "data":
// bytes in memory order} (scalars: dtype and data).
class Value {
 public:
  enum class Kind : uint8_t { None, Bool, Int, Float, String, Bytes, Tensor, List, Tuple, Set, Dict, Object };
  using Items = std::vector<std::pair<Value, Value>>;

  Value() = default;  // None
  explicit Value(bool b);
  explicit Value(int64_t i);
  explicit Value(int i) : Value(static_cast<int64_t>(i)) {}
  explicit Value(double f);
  explicit Value(std::string s);
  explicit Value(const char* s) : Value(std::string(s)) {}
  explicit Value(Tensor t);
  // A state_dict as an OrderedDict of tensors.
  explicit Value(const nn::StateDict& state_dict);
  static Value bytes(std::string data);
  static Value list(std::vector<Value> items = {});
  static Value tuple(std::vector<Value> items = {});
  static Value set(std::vector<Value> items = {});
  // ordered: an OrderedDict (pickled as collections.OrderedDict) rather than a dict.
  static Value dict(Items items = {}, bool ordered = false);
  static Value object(OpaqueObject object);

  Kind kind() const { return kind_; }
  const char* kind_name() const;  // "None", "bool", "int", "float", "str", "bytes", "Tensor", ...
  bool is_none() const { return kind_ == Kind::None; }
  bool to_bool() const;
  int64_t to_int() const;
  double to_float() const;
  const std::string& to_string() const;  // String and Bytes
  const Tensor& to_tensor() const;
  const std::vector<Value>& elements() const;  // List, Tuple, Set
  std::vector<Value>& elements();
  const Items& items() const;  // Dict
  Items& items();
  const OpaqueObject& object() const;  // Object
  bool ordered() const { return ordered_; }
  // Dict lookup by string key; null when absent or not a dict.
  const Value* find(const std::string& key) const;
  // Python's == for every kind but Tensor, which compares dtype, shape and values bit for bit.
  bool operator==(const Value& other) const;

 private:
  Kind kind_ = Kind::None;
  bool ordered_ = false;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string string_;
  Tensor tensor_;
  std::shared_ptr<std::vector<Value>> elements_;
  std::shared_ptr<Items> items_;
  std::shared_ptr<const OpaqueObject> object_;
};

// A class instance or call result a pickle describes, read as data (ReadOptions::opaque_objects):
// what unpickling would have done, recorded instead of done.
struct OpaqueObject {
  enum class Made : uint8_t {
    Global,  // the class or function itself (GLOBAL alone), e.g. a model's norm_layer class
    Call,    // global(*args) (REDUCE), e.g. os.system('...'), torch.device('cpu')
    New,     // global.__new__(global, *args) (NEWOBJ): an instance, e.g. argparse.Namespace
  };
  std::string global{};  // "module.name" as the pickle names it: "argparse.Namespace"
  Made made = Made::Global;
  std::vector<Value> args{};      // of the call or of __new__
  Value state{};                  // BUILD's state (usually the instance's __dict__); None if none
  std::vector<Value> appended{};  // APPEND(S) onto the instance (a list subclass)
  Value::Items set_items{};       // SETITEM(S) onto the instance (a dict subclass, defaultdict)

  bool operator==(const OpaqueObject& other) const;
};

// Python-like text of a value for listings, strings escaped (printable), cut to about
// max_chars: 'x', 3, 0.10000000000000001, [1, 2], {'lr': 0.1}, tensor(float32, [3, 4]),
// argparse.Namespace(lr=0.1, name='x'), os.system('touch f').
std::string repr(const Value& value, size_t max_chars = 300);

// Whole-model saves (torch.save(model), read with ReadOptions::opaque_objects): whether value is
// a torch.nn.Module instance (an object whose state holds _parameters, _buffers and _modules).
bool is_module(const Value& value);
// The state_dict PyTorch's module.state_dict() gives: each module's parameters, then its
// persistent buffers (those not in _non_persistent_buffers_set), then its children's, depth
// first in registration order, skipping None entries; tensors detached. Classes that override
// state_dict or _save_to_state_dict (quantized modules, get_extra_state) are not replayed:
// their code is not run. file names the file in errors.
nn::StateDict module_state_dict(const Value& module, const std::string& file = "");

// Every leaf of a nested value (anything but a dict, list, tuple or module) under its dotted
// path: dict keys and list/tuple indices joined by "." ("optimizer.state.0.exp_avg"), in order.
// A whole module (is_module) flattens to its module_state_dict under its path.
std::vector<std::pair<std::string, Value>> flatten(const Value& value);
// The tensor leaves of flatten(value).
std::vector<std::pair<std::string, Tensor>> flatten_tensors(const Value& value);

// ---------------------------------------------------------------- formats

enum class WeightFormat : uint8_t { Safetensors, PthZip, PthLegacy };
const char* format_name(WeightFormat format);  // "safetensors", "pth (zip)", "pth (legacy)"
// From the content: zip signature, pickle protocol 2 magic number, else safetensors (which the
// reader then validates). Throws naming the file when it cannot be opened.
WeightFormat detect_format(const std::string& path);
// The format a file to write asks for by its extension: .safetensors (Safetensors), .pth or .pt
// (PthZip); another extension throws naming the path.
WeightFormat format_for_extension(const std::string& path);

// ---------------------------------------------------------------- safetensors

// One tensor of a safetensors header.
struct SafetensorsEntry {
  std::string name{};
  FileDType dtype{};
  Shape shape{};
  uint64_t begin = 0;   // data_offsets, relative to the data section
  uint64_t nbytes = 0;  // end - begin
};

// A validated safetensors file. open() checks everything the reference implementation checks
// (header length <= 100,000,000 and inside the file, UTF-8 JSON object, known dtypes, shape
// products and byte sizes without overflow, offsets contiguous from 0 without holes or overlap,
// data ending exactly at the end of the file) plus duplicate keys and non-string metadata.
// The data is not read until asked for.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);
  const std::string& path() const { return path_; }
  // In data order.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  // Throws naming the tensor and the file when absent.
  const SafetensorsEntry& entry(const std::string& name) const;
  // The "__metadata__" string map, empty when the file has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor, as exact_dtype (or widened_dtype with options.widen), contiguous.
  Tensor tensor(const std::string& name, const ReadOptions& options = {}) const;
  // The stored little-endian bytes of one tensor.
  std::vector<uint8_t> bytes(const std::string& name) const;

 private:
  std::string path_;
  std::shared_ptr<InputFile> file_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<Storage> mapping_;  // the whole file, mapped privately
};

// A tensor to write as raw bytes of a file dtype (used to copy types tvc cannot hold).
struct RawTensor {
  FileDType dtype{};
  Shape shape{};
  std::vector<uint8_t> bytes{};  // little-endian, row-major; size checked against shape and dtype
};

// Writes tensors (any strides; written row-major) and metadata. The header lists the tensors
// by name with "__metadata__" first and is padded with spaces to a multiple of 8; data is
// ordered by decreasing element size, then name, so every tensor is aligned. Names must be
// unique and non-empty.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
void save_safetensors(const std::string& path, const nn::StateDict& state_dict,
                      const std::map<std::string, std::string>& metadata = {});
void save_safetensors_raw(const std::string& path, const std::vector<std::pair<std::string, RawTensor>>& tensors,
                          const std::map<std::string, std::string>& metadata = {});

// ---------------------------------------------------------------- PyTorch .pth

// torch.save's zip format (any top-level folder name, stored or deflated entries, zip64) or the
// legacy format (magic number, protocol, sys_info and object pickles followed by raw storages).
// Big-endian files are refused. ReadOptions::map is ignored (.pth tensors are always copies).
Value load_pth(const std::string& path, const ReadOptions& options = {});

// torch.save's zip format, pickle protocol 2, storages stored (not deflated) and aligned to 64
// bytes, top-level folder "archive". Tensors sharing a tvc Storage share one saved storage;
// strides and offsets are kept. torch.load(path, weights_only=True) reads it back equal.
// Supported values: everything Value holds but opaque objects (an error naming their path);
// bytes need torch >= 2.1 to load with weights_only.
void save_pth(const std::string& path, const Value& value);

// ---------------------------------------------------------------- any format

// The whole file as a Value: .pth as saved; safetensors as an ordered dict name -> tensor,
// sorted by name (the file keeps no other order that means anything).
Value load(const std::string& path, const ReadOptions& options = {});

// A state_dict from a weight file of any format. unwrap: take the weights out of a training
// checkpoint ({"state_dict": ...}, {"model_state_dict": ...}, {"model": ...}, descending while
// one applies) and drop a "module." prefix that every key has (DataParallel/DDP). A whole-model
// save (read with read.opaque_objects) gives its module_state_dict, also where unwrap finds one.
// Nested dicts flatten to dotted names; a non-tensor leaf is an error naming its path.
struct StateDictOptions {
  ReadOptions read{};
  bool unwrap = false;
};
nn::StateDict load_state_dict(const std::string& path, const StateDictOptions& options = {});
// Writes bytes (a text file: metrics, a recipe) to path crash-safely, as the weight writers do.
void write_file_atomic(const std::string& path, const std::string& bytes);

// Writes a state_dict in the format of path's extension (format_for_extension): safetensors
// (names sorted) or torch.save's zip format (an OrderedDict in the dict's order).
void save_state_dict(const std::string& path, const nn::StateDict& state_dict);

// The module loads a state_dict file of any format: module.load_state_dict(load_state_dict(
// path, options), strict, assign), except that tensors whose dtype differs from the module's
// (a float16 file into a float32 model) are converted first, also with assign.
nn::IncompatibleKeys load_into(nn::Module& module, const std::string& path, const StateDictOptions& options = {},
                               bool strict = true, bool assign = false);
// module.load_state_dict(state_dict, strict, assign) after converting the tensors whose dtype
// differs from the module's to the module's dtype.
nn::IncompatibleKeys load_converted(nn::Module& module, nn::StateDict state_dict, bool strict = true,
                                    bool assign = false);

}  // namespace tvc::io
