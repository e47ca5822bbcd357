// Patch specifications: parse_patches reads the Python library's JSON form.
#include <nlohmann/json.hpp>

#include "tvc/error.h"
#include "tvc/hybrid/hybrid.h"

namespace tvc::hybrid {

const char* patch_op_name(PatchOp op) {
  switch (op) {
    case PatchOp::Wrap:
      return "wrap";
    case PatchOp::Inject:
      return "inject";
    case PatchOp::Replace:
      return "replace";
  }
  return "?";
}

namespace {

using Json = nlohmann::ordered_json;

ParamValue param_value(const std::string& where, const Json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) return v.get<double>();
  if (v.is_string()) return v.get<std::string>();
  throw Error(cat_str(where, ": a block parameter must be a boolean, number or string, got ", v.dump()));
}

Patch parse_patch(const std::string& target, const Json& spec) {
  const std::string where = cat_str("patch '", target, "'");
  TVC_CHECK(spec.is_object(), where, ": expected an object like {\"wrap\": \"se\"}, got ", spec.dump());
  Patch patch{.target = target};
  const Json* block_spec = nullptr;
  for (const auto& [key, value] : spec.items()) {
    PatchOp op;
    if (key == "wrap")
      op = PatchOp::Wrap;
    else if (key == "inject" || key == "inject_after")
      op = PatchOp::Inject;
    else if (key == "replace")
      op = PatchOp::Replace;
    else
      throw Error(cat_str(where, ": unknown operation '", key, "' (known: wrap, inject, inject_after, replace)"));
    TVC_CHECK(block_spec == nullptr, where, ": one operation per patch, got '", patch_op_name(patch.op), "' and '", key,
              "'");
    patch.op = op;
    block_spec = &value;
  }
  TVC_CHECK(block_spec != nullptr, where, ": no operation (wrap, inject, replace)");
  if (block_spec->is_string()) {
    patch.block = block_spec->get<std::string>();
    return patch;
  }
  TVC_CHECK(block_spec->is_object(), where, ": the block is a name or {\"type\": NAME, \"params\": {...}}, got ",
            block_spec->dump());
  for (const auto& [key, value] : block_spec->items()) {
    if (key == "type" || key == "block") {
      TVC_CHECK(value.is_string(), where, ": '", key, "' must be a block name, got ", value.dump());
      TVC_CHECK(patch.block.empty(), where, ": give the block once ('type' or 'block')");
      patch.block = value.get<std::string>();
    } else if (key == "params") {
      TVC_CHECK(value.is_object(), where, ": 'params' must be an object, got ", value.dump());
      for (const auto& [name, v] : value.items()) patch.params[name] = param_value(cat_str(where, ", '", name, "'"), v);
    } else {
      throw Error(cat_str(where, ": unknown key '", key, "' (known: type, block, params)"));
    }
  }
  TVC_CHECK(!patch.block.empty(), where, ": no block type ('type' or 'block')");
  return patch;
}

}  // namespace

std::vector<Patch> parse_patches(const std::string& json) {
  Json doc;
  try {
    doc = Json::parse(json);
  } catch (const Json::parse_error& e) {
    throw Error(cat_str("patches: not valid JSON: ", e.what()));
  }
  TVC_CHECK(doc.is_object(), "patches: expected an object {\"path\": {\"wrap\": \"se\"}, ...}, got ", doc.dump());
  std::vector<Patch> patches;
  for (const auto& [target, spec] : doc.items()) patches.push_back(parse_patch(target, spec));
  return patches;
}

}  // namespace tvc::hybrid
