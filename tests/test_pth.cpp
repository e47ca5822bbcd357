// .pth files: torch.save files (zip, legacy, re-packed deflated/zip64) read bit-exactly, tvc's
// files read back by torch, the restricted unpickler against hand-made hostile pickles, and the
// zip reader/writer.

// GCC 12 warns falsely on "literal" + std::string (GCC bug 105651), which the pickles here use.
#pragma GCC diagnostic ignored "-Wrestrict"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/pickle.h"
#include "io/zip.h"
#include "test_helpers.h"
#include "tvc/ops.h"
#include "tvc/serialize.h"
#include "value_matcher.h"

namespace tvc::io {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using json = nlohmann::json;
using ::testing::HasSubstr;
using namespace std::string_literals;

// ---------------------------------------------------------------- helpers

using test::hex_of_tensor;

fs::path build_root() { return fs::path(TVC_DEFAULT_GOLDEN_CACHE).parent_path(); }

fs::path script() {
  fs::path source(__FILE__);  // relative to the build folder, where meson compiles
  if (source.is_relative()) source = build_root() / source;
  return source.parent_path().parent_path() / "tools" / "pth_fixtures.py";
}

// One folder for the whole run, removed at exit.
const fs::path& temp_dir() {
  static test::TempDir dir;
  return dir.path();
}

std::string slurp(const fs::path& p) { return test::read_file(p.string()); }
void spit(const fs::path& p, const std::string& bytes) { test::write_file(p.string(), bytes); }

// Runs a shell command and returns its stdout; a failure fails the test.
std::string run(const std::string& command) {
  fs::path out = temp_dir() / "stdout.txt", err = temp_dir() / "stderr.txt";
  int rc = std::system((command + " > " + out.string() + " 2> " + err.string()).c_str());
  if (rc != 0) {
    ADD_FAILURE() << command << " failed (torch 1.13 is needed at /usr/bin/python3):\n" << slurp(err);
    return "";
  }
  return slurp(out);
}

// The torch.save files of tools/pth_fixtures.py, made once per test run.
const fs::path& fixtures() {
  static fs::path dir = [] {
    fs::path d = temp_dir() / "fixtures";
    fs::create_directories(d);
    run("/usr/bin/python3 " + script().string() + " make " + d.string());
    return d;
  }();
  return dir;
}

json describe(const fs::path& file, bool weights_only) {
  std::string out =
      run("/usr/bin/python3 " + script().string() + (weights_only ? " describe " : " describe_full ") + file.string());
  return out.empty() ? json() : json::parse(out);
}

// ---- hand-made pickles

std::string u32(uint32_t v) { return std::string{char(v), char(v >> 8), char(v >> 16), char(v >> 24)}; }
std::string pint(int32_t v) { return std::string("J").append(u32(static_cast<uint32_t>(v))); }
std::string pstr(const std::string& s) {
  return std::string("X").append(u32(static_cast<uint32_t>(s.size()))).append(s);
}
std::string ptuple(const Shape& dims) {
  std::string s = "(";
  for (int64_t d : dims) s += pint(static_cast<int32_t>(d));
  return s + "t";
}
const std::string kProto = "\x80\x02";

// _rebuild_tensor_v2 of storage key "0" of the given torch storage type and numel.
std::string tensor_pickle(const std::string& type, int32_t numel, int32_t offset, const Shape& size,
                          const Shape& stride) {
  std::string p = "ctorch._utils\n_rebuild_tensor_v2\n((";
  p += pstr("storage") + "ctorch\n" + type + "\n" + pstr("0") + pstr("cpu") + pint(numel) + "tQ";
  p += pint(offset) + ptuple(size) + ptuple(stride) + "\x89}tR";
  return p;
}

// {"w": tensor} as data.pkl
std::string state_pickle(const std::string& tensor) { return kProto + "}" + pstr("w") + tensor + "s."; }

// A .pth zip of a data.pkl and storage "0" holding data.
fs::path write_pth(const std::string& name, const std::string& pkl, const std::string& data) {
  fs::path p = temp_dir() / name;
  ZipWriter zip(p.string());
  zip.add("archive/data.pkl", pkl.data(), pkl.size());
  zip.add("archive/data/0", data.data(), data.size());
  zip.add("archive/version", "3\n", 2);
  zip.finish();
  return p;
}

// Runs a pickle through the unpickler; storages are zeroed memory of the requested size.
Value unpickle(const std::string& bytes) {
  Unpickler u("test.pkl", "data.pkl", [](const PersistentId& id) {
    TVC_CHECK(id.numel <= (1u << 20), "test storage too large");
    auto s = Storage::allocate(id.numel * static_cast<size_t>(bit_size(id.dtype) / 8));
    if (s->nbytes() > 0) std::memset(s->data(), 0, s->nbytes());
    return s;
  });
  PickleInput in(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  u.load(in);
  return u.value();
}

std::string unpickle_error(const std::string& bytes) {
  return error_of([&] { unpickle(bytes); });
}

// ---------------------------------------------------------------- reading torch's files

TEST(PthRead, FilesWrittenByTorchMatchBitForBit) {
  for (const char* name : {"sd.pt", "sd_legacy.pt", "sd_repack.pt", "ckpt.pt", "ckpt_legacy.pt", "ckpt_repack.pt"}) {
    SCOPED_TRACE(name);
    std::string stem = std::string(name).substr(0, std::string(name).find_first_of("_."));
    json expected = json::parse(slurp(fixtures() / (stem + ".json")));
    Value v = load_pth((fixtures() / name).string());
    test::ValueMatcher().match(v, expected, "");
  }
}

TEST(PthRead, CheckpointStructure) {
  Value ckpt = load_pth((fixtures() / "ckpt.pt").string());
  EXPECT_EQ(ckpt.find("epoch")->to_int(), 3);
  const Value* opt = ckpt.find("optimizer");
  ASSERT_NE(opt, nullptr);
  const Value& group = opt->find("param_groups")->elements().at(0);
  EXPECT_EQ(*group.find("betas"), Value::tuple({Value(0.9), Value(0.999)}));
  EXPECT_EQ(group.find("lr")->to_float(), 1e-3);
  EXPECT_EQ(*group.find("params"), Value::list({Value(0), Value(1), Value(2), Value(3)}));
  // optimizer.state is keyed by int parameter indices.
  std::vector<std::string> names;
  for (const auto& [name, t] : flatten_tensors(*opt)) names.push_back(name);
  EXPECT_THAT(names, ::testing::Contains("state.0.exp_avg"));
  EXPECT_THAT(names, ::testing::Contains("state.3.exp_avg_sq"));
  auto all = flatten_tensors(ckpt);
  EXPECT_EQ(all.front().first, "state_dict.0.weight");
}

TEST(PthRead, SharedStoragesStayShared) {
  Value sd = load_pth((fixtures() / "sd_legacy.pt").string());
  const Tensor& base = sd.find("shared_base")->to_tensor();
  const Tensor& sliced = sd.find("sliced")->to_tensor();
  EXPECT_EQ(base.storage(), sliced.storage());
  EXPECT_EQ(sliced.storage_offset(), 5);
  EXPECT_EQ(sliced.strides(), (Shape{5, 2}));
  EXPECT_EQ(sliced.to_vector(), base.slice(0, 1, 6).slice(1, 0, 5, 2).to_vector());
}

TEST(PthRead, WidensUnsignedOnlyWhenAsked) {
  std::string data = {1, 0, char(0xff), char(0xff), 0, 0};
  fs::path p = write_pth("u16.pth", state_pickle(tensor_pickle("UInt16Storage", 3, 0, {3}, {1})), data);
  EXPECT_THAT(error_of([&] { load_pth(p.string()); }), HasSubstr("tensor 'w' has element type UInt16Storage"));
  ReadOptions widen;
  widen.widen = true;
  Tensor w = load_pth(p.string(), widen).find("w")->to_tensor();
  EXPECT_EQ(w.dtype(), DType::Int32);
  EXPECT_EQ(w.to_vector(), (std::vector<double>{1, 65535, 0}));
}

TEST(PthRead, WidensFloat8AndChecksUInt64) {
  ReadOptions widen;
  widen.widen = true;
  // float8 e4m3fn: 0x38 = 1.0, 0xc0 = -2.0, 0x01 = 2^-9 (subnormal)
  fs::path p = write_pth("f8.pth", state_pickle(tensor_pickle("Float8_e4m3fnStorage", 3, 0, {3}, {1})), "\x38\xc0\x01");
  Tensor w = load_pth(p.string(), widen).find("w")->to_tensor();
  EXPECT_EQ(w.dtype(), DType::Float32);
  EXPECT_EQ(w.to_vector(), (std::vector<double>{1.0, -2.0, 1.0 / 512}));
  p = write_pth("u64.pth", state_pickle(tensor_pickle("UInt64Storage", 1, 0, {1}, {1})), std::string(8, '\xff'));
  EXPECT_THAT(error_of([&] { load_pth(p.string(), widen); }),
              HasSubstr("tensor 'w' holds the unsigned value 18446744073709551615, beyond int64"));
  p = write_pth("c64.pth", state_pickle(tensor_pickle("ComplexFloatStorage", 1, 0, {1}, {1})), std::string(8, 0));
  EXPECT_THAT(error_of([&] { load_pth(p.string(), widen); }),
              HasSubstr("tensor 'w' has element type ComplexFloatStorage, which tvc lacks"));
}

// ---------------------------------------------------------------- writing for torch

TEST(PthWrite, TorchReadsBackEqual) {
  for (const char* stem : {"sd", "ckpt"}) {
    SCOPED_TRACE(stem);
    Value v = load_pth((fixtures() / (std::string(stem) + ".pt")).string());
    fs::path out = temp_dir() / (std::string(stem) + "_tvc.pt");
    save_pth(out.string(), v);
    // torch 1.13's weights_only unpickler lacks BINFLOAT, which the checkpoint needs.
    json back = describe(out, std::string(stem) == "sd");
    EXPECT_EQ(back, json::parse(slurp(fixtures() / (std::string(stem) + ".json"))));
    EXPECT_EQ(load_pth(out.string()), v);
  }
}

TEST(PthWrite, Zip64ArchiveLoadsInTorch) {
  Value v = load_pth((fixtures() / "sd.pt").string());
  fs::path plain = temp_dir() / "plain.pt", zip64 = temp_dir() / "zip64.pt";
  save_pth(plain.string(), v);
  {
    ZipReader in(plain.string());
    ZipWriter out(zip64.string(), /*force_zip64=*/true);
    for (const std::string& name : in.names()) {
      std::vector<uint8_t> bytes = in.read(name, in.size(name));
      out.add(name, bytes.data(), bytes.size());
    }
    out.finish();
  }
  EXPECT_EQ(describe(zip64, true), json::parse(slurp(fixtures() / "sd.json")));
  EXPECT_EQ(load_pth(zip64.string()), v);
}

TEST(PthWrite, LayoutAsTorchWritesIt) {
  fs::path out = temp_dir() / "layout.pt";
  Tensor a = arange(10, {.dtype = DType::Float32});
  save_pth(out.string(), Value::dict({{Value("a"), Value(a)}, {Value("b"), Value(a.slice(0, 2, 8, 3))}}, true));
  ZipReader zip(out.string());
  EXPECT_EQ(zip.names(), (std::vector<std::string>{"archive/data.pkl", "archive/byteorder", "archive/data/0",
                                                   "archive/version"}));  // one storage for both
  std::vector<uint8_t> version = zip.read("archive/version", 16);
  EXPECT_EQ(std::string(version.begin(), version.end()), "3\n");
  // Storage data starts at a multiple of 64: find it in the raw file.
  std::string raw = slurp(out);
  size_t at = raw.find(std::string(static_cast<const char*>(a.raw_data()), 40));
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(at % 64, 0u);
}

TEST(PthWrite, SavesTheElementsInUse) {
  // A strided view into the middle of a storage: the file holds elements 10..28, the view
  // starts at offset 0 of them.
  Tensor base = arange(100, {.dtype = DType::Float32});
  Tensor view = base.slice(0, 10, 30, 2);
  fs::path out = temp_dir() / "range.pt";
  save_pth(out.string(), Value::dict({{Value("v"), Value(view)}}));
  Tensor back = load_pth(out.string()).find("v")->to_tensor();
  EXPECT_EQ(back.storage()->nbytes(), 19u * 4);
  EXPECT_EQ(back.storage_offset(), 0);
  EXPECT_EQ(back.strides(), (Shape{2}));
  EXPECT_EQ(back.to_vector(), view.to_vector());
  json d = describe(out, true)["dict"][0][1]["tensor"];
  EXPECT_EQ(d["storage_size"], 19);
  EXPECT_EQ(d["stride"], json::array({2}));
  EXPECT_EQ(d["hex"], hex_of_tensor(view));
}

TEST(PthWrite, EveryValueKindRoundTrips) {
  Tensor t = tensor<double>({1.5, -2.25});
  Value v =
      Value::dict({{Value("none"), Value()},
                   {Value("bools"), Value::list({Value(true), Value(false)})},
                   {Value("ints"), Value::list({Value(0), Value(255), Value(256), Value(65535), Value(65536), Value(-1),
                                                Value(int64_t{INT32_MIN}), Value(int64_t{INT32_MAX} + 1),
                                                Value(std::numeric_limits<int64_t>::min()),
                                                Value(std::numeric_limits<int64_t>::max())})},
                   {Value("floats"), Value::tuple({Value(0.1), Value(-0.0), Value(1e300)})},
                   {Value("text"), Value("héllo")},
                   {Value("bytes"), Value::bytes("\x00\x7f\x80\xff"s)},
                   {Value("set"), Value::set({Value(1), Value(300)})},
                   {Value(7), Value::tuple({Value(1), Value(2), Value(3), Value(4), Value(5)})},
                   {Value("t"), Value(t)},
                   {Value("long"), Value::list(std::vector<Value>(2500, Value(3)))}});
  fs::path out = temp_dir() / "kinds.pt";
  save_pth(out.string(), v);
  EXPECT_EQ(load_pth(out.string()), v);
  // Python's own unpickler reads the same values (no torch needed without tensors).
  Value plain = v;
  plain.items().erase(plain.items().begin() + 8);
  plain.items().pop_back();
  save_pth(out.string(), plain);
  std::string py = run("/usr/bin/python3 -c \"import zipfile, pickle; print(repr(pickle.loads(zipfile.ZipFile('" +
                       out.string() + "').read('archive/data.pkl'))))\"");
  EXPECT_EQ(py,
            "{'none': None, 'bools': [True, False], 'ints': [0, 255, 256, 65535, 65536, -1, -2147483648, 2147483648, "
            "-9223372036854775808, 9223372036854775807], 'floats': (0.1, -0.0, 1e+300), 'text': 'héllo', "
            "'bytes': b'\\x00\\x7f\\x80\\xff', 'set': {1, 300}, 7: (1, 2, 3, 4, 5)}\n");
}

// ---------------------------------------------------------------- malformed .pth files

TEST(PthMalformed, StorageShorterThanTensor) {
  fs::path p = write_pth("short.pth", state_pickle(tensor_pickle("FloatStorage", 2, 0, {5}, {1})), std::string(8, 0));
  std::string msg = error_of([&] { load_pth(p.string()); });
  EXPECT_THAT(msg, HasSubstr(p.string()));
  EXPECT_THAT(msg, HasSubstr("storage too short"));
  p = write_pth("offset.pth", state_pickle(tensor_pickle("FloatStorage", 4, 3, {2, 2}, {1, 1})), std::string(16, 0));
  EXPECT_THAT(error_of([&] { load_pth(p.string()); }), HasSubstr("reaches element 5 of a storage of 4 elements"));
}

TEST(PthMalformed, PersistentIdNumelMustMatchEntrySize) {
  // CVE-2026-24747: the id claims 2 floats, the entry holds 3.
  fs::path p = write_pth("numel.pth", state_pickle(tensor_pickle("FloatStorage", 2, 0, {2}, {1})), std::string(12, 0));
  EXPECT_THAT(error_of([&] { load_pth(p.string()); }),
              HasSubstr("storage '0' (2 elements of FloatStorage) needs 8 bytes but entry archive/data/0 holds 12"));
}

TEST(PthMalformed, OverflowingSizes) {
  fs::path p = write_pth("overflow.pth",
                         state_pickle(tensor_pickle("FloatStorage", 4, 0, {65536, 65536, 65536, 65536}, {0, 0, 0, 0})),
                         std::string(16, 0));
  EXPECT_THAT(error_of([&] { load_pth(p.string()); }), HasSubstr("overflows"));
  p = write_pth("negative.pth", state_pickle(tensor_pickle("FloatStorage", 4, 0, {2}, {-1})), std::string(16, 0));
  EXPECT_THAT(error_of([&] { load_pth(p.string()); }), HasSubstr("negative size or stride"));
}

TEST(PthMalformed, TruncatedDataPkl) {
  std::string pkl = state_pickle(tensor_pickle("FloatStorage", 2, 0, {2}, {1}));
  for (size_t cut : {pkl.size() - 1, pkl.size() / 2, size_t{3}}) {
    fs::path p = write_pth("trunc.pth", pkl.substr(0, cut), std::string(8, 0));
    std::string msg = error_of([&] { load_pth(p.string()); });
    EXPECT_THAT(msg, HasSubstr("archive/data.pkl"));
    EXPECT_THAT(msg, ::testing::AnyOf(HasSubstr("truncated"), HasSubstr("stack underflow")));
  }
}

TEST(PthMalformed, MissingStorageEntryAndDataPkl) {
  std::string pkl = state_pickle(tensor_pickle("FloatStorage", 2, 0, {2}, {1}));
  fs::path p = temp_dir() / "nostorage.pth";
  {
    ZipWriter zip(p.string());
    zip.add("archive/data.pkl", pkl.data(), pkl.size());
    zip.finish();
  }
  EXPECT_THAT(error_of([&] { load_pth(p.string()); }), HasSubstr("storage '0' has no entry archive/data/0"));
  {
    ZipWriter zip(p.string());
    zip.add("a/data.pkl", pkl.data(), pkl.size());
    zip.add("b/data.pkl", pkl.data(), pkl.size());
    zip.finish();
  }
  EXPECT_THAT(error_of([&] { load_pth(p.string()); }), HasSubstr("expected one '<folder>/data.pkl' entry"));
}

TEST(PthMalformed, BigEndianRefused) {
  std::string pkl = state_pickle(tensor_pickle("FloatStorage", 2, 0, {2}, {1}));
  fs::path p = temp_dir() / "big.pth";
  ZipWriter zip(p.string());
  zip.add("archive/data.pkl", pkl.data(), pkl.size());
  zip.add("archive/byteorder", "big", 3);
  zip.finish();
  EXPECT_THAT(error_of([&] { load_pth(p.string()); }), HasSubstr("big-endian"));
}

TEST(PthMalformed, CorruptStorageFailsCrc) {
  fs::path p = temp_dir() / "crc.pt";
  Tensor a = arange(16, {.dtype = DType::Int64});
  save_pth(p.string(), Value(a));
  std::string raw = slurp(p);
  size_t at = raw.find(std::string(static_cast<const char*>(a.raw_data()), 128));
  ASSERT_NE(at, std::string::npos);
  raw[at + 100] ^= 1;
  spit(p, raw);
  EXPECT_THAT(error_of([&] { load_pth(p.string()); }), HasSubstr("CRC"));
}

TEST(PthMalformed, LegacyStorageSizeChecked) {
  std::string raw = slurp(fixtures() / "sd_legacy.pt");
  // Truncating the file cuts the last storage short.
  spit(temp_dir() / "legacy_cut.pt", raw.substr(0, raw.size() - 3));
  EXPECT_THAT(error_of([&] { load_pth((temp_dir() / "legacy_cut.pt").string()); }),
              HasSubstr("past the end of the file"));
  // The first storage's element count, right after the keys pickle, no longer matches.
  size_t keys_end = raw.find("\x2e", raw.rfind("]q"));  // STOP of the keys list pickle
  ASSERT_NE(keys_end, std::string::npos);
  raw[keys_end + 1] ^= 1;
  spit(temp_dir() / "legacy_numel.pt", raw);
  EXPECT_THAT(error_of([&] { load_pth((temp_dir() / "legacy_numel.pt").string()); }),
              HasSubstr("elements in the file but"));
}

TEST(PthMalformed, RandomCorruptionsOnlyRaiseErrors) {
  // torch's zip and legacy files damaged at random: a value or a tvc::Error, nothing else.
  uint64_t state = 777;
  auto next = [&] { return (state = state * 6364136223846793005u + 1442695040888963407u) >> 33; };
  for (const char* name : {"ckpt.pt", "ckpt_legacy.pt", "ckpt_repack.pt"}) {
    const std::string good = slurp(fixtures() / name);
    fs::path p = temp_dir() / "corrupt.pt";
    int errors = 0;
    for (int i = 0; i < 300; ++i) {
      std::string bad = good;
      for (uint64_t n = 1 + next() % 4; n > 0; --n) bad[next() % bad.size()] = static_cast<char>(next());
      spit(p, bad);
      try {
        load_pth(p.string());
      } catch (const Error&) {
        ++errors;
      }
    }
    EXPECT_GT(errors, 50) << name;
  }
}

// ---------------------------------------------------------------- the unpickler

TEST(PickleUnpickler, GlobalRefusedByName) {
  std::string msg = unpickle_error(kProto + "cos\nsystem\n" + pstr("echo hi") + "\x85R.");
  EXPECT_THAT(msg, HasSubstr("'test.pkl'"));
  EXPECT_THAT(msg, HasSubstr("GLOBAL os.system is not allowed (only state_dict/checkpoint types are; "
                             "ReadOptions::opaque_objects, `--opaque`"));
  msg = unpickle_error(kProto + pstr("builtins") + pstr("eval") + "\x93.");
  EXPECT_THAT(msg, HasSubstr("STACK_GLOBAL builtins.eval is not allowed"));
}

// Names and keys come from the file: escape sequences and bytes that are not UTF-8 in them
// reach the message escaped.
TEST(PickleUnpickler, NamesFromTheFilePrintEscaped) {
  std::string msg = unpickle_error(kProto + "cos\x1b]0;x\x07\nsys\xfftem\n" + pstr("ls") + "\x85R.");
  EXPECT_THAT(msg, HasSubstr("GLOBAL os\\x1b]0;x\\x07.sys\\xfftem is not allowed"));
  EXPECT_TRUE(test::IsTerminalSafe(msg));
  msg = unpickle_error(kProto + "}" + pstr("k\x1b[2J\xc2\x9b\xc0") + "ccollections\nOrderedDict\ns.");
  EXPECT_THAT(msg, HasSubstr("holds a class or function at 'k\\x1b[2J\\xc2\\x9b\\xc0'"));
  EXPECT_TRUE(test::IsTerminalSafe(msg));
}

TEST(PickleUnpickler, DisallowedOpcodeNamed) {
  EXPECT_THAT(unpickle_error(kProto + "(ios\nsystem\n."), HasSubstr("opcode INST (0x69) at byte 3 is not allowed"));
  EXPECT_THAT(unpickle_error(kProto + "\x82\x01."), HasSubstr("opcode EXT1 (0x82) at byte 2 is not allowed"));
}

TEST(PickleUnpickler, ContainerOperationsTypeChecked) {
  EXPECT_THAT(unpickle_error(kProto + "]K\x01K\x02s."), HasSubstr("SETITEM on a list (only a dict takes it)"));
  EXPECT_THAT(unpickle_error(kProto + "](K\x01K\x02u."), HasSubstr("SETITEMS on a list"));
  EXPECT_THAT(unpickle_error(kProto + "}K\x01"
                                      "a."),
              HasSubstr("APPEND on a dict (only a list takes it)"));
  EXPECT_THAT(unpickle_error(kProto + "](K\x01\x90."), HasSubstr("ADDITEMS on a list (only a set takes it)"));
  EXPECT_THAT(unpickle_error(kProto + "}]K\x01s."), HasSubstr("a dict key is a list"));
  // Keys Python finds equal are one key (the last value wins); distinct tuples stay distinct.
  Value d = unpickle(kProto + "}(K\x01K\x02\x88K\x03G\x3f\xf0\x00\x00\x00\x00\x00\x00K\x04u."s);
  EXPECT_EQ(d, Value::dict({{Value(1), Value(4)}}));
  d = unpickle(kProto + "}(" + pstr("a,s1:b") + "\x85K\x01" + pstr("a") + pstr("b") + "\x86K\x02u.");
  EXPECT_EQ(d.items().size(), 2u);
  EXPECT_THAT(unpickle_error(kProto + "]q\x00h\x00"s
                                      "a."),
              HasSubstr("into itself"));
  // A list changed after it went into another one (the way to build a cycle) is refused.
  EXPECT_THAT(unpickle_error(kProto + "]q\x00]h\x00"s
                                      "a0h\x00K\x01"s
                                      "a."),
              HasSubstr("already inside another object"));
}

TEST(PickleUnpickler, TensorRebuildForms) {
  // Old files: _rebuild_tensor(storage, offset, size, stride); parameters wrap a tensor.
  std::string storage = "(" + pstr("storage") + "ctorch\nDoubleStorage\n" + pstr("0") + pstr("cpu") + pint(4) + "tQ";
  Value v =
      unpickle(kProto + "ctorch._utils\n_rebuild_tensor\n(" + storage + pint(1) + ptuple({3}) + ptuple({1}) + "tR.");
  EXPECT_EQ(v.to_tensor().shape(), (Shape{3}));
  EXPECT_EQ(v.to_tensor().storage_offset(), 1);
  v = unpickle(kProto + "ctorch._utils\n_rebuild_parameter\n(" + tensor_pickle("FloatStorage", 2, 0, {2}, {1}) +
               "\x88}tR.");
  EXPECT_TRUE(v.to_tensor().requires_grad());
  // Legacy persistent ids carry view_metadata, which must be None.
  std::string view = "(" + pstr("storage") + "ctorch\nFloatStorage\n" + pstr("0") + pstr("cpu") + pint(4) + "(" +
                     pstr("1") + pint(0) + pint(2) + "ttQ.";
  EXPECT_THAT(unpickle_error(kProto + view),
              HasSubstr("storage views (persistent id view_metadata) are not supported"));
  EXPECT_THAT(unpickle_error(kProto + "(" + pstr("storage") + "ccollections\nOrderedDict\n" + pstr("0") + pstr("cpu") +
                             pint(4) + "tQ."),
              HasSubstr("the storage type collections.OrderedDict is not a torch storage"));
  EXPECT_THAT(unpickle_error(kProto + "ctorch\nFloatStorage\n)R."), HasSubstr("torch.FloatStorage cannot be called"));
  EXPECT_THAT(unpickle_error(kProto + "]]b."), HasSubstr("BUILD of a list is not allowed"));
}

TEST(PickleUnpickler, StackAndMemoChecked) {
  EXPECT_THAT(unpickle_error(kProto + "a."), HasSubstr("stack underflow"));
  EXPECT_THAT(unpickle_error(kProto + "K\x01(a."), HasSubstr("stack underflow"));  // items below a mark are hidden
  EXPECT_THAT(unpickle_error(kProto + "t."), HasSubstr("no MARK"));
  EXPECT_THAT(unpickle_error(kProto + "K\x01K\x02."), HasSubstr("STOP with 2 objects"));
  EXPECT_THAT(unpickle_error(kProto + "h\x05."), HasSubstr("memo index 5 is not defined"));
  EXPECT_THAT(unpickle_error(kProto + "j\xff\xff\xff\xff."), HasSubstr("memo index 4294967295"));
}

TEST(PickleUnpickler, DeepNestingRefusedWithoutStackOverflow) {
  std::string deep = kProto + std::string(100000, ']') + std::string(99999, 'a') + ".";
  EXPECT_THAT(unpickle_error(deep), HasSubstr("nest deeper than 1000 levels"));
  EXPECT_THAT(unpickle_error(kProto + std::string(100000, '(')), HasSubstr("more than 1000 open marks"));
  // 1000 levels are fine.
  Value ok = unpickle(kProto + std::string(1000, ']') + std::string(999, 'a') + ".");
  EXPECT_EQ(ok.kind(), Value::Kind::List);
}

TEST(PickleUnpickler, SharedSubtreesCannotExplode) {
  // l0 = [1]; l_{i+1} = [l_i, l_i]: 2^60 nodes when expanded.
  std::string p = kProto +
                  "]K\x01"
                  "aq\x00"s
                  "0";
  for (int i = 0; i < 60; ++i)
    p += "](h\x00h\x00"s
         "eq\x00"s
         "0";
  p += "h\x00"s
       ".";
  EXPECT_THAT(unpickle_error(p), HasSubstr("more than 67108864 nodes"));
  // One memoized 1 MiB string used 2000 times would be copied 2000 times.
  std::string big = kProto + "X" + u32(1 << 20) + std::string(1 << 20, 'x') +
                    "q\x00"
                    "0]("s;
  for (int i = 0; i < 2000; ++i) big += "h\x00"s;
  EXPECT_THAT(unpickle_error(big + "e."), HasSubstr("more than 1073741824 bytes of strings"));
}

TEST(PickleUnpickler, LengthsCheckedBeforeAllocating) {
  EXPECT_THAT(unpickle_error(kProto + "X\xff\xff\xff\x7f"
                                      "ab"),
              HasSubstr("needs 2147483647 more bytes but the pickle has 2 left"));
  EXPECT_THAT(unpickle_error(kProto + "\x8e\xff\xff\xff\xff\xff\xff\xff\x7f"), HasSubstr("more bytes"));
  EXPECT_THAT(unpickle_error(kProto + "\x8a\x09" + std::string(9, 1) + "."), HasSubstr("beyond 64 bits"));
  EXPECT_THAT(unpickle_error(kProto + "T\xff\xff\xff\xff."), HasSubstr("negative string length"));
  EXPECT_THAT(unpickle_error(kProto + "]"), HasSubstr("ends without STOP (truncated?)"));
}

TEST(PickleUnpickler, ReadsWhatPythonWrites) {
  // pickle.dumps([1, -2, 2**40, -2**63, 1.5, 'é', b'\x00\xff', (1,), {3: None}, {True, 'x'}], protocol=N)
  std::string code =
      "import pickle, sys\n"
      "v = [1, -2, 2**40, -2**63, 1.5, 'é', b'\\x00\\xff', (1,), {3: None}, {True, 'x'}, frozenset([2])]\n"
      "for p in (2, 3, 4, 5): sys.stdout.write(pickle.dumps(v, protocol=p).hex() + '\\n')\n";
  spit(temp_dir() / "py_pickles.py", code);
  std::string out = run("/usr/bin/python3 " + (temp_dir() / "py_pickles.py").string());
  Value expected =
      Value::list({Value(1), Value(-2), Value(int64_t{1} << 40), Value(std::numeric_limits<int64_t>::min()), Value(1.5),
                   Value("é"), Value::bytes("\x00\xff"s), Value::tuple({Value(1)}), Value::dict({{Value(3), Value()}}),
                   Value::set({Value(true), Value("x")}), Value::set({Value(2)})});
  std::istringstream lines(out);
  std::string hex;
  int n = 0;
  while (std::getline(lines, hex)) {
    std::string bytes;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    EXPECT_EQ(unpickle(bytes), expected) << "protocol " << n + 2;
    ++n;
  }
  EXPECT_EQ(n, 4);
}

TEST(PickleUnpickler, RandomCorruptionsOnlyRaiseErrors) {
  // A checkpoint pickle with tensors, dicts, lists and tuples, damaged at random: every result
  // is a value or a tvc::Error (run under the sanitizers to catch worse).
  Value ckpt = Value::dict(
      {{Value("w"), Value(arange(12, {.dtype = DType::Float32}).view({3, 4}).t())},
       {Value("opt"), Value::dict({{Value(0), Value::list({Value(1.5), Value::tuple({Value(2), Value("x")})})}})},
       {Value("b"), Value::bytes("\x01\xff")}},
      true);
  std::vector<PickledStorage> storages;
  const std::string good = pickle_value(ckpt, storages);
  EXPECT_EQ(*unpickle(good).find("opt"), *ckpt.find("opt"));  // (the test storages are zeros)
  uint64_t state = 12345;
  auto next = [&] { return (state = state * 6364136223846793005u + 1442695040888963407u) >> 33; };
  int errors = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string bad = good;
    for (uint64_t n = 1 + next() % 3; n > 0; --n) bad[next() % bad.size()] = static_cast<char>(next());
    if (next() % 4 == 0) bad.resize(next() % bad.size());
    try {
      unpickle(bad);
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 2500);
}

// ---------------------------------------------------------------- zip

TEST(ZipArchive, WriterAndReaderAgree) {
  for (bool zip64 : {false, true}) {
    fs::path p = temp_dir() / "t.zip";
    std::string big(100000, 'x');
    {
      ZipWriter w(p.string(), zip64);
      w.add("a", "hello", 5);
      w.add("dir/empty", "", 0);
      w.add("dir/big", big.data(), big.size());
      w.finish();
    }
    ZipReader r(p.string());
    EXPECT_EQ(r.names(), (std::vector<std::string>{"a", "dir/empty", "dir/big"}));
    std::vector<uint8_t> a = r.read("a", 5);
    EXPECT_EQ(std::string(a.begin(), a.end()), "hello");
    EXPECT_EQ(r.size("dir/empty"), 0u);
    std::string got(big.size(), '\0');
    r.read("dir/big", got.data(), got.size());
    EXPECT_EQ(got, big);
    EXPECT_THAT(error_of([&] { r.read("a", 4); }), HasSubstr("zip entry 'a' holds 5 bytes, more than the 4 expected"));
    EXPECT_THAT(error_of([&] { r.read("a", got.data(), 6); }), HasSubstr("zip entry 'a' holds 5 bytes, expected 6"));
    EXPECT_THAT(error_of([&] { r.size("nope"); }), HasSubstr("has no entry 'nope'"));
    // Python's zipfile reads it too.
    std::string py =
        run("/usr/bin/python3 -c \"import zipfile; z = zipfile.ZipFile('" + p.string() +
            "'); print(z.testzip(), [(i.filename, i.file_size, i.header_offset) for i in z.infolist()])\"");
    EXPECT_THAT(py, HasSubstr("None [('a', 5, 0), ('dir/empty', 0, "));
  }
}

TEST(ZipArchive, LyingDeflatedSizeRefusedBeforeAllocating) {
  // A deflated entry whose headers claim 1 TB: the deflate ratio limit rejects it.
  fs::path p = temp_dir() / "lie.zip";
  run("/usr/bin/python3 -c \"import zipfile; z = zipfile.ZipFile('" + p.string() +
      "', 'w', zipfile.ZIP_DEFLATED); z.writestr('x', b'a' * 1000); z.close()\"");
  std::string raw = slurp(p);
  std::string real = u32(1000), lie = u32(0xfffffff0u);
  for (size_t at = raw.find(real); at != std::string::npos; at = raw.find(real, at + 4)) raw.replace(at, 4, lie);
  spit(p, raw);
  std::string msg = error_of([&] { ZipReader(p.string()).size("x"); });
  EXPECT_THAT(msg, HasSubstr("beyond the deflate ratio limit"));
  EXPECT_THAT(msg, HasSubstr("'x'"));
}

TEST(ZipArchive, NotAZip) {
  spit(temp_dir() / "junk.zip", "not a zip at all");
  EXPECT_THAT(error_of([&] { ZipReader((temp_dir() / "junk.zip").string()); }),
              HasSubstr("not a readable zip archive"));
}

}  // namespace
}  // namespace tvc::io
