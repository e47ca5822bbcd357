// libFuzzer target: the PyTorch .pth readers (zip archive and legacy format, both through the
// restricted unpickler) and format detection, on arbitrary bytes.
//
// The input is the whole file. It goes through detect_format, load_pth (whatever the detected
// format: the reader must refuse a non-.pth file cleanly too), load (which dispatches on the
// detected format, so safetensors-looking inputs reach that reader as well) and
// load_state_dict with unwrap (checkpoint unwrapping, flattening and whole-model state_dicts),
// load_pth and load_state_dict in opaque mode as well as strict. Every tensor of every
// value returned is checked to lie inside its storage and read in full. tvc::Error is the
// expected answer to a malformed file; any other exception, a crash, a sanitizer report, a
// leaked descriptor or a tensor outside its storage is a finding.
#include <cstdint>
#include <exception>
#include <string>

#include "fuzz_common.h"
#include "tvc/error.h"
#include "tvc/serialize.h"

namespace {

using tvc::io::Value;

// Visits every value inside v, reading every tensor.
void walk(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Tensor:
      tvc_fuzz::check_tensor(v.to_tensor(), "(in a loaded value)");
      break;
    case Value::Kind::List:
    case Value::Kind::Tuple:
    case Value::Kind::Set:
      for (const Value& e : v.elements()) walk(e);
      break;
    case Value::Kind::Dict:
      for (const auto& [k, e] : v.items()) {
        walk(k);
        walk(e);
      }
      break;
    case Value::Kind::Object: {
      const tvc::io::OpaqueObject& o = v.object();
      for (const Value& a : o.args) walk(a);
      walk(o.state);
      for (const Value& e : o.appended) walk(e);
      for (const auto& [k, e] : o.set_items) {
        walk(k);
        walk(e);
      }
      break;
    }
    default:
      (void)v.kind_name();
  }
}

// Everything a caller may do with a loaded value, none of which may fail but by tvc::Error.
void use(const Value& v) {
  walk(v);
  (void)(v == v);  // not asserted: Python's NaN != NaN holds for float values
  (void)tvc::io::repr(v);
  try {
    for (const auto& [name, t] : tvc::io::flatten_tensors(v)) tvc_fuzz::check_tensor(t, name);
  } catch (const tvc::Error&) {
    // a dict key that cannot name a path (e.g. a float): a valid refusal
  }
}

// Runs one reader; a tvc::Error is its valid answer to a bad file and the next reader runs.
template <typename Read>
void attempt(Read read) {
  try {
    read();
  } catch (const tvc::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return tvc_fuzz::run_on_file(data, size, [](const std::string& path) {
    attempt([&] { (void)tvc::io::format_name(tvc::io::detect_format(path)); });
    attempt([&] { use(tvc::io::load_pth(path)); });
    attempt([&] { use(tvc::io::load_pth(path, {.opaque_objects = true})); });
    attempt([&] { use(tvc::io::load(path, {.widen = true})); });
    attempt([&] {
      tvc::nn::StateDict sd =
          tvc::io::load_state_dict(path, {.read = {.widen = true, .opaque_objects = true}, .unwrap = true});
      for (const auto& [name, t] : sd) tvc_fuzz::check_tensor(t, name);
    });
  });
}
