// safetensors: round trips with the reference Python package (every dtype, bit-exact), the
// float8 decoding table, crash-safe writes, files shrinking under us, lazy memory mapping.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "io/file.h"
#include "test_helpers.h"
#include "torch_golden.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"
#include "tvc/serialize.h"

namespace tvc {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;
using test::error_of;
using test::hex;
using test::read_file;
using test::TempDir;
using test::tensor_bytes;
using test::write_file;

bool same(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && tensor_bytes(a) == tensor_bytes(b);
}

// Python code that writes, with the safetensors package, one tensor of random bytes per dtype
// (and an empty and a 0-d one) plus metadata to `path`, then prints each tensor's dtype,
// shape and bytes (hex) as JSON.
std::string write_every_dtype_py(const std::string& path) {
  return R"PY(
import ctypes, json, random
from safetensors._safetensors_rust import TensorSpec, serialize_file
rng = random.Random(7)
specs = [("bool", [3, 5]), ("uint8", [4, 3]), ("int8", [7]), ("int16", [2, 3]), ("uint16", [5]),
         ("int32", [3, 2]), ("uint32", [4]), ("int64", [2, 2]), ("uint64", [3]), ("float16", [6]),
         ("bfloat16", [2, 4]), ("float32", [3, 4]), ("float64", [5]), ("float8_e4m3fn", [9]),
         ("float8_e5m2", [2, 3]), ("float8_e4m3fnuz", [4]), ("float8_e5m2fnuz", [4]),
         ("float8_e8m0fnu", [3]), ("float4_e2m1fn_x2", [2, 3]), ("complex64", [3])]
size = {"bool": 1, "uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
        "int64": 8, "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
        "complex64": 8}
keep, tensors = [], {}
def add(name, dtype, shape, nbytes):
    data = bytes(rng.randrange(2) if dtype == "bool" else rng.randrange(256) for _ in range(nbytes))
    buf = ctypes.create_string_buffer(data, max(nbytes, 1))
    keep.append(buf)
    tensors[name] = TensorSpec(dtype=dtype, shape=shape, data_ptr=ctypes.addressof(buf), data_len=nbytes)
for dtype, shape in specs:
    n = 1
    for d in shape: n *= d
    add("t." + dtype, dtype, shape, n * size.get(dtype, 1))
add("empty", "float32", [0, 3], 0)
add("scalar", "float64", [], 8)
serialize_file(tensors, ")PY" +
         path + R"PY(", metadata={"format": "pt", "note": "caf\u00e9"})
from safetensors import deserialize
out = {name: {"dtype": v["dtype"], "shape": v["shape"], "hex": bytes(v["data"]).hex()}
       for name, v in deserialize(open(")PY" +
         path + R"PY(", "rb").read())}
print(json.dumps(out))
)PY";
}

TEST(Safetensors, ReadsEveryDtypeWrittenByThePythonPackageBitExact) {
  TempDir dir;
  std::string path = dir / "every.safetensors";
  std::string out = test::torch_run_uncached(write_every_dtype_py(path));
  ASSERT_FALSE(out.empty());
  nlohmann::json expected = nlohmann::json::parse(out);

  io::SafetensorsFile file = io::SafetensorsFile::open(path);
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "caf\xc3\xa9"}}));
  ASSERT_EQ(file.entries().size(), expected.size());
  for (const auto& e : file.entries()) {
    SCOPED_TRACE(e.name);
    const auto& want = expected.at(e.name);
    EXPECT_EQ(io::safetensors_name(e.dtype), want.at("dtype").get<std::string>());
    EXPECT_EQ(e.shape, want.at("shape").get<Shape>());
    EXPECT_EQ(hex(file.bytes(e.name)), want.at("hex").get<std::string>());
    if (auto exact = io::exact_dtype(e.dtype)) {
      Tensor t = file.tensor(e.name);
      EXPECT_EQ(t.dtype(), *exact);
      EXPECT_EQ(t.shape(), e.shape);
      EXPECT_EQ(hex(tensor_bytes(t)), want.at("hex").get<std::string>());
    } else if (io::widened_dtype(e.dtype)) {
      std::string msg = error_of([&] { file.tensor(e.name); });
      EXPECT_THAT(msg, HasSubstr("widen"));
      EXPECT_THAT(msg, HasSubstr(e.name));
      EXPECT_EQ(file.tensor(e.name, {.widen = true}).shape(), e.shape);
    } else {
      EXPECT_THROW(file.tensor(e.name, {.widen = true}), Error);
    }
  }
  // Unsigned integers widen to their exact values.
  std::vector<uint8_t> u16 = file.bytes("t.uint16");
  Tensor w16 = file.tensor("t.uint16", {.widen = true});
  ASSERT_EQ(w16.dtype(), DType::Int32);
  for (int64_t i = 0; i < w16.numel(); ++i) EXPECT_EQ(w16.data_ptr<int32_t>()[i], u16[2 * i] | (u16[2 * i + 1] << 8));
  std::vector<uint8_t> u32 = file.bytes("t.uint32");
  Tensor w32 = file.tensor("t.uint32", {.widen = true});
  ASSERT_EQ(w32.dtype(), DType::Int64);
  for (int64_t i = 0; i < w32.numel(); ++i) {
    uint32_t v;
    std::memcpy(&v, u32.data() + 4 * i, 4);
    EXPECT_EQ(w32.data_ptr<int64_t>()[i], int64_t{v});
  }
}

TEST(Safetensors, RawCopyIsReadBackEqualByThePythonPackage) {
  TempDir dir;
  std::string src = dir / "src.safetensors", dst = dir / "dst.safetensors";
  ASSERT_FALSE(test::torch_run_uncached(write_every_dtype_py(src)).empty());
  io::SafetensorsFile file = io::SafetensorsFile::open(src);
  std::vector<std::pair<std::string, io::RawTensor>> raw;
  for (const auto& e : file.entries()) raw.emplace_back(e.name, io::RawTensor{e.dtype, e.shape, file.bytes(e.name)});
  io::save_safetensors_raw(dst, raw, file.metadata());

  // The header: 8-byte aligned, "__metadata__" first, names sorted; every tensor aligned.
  std::string bytes = read_file(dst);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.compare(8, 16, "{\"__metadata__\":"), 0) << bytes.substr(8, 40);
  io::SafetensorsFile copy = io::SafetensorsFile::open(dst);
  for (const auto& e : copy.entries())
    EXPECT_EQ(e.begin % (io::bit_size(e.dtype) >= 8 ? io::bit_size(e.dtype) / 8 : 1), 0u) << e.name;

  std::string check = test::torch_run_uncached(R"PY(
from safetensors import deserialize, safe_open
a = {k: (v["dtype"], v["shape"], bytes(v["data"])) for k, v in deserialize(open(")PY" +
                                               src + R"PY(", "rb").read())}
b = {k: (v["dtype"], v["shape"], bytes(v["data"])) for k, v in deserialize(open(")PY" +
                                               dst + R"PY(", "rb").read())}
with safe_open(")PY" + dst + R"PY(", framework="np") as f:
    meta = f.metadata()
print("equal" if a == b and meta == {"format": "pt", "note": "caf\u00e9"} else "DIFFERENT", len(b))
)PY");
  EXPECT_EQ(check, "equal 22\n");
}

TEST(Safetensors, TensorsSavedByTvcLoadEqualInTorch) {
  TempDir dir;
  std::string path = dir / "tvc.safetensors";
  manual_seed(3);
  Tensor a = randn({3, 4});
  Tensor b = randn({4, 5}, {.dtype = DType::Float64}).transpose(0, 1);  // non-contiguous
  Tensor h = randn({6}).to(DType::Float16), bf = randn({2, 3}).to(DType::BFloat16);
  Tensor i = randint(-1000, 1000, {7}), k = randint(0, 2, {4}).to(DType::Bool);
  std::vector<std::pair<std::string, Tensor>> tensors = {{"a", a},   {"b.t", b}, {"h", h},
                                                         {"bf", bf}, {"i", i},   {"k", k}};
  io::save_safetensors(path, tensors, {{"format", "pt"}});
  std::string code = "from safetensors.torch import load_file\nd = load_file('" + path + "')\nok = True\n";
  for (const auto& [name, t] : tensors)
    code += "ok = ok and torch.equal(d['" + name + "'], " + test::py_tensor(t) + ")\n";
  code += "print(ok, sorted(d))\n";
  EXPECT_EQ(test::torch_run_uncached(code), "True ['a', 'b.t', 'bf', 'h', 'i', 'k']\n");
  // And back into tvc, bit for bit.
  io::SafetensorsFile file = io::SafetensorsFile::open(path);
  for (const auto& [name, t] : tensors) EXPECT_EQ(tensor_bytes(file.tensor(name)), tensor_bytes(t)) << name;
}

// Bit patterns and their values, from the OCP 8-bit float specification and torch's fnuz types.
TEST(Safetensors, Float8BitPatternsWidenToTheirValues) {
  const float nan = std::nanf(""), inf = INFINITY;
  struct Case {
    io::FileDType dtype;
    std::vector<std::pair<uint8_t, float>> values;
  };
  std::vector<Case> cases = {
      {io::FileDType::Float8E4M3,
       {{0x00, 0.0f},
        {0x80, -0.0f},
        {0x01, 0.001953125f},
        {0x07, 0.013671875f},
        {0x08, 0.015625f},
        {0x38, 1.0f},
        {0x39, 1.125f},
        {0xb8, -1.0f},
        {0x7e, 448.0f},
        {0xfe, -448.0f},
        {0x7f, nan},
        {0xff, nan}}},
      {io::FileDType::Float8E5M2,
       {{0x00, 0.0f},
        {0x01, 1.52587890625e-05f},
        {0x04, 6.103515625e-05f},
        {0x3c, 1.0f},
        {0x3d, 1.25f},
        {0xc0, -2.0f},
        {0x7b, 57344.0f},
        {0x7c, inf},
        {0xfc, -inf},
        {0x7d, nan},
        {0xff, nan}}},
      {io::FileDType::Float8E4M3Fnuz,
       {{0x00, 0.0f}, {0x40, 1.0f}, {0x01, 0.0009765625f}, {0x7f, 240.0f}, {0xff, -240.0f}, {0x80, nan}}},
      {io::FileDType::Float8E5M2Fnuz,
       {{0x00, 0.0f}, {0x40, 1.0f}, {0x01, 7.62939453125e-06f}, {0x7f, 57344.0f}, {0xc0, -1.0f}, {0x80, nan}}},
      {io::FileDType::Float8E8M0,
       {{0x7f, 1.0f}, {0x80, 2.0f}, {0x00, 5.877471754111438e-39f}, {0xfe, 1.7014118346046923e38f}, {0xff, nan}}},
  };
  TempDir dir;
  std::string path = dir / "f8.safetensors";
  std::vector<std::pair<std::string, io::RawTensor>> raw;
  for (const auto& c : cases) {
    io::RawTensor t{c.dtype, {static_cast<int64_t>(c.values.size())}, {}};
    for (auto [bits, value] : c.values) t.bytes.push_back(bits);
    raw.emplace_back(io::safetensors_name(c.dtype), t);
  }
  io::save_safetensors_raw(path, raw);
  io::SafetensorsFile file = io::SafetensorsFile::open(path);
  for (const auto& c : cases) {
    Tensor t = file.tensor(io::safetensors_name(c.dtype), {.widen = true});
    ASSERT_EQ(t.dtype(), DType::Float32);
    for (size_t i = 0; i < c.values.size(); ++i) {
      float got = t.data_ptr<float>()[i], want = c.values[i].second;
      SCOPED_TRACE(::testing::Message() << io::safetensors_name(c.dtype) << " bits 0x" << std::hex
                                        << int{c.values[i].first});
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << got;
      } else {
        EXPECT_EQ(got, want);
        EXPECT_EQ(std::signbit(got), std::signbit(want));
      }
    }
  }
}

TEST(Safetensors, BoolBytesOtherThanZeroOrOneAreRefused) {
  TempDir dir;
  std::string path = dir / "bool.safetensors";
  io::save_safetensors_raw(path, {{"mask", io::RawTensor{io::FileDType::Bool, {3}, {1, 0, 7}}}});
  std::string msg = error_of([&] { io::SafetensorsFile::open(path).tensor("mask"); });
  EXPECT_THAT(msg, HasSubstr("'mask'"));
  EXPECT_THAT(msg, HasSubstr("byte value 7"));
}

TEST(Safetensors, WriterRefusesBadNamesAndKeepsNoTemporaryFile) {
  TempDir dir;
  std::string path = dir / "w.safetensors";
  Tensor t = ones({2});
  EXPECT_THROW(io::save_safetensors(path, {{"a", t}, {"a", t}}), Error);
  EXPECT_THROW(io::save_safetensors(path, {{"", t}}), Error);
  EXPECT_THROW(io::save_safetensors(path, {{"__metadata__", t}}), Error);
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

// A writer that fails before commit removes its temporary file and leaves the old file.
TEST(Safetensors, AtomicWriterWithoutCommitLeavesTheOldFile) {
  TempDir dir;
  std::string path = dir / "model.safetensors";
  io::save_safetensors(path, {{"w", full({4}, 1.0)}});
  std::string before = read_file(path);
  {
    io::AtomicFileWriter writer(path);
    writer.write("partial", 7);
    EXPECT_TRUE(fs::exists(writer.temp_path()));
  }
  EXPECT_EQ(read_file(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

std::vector<std::string> temporaries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tvc-tmp.") != std::string::npos) out.push_back(e.path().string());
  return out;
}

// A save killed midway (SIGKILL, no chance to clean up) leaves the previous file intact; the
// next save removes the dead writer's temporary file.
TEST(Safetensors, WriterKilledMidFileLeavesTheOldFileAndNextSaveCleansUp) {
  TempDir dir;
  std::string path = dir / "model.safetensors";
  io::save_safetensors(path, {{"w", full({4}, 1.0)}});
  std::string before = read_file(path);

  constexpr size_t kBig = size_t{400} << 20;  // long enough to be caught midway
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    io::RawTensor big{io::FileDType::UInt8, {static_cast<int64_t>(kBig)}, std::vector<uint8_t>(kBig, 0x5a)};
    io::save_safetensors_raw(path, {{"big", big}});
    ::_exit(0);
  }
  // Wait until the child has written part of its temporary file, then kill it.
  bool caught = false;
  for (int i = 0; i < 20000 && !caught; ++i) {
    for (const auto& t : temporaries(dir.path()))
      if (fs::file_size(t) >= (size_t{32} << 20)) caught = true;
    if (!caught) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(caught) << "the child's temporary file never grew";
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child finished before it was killed";
  EXPECT_EQ(read_file(path), before);
  ASSERT_EQ(temporaries(dir.path()).size(), 1u);

  io::save_safetensors(path, {{"w", full({4}, 2.0)}});
  EXPECT_TRUE(temporaries(dir.path()).empty());
  EXPECT_EQ(io::SafetensorsFile::open(path).tensor("w").data_ptr<float>()[0], 2.0f);
}

// A file truncated by another process after it was opened and validated: reading a tensor is
// an error naming the file, not a crash.
TEST(Safetensors, FileTruncatedAfterOpenIsAnError) {
  TempDir dir;
  std::string path = dir / "t.safetensors";
  io::save_safetensors(path, {{"a", randn({1000})}, {"b", randn({1000})}});
  io::SafetensorsFile file = io::SafetensorsFile::open(path);
  fs::resize_file(path, fs::file_size(path) / 2);
  std::string msg = error_of([&] { file.tensor("b"); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("truncated"));
}

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

// A 500 MB file opened with map: only the pages of touched tensors become resident.
TEST(Safetensors, MappedFileStaysOffResidentMemoryUntilTouched) {
  TempDir dir;
  std::string path = dir / "big.safetensors";
  constexpr int kTensors = 5;
  constexpr int64_t kElems = 25 << 20;  // 100 MB of float32 each
  std::string header = "{";
  for (int i = 0; i < kTensors; ++i)
    header += cat_str(i ? "," : "", "\"t", i, "\":{\"dtype\":\"F32\",\"shape\":[", kElems, "],\"data_offsets\":[",
                      i * kElems * 4, ",", (i + 1) * kElems * 4, "]}");
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  {
    std::ofstream out(path, std::ios::binary);
    uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
  }
  fs::resize_file(path, 8 + header.size() + kTensors * kElems * 4);  // a sparse 500 MB

  int64_t base = resident_bytes();
  io::SafetensorsFile file = io::SafetensorsFile::open(path);
  std::vector<Tensor> tensors;
  for (int i = 0; i < kTensors; ++i) tensors.push_back(file.tensor(cat_str("t", i), {.map = true}));
  int64_t opened = resident_bytes() - base;
  EXPECT_LT(opened, 16 << 20) << "resident memory grew by " << opened << " bytes on open";
  EXPECT_EQ(tensors[0].storage()->nbytes(), fs::file_size(path));  // a view of the mapping

  EXPECT_EQ(tensors[2].sum().item<double>(), 0.0);  // touches 100 MB
  int64_t touched = resident_bytes() - base;
  EXPECT_GT(touched, 90 << 20);
  EXPECT_LT(touched, 150 << 20);
}

// load_into: a float16 file into a float32 module, with and without assign (map: views).
TEST(Safetensors, LoadIntoModuleConvertsDtypeAndAssignMaps) {
  TempDir dir;
  std::string path = dir / "lin.safetensors";
  manual_seed(5);
  nn::Linear source(4, 3);
  io::save_safetensors(path, source.state_dict());

  nn::Linear copy(4, 3);
  copy.load_state_dict(path);
  EXPECT_TRUE(same(copy.weight(), source.weight()));
  EXPECT_NE(copy.weight().storage()->nbytes(), fs::file_size(path));

  nn::Linear mapped(4, 3);
  io::load_into(mapped, path, {.read = {.map = true}}, true, true);
  EXPECT_TRUE(same(mapped.weight(), source.weight()));
  EXPECT_EQ(mapped.weight().storage()->nbytes(), fs::file_size(path));
  EXPECT_TRUE(mapped.weight().requires_grad());

  std::string half = dir / "half.safetensors";
  io::save_safetensors(half,
                       {{"weight", source.weight().to(DType::Float16)}, {"bias", source.bias().to(DType::Float16)}});
  nn::Linear from_half(4, 3);
  io::load_into(from_half, half, {}, true, true);
  EXPECT_EQ(from_half.weight().dtype(), DType::Float32);
  EXPECT_TRUE(same(from_half.weight(), source.weight().to(DType::Float16).to(DType::Float32)));
}

}  // namespace
}  // namespace tvc
