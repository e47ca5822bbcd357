// PyTorch .pth files: torch.save's zip format (read and written) and its legacy format (read).
#include <cstring>
#include <map>

#include "io/file.h"
#include "io/pickle.h"
#include "io/zip.h"

namespace tvc::io {

namespace {

// Bytes of a storage of numel elements of dtype, or an error naming the storage when that
// overflows.
uint64_t storage_bytes(const std::string& path, const PersistentId& id) {
  uint64_t size = static_cast<uint64_t>(bit_size(id.dtype) / 8), n;
  TVC_CHECK(!__builtin_mul_overflow(id.numel, size, &n), "'", printable(path), "': storage '", printable(id.key),
            "' of ", id.numel, " elements overflows");
  return n;
}

// A storage seen before under the same key must have the same type and element count.
void check_same(const std::string& path, const PersistentId& first, const PersistentId& again) {
  TVC_CHECK(first.dtype == again.dtype && first.numel == again.numel, "'", printable(path), "': storage '",
            printable(again.key), "' is used as ", torch_storage_name(first.dtype), " of ", first.numel,
            " elements and as ", torch_storage_name(again.dtype), " of ", again.numel);
}

// ---------------------------------------------------------------- zip format

Value load_zip(const std::string& path, const ReadOptions& options) {
  ZipReader zip(path);
  // The pickle is "<stem>/data.pkl" for any stem (torch names it after the file it saved).
  std::string stem;
  int found = 0;
  for (const std::string& name : zip.names()) {
    size_t slash = name.find('/');
    if (slash != std::string::npos && slash > 0 && name.substr(slash) == "/data.pkl") {
      stem = name.substr(0, slash);
      ++found;
    }
  }
  TVC_CHECK(found == 1, "'", printable(path), "': expected one '<folder>/data.pkl' entry in the zip archive, found ",
            found, found == 0 ? " (not a torch.save file?)" : "");
  if (zip.contains(stem + "/byteorder")) {
    std::vector<uint8_t> order = zip.read(stem + "/byteorder", 16);
    std::string text(order.begin(), order.end());
    TVC_CHECK(text != "big", "'", printable(path), "': the file is big-endian, which is not supported");
    TVC_CHECK(text == "little", "'", printable(path), "': unknown byte order '", printable(text), "' in ",
              printable(stem), "/byteorder");
  }  // absent: little-endian (files before torch 2.1)

  struct Loaded {
    PersistentId id;
    std::shared_ptr<Storage> storage;
  };
  std::map<std::string, Loaded> storages;
  // Each storage entry is read when a persistent id first names it; its size must equal the
  // id's numel times the element size exactly.
  auto persistent_load = [&](const PersistentId& id) {
    auto it = storages.find(id.key);
    if (it != storages.end()) {
      check_same(path, it->second.id, id);
      return it->second.storage;
    }
    std::string entry = stem + "/data/" + id.key;
    TVC_CHECK(zip.contains(entry), "'", printable(path), "': storage '", printable(id.key), "' has no entry ",
              printable(entry));
    uint64_t nbytes = storage_bytes(path, id);
    uint64_t actual = zip.size(entry);
    TVC_CHECK(actual == nbytes, "'", printable(path), "': storage '", printable(id.key), "' (", id.numel,
              " elements of ", torch_storage_name(id.dtype), ") needs ", nbytes, " bytes but entry ", printable(entry),
              " holds ", actual);
    auto storage = Storage::allocate(static_cast<size_t>(nbytes));
    zip.read(entry, storage->data(), nbytes);
    storages.emplace(id.key, Loaded{id, storage});
    return storage;
  };
  std::string pkl_name = stem + "/data.pkl";
  std::vector<uint8_t> pkl = zip.read(pkl_name, zip.size(pkl_name));
  Unpickler unpickler(path, pkl_name, persistent_load, options.opaque_objects);
  PickleInput input(pkl.data(), pkl.size());
  unpickler.load(input);
  return unpickler.value(options.widen);
}

// ---------------------------------------------------------------- legacy format

// pickle.dumps(0x1950a86a20f9469cfc6c, protocol=2): the magic number that opens a legacy file.
constexpr uint8_t kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                    0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e};

Value load_legacy(const std::string& path, const ReadOptions& options) {
  InputFile file(path);
  uint8_t magic[sizeof kLegacyMagic] = {};
  if (file.size() >= sizeof magic) file.read(0, magic, sizeof magic, "the magic number");
  TVC_CHECK(std::memcmp(magic, kLegacyMagic, sizeof magic) == 0, "'", printable(path),
            "': not a torch.save file (no zip archive, no legacy magic number)");
  uint64_t offset = sizeof magic;

  // The pickles follow one another; each is read up to its STOP.
  auto next = [&](const char* what, PersistentLoad persistent_load, bool opaque = false) {
    Unpickler unpickler(path, what, std::move(persistent_load), opaque);
    PickleInput input(file, offset);
    unpickler.load(input);
    offset += input.position();
    return unpickler;
  };
  Value protocol = next("the protocol version pickle", {}).value();
  TVC_CHECK(protocol.kind() == Value::Kind::Int && protocol.to_int() == 1001, "'", printable(path),
            "': legacy protocol version is not 1001");
  Value sys_info = next("the sys_info pickle", {}).value();
  const Value* little = sys_info.find("little_endian");
  TVC_CHECK(little && little->kind() == Value::Kind::Bool, "'", printable(path),
            "': sys_info has no little_endian flag");
  TVC_CHECK(little->to_bool(), "'", printable(path), "': the file is big-endian, which is not supported");

  struct Pending {
    PersistentId id;
    std::shared_ptr<Storage> storage;
    bool read = false;
  };
  std::map<std::string, Pending> storages;
  uint64_t object_start = offset;
  auto persistent_load = [&](const PersistentId& id) {
    auto it = storages.find(id.key);
    if (it != storages.end()) {
      check_same(path, it->second.id, id);
      return it->second.storage;
    }
    // The data follows the pickles: it must at least fit in the rest of the file.
    uint64_t nbytes = storage_bytes(path, id);
    TVC_CHECK(nbytes <= file.size() - object_start, "'", printable(path), "': storage '", printable(id.key), "' of ",
              id.numel, " elements (", nbytes, " bytes) is larger than the file");
    auto storage = Storage::allocate(static_cast<size_t>(nbytes));
    storages.emplace(id.key, Pending{id, storage});
    return storage;
  };
  Unpickler object = next("the object pickle", persistent_load, options.opaque_objects);
  Value keys = next("the storage keys pickle", {}).value();
  TVC_CHECK(keys.kind() == Value::Kind::List, "'", printable(path), "': the storage keys are a ", keys.kind_name(),
            ", not a list");

  // Each storage in key order: int64 element count, then the elements.
  for (const Value& key : keys.elements()) {
    TVC_CHECK(key.kind() == Value::Kind::String, "'", printable(path), "': a storage key is a ", key.kind_name());
    auto it = storages.find(key.to_string());
    TVC_CHECK(it != storages.end(), "'", printable(path), "': storage '", printable(key.to_string()),
              "' is not used by the object");
    Pending& s = it->second;
    TVC_CHECK(!s.read, "'", printable(path), "': storage '", printable(key.to_string()), "' is listed twice");
    int64_t numel = 0;
    file.read(offset, &numel, 8, cat_str("the size of storage '", printable(key.to_string()), "'"));
    TVC_CHECK(numel >= 0 && static_cast<uint64_t>(numel) == s.id.numel, "'", printable(path), "': storage '",
              printable(key.to_string()), "' holds ", numel, " elements in the file but ", s.id.numel,
              " in the pickle");
    offset += 8;
    file.read(offset, s.storage->data(), s.storage->nbytes(), cat_str("storage '", printable(key.to_string()), "'"));
    offset += s.storage->nbytes();
    s.read = true;
  }
  for (const auto& [key, s] : storages)
    TVC_CHECK(s.read, "'", printable(path), "': storage '", printable(key),
              "' is used by the object but missing from the file");
  return object.value(options.widen);
}

}  // namespace

Value load_pth(const std::string& path, const ReadOptions& options) {
  WeightFormat format = detect_format(path);
  if (format == WeightFormat::PthZip) return load_zip(path, options);
  if (format == WeightFormat::PthLegacy) return load_legacy(path, options);
  throw Error(cat_str("'", printable(path), "': not a .pth file (neither a zip archive nor a legacy torch.save file)"));
}

void save_pth(const std::string& path, const Value& value) {
  std::vector<PickledStorage> storages;
  std::string pkl = pickle_value(value, storages);
  ZipWriter zip(path);
  zip.add("archive/data.pkl", pkl.data(), pkl.size());
  zip.add("archive/byteorder", "little", 6);
  for (const PickledStorage& s : storages)
    zip.add("archive/data/" + s.key, static_cast<const uint8_t*>(s.storage->data()) + s.byte_offset,
            s.numel * static_cast<uint64_t>(bit_size(s.dtype) / 8));
  zip.add("archive/version", "3\n", 2);
  zip.finish();
}

}  // namespace tvc::io
