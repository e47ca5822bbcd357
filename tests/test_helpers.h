// Helpers of the tests: an environment variable set for a scope, a temporary folder removed at
// the end, whole-file reads and writes, the message of an expected tvc::Error, the bytes of a
// tensor.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "tvc/error.h"
#include "tvc/tensor.h"

namespace tvc::test {

// Sets an environment variable for the scope of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { old_ ? (void)::setenv(name_, old_->c_str(), 1) : (void)::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A fresh folder under the system temp dir, removed with everything in it when destroyed.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tvc-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() { std::filesystem::remove_all(path_); }
  // The path of name inside the folder ("" gives the folder with a trailing slash).
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The message of the tvc::Error that f throws; a test failure (and "") when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no tvc::Error was thrown";
  return "";
}

// The bytes of t's elements in row-major order.
inline std::vector<uint8_t> tensor_bytes(const Tensor& t) {
  Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return std::vector<uint8_t>(p, p + c.numel() * static_cast<int64_t>(dtype_size(c.dtype())));
}

// Lower-case hexadecimal, two digits a byte.
inline std::string hex(const std::vector<uint8_t>& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) s += digits[b >> 4], s += digits[b & 15];
  return s;
}

// Whether text can reach a terminal as it is, as printable() makes the untrusted parts of
// messages: valid UTF-8 without control characters (C0 but '\n', and '\t' where the format itself
// has tabs; DEL; C1). A failure names the first offending byte and shows the text escaped.
inline ::testing::AssertionResult IsTerminalSafe(const std::string& text, bool tabs = false) {
  for (size_t i = 0; i < text.size();) {
    auto lead = static_cast<unsigned char>(text[i]);
    size_t len = utf8_char_length(text, i);
    bool c1_control = len == 2 && lead == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0;
    bool allowed_control = lead == '\n' || (tabs && lead == '\t');
    if (len == 0 || (lead < 0x20 && !allowed_control) || lead == 0x7f || c1_control) {
      std::string offending = text.substr(i, std::max<size_t>(len, 1));
      return ::testing::AssertionFailure()
             << "byte " << i << " (" << printable(offending) << ") is a control character or not UTF-8 in:\n"
             << printable(text);
    }
    i += len;
  }
  return ::testing::AssertionSuccess();
}

struct TvcRun {
  int status;  // the exit status, or 128 + the signal
  std::string out, err;
};

// Runs `$TVC_EXE args` (the tvc program; meson sets TVC_EXE) through bash, with shell_prefix
// before it (e.g. "ulimit -v N; "); stdout and stderr are captured through files in dir.
inline TvcRun run_tvc(const TempDir& dir, const std::string& args, const std::string& shell_prefix = "") {
  const char* exe = std::getenv("TVC_EXE");
  EXPECT_NE(exe, nullptr) << "TVC_EXE is not set (meson sets it)";
  if (!exe) return {-1, "", ""};
  std::string out = dir / "stdout", err = dir / "stderr";
  std::string cmd = "/bin/bash -c '" + shell_prefix + "exec \"" + exe + "\" " + args + "' >" + out + " 2>" + err;
  int rc = std::system(cmd.c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc), read_file(out), read_file(err)};
}

}  // namespace tvc::test
