// PyTorch as the oracle: runs Python code with Debian's torch (/usr/bin/python3) and reads back
// what it prints. Results are cached in the golden cache folder (TVC_GOLDEN_CACHE, default
// <build>/golden-cache), keyed by a hash of the code, so goldens are generated at test time and
// never committed. When torch is missing the calling test fails, saying what to install.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tvc/tensor.h"

namespace tvc::test {

// stdout of `python3 -c code` (prefixed with `import torch`).
std::string torch_run(const std::string& code);
// The same, run every time and never cached: for code that writes or reads files.
std::string torch_run_uncached(const std::string& code);
// The folder of files a Python script writes: `/usr/bin/python3 script ARGS... FOLDER` runs once
// into a folder of the golden cache keyed by a hash of the script's text and the arguments; the
// script writes a file named `complete` last, into a folder of the calling process's own that
// is renamed into place once complete (programs running at once may need the same goldens). A
// failed run is run once more; a second failure is a test failure whose message starts with how
// the script ended and its last line. Returns the folder ("" after a recorded test failure),
// which stays there until the calling test ends; call again in a later test rather than keep the
// path. The golden folders kept for later runs take at most TVC_GOLDEN_CACHE_GIB GiB (default 2):
// before a script runs, the least recently used ones no running test holds are removed.
std::string python_golden_folder(const std::string& script, const std::vector<std::string>& args);
// Lets go of the golden folders this process holds (done when each test ends).
void release_golden_folders();
// Lets go of one folder before the test ends: a test that checks many models in turn, done with
// one model's goldens, lets them be removed for the next model's.
void release_golden_folder(const std::string& dir);
// stdout parsed as JSON.
nlohmann::json torch_json(const std::string& code);

// Python source for a tensor with t's exact values (float64 printed with 17 digits), shape and
// dtype, e.g. "torch.tensor([...], dtype=torch.float32).reshape([2, 3])".
std::string py_tensor(const Tensor& t);
// A Python expression that prints tensors as JSON: use in code as print(json_tensors([...])).
extern const char* kPyJsonHelpers;
// A float64 tensor from JSON {"shape": [...], "data": [...]} as printed by json_tensors
// (non-finite values travel as the strings "nan", "inf", "-inf").
Tensor tensor_from_json(const nlohmann::json& j);

}  // namespace tvc::test
