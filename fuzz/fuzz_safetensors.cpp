// libFuzzer target: the safetensors reader (tvc::io::SafetensorsFile) on arbitrary bytes.
//
// The input is the whole file. It is opened, and every tensor the header lists is read in each
// way the API offers: copied as its own dtype, copied widened, mapped (zero-copy views of the
// file) and as raw bytes. tvc::Error is the expected answer to a malformed file; any other
// exception, a crash, a sanitizer report, a leaked descriptor or a tensor outside its storage
// is a finding (libFuzzer saves the input as crash-*).
#include <cstdint>
#include <exception>
#include <string>

#include "fuzz_common.h"
#include "tvc/error.h"
#include "tvc/serialize.h"

namespace {

// Reads one tensor one way. A tvc::Error here (e.g. a BOOL byte that is not 0 or 1, a dtype
// tvc only loads widened) is a valid answer about this tensor; the others are still read.
template <typename Read>
void read_one(Read read) {
  try {
    read();
  } catch (const tvc::Error&) {
  }
}

void run(const std::string& path) {
  tvc::io::SafetensorsFile file = tvc::io::SafetensorsFile::open(path);
  (void)file.metadata();
  for (const tvc::io::SafetensorsEntry& e : file.entries()) {
    const std::string& name = e.name;
    if (&file.entry(name) != &e) tvc_fuzz::finding("entry('" + name + "') is not the listed entry");
    read_one([&] { tvc_fuzz::check_tensor(file.tensor(name), name); });
    read_one([&] { tvc_fuzz::check_tensor(file.tensor(name, {.widen = true}), name); });
    read_one([&] { tvc_fuzz::check_tensor(file.tensor(name, {.map = true}), name); });
    read_one([&] {
      std::vector<uint8_t> bytes = file.bytes(name);
      if (bytes.size() != e.nbytes)
        tvc_fuzz::finding("bytes('" + name + "') gave " + std::to_string(bytes.size()) + " bytes, the header says " +
                          std::to_string(e.nbytes));
    });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return tvc_fuzz::run_on_file(data, size, run);
}
