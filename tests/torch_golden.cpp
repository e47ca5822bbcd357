#include "torch_golden.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tvc/ops.h"

namespace tvc::test {

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::filesystem::path cache_dir() {
  const char* env = std::getenv("TVC_GOLDEN_CACHE");
  std::filesystem::path dir = env && *env ? env : TVC_DEFAULT_GOLDEN_CACHE;
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace

const char* kPyJsonHelpers = R"PY(
import json, math, torch
def _t(x):
    x = x.detach().to(torch.float64).contiguous()
    return {"shape": list(x.shape),
            "data": [v if math.isfinite(v) else str(v) for v in map(float, x.reshape(-1).tolist())]}
def json_tensors(ts):
    return json.dumps([_t(t) if isinstance(t, torch.Tensor) else t for t in ts])
)PY";

namespace {

// Runs script with /usr/bin/python3, stdout into out; on failure records a test failure with
// stderr and returns false.
bool run_python(const std::filesystem::path& script, const std::filesystem::path& out) {
  std::string cmd = "/usr/bin/python3 " + script.string() + " > " + out.string() + " 2> " + out.string() + ".err";
  int rc = std::system(cmd.c_str());
  std::ifstream err(out.string() + ".err");
  std::string msg(std::istreambuf_iterator<char>(err), {});
  std::filesystem::remove(out.string() + ".err");
  if (rc == 0) return true;
  ADD_FAILURE() << "PyTorch golden failed (install python3-torch python3-torchvision "
                   "libopenblas0-pthread): "
                << script << "\n"
                << msg;
  return false;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string with_prelude(const std::string& code) {
  return std::string("import torch\ntorch.set_num_threads(1)\n") + kPyJsonHelpers + code;
}

}  // namespace

std::string torch_run(const std::string& code) {
  std::string full = with_prelude(code);
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.out", static_cast<unsigned long long>(fnv1a(full)));
  std::filesystem::path out = cache_dir() / name;
  if (std::filesystem::exists(out)) return read_file(out);
  std::filesystem::path script = cache_dir() / (std::string(name) + ".py");
  std::ofstream(script) << full;
  std::filesystem::path tmp = cache_dir() / (std::string(name) + ".tmp");
  if (!run_python(script, tmp)) return "";
  std::filesystem::rename(tmp, out);
  return read_file(out);
}

std::string torch_run_uncached(const std::string& code) {
  static int counter = 0;
  std::string stem = "uncached-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  std::filesystem::path script = cache_dir() / (stem + ".py"), out = cache_dir() / (stem + ".out");
  std::ofstream(script) << with_prelude(code);
  std::string result = run_python(script, out) ? read_file(out) : "";
  std::filesystem::remove(script);
  std::filesystem::remove(out);
  return result;
}

std::string python_golden_folder(const std::string& script, const std::vector<std::string>& args) {
  std::string key = read_file(script);
  if (key.empty()) {
    ADD_FAILURE() << "cannot read the golden script " << script;
    return "";
  }
  std::string command = "/usr/bin/python3 " + script;
  for (const auto& a : args) key += "\n" + a, command += " '" + a + "'";
  char name[40];
  std::snprintf(name, sizeof name, "files-%016llx", static_cast<unsigned long long>(fnv1a(key)));
  std::filesystem::path dir = cache_dir() / name;
  if (std::filesystem::exists(dir / "complete")) return dir.string();
  std::filesystem::create_directories(dir);
  std::filesystem::path log = dir / "log";
  int rc = std::system((command + " '" + dir.string() + "' > " + log.string() + " 2>&1").c_str());
  if (rc != 0 || !std::filesystem::exists(dir / "complete")) {
    ADD_FAILURE() << "golden script failed (install python3-torch python3-torchvision and the safetensors "
                     "package): "
                  << command << "\n"
                  << read_file(log);
    return "";
  }
  return dir.string();
}

nlohmann::json torch_json(const std::string& code) {
  std::string s = torch_run(code);
  if (s.empty()) return nlohmann::json();
  return nlohmann::json::parse(s);
}

std::string py_tensor(const Tensor& t) {
  std::vector<double> v = t.to_vector();
  std::ostringstream os;
  os.precision(17);
  os << "torch.tensor([";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  os << "], dtype=torch.float64).to(torch." << dtype_name(t.dtype()) << ").reshape([";
  for (int64_t i = 0; i < t.dim(); ++i) os << (i ? "," : "") << t.shape()[i];
  os << "])";
  return os.str();
}

Tensor tensor_from_json(const nlohmann::json& j) {
  Shape shape = j.at("shape").get<Shape>();
  std::vector<double> data;
  for (const auto& v : j.at("data")) {
    if (v.is_number())
      data.push_back(v.get<double>());
    else
      data.push_back(std::stod(v.get<std::string>()));  // "nan", "inf", "-inf"
  }
  return tensor<double>(data, shape);
}

}  // namespace tvc::test
