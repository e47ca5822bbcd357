// The C API (tvc/c_api.h) over tvc::models. Each entry point checks its arguments, runs the C++
// call inside guarded(), which turns whatever is thrown into a status and the calling thread's
// last error, and only then sets its outputs, so a failed call leaves every handle as it was.
#include "tvc/c_api.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "tvc/autograd.h"
#include "tvc/error.h"
#include "tvc/models/models.h"
#include "tvc/models/weights.h"
#include "tvc/ops.h"
#include "tvc/version.h"

struct tvc_model {
  tvc::models::BackbonePtr module;  // in eval mode
};

struct tvc_tensor {
  tvc::Tensor values;  // float32, contiguous
};

namespace {

thread_local std::string last_error;

// A caller's mistake (TVC_ERROR_INVALID_ARGUMENT).
struct InvalidArgument : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Parts>
[[noreturn]] void invalid(const Parts&... parts) {
  throw InvalidArgument(tvc::cat_str(parts...));
}

// Runs body; TVC_OK, or the status of what it threw with its message as the last error.
template <typename Body>
int guarded(const char* function, Body&& body) noexcept {
  auto fail = [&](int status, const char* message) {
    try {
      last_error = std::string(function) + ": " + message;
    } catch (...) {
      last_error.clear();  // no memory for the message; the status still says what happened
    }
    return status;
  };
  try {
    body();
    return TVC_OK;
  } catch (const InvalidArgument& e) {
    return fail(TVC_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const std::bad_alloc&) {
    return fail(TVC_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(TVC_ERROR_FAILED, e.what());
  } catch (...) {
    return fail(TVC_ERROR_FAILED, "unknown error");
  }
}

void require(const void* pointer, const char* name) {
  if (pointer == nullptr) invalid(name, " is NULL");
}

}  // namespace

extern "C" {

const char* tvc_version(void) { return TVC_VERSION_STRING; }

const char* tvc_last_error(void) { return last_error.c_str(); }

int tvc_set_num_threads(int n) {
  return guarded("tvc_set_num_threads", [&] {
    if (n < 1) invalid("need at least 1 thread, got ", n);
    tvc::set_num_threads(n);
  });
}

int tvc_model_create(const char* name, int64_t num_classes, tvc_model** out) {
  return guarded("tvc_model_create", [&] {
    require(name, "name");
    require(out, "out");
    if (num_classes < 0) invalid("num_classes is ", num_classes, "; expected 0 (the default) or more");
    std::vector<std::string> known = tvc::models::list();
    tvc::models::BackbonePtr module;
    try {
      module = tvc::models::create(name, {.num_classes = num_classes == 0 ? std::optional<int64_t>() : num_classes});
    } catch (const tvc::Error& e) {
      // An unknown name (the message names the closest known one) is the caller's mistake.
      if (std::find(known.begin(), known.end(), name) == known.end()) throw InvalidArgument(e.what());
      throw;
    }
    module->eval();
    *out = new tvc_model{std::move(module)};
  });
}

int tvc_model_load_weights(tvc_model* model, const char* path) {
  return guarded("tvc_model_load_weights", [&] {
    require(model, "model");
    require(path, "path");
    std::string file = tvc::models::weights_file(model->module->model_name(), path);
    model->module->load_state_dict(file, /*strict=*/true);  // checks everything before writing
  });
}

int tvc_model_forward(tvc_model* model, const tvc_tensor* input, tvc_tensor** out) {
  return guarded("tvc_model_forward", [&] {
    require(model, "model");
    require(input, "input");
    require(out, "out");
    const tvc::Shape& shape = input->values.shape();
    if (shape.size() != 4 || shape[1] != 3) invalid("input has shape ", shape, "; expected (N, 3, H, W) images");
    tvc::NoGradGuard no_grad;
    tvc::Tensor logits = (*model->module)(input->values);
    *out = new tvc_tensor{logits.to(tvc::DType::Float32).contiguous()};
  });
}

void tvc_model_free(tvc_model* model) { delete model; }

int tvc_tensor_from_data(const float* data, const int64_t* shape, int ndim, tvc_tensor** out) {
  return guarded("tvc_tensor_from_data", [&] {
    require(out, "out");
    if (ndim < 0 || ndim > 8) invalid("ndim is ", ndim, "; expected 0 to 8");
    if (ndim > 0) require(shape, "shape");
    tvc::Shape sizes(shape, shape + ndim);
    int64_t numel = 1;
    for (int64_t size : sizes) {
      if (size < 0) invalid("shape ", sizes, " has a negative size");
      if (size != 0 && numel > INT64_MAX / static_cast<int64_t>(sizeof(float)) / size)
        invalid("shape ", sizes, " has more elements than memory can hold");
      numel *= size;
    }
    if (numel > 0) require(data, "data");
    tvc::Tensor values = tvc::empty(sizes);
    if (numel > 0) std::memcpy(values.data_ptr<float>(), data, static_cast<size_t>(numel) * sizeof(float));
    *out = new tvc_tensor{std::move(values)};
  });
}

int tvc_tensor_ndim(const tvc_tensor* tensor) { return tensor ? static_cast<int>(tensor->values.dim()) : 0; }

const int64_t* tvc_tensor_shape(const tvc_tensor* tensor) { return tensor ? tensor->values.shape().data() : nullptr; }

int64_t tvc_tensor_numel(const tvc_tensor* tensor) { return tensor ? tensor->values.numel() : 0; }

const float* tvc_tensor_data(const tvc_tensor* tensor) { return tensor ? tensor->values.data_ptr<float>() : nullptr; }

void tvc_tensor_free(tvc_tensor* tensor) { delete tensor; }

}  // extern "C"
