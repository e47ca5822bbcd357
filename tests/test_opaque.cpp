// Checkpoints as users have them (tools/checkpoint_fixtures.py, written by torch.save with
// Debian's torch): Lightning- and timm-style training checkpoints, NumPy values, whole-model
// saves and a file whose unpickling would run commands, read with ReadOptions::opaque_objects
// (and `--opaque`) without running anything, and refused by name without it.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/pickle.h"
#include "test_helpers.h"
#include "torch_golden.h"
#include "tvc/ops.h"
#include "tvc/serialize.h"
#include "value_matcher.h"

namespace tvc::io {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using json = nlohmann::json;
using namespace std::string_literals;

fs::path fixtures() { return test::python_golden_folder(TVC_SOURCE_ROOT "/tools/checkpoint_fixtures.py", {}); }
std::string fixture(const std::string& name) { return (fixtures() / name).string(); }

// The marker files the hostile pickle's commands would create.
std::vector<std::string> markers() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fixtures() / "markers")) names.push_back(e.path().filename());
  return names;
}

const ReadOptions kOpaque{.opaque_objects = true};

// Names in order and tensors bit for bit (Value's == compares dtype, shape and bits).
void expect_same_state_dict(const nn::StateDict& actual, const nn::StateDict& expected) {
  std::vector<std::string> names, expected_names;
  for (const auto& [name, t] : actual) names.push_back(name);
  for (const auto& [name, t] : expected) expected_names.push_back(name);
  ASSERT_EQ(names, expected_names);
  for (const auto& [name, t] : expected) {
    EXPECT_TRUE(Value(*actual.find(name)) == Value(t)) << name;
    EXPECT_FALSE(actual.find(name)->requires_grad()) << name;
  }
}

TEST(OpaqueRead, CheckpointsMatchWhatPickleRecords) {
  ASSERT_FALSE(fixtures().empty());
  for (const char* name : {"lightning.ckpt", "timm.pth.tar", "numpy.pt", "whole_custom.pt", "evil.pt"}) {
    SCOPED_TRACE(name);
    json expected = json::parse(test::read_file(fixture(std::string(name) + ".json")));
    test::ValueMatcher().match(load_pth(fixture(name), kOpaque), expected, "");
  }
  SCOPED_TRACE("whole_custom_legacy.pt");  // the legacy format: the same object
  test::ValueMatcher().match(load_pth(fixture("whole_custom_legacy.pt"), kOpaque),
                             json::parse(test::read_file(fixture("whole_custom.pt.json"))), "");
  EXPECT_EQ(markers(), std::vector<std::string>{});
}

TEST(OpaqueRead, StrictModeNamesTheGlobalAndTheOption) {
  const std::pair<const char*, const char*> cases[] = {
      {"lightning.ckpt", "GLOBAL argparse.Namespace is not allowed"},
      {"timm.pth.tar", "GLOBAL argparse.Namespace is not allowed"},
      {"whole_resnet18.pt", "GLOBAL torchvision.models.resnet.ResNet is not allowed"},
      {"whole_custom.pt", "GLOBAL __main__.Net is not allowed"},
      {"whole_custom_legacy.pt", "GLOBAL __main__.Net is not allowed"},
      {"evil.pt", "GLOBAL os.system is not allowed"}};
  for (const auto& [name, message] : cases) {
    SCOPED_TRACE(name);
    const std::string path = fixture(name);  // clang 14 lambdas cannot capture structured bindings
    std::string error = test::error_of([&] { load_pth(path); });
    EXPECT_THAT(error, HasSubstr(message));
    EXPECT_THAT(error, HasSubstr("ReadOptions::opaque_objects, `--opaque` on the command line"));
    EXPECT_THAT(error, HasSubstr(name));
  }
  EXPECT_EQ(markers(), std::vector<std::string>{});
}

TEST(OpaqueRead, NumpyValuesAreDataInStrictModeToo) {
  Value strict = load_pth(fixture("numpy.pt"));
  EXPECT_TRUE(strict == load_pth(fixture("numpy.pt"), kOpaque));
  test::ValueMatcher().match(strict, json::parse(test::read_file(fixture("numpy.pt.json"))), "");
  // Unsigned arrays tvc has no dtype for are raw data unless widened, as tensors of torch's
  // unsigned storages are.
  const Value& raw = *strict.find("array_u4");
  ASSERT_EQ(raw.kind(), Value::Kind::Object);
  EXPECT_EQ(raw.object().global, "numpy.ndarray");
  Value wide = load_pth(fixture("numpy.pt"), {.widen = true});
  const Tensor& u4 = wide.find("array_u4")->to_tensor();
  ASSERT_EQ(u4.dtype(), DType::Int64);
  ASSERT_EQ(u4.shape(), (Shape{2, 3}));
  const std::string& data = raw.object().state.find("data")->to_string();
  for (int64_t i = 0; i < 6; ++i) {
    uint32_t expected = 0;
    std::memcpy(&expected, data.data() + 4 * i, 4);
    EXPECT_EQ(u4.reshape({6})[i].item<int64_t>(), int64_t{expected});
  }
  EXPECT_EQ(wide.find("array_u8")->to_tensor().dtype(), DType::Int64);
  EXPECT_EQ(wide.find("array_c16")->kind(), Value::Kind::Object);  // complex: no tvc dtype at all
}

TEST(OpaqueRead, StateDictsArePyTorchsOwn) {
  // Training checkpoints unwrap to their state_dict; whole-model saves give model.state_dict()
  // (None bias, None and non-persistent buffers left out, tied weights under both names).
  for (const char* name : {"lightning.ckpt", "timm.pth.tar", "evil.pt", "whole_resnet18.pt", "whole_custom.pt"}) {
    SCOPED_TRACE(name);
    nn::StateDict expected = load_state_dict(fixture(std::string(name) + ".expected.pt"));
    expect_same_state_dict(load_state_dict(fixture(name), {.read = kOpaque, .unwrap = true}), expected);
    if (std::string(name).rfind("whole", 0) == 0)
      expect_same_state_dict(load_state_dict(fixture(name), {.read = kOpaque}), expected);
  }
  expect_same_state_dict(load_state_dict(fixture("whole_custom_legacy.pt"), {.read = kOpaque}),
                         load_state_dict(fixture("whole_custom.pt.expected.pt")));
  Value net = load_pth(fixture("whole_custom.pt"), kOpaque);
  EXPECT_TRUE(is_module(net));
  const Value* table = net.object().state.find("table");  // a NumPy array: not a module
  ASSERT_NE(table, nullptr);
  EXPECT_FALSE(is_module(*table));
  EXPECT_FALSE(is_module(*load_pth(fixture("lightning.ckpt"), kOpaque).find("hyper_parameters")));
  EXPECT_THAT(test::error_of([&] { module_state_dict(*table); }), HasSubstr("is not a torch.nn.Module instance"));
  EXPECT_EQ(markers(), std::vector<std::string>{});
}

TEST(OpaqueRead, TextOfOpaqueObjects) {
  Value ckpt = load_pth(fixture("lightning.ckpt"), kOpaque);
  EXPECT_EQ(repr(*ckpt.find("hyper_parameters")),
            "argparse.Namespace(lr=0.1, name='x', layers=[1, 2], betas=(0.9, 0.999), note='é\\x0a')");
  EXPECT_EQ(repr(*ckpt.find("metrics")), "{'val_acc': 0.9125, 'val_loss': 0.25, 'step': 120, 'flag': True}");
  Value evil = load_pth(fixture("evil.pt"), kOpaque);
  EXPECT_THAT(repr(*evil.find("hook")), ::testing::MatchesRegex("os\\.system\\('touch .*/markers/os_system'\\)"));
  EXPECT_EQ(repr(Value::list({Value(1.0), Value(1e-5), Value(1e16), Value(0.1)})), "[1.0, 1e-05, 1e+16, 0.1]");
  EXPECT_EQ(repr(Value::tuple({Value("a")})), "('a',)");
  std::string cut = repr(Value::list(std::vector<Value>(1000, Value(12345))), 40);
  EXPECT_LT(cut.size(), 50u);
  EXPECT_EQ(cut.substr(cut.size() - 3), "...");
}

// ---- hand-made pickles: what a placeholder can and cannot become

const std::string kProto = "\x80\x02";
std::string pstr(const std::string& s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  return std::string("X") + std::string{char(n), char(n >> 8), char(n >> 16), char(n >> 24)} + s;
}

Value unpickle_opaque(const std::string& bytes) {
  Unpickler u(
      "test.pkl", "data.pkl", [](const PersistentId& id) { return Storage::allocate(id.numel * 4); },
      /*opaque_objects=*/true);
  PickleInput in(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  u.load(in);
  return u.value();
}
std::string opaque_error(const std::string& bytes) {
  return test::error_of([&] { unpickle_opaque(bytes); });
}

TEST(OpaqueUnpickler, PlaceholdersStayData) {
  // os.system('ls'): recorded, not run.
  Value call = unpickle_opaque(kProto + "cos\nsystem\n" + pstr("ls") + "\x85R.");
  EXPECT_EQ(call.object().global, "os.system");
  EXPECT_EQ(call.object().made, OpaqueObject::Made::Call);
  EXPECT_EQ(call.object().args, std::vector<Value>{Value("ls")});
  // A placeholder is not callable, not a storage, not a tensor.
  EXPECT_THAT(opaque_error(kProto + "cos\nsystem\n" + pstr("ls") + "\x85R)R."),
              HasSubstr("calls a opaque object, not a class or function"));
  EXPECT_THAT(opaque_error(kProto + "ctorch._utils\n_rebuild_tensor_v2\n(cx\ny\n)RK\x00))\x89NtR."s),
              HasSubstr("the storage is a opaque object"));
  EXPECT_THAT(opaque_error(kProto + "ctorch._utils\n_rebuild_parameter\n(cx\ny\n)R\x88NtR."),
              HasSubstr("takes (Tensor, bool, hooks)"));
  EXPECT_THAT(opaque_error(kProto + "(" + pstr("storage") + "cx\ny\n" + pstr("0") + pstr("cpu") + "K\x01tQ."),
              HasSubstr("the storage type x.y is not a torch storage"));
  // BUILD records the state once; items go into instances only.
  EXPECT_THAT(opaque_error(kProto + "cx\nC\n)\x81}b}b."), HasSubstr("BUILD of x.C twice"));
  EXPECT_THAT(opaque_error(kProto + "cx\nC\nK\x01" + "a."), HasSubstr("APPEND on a class or function"));
  Value items = unpickle_opaque(kProto + "cx\nD\n)\x81(" + pstr("k") + "K\x02" + "uK\x03" + "a.");
  EXPECT_EQ(items.object().set_items, (Value::Items{{Value("k"), Value(2)}}));
  EXPECT_EQ(items.object().appended, std::vector<Value>{Value(3)});
  // The limits hold: nesting placeholders is bounded like nesting lists.
  std::string deep = kProto;
  for (int i = 0; i < 1100; ++i) deep += "cx\ny\n(";
  for (int i = 0; i < 1100; ++i) deep += "tR";
  EXPECT_THAT(opaque_error(deep + "."), ::testing::AnyOf(HasSubstr("deeper than"), HasSubstr("open marks")));
  // A placeholder cannot be written back.
  EXPECT_THAT(test::error_of([&] { save_pth((fs::temp_directory_path() / "never.pth").string(), call); }),
              HasSubstr("opaque object (os.system)"));
}

TEST(OpaqueUnpickler, NumpyDataIsChecked) {
  // _reconstruct then BUILD with 5 bytes of data for a (2,) float32 array.
  std::string array = kProto + "cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85"s + "C\x01" +
                      "b\x87R(K\x01K\x02\x85" + "cnumpy\ndtype\n" + pstr("f4") + "\x89\x88\x87R(K\x03" + pstr("<") +
                      "NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89"s + "C\x05" + "abcdetb.";
  EXPECT_THAT(opaque_error(array), HasSubstr("holds 5 bytes of data, not 8"));
  // NumPy 2's module names (numpy._core) decode as NumPy 1's: numpy.float64(1.5).
  std::string scalar = kProto + "cnumpy._core.multiarray\nscalar\ncnumpy\ndtype\n" + pstr("f8") +
                       "\x89\x88\x87R(K\x03" + pstr("<") + "NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"s + "C\x08" +
                       "\x00\x00\x00\x00\x00\x00\xf8?\x86R."s;
  EXPECT_EQ(unpickle_opaque(scalar), Value(1.5));
  EXPECT_THAT(opaque_error(kProto + "cnumpy\ndtype\n" + pstr("f$") + "\x89\x88\x87R."),
              HasSubstr("bad type code 'f$'"));
  EXPECT_THAT(opaque_error(kProto + "cnumpy\ndtype\n" + pstr("f99999999999999999999999") + "\x89\x88\x87R."),
              HasSubstr("bad type code"));
  EXPECT_THAT(opaque_error(kProto + "cnumpy.core.multiarray\n_reconstruct\ncx\ny\nK\x00\x85"s + "C\x01" + "b\x87R."),
              HasSubstr("subclasses of ndarray are not supported"));
}

// ---- the command line

TEST(OpaqueCli, InspectConvertAndRun) {
  test::TempDir dir;
  test::TvcRun r = test::run_tvc(dir, "inspect " + fixture("lightning.ckpt"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("GLOBAL argparse.Namespace is not allowed"));
  EXPECT_THAT(r.err, HasSubstr("--opaque"));

  r = test::run_tvc(dir, "inspect --opaque " + fixture("lightning.ckpt"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("state_dict.0.weight"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\nfeatures +float32  \\[2, 3\\]\n"));
  EXPECT_THAT(r.out, HasSubstr("hyper_parameters: argparse.Namespace(lr=0.1, name='x', layers=[1, 2], "
                               "betas=(0.9, 0.999), note='é\\x0a')"));
  EXPECT_THAT(r.out, HasSubstr("metrics.val_acc: 0.9125"));
  EXPECT_TRUE(test::IsTerminalSafe(r.out, /*tabs=*/true));

  r = test::run_tvc(dir, "inspect --opaque " + fixture("evil.pt"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("hook: os.system('touch "));
  EXPECT_THAT(r.out, HasSubstr("popen: subprocess.Popen(['touch', "));
  EXPECT_THAT(r.out, HasSubstr("eval: builtins.eval("));

  r = test::run_tvc(dir, "inspect --opaque " + fixture("whole_resnet18.pt"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("layer4.1.bn2.num_batches_tracked"));

  for (const char* name : {"lightning.ckpt", "timm.pth.tar", "evil.pt", "whole_resnet18.pt", "whole_custom.pt"}) {
    SCOPED_TRACE(name);
    std::string out = (dir.path() / (std::string(name) + ".safetensors")).string();
    r = test::run_tvc(dir, "convert " + fixture(name) + " " + out + " --unwrap --opaque");
    ASSERT_EQ(r.status, 0) << r.err;
    // safetensors keeps no order: the same tensors by name.
    nn::StateDict written = load_state_dict(out), expected = load_state_dict(fixture(name) + ".expected.pt");
    ASSERT_EQ(written.size(), expected.size());
    for (const auto& [key, t] : expected) {
      ASSERT_TRUE(written.contains(key)) << key;
      EXPECT_TRUE(Value(*written.find(key)) == Value(t)) << key;
    }
  }

  // tvc average reads whole-model saves too: one file twice averages to itself.
  std::string average = (dir.path() / "average.safetensors").string();
  r = test::run_tvc(dir, "average --plain --opaque --out " + average + " " + fixture("whole_custom.pt") + " " +
                             fixture("whole_custom.pt"));
  ASSERT_EQ(r.status, 0) << r.err;
  nn::StateDict averaged = load_state_dict(average), custom = load_state_dict(fixture("whole_custom.pt.expected.pt"));
  ASSERT_EQ(averaged.size(), custom.size());
  for (const auto& [key, t] : custom) EXPECT_TRUE(Value(*averaged.find(key)) == Value(t)) << key;

  // tvc run takes a whole-model save as weights: the outputs of the plain state_dict's.
  std::string input = (dir.path() / "x.safetensors").string();
  save_safetensors(input, {{"input", rand({1, 3, 64, 64})}});
  std::string a = (dir.path() / "a.safetensors").string(), b = (dir.path() / "b.safetensors").string();
  r = test::run_tvc(
      dir, "run resnet18 --opaque --weights " + fixture("whole_resnet18.pt") + " --input " + input + " --output " + a);
  ASSERT_EQ(r.status, 0) << r.err;
  r = test::run_tvc(dir, "run resnet18 --weights " + fixture("whole_resnet18.pt.expected.pt") + " --input " + input +
                             " --output " + b);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(Value(SafetensorsFile::open(a).tensor("output")) == Value(SafetensorsFile::open(b).tensor("output")));
  EXPECT_EQ(markers(), std::vector<std::string>{});
}

}  // namespace
}  // namespace tvc::io
