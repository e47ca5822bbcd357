// The malformed-file table: every broken safetensors and .pth file must make `tvc inspect` exit
// with status 1 and a message naming the file and the fault, under a memory cap that a lying
// size would break (ulimit -v; in AddressSanitizer builds, ASan's allocation limit instead,
// since ASan reserves terabytes of address space), and print no control character, also under
// a file name of escape sequences. Also: names, metadata and pickled strings holding escape
// sequences printed escaped, format detection, checkpoint unwrapping and `tvc convert` between
// formats.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "test_helpers.h"
#include "torch_golden.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"
#include "tvc/serialize.h"

namespace tvc {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;
using test::read_file;
using test::TempDir;
using test::write_file;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif

constexpr int kMemoryCapMb = 1024;

using test::TvcRun;

// Runs `tvc ARGS` under the memory cap.
TvcRun run_tvc_capped(const TempDir& dir, const std::string& args) {
  std::string limit = kAsan ? cat_str("ASAN_OPTIONS=max_allocation_size_mb=", kMemoryCapMb,
                                      ":allocator_may_return_null=0:detect_leaks=1:exitcode=86 ")
                            : cat_str("ulimit -v ", kMemoryCapMb * 1024, "; ");
  return test::run_tvc(dir, args, limit);
}

// A file name that, printed as it is, would set the terminal's title, ring its bell and clear the
// screen, with bytes that are not UTF-8 (a lone C1 CSI byte, 0xff, an overlong form); and how
// messages print it.
const std::string kHostileName = "evil\x1b]0;pwned\x07\x1b[2J\x9b\xff\xc0\xaf-";
const std::string kHostileNamePrinted = "evil\\x1b]0;pwned\\x07\\x1b[2J\\x9b\\xff\\xc0\\xaf-";

// `tvc inspect path` exits with status 1 and `error: 'path': ...fault...`; so does the file
// copied under a hostile name, whose message names it escaped. No output has a control byte.
void expect_inspect_fails(const TempDir& dir, const std::string& path, const std::string& fault) {
  TvcRun r = run_tvc_capped(dir, "inspect " + path);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("error: '" + path + "'"));
  EXPECT_THAT(r.err, HasSubstr(fault));
  EXPECT_TRUE(test::IsTerminalSafe(r.out + r.err));

  std::string name = fs::path(path).filename().string();
  fs::copy_file(path, dir / (kHostileName + name), fs::copy_options::overwrite_existing);
  TvcRun hostile = run_tvc_capped(dir, "inspect \"" + dir / (kHostileName + name) + "\"");
  EXPECT_EQ(hostile.status, 1) << hostile.err;
  EXPECT_THAT(hostile.err, HasSubstr("error: '" + dir / (kHostileNamePrinted + name) + "'"));
  EXPECT_THAT(hostile.err, HasSubstr(fault));
  EXPECT_TRUE(test::IsTerminalSafe(hostile.out + hostile.err));
}

// ---------------------------------------------------------------- safetensors cases

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

std::string safetensors(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

// Two tensors: a F32 [2] at [0, 8), b I64 [1] at [8, 16).
const std::string kHeader =
    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}})";
const std::string kData = "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10";

std::string one_tensor(const std::string& entry, size_t data_size) {
  return safetensors(R"({"t":)" + entry + "}", std::string(data_size, '\x11'));
}

struct Malformed {
  std::string name;   // also the file name
  std::string bytes;  // the file
  std::string fault;  // a substring the message must contain
};

std::vector<Malformed> safetensors_cases() {
  std::string valid = safetensors(kHeader, kData);
  std::string nested = R"({"t":{"dtype":"F32","shape":)" + std::string(100000, '[') + std::string(100000, ']') +
                       R"(,"data_offsets":[0,4]}})";
  return {
      {"empty", "", "shorter than the 8-byte header length"},
      {"five-bytes", "\x08\x00\x00\x00\x00", "shorter than the 8-byte header length"},
      {"header-length-over-limit", le64(100'000'001) + "{}", "beyond the limit"},
      {"header-length-past-end", le64(1000) + "{}      ", "runs past the end of the file"},
      {"header-length-max-u64", le64(~uint64_t{0}) + "{}      ", "beyond the limit"},
      {"truncated-in-header", valid.substr(0, 40), "runs past the end of the file"},
      {"truncated-in-data", valid.substr(0, valid.size() - 4), "past the end of the file"},
      {"trailing-bytes", valid + "junk", "cover 16 bytes of data but the file has 20"},
      {"header-not-utf8", safetensors("{\"\xff\xfe\":{}}", ""), "not UTF-8"},
      {"header-overlong-utf8", safetensors("{\"\xc0\xaf\":{}}", ""), "not UTF-8"},
      {"header-not-json", safetensors(R"({"a": {"dtype": )", ""), "not valid JSON"},
      {"header-json-array", safetensors("[1, 2]", ""), "not a weight file tvc reads"},
      {"entry-not-object", safetensors(R"({"t": 5})", ""), "entry 't' is a number, not an object"},
      {"duplicate-tensor",
       safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                   R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                   std::string(8, '\0')),
       "duplicate tensor name 'a'"},
      {"duplicate-metadata", safetensors(R"({"__metadata__":{},"__metadata__":{}})", ""),
       "\"__metadata__\" appears twice"},
      {"duplicate-field", one_tensor(R"({"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]})", 4),
       "has \"dtype\" twice"},
      {"unknown-dtype", one_tensor(R"({"dtype":"F33","shape":[1],"data_offsets":[0,4]})", 4), "unknown dtype 'F33'"},
      {"unknown-field", one_tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1})", 4),
       "unknown field \"x\""},
      {"missing-dtype", one_tensor(R"({"shape":[1],"data_offsets":[0,4]})", 4), "has no \"dtype\""},
      {"metadata-not-string", safetensors(R"({"__metadata__":{"k":1}})", ""), "value of 'k' is a number, not a string"},
      {"negative-offset", one_tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})", 4), "a negative number"},
      {"negative-dimension", one_tensor(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})", 4),
       "a negative number"},
      {"float-offset", one_tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4.5]})", 4), "non-integer number"},
      {"offset-beyond-u64", one_tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0,99999999999999999999999]})", 4),
       "non-integer number"},
      {"dimension-beyond-i64", one_tensor(R"({"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,4]})", 4),
       "beyond int64"},
      {"shape-product-overflow",
       one_tensor(R"({"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,4]})", 4),
       "element count overflows"},
      {"shape-product-wraps-to-zero",
       one_tensor(R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]})", 0),
       "element count overflows"},
      {"byte-size-overflow", one_tensor(R"({"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,4]})", 4),
       "byte size that overflows"},
      {"size-mismatch", one_tensor(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})", 8),
       "needs 12 bytes but its data_offsets span 8"},
      {"offsets-reversed", one_tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})", 8),
       "end before they begin"},
      {"three-offsets", one_tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})", 8),
       "3 data_offsets instead of 2"},
      {"offsets-out-of-range",
       one_tensor(R"({"dtype":"F32","shape":[274877906944],"data_offsets":[0,1099511627776]})", 16),
       "runs past the end of the file"},
      {"offsets-overlap",
       safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                   std::string(12, '\0')),
       "(overlapping)"},
      {"offsets-hole",
       safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                   std::string(12, '\0')),
       "(a hole)"},
      {"partial-byte-f4", one_tensor(R"({"dtype":"F4","shape":[3],"data_offsets":[0,2]})", 2),
       "does not fill whole bytes"},
      {"nested-arrays", safetensors(nested, std::string(4, '\0')), "an array where"},
      // Control characters in names, keys and the JSON itself reach the message escaped.
      {"tensor-name-with-controls",
       safetensors(R"({"\u001b]0;x\u0007\u009b":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", ""),
       "tensor '\\x1b]0;x\\x07\\xc2\\x9b' has unknown dtype 'F33'"},
      {"dtype-with-controls", one_tensor(R"({"dtype":"F\u001b[2J","shape":[1],"data_offsets":[0,4]})", 4),
       "unknown dtype 'F\\x1b[2J'"},
      {"metadata-key-with-controls", safetensors(R"({"__metadata__":{"\u001b[2J":1}})", ""),
       "value of '\\x1b[2J' is a number"},
      {"header-control-bytes-in-json", safetensors("{\"a\x1b[2J\x07\":{}}", ""), "not valid JSON"},
      {"header-c1-outside-strings", safetensors("{\xc2\x9b\x1b]0;x\x07}", ""), "not valid JSON"},
  };
}

TEST(Malformed, SafetensorsFilesFailInspectWithTheirFault) {
  TempDir dir;
  std::vector<Malformed> cases = safetensors_cases();
  EXPECT_GE(cases.size(), 30u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = dir / (c.name + ".safetensors");
    write_file(path, c.bytes);
    expect_inspect_fails(dir, path, c.fault);
  }
}

// The valid base of the table loads, so the table's faults are what breaks its files.
TEST(Malformed, TheValidBaseInspects) {
  TempDir dir;
  std::string path = dir / "valid.safetensors";
  write_file(path, safetensors(kHeader, kData));
  TvcRun r = run_tvc_capped(dir, "inspect " + path);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("format: safetensors"));
  EXPECT_THAT(r.out, HasSubstr("total: 2 tensors, 3 parameters, 16 bytes"));
}

// ---------------------------------------------------------------- .pth cases

// Python (Debian's torch) that writes the broken .pth files of the table into DIR: valid files
// from torch.save, then cut or patched, and archives around hand-made pickles.
std::string write_broken_pth_py(const std::string& dir) {
  return R"PY(
import collections, io, pickle, struct, zipfile
D = ")PY" +
         dir + R"PY("
def save(name, data): open(f"{D}/{name}", "wb").write(data)
def saved(obj, **kw):
    b = io.BytesIO(); torch.save(obj, b, **kw); return b.getvalue()
def archive(pkl, storages=(), compress=zipfile.ZIP_STORED):
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", compress) as z:
        if pkl is not None: z.writestr("archive/data.pkl", pkl)
        for key, data in storages: z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", "3\n")
    return b.getvalue()

# Tensors with storages we describe by hand (key, storage type, numel).
class Ref:
    def __init__(self, key, numel, stype="FloatStorage"): self.key, self.numel, self.stype = key, numel, stype
class T:
    def __init__(self, ref, size, stride, offset=0): self.a = (ref, offset, tuple(size), tuple(stride))
    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.a + (False, collections.OrderedDict()))
class P(pickle.Pickler):
    def persistent_id(self, obj):
        return ("storage", getattr(torch, obj.stype), obj.key, "cpu", obj.numel) if isinstance(obj, Ref) else None
def pkl(obj):
    b = io.BytesIO(); P(b, protocol=2).dump(obj); return b.getvalue()

torch.manual_seed(0)
sd = collections.OrderedDict(w=torch.randn(2, 3), b=torch.arange(3))
good = saved(sd)
save("truncated-zip.pth", good[: len(good) - 30])
save("truncated-zip-half.pth", good[: len(good) // 2])
# The central directory entry of data/0 claims 2 GB (compressed and uncompressed).
lie = bytearray(good)
at = lie.find(b"PK\x01\x02", lie.find(b"PK\x01\x02") + 1)  # the second entry: data/0 follows data.pkl
while not lie[at + 46: at + 46 + struct.unpack("<H", lie[at + 28: at + 30])[0]].endswith(b"data/0"):
    at = lie.find(b"PK\x01\x02", at + 1)
lie[at + 20: at + 28] = struct.pack("<II", 0x7FFFFFFF, 0x7FFFFFFF)
save("zip-entry-size-lie.pth", bytes(lie))
# A deflated data.pkl whose sizes claim 2 GB.
bomb = bytearray(archive(pkl(sd), compress=zipfile.ZIP_DEFLATED))
at = bomb.find(b"PK\x01\x02")
bomb[at + 24: at + 28] = struct.pack("<I", 0x7FFFFFFF)
save("zip-deflated-size-lie.pth", bytes(bomb))
save("zip-without-data-pkl.pth", archive(None, [("0", b"\0" * 8)]))
save("forbidden-global.pth", archive(b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R."))
save("forbidden-global-builtins-eval.pth", archive(b"\x80\x02cbuiltins\neval\nX\x01\x00\x00\x001\x85R."))
save("setitem-on-list.pth", archive(b"\x80\x02]X\x01\x00\x00\x00aK\x01s."))
save("stack-underflow.pth", archive(b"\x80\x02s."))
save("deep-nesting.pth", archive(b"\x80\x02" + b"]" * 200000 + b"a" * 199999 + b"."))
save("deep-marks.pth", archive(b"\x80\x02" + b"(" * 200000 + b"."))
save("memo-out-of-range.pth", archive(b"\x80\x02h\x07."))
save("string-past-end.pth", archive(b"\x80\x02X\xff\xff\xff\x7f."))
save("storage-shorter-than-tensor.pth",
     archive(pkl({"w": T(Ref("0", 4), [100], [1])}), [("0", b"\0" * 16)]))
save("storage-numel-vs-entry.pth",
     archive(pkl({"w": T(Ref("0", 1 << 40), [4], [1])}), [("0", b"\0" * 16)]))
save("negative-stride.pth", archive(pkl({"w": T(Ref("0", 4), [2], [-1])}), [("0", b"\0" * 16)]))
save("missing-storage-entry.pth", archive(pkl({"w": T(Ref("9", 4), [4], [1])}), [("0", b"\0" * 16)]))
save("unknown-storage-type.pth",
     archive(pkl({"w": T(Ref("0", 4, "QInt8Storage"), [4], [1])}), [("0", b"\0" * 4)]))
legacy = saved(collections.OrderedDict(w=torch.randn(2, 3)), _use_new_zipfile_serialization=False)
save("legacy-truncated.pth", legacy[: len(legacy) - 10])
lying = bytearray(legacy)  # the int64 element count in front of the one storage's 24 bytes
lying[len(lying) - 32: len(lying) - 24] = struct.pack("<q", 1 << 40)
save("legacy-numel-lie.pth", bytes(lying))
save("legacy-forbidden-global.pth", legacy[: legacy.find(b"\x80\x02", 20)] + b"\x80\x02cposix\nsystem\nX\x02\x00\x00\x00ls\x85R.")
save("not-a-weight-file.pth", b"hello, this is not a checkpoint at all\n")
print("ok")
)PY";
}

struct PthCase {
  std::string file;
  std::string fault;
};

TEST(Malformed, PthFilesFailInspectWithTheirFault) {
  TempDir dir;
  ASSERT_EQ(test::torch_run_uncached(write_broken_pth_py(dir / "")), "ok\n");
  std::vector<PthCase> cases = {
      {"truncated-zip.pth", "zip"},
      {"truncated-zip-half.pth", "zip"},
      {"zip-entry-size-lie.pth", "data/0"},
      {"zip-deflated-size-lie.pth", "data.pkl"},
      {"zip-without-data-pkl.pth", "data.pkl"},
      {"forbidden-global.pth", "GLOBAL os.system is not allowed"},
      {"forbidden-global-builtins-eval.pth", "GLOBAL builtins.eval is not allowed"},
      {"setitem-on-list.pth", "SETITEM"},
      {"stack-underflow.pth", "SETITEM"},
      {"deep-nesting.pth", "nest"},
      {"deep-marks.pth", "nest"},
      {"memo-out-of-range.pth", "memo"},
      {"string-past-end.pth", "past the end"},
      {"storage-shorter-than-tensor.pth", "storage"},
      {"storage-numel-vs-entry.pth", "data/0"},
      {"negative-stride.pth", "stride"},
      {"missing-storage-entry.pth", "data/9"},
      {"unknown-storage-type.pth", "QInt8Storage"},
      {"legacy-truncated.pth", "legacy"},
      {"legacy-numel-lie.pth", "1099511627776"},
      {"legacy-forbidden-global.pth", "GLOBAL posix.system is not allowed"},
      {"not-a-weight-file.pth", "not a weight file tvc reads"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    expect_inspect_fails(dir, dir / c.file, c.fault);
  }
}

// ---------------------------------------------------------------- hostile text

// Escape sequences that set the terminal's title, ring its bell, clear the screen and (the C1
// CSI, U+009B) start a colour change, as crafted names and strings in weight files may hold.
const std::string kEscapes =
    "\x1b]0;pwned\x07\x1b[2J\xc2\x9b"
    "31m";
const std::string kEscapesPrinted = "\\x1b]0;pwned\\x07\\x1b[2J\\xc2\\x9b31m";

// Names and metadata of a safetensors file (JSON's \u escapes, NUL included) print escaped;
// printable text prints as it is.
TEST(HostileText, InspectPrintsSafetensorsNamesAndMetadataEscaped) {
  TempDir dir;
  std::string path = dir / (kHostileName + "names.safetensors");
  std::string header = R"({"__metadata__":{"k\u001b[31m":"v\u0007\u009b2J\u0000"},)"
                       R"("caf\u00e9.\u5c42":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                       R"("w\u001b]0;pwned\u0007\u001b[2J\u009b31m":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  write_file(path, safetensors(header, std::string(8, '\0')));
  TvcRun r = run_tvc_capped(dir, "inspect \"" + path + "\"");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(test::IsTerminalSafe(r.out + r.err));
  EXPECT_THAT(r.out, HasSubstr("file: " + dir / (kHostileNamePrinted + "names.safetensors") + "\n"));
  EXPECT_THAT(r.out, HasSubstr("\ncafé.层 "));
  EXPECT_THAT(r.out, HasSubstr("\nw" + kEscapesPrinted + " "));
  EXPECT_THAT(r.out, HasSubstr("\n  k\\x1b[31m: v\\x07\\xc2\\x9b2J\\x00\n"));
}

// Pickled strings are any bytes (tvc's writer, like a crafted file, does not check them): keys
// and str values with escape sequences and bytes that are not UTF-8 print escaped.
TEST(HostileText, InspectPrintsPickledStringsEscaped) {
  TempDir dir;
  std::string path = dir / (kHostileName + "strings.pth");
  io::save_pth(path, io::Value::dict({{io::Value("w" + kEscapes + "\xff\xed\xa0\x80"), io::Value(ones({1}))},
                                      {io::Value("note"), io::Value("\x1b[31mred\x7f\xc0\xaf")}}));
  TvcRun r = run_tvc_capped(dir, "inspect \"" + path + "\"");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(test::IsTerminalSafe(r.out + r.err));
  EXPECT_THAT(r.out, HasSubstr("file: " + dir / (kHostileNamePrinted + "strings.pth") + "\n"));
  EXPECT_THAT(r.out, HasSubstr("\nw" + kEscapesPrinted + "\\xff\\xed\\xa0\\x80 "));
  EXPECT_THAT(r.out, HasSubstr("\n  note: '\\x1b[31mred\\x7f\\xc0\\xaf'\n"));
}

// A file's keys that do not fit the module reach load_state_dict's message escaped (its own line
// breaks and tabs stay); the keys it returns are the file's, unchanged.
TEST(HostileText, LoadStateDictErrorsEscapeTheFilesKeys) {
  TempDir dir;
  nn::Linear linear(2, 3);
  nn::StateDict sd = linear.state_dict();
  std::string key = "bias" + kEscapes + "\xff";
  sd.insert(key, ones({3}));
  std::string path = dir / (kHostileName + "keys.pth");
  io::save_pth(path, io::Value(sd));
  std::string msg = test::error_of([&] { io::load_into(linear, path); });
  EXPECT_TRUE(test::IsTerminalSafe(msg, /*tabs=*/true));
  EXPECT_THAT(msg, HasSubstr("Error(s) in loading state_dict for Linear:\n\tUnexpected key(s) in state_dict: \"bias" +
                             kEscapesPrinted + "\\xff\". "));
  EXPECT_EQ(linear.load_state_dict(sd, /*strict=*/false).unexpected_keys, std::vector<std::string>{key});
}

// ---------------------------------------------------------------- any format, the CLI

// A torchvision-like state_dict and a DataParallel training checkpoint around it.
std::string write_checkpoints_py(const std::string& dir) {
  return R"PY(
import collections
D = ")PY" +
         dir + R"PY("
torch.manual_seed(1)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(), torch.nn.Linear(4, 2))
for p in net.parameters(): p.data.normal_()
net[1].running_mean.normal_(); net[1].running_var.uniform_(0.5, 2)
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
net(torch.randn(2, 3, 3, 3)).sum().backward(); opt.step()
torch.save(net.state_dict(), f"{D}/plain.pth")
torch.save(net.state_dict(), f"{D}/plain_legacy.pth", _use_new_zipfile_serialization=False)
dp = collections.OrderedDict(("module." + k, v) for k, v in net.state_dict().items())
torch.save({"epoch": 3, "model": dp, "optimizer": opt.state_dict(), "best": 0.75}, f"{D}/ckpt.pth")
torch.save({"state_dict": net.state_dict(), "arch": "tiny"}, f"{D}/wrapped.pth")
print("ok")
)PY";
}

// A torchvision backbone's state_dict, saved by torch as torchvision's files are (zip, and the
// legacy format of the older files such as vgg16-397923af.pth) and by the safetensors package:
// all three load identical, bit for bit, under torchvision's names.
TEST(Weights, TorchvisionResnet18LoadsIdenticallyFromEveryFormat) {
  TempDir dir;
  ASSERT_EQ(test::torch_run_uncached(R"PY(
import torchvision
from safetensors.torch import save_file
D = ")PY" + dir / "" + R"PY("
torch.manual_seed(0)
sd = torchvision.models.resnet18().state_dict()
torch.save(sd, f"{D}/resnet18.pth")
torch.save(sd, f"{D}/resnet18_legacy.pth", _use_new_zipfile_serialization=False)
save_file(sd, f"{D}/resnet18.safetensors")
print(len(sd))
)PY"),
            "122\n");
  nn::StateDict zip = io::load_state_dict(dir / "resnet18.pth");
  nn::StateDict legacy = io::load_state_dict(dir / "resnet18_legacy.pth");
  nn::StateDict st = io::load_state_dict(dir / "resnet18.safetensors");
  ASSERT_EQ(zip.size(), 122u);
  EXPECT_EQ(zip.keys().front(), "conv1.weight");
  EXPECT_EQ(zip.keys().back(), "fc.bias");
  EXPECT_EQ(legacy.keys(), zip.keys());
  for (const auto& [name, t] : zip) {
    EXPECT_EQ(test::tensor_bytes(legacy.at(name)), test::tensor_bytes(t)) << name;
    ASSERT_TRUE(st.contains(name)) << name;
    EXPECT_EQ(st.at(name).dtype(), t.dtype()) << name;
    EXPECT_EQ(test::tensor_bytes(st.at(name)), test::tensor_bytes(t)) << name;
  }
  EXPECT_EQ(zip.at("layer1.0.bn1.num_batches_tracked").dtype(), DType::Int64);
}

TEST(Weights, DetectsTheFormatOfEachFile) {
  TempDir dir;
  ASSERT_EQ(test::torch_run_uncached(write_checkpoints_py(dir / "")), "ok\n");
  io::save_safetensors(dir / "s.safetensors", {{"x", ones({2})}});
  EXPECT_EQ(io::detect_format(dir / "plain.pth"), io::WeightFormat::PthZip);
  EXPECT_EQ(io::detect_format(dir / "plain_legacy.pth"), io::WeightFormat::PthLegacy);
  EXPECT_EQ(io::detect_format(dir / "s.safetensors"), io::WeightFormat::Safetensors);
  EXPECT_THROW(io::detect_format(dir / "absent.pth"), Error);
}

TEST(Weights, UnwrapsTrainingCheckpoints) {
  TempDir dir;
  ASSERT_EQ(test::torch_run_uncached(write_checkpoints_py(dir / "")), "ok\n");
  nn::StateDict plain = io::load_state_dict(dir / "plain.pth");
  nn::StateDict legacy = io::load_state_dict(dir / "plain_legacy.pth");
  nn::StateDict ckpt = io::load_state_dict(dir / "ckpt.pth", {.unwrap = true});
  nn::StateDict wrapped = io::load_state_dict(dir / "wrapped.pth", {.unwrap = true});
  std::vector<std::string> keys = {
      "0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked",
      "3.weight", "3.bias"};
  for (const nn::StateDict* sd : {&plain, &legacy, &ckpt, &wrapped}) {
    EXPECT_EQ(sd->keys(), keys);
    for (const auto& k : keys)
      EXPECT_TRUE(allclose(sd->at(k).to(DType::Float64), plain.at(k).to(DType::Float64), 0, 0)) << k;
  }
  std::string msg = test::error_of([&] { io::load_state_dict(dir / "ckpt.pth"); });
  EXPECT_THAT(msg, HasSubstr("'epoch' (int) is not a tensor"));
  EXPECT_THAT(msg, HasSubstr("unwrap"));
}

TEST(Weights, InspectShowsCheckpointTensorsUnderDottedPaths) {
  TempDir dir;
  ASSERT_EQ(test::torch_run_uncached(write_checkpoints_py(dir / "")), "ok\n");
  TvcRun r = run_tvc_capped(dir, "inspect " + (dir / "ckpt.pth"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("format: pth (zip)"));
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\nmodel\\.module\\.0\\.weight +float32 +\\[4, 3, 3, 3\\]\n")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\noptimizer\\.state\\.0\\.exp_avg +float32 +\\[4, 3, 3, 3\\]\n")))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("  epoch: 3\n"));
  EXPECT_THAT(r.out, HasSubstr("  best: 0.75\n"));
  EXPECT_THAT(r.out, HasSubstr("  optimizer.param_groups.0.lr: 0.001\n"));
  // 9 model tensors, 6 parameters x (exp_avg, exp_avg_sq) + 6 step tensors in torch 1.13.
  EXPECT_THAT(r.out, HasSubstr("total: 27 tensors"));
}

// pth -> safetensors (float16) -> pth: torch reads the result back equal to its own .half().
TEST(Weights, ConvertBetweenFormatsAndDtypes) {
  TempDir dir;
  ASSERT_EQ(test::torch_run_uncached(write_checkpoints_py(dir / "")), "ok\n");
  std::string st = dir / "half.safetensors", back = dir / "back.pth", legacy_st = dir / "legacy.safetensors";
  TvcRun a = run_tvc_capped(dir, "convert " + (dir / "ckpt.pth") + " " + st + " --unwrap --dtype float16");
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_THAT(a.out, HasSubstr("9 tensors"));
  TvcRun b = run_tvc_capped(dir, "convert " + st + " " + back);
  ASSERT_EQ(b.status, 0) << b.err;
  TvcRun c = run_tvc_capped(dir, "convert " + (dir / "plain_legacy.pth") + " " + legacy_st);
  ASSERT_EQ(c.status, 0) << c.err;
  std::string check = test::torch_run_uncached(R"PY(
from safetensors.torch import load_file
D = ")PY" + dir / "" + R"PY("
ref = torch.load(f"{D}/plain.pth")
back = torch.load(f"{D}/back.pth", weights_only=True)
leg = load_file(f"{D}/legacy.safetensors")
ok = sorted(back) == sorted(ref) and sorted(leg) == sorted(ref)
for k, v in ref.items():
    want = v.half() if v.is_floating_point() else v
    ok = ok and back[k].dtype == want.dtype and torch.equal(back[k], want) and torch.equal(leg[k], v)
print(ok)
)PY");
  EXPECT_EQ(check, "True\n");
  // A checkpoint's non-tensor values have no place in safetensors: an error, not a silent drop.
  TvcRun d = run_tvc_capped(dir, "convert " + (dir / "ckpt.pth") + " " + (dir / "x.safetensors"));
  EXPECT_EQ(d.status, 1);
  EXPECT_THAT(d.err, HasSubstr("'epoch' (int) is not a tensor, which safetensors cannot hold"));
  TvcRun e = run_tvc_capped(dir, "convert " + st + " " + (dir / "x.onnx"));
  EXPECT_EQ(e.status, 1);
  EXPECT_THAT(e.err, HasSubstr("unknown output format '.onnx'"));
}

}  // namespace
}  // namespace tvc
