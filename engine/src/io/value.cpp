// tvc::io::Value, the tree of a PyTorch checkpoint, its text, its flattening to dotted paths, and
// the state_dicts of whole-model saves.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "tvc/serialize.h"

namespace tvc::io {

Value::Value(bool b) : kind_(Kind::Bool), bool_(b) {}
Value::Value(int64_t i) : kind_(Kind::Int), int_(i) {}
Value::Value(double f) : kind_(Kind::Float), float_(f) {}
Value::Value(std::string s) : kind_(Kind::String), string_(std::move(s)) {}
Value::Value(Tensor t) : kind_(Kind::Tensor), tensor_(std::move(t)) {
  TVC_CHECK(tensor_.defined(), "Value: the tensor is undefined");
}

Value::Value(const nn::StateDict& state_dict) : Value(dict({}, /*ordered=*/true)) {
  for (const auto& [name, tensor] : state_dict) items_->emplace_back(Value(name), Value(tensor));
}

Value Value::bytes(std::string data) {
  Value v(std::move(data));
  v.kind_ = Kind::Bytes;
  return v;
}

Value Value::list(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::List;
  v.elements_ = std::make_shared<std::vector<Value>>(std::move(items));
  return v;
}

Value Value::tuple(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::Tuple;
  return v;
}

Value Value::set(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::Set;
  return v;
}

Value Value::dict(Items items, bool ordered) {
  Value v;
  v.kind_ = Kind::Dict;
  v.ordered_ = ordered;
  v.items_ = std::make_shared<Items>(std::move(items));
  return v;
}

Value Value::object(OpaqueObject object) {
  Value v;
  v.kind_ = Kind::Object;
  v.object_ = std::make_shared<const OpaqueObject>(std::move(object));
  return v;
}

const char* Value::kind_name() const {
  switch (kind_) {
    case Kind::None:
      return "None";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::Bytes:
      return "bytes";
    case Kind::Tensor:
      return "Tensor";
    case Kind::List:
      return "list";
    case Kind::Tuple:
      return "tuple";
    case Kind::Set:
      return "set";
    case Kind::Dict:
      return ordered_ ? "OrderedDict" : "dict";
    case Kind::Object:
      return "object";
  }
  return "?";
}

bool Value::to_bool() const {
  TVC_CHECK(kind_ == Kind::Bool, "Value: expected a bool, got ", kind_name());
  return bool_;
}

int64_t Value::to_int() const {
  TVC_CHECK(kind_ == Kind::Int, "Value: expected an int, got ", kind_name());
  return int_;
}

double Value::to_float() const {
  TVC_CHECK(kind_ == Kind::Float, "Value: expected a float, got ", kind_name());
  return float_;
}

const std::string& Value::to_string() const {
  TVC_CHECK(kind_ == Kind::String || kind_ == Kind::Bytes, "Value: expected a str or bytes, got ", kind_name());
  return string_;
}

const Tensor& Value::to_tensor() const {
  TVC_CHECK(kind_ == Kind::Tensor, "Value: expected a Tensor, got ", kind_name());
  return tensor_;
}

const std::vector<Value>& Value::elements() const {
  TVC_CHECK(kind_ == Kind::List || kind_ == Kind::Tuple || kind_ == Kind::Set,
            "Value: expected a list, tuple or set, got ", kind_name());
  return *elements_;
}

std::vector<Value>& Value::elements() { return const_cast<std::vector<Value>&>(std::as_const(*this).elements()); }

const Value::Items& Value::items() const {
  TVC_CHECK(kind_ == Kind::Dict, "Value: expected a dict, got ", kind_name());
  return *items_;
}

Value::Items& Value::items() { return const_cast<Items&>(std::as_const(*this).items()); }

const OpaqueObject& Value::object() const {
  TVC_CHECK(kind_ == Kind::Object, "Value: expected an opaque object, got ", kind_name());
  return *object_;
}

bool OpaqueObject::operator==(const OpaqueObject& other) const {
  return global == other.global && made == other.made && args == other.args && state == other.state &&
         appended == other.appended && set_items == other.set_items;
}

const Value* Value::find(const std::string& key) const {
  if (kind_ != Kind::Dict) return nullptr;
  for (const auto& [k, v] : *items_)
    if (k.kind_ == Kind::String && k.string_ == key) return &v;
  return nullptr;
}

namespace {

bool is_number(Value::Kind k) { return k == Value::Kind::Bool || k == Value::Kind::Int || k == Value::Kind::Float; }

// Python's numeric ==: True == 1 == 1.0, an int and a float compare exactly (no rounding).
bool numbers_equal(const Value& a, const Value& b) {
  auto as_int = [](const Value& v) { return v.kind() == Value::Kind::Bool ? int64_t{v.to_bool()} : v.to_int(); };
  bool fa = a.kind() == Value::Kind::Float, fb = b.kind() == Value::Kind::Float;
  if (fa && fb) return a.to_float() == b.to_float();
  if (!fa && !fb) return as_int(a) == as_int(b);
  double f = fa ? a.to_float() : b.to_float();
  int64_t i = fa ? as_int(b) : as_int(a);
  // 2^63 is exactly representable; every integral double in [-2^63, 2^63) converts exactly.
  if (!(f >= -9223372036854775808.0 && f < 9223372036854775808.0) || f != static_cast<double>(static_cast<int64_t>(f)))
    return false;
  return static_cast<int64_t>(f) == i;
}

bool tensors_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  size_t n = static_cast<size_t>(ca.numel()) * ca.element_size();
  return n == 0 || std::memcmp(ca.raw_data(), cb.raw_data(), n) == 0;
}

}  // namespace

bool Value::operator==(const Value& other) const {
  if (is_number(kind_) && is_number(other.kind_)) return numbers_equal(*this, other);
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::None:
      return true;
    case Kind::String:
    case Kind::Bytes:
      return string_ == other.string_;
    case Kind::Tensor:
      return tensors_equal(tensor_, other.tensor_);
    case Kind::List:
    case Kind::Tuple:
      return *elements_ == *other.elements_;
    case Kind::Set: {
      // Set elements are unique (hashable and distinct), so equal sizes and inclusion suffice.
      if (elements_->size() != other.elements_->size()) return false;
      for (const Value& e : *elements_) {
        bool found = false;
        for (const Value& o : *other.elements_) found = found || e == o;
        if (!found) return false;
      }
      return true;
    }
    case Kind::Dict: {
      if (items_->size() != other.items_->size()) return false;
      if (ordered_ && other.ordered_) return *items_ == *other.items_;  // OrderedDicts: order counts
      for (const auto& [k, v] : *items_) {
        bool found = false;
        for (const auto& [ok, ov] : *other.items_)
          if (k == ok) {
            found = v == ov;
            break;
          }
        if (!found) return false;
      }
      return true;
    }
    case Kind::Object:
      return *object_ == *other.object_;
    default:
      return false;  // numbers are handled above
  }
}

// ---------------------------------------------------------------- repr

namespace {

// Appends Python-like text to out until it passes max_chars, then "..." once.
class ReprWriter {
 public:
  explicit ReprWriter(size_t max_chars) : max_chars_(max_chars) {}

  std::string text() && { return std::move(out_); }

  void value(const Value& v) {
    if (full()) return;
    switch (v.kind()) {
      case Value::Kind::None:
        return put("None");
      case Value::Kind::Bool:
        return put(v.to_bool() ? "True" : "False");
      case Value::Kind::Int:
        return put(std::to_string(v.to_int()));
      case Value::Kind::Float:
        return put(float_text(v.to_float()));
      case Value::Kind::String:
        return put(cat_str("'", printable(v.to_string()), "'"));
      case Value::Kind::Bytes:
        return put(cat_str("<", v.to_string().size(), " bytes>"));
      case Value::Kind::Tensor:
        return put(cat_str("tensor(", dtype_name(v.to_tensor().dtype()), ", ", v.to_tensor().shape(), ")"));
      case Value::Kind::List:
        return sequence("[", v.elements(), "]");
      case Value::Kind::Tuple:
        return sequence("(", v.elements(), v.elements().size() == 1 ? ",)" : ")");
      case Value::Kind::Set:
        if (v.elements().empty()) return put("set()");
        return sequence("{", v.elements(), "}");
      case Value::Kind::Dict:
        return dict(v.items());
      case Value::Kind::Object:
        return object(v.object());
    }
  }

 private:
  bool full() const { return out_.size() >= max_chars_; }
  void put(const std::string& s) {
    if (full()) return;
    out_ += s;
    if (full()) out_ += "...";
  }
  static std::string float_text(double d) {  // Python's repr: the shortest text that reads back
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
    char buf[40];
    auto end = std::to_chars(buf, buf + sizeof buf, d).ptr;
    std::string s(buf, end);
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
  }
  void sequence(const char* open, const std::vector<Value>& items, const char* close) {
    put(open);
    for (size_t i = 0; i < items.size() && !full(); ++i) {
      if (i) put(", ");
      value(items[i]);
    }
    put(close);
  }
  void dict(const Value::Items& items) {
    put("{");
    for (size_t i = 0; i < items.size() && !full(); ++i) {
      if (i) put(", ");
      value(items[i].first);
      put(": ");
      value(items[i].second);
    }
    put("}");
  }
  void object(const OpaqueObject& o) {
    put(printable(o.global));
    if (o.made == OpaqueObject::Made::Global) return;
    put("(");
    bool first = true;
    auto comma = [&] {
      if (!first) put(", ");
      first = false;
    };
    for (const Value& a : o.args) comma(), value(a);
    // An instance's __dict__ as keywords, like argparse.Namespace's own repr.
    bool keywords = o.state.kind() == Value::Kind::Dict &&
                    std::all_of(o.state.items().begin(), o.state.items().end(),
                                [](const auto& item) { return item.first.kind() == Value::Kind::String; });
    if (keywords) {
      for (const auto& [k, v] : o.state.items()) comma(), put(printable(k.to_string()) + "="), value(v);
    } else if (!o.state.is_none()) {
      comma(), put("state="), value(o.state);
    }
    if (!o.appended.empty()) comma(), put("items="), sequence("[", o.appended, "]");
    if (!o.set_items.empty()) comma(), put("items="), dict(o.set_items);
    put(")");
  }

  size_t max_chars_;
  std::string out_;
};

}  // namespace

std::string repr(const Value& value, size_t max_chars) {
  ReprWriter writer(max_chars);
  writer.value(value);
  return std::move(writer).text();
}

// ---------------------------------------------------------------- whole-model saves

namespace {

// An instance's __dict__: BUILD's state, or the first element of a (dict, slots) state.
const Value* instance_dict(const Value& v) {
  if (v.kind() != Value::Kind::Object || v.object().made != OpaqueObject::Made::New) return nullptr;
  const Value& state = v.object().state;
  if (state.kind() == Value::Kind::Dict) return &state;
  if (state.kind() == Value::Kind::Tuple && !state.elements().empty() &&
      state.elements()[0].kind() == Value::Kind::Dict)
    return &state.elements()[0];
  return nullptr;
}

void save_module(const Value& module, const std::string& prefix, nn::StateDict& out, const std::string& file) {
  const Value& d = *instance_dict(module);
  auto where = [&](const std::string& name) {
    return cat_str(file.empty() ? "" : cat_str("'", printable(file), "': "),
                   "whole-model save: ", printable(module.object().global), " at '", printable(prefix), "': ", name);
  };
  std::vector<std::string> non_persistent;
  if (const Value* set = d.find("_non_persistent_buffers_set"); set && set->kind() == Value::Kind::Set)
    for (const Value& e : set->elements())
      if (e.kind() == Value::Kind::String) non_persistent.push_back(e.to_string());
  for (const char* table : {"_parameters", "_buffers"}) {
    for (const auto& [k, v] : d.find(table)->items()) {
      TVC_CHECK(k.kind() == Value::Kind::String, where(table), " has a ", k.kind_name(), " key");
      const std::string& name = k.to_string();
      if (v.is_none()) continue;
      if (table[1] == 'b' && std::find(non_persistent.begin(), non_persistent.end(), name) != non_persistent.end())
        continue;
      TVC_CHECK(v.kind() == Value::Kind::Tensor,
                where(cat_str(table, " entry '", printable(name), "' is a ", v.kind_name(), ", not a tensor")));
      TVC_CHECK(!out.contains(prefix + name), where(cat_str("two entries are named '", printable(prefix + name), "'")));
      out.insert(prefix + name, v.to_tensor().detach());
    }
  }
  for (const auto& [k, child] : d.find("_modules")->items()) {
    TVC_CHECK(k.kind() == Value::Kind::String, where("_modules"), " has a ", k.kind_name(), " key");
    if (child.is_none()) continue;
    TVC_CHECK(is_module(child),
              where(cat_str("the child module '", printable(k.to_string()), "' is a ",
                            child.kind() == Value::Kind::Object ? printable(child.object().global) : child.kind_name(),
                            ", not a module")));
    save_module(child, prefix + k.to_string() + ".", out, file);
  }
}

}  // namespace

bool is_module(const Value& value) {
  const Value* d = instance_dict(value);
  if (!d) return false;
  for (const char* key : {"_parameters", "_buffers", "_modules"}) {
    const Value* table = d->find(key);
    if (!table || table->kind() != Value::Kind::Dict) return false;
  }
  return true;
}

nn::StateDict module_state_dict(const Value& module, const std::string& file) {
  TVC_CHECK(is_module(module), file.empty() ? "" : cat_str("'", printable(file), "': "), "module_state_dict: a ",
            module.kind() == Value::Kind::Object ? printable(module.object().global) : module.kind_name(),
            " is not a torch.nn.Module instance (no _parameters, _buffers and _modules in its state)");
  nn::StateDict out;
  save_module(module, "", out, file);
  return out;
}

namespace {

std::string key_text(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::String:
      return key.to_string();
    case Value::Kind::Int:
      return std::to_string(key.to_int());
    case Value::Kind::Bool:
      return key.to_bool() ? "True" : "False";
    case Value::Kind::None:
      return "None";
    case Value::Kind::Float:
      return cat_str(key.to_float());
    default: {  // a tuple key
      std::string s = "(";
      for (const Value& e : key.elements()) s += (s.size() > 1 ? ", " : "") + key_text(e);
      return s + ")";
    }
  }
}

void flatten_into(const Value& value, const std::string& path, std::vector<std::pair<std::string, Value>>& out) {
  auto child = [&](const std::string& name) { return path.empty() ? name : path + "." + name; };
  switch (value.kind()) {
    case Value::Kind::Dict:
      for (const auto& [k, v] : value.items()) flatten_into(v, child(key_text(k)), out);
      break;
    case Value::Kind::List:
    case Value::Kind::Tuple:
      for (size_t i = 0; i < value.elements().size(); ++i)
        flatten_into(value.elements()[i], child(std::to_string(i)), out);
      break;
    case Value::Kind::Object:
      if (is_module(value)) {
        for (const auto& [name, tensor] : module_state_dict(value)) out.emplace_back(child(name), Value(tensor));
        break;
      }
      [[fallthrough]];
    default:
      out.emplace_back(path, value);
  }
}

}  // namespace

std::vector<std::pair<std::string, Value>> flatten(const Value& value) {
  std::vector<std::pair<std::string, Value>> out;
  flatten_into(value, "", out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> flatten_tensors(const Value& value) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [path, leaf] : flatten(value))
    if (leaf.kind() == Value::Kind::Tensor) out.emplace_back(path, leaf.to_tensor());
  return out;
}

}  // namespace tvc::io
