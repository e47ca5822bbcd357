// The C API (tvc/c_api.h): results equal the C++ API's on the same weights and input; every
// error path returns its status with a message, sets no output and leaves the handles usable
// (run under LeakSanitizer by tools/sanitize.sh); one model serves forward passes from several
// threads at once, with set_num_threads changing meanwhile, equal to serial runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test_helpers.h"
#include "tvc/autograd.h"
#include "tvc/c_api.h"
#include "tvc/models/models.h"
#include "tvc/ops.h"
#include "tvc/serialize.h"
#include "tvc/version.h"

namespace {

using ::testing::HasSubstr;

// Owns a C API handle (moves, never copies); free_handle frees it.
template <typename Handle, void (*free_handle)(Handle*)>
struct Owned {
  Handle* handle = nullptr;
  Owned() = default;
  Owned(Owned&& other) noexcept : handle(std::exchange(other.handle, nullptr)) {}
  Owned& operator=(Owned&& other) noexcept {
    std::swap(handle, other.handle);
    return *this;
  }
  ~Owned() { free_handle(handle); }
};
using Model = Owned<tvc_model, tvc_model_free>;
using CTensor = Owned<tvc_tensor, tvc_tensor_free>;

CTensor c_tensor(const tvc::Tensor& t) {
  tvc::Tensor values = t.to(tvc::DType::Float32).contiguous();
  CTensor out;
  EXPECT_EQ(tvc_tensor_from_data(values.data_ptr<float>(), values.shape().data(), static_cast<int>(values.dim()),
                                 &out.handle),
            TVC_OK)
      << tvc_last_error();
  return out;
}

std::vector<float> values_of(const tvc_tensor* t) {
  return std::vector<float>(tvc_tensor_data(t), tvc_tensor_data(t) + tvc_tensor_numel(t));
}

std::vector<float> values_of(const tvc::Tensor& t) {
  tvc::Tensor c = t.contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// resnet18 with 10 classes on random weights saved to dir, and the same model in C++.
tvc::models::BackbonePtr saved_resnet18(const tvc::test::TempDir& dir) {
  tvc::manual_seed(21);
  tvc::models::BackbonePtr model = tvc::models::create("resnet18", {.num_classes = 10});
  tvc::io::save_safetensors(dir / "r18.safetensors", model->state_dict());
  model->eval();
  return model;
}

TEST(CApi, VersionAndNoErrorYet) {
  EXPECT_STREQ(tvc_version(), TVC_VERSION_STRING);
  std::string message = "unset";
  std::thread([&] { message = tvc_last_error(); }).join();  // a fresh thread has failed nothing
  EXPECT_EQ(message, "");
}

TEST(CApi, ForwardEqualsTheCppApi) {
  tvc::test::TempDir dir;
  tvc::models::BackbonePtr reference = saved_resnet18(dir);
  Model model;
  ASSERT_EQ(tvc_model_create("resnet18", 10, &model.handle), TVC_OK) << tvc_last_error();
  ASSERT_EQ(tvc_model_load_weights(model.handle, (dir / "r18.safetensors").c_str()), TVC_OK) << tvc_last_error();
  tvc::Tensor x = tvc::randn({2, 3, 48, 40});
  CTensor input = c_tensor(x), logits;
  ASSERT_EQ(tvc_model_forward(model.handle, input.handle, &logits.handle), TVC_OK) << tvc_last_error();
  ASSERT_EQ(tvc_tensor_ndim(logits.handle), 2);
  EXPECT_EQ(tvc_tensor_shape(logits.handle)[0], 2);
  EXPECT_EQ(tvc_tensor_shape(logits.handle)[1], 10);
  tvc::NoGradGuard no_grad;
  EXPECT_EQ(values_of(logits.handle), values_of((*reference)(x)));
  // The input tensor is a copy: its shape and values are the data given.
  EXPECT_EQ(tvc_tensor_ndim(input.handle), 4);
  EXPECT_EQ(values_of(input.handle), values_of(x));
}

TEST(CApi, ErrorsReturnAStatusAndAMessageAndLeaveHandlesUsable) {
  tvc::test::TempDir dir;
  saved_resnet18(dir);
  tvc_model* untouched = reinterpret_cast<tvc_model*>(0x1);
  EXPECT_EQ(tvc_model_create("resnet181", 10, &untouched), TVC_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(tvc_last_error(), HasSubstr("tvc_model_create: unknown model 'resnet181'; did you mean 'resnet1"));
  EXPECT_EQ(untouched, reinterpret_cast<tvc_model*>(0x1));
  EXPECT_EQ(tvc_model_create(nullptr, 10, &untouched), TVC_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(tvc_last_error(), HasSubstr("name is NULL"));
  EXPECT_EQ(tvc_model_create("resnet18", -3, &untouched), TVC_ERROR_INVALID_ARGUMENT);

  Model model;
  ASSERT_EQ(tvc_model_create("resnet18", 10, &model.handle), TVC_OK);
  ASSERT_EQ(tvc_model_load_weights(model.handle, (dir / "r18.safetensors").c_str()), TVC_OK);
  CTensor input = c_tensor(tvc::randn({1, 3, 32, 32})), before;
  ASSERT_EQ(tvc_model_forward(model.handle, input.handle, &before.handle), TVC_OK);

  // A missing file, a file of another class count: errors naming them, the weights unchanged.
  EXPECT_EQ(tvc_model_load_weights(model.handle, (dir / "missing.pth").c_str()), TVC_ERROR_FAILED);
  EXPECT_THAT(tvc_last_error(), HasSubstr("missing.pth"));
  tvc::io::save_safetensors(dir / "r18_1000.safetensors", tvc::models::create("resnet18")->state_dict());
  EXPECT_EQ(tvc_model_load_weights(model.handle, (dir / "r18_1000.safetensors").c_str()), TVC_ERROR_FAILED);
  EXPECT_THAT(tvc_last_error(), HasSubstr("fc.weight"));

  // Inputs of the wrong shape; the output pointer is not set.
  tvc_tensor* no_output = nullptr;
  CTensor flat = c_tensor(tvc::randn({3, 32})), gray = c_tensor(tvc::randn({1, 1, 32, 32}));
  EXPECT_EQ(tvc_model_forward(model.handle, flat.handle, &no_output), TVC_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(tvc_last_error(), HasSubstr("input has shape [3, 32]; expected (N, 3, H, W)"));
  EXPECT_EQ(tvc_model_forward(model.handle, gray.handle, &no_output), TVC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tvc_model_forward(model.handle, nullptr, &no_output), TVC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(no_output, nullptr);

  // The model still works, with its old weights.
  CTensor after;
  ASSERT_EQ(tvc_model_forward(model.handle, input.handle, &after.handle), TVC_OK) << tvc_last_error();
  EXPECT_EQ(values_of(after.handle), values_of(before.handle));

  // A ViT refuses another input size than it was built for.
  Model vit;
  ASSERT_EQ(tvc_model_create("vit_b_32", 0, &vit.handle), TVC_OK);
  EXPECT_EQ(tvc_model_forward(vit.handle, input.handle, &no_output), TVC_ERROR_FAILED);
  EXPECT_THAT(tvc_last_error(), HasSubstr("224"));
}

TEST(CApi, TensorArgumentsAreChecked) {
  tvc_tensor* out = nullptr;
  float value = 1;
  int64_t negative[2] = {2, -1}, huge[3] = {int64_t{1} << 40, int64_t{1} << 40, 8}, empty[2] = {0, 5};
  EXPECT_EQ(tvc_tensor_from_data(&value, negative, 2, &out), TVC_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(tvc_last_error(), HasSubstr("negative size"));
  EXPECT_EQ(tvc_tensor_from_data(&value, huge, 3, &out), TVC_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(tvc_last_error(), HasSubstr("more elements than memory can hold"));
  EXPECT_EQ(tvc_tensor_from_data(&value, negative, 9, &out), TVC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tvc_tensor_from_data(nullptr, huge, 1, &out), TVC_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(tvc_last_error(), HasSubstr("data is NULL"));
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(tvc_set_num_threads(0), TVC_ERROR_INVALID_ARGUMENT);
  // An empty tensor needs no data; a scalar has no dims.
  ASSERT_EQ(tvc_tensor_from_data(nullptr, empty, 2, &out), TVC_OK);
  EXPECT_EQ(tvc_tensor_numel(out), 0);
  tvc_tensor_free(out);
  ASSERT_EQ(tvc_tensor_from_data(&value, nullptr, 0, &out), TVC_OK);
  EXPECT_EQ(tvc_tensor_ndim(out), 0);
  EXPECT_EQ(tvc_tensor_data(out)[0], 1.0f);
  tvc_tensor_free(out);
  // NULL handles are accepted where documented.
  EXPECT_EQ(tvc_tensor_ndim(nullptr), 0);
  EXPECT_EQ(tvc_tensor_data(nullptr), nullptr);
  tvc_tensor_free(nullptr);
  tvc_model_free(nullptr);
}

TEST(CApi, LastErrorIsPerThread) {
  tvc_tensor* out = nullptr;
  EXPECT_EQ(tvc_set_num_threads(-1), TVC_ERROR_INVALID_ARGUMENT);
  std::string mine = tvc_last_error();
  std::thread([&] { EXPECT_EQ(tvc_tensor_from_data(nullptr, nullptr, 1, &out), TVC_ERROR_INVALID_ARGUMENT); }).join();
  EXPECT_EQ(tvc_last_error(), mine);
  EXPECT_THAT(mine, HasSubstr("tvc_set_num_threads: need at least 1 thread, got -1"));
}

// Four threads share one model, each running forward passes on its own inputs, while another
// thread changes the thread count: every output equals the serial one.
TEST(CApi, OneModelServesSeveralThreads) {
  tvc::test::TempDir dir;
  saved_resnet18(dir);
  Model model;
  ASSERT_EQ(tvc_model_create("resnet18", 10, &model.handle), TVC_OK);
  ASSERT_EQ(tvc_model_load_weights(model.handle, (dir / "r18.safetensors").c_str()), TVC_OK);
  constexpr int kThreads = 4, kPasses = 3;
  std::vector<CTensor> inputs(kThreads);
  std::vector<std::vector<float>> serial(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    inputs[t] = c_tensor(tvc::randn({2, 3, 32, 32}));
    CTensor out;
    ASSERT_EQ(tvc_model_forward(model.handle, inputs[t].handle, &out.handle), TVC_OK);
    serial[t] = values_of(out.handle);
  }
  std::vector<int> equal(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int pass = 0; pass < kPasses; ++pass) {
        CTensor out;
        if (tvc_model_forward(model.handle, inputs[t].handle, &out.handle) == TVC_OK &&
            values_of(out.handle) == serial[t])
          ++equal[t];
      }
    });
  threads.emplace_back([] {
    for (int i = 0; i < 20; ++i) tvc_set_num_threads(1 + i % 2);
  });
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(equal[t], kPasses) << "thread " << t;
  tvc_set_num_threads(2);
}

}  // namespace
