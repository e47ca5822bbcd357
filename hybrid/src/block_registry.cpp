// The block registry (see tvc/hybrid/blocks.h): the checked arguments of a block, the table of
// block types by name and alias, and make_block.
#include <algorithm>
#include <deque>
#include <mutex>
#include <sstream>

#include "block_types.h"
#include "tvc/hybrid/blocks.h"

namespace tvc::hybrid {

namespace {

// The table of block types: the built-in ones, then the users'. A deque keeps references to
// its elements valid while types are added.
struct Registry {
  std::mutex mutex;
  std::deque<BlockType> types;
  std::map<std::string, size_t> by_name;  // canonical names and aliases

  Registry() {
    using Group = std::vector<BlockType> (*)();
    for (Group group : {detail::conv_block_types, detail::attention_block_types, detail::other_block_types})
      for (BlockType& type : group()) add(std::move(type));
  }

  void add(BlockType type) {
    TVC_CHECK(!type.name.empty(), "register_block: a block type needs a name");
    TVC_CHECK(type.make != nullptr, "register_block: block '", type.name, "' has no make function");
    TVC_CHECK(!type.layouts.empty(), "register_block: block '", type.name, "' takes no layout");
    std::vector<std::string> names = type.aliases;
    names.insert(names.begin(), type.name);
    for (size_t i = 0; i < names.size(); ++i) {
      auto taken = by_name.find(names[i]);
      TVC_CHECK(taken == by_name.end(), "register_block: the name '", names[i], "' of block '", type.name,
                "' is taken by block '", types[taken->second].name, "' (", types[taken->second].class_name, ")");
      TVC_CHECK(std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i), names[i]) ==
                    names.begin() + static_cast<std::ptrdiff_t>(i),
                "register_block: block '", type.name, "' lists the name '", names[i], "' twice");
    }
    for (const std::string& n : names) by_name[n] = types.size();
    types.push_back(std::move(type));
  }

  std::string canonical_names() const {
    std::vector<std::string> names;
    for (const BlockType& t : types) names.push_back(t.name);
    std::sort(names.begin(), names.end());
    std::string s;
    for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

const char* kind_name(ParamKind kind) {
  switch (kind) {
    case ParamKind::Int:
      return "an int";
    case ParamKind::Float:
      return "a number";
    case ParamKind::Bool:
      return "a bool";
    case ParamKind::String:
      return "a string";
    case ParamKind::Channels:
      return "a channel count (int)";
  }
  return "?";
}

std::string value_repr(const ParamValue& v) {
  std::ostringstream os;
  if (const bool* b = std::get_if<bool>(&v))
    os << "the bool " << (*b ? "true" : "false");
  else if (const int64_t* i = std::get_if<int64_t>(&v))
    os << "the int " << *i;
  else if (const double* d = std::get_if<double>(&v))
    os << "the number " << *d;
  else
    os << "the string \"" << std::get<std::string>(v) << "\"";
  return os.str();
}

std::string joined(const std::vector<std::string>& items) {
  std::string s;
  for (const std::string& item : items) s += (s.empty() ? "" : ", ") + item;
  return s;
}

// "block 'se' (SEBlock)", the prefix of every message about a block's arguments.
std::string who(const BlockType& type) { return "block '" + type.name + "' (" + type.class_name + ")"; }

// value checked against spec (and converted: an int given for a Float becomes a double).
ParamValue checked_value(const BlockType& type, const ParamSpec& spec, const ParamValue& value) {
  bool ok = false;
  switch (spec.kind) {
    case ParamKind::Int:
    case ParamKind::Channels:
      ok = std::holds_alternative<int64_t>(value);
      break;
    case ParamKind::Float:
      if (const int64_t* i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
      ok = std::holds_alternative<double>(value);
      break;
    case ParamKind::Bool:
      ok = std::holds_alternative<bool>(value);
      break;
    case ParamKind::String:
      ok = std::holds_alternative<std::string>(value);
      break;
  }
  TVC_CHECK(ok, who(type), ": parameter '", spec.name, "' must be ", kind_name(spec.kind), ", got ", value_repr(value));
  if (spec.kind == ParamKind::String && !spec.choices.empty()) {
    const std::string& s = std::get<std::string>(value);
    TVC_CHECK(std::find(spec.choices.begin(), spec.choices.end(), s) != spec.choices.end(), who(type), ": parameter '",
              spec.name, "' must be one of ", joined(spec.choices), "; got \"", s, "\"");
  }
  if (spec.kind == ParamKind::Channels)
    TVC_CHECK(std::get<int64_t>(value) >= 1, who(type), ": parameter '", spec.name,
              "' must be a positive channel count, got ", std::get<int64_t>(value));
  return value;
}

}  // namespace

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::NCHW:
      return "(N, C, H, W)";
    case Layout::NHWC:
      return "(N, H, W, C)";
    case Layout::Tokens:
      return "(N, L, C)";
  }
  return "?";
}

// ---------------------------------------------------------------- BlockArgs

BlockArgs::BlockArgs(const std::string& block, const BlockParams& given, const InferredChannels& inferred)
    : layout_(inferred.layout) {
  const BlockType& type = find_block(block);
  block_ = type.name;
  for (const auto& [name, value] : given) {
    const std::string& given_name = name;  // a structured binding cannot be captured before C++20's clang 16
    auto spec =
        std::find_if(type.params.begin(), type.params.end(), [&](const ParamSpec& p) { return p.name == given_name; });
    if (spec == type.params.end()) {
      std::vector<std::string> accepted;
      for (const ParamSpec& p : type.params) accepted.push_back(p.name);
      TVC_CHECK(false, who(type), " has no parameter '", name,
                "'; it accepts: ", accepted.empty() ? std::string("none") : joined(accepted));
    }
    values_[name] = checked_value(type, *spec, value);
  }
  for (const ParamSpec& spec : type.params) {
    if (values_.count(spec.name)) continue;
    if (spec.kind == ParamKind::Channels) {
      const std::optional<int64_t>& count = spec.role == ChannelRole::In ? inferred.in_channels : inferred.out_channels;
      TVC_CHECK(count.has_value(), who(type), ": the channels of the target could not be inferred for parameter '",
                spec.name, "' (the target's ", spec.role == ChannelRole::In ? "input" : "output",
                " channels); the patch may give it: \"params\": {\"", spec.name, "\": N}");
      values_[spec.name] = checked_value(type, spec, *count);
    } else if (spec.default_value) {
      values_[spec.name] = checked_value(type, spec, *spec.default_value);
    } else {
      TVC_CHECK(spec.optional, who(type), ": parameter '", spec.name, "' (", kind_name(spec.kind),
                ") is required and was not given");
    }
  }
}

const ParamValue& BlockArgs::value(const std::string& name) const {
  auto it = values_.find(name);
  TVC_CHECK(it != values_.end(), "block '", block_, "': parameter '", name,
            "' has no value (not a parameter of the block, or an optional one not given)");
  return it->second;
}

int64_t BlockArgs::get_int(const std::string& name) const {
  const int64_t* v = std::get_if<int64_t>(&value(name));
  TVC_CHECK(v != nullptr, "block '", block_, "': parameter '", name, "' is not an int");
  return *v;
}

double BlockArgs::get_float(const std::string& name) const {
  const double* v = std::get_if<double>(&value(name));
  TVC_CHECK(v != nullptr, "block '", block_, "': parameter '", name, "' is not a number");
  return *v;
}

bool BlockArgs::get_bool(const std::string& name) const {
  const bool* v = std::get_if<bool>(&value(name));
  TVC_CHECK(v != nullptr, "block '", block_, "': parameter '", name, "' is not a bool");
  return *v;
}

const std::string& BlockArgs::get_string(const std::string& name) const {
  const std::string* v = std::get_if<std::string>(&value(name));
  TVC_CHECK(v != nullptr, "block '", block_, "': parameter '", name, "' is not a string");
  return *v;
}

// ---------------------------------------------------------------- the registry

void register_block(BlockType type) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.add(std::move(type));
}

const BlockType& find_block(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_name.find(name);
  TVC_CHECK(it != r.by_name.end(), "unknown block '", name, "'; known blocks: ", r.canonical_names());
  return r.types[it->second];
}

std::vector<const BlockType*> block_types() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<const BlockType*> out;
  for (const BlockType& t : r.types) out.push_back(&t);
  std::sort(out.begin(), out.end(), [](const BlockType* a, const BlockType* b) { return a->name < b->name; });
  return out;
}

nn::ModulePtr make_block(const std::string& name, const BlockParams& given, const InferredChannels& inferred) {
  const BlockType& type = find_block(name);
  if (std::find(type.layouts.begin(), type.layouts.end(), inferred.layout) == type.layouts.end()) {
    std::vector<std::string> taken;
    for (Layout l : type.layouts) taken.push_back(layout_name(l));
    TVC_CHECK(false, who(type), " cannot take the target's output laid out ", layout_name(inferred.layout),
              "; it takes ", joined(taken));
  }
  BlockArgs args(type.name, given, inferred);
  nn::ModulePtr block = type.make(args);
  TVC_CHECK(block != nullptr, who(type), ": its make function returned no module");
  return block;
}

// ---------------------------------------------------------------- ParamSpec builders

namespace detail {

ParamSpec channels_param(const std::string& name, ChannelRole role) {
  return {.name = name, .kind = ParamKind::Channels, .role = role};
}
ParamSpec int_param(const std::string& name, int64_t value) {
  return {.name = name, .kind = ParamKind::Int, .default_value = value};
}
ParamSpec float_param(const std::string& name, double value) {
  return {.name = name, .kind = ParamKind::Float, .default_value = value};
}
ParamSpec bool_param(const std::string& name, bool value) {
  return {.name = name, .kind = ParamKind::Bool, .default_value = value};
}
ParamSpec string_param(const std::string& name, const std::string& value, std::vector<std::string> choices) {
  return {.name = name, .kind = ParamKind::String, .default_value = value, .choices = std::move(choices)};
}
ParamSpec required_int_param(const std::string& name) { return {.name = name, .kind = ParamKind::Int}; }
ParamSpec optional_int_param(const std::string& name) {
  return {.name = name, .kind = ParamKind::Int, .optional = true};
}

std::vector<std::string> activation_choices(bool with_none) {
  std::vector<std::string> names = {"relu", "leaky_relu", "prelu", "gelu", "silu", "sigmoid", "tanh", "elu", "selu"};
  if (with_none) names.push_back("none");
  return names;
}

std::vector<std::string> norm_choices() { return {"batch", "group", "instance", "layer", "none"}; }

}  // namespace detail

}  // namespace tvc::hybrid
