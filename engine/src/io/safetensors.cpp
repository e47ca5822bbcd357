// safetensors: 8-byte little-endian header length N, N bytes of UTF-8 JSON
//   {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}}
// then the data section, each tensor little-endian and row-major at [b, e).
#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "io/file.h"
#include "io/file_dtype.h"
#include "tvc/error.h"
#include "tvc/internal/tensor_impl.h"
#include "tvc/serialize.h"

namespace tvc::io {

namespace {

constexpr uint64_t kMaxHeaderSize = 100'000'000;  // the reference implementation's limit

// Index of the first byte that breaks UTF-8, or npos.
size_t invalid_utf8_at(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len = utf8_char_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string::npos;
}

// Builds the entries straight from the JSON event stream, so that the header's shape is checked
// as it is read: an object of objects, three levels deep at most, no duplicate keys.
class HeaderReader : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit HeaderReader(const std::string& path) : path_(path) {}

  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;

  bool null() override { return scalar("null"); }
  bool boolean(bool) override { return scalar("a boolean"); }
  bool number_integer(number_integer_t v) override {
    return v >= 0 ? number_unsigned(static_cast<uint64_t>(v)) : scalar("a negative number");
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (depth_ == 3 && in_tensor()) {
      numbers_.push_back(v);
      return true;
    }
    return scalar("a number");
  }
  bool number_float(number_float_t, const string_t& text) override { return scalar("the non-integer number " + text); }
  bool string(string_t& v) override {
    if (depth_ == 2 && in_metadata()) {
      metadata[field_] = v;
      return true;
    }
    if (depth_ == 2 && in_tensor() && field_ == "dtype") {
      auto dtype = file_dtype_from_safetensors(v);
      if (!dtype) fail(cat_str("tensor '", printable(entry_), "' has unknown dtype '", printable(v), "'"));
      entries.back().dtype = *dtype;
      seen_.insert("dtype");
      return true;
    }
    return scalar("a string");
  }
  bool binary(binary_t&) override { return scalar("binary data"); }

  bool start_object(std::size_t) override {
    if (depth_ == 0) {
      depth_ = 1;
      return true;
    }
    if (depth_ == 1) {
      depth_ = 2;
      field_keys_.clear();
      if (!in_metadata()) {
        entries.push_back({.name = entry_});
        seen_.clear();
      }
      return true;
    }
    return scalar("an object");
  }
  bool end_object() override {
    if (depth_ == 2 && in_tensor()) {
      for (const char* field : {"dtype", "shape", "data_offsets"})
        if (!seen_.count(field)) fail(cat_str("tensor '", printable(entry_), "' has no \"", field, "\""));
    }
    --depth_;
    return true;
  }
  bool key(string_t& k) override {
    if (depth_ == 1) {
      if (!top_keys_.insert(k).second)
        fail(k == "__metadata__" ? std::string("\"__metadata__\" appears twice")
                                 : cat_str("duplicate tensor name '", printable(k), "'"));
      entry_ = k;
      return true;
    }
    if (!field_keys_.insert(k).second)
      fail(in_metadata() ? cat_str("duplicate key '", printable(k), "' in \"__metadata__\"")
                         : cat_str("tensor '", printable(entry_), "' has \"", printable(k), "\" twice"));
    if (in_tensor() && k != "dtype" && k != "shape" && k != "data_offsets")
      fail(cat_str("tensor '", printable(entry_), "' has an unknown field \"", printable(k), "\""));
    field_ = k;
    return true;
  }
  bool start_array(std::size_t) override {
    if (depth_ == 2 && in_tensor() && (field_ == "shape" || field_ == "data_offsets")) {
      depth_ = 3;
      numbers_.clear();
      return true;
    }
    return scalar("an array");
  }
  bool end_array() override {
    depth_ = 2;
    SafetensorsEntry& e = entries.back();
    if (field_ == "shape") {
      e.shape.clear();
      for (uint64_t d : numbers_) {
        if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          fail(cat_str("tensor '", printable(entry_), "' has a dimension of ", d, ", beyond int64"));
        e.shape.push_back(static_cast<int64_t>(d));
      }
    } else {
      if (numbers_.size() != 2)
        fail(cat_str("tensor '", printable(entry_), "' has ", numbers_.size(), " data_offsets instead of 2"));
      if (numbers_[1] < numbers_[0])
        fail(cat_str("tensor '", printable(entry_), "' has data_offsets [", numbers_[0], ", ", numbers_[1],
                     "] that end before they begin"));
      e.begin = numbers_[0];
      e.nbytes = numbers_[1] - numbers_[0];
    }
    seen_.insert(field_);
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    fail(cat_str("the header is not valid JSON (at byte ", position, " of the header): ", printable(ex.what())));
  }

 private:
  bool in_metadata() const { return entry_ == "__metadata__"; }
  bool in_tensor() const { return !in_metadata(); }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(cat_str("'", printable(path_), "': invalid safetensors header: ", what));
  }
  bool scalar(const std::string& what) {
    if (depth_ == 0) fail("it is not a JSON object");
    if (depth_ == 1) fail(cat_str("entry '", printable(entry_), "' is ", what, ", not an object"));
    if (in_metadata()) fail(cat_str("\"__metadata__\" value of '", printable(field_), "' is ", what, ", not a string"));
    fail(cat_str("tensor '", printable(entry_), "' has ", what, " where its \"", printable(field_), "\" ",
                 depth_ == 3 ? "lists non-negative integers" : "belongs"));
  }

  std::string path_;
  int depth_ = 0;      // 1: top object, 2: an entry, 3: an entry's array
  std::string entry_;  // the current top-level key
  std::string field_;  // the current key inside an entry
  std::set<std::string> top_keys_, field_keys_, seen_;
  std::vector<uint64_t> numbers_;
};

// Bytes of numel elements of dtype; throws naming the tensor on overflow or a partial byte.
uint64_t byte_size(const std::string& path, const std::string& name, FileDType dtype, const Shape& shape) {
  uint64_t numel = 1;
  for (int64_t d : shape) {
    auto ud = static_cast<uint64_t>(d);
    TVC_CHECK(ud == 0 || numel <= std::numeric_limits<uint64_t>::max() / ud, "'", printable(path),
              "': invalid safetensors header: tensor '", printable(name), "' has shape ", shape_str(shape),
              " whose element count overflows");
    numel *= ud;
  }
  auto bits = static_cast<uint64_t>(bit_size(dtype));
  TVC_CHECK(numel <= std::numeric_limits<uint64_t>::max() / bits, "'", printable(path),
            "': invalid safetensors header: tensor '", printable(name), "' of shape ", shape_str(shape),
            " has a byte size that overflows");
  TVC_CHECK(numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "'", printable(path),
            "': invalid safetensors header: tensor '", printable(name), "' has more than 2^63 elements");
  TVC_CHECK(numel * bits % 8 == 0, "'", printable(path), "': invalid safetensors header: tensor '", printable(name),
            "' of ", numel, " ", safetensors_name(dtype), " elements does not fill whole bytes");
  return numel * bits / 8;
}

void check_bools(const uint8_t* data, uint64_t n, const std::string& what) {
  for (uint64_t i = 0; i < n; ++i)
    TVC_CHECK(data[i] <= 1, what, ": BOOL element ", i, " has byte value ", int{data[i]},
              " (only 0 and 1 are booleans)");
}

std::string describe(const SafetensorsFile& file, const std::string& name) {
  return cat_str("tensor '", printable(name), "' in '", printable(file.path()), "'");
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.file_ = std::make_shared<InputFile>(path);
  const InputFile& in = *f.file_;
  TVC_CHECK(in.size() >= 8, "'", printable(path), "': not a safetensors file: ", in.size(),
            " bytes, shorter than the 8-byte header length");
  uint8_t len_bytes[8];
  in.read(0, len_bytes, 8, "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  TVC_CHECK(n <= kMaxHeaderSize, "'", printable(path), "': invalid safetensors header: its length ", n,
            " is beyond the limit of ", kMaxHeaderSize, " bytes");
  TVC_CHECK(n <= in.size() - 8, "'", printable(path), "': invalid safetensors header: its length ", n,
            " runs past the end of the file (", in.size(), " bytes)");
  std::string header(n, '\0');
  in.read(8, header.data(), n, "the header");
  size_t bad = invalid_utf8_at(header);
  TVC_CHECK(bad == std::string::npos, "'", printable(path), "': invalid safetensors header: not UTF-8 (byte ", bad,
            " of the header)");
  HeaderReader reader(path);
  nlohmann::json::sax_parse(header, &reader);
  f.metadata_ = std::move(reader.metadata);
  f.entries_ = std::move(reader.entries);

  // The reference rules: sorted by offsets, the entries tile the data section from 0 exactly.
  std::stable_sort(f.entries_.begin(), f.entries_.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.nbytes < b.nbytes;
  });
  f.data_start_ = 8 + n;
  uint64_t data_size = in.size() - f.data_start_;
  uint64_t next = 0;
  for (size_t i = 0; i < f.entries_.size(); ++i) {
    const SafetensorsEntry& e = f.entries_[i];
    TVC_CHECK(e.begin == next, "'", printable(path), "': invalid safetensors header: tensor '", printable(e.name),
              "' starts at data offset ", e.begin, " but the previous tensor ends at ", next,
              e.begin > next ? " (a hole)" : " (overlapping)");
    uint64_t expected = byte_size(path, e.name, e.dtype, e.shape);
    TVC_CHECK(e.nbytes == expected, "'", printable(path), "': invalid safetensors header: tensor '", printable(e.name),
              "' of dtype ", safetensors_name(e.dtype), " and shape ", shape_str(e.shape), " needs ", expected,
              " bytes but its data_offsets span ", e.nbytes);
    TVC_CHECK(e.nbytes <= data_size - next, "'", printable(path), "': tensor '", printable(e.name), "' (data offsets ",
              e.begin, " to ", e.begin + e.nbytes, ") runs past the end of the file (data section of ", data_size,
              " bytes)");
    next += e.nbytes;
    f.index_[e.name] = i;
  }
  TVC_CHECK(next == data_size, "'", printable(path), "': invalid safetensors header: the tensors cover ", next,
            " bytes of data but the file has ", data_size, " after the header");
  if (in.size() > 0) f.mapping_ = Storage::map_file(path);
  return f;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  TVC_CHECK(it != index_.end(), "'", printable(path_), "' has no tensor named '", printable(name), "'");
  return entries_[it->second];
}

std::vector<uint8_t> SafetensorsFile::bytes(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  return file_->read(data_start_ + e.begin, e.nbytes, cat_str("the data of tensor '", printable(name), "'"));
}

Tensor SafetensorsFile::tensor(const std::string& name, const ReadOptions& options) const {
  const SafetensorsEntry& e = entry(name);
  std::string what = describe(*this, name);
  DType dtype = load_dtype(e.dtype, options.widen, what);
  uint64_t offset = data_start_ + e.begin;
  size_t elem = dtype_size(dtype);
  bool exact = exact_dtype(e.dtype).has_value();

  auto impl = std::make_shared<TensorImpl>();
  impl->shape = e.shape;
  impl->strides = contiguous_strides(e.shape);
  impl->dtype = dtype;
  if (options.map && exact && offset % elem == 0 && mapping_) {
    if (e.dtype == FileDType::Bool) check_bools(static_cast<const uint8_t*>(mapping_->data()) + offset, e.nbytes, what);
    impl->storage = mapping_;
    impl->offset = static_cast<int64_t>(offset / elem);
    return Tensor(impl);
  }
  int64_t numel = shape_numel(e.shape);
  if (exact) {
    impl->storage = Storage::allocate(e.nbytes);
    file_->read(offset, impl->storage->data(), e.nbytes, cat_str("the data of tensor '", printable(name), "'"));
    if (e.dtype == FileDType::Bool) check_bools(static_cast<const uint8_t*>(impl->storage->data()), e.nbytes, what);
  } else {
    std::vector<uint8_t> raw = bytes(name);
    impl->storage = Storage::allocate(static_cast<size_t>(numel) * elem);
    widen_elements(e.dtype, raw.data(), numel, impl->storage->data(), what);
  }
  return Tensor(impl);
}

// ---------------------------------------------------------------- writer

namespace {

struct PendingTensor {
  std::string name;
  FileDType dtype;
  Shape shape;
  const uint8_t* data;
  uint64_t nbytes;
};

void write_safetensors(const std::string& path, std::vector<PendingTensor> tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const auto& t : tensors) {
    TVC_CHECK(!t.name.empty(), "save_safetensors '", printable(path), "': a tensor has an empty name");
    TVC_CHECK(t.name != "__metadata__", "save_safetensors '", printable(path),
              "': \"__metadata__\" is reserved and cannot name a tensor");
    TVC_CHECK(names.insert(t.name).second, "save_safetensors '", printable(path), "': tensor name '", printable(t.name),
              "' appears twice");
    TVC_CHECK(invalid_utf8_at(t.name) == std::string::npos, "save_safetensors '", printable(path), "': tensor name '",
              printable(t.name), "' is not UTF-8");
    uint64_t expected = byte_size(path, t.name, t.dtype, t.shape);
    TVC_CHECK(t.nbytes == expected, "save_safetensors '", printable(path), "': tensor '", printable(t.name),
              "' of dtype ", safetensors_name(t.dtype), " and shape ", shape_str(t.shape), " needs ", expected,
              " bytes but has ", t.nbytes);
  }
  for (const auto& [k, v] : metadata)
    TVC_CHECK(invalid_utf8_at(k) == std::string::npos && invalid_utf8_at(v) == std::string::npos, "save_safetensors '",
              printable(path), "': metadata entry '", printable(k), "' is not UTF-8");
  // Data ordered by decreasing element size, then name: every tensor starts aligned to its
  // element size, since the data section itself starts at a multiple of 8.
  std::sort(tensors.begin(), tensors.end(), [](const PendingTensor& a, const PendingTensor& b) {
    int ba = bit_size(a.dtype), bb = bit_size(b.dtype);
    return ba != bb ? ba > bb : a.name < b.name;
  });
  std::map<std::string, nlohmann::ordered_json> by_name;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    by_name[t.name] = nlohmann::ordered_json{
        {"dtype", safetensors_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (auto& [name, info] : by_name) header[name] = std::move(info);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  AtomicFileWriter out(path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.write(len, 8);
  out.write(text.data(), text.size());
  for (const auto& t : tensors) out.write(t.data, t.nbytes);
  out.commit();
}

}  // namespace

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<Tensor> keep;  // contiguous CPU copies live until written
  std::vector<PendingTensor> pending;
  for (const auto& [name, t] : tensors) {
    TVC_CHECK(t.defined(), "save_safetensors '", printable(path), "': tensor '", printable(name), "' is undefined");
    Tensor c = t.detach().to(Device::CPU).contiguous();
    keep.push_back(c);
    pending.push_back({name, file_dtype(c.dtype()), c.shape(), static_cast<const uint8_t*>(c.raw_data()),
                       static_cast<uint64_t>(c.numel()) * dtype_size(c.dtype())});
  }
  write_safetensors(path, std::move(pending), metadata);
}

void save_safetensors(const std::string& path, const nn::StateDict& state_dict,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, t] : state_dict) tensors.emplace_back(name, t);
  save_safetensors(path, tensors, metadata);
}

void save_safetensors_raw(const std::string& path, const std::vector<std::pair<std::string, RawTensor>>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  std::vector<PendingTensor> pending;
  for (const auto& [name, t] : tensors) pending.push_back({name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  write_safetensors(path, std::move(pending), metadata);
}

}  // namespace tvc::io
