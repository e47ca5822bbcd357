// Any weight format: detection, whole-file loading, state_dicts and loading into modules.
#include <algorithm>
#include <cstring>
#include <filesystem>

#include "io/file.h"
#include "tvc/error.h"
#include "tvc/serialize.h"

namespace tvc::io {

const char* format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::Safetensors:
      return "safetensors";
    case WeightFormat::PthZip:
      return "pth (zip)";
    case WeightFormat::PthLegacy:
      return "pth (legacy)";
  }
  return "?";
}

WeightFormat detect_format(const std::string& path) {
  InputFile in(path);
  uint8_t head[9] = {};
  size_t n = static_cast<size_t>(std::min<uint64_t>(in.size(), sizeof head));
  in.read(0, head, n, "the file signature");
  if (n >= 4 && head[0] == 'P' && head[1] == 'K' && ((head[2] == 3 && head[3] == 4) || (head[2] == 5 && head[3] == 6)))
    return WeightFormat::PthZip;
  // torch.save's legacy format starts with the pickled magic number: PROTO 2, LONG1.
  if (n >= 3 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5 && head[2] == 0x8a) return WeightFormat::PthLegacy;
  // safetensors: the header length, then the JSON header's '{'. Shorter files go to the
  // safetensors reader, which says what is missing.
  if (n < 9 || head[8] == '{') return WeightFormat::Safetensors;
  throw Error(cat_str("'", printable(path),
                      "': not a weight file tvc reads: it starts neither with a zip signature "
                      "(torch.save), nor a pickle (legacy torch.save), nor a safetensors header "
                      "length followed by '{'"));
}

WeightFormat format_for_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".safetensors") return WeightFormat::Safetensors;
  if (ext == ".pth" || ext == ".pt") return WeightFormat::PthZip;
  throw Error(cat_str("'", printable(path), "': unknown output format '", printable(ext),
                      "' (use .safetensors, or .pth / .pt for torch.save's zip format)"));
}

void save_state_dict(const std::string& path, const nn::StateDict& state_dict) {
  if (format_for_extension(path) == WeightFormat::Safetensors)
    save_safetensors(path, state_dict);
  else
    save_pth(path, Value(state_dict));
}

Value load(const std::string& path, const ReadOptions& options) {
  if (detect_format(path) != WeightFormat::Safetensors) return load_pth(path, options);
  SafetensorsFile file = SafetensorsFile::open(path);
  std::vector<const SafetensorsEntry*> by_name;
  for (const auto& e : file.entries()) by_name.push_back(&e);
  std::sort(by_name.begin(), by_name.end(), [](auto* a, auto* b) { return a->name < b->name; });
  Value::Items items;
  for (const auto* e : by_name) items.emplace_back(Value(e->name), Value(file.tensor(e->name, options)));
  return Value::dict(std::move(items), true);
}

namespace {

// The weights inside a training checkpoint, by the keys training scripts use: a dict, or a
// whole module ({"model": model}).
const Value& unwrap_checkpoint(const Value& value) {
  const Value* v = &value;
  for (bool descended = true; descended;) {
    descended = false;
    for (const char* key : {"state_dict", "model_state_dict", "model"}) {
      const Value* inner = v->find(key);
      if (inner && (inner->kind() == Value::Kind::Dict || is_module(*inner))) {
        v = inner;
        descended = true;
        break;
      }
    }
  }
  return *v;
}

}  // namespace

nn::StateDict load_state_dict(const std::string& path, const StateDictOptions& options) {
  Value file = load(path, options.read);
  const Value& weights = options.unwrap ? unwrap_checkpoint(file) : file;
  TVC_CHECK(weights.kind() == Value::Kind::Dict || is_module(weights), "'", printable(path), "' holds ",
            weights.kind() == Value::Kind::Object ? cat_str("an object of ", printable(weights.object().global))
                                                  : cat_str("a value of type ", weights.kind_name()),
            ", not a state_dict");
  // A whole-model save: its state_dict (flatten gives the same names), errors naming the file.
  std::vector<std::pair<std::string, Value>> leaves;
  if (is_module(weights))
    for (const auto& [name, tensor] : module_state_dict(weights, path)) leaves.emplace_back(name, Value(tensor));
  else
    leaves = flatten(weights);
  bool prefixed = options.unwrap && !leaves.empty();
  for (const auto& [name, v] : leaves) {
    TVC_CHECK(v.kind() == Value::Kind::Tensor, "'", printable(path), "': '", printable(name), "' (",
              v.kind() == Value::Kind::Object ? printable(v.object().global) : v.kind_name(), ") is not a tensor",
              options.unwrap ? "" : " (a training checkpoint? ask to unwrap it)");
    prefixed = prefixed && name.compare(0, 7, "module.") == 0;
  }
  nn::StateDict sd;
  for (const auto& [name, v] : leaves) {
    std::string key = prefixed ? name.substr(7) : name;
    TVC_CHECK(!sd.contains(key), "'", printable(path), "': two entries flatten to the name '", printable(key), "'");
    sd.insert(key, v.to_tensor());
  }
  return sd;
}

nn::IncompatibleKeys load_into(nn::Module& module, const std::string& path, const StateDictOptions& options,
                               bool strict, bool assign) {
  return load_converted(module, load_state_dict(path, options), strict, assign);
}

nn::IncompatibleKeys load_converted(nn::Module& module, nn::StateDict state_dict, bool strict, bool assign) {
  for (const auto& [name, t] : module.state_dict("", true)) {
    Tensor* src = state_dict.find(name);
    if (src && t.defined() && src->defined() && src->dtype() != t.dtype()) *src = src->to(t.dtype());
  }
  return module.load_state_dict(state_dict, strict, assign);
}

}  // namespace tvc::io

namespace tvc::nn {

IncompatibleKeys Module::load_state_dict(const std::string& path, bool strict, bool assign) {
  return io::load_into(*this, path, {}, strict, assign);
}

}  // namespace tvc::nn
