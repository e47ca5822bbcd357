#include "torch_golden.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
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

// How a child command ended and the last line it printed (a Python error's own line), for the
// first line of a failure message: a long log may be cut short where CI shows it.
std::string failure_summary(int status, const std::string& output) {
  // std::system runs sh -c, which reports a child killed by signal S as exit status 128 + S.
  int signal = WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status) > 128 ? WEXITSTATUS(status) - 128 : 0;
  std::string how =
      status == -1 ? "could not be started"
      : signal     ? "was killed by signal " + std::to_string(signal) + (signal == SIGKILL ? " (out of memory?)" : "")
                   : "exited with status " + std::to_string(WEXITSTATUS(status));
  const size_t end = output.find_last_not_of(" \n");
  if (end == std::string::npos) return how;
  const size_t newline = output.rfind('\n', end);
  const size_t begin = newline == std::string::npos ? 0 : newline + 1;
  return how + ": " + output.substr(begin, end - begin + 1);
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
  ADD_FAILURE() << "PyTorch golden " << failure_summary(rc, msg) << "\n"
                << "script: " << script << " (install python3-torch python3-torchvision libopenblas0-pthread)\n"
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

namespace {

namespace fs = std::filesystem;

// Golden folders are kept within a budget of disk (TVC_GOLDEN_CACHE_GIB, default 2): the model
// goldens alone would take 11 GB in one run of the tests. A folder in use is held by a shared
// flock on its `complete` file until the calling test ends; an eviction takes that lock
// exclusively without waiting, so no folder a test is reading goes away.
double golden_budget_gib() {
  const char* env = std::getenv("TVC_GOLDEN_CACHE_GIB");
  if (env == nullptr || *env == '\0') return 2.0;
  char* end = nullptr;
  const double gib = std::strtod(env, &end);
  if (*end != '\0' || !(gib >= 0)) {
    ADD_FAILURE() << "TVC_GOLDEN_CACHE_GIB='" << env << "' is not a size in GiB (a number >= 0); using 2";
    return 2.0;
  }
  return gib;
}

std::mutex held_mutex;
// This process's shared locks (folder, descriptor), released when the current test ends.
std::vector<std::pair<std::string, int>> held_locks;

class ReleaseGoldenFolders : public testing::EmptyTestEventListener {
  void OnTestEnd(const testing::TestInfo&) override { release_golden_folders(); }
};
[[maybe_unused]] const bool release_listener_added = [] {
  testing::UnitTest::GetInstance()->listeners().Append(new ReleaseGoldenFolders);
  return true;
}();

// Whether fd is the file at path now (not one renamed away and replaced since it was opened).
bool same_file(int fd, const fs::path& path) {
  struct stat opened {
  }, named{};
  return ::fstat(fd, &opened) == 0 && ::stat(path.c_str(), &named) == 0 && opened.st_dev == named.st_dev &&
         opened.st_ino == named.st_ino;
}

// Holds a complete golden folder for the current test and marks it used now; false when the
// folder is not (or no longer) there.
bool hold_folder(const fs::path& dir) {
  const fs::path complete = dir / "complete";
  auto mark_used = [&complete] {
    std::error_code ignored;  // the time only orders evictions
    fs::last_write_time(complete, fs::file_time_type::clock::now(), ignored);
  };
  {
    // Held already (a test asking for the same goldens again): its lock keeps it, no second one.
    std::lock_guard<std::mutex> lock(held_mutex);
    for (const auto& held : held_locks)
      if (held.first == dir.string()) {
        mark_used();
        return true;
      }
  }
  const int fd = ::open(complete.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  if (::flock(fd, LOCK_SH) != 0 || !same_file(fd, complete)) {  // waits out an eviction, then looks again
    ::close(fd);
    return false;
  }
  mark_used();
  std::lock_guard<std::mutex> lock(held_mutex);
  held_locks.emplace_back(dir.string(), fd);
  return true;
}

// Whether the process that named a folder "<name>.<tag>-PID" is gone (its folder is left over).
bool owner_is_gone(const std::string& name) {
  const size_t dash = name.rfind('-');
  char* end = nullptr;
  const long pid = std::strtol(name.c_str() + dash + 1, &end, 10);
  return *end == '\0' && pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

uintmax_t folder_bytes(const fs::path& dir) {
  uintmax_t bytes = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) bytes += e.file_size(ec);
  return bytes;
}

// Removes the least recently used golden folders that no test holds until the complete ones left
// take at most budget bytes, and the half-written or half-removed folders of processes that died.
void evict_golden_folders(const fs::path& cache, uintmax_t budget) {
  struct Folder {
    fs::path dir;
    fs::file_time_type used;
    uintmax_t bytes;
  };
  std::vector<Folder> folders;
  uintmax_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(cache, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("files-") || !e.is_directory(ec)) continue;
    if (name.find('.') != std::string::npos) {  // "files-H.tmp-PID" or "files-H.evict-PID"
      if (owner_is_gone(name)) fs::remove_all(e.path(), ec);
      continue;
    }
    const fs::file_time_type used = fs::last_write_time(e.path() / "complete", ec);
    if (ec) continue;  // being replaced
    folders.push_back({e.path(), used, folder_bytes(e.path())});
    total += folders.back().bytes;
  }
  std::sort(folders.begin(), folders.end(), [](const Folder& a, const Folder& b) { return a.used < b.used; });
  for (const Folder& f : folders) {
    if (total <= budget) break;
    const fs::path complete = f.dir / "complete";
    const int fd = ::open(complete.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && same_file(fd, complete)) {  // no test holds it
      const fs::path doomed = f.dir.string() + ".evict-" + std::to_string(::getpid());
      fs::rename(f.dir, doomed, ec);  // gone from its name at once, however long the removal takes
      if (!ec) {
        fs::remove_all(doomed, ec);
        total -= f.bytes;
      }
    }
    ::close(fd);
  }
}

}  // namespace

void release_golden_folders() {
  std::lock_guard<std::mutex> lock(held_mutex);
  for (const auto& [dir, fd] : held_locks) ::close(fd);
  held_locks.clear();
}

void release_golden_folder(const std::string& dir) {
  std::lock_guard<std::mutex> lock(held_mutex);
  std::erase_if(held_locks, [&dir](const std::pair<std::string, int>& held) {
    if (held.first != dir) return false;
    ::close(held.second);
    return true;
  });
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
  const fs::path dir = cache_dir() / name;
  if (hold_folder(dir)) return dir.string();
  evict_golden_folders(cache_dir(), static_cast<uintmax_t>(golden_budget_gib() * double(1ull << 30)));
  // The script writes into a folder of this process's own, renamed into place when complete:
  // test programs running at once may need the same goldens, and none reads a half-written one.
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  const fs::path log = tmp / "log";
  // Goldens are deterministic, so a run that failed for a passing reason of the machine (memory,
  // disk, a killed process) is run once more; the first failure is printed either way.
  std::string failure;
  for (int attempt = 0; attempt < 2; ++attempt) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    int rc = std::system((command + " '" + tmp.string() + "' > " + log.string() + " 2>&1").c_str());
    if (rc == 0 && fs::exists(tmp / "complete")) {
      std::error_code taken;
      fs::rename(tmp, dir, taken);
      if (taken) {  // another process renamed its copy first, or an old run left an incomplete folder
        if (!fs::exists(dir / "complete")) {
          fs::remove_all(dir);
          fs::rename(tmp, dir);
        }
        fs::remove_all(tmp);
      }
      if (hold_folder(dir)) return dir.string();
      failure = "wrote its folder, which another test process removed before this one could hold it";
    } else {
      const std::string output = read_file(log);
      failure = failure_summary(rc, output) + "\n" + output;
    }
    std::cerr << "golden script " << script << " " << failure.substr(0, failure.find('\n'))
              << (attempt == 0 ? " (running it once more)" : "") << "\n";
  }
  fs::remove_all(tmp);  // no partial goldens left behind
  ADD_FAILURE() << "golden script " << script << " " << failure
                << "\ncommand (needs python3-torch python3-torchvision and the safetensors package): " << command;
  return "";
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
