// Tensor core: views and strides, storage sharing, creation, type promotion, printing, errors.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <thread>

#include "compare.h"
#include "test_helpers.h"
#include "torch_golden.h"
#include "tvc/autograd.h"
#include "tvc/internal/kernel.h"
#include "tvc/internal/tensor_impl.h"
#include "tvc/ops.h"

// A user's code outside namespace tvc: shapes print through argument-dependent lookup.
static std::string printed_outside_tvc(const tvc::Tensor& t) {
  std::ostringstream os;
  os << t.shape() << " " << t;
  return os.str();
}

using namespace tvc;
using tvc::test::py_tensor;
using tvc::test::relative_error;
using tvc::test::torch_run;

// A floating Scalar's integer value is truncated, and saturated where the double is out of
// int64's range (an attention mask's -inf is such a Scalar).
TEST(Scalar, IntegerValueOfAnyDouble) {
  EXPECT_EQ(Scalar(-2.75).to_int(), -2);
  EXPECT_EQ(Scalar(-std::numeric_limits<double>::infinity()).to_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(Scalar(std::numeric_limits<double>::infinity()).to_int(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Scalar(1e300).to_int(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Scalar(std::numeric_limits<double>::quiet_NaN()).to_int(), 0);
  EXPECT_EQ(Scalar(-9223372036854775808.0).to_int(), std::numeric_limits<int64_t>::min());
}

TEST(Tensor, ViewsShareStorageAndVersion) {
  Tensor t = arange(24, {.dtype = DType::Float32}).reshape({2, 3, 4});
  Tensor v = t.permute({2, 0, 1});
  EXPECT_EQ(v.shape(), Shape({4, 2, 3}));
  EXPECT_EQ(v.strides(), Shape({1, 12, 4}));
  EXPECT_EQ(v.storage(), t.storage());
  EXPECT_FALSE(v.is_contiguous());
  uint64_t before = t.version();
  v.select(0, 1).fill_(-1);
  EXPECT_EQ(t.version(), before + 1);
  EXPECT_EQ(t.select(2, 1).sum().item<double>(), -6);
  Tensor s = t.slice(2, 1, 4, 2);  // columns 1 and 3
  EXPECT_EQ(s.shape(), Shape({2, 3, 2}));
  EXPECT_EQ(s.strides(), Shape({12, 4, 2}));
  EXPECT_EQ(s.storage_offset(), 1);
  Tensor n = t.narrow(1, 1, 2);
  EXPECT_EQ(n.storage_offset(), 4);
  EXPECT_EQ(t.unsqueeze(1).shape(), Shape({2, 1, 3, 4}));
  EXPECT_EQ(t.unsqueeze(-1).strides(), Shape({12, 4, 1, 1}));
  EXPECT_EQ(t.flatten(1).shape(), Shape({2, 12}));
  EXPECT_EQ(t.reshape({4, -1}).shape(), Shape({4, 6}));
  EXPECT_EQ(tensor<float>({1, 2, 3}).reshape({3, 1}).expand({3, 5}).strides(), Shape({1, 0}));
  EXPECT_EQ(t.unflatten(2, {2, 2}).shape(), Shape({2, 3, 2, 2}));
  EXPECT_EQ(zeros({1, 3, 1}).squeeze().shape(), Shape({3}));
}

TEST(Tensor, ReshapeCopiesOnlyWhenNeeded) {
  Tensor t = randn({4, 6});
  EXPECT_EQ(t.reshape({2, 12}).storage(), t.storage());
  Tensor tt = t.t();
  Tensor r = tt.reshape({24});
  EXPECT_NE(r.storage(), t.storage());
  EXPECT_THROW(tt.view({24}), Error);
  EXPECT_LE(relative_error(r, tt.contiguous().view({24})), 0);
}

TEST(Tensor, ChannelsLast) {
  Tensor t = randn({2, 3, 4, 5});
  Tensor cl = t.contiguous(MemoryFormat::ChannelsLast);
  EXPECT_EQ(cl.strides(), Shape({60, 1, 15, 3}));
  EXPECT_TRUE(cl.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_EQ(cl.suggest_memory_format(), MemoryFormat::ChannelsLast);
  // Elementwise results keep channels-last (documented rule), values equal.
  Tensor y = add(cl, ones({3, 1, 1}));
  EXPECT_EQ(y.suggest_memory_format(), MemoryFormat::ChannelsLast);
  EXPECT_EQ(relative_error(y, add(t, ones({3, 1, 1}))), 0);
  EXPECT_EQ(cl.clone().suggest_memory_format(), MemoryFormat::ChannelsLast);
  EXPECT_EQ(relu(cl).suggest_memory_format(), MemoryFormat::ChannelsLast);
}

TEST(Tensor, FromBlobUnalignedNoCopy) {
  std::vector<unsigned char> raw(1 + 6 * sizeof(float));
  float values[6] = {1, 2, 3, 4, 5, 6};
  std::memcpy(raw.data() + 1, values, sizeof values);  // deliberately misaligned
  bool deleted = false;
  {
    Tensor t = from_blob(raw.data() + 1, {2, 3}, DType::Float32, [&](void*) { deleted = true; });
    EXPECT_EQ(t.raw_data(), raw.data() + 1);
    EXPECT_EQ(sum(t).item<double>(), 21);
    EXPECT_EQ(t.t().contiguous().to_vector(), std::vector<double>({1, 4, 2, 5, 3, 6}));
    t.mul_(2.0);  // an in-place kernel writes through the misaligned view
    float back[6];
    std::memcpy(back, raw.data() + 1, sizeof back);
    EXPECT_EQ(back[5], 12.0f);
    EXPECT_EQ(sum(relu(t)).item<double>(), 42);
  }
  EXPECT_TRUE(deleted);
}

// A backend compiled against another op list (a stale object file) is refused, not registered
// under Op numbers that now name other ops.
TEST(KernelRegistry, RefusesABackendBuiltAgainstAnotherOpList) {
  auto registration = [](KernelRegistry&) {};
  EXPECT_NE(test::error_of([&] { add_backend(registration, kOpListHash + 1); }).find("another list of ops"),
            std::string::npos);
}

TEST(Tensor, CreationOps) {
  EXPECT_EQ(zeros({2, 3}).to_vector(), std::vector<double>(6, 0));
  EXPECT_EQ(full({2}, 7, {.dtype = DType::Int32}).dtype(), DType::Int32);
  EXPECT_EQ(arange(5).dtype(), DType::Int64);
  EXPECT_EQ(arange(0, 1, 0.25, {.dtype = DType::Float64}).to_vector(), std::vector<double>({0, 0.25, 0.5, 0.75}));
  EXPECT_THROW(arange(0, 10, -1), Error);
  EXPECT_THROW(empty({2, -3}), Error);
  EXPECT_THROW(empty({int64_t{1} << 40, int64_t{1} << 40}), Error);  // no giant allocation
  int64_t big = (int64_t{1} << 60) + 1;                              // not representable in double
  EXPECT_EQ(full({}, big, {.dtype = DType::Int64}).item<int64_t>() - (int64_t{1} << 60), 1);
  EXPECT_EQ(scalar_tensor(-2.7).item<int>(), -2);
  EXPECT_TRUE(scalar_tensor(0.5).item<bool>());
}

TEST(Tensor, TypePromotionMatchesPyTorch) {
  std::vector<DType> types = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int64,
                              DType::Int32,   DType::Int16,   DType::Int8,    DType::UInt8,    DType::Bool};
  std::string code = "import itertools\nts = [";
  for (DType t : types) code += std::string("torch.") + dtype_name(t) + ",";
  code += "]\nprint(json.dumps([[str(torch.promote_types(a, b)).replace('torch.', '') for b in ts] for a in ts]))\n";
  auto j = tvc::test::torch_json(code);
  ASSERT_FALSE(j.is_null());
  for (size_t a = 0; a < types.size(); ++a)
    for (size_t b = 0; b < types.size(); ++b)
      EXPECT_EQ(dtype_name(promote_types(types[a], types[b])), j[a][b].get<std::string>())
          << dtype_name(types[a]) << " + " << dtype_name(types[b]);
  // Scalars and 0-d tensors rank below dimensioned tensors of the same category.
  Tensor i = arange(3);
  EXPECT_EQ((i * 2.5).dtype(), DType::Float32);
  EXPECT_EQ((i * 2).dtype(), DType::Int64);
  EXPECT_EQ(add(ones({2}), scalar_tensor(1.0, {.dtype = DType::Float64})).dtype(), DType::Float32);
  EXPECT_EQ(add(ones({2}, {.dtype = DType::Float16}), ones({2})).dtype(), DType::Float32);
}

TEST(Tensor, HalfAndBFloat16Rounding) {
  // Bit patterns of round-to-nearest-even conversions, including subnormals and overflow.
  EXPECT_EQ(Half(1.0f).bits, 0x3c00);
  EXPECT_EQ(Half(65504.0f).bits, 0x7bff);
  EXPECT_EQ(Half(65520.0f).bits, 0x7c00);
  EXPECT_EQ(Half(5.960464477539063e-08f).bits, 0x0001);
  EXPECT_EQ(Half(-2.0f).bits, 0xc000);
  EXPECT_EQ(static_cast<float>(Half(0.333333f)), 0.333251953125f);
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(static_cast<float>(BFloat16(3.14159f)), 3.140625f);
  Tensor x = randn({1000});
  std::string code = "x = " + py_tensor(x) + "\nprint(json_tensors([x.half().float(), x.bfloat16().float()]))\n";
  auto j = tvc::test::torch_json(code);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(relative_error(x.to(DType::Float16).to(DType::Float32), tvc::test::tensor_from_json(j[0])), 0);
  EXPECT_EQ(relative_error(x.to(DType::BFloat16).to(DType::Float32), tvc::test::tensor_from_json(j[1])), 0);
}

TEST(Tensor, ReprLikePyTorch) {
  std::vector<Tensor> cases = {
      tensor<float>({0.5f, -1.25f, 3.0f, 100.125f}, Shape{2, 2}),
      tensor<float>({1, 2, 3}),
      tensor<double>({1e-5, 2.5, 3e5}),
      arange(6).reshape({2, 3}),
      tensor<bool>({true, false}),
      zeros({0, 3}),
      scalar_tensor(2.5),
      arange(24, {.dtype = DType::Float32}).reshape({2, 3, 4}),
      arange(2000, {.dtype = DType::Float32}),
  };
  std::string code = "ts = [";
  for (const Tensor& t : cases) code += py_tensor(t) + ",";
  code += "]\nprint(json.dumps([repr(t) for t in ts]))\n";
  auto j = tvc::test::torch_json(code);
  ASSERT_FALSE(j.is_null());
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(cases[i].repr(), j[i].get<std::string>());
}

// The methods are the free functions of tvc/ops.h; tensors and shapes print with operator<<.
TEST(Tensor, MethodsAndPrinting) {
  manual_seed(3);
  Tensor x = randn({3, 5}), y = randn({3, 5}), w = randn({5, 2});
  auto same = [](const Tensor& a, const Tensor& b) { return a.shape() == b.shape() && a.to_vector() == b.to_vector(); };
  EXPECT_TRUE(same(x.add(y, 2), add(x, y, 2)));
  EXPECT_TRUE(same(x.sub(y), sub(x, y)));
  EXPECT_TRUE(same(x.mul(y), mul(x, y)));
  EXPECT_TRUE(same(x.div(y), div(x, y)));
  EXPECT_TRUE(same(x.matmul(w), matmul(x, w)));
  EXPECT_TRUE(same(x.clamp(-0.5, 0.5), clamp(x, -0.5, 0.5)));
  EXPECT_TRUE(same(x.softmax(1), softmax(x, 1)));
  EXPECT_TRUE(same(x.log_softmax(-1), log_softmax(x, -1)));
  EXPECT_TRUE(same(x.sum(1), sum(x, {1})));
  EXPECT_TRUE(same(x.mean(0, true), mean(x, {0}, true)));
  EXPECT_TRUE(same(x.var({1}), var(x, {1})));
  EXPECT_TRUE(same(x.std(), tvc::std(x)));
  EXPECT_TRUE(same(x.max(), max(x)));
  EXPECT_TRUE(same(x.min(), min(x)));
  EXPECT_TRUE(same(x.max(1).second, max(x, 1).second));
  EXPECT_TRUE(same(x.min(0).first, min(x, 0).first));
  EXPECT_TRUE(same(x.argmax(1), argmax(x, 1)));
  EXPECT_TRUE(same(x.argmin(), argmin(x)));
  std::ostringstream printed;
  printed << x.shape() << " " << tensor<float>({1.5f, -2}) << " " << Shape{};
  EXPECT_EQ(printed.str(), "[3, 5] tensor([ 1.5000, -2.0000]) []");
  EXPECT_EQ(printed_outside_tvc(tensor<float>({1.5f, -2})), "[2] tensor([ 1.5000, -2.0000])");
}

TEST(Tensor, ErrorsNameOpAndShapes) {
  try {
    add(ones({2, 3}), ones({4}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "add: shapes [2, 3] and [4] cannot be broadcast together");
  }
  try {
    matmul(ones({2, 3}), ones({4, 5}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3] and [4, 5]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ones({2}).select(0, 5), Error);
  EXPECT_THROW(ones({2, 3}).permute({0, 0}), Error);
  EXPECT_THROW(ones({2, 3}).sum({2}), Error);
  EXPECT_THROW(ones({2, 3}).expand({3, 3}), Error);
  EXPECT_THROW(ones({2, 3}).item<float>(), Error);
  EXPECT_THROW(ones({3}, {.dtype = DType::Int64}).data_ptr<float>(), Error);
}

// Every size computation of a layout is overflow-checked: a shape, strides or offset whose
// element count, extent or byte size passes int64 is an error naming the op and the layout,
// never a wrapped-around (small) allocation or a view reaching outside its storage.
TEST(Tensor, LayoutSizesAreOverflowChecked) {
  constexpr int64_t big = int64_t{1} << 62;
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto has = [](const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; };
  std::string m = message([&] { empty({big, 4}); });
  EXPECT_TRUE(has(m, "more elements than int64 holds")) << m;
  m = message([&] { empty_strided({3, 2}, {big, 1}); });
  EXPECT_TRUE(has(m, "empty_strided: shape [3, 2] with strides [4611686018427387904, 1]")) << m;
  m = message([&] { empty_strided({INT64_MAX / 2}, {1}); });
  EXPECT_TRUE(has(m, "empty_strided: 4611686018427387903 elements of float32 are more bytes")) << m;
  m = message([&] { empty_strided({2, 2}, {-1, 1}); });
  EXPECT_TRUE(has(m, "negative strides are not supported")) << m;
  float buffer[4] = {1, 2, 3, 4};
  m = message([&] { from_blob(buffer, {2, big}, DType::Float32, {}, Shape{big, 1}); });
  EXPECT_TRUE(has(m, "from_blob:")) << m;
  m = message([&] { from_blob(buffer, {2, 2}, DType::Float32, {}, Shape{2, -1}); });
  EXPECT_TRUE(has(m, "from_blob: negative stride")) << m;
  Tensor t = from_blob(buffer, {4}, DType::Float32);
  m = message([&] {
    NoGradGuard no_grad;
    t.as_strided({2}, {INT64_MAX}, 0);
  });
  EXPECT_TRUE(has(m, "as_strided: shape [2] with strides [9223372036854775807]")) << m;
  m = message([&] {
    NoGradGuard no_grad;
    t.as_strided({2}, {1}, INT64_MAX);
  });
  EXPECT_TRUE(has(m, "reach past the storage of 16 bytes")) << m;
  m = message([&] { t.view({-1, big, big}); });
  EXPECT_TRUE(has(m, "view: shape [-1, 4611686018427387904, 4611686018427387904] is invalid for input of size 4")) << m;
  EXPECT_EQ(t.slice(0, 1, 4, INT64_MAX).shape(), Shape{1});  // a step past int64 when multiplied
  m = message([&] { t.narrow(0, 3, INT64_MAX); });
  EXPECT_TRUE(has(m, "narrow: start 3 + length 9223372036854775807 exceeds dimension 0")) << m;
  m = message([&] { t.expand({big, 4}); });
  EXPECT_TRUE(has(m, "expand: target [4611686018427387904, 4] has more elements than int64 holds")) << m;
  m = message([&] { from_blob(buffer, {0, big, 4}, DType::Float32, {}, Shape{1, 1, 1}).flatten(1, 2); });
  EXPECT_TRUE(has(m, "flatten: dims 1 to 2 of shape [0, 4611686018427387904, 4]")) << m;
  EXPECT_EQ(t.as_strided({2, 2}, {0, 1}, 2).sum().item<float>(), 14.0f);  // in-bounds views still work
}

// Untrusted text in messages: printable text stays, control characters and bytes that break
// UTF-8 become \xNN (both bytes of a C1 control), a backslash \\.
TEST(Errors, PrintableEscapesControlCharactersAndInvalidUtf8) {
  struct Case {
    std::string text, printed;
  };
  const Case cases[] = {
      {"", ""},
      {"layer1.0.conv1.weight", "layer1.0.conv1.weight"},
      {"café 层 😀 \xc2\xa0", "café 层 😀 \xc2\xa0"},  // 2-, 3- and 4-byte characters, U+00A0 is no control
      {"\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"},    // sets the terminal's title (ESC, BEL)
      {"\x1b[2J\x1b[31m", "\\x1b[2J\\x1b[31m"},      // clears the screen, turns red (CSI)
      {"a\x9b"
       "2J",
       "a\\x9b2J"},  // the 8-bit CSI byte alone: not UTF-8
      {"a\xc2\x9b"
       "2J",
       "a\\xc2\\x9b2J"},                                    // U+009B (CSI) in UTF-8: a C1 control
      {"\xc2\x80 \xc2\x9f", "\\xc2\\x80 \\xc2\\x9f"},       // the ends of the C1 range
      {std::string("a\0b", 3), "a\\x00b"},                  // NUL inside the text
      {"\x7f\x01\x1f", "\\x7f\\x01\\x1f"},                  // DEL, the ends of C0
      {"line\nnext\ttab\r", "line\\x0anext\\x09tab\\x0d"},  // a name is one line
      {"back\\slash \\x1b", "back\\\\slash \\\\x1b"},       // unambiguous: not an escape
      {"\xff", "\\xff"},                                    // never in UTF-8
      {"\xe5\xb1", "\\xe5\\xb1"},                           // 3-byte sequence cut short by the end
      {"\xe5\xb1x", "\\xe5\\xb1x"},                         // ... and by an ASCII byte
      {"\xc0\xaf", "\\xc0\\xaf"},                           // overlong '/'
      {"\xe0\x80\xaf", "\\xe0\\x80\\xaf"},                  // overlong, 3 bytes
      {"\xed\xa0\x80", "\\xed\\xa0\\x80"},                  // surrogate U+D800
      {"\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"},         // U+110000, past Unicode
      {"\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf"},             // U+10FFFF, the last code point
  };
  for (const Case& c : cases) EXPECT_EQ(printable(c.text), c.printed) << c.printed;
  EXPECT_EQ(utf8_char_length("层", 0), 3u);
  EXPECT_EQ(utf8_char_length("a\xe5\xb1", 1), 0u);
}

TEST(Tensor, ReductionsAreThreadCountIndependent) {
  Tensor x = randn({257, 1031});
  set_num_threads(1);
  Tensor a = sum(x, {1}), b = sum(x);
  set_num_threads(2);
  Tensor c = sum(x, {1}), d = sum(x);
  EXPECT_EQ(relative_error(a, c), 0);
  EXPECT_EQ(relative_error(b, d), 0);
}

TEST(Tensor, MemoryMappedStorage) {
  std::string path = ::testing::TempDir() + "tvc_map_test.bin";
  std::vector<float> values = {1.5f, -2.0f, 3.25f, 4.0f};
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(values.data(), sizeof(float), values.size(), f);
    std::fclose(f);
  }
  auto storage = Storage::map_file(path);
  ASSERT_EQ(storage->nbytes(), 16u);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage;
  impl->shape = {2, 2};
  impl->strides = {2, 1};
  Tensor t(impl);
  EXPECT_EQ(t.to_vector(), std::vector<double>({1.5, -2.0, 3.25, 4.0}));
  t.fill_(0);  // private mapping: the file is untouched
  auto again = Storage::map_file(path);
  EXPECT_EQ(static_cast<const float*>(again->data())[0], 1.5f);
  EXPECT_THROW(Storage::map_file(path + ".missing"), Error);
  std::remove(path.c_str());
}

// Data derived from a storage (Storage::derived): found under its key at the version it was made
// for, gone (freed) after any in-place write (which bumps the version), replaced under the same
// key, never kept for wrapped memory, freed
// with the storage, neither stored nor found while set_keep_derived_data(false).
TEST(Storage, DerivedDataLivesWhileTheContentsAreUnchanged) {
  Tensor t = randn({64});
  const std::shared_ptr<Storage>& s = t.storage();
  const Storage::DerivedKey a{1, 0, 8, 8}, b{1, 0, 8, 9};
  auto da = std::make_shared<int>(1), db = std::make_shared<int>(2);
  std::weak_ptr<int> watch_a = da, watch_b = db;
  EXPECT_EQ(s->derived(a), nullptr);
  s->set_derived(a, std::move(da));
  s->set_derived(b, std::move(db));
  ASSERT_NE(s->derived(a), nullptr);
  EXPECT_EQ(*std::static_pointer_cast<const int>(s->derived(a)), 1);
  EXPECT_EQ(*std::static_pointer_cast<const int>(s->derived(b)), 2);
  s->set_derived(a, std::make_shared<int>(3));  // same key, same version: replaced
  EXPECT_EQ(*std::static_pointer_cast<const int>(s->derived(a)), 3);
  EXPECT_TRUE(watch_a.expired());
  t.mul_(2.0);  // an in-place op: a new version
  EXPECT_EQ(s->derived(a), nullptr);
  EXPECT_EQ(s->derived(b), nullptr);
  EXPECT_TRUE(watch_b.expired());  // freed by the write (an optimizer's step holds no stale forms)
  auto dd = std::make_shared<int>(4);
  std::weak_ptr<int> watch_d = dd;
  s->set_derived(a, std::move(dd));
  EXPECT_EQ(*std::static_pointer_cast<const int>(s->derived(a)), 4);
  s->bump_version();  // what a write through a raw pointer must do
  EXPECT_EQ(s->derived(a), nullptr);
  EXPECT_TRUE(watch_d.expired());
  std::weak_ptr<int> watch_c;
  {
    Tensor u = randn({8});
    auto dc = std::make_shared<int>(5);
    watch_c = dc;
    u.storage()->set_derived(a, std::move(dc));
  }
  EXPECT_TRUE(watch_c.expired());  // freed with its storage
  std::vector<float> outside(8, 1.f);
  Tensor wrapped = from_blob(outside.data(), {8}, DType::Float32);
  wrapped.storage()->set_derived(a, std::make_shared<int>(6));
  EXPECT_EQ(wrapped.storage()->derived(a), nullptr);
  // Keeping switched off: nothing is stored or found; on again, what was kept before is found.
  ASSERT_TRUE(keep_derived_data());
  s->set_derived(a, std::make_shared<int>(8));
  set_keep_derived_data(false);
  s->set_derived(b, std::make_shared<int>(7));
  EXPECT_EQ(s->derived(b), nullptr);
  EXPECT_EQ(s->derived(a), nullptr);
  set_keep_derived_data(true);
  EXPECT_EQ(s->derived(b), nullptr);
  ASSERT_NE(s->derived(a), nullptr);
  EXPECT_EQ(*std::static_pointer_cast<const int>(s->derived(a)), 8);
}

// Large CPU blocks go back to a cache when their tensor dies and serve the next request of their
// size up to twice it, the most recently kept first (a model's activations then reuse memory
// still in cache); the limit bounds what is kept, and empty_cpu_cache gives it all back.
TEST(Storage, LargeBlocksAreKeptForReuse) {
  empty_cpu_cache();
  const size_t limit = cpu_cache_limit();
  ASSERT_GT(limit, size_t{64} << 20);
  const int64_t n = int64_t{1} << 20;  // 4 MiB of float32
  const void* first = nullptr;
  {
    Tensor t = empty({n});
    first = t.raw_data();
    EXPECT_EQ(cpu_cached_bytes(), 0u);
  }
  EXPECT_EQ(cpu_cached_bytes(), size_t(n) * 4);
  {
    Tensor same = empty({n});
    EXPECT_EQ(same.raw_data(), first);  // the kept block
    EXPECT_EQ(cpu_cached_bytes(), 0u);
  }
  {
    Tensor half = empty({n / 2});  // half the size: the same block again
    EXPECT_EQ(half.raw_data(), first);
    half.fill_(1.0);
    EXPECT_EQ(sum(half).item<double>(), double(n / 2));
  }
  EXPECT_EQ(cpu_cached_bytes(), size_t(n) * 4);  // the block keeps its own size
  {
    Tensor smaller = empty({n / 2 - 16});  // less than half: a block of its own
    EXPECT_NE(smaller.raw_data(), first);
    EXPECT_EQ(cpu_cached_bytes(), size_t(n) * 4);
  }
  EXPECT_EQ(cpu_cached_bytes(), size_t(n) * 6 - 64);
  {
    // Two blocks that fit: the one kept last.
    Tensor a = empty({n}), b = empty({n});
    const void* kept_last = a.raw_data();
    b = Tensor();
    a = Tensor();
    Tensor again = empty({n * 3 / 4});
    EXPECT_EQ(again.raw_data(), kept_last);
  }
  {
    Tensor small = empty({30000});  // below 128 KiB: never kept
  }
  EXPECT_EQ(cpu_cached_bytes(), size_t(n) * 10 - 64);
  set_cpu_cache_limit(size_t(n) * 5);  // frees the largest blocks beyond the limit
  EXPECT_EQ(cpu_cached_bytes(), size_t(n) * 2 - 64);
  set_cpu_cache_limit(0);
  EXPECT_EQ(cpu_cached_bytes(), 0u);
  { Tensor t = empty({n}); }
  EXPECT_EQ(cpu_cached_bytes(), 0u);  // nothing is kept with a limit of 0
  set_cpu_cache_limit(limit);
  { Tensor t = empty({n}); }
  EXPECT_EQ(cpu_cached_bytes(), size_t(n) * 4);
  empty_cpu_cache();
  EXPECT_EQ(cpu_cached_bytes(), 0u);
}
