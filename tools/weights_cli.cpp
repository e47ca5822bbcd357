#include "weights_cli.h"

#include <cstdio>
#include <sstream>

#include "tvc/error.h"
#include "tvc/serialize.h"

namespace tvc::tools {

namespace {

// 25557032 -> "25,557,032"
std::string grouped(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

struct Row {
  std::string name, dtype, shape;
};

void print_table(const std::string& path, const char* format, const std::vector<Row>& rows, uint64_t elements,
                 uint64_t bytes) {
  std::printf("file: %s\nformat: %s\n", printable(path).c_str(), format);
  size_t name_w = 4, dtype_w = 5;
  for (const Row& r : rows) name_w = std::max(name_w, r.name.size()), dtype_w = std::max(dtype_w, r.dtype.size());
  std::printf("%-*s  %-*s  %s\n", int(name_w), "name", int(dtype_w), "dtype", "shape");
  for (const Row& r : rows)
    std::printf("%-*s  %-*s  %s\n", int(name_w), r.name.c_str(), int(dtype_w), r.dtype.c_str(), r.shape.c_str());
  std::printf("total: %s tensors, %s parameters, %s bytes\n", grouped(rows.size()).c_str(), grouped(elements).c_str(),
              grouped(bytes).c_str());
}

void inspect_safetensors(const std::string& path) {
  io::SafetensorsFile file = io::SafetensorsFile::open(path);
  std::vector<Row> rows;
  uint64_t elements = 0, bytes = 0;
  for (const auto& e : file.entries()) {
    rows.push_back({printable(e.name), io::safetensors_name(e.dtype), shape_str(e.shape)});
    elements += static_cast<uint64_t>(shape_numel(e.shape));
    bytes += e.nbytes;
  }
  print_table(path, "safetensors", rows, elements, bytes);
  std::printf("metadata:%s\n", file.metadata().empty() ? " none" : "");
  for (const auto& [k, v] : file.metadata()) std::printf("  %s: %s\n", printable(k).c_str(), printable(v).c_str());
}

void inspect_pth(const std::string& path, io::WeightFormat format, const InspectOptions& options) {
  io::Value value = io::load_pth(path, {.widen = options.widen, .opaque_objects = options.opaque});
  std::vector<Row> rows;
  std::vector<std::pair<std::string, std::string>> others;
  uint64_t elements = 0, bytes = 0;
  for (const auto& [name, leaf] : io::flatten(value)) {
    if (leaf.kind() != io::Value::Kind::Tensor) {
      others.emplace_back(name.empty() ? "(file)" : printable(name), io::repr(leaf));
      continue;
    }
    const Tensor& t = leaf.to_tensor();
    rows.push_back({printable(name), dtype_name(t.dtype()), shape_str(t.shape())});
    elements += static_cast<uint64_t>(t.numel());
    bytes += static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype());
  }
  print_table(path, io::format_name(format), rows, elements, bytes);
  if (io::is_module(value))
    std::printf("whole-model save of %s: the tensors are its state_dict\n", printable(value.object().global).c_str());
  std::printf("values:%s\n", others.empty() ? " none" : "");
  for (const auto& [k, v] : others) std::printf("  %s: %s\n", k.c_str(), v.c_str());
}

// The value with its floating tensors converted to dtype (each to its own storage).
io::Value cast_floating(const io::Value& v, DType dtype) {
  switch (v.kind()) {
    case io::Value::Kind::Tensor:
      return is_floating(v.to_tensor().dtype()) ? io::Value(v.to_tensor().to(dtype)) : v;
    case io::Value::Kind::Dict: {
      io::Value::Items items;
      for (const auto& [k, x] : v.items()) items.emplace_back(k, cast_floating(x, dtype));
      return io::Value::dict(std::move(items), v.ordered());
    }
    case io::Value::Kind::List:
    case io::Value::Kind::Tuple: {
      std::vector<io::Value> elements;
      for (const auto& x : v.elements()) elements.push_back(cast_floating(x, dtype));
      return v.kind() == io::Value::Kind::List ? io::Value::list(std::move(elements))
                                               : io::Value::tuple(std::move(elements));
    }
    default:
      return v;
  }
}

}  // namespace

void inspect_weights(const std::string& path, const InspectOptions& options) {
  io::WeightFormat format = io::detect_format(path);
  if (format == io::WeightFormat::Safetensors)
    inspect_safetensors(path);
  else
    inspect_pth(path, format, options);
}

void convert_weights(const std::string& in, const std::string& out, const ConvertOptions& options) {
  io::WeightFormat to = io::format_for_extension(out);
  io::WeightFormat from = io::detect_format(in);
  if (from == io::WeightFormat::Safetensors && to == io::WeightFormat::Safetensors && !options.dtype) {
    io::SafetensorsFile file = io::SafetensorsFile::open(in);
    std::vector<std::pair<std::string, io::RawTensor>> tensors;
    for (const auto& e : file.entries())
      tensors.emplace_back(e.name, io::RawTensor{e.dtype, e.shape, file.bytes(e.name)});
    io::save_safetensors_raw(out, tensors, file.metadata());
    std::printf("wrote %s: %zu tensors, safetensors (bytes copied)\n", printable(out).c_str(), tensors.size());
    return;
  }
  io::ReadOptions read{.widen = options.widen, .opaque_objects = options.opaque};
  io::Value value =
      options.unwrap ? io::Value(io::load_state_dict(in, {.read = read, .unwrap = true})) : io::load(in, read);
  if (options.dtype) value = cast_floating(value, *options.dtype);
  std::map<std::string, std::string> metadata;
  if (from == io::WeightFormat::Safetensors) metadata = io::SafetensorsFile::open(in).metadata();
  if (to == io::WeightFormat::Safetensors) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& [name, leaf] : io::flatten(value)) {
      TVC_CHECK(leaf.kind() == io::Value::Kind::Tensor, "'", printable(in), "': '", printable(name), "' (",
                leaf.kind_name(),
                ") is not a tensor, which safetensors cannot hold (--unwrap keeps only the weights of a checkpoint)");
      tensors.emplace_back(name, leaf.to_tensor());
    }
    io::save_safetensors(out, tensors, metadata);
    std::printf("wrote %s: %zu tensors, safetensors\n", printable(out).c_str(), tensors.size());
  } else {
    if (!metadata.empty())
      std::fprintf(stderr, "note: the %zu safetensors metadata entries have no place in a .pth file\n",
                   metadata.size());
    io::save_pth(out, value);
    std::printf("wrote %s: %zu tensors, pth (zip)\n", printable(out).c_str(), io::flatten_tensors(value).size());
  }
}

void average_weights(const std::vector<std::string>& files, const std::string& out,
                     const swa::AverageFilesOptions& options) {
  swa::AverageFilesReport r = swa::average_weight_files(files, out, options);
  const bool ema = options.method == swa::AverageFilesOptions::Method::ema;
  std::printf("wrote %s: %s of %lld files, %lld tensors averaged, %lld buffers from the last file, %s\n",
              printable(out).c_str(), ema ? cat_str("EMA (decay ", options.ema_decay, ")").c_str() : "SWA",
              static_cast<long long>(r.files), static_cast<long long>(r.averaged), static_cast<long long>(r.copied),
              options.plain ? "the model's own state_dict" : "AveragedModel state_dict (module.*, n_averaged)");
}

}  // namespace tvc::tools
