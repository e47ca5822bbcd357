// Direct checks of the convolution, pooling, normalisation and softmax ops against PyTorch
// (tests/torch_golden.h), plus a float64 finite-difference check of conv2d's gradients, the
// batch-norm running statistics, layouts, thread-count independence and error messages.
// err = ||a - b|| / ||b|| <= 1e-5 in float32 and <= 1e-10 in float64.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <sstream>

#include "../kernels/cpu/gemm.h"
#include "../kernels/cpu/weight_form.h"
#include "compare.h"
#include "torch_golden.h"
#include "tvc/autograd.h"
#include "tvc/internal/autograd.h"
#include "tvc/internal/kernel.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"
#include "tvc/profiler.h"

namespace tvc::test {
namespace {

Tensor randn_of(const Shape& shape, DType dtype, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, {.dtype = dtype}, &gen);
}

std::string py_pair(std::array<int64_t, 2> p) { return tvc::cat_str("(", p[0], ", ", p[1], ")"); }

// Runs code with PyTorch; the code appends tensors to the list `out`, returned in order.
std::vector<Tensor> torch_tensors(const std::string& code) {
  nlohmann::json j = torch_json("out = []\n" + code + "\nprint(json_tensors(out))\n");
  std::vector<Tensor> r;
  for (const auto& t : j) r.push_back(tensor_from_json(t));
  return r;
}

double tol_for(DType dtype) { return dtype == DType::Float64 ? 1e-10 : 1e-5; }

// ---------------------------------------------------------------- conv2d

struct ConvCase {
  Shape x, w;
  bool bias;
  std::array<int64_t, 2> stride, padding, dilation;
  int64_t groups;
  bool channels_last = false;
  DType dtype = DType::Float32;
};

std::string conv_label(const ConvCase& c) {
  std::ostringstream os;
  os << "x " << shape_str(c.x) << " w " << shape_str(c.w) << " stride " << py_pair(c.stride) << " padding "
     << py_pair(c.padding) << " dilation " << py_pair(c.dilation) << " groups " << c.groups
     << (c.channels_last ? " channels-last" : "") << " " << dtype_name(c.dtype);
  return os.str();
}

TEST(NnOps, Conv2dForwardAndGradientsMatchTorch) {
  std::vector<ConvCase> cases = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, true, {1, 1}, {0, 0}, {1, 1}, 1},
      {{3, 4, 9, 8}, {6, 4, 3, 3}, true, {2, 2}, {1, 1}, {1, 1}, 1},
      {{2, 4, 9, 8}, {6, 2, 3, 2}, false, {2, 1}, {1, 2}, {2, 2}, 2},
      {{2, 6, 7, 7}, {6, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 6},  // depthwise
      {{2, 3, 8, 7}, {6, 1, 3, 3}, true, {2, 2}, {1, 1}, {1, 1}, 3},  // depthwise, multiplier 2
      // depthwise rows wide enough for whole vectors of every instruction set's row kernel
      {{1, 3, 5, 75}, {3, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 3},
      {{1, 2, 6, 140}, {4, 1, 5, 5}, false, {2, 2}, {2, 2}, {1, 1}, 2},
      {{1, 2, 5, 150}, {2, 1, 3, 3}, true, {1, 2}, {1, 2}, {1, 2}, 2},
      {{1, 4, 9, 70}, {4, 1, 7, 7}, true, {1, 1}, {3, 3}, {1, 1}, 4},
      // small maps (a padded plane read as one row), strides 1 and 2, dilated
      {{1, 8, 7, 7}, {8, 1, 5, 5}, true, {1, 1}, {2, 2}, {1, 1}, 8},
      {{2, 4, 14, 14}, {4, 1, 5, 5}, true, {2, 2}, {2, 2}, {1, 1}, 4},
      {{1, 3, 20, 21}, {3, 1, 3, 3}, true, {2, 2}, {2, 2}, {2, 2}, 3},
      {{1, 3, 9, 11}, {6, 1, 3, 3}, false, {1, 1}, {0, 2}, {2, 1}, 3},
      {{2, 5, 4, 6}, {3, 5, 1, 1}, true, {1, 1}, {0, 0}, {1, 1}, 1},     // pointwise
      {{8, 3, 7, 7}, {4, 3, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},     // 8 small maps as two GEMMs of 4 samples
      {{12, 2, 10, 10}, {3, 2, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},  // weight gradient: GEMMs of 10 + 2 samples
      // weight gradients of large maps in bands of output rows: 22 + 22 + 6, grouped 34 + 34 + 2
      {{2, 3, 50, 45}, {4, 3, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},
      {{1, 4, 70, 30}, {4, 2, 3, 3}, false, {1, 1}, {1, 1}, {1, 1}, 2},
      // "same" rows lowered as one run per tap: dilated, and 3x5 with only the width kept
      {{2, 3, 9, 8}, {4, 3, 3, 3}, true, {1, 1}, {2, 2}, {2, 2}, 1},
      {{2, 3, 6, 9}, {5, 3, 3, 5}, false, {1, 1}, {0, 2}, {1, 1}, 1},
      // depthwise in blocks of 16 channels (at least 16 blocks, two per thread up to 8 threads):
      // small maps, 5x5, stride 2 and 3, multiplier 2, a partial block, dilated, channels-last
      {{4, 68, 7, 7}, {68, 1, 5, 5}, true, {1, 1}, {2, 2}, {1, 1}, 68},
      {{2, 120, 12, 11}, {120, 1, 3, 3}, true, {2, 2}, {1, 1}, {1, 1}, 120},
      {{1, 16, 10, 9}, {16, 1, 3, 3}, false, {3, 3}, {1, 1}, {1, 1}, 16},
      {{4, 40, 6, 6}, {80, 1, 5, 5}, true, {1, 1}, {2, 2}, {1, 1}, 40},
      {{2, 128, 9, 10}, {128, 1, 3, 3}, true, {1, 1}, {2, 2}, {2, 2}, 128},
      {{2, 18, 7, 7}, {18, 1, 5, 5}, true, {1, 1}, {2, 2}, {1, 1}, 18, true},
      {{2, 5, 4, 6}, {3, 5, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1, true},
      {{2, 4, 6, 6}, {4, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 4, true},
      {{2, 6, 4, 6}, {4, 6, 1, 1}, false, {1, 1}, {0, 0}, {1, 1}, 1, true},
      {{2, 3, 7, 6}, {4, 3, 3, 3}, true, {2, 1}, {1, 0}, {1, 2}, 1, false, DType::Float64},
      {{3, 4, 6, 5}, {4, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 4, true, DType::Float64},
      // depthwise channels-last in whole blocks of 16 channels, rows of 16 outputs and more (read
      // in place): 3x3 stride 1 and 2, 5x5 stride 2, dilated, and a 7x7 window over a 5x16 map
      // (every row cut at the top or bottom, 6 of 16 columns at the edges)
      {{2, 32, 5, 18}, {32, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 32, true},
      {{1, 16, 7, 33}, {16, 1, 3, 3}, false, {2, 2}, {1, 1}, {1, 1}, 16, true},
      {{1, 48, 6, 35}, {48, 1, 5, 5}, true, {2, 2}, {2, 2}, {1, 1}, 48, true},
      {{1, 16, 6, 20}, {16, 1, 3, 3}, true, {1, 1}, {2, 2}, {2, 2}, 16, true},
      {{1, 16, 5, 16}, {16, 1, 7, 7}, true, {1, 1}, {3, 3}, {1, 1}, 16, true},
      // weight gradients summed transposed (16 to K output channels per group): maps of 256+
      // positions in bands, pointwise, two groups, channels-last, float64; small maps (one GEMM
      // over all threads) with up to 64 channels; and small maps with more, summed as dY @ X^T
      {{2, 16, 18, 16}, {32, 16, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},
      {{2, 64, 17, 16}, {16, 64, 1, 1}, false, {1, 1}, {0, 0}, {1, 1}, 1},
      {{2, 32, 17, 16}, {32, 16, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 2},
      {{2, 16, 18, 16}, {32, 16, 3, 3}, false, {1, 1}, {1, 1}, {1, 1}, 1, true},
      {{2, 16, 17, 16}, {24, 16, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1, false, DType::Float64},
      {{3, 16, 9, 9}, {32, 16, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},
      {{2, 16, 9, 9}, {80, 16, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},
      // strided 1x1 without padding (the pointwise paths over every stride-th row and column):
      // odd map, two groups, channels-last with unequal strides, float64
      {{2, 6, 9, 8}, {5, 6, 1, 1}, true, {2, 2}, {0, 0}, {1, 1}, 1},
      {{1, 8, 9, 9}, {4, 4, 1, 1}, true, {2, 2}, {0, 0}, {1, 1}, 2},
      {{2, 6, 7, 10}, {4, 6, 1, 1}, false, {2, 3}, {0, 0}, {1, 1}, 1, true},
      {{2, 3, 7, 6}, {4, 3, 1, 1}, true, {3, 2}, {0, 0}, {2, 2}, 1, false, DType::Float64},
  };
  std::ostringstream code;
  struct Ours {
    Tensor y, dx, dw, db;
  };
  std::vector<Ours> ours;
  for (size_t i = 0; i < cases.size(); ++i) {
    const ConvCase& c = cases[i];
    Tensor x = randn_of(c.x, c.dtype, 10 * i + 1);
    if (c.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
    x.requires_grad_();
    Tensor w = randn_of(c.w, c.dtype, 10 * i + 2).requires_grad_();
    Tensor b = c.bias ? randn_of({c.w[0]}, c.dtype, 10 * i + 3).requires_grad_() : Tensor();
    Tensor y = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
    Tensor r = randn_of(y.shape(), c.dtype, 10 * i + 4);
    sum(mul(y, r)).backward();
    EXPECT_EQ(y.suggest_memory_format() == MemoryFormat::ChannelsLast, c.channels_last) << conv_label(c);
    EXPECT_EQ(x.grad().suggest_memory_format() == MemoryFormat::ChannelsLast, c.channels_last) << conv_label(c);
    ours.push_back({y, x.grad(), w.grad(), c.bias ? b.grad() : Tensor()});
    code << "x = " << py_tensor(x) << ".requires_grad_()\nw = " << py_tensor(w) << ".requires_grad_()\n"
         << "b = " << (c.bias ? py_tensor(b) + ".requires_grad_()" : "None") << "\n"
         << "y = torch.nn.functional.conv2d(x, w, b, stride=" << py_pair(c.stride) << ", padding=" << py_pair(c.padding)
         << ", dilation=" << py_pair(c.dilation) << ", groups=" << c.groups << ")\n"
         << "(y * " << py_tensor(r) << ").sum().backward()\n"
         << "out += [y, x.grad, w.grad" << (c.bias ? ", b.grad" : "") << "]\n";
  }
  std::vector<Tensor> ref = torch_tensors(code.str());
  size_t k = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const ConvCase& c = cases[i];
    double tol = tol_for(c.dtype);
    ASSERT_LT(k + 2, ref.size());
    EXPECT_LE(relative_error(ours[i].y, ref[k++]), tol) << conv_label(c) << ": output";
    EXPECT_LE(relative_error(ours[i].dx, ref[k++]), tol) << conv_label(c) << ": grad input";
    EXPECT_LE(relative_error(ours[i].dw, ref[k++]), tol) << conv_label(c) << ": grad weight";
    if (c.bias) {
      EXPECT_LE(relative_error(ours[i].db, ref[k++]), tol) << conv_label(c) << ": grad bias";
    }
  }
  EXPECT_EQ(k, ref.size());
}

// Central differences of sum(conv2d(x, w, b) * r) in float64. The loss is linear in each
// argument, so the differences are exact up to rounding.
TEST(NnOps, Conv2dGradientsMatchFiniteDifferences) {
  std::vector<ConvCase> cases = {
      {{2, 4, 6, 5}, {6, 2, 3, 2}, true, {2, 1}, {1, 1}, {1, 2}, 2, false, DType::Float64},
      {{2, 3, 5, 5}, {6, 1, 3, 3}, true, {2, 2}, {1, 1}, {1, 1}, 3, true, DType::Float64},
      {{1, 3, 4, 4}, {2, 3, 1, 1}, true, {1, 1}, {0, 0}, {1, 1}, 1, false, DType::Float64},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const ConvCase& c = cases[i];
    Tensor x = randn_of(c.x, DType::Float64, 100 + i);
    if (c.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
    x.requires_grad_();
    Tensor w = randn_of(c.w, DType::Float64, 200 + i).requires_grad_();
    Tensor b = randn_of({c.w[0]}, DType::Float64, 300 + i).requires_grad_();
    auto loss = [&](const Tensor& r) {
      return sum(mul(conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups), r));
    };
    Tensor r;
    {
      NoGradGuard no_grad;
      r = randn_of(conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups).shape(), DType::Float64, 400 + i);
    }
    loss(r).backward();
    for (Tensor* t : {&x, &w, &b}) {
      Tensor analytic = t->grad();
      std::vector<double> num;
      for (int64_t e = 0; e < t->numel(); ++e) {
        Shape idx(t->dim());
        int64_t rem = e, off = t->storage_offset();
        for (int64_t d = t->dim() - 1; d >= 0; --d) {
          idx[d] = rem % t->shape()[d];
          rem /= t->shape()[d];
          off += idx[d] * t->strides()[d];
        }
        double* p = static_cast<double*>(t->storage()->data()) + off;
        double orig = *p, h = 1e-6;
        NoGradGuard no_grad;
        *p = orig + h;
        double lp = loss(r).item<double>();
        *p = orig - h;
        double lm = loss(r).item<double>();
        *p = orig;
        num.push_back((lp - lm) / (2 * h));
      }
      EXPECT_LE(relative_error(analytic, tensor<double>(num, t->shape())), 1e-7) << conv_label(c);
    }
  }
}

TEST(NnOps, Conv1dAndUnbatchedConv2dMatchTorch) {
  Tensor x1 = randn_of({2, 4, 11}, DType::Float32, 1), w1 = randn_of({6, 2, 3}, DType::Float32, 2);
  Tensor b1 = randn_of({6}, DType::Float32, 3);
  Tensor x2 = randn_of({3, 6, 5}, DType::Float32, 4), w2 = randn_of({2, 3, 3, 2}, DType::Float32, 5);
  Tensor y1 = conv1d(x1, w1, b1, 2, 1, 2, 2);
  Tensor y2 = conv2d(x2, w2, Tensor(), {1, 1}, {1, 0});
  std::vector<Tensor> ref = torch_tensors(
      "out.append(torch.nn.functional.conv1d(" + py_tensor(x1) + ", " + py_tensor(w1) + ", " + py_tensor(b1) +
      ", stride=2, padding=1, dilation=2, groups=2))\n" + "out.append(torch.nn.functional.conv2d(" + py_tensor(x2) +
      ", " + py_tensor(w2) + ", padding=(1, 0)))");
  ASSERT_EQ(ref.size(), 2u);
  EXPECT_LE(relative_error(y1, ref[0]), 1e-5);
  EXPECT_LE(relative_error(y2, ref[1]), 1e-5);
}

// The CPU kernels split work over threads so that every element is computed the same way.
TEST(NnOps, Conv2dDoesNotDependOnThreadCount) {
  int threads = get_num_threads();
  // Batch 9 splits samples over threads; batch 1 leaves the threads to the GEMM.
  // 7x7 maps of 64 channels take the positions as rows where the CPU has that kernel; 28x28 maps
  // of 16 channels Winograd, in rounds of 2 samples each thread its own at batch 9 (forward and
  // input gradient), one round split over the threads at batch 1.
  auto run = [](int n, int64_t batch, int64_t channels, int64_t h, int64_t w_) {
    set_num_threads(n);
    Tensor x = randn_of({batch, channels, h, w_}, DType::Float32, 7).requires_grad_();
    Tensor w = randn_of({2 * channels, channels, 3, 3}, DType::Float32, 8).requires_grad_();
    Tensor b = randn_of({2 * channels}, DType::Float32, 9).requires_grad_();
    Tensor y = conv2d(x, w, b, {1, 1}, {1, 1});
    sum(mul(y, y)).backward();
    return std::vector<std::vector<double>>{y.to_vector(), x.grad().to_vector(), w.grad().to_vector()};
  };
  for (int64_t batch : {9, 1})
    for (const auto& [channels, h, w] :
         {std::array<int64_t, 3>{8, 10, 9}, std::array<int64_t, 3>{64, 7, 7}, std::array<int64_t, 3>{16, 28, 28}}) {
      auto one = run(1, batch, channels, h, w), three = run(3, batch, channels, h, w);
      for (size_t i = 0; i < one.size(); ++i)
        EXPECT_EQ(one[i], three[i]) << "batch " << batch << ", map " << h << "x" << w << ", tensor " << i;
    }
  set_num_threads(threads);
}

// float16 and bfloat16 are computed in float32: the result is the float32 result rounded. The
// 1x1 output makes sum()'s gradient an expanded (stride-0) tensor, which the backward copies.
TEST(NnOps, Conv2dHalfTypesAndExpandedGradients) {
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    Tensor x = randn_of({2, 3, 5, 5}, DType::Float32, 1).to(dt).requires_grad_();
    Tensor w = randn_of({4, 3, 5, 5}, DType::Float32, 2).to(dt).requires_grad_();
    Tensor x32 = x.detach().to(DType::Float32).requires_grad_(), w32 = w.detach().to(DType::Float32).requires_grad_();
    Tensor y = conv2d(x, w), y32 = conv2d(x32, w32);
    ASSERT_EQ(y.dtype(), dt);
    sum(y).backward();
    sum(y32).backward();
    double tol = dt == DType::Float16 ? 1e-3 : 1e-2;  // one rounding of the result
    EXPECT_LE(relative_error(y, y32), tol) << dtype_name(dt);
    EXPECT_LE(relative_error(x.grad(), x32.grad()), tol) << dtype_name(dt);
    EXPECT_LE(relative_error(w.grad(), w32.grad()), tol) << dtype_name(dt);
  }
}

// Expects f to throw a tvc::Error whose message holds each of parts.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(NnOps, Conv2dRejectsBadShapes) {
  Tensor x = randn_of({2, 4, 5, 5}, DType::Float32, 1);
  expect_error(
      [&] {
        conv2d(x, randn_of({3, 3, 3, 3}, DType::Float32, 2));
      },
      {"conv2d", "weight", "[3, 3, 3, 3]", "[2, 4, 5, 5]"});
  expect_error(
      [&] {
        conv2d(x, randn_of({3, 2, 3, 3}, DType::Float32, 2), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2);
      },
      {"conv2d", "groups", "[3, 2, 3, 3]"});
  expect_error([&] { conv2d(x, randn_of({3, 4, 7, 3}, DType::Float32, 2)); }, {"conv2d", "kernel", "[2, 4, 5, 5]"});
  expect_error(
      [&] {
        conv2d(x.flatten(2), randn_of({3, 4, 3}, DType::Float32, 2));
      },
      {"conv2d", "weight", "[3, 4, 3]"});
  expect_error(
      [&] {
        conv2d(x, randn_of({3, 4, 3, 3}, DType::Float32, 2), randn_of({4}, DType::Float32, 3));
      },
      {"conv2d", "bias", "[4]"});
  expect_error(
      [&] {
        conv1d(x.flatten(2), randn_of({3, 2, 3}, DType::Float32, 2));
      },
      {"conv1d", "weight", "[3, 2, 3]"});
  expect_error([&] { max_pool2d(x, {2, 2}, std::nullopt, {2, 2}); }, {"max_pool2d", "padding"});
  expect_error([&] { avg_pool2d(x, {7, 7}); }, {"avg_pool2d", "[2, 4, 5, 5]"});
}

// A 1x1 convolution of 1x1 maps (a squeeze-excitation's squeeze and excitation), several samples
// side by side and one alone, grouped or not, is a linear layer of each sample's channels: its
// values against float64's linear (float32 within 1e-6, float64 1e-14), plain and with an
// epilogue.
TEST(NnOps, Conv2dOfOnePositionMapsIsALinearLayerOfEachSample) {
  struct Case {
    int64_t N, C, O, groups;
  };
  for (DType dt : {DType::Float32, DType::Float64})
    for (const Case& c : {Case{1, 40, 96, 1}, Case{2, 40, 96, 1}, Case{3, 1152, 48, 1}, Case{8, 48, 1152, 1},
                          Case{5, 8, 32, 1}, Case{4, 24, 16, 2}}) {
      const std::string where = cat_str("N ", c.N, " C ", c.C, " O ", c.O, " groups ", c.groups, " ", dtype_name(dt));
      const int64_t Cg = c.C / c.groups, Og = c.O / c.groups;
      const Tensor x = randn_of({c.N, c.C, 1, 1}, dt, 21), w = randn_of({c.O, Cg, 1, 1}, dt, 22);
      const Tensor bias = randn_of({c.O}, dt, 23), scale = randn_of({c.O}, dt, 24);
      // float64: each group's channels through its rows of the weight
      std::vector<Tensor> parts;
      for (int64_t g = 0; g < c.groups; ++g)
        parts.push_back(linear(x.to(DType::Float64).reshape({c.N, c.C}).narrow(1, g * Cg, Cg),
                               w.to(DType::Float64).reshape({c.O, Cg}).narrow(0, g * Og, Og)));
      const Tensor sums = cat(parts, 1).reshape({c.N, c.O, 1, 1});
      const Tensor b64 = bias.to(DType::Float64).view({1, c.O, 1, 1}),
                   s64 = scale.to(DType::Float64).view({1, c.O, 1, 1});
      const double tol = dt == DType::Float32 ? 1e-6 : 1e-14;
      NoGradGuard no_grad;
      EXPECT_LE(relative_error(conv2d(x, w, bias, {1, 1}, {0, 0}, {1, 1}, c.groups).to(DType::Float64), sums + b64),
                tol)
          << where;
      const Tensor affine = sums * s64 + b64;
      EXPECT_LE(relative_error(conv2d_epilogue(x, w, scale, bias, Tensor(), EpilogueActivation::SiLU, {1, 1}, {0, 0},
                                               {1, 1}, c.groups)
                                   .to(DType::Float64),
                               affine * sigmoid(affine)),
                tol)
          << where;
    }
}

// The fused epilogue kernel (no autograd) against the separate ops (autograd recording), in
// float32, float64 and bfloat16 (its GEMM form; against float64), over the kernel's paths: pointwise and 3x3 GEMMs (in
// place, the epilogue inside the GEMM on one or several threads, and several samples per GEMM on small maps), grouped,
// depthwise (the float32 flat path, stride 1 and 2, short and long rows, and float64's direct loops), NCHW and
// channels-last inputs and outputs, a residual in either layout or strided.
TEST(NnOps, Conv2dEpilogueEqualsTheSeparateOps) {
  struct Case {
    const char* label;
    Shape x, w;
    std::array<int64_t, 2> stride, padding;
    int64_t groups;
  };
  const std::vector<Case> cases{
      {"pointwise", {2, 6, 5, 7}, {5, 6, 1, 1}, {1, 1}, {0, 0}, 1},
      // a 1x1 map (squeeze-excitation): one column of contiguous channels, its epilogue in one call
      {"squeeze-excitation", {2, 40, 1, 1}, {96, 40, 1, 1}, {1, 1}, {0, 0}, 1},
      {"3x3", {1, 4, 9, 8}, {6, 4, 3, 3}, {1, 1}, {1, 1}, 1},
      // several threads and K, N blocks in the GEMM
      {"large", {1, 32, 20, 24}, {80, 32, 3, 3}, {1, 1}, {1, 1}, 1},
      {"small maps", {12, 3, 4, 4}, {5, 3, 3, 3}, {2, 2}, {1, 1}, 1},
      {"grouped", {2, 4, 6, 5}, {6, 2, 3, 3}, {1, 1}, {1, 1}, 2},
      {"depthwise", {2, 5, 9, 7}, {5, 1, 3, 3}, {1, 1}, {1, 1}, 5},
      {"depthwise stride 2", {1, 4, 9, 10}, {8, 1, 5, 5}, {2, 2}, {2, 2}, 4},
      // rows of 16 and more: the epilogue row by row on the way out
      {"depthwise wide rows", {1, 3, 6, 40}, {3, 1, 3, 3}, {1, 1}, {1, 1}, 3},
      {"depthwise wide stride 2", {2, 3, 9, 36}, {3, 1, 5, 5}, {2, 2}, {2, 2}, 3},
      // blocks of 16 channels (a partial one; at least 16 blocks, two per thread up to 8 threads;
      // float32 NCHW stride 1 without a residual: the planes where the CPU has their kernel)
      {"depthwise channel blocks", {4, 68, 7, 7}, {68, 1, 5, 5}, {1, 1}, {2, 2}, 68},
      {"depthwise channel blocks stride 2", {4, 72, 9, 8}, {72, 1, 3, 3}, {2, 2}, {1, 1}, 72},
      // input rows of a whole tile and more: transposed row by row
      {"depthwise channel blocks wide rows", {2, 136, 5, 20}, {136, 1, 3, 3}, {1, 1}, {1, 1}, 136},
      // whole blocks and rows of 16 outputs and more: channels-last ones read in place
      {"depthwise whole blocks", {2, 32, 6, 20}, {32, 1, 3, 3}, {1, 1}, {1, 1}, 32},
      {"depthwise whole blocks stride 2", {1, 48, 9, 34}, {48, 1, 5, 5}, {2, 2}, {2, 2}, 48}};
  const EpilogueActivation acts[] = {EpilogueActivation::None, EpilogueActivation::ReLU, EpilogueActivation::ReLU6,
                                     EpilogueActivation::SiLU, EpilogueActivation::Hardswish};
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16})
    for (const Case& c : cases)
      for (bool channels_last : {false, true})
        for (int residual_kind = 0; residual_kind < 4; ++residual_kind)  // none, NCHW, channels-last, strided
          for (EpilogueActivation act : acts) {
            const std::string where = cat_str(c.label, channels_last ? " channels-last" : "", " residual ",
                                              residual_kind, " ", to_string(act), " ", dtype_name(dt));
            Tensor x = (randn_of(c.x, dt, 1) * 2)
                           .contiguous(channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
            Tensor w = randn_of(c.w, dt, 2), scale = randn_of({c.w[0]}, dt, 3), shift = randn_of({c.w[0]}, dt, 4) * 3;
            Tensor plain = conv2d(x, w, Tensor(), c.stride, c.padding, {1, 1}, c.groups);
            Tensor residual;
            if (residual_kind == 1) residual = randn_of(plain.shape(), dt, 5);
            if (residual_kind == 2) residual = randn_of(plain.shape(), dt, 5).contiguous(MemoryFormat::ChannelsLast);
            if (residual_kind == 3)
              residual = randn_of(plain.shape(), dt, 5).transpose(2, 3).contiguous().transpose(2, 3);
            Tensor fused;
            {
              NoGradGuard no_grad;
              fused = conv2d_epilogue(x, w, scale, shift, residual, act, c.stride, c.padding, {1, 1}, c.groups);
            }
            // bfloat16 (float32 sums, the epilogue in float32, one rounding at the end) against the
            // float64 ops on the same bfloat16 values: within the output's rounding (2^-9 relative).
            const bool bf16 = dt == DType::BFloat16;
            auto wide = [&](const Tensor& t) { return bf16 && t.defined() ? t.to(DType::Float64) : t; };
            Tensor separate = conv2d_epilogue(wide(x), wide(w), wide(scale).detach().requires_grad_(), wide(shift),
                                              wide(residual), act, c.stride, c.padding, {1, 1}, c.groups);
            ASSERT_TRUE(separate.requires_grad()) << where;  // the composed path
            EXPECT_EQ(fused.shape(), plain.shape()) << where;
            EXPECT_EQ(fused.dtype(), dt) << where;
            EXPECT_EQ(fused.suggest_memory_format(), plain.suggest_memory_format()) << where;
            EXPECT_LE(relative_error(wide(fused), separate.detach()), dt == DType::Float32 ? 1e-6
                                                                      : bf16               ? 3e-3
                                                                                           : 1e-14)
                << where;
          }
}

bool same_bits(const Tensor& a, const Tensor& b) { return a.shape() == b.shape() && a.to_vector() == b.to_vector(); }

// A channels-last depthwise convolution read in place (whole blocks of 16 channels, rows of 16
// outputs and more) leaves out the taps over the padding; the NCHW paths add them as zeros: the
// same sums, the same bits, for the conv2d_epilogue cases of fused activations too.
TEST(NnOps, DepthwiseChannelsLastGivesTheBitsOfNchw) {
  struct Case {
    Shape x;
    int64_t k, stride, padding, dilation;
  };
  // Stride 1 without dilation goes through whole rows (depthwise_channel_rows on AVX-512: groups of
  // 16 and 8 outputs, a last one part-stored, the ends' taps left out): windows 3, 5 and 7 wide,
  // rows of 16, 18, 41 and 57 outputs.
  for (const Case& c :
       {Case{{2, 32, 5, 18}, 3, 1, 1, 1}, Case{{1, 48, 6, 35}, 5, 2, 2, 1}, Case{{1, 16, 6, 20}, 3, 1, 2, 2},
        Case{{1, 16, 5, 16}, 7, 1, 3, 1}, Case{{1, 32, 6, 41}, 5, 1, 2, 1}, Case{{2, 16, 9, 57}, 7, 1, 3, 1}}) {
    const int64_t C = c.x[1];
    const Tensor x = randn_of(c.x, DType::Float32, 3), w = randn_of({C, 1, c.k, c.k}, DType::Float32, 4);
    const Tensor scale = randn_of({C}, DType::Float32, 5), shift = randn_of({C}, DType::Float32, 6);
    const Tensor x_cl = x.contiguous(MemoryFormat::ChannelsLast);
    NoGradGuard no_grad;
    const std::string where = cat_str("x ", shape_str(c.x), " k ", c.k, " stride ", c.stride);
    EXPECT_TRUE(
        same_bits(conv2d(x_cl, w, shift, {c.stride, c.stride}, {c.padding, c.padding}, {c.dilation, c.dilation}, C),
                  conv2d(x, w, shift, {c.stride, c.stride}, {c.padding, c.padding}, {c.dilation, c.dilation}, C)))
        << where;
    for (EpilogueActivation act : {EpilogueActivation::ReLU6, EpilogueActivation::SiLU})
      EXPECT_TRUE(same_bits(conv2d_epilogue(x_cl, w, scale, shift, Tensor(), act, {c.stride, c.stride},
                                            {c.padding, c.padding}, {c.dilation, c.dilation}, C),
                            conv2d_epilogue(x, w, scale, shift, Tensor(), act, {c.stride, c.stride},
                                            {c.padding, c.padding}, {c.dilation, c.dilation}, C)))
          << where << " " << to_string(act);
  }
}

// Stride-1 depthwise convolutions that keep the map's size, and 2x2 and 3x3 ones of stride 2 (5x5
// on rows of more than 8 outputs; inputs up to 16 MB), on dense NCHW planes take the planes paths
// where the CPU has their kernels (AVX-512), in vectors of positions across rows (stride 2: of
// columns, two rows to a vector when they have up to 8, each tap picked from its rows' windows of
// three or four loads, the last taps' columns from the last), the taps outside the map masked:
// against float64 (the bias alone, and the whole epilogue with each activation), maps narrower
// and wider than a vector and not a multiple of it, 3x3 to 7x7 and a dilated 3x3, several
// samples, odd channel counts (the kernels take two planes at a time, the last alone); the same
// bits on 1, 2 and 3 threads.
TEST(NnOps, DepthwisePlanesMatchFloat64) {
  struct Case {
    Shape x;
    int64_t k, dilation, stride;
  };
  const int threads = get_num_threads();
  NoGradGuard no_grad;
  for (const Case& c : {Case{{2, 5, 7, 7}, 3, 1, 1}, Case{{1, 6, 14, 14}, 5, 1, 1}, Case{{3, 4, 9, 17}, 3, 1, 1},
                        Case{{1, 3, 20, 33}, 7, 1, 1}, Case{{2, 4, 11, 13}, 3, 2, 1}, Case{{2, 5, 7, 7}, 3, 1, 2},
                        Case{{1, 6, 14, 14}, 3, 1, 2}, Case{{3, 3, 9, 17}, 3, 1, 2}, Case{{1, 3, 20, 70}, 3, 1, 2},
                        Case{{1, 4, 18, 31}, 3, 1, 2}, Case{{1, 5, 20, 40}, 5, 1, 2}, Case{{2, 3, 19, 33}, 5, 1, 2},
                        Case{{1, 3, 12, 69}, 5, 1, 2}, Case{{1, 3, 9, 40}, 2, 1, 2}, Case{{2, 3, 9, 9}, 2, 1, 2}}) {
    const int64_t C = c.x[1], pad = c.k / 2 * c.dilation;
    const std::string where = cat_str("x ", shape_str(c.x), " k ", c.k, " dilation ", c.dilation, " stride ", c.stride);
    const Tensor x = randn_of(c.x, DType::Float32, 11), w = randn_of({C, 1, c.k, c.k}, DType::Float32, 12);
    const Tensor scale = randn_of({C}, DType::Float32, 13), shift = randn_of({C}, DType::Float32, 14);
    const Tensor x64 = x.to(DType::Float64), w64 = w.to(DType::Float64);
    const Tensor plain64 = conv2d(x64, w64, Tensor(), {c.stride, c.stride}, {pad, pad}, {c.dilation, c.dilation}, C);
    const Tensor affine64 =
        plain64 * scale.to(DType::Float64).view({1, C, 1, 1}) + shift.to(DType::Float64).view({1, C, 1, 1});
    {
      KernelProfiler profiler;
      const Tensor y = conv2d(x, w, shift, {c.stride, c.stride}, {pad, pad}, {c.dilation, c.dilation}, C);
      ASSERT_EQ(profiler.records().size(), 1u) << where;
      if (cpu::has_depthwise_planes_kernel()) {
        EXPECT_EQ(profiler.records()[0].path, c.stride == 1 ? "depthwise planes" : "depthwise planes, stride 2")
            << where;
      }
      EXPECT_LE(relative_error(y.to(DType::Float64), plain64 + shift.to(DType::Float64).view({1, C, 1, 1})), 2e-6)
          << where;
    }
    const std::vector<std::pair<EpilogueActivation, Tensor>> activations = {
        {EpilogueActivation::None, affine64},
        {EpilogueActivation::ReLU6, clamp(affine64, 0.0, 6.0)},
        {EpilogueActivation::SiLU, affine64 * sigmoid(affine64)},
        {EpilogueActivation::Hardswish, affine64 * clamp(affine64 + 3.0, 0.0, 6.0) / 6.0}};
    for (const auto& [act, want] : activations) {
      Tensor first;
      for (int t : {1, 2, 3}) {
        set_num_threads(t);
        const Tensor y = conv2d_epilogue(x, w, scale, shift, Tensor(), act, {c.stride, c.stride}, {pad, pad},
                                         {c.dilation, c.dilation}, C);
        if (t == 1) {
          first = y;
          EXPECT_LE(relative_error(y.to(DType::Float64), want), 4e-6) << where << " " << to_string(act);
        } else {
          EXPECT_TRUE(same_bits(y, first)) << where << " " << to_string(act) << " threads " << t;
        }
      }
    }
  }
  set_num_threads(threads);
}

// A global average pool of a dense channels-last input reads it along its rows, many channels at
// a time, with the planes' order of sums: the same bits as the NCHW input's, for adaptive and
// plain average pooling, chunks of channels whole and partial, float32 and float64.
TEST(NnOps, GlobalAveragePoolOfChannelsLastGivesTheBitsOfNchw) {
  for (DType dt : {DType::Float32, DType::Float64})
    for (const Shape& shape : {Shape{3, 96, 9, 11}, Shape{2, 200, 5, 7}, Shape{1, 70, 1, 13}, Shape{2, 16, 3, 3}}) {
      const Tensor x = randn_of(shape, dt, 7), x_cl = x.contiguous(MemoryFormat::ChannelsLast);
      NoGradGuard no_grad;
      EXPECT_TRUE(same_bits(adaptive_avg_pool2d(x_cl, {1, 1}), adaptive_avg_pool2d(x, {1, 1})))
          << shape_str(shape) << " " << dtype_name(dt);
      EXPECT_TRUE(same_bits(avg_pool2d(x_cl, {shape[2], shape[3]}), avg_pool2d(x, {shape[2], shape[3]})))
          << shape_str(shape) << " " << dtype_name(dt);
    }
}

// A global average pool of dense NCHW planes (also a slice of a tensor's channels, and adaptive or
// plain average pooling alike) sums each plane as one run in 8 lanes, value q into lane q % 8 in
// order, the lanes combined ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), then divides by its size:
// those bits, for float32 and float64, maps smaller and larger than the lanes.
template <typename T>
std::vector<double> plane_means_in_lanes(const std::vector<double>& values, int64_t planes, int64_t positions) {
  std::vector<double> means(planes);
  for (int64_t p = 0; p < planes; ++p) {
    T lanes[8] = {};
    for (int64_t q = 0; q < positions; ++q) lanes[q % 8] += static_cast<T>(values[p * positions + q]);
    const T sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    means[p] = sum / static_cast<T>(positions);
  }
  return means;
}
TEST(NnOps, GlobalAveragePoolOfDensePlanesSumsEachPlaneInLanes) {
  for (DType dt : {DType::Float32, DType::Float64})
    for (const Shape& shape : {Shape{3, 5, 7, 7}, Shape{2, 9, 1, 13}, Shape{1, 3, 4, 2}, Shape{8, 40, 14, 14}})
      for (bool slice : {false, true}) {
        const Tensor whole = randn_of({shape[0], shape[1] + 3, shape[2], shape[3]}, dt, 8);
        const Tensor x = slice ? whole.narrow(1, 2, shape[1]) : whole.narrow(1, 0, shape[1]).contiguous();
        const std::string where = cat_str(shape_str(shape), slice ? " channel slice " : " ", dtype_name(dt));
        NoGradGuard no_grad;
        const int64_t planes = shape[0] * shape[1], positions = shape[2] * shape[3];
        const std::vector<double> values = x.contiguous().to_vector();
        const std::vector<double> want = dt == DType::Float32 ? plane_means_in_lanes<float>(values, planes, positions)
                                                              : plane_means_in_lanes<double>(values, planes, positions);
        EXPECT_EQ(adaptive_avg_pool2d(x, {1, 1}).to_vector(), want) << where;
        EXPECT_EQ(avg_pool2d(x, {shape[2], shape[3]}).to_vector(), want) << where;
      }
}

// A Linear's result is a tensor of its own, not a view of the kernel's output: an in-place ReLU
// on it under autograd (VGG's classifier, Linear then ReLU(inplace=True)) runs, with the
// gradients of the out-of-place ReLU, for 2-d and 3-d inputs, float32 and float64.
TEST(NnOps, LinearResultTakesInPlaceOpsUnderAutograd) {
  for (DType dtype : {DType::Float32, DType::Float64})
    for (const Shape& x_shape : {Shape{3, 8}, Shape{2, 3, 8}}) {
      const Tensor x0 = randn(x_shape, {.dtype = dtype}), w0 = randn({5, 8}, {.dtype = dtype}),
                   b0 = randn({5}, {.dtype = dtype});
      Tensor grads[2][3];
      for (int inplace = 0; inplace < 2; ++inplace) {
        Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
        Tensor y = linear(x, w, b);
        if (inplace)
          y.relu_();
        else
          y = relu(y);
        (y * y).sum().backward();
        grads[inplace][0] = x.grad(), grads[inplace][1] = w.grad(), grads[inplace][2] = b.grad();
      }
      for (int k = 0; k < 3; ++k)
        EXPECT_EQ(grads[1][k].to_vector(), grads[0][k].to_vector()) << dtype_name(dtype) << " " << x_shape << " " << k;
    }
}

// A float32 linear without autograd reads its weight packed once and kept with the weight's
// storage: where the CPU has the 7-row kernel on 7-row tiles up to 256 rows and on gemm's tiles
// beyond, elsewhere on gemm's tiles. Its results (linear and linear_gelu; 9 to 1024 rows, a strided x, outputs past and
// short of a 64-column panel) are those of the recorded path (a weight that requires grad, packed by gemm on each call)
// bit for bit on every instruction set, taken in turn, follow in-place changes of the weight, and equal them with
// keeping switched off.
TEST(NnOps, LinearKeptWeightGivesTheBitsOfTheRecordedPath) {
  for (const auto& [rows, in, out] : {std::array<int64_t, 3>{9, 40, 70}, std::array<int64_t, 3>{49, 768, 100},
                                      std::array<int64_t, 3>{197, 130, 64}, std::array<int64_t, 3>{1024, 33, 17}})
    for (bool strided : {false, true}) {
      Tensor x = randn_of({rows, strided ? 2 * in : in}, DType::Float32, 1);
      if (strided) x = x.narrow(1, 0, in);
      Tensor w = randn_of({out, in}, DType::Float32, 2);
      const Tensor b = randn_of({out}, DType::Float32, 3);
      auto recorded = [&](bool with_gelu) {
        GradModeGuard grad(true);
        const Tensor leaf = w.detach().requires_grad_();  // (w's storage)
        return (with_gelu ? linear_gelu(x, leaf, b) : linear(x, leaf, b)).detach();
      };
      NoGradGuard no_grad;
      for (Isa isa : available_isas()) {
        set_isa(isa);
        const std::string where = cat_str(rows, " x ", in, " -> ", out, strided ? " strided " : " ", isa_name(isa));
        {
          const Tensor want = recorded(false);
          KernelProfiler profiler;
          const Tensor got = linear(x, w, b);
          const std::vector<KernelRecord> records = profiler.records();
          EXPECT_TRUE(same_bits(got, want)) << where;
          ASSERT_EQ(records.size(), 1u) << where;
          const char* path =
              cpu::has_rows_of_7_kernel() && rows <= 256 ? "kept weight, 7-row tiles" : "kept weight, gemm tiles";
          EXPECT_EQ(records[0].path, path) << where;
        }
        EXPECT_TRUE(same_bits(linear_gelu(x, w, b), recorded(true))) << where;
        EXPECT_TRUE(same_bits(linear(x, w, b), recorded(false))) << where;  // the kept weight
        w.mul_(-0.5);
        EXPECT_TRUE(same_bits(linear(x, w, b), recorded(false))) << where;
        set_keep_derived_data(false);  // nothing kept: gemm's own packing
        EXPECT_TRUE(same_bits(linear(x, w, b), recorded(false))) << where;
        set_keep_derived_data(true);
        EXPECT_LE(relative_error(linear(x, w, b).to(DType::Float64),
                                 linear(x.to(DType::Float64), w.to(DType::Float64), b.to(DType::Float64))),
                  2e-6)
            << where;
      }
      set_isa(available_isas().back());
    }
}

// A weight keeps one panel form (each a copy of the weight) where the CPU has the 7-row kernel:
// used first with few rows it keeps the 7-row panels, and a later call of more than 256 rows
// takes gemm; used first with many rows it keeps gemm's panels, which a later call of few rows
// reads. Every call has the bits of the recorded path, on every instruction set (without the
// 7-row kernel: gemm's panels for both).
TEST(NnOps, LinearWeightKeepsOnePanelForm) {
  const Tensor few = randn_of({49, 96}, DType::Float32, 1), many = randn_of({300, 96}, DType::Float32, 2);
  const Tensor b = randn_of({80}, DType::Float32, 3);
  NoGradGuard no_grad;
  uint64_t seed = 4;
  for (Isa isa : available_isas()) {
    set_isa(isa);
    for (bool few_first : {true, false}) {
      const Tensor w = randn_of({80, 96}, DType::Float32, ++seed);  // nothing kept yet
      const Tensor leaf = w.detach().requires_grad_();
      std::vector<std::string> paths;
      for (const Tensor& x : few_first ? std::vector<Tensor>{few, many} : std::vector<Tensor>{many, few}) {
        Tensor want;
        {
          GradModeGuard grad(true);
          want = linear(x, leaf, b).detach();
        }
        KernelProfiler profiler;
        const Tensor got = linear(x, w, b);
        const std::vector<KernelRecord> records = profiler.records();
        ASSERT_EQ(records.size(), 1u);
        paths.push_back(records[0].path);
        EXPECT_TRUE(same_bits(got, want)) << x.shape() << " " << isa_name(isa);
      }
      std::vector<std::string> expected{"kept weight, gemm tiles", "kept weight, gemm tiles"};
      if (cpu::has_rows_of_7_kernel())
        expected = few_first ? std::vector<std::string>{"kept weight, 7-row tiles", "gemm"}
                             : std::vector<std::string>{"kept weight, gemm tiles", "kept weight, gemm tiles"};
      EXPECT_EQ(paths, expected) << isa_name(isa) << (few_first ? " few rows first" : " many rows first");
    }
  }
  set_isa(available_isas().back());
}

// Each instruction set keeps gemm's panels of its own width (32, 16 or 8 columns): one weight used
// under every set in turn, unchanged between them, gives each set the bits of gemm packing the
// weight on each call (a set reading another's panels would not).
TEST(NnOps, LinearKeptPanelsOfEachInstructionSetAreItsOwn) {
  const Tensor x = randn_of({300, 96}, DType::Float32, 1), w = randn_of({80, 96}, DType::Float32, 2);
  const Tensor b = randn_of({80}, DType::Float32, 3);
  NoGradGuard no_grad;
  std::vector<Tensor> kept;
  for (Isa isa : available_isas()) {
    set_isa(isa);
    KernelProfiler profiler;
    kept.push_back(linear(x, w, b));
    const std::vector<KernelRecord> records = profiler.records();
    ASSERT_EQ(records.size(), 1u);
    EXPECT_EQ(records[0].path, "kept weight, gemm tiles") << isa_name(isa);
  }
  set_keep_derived_data(false);
  for (size_t i = 0; i < available_isas().size(); ++i) {
    set_isa(available_isas()[i]);
    EXPECT_TRUE(same_bits(kept[i], linear(x, w, b))) << isa_name(available_isas()[i]);
  }
  set_keep_derived_data(true);
  set_isa(available_isas().back());
}

// A training forward (grad mode on, the weight requires grad) keeps no form of its weight, since
// each optimizer step changes it: a linear layer's packed panels and a convolution's Winograd
// transform are made for the call only; the same calls without grad keep them (and the forward
// then reads them), with the same bits.
TEST(NnOps, TrainingForwardKeepsNoWeightForm) {
  const Tensor x = randn_of({300, 96}, DType::Float32, 1), b = randn_of({80}, DType::Float32, 3);
  const Tensor image = randn_of({1, 32, 24, 24}, DType::Float32, 4), bias = randn_of({32}, DType::Float32, 5);
  const cpu::WeightForm panels = cpu::standard_panels_form(cpu::gemm_tile_columns());
  struct Case {
    const char* label;
    Tensor weight;
    std::function<Tensor(const Tensor&)> forward;
    std::function<bool(const Tensor&)> kept;
    std::string path;  // of the calls without grad
  };
  const std::vector<Case> cases{
      {"linear", randn_of({80, 96}, DType::Float32, 2), [&](const Tensor& w) { return linear(x, w, b); },
       [&](const Tensor& w) { return cpu::has_weight_form(w, panels, 80, 96); }, "kept weight"},
      {"winograd conv2d", randn_of({32, 32, 3, 3}, DType::Float32, 6),
       [&](const Tensor& w) {
         return conv2d(image, w, bias, {1, 1}, {1, 1});
       },
       [&](const Tensor& w) { return cpu::has_weight_form(w, cpu::WeightForm::winograd, 32, 32 * 9); }, "winograd"}};
  for (const Case& c : cases) {
    const Tensor w = c.weight.detach().requires_grad_();
    const Tensor trained = c.forward(w);
    ASSERT_TRUE(trained.requires_grad()) << c.label;
    EXPECT_FALSE(c.kept(w)) << c.label;
    NoGradGuard no_grad;
    Tensor first;
    std::vector<KernelRecord> records;
    {
      KernelProfiler profiler;
      first = c.forward(w);
      records = profiler.records();
    }
    EXPECT_TRUE(same_bits(first, trained.detach())) << c.label;
    ASSERT_EQ(records.size(), 1u) << c.label;
    EXPECT_EQ(records[0].path.rfind(c.path, 0), 0u) << c.label << ": " << records[0].path;
    EXPECT_TRUE(c.kept(w)) << c.label;
    EXPECT_TRUE(same_bits(c.forward(w), trained.detach())) << c.label;  // from the kept form
  }
}

// A convolution through gemm (im2col or pointwise) reads its weight kept as gemm_a_panels' A where
// forms are kept (no grad), with the bits of gemm packing the weight on each call (keeping
// switched off), on every instruction set in turn, with the folded epilogue (scale, shift,
// residual, ReLU) that the kernels apply to whole tiles: 3x3 stride 2, pointwise with rows 4 KiB
// apart, samples side by side, two groups (a panel form per group), output channels short of a
// tile; after an in-place change of the weight, the new weight's bits. Where the call took gemm
// the panels are kept, and not in a training forward, nor for a channels-last input (its output's
// products are computed transposed, without them).
TEST(NnOps, Conv2dKeptWeightPanelsGiveTheBitsOfGemm) {
  struct Case {
    Shape x, w;
    int64_t stride, padding, groups;
    bool channels_last;
  };
  const Case cases[] = {{{1, 32, 15, 15}, {40, 32, 3, 3}, 2, 1, 1, false},
                        {{1, 1024, 5, 5}, {30, 1024, 1, 1}, 1, 0, 1, false},
                        {{3, 16, 7, 7}, {24, 16, 3, 3}, 1, 1, 1, false},
                        {{1, 16, 9, 9}, {20, 8, 3, 3}, 1, 1, 2, false},
                        {{2, 32, 15, 15}, {40, 32, 3, 3}, 2, 1, 1, true}};
  NoGradGuard no_grad;
  uint64_t seed = 1;
  for (Isa isa : available_isas()) {
    set_isa(isa);
    for (const Case& c : cases) {
      Tensor x = randn_of(c.x, DType::Float32, ++seed);
      if (c.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
      Tensor w = randn_of(c.w, DType::Float32, ++seed);
      const int64_t O = c.w[0], K = c.w[1] * c.w[2] * c.w[3], Og = O / c.groups;
      const Tensor scale = randn_of({O}, DType::Float32, ++seed), shift = randn_of({O}, DType::Float32, ++seed);
      const std::string where = cat_str(c.x, " * ", c.w, " stride ", c.stride, " groups ", c.groups,
                                        c.channels_last ? " channels-last " : " ", isa_name(isa));
      const int64_t out_map = (c.x[2] + 2 * c.padding - c.w[2]) / c.stride + 1;
      const Tensor residual = randn_of({c.x[0], O, out_map, out_map}, DType::Float32, ++seed);
      auto forward = [&] {
        return conv2d_epilogue(x, w, scale, shift, residual, EpilogueActivation::ReLU, {c.stride, c.stride},
                               {c.padding, c.padding}, {1, 1}, c.groups);
      };
      auto unkept = [&] {
        set_keep_derived_data(false);  // nothing kept: gemm packs the weight itself
        const Tensor y = forward();
        set_keep_derived_data(true);
        return y;
      };
      const cpu::WeightForm form = cpu::a_panels_form(cpu::gemm_tile_rows(), cpu::gemm_k_block());
      {
        GradModeGuard grad(true);
        const Tensor leaf = w.detach().requires_grad_();  // (w's storage)
        conv2d(x, leaf, Tensor(), {c.stride, c.stride}, {c.padding, c.padding}, {1, 1}, c.groups);
        EXPECT_FALSE(cpu::has_weight_form(w, form, Og, K)) << where;
      }
      const Tensor want = unkept();
      KernelProfiler profiler;
      const Tensor first = forward();
      const std::vector<KernelRecord> records = profiler.records();
      ASSERT_FALSE(records.empty()) << where;
      const bool took_gemm = records.back().path.find("gemm") != std::string::npos &&
                             records.back().path.find("position rows") == std::string::npos;
      EXPECT_EQ(cpu::has_weight_form(w, form, Og, K), took_gemm && !c.channels_last)
          << where << ": " << records.back().path;
      EXPECT_TRUE(same_bits(first, want)) << where;
      EXPECT_TRUE(same_bits(forward(), want)) << where;  // from the kept panels
      w.mul_(-0.5);
      EXPECT_TRUE(same_bits(forward(), unkept())) << where;
    }
  }
  set_isa(available_isas().back());
}

// A weight that is not contiguous (a channels-last model's, Module::to(ChannelsLast)) is read
// through a contiguous copy kept with its storage where forms are kept, so the forms made from the
// copy (Winograd's transformed weights, gemm's A panels) serve the next calls; a write to the
// weight frees the copy; without keeping each call copies. The convolutions' bits are those of the
// contiguous weight.
TEST(NnOps, ChannelsLastWeightKeepsItsContiguousCopyAndForms) {
  const Tensor x = randn_of({1, 32, 24, 24}, DType::Float32, 1);
  NoGradGuard no_grad;
  for (const Shape& shape : {Shape{32, 32, 3, 3}, Shape{48, 32, 3, 3}}) {
    const bool winograd = shape[0] == 32;
    const int64_t stride = winograd ? 1 : 2;  // stride 2: im2col + gemm's A panels
    Tensor w = randn_of(shape, DType::Float32, 2).contiguous(MemoryFormat::ChannelsLast);
    ASSERT_FALSE(w.is_contiguous());
    const std::string where = winograd ? "winograd" : "im2col";
    const Tensor want = conv2d(x, w.contiguous(), Tensor(), {stride, stride}, {1, 1});
    EXPECT_TRUE(same_bits(conv2d(x, w, Tensor(), {stride, stride}, {1, 1}), want)) << where;
    const Tensor copy = cpu::contiguous_weight(w, true);
    EXPECT_EQ(cpu::contiguous_weight(w, true).data_ptr<float>(), copy.data_ptr<float>()) << where;
    EXPECT_TRUE(same_bits(copy, w.contiguous())) << where;
    const int64_t K = shape[1] * 9;
    EXPECT_TRUE(winograd ? cpu::has_weight_form(copy, cpu::WeightForm::winograd, shape[0], K)
                         : cpu::has_weight_form(copy, cpu::a_panels_form(cpu::gemm_tile_rows(), cpu::gemm_k_block()),
                                                shape[0], K))
        << where;
    EXPECT_TRUE(same_bits(conv2d(x, w, Tensor(), {stride, stride}, {1, 1}), want)) << where;  // from the kept forms
    const Tensor unkept = cpu::contiguous_weight(w, false);
    EXPECT_NE(unkept.data_ptr<float>(), copy.data_ptr<float>()) << where;
    w.mul_(-0.5);
    const Tensor changed = cpu::contiguous_weight(w, true);
    EXPECT_NE(changed.data_ptr<float>(), copy.data_ptr<float>()) << where;
    EXPECT_TRUE(same_bits(changed, w.contiguous())) << where;
    EXPECT_TRUE(same_bits(conv2d(x, w, Tensor(), {stride, stride}, {1, 1}),
                          conv2d(x, w.contiguous(), Tensor(), {stride, stride}, {1, 1})))
        << where;
  }
}

// A linear without a bias where autograd does not record is the linear kernel too (Swin's patch
// merging: its kept weight), with the bits of matmul(x, weight^T) (what it runs with autograd):
// few rows (dot products), the kept weight's rows, gemm's, 2-d and 4-d x, float32 and float64.
TEST(NnOps, LinearWithoutBiasTakesTheKernelWithTheBitsOfMatmul) {
  for (const Shape& x_shape : {Shape{5, 40}, Shape{49, 96}, Shape{1, 14, 14, 136}, Shape{1024, 33}})
    for (DType dt : {DType::Float32, DType::Float64}) {
      const std::string where = cat_str(x_shape, " ", dtype_name(dt));
      const Tensor x = randn_of(x_shape, dt, 1), w = randn_of({70, x_shape.back()}, dt, 2);
      Tensor y;
      {
        NoGradGuard no_grad;
        KernelProfiler profiler;
        y = linear(x, w);
        ASSERT_EQ(profiler.records().size(), 1u) << where;
        EXPECT_EQ(profiler.records()[0].op, "linear") << where;
      }
      EXPECT_TRUE(same_bits(y, matmul(x, w.t()))) << where;
      const Tensor leaf = w.detach().requires_grad_();
      const Tensor recorded = linear(x, leaf);
      ASSERT_TRUE(recorded.requires_grad()) << where;
      EXPECT_TRUE(same_bits(recorded.detach(), y)) << where;
    }
}

// linear_gelu in inference (one kernel: the bias and the GELU applied to the product's blocks)
// gives the separate linear and gelu ops' values bit for bit, in float32 (on every instruction
// set) and float64, for shapes with one or several GEMM blocks, a strided x and a transposed
// weight; with autograd it is the separate ops with their gradients; a Sequential's Linear then
// GELU takes it without grad, and the plain forwards with a hook on either module.
TEST(NnOps, LinearGeluEqualsTheSeparateOps) {
  auto identical = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.to_vector() == b.to_vector();
  };
  struct Case {
    const char* label;
    Shape x;
    int64_t out;
  };
  const std::vector<Case> cases{
      {"small", {3, 5}, 4}, {"3-d rows", {2, 7, 37}, 21}, {"several blocks", {5, 120, 70}, 700}, {"1-d", {9}, 40}};
  for (Isa isa : available_isas()) {
    set_isa(isa);
    for (DType dt : {DType::Float32, DType::Float64})
      for (const Case& c : cases)
        for (bool strided : {false, true}) {
          const std::string where =
              cat_str(c.label, strided ? " strided" : "", " ", dtype_name(dt), " ", isa_name(isa));
          Tensor x = randn_of(c.x, dt, 1) * 2;
          Tensor w = randn_of({c.out, c.x.back()}, dt, 2), b = randn_of({c.out}, dt, 3);
          if (strided) {
            x = x.unsqueeze(-1)
                    .expand([&] {
                      Shape s = c.x;
                      s.push_back(2);
                      return s;
                    }())
                    .contiguous()
                    .select(-1, 1);
            w = w.t().contiguous().t();
          }
          Tensor fused;
          {
            NoGradGuard no_grad;
            KernelProfiler profiler;
            fused = linear_gelu(x, w, b);
            // One kernel: the fused linear, no separate gelu (or add) after it.
            ASSERT_EQ(profiler.records().size(), 1u) << where;
            EXPECT_EQ(profiler.records()[0].op, "linear") << where;
          }
          const Tensor separate = gelu(linear(x, w, b));
          EXPECT_EQ(fused.shape(), separate.shape()) << where;
          EXPECT_TRUE(identical(fused, separate.detach())) << where << ": " << relative_error(fused, separate);
        }
  }
  set_isa(available_isas().back());
  // With autograd: the separate ops' values and gradients.
  const Tensor x = randn_of({4, 6}, DType::Float64, 4).requires_grad_(), w = randn_of({5, 6}, DType::Float64, 5),
               b = randn_of({5}, DType::Float64, 6).requires_grad_();
  const Tensor y = linear_gelu(x, w, b);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  const Tensor x2 = x.detach().requires_grad_(), b2 = b.detach().requires_grad_();
  gelu(linear(x2, w, b2)).sum().backward();
  EXPECT_LE(relative_error(x.grad(), x2.grad()), 1e-15);
  EXPECT_LE(relative_error(b.grad(), b2.grad()), 1e-15);
  // Sequential: fused without grad, the hooked forwards otherwise (the hook sees the Linear's output).
  auto fc = std::make_shared<nn::Linear>(6, 5);
  nn::Sequential mlp{fc, std::make_shared<nn::GELU>()};
  const Tensor input = randn_of({3, 6}, DType::Float32, 7);
  Tensor plain, hooked;
  {
    NoGradGuard no_grad;
    {
      KernelProfiler profiler;
      plain = mlp(input);
      ASSERT_EQ(profiler.records().size(), 1u);  // the Linear and the GELU as one kernel
    }
    int calls = 0;
    fc->register_forward_hook([&](nn::Module&, const nn::TensorList&, const nn::TensorList&) {
      ++calls;
      return std::optional<nn::TensorList>();
    });
    hooked = mlp(input);
    EXPECT_EQ(calls, 1);
  }
  EXPECT_TRUE(identical(plain, gelu(linear(input, fc->weight(), fc->bias())).detach()));
  EXPECT_TRUE(identical(hooked, plain));
}

// linear_gelu_linear in inference (one kernel) gives the bits of linear_gelu then linear, on every
// instruction set, by each of its ways (2 threads): bands of rows (each band on one thread, 2-d
// and 3-d x, a strided x, bands of unequal sizes that are not multiples of 14), and the layers one after
// the other where bands would not pay (a hidden matrix that stays in the caches, C more than a
// band's rows, few rows, float64).
TEST(NnOps, LinearGeluLinearGivesTheBitsOfItsTwoLinears) {
  struct Case {
    Shape x;
    int64_t H, O;
    bool strided, bands;
    DType dtype;
  };
  const Case cases[] = {
      {{2000, 40}, 300, 40, false, true, DType::Float32},    {{4, 701, 24}, 200, 30, false, true, DType::Float32},
      {{3100, 33}, 190, 17, true, true, DType::Float32},     {{600, 64}, 300, 64, false, false, DType::Float32},
      {{1000, 300}, 600, 300, false, false, DType::Float32}, {{5, 16}, 32, 16, false, false, DType::Float32},
      {{2000, 40}, 300, 40, false, false, DType::Float64},
  };
  const int threads = get_num_threads();
  set_num_threads(2);
  NoGradGuard no_grad;
  uint64_t seed = 40;
  for (const Case& c : cases) {
    const int64_t C = c.x.back();
    Tensor x = randn_of(c.x, c.dtype, ++seed);
    if (c.strided) x = cat({x, x}, -1).narrow(-1, 1, C);
    const Tensor w1 = randn_of({c.H, C}, c.dtype, ++seed) * 0.3, b1 = randn_of({c.H}, c.dtype, ++seed);
    const Tensor w2 = randn_of({c.O, c.H}, c.dtype, ++seed) * 0.1, b2 = randn_of({c.O}, c.dtype, ++seed);
    const std::string where = cat_str(c.x, " H ", c.H, " O ", c.O, c.strided ? " strided " : " ", dtype_name(c.dtype));
    for (Isa isa : available_isas()) {
      set_isa(isa);
      const Tensor want = linear(linear_gelu(x, w1, b1), w2, b2);
      std::vector<KernelRecord> records;
      Tensor y;
      {
        KernelProfiler profiler;
        y = linear_gelu_linear(x, w1, b1, w2, b2);
        records = profiler.records();
      }
      EXPECT_TRUE(same_bits(y, want)) << where << " " << isa_name(isa);
      ASSERT_EQ(records.size(), 1u) << where;
      EXPECT_EQ(records[0].op, "linear_gelu_linear") << where;
      EXPECT_EQ(records[0].path, c.bands ? "MLP, bands of rows" : "MLP, layer by layer")
          << where << " " << isa_name(isa);
    }
  }
  set_isa(available_isas().back());
  set_num_threads(threads);
}

// With autograd, linear_gelu_linear is the two ops with their gradients; a Sequential's Linear,
// GELU, Dropout (evaluation mode) and Linear take it without grad as one kernel, and the modules'
// forwards with a hook on any of the three or a Dropout that drops.
TEST(NnOps, LinearGeluLinearRecordsTheTwoOpsAndServesSequential) {
  const Tensor x = randn_of({4, 6}, DType::Float64, 1).requires_grad_(), w1 = randn_of({5, 6}, DType::Float64, 2),
               b1 = randn_of({5}, DType::Float64, 3).requires_grad_(), w2 = randn_of({3, 5}, DType::Float64, 4),
               b2 = randn_of({3}, DType::Float64, 5);
  const Tensor y = linear_gelu_linear(x, w1, b1, w2, b2);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  const Tensor x2 = x.detach().requires_grad_(), b12 = b1.detach().requires_grad_();
  linear(gelu(linear(x2, w1, b12)), w2, b2).sum().backward();
  EXPECT_TRUE(same_bits(x.grad(), x2.grad()));
  EXPECT_TRUE(same_bits(b1.grad(), b12.grad()));

  auto fc1 = std::make_shared<nn::Linear>(6, 5), fc2 = std::make_shared<nn::Linear>(5, 3);
  auto dropout = std::make_shared<nn::Dropout>(0.5);
  nn::Sequential mlp{fc1, std::make_shared<nn::GELU>(), dropout, fc2};
  mlp.eval();
  const Tensor input = randn_of({2, 7, 6}, DType::Float32, 6);
  const Tensor want = linear(linear_gelu(input, fc1->weight(), fc1->bias()), fc2->weight(), fc2->bias()).detach();
  NoGradGuard no_grad;
  auto kernels = [&] {
    std::vector<std::string> ops;
    Tensor y;
    {
      KernelProfiler profiler;
      y = mlp(input);
      for (const KernelRecord& r : profiler.records()) ops.push_back(r.op);
    }
    EXPECT_TRUE(same_bits(y, want));
    return ops;
  };
  EXPECT_EQ(kernels(), std::vector<std::string>{"linear_gelu_linear"});
  mlp.train();  // a Dropout that drops: linear_gelu, the dropout's mask and product, linear
  {
    KernelProfiler profiler;
    mlp(input);
    EXPECT_GT(profiler.records().size(), 2u);
    EXPECT_EQ(profiler.records().front().op, "linear");
    EXPECT_EQ(profiler.records().back().op, "linear");
  }
  dropout->p = 0.0;  // passes its input through in training too
  EXPECT_EQ(kernels(), std::vector<std::string>{"linear_gelu_linear"});
  int calls = 0;
  fc2->register_forward_hook([&](nn::Module&, const nn::TensorList&, const nn::TensorList&) {
    ++calls;
    return std::optional<nn::TensorList>();
  });
  EXPECT_EQ(kernels(), (std::vector<std::string>{"linear", "linear"}));
  EXPECT_EQ(calls, 1);
}

TEST(NnOps, LinearGeluLinearRejectsBadOperands) {
  const Tensor x = randn_of({3, 4}, DType::Float32, 1), w1 = randn_of({6, 4}, DType::Float32, 2),
               b1 = randn_of({6}, DType::Float32, 3), w2 = randn_of({2, 6}, DType::Float32, 4),
               b2 = randn_of({2}, DType::Float32, 5);
  NoGradGuard no_grad;
  expect_error(
      [&] {
        linear_gelu_linear(x, w1, b1, randn_of({2, 5}, DType::Float32, 6), b2);
      },
      {"linear_gelu_linear", "w2", "[2, 5]", "6"});
  expect_error(
      [&] {
        linear_gelu_linear(randn_of({3, 5}, DType::Float32, 7), w1, b1, w2, b2);
      },
      {"linear_gelu_linear", "[3, 5]", "4"});
  expect_error([&] { linear_gelu_linear(x, w1[0], b1, w2, b2); }, {"linear_gelu_linear", "2-d", "[4]"});
  expect_error([&] { linear_gelu_linear(x, w1, randn_of({5}, DType::Float32, 8), w2, b2); }, {"[5]", "6"});
  expect_error([&] { linear_gelu_linear(x, w1, b1, w2, randn_of({3}, DType::Float32, 9)); }, {"[3]", "2"});
}

// Where the instruction set has no 7-row kernel (AVX2, generic), a 3x3 stride-1 convolution takes
// Winograd from 16 output tiles (a 14x14 map at batch 1), with few output channels too, against
// the float64 convolution within Winograd's 2e-6; with the 7-row kernel (AVX-512) from 36, with
// 64 output channels or more on maps of 16 tiles or fewer; a 7x7 map's 4 tiles never (each
// instruction set in turn).
TEST(NnOps, Conv2dWinogradFromSixteenTilesWithoutPositionRows) {
  NoGradGuard no_grad;
  for (Isa isa : available_isas()) {
    set_isa(isa);
    for (const auto& [map, O] :
         {std::array<int64_t, 2>{14, 64}, std::array<int64_t, 2>{7, 64}, std::array<int64_t, 2>{14, 32}}) {
      const Tensor x = randn_of({1, 32, map, map}, DType::Float32, 1), w = randn_of({O, 32, 3, 3}, DType::Float32, 2);
      KernelProfiler profiler;
      const Tensor y = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
      const std::string where = cat_str(map, "x", map, " to ", O, " ", isa_name(isa));
      ASSERT_EQ(profiler.records().size(), 1u) << where;
      const bool winograd = profiler.records()[0].path.rfind("winograd F(4x4,3x3)", 0) == 0;
      EXPECT_EQ(winograd, map == 14 && !cpu::has_rows_of_7_kernel()) << where << ": " << profiler.records()[0].path;
      const Tensor want = conv2d(x.to(DType::Float64), w.to(DType::Float64), Tensor(), {1, 1}, {1, 1});
      EXPECT_LE(relative_error(y, want.to(DType::Float32)), winograd ? 2e-6 : 1e-6) << where;
    }
  }
  set_isa(available_isas().back());
}

// float32 3x3 stride-1 convolutions with enough channels and 4x4 output tiles take Winograd
// F(4x4, 3x3) (kernels/cpu/conv.cpp use_winograd; the profiler shows the path): against the
// float64 convolution (im2col + GEMM) of the same values, within 2e-6 (measured 0.9-1.2e-6, five
// times im2col's rounding), for maps that fill the tiles or not, paddings 0, 1 and 2, several
// samples (small maps: side by side in the GEMMs, 4 then 1), NCHW and channels-last inputs, a bias, the fused epilogue
// with a strided residual, and the input gradient (the convolution of dy by the turned kernels, through Winograd as
// well).
TEST(NnOps, Conv2dWinogradMatchesFloat64) {
  struct Case {
    Shape x;
    int64_t O, pad;
  };
  for (const Case& c : {Case{{1, 16, 24, 24}, 16, 1}, Case{{2, 24, 27, 23}, 40, 1}, Case{{1, 32, 30, 26}, 17, 0},
                        Case{{1, 16, 17, 33}, 24, 2}, Case{{5, 64, 14, 14}, 64, 1}})
    for (bool channels_last : {false, true}) {
      const std::string where = cat_str(c.x, " O ", c.O, " pad ", c.pad, channels_last ? " channels-last" : "");
      const Tensor x = randn_of(c.x, DType::Float32, 1)
                           .contiguous(channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
      const Tensor w = randn_of({c.O, c.x[1], 3, 3}, DType::Float32, 2), b = randn_of({c.O}, DType::Float32, 3);
      const std::array<int64_t, 2> pad{c.pad, c.pad};
      Tensor y;
      {
        KernelProfiler profiler;
        y = conv2d(x, w, b, {1, 1}, pad);
        ASSERT_EQ(profiler.records().size(), 1u) << where;
        EXPECT_EQ(profiler.records()[0].path.rfind("winograd F(4x4,3x3)", 0), 0u) << where;
      }
      const Tensor want =
          conv2d(x.to(DType::Float64), w.to(DType::Float64), b.to(DType::Float64), {1, 1}, pad).to(DType::Float32);
      EXPECT_EQ(y.suggest_memory_format(), want.suggest_memory_format()) << where;
      EXPECT_LE(relative_error(y, want), 2e-6) << where;
      // The input gradient: the same convolution of dy with the kernels turned (Winograd too).
      const Tensor dy = randn_of(want.shape(), DType::Float32, 7);
      const Tensor leaf = x.detach().requires_grad_(), leaf64 = x.to(DType::Float64).requires_grad_();
      {
        KernelProfiler profiler;
        conv2d(leaf, w, b, {1, 1}, pad).backward(dy);
        bool winograd_backward = false;
        for (const KernelRecord& r : profiler.records())
          winograd_backward |= r.op == "conv2d_backward_input" && r.path.rfind("winograd F(4x4,3x3)", 0) == 0;
        EXPECT_TRUE(winograd_backward) << where;
      }
      conv2d(leaf64, w.to(DType::Float64), b.to(DType::Float64), {1, 1}, pad).backward(dy.to(DType::Float64));
      EXPECT_LE(relative_error(leaf.grad(), leaf64.grad().to(DType::Float32)), 2e-6) << where;
      const Tensor scale = randn_of({c.O}, DType::Float32, 4), shift = randn_of({c.O}, DType::Float32, 5);
      const Tensor residual = randn_of(want.shape(), DType::Float32, 6).transpose(2, 3).contiguous().transpose(2, 3);
      Tensor fused;
      {
        NoGradGuard no_grad;
        fused = conv2d_epilogue(x, w, scale, shift, residual, EpilogueActivation::SiLU, {1, 1}, pad);
      }
      const Tensor want_fused = silu(conv2d(x.to(DType::Float64), w.to(DType::Float64), Tensor(), {1, 1}, pad) *
                                         scale.to(DType::Float64).view({1, c.O, 1, 1}) +
                                     shift.to(DType::Float64).view({1, c.O, 1, 1}) + residual.to(DType::Float64));
      EXPECT_LE(relative_error(fused.to(DType::Float64), want_fused), 2e-6) << where;
    }
}

// The Winograd transforms of every instruction set of this machine (vector widths 4, 8, 16: the
// tile rows cut differently) against float64, forward and input gradient.
TEST(NnOps, Conv2dWinogradOnEveryInstructionSet) {
  const Tensor x = randn_of({2, 16, 21, 38}, DType::Float32, 1), w = randn_of({24, 16, 3, 3}, DType::Float32, 2);
  const Tensor dy = randn_of({2, 24, 21, 38}, DType::Float32, 3);
  const Tensor leaf64 = x.to(DType::Float64).requires_grad_();
  const Tensor want = conv2d(leaf64, w.to(DType::Float64), Tensor(), {1, 1}, {1, 1});
  want.backward(dy.to(DType::Float64));
  for (Isa isa : available_isas()) {
    set_isa(isa);
    const Tensor leaf = x.detach().requires_grad_();
    const Tensor y = conv2d(leaf, w, Tensor(), {1, 1}, {1, 1});
    y.backward(dy);
    EXPECT_LE(relative_error(y.to(DType::Float64), want.detach()), 2e-6) << isa_name(isa);
    EXPECT_LE(relative_error(leaf.grad().to(DType::Float64), leaf64.grad()), 2e-6) << isa_name(isa);
  }
  set_isa(available_isas().back());
}

// A float32 convolution whose dense output passes 32 MB takes its GEMM's blocks through the thread's
// sums into y with stores past the caches (stream_rows), in chunks of columns: two samples of an
// odd-sized map (rows not vector-aligned, chunks across the samples' boundary) give the bits each
// sample gives alone (20 MB, stored as usual), on every instruction set, with the whole epilogue.
TEST(NnOps, Conv2dLargeOutputStreamedGivesTheBitsOfSmallOnes) {
  NoGradGuard no_grad;
  const Tensor x = randn_of({2, 3, 1001, 1001}, DType::Float32, 21), w = randn_of({5, 3, 1, 1}, DType::Float32, 22);
  const Tensor scale = randn_of({5}, DType::Float32, 23), shift = randn_of({5}, DType::Float32, 24);
  auto run = [&](const Tensor& input) {
    return conv2d_epilogue(input, w, scale, shift, Tensor(), EpilogueActivation::ReLU6, {1, 1}, {0, 0});
  };
  for (Isa isa : available_isas()) {
    set_isa(isa);
    KernelProfiler profiler;
    const Tensor both = run(x);
    ASSERT_EQ(profiler.records().size(), 1u);
    EXPECT_EQ(profiler.records()[0].path, "pointwise gemm, streamed") << isa_name(isa);
    for (int64_t n = 0; n < 2; ++n)
      EXPECT_TRUE(same_bits(both.select(0, n), run(x.narrow(0, n, 1)).select(0, 0)))
          << isa_name(isa) << " sample " << n;
  }
  set_isa(available_isas().back());
}

// Convolutions whose GEMM has few columns of positions (7x7 and 14x14 maps) take the transposed
// path with the positions as 7-row tiles where the instruction set has that kernel (AVX-512; the
// standard path elsewhere): against float64, forward (plain and with the whole epilogue) and
// gradients, output channels past and short of a 64-column panel (narrow tiles), 3x3 and 1x1,
// samples side by side, channels-last. The weight packed for the call (grad mode with a weight
// that requires grad) and the one kept with the weight's storage (no grad) give the same bits.
// (Without the 7-row kernel the 3x3 layers of 16 tiles and more take Winograd, within its 5e-6.)
TEST(NnOps, Conv2dPositionRowsMatchFloat64) {
  struct Case {
    Shape x;
    int64_t O, k;
  };
  const bool rows_kernel = cpu::has_rows_of_7_kernel();
  for (const Case& c : {Case{{1, 64, 7, 7}, 40, 3}, Case{{1, 512, 7, 7}, 100, 1}, Case{{3, 96, 7, 7}, 70, 3},
                        Case{{1, 256, 14, 14}, 64, 1}, Case{{2, 40, 14, 14}, 17, 3},
                        // a 28x28 map, taken for its K: windows read in place (no im2col)
                        Case{{2, 8, 28, 28}, 24, 5},
                        // few output channels at 14x14: not Winograd with the 7-row kernel, however many
                        // samples
                        Case{{8, 128, 14, 14}, 32, 3}})
    for (bool channels_last : {false, true}) {
      const std::string where = cat_str(c.x, " O ", c.O, " k ", c.k, channels_last ? " channels-last" : "");
      const Tensor x = randn_of(c.x, DType::Float32, 1)
                           .contiguous(channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
      const Tensor w = randn_of({c.O, c.x[1], c.k, c.k}, DType::Float32, 2), b = randn_of({c.O}, DType::Float32, 3);
      const std::array<int64_t, 2> pad{c.k / 2, c.k / 2};
      const Tensor x64 = x.to(DType::Float64), w64 = w.to(DType::Float64), b64 = b.to(DType::Float64);
      Tensor kept;
      double bound = 2e-6;
      {
        NoGradGuard no_grad;
        KernelProfiler profiler;
        kept = conv2d(x, w, b, {1, 1}, pad);
        ASSERT_EQ(profiler.records().size(), 1u) << where;
        const std::string& path = profiler.records()[0].path;
        EXPECT_EQ(path.rfind("position rows gemm", 0) == 0, rows_kernel) << where;
        if (path.rfind("winograd", 0) == 0) {
          EXPECT_FALSE(rows_kernel) << where;
          bound = 5e-6;
        }
      }
      EXPECT_LE(relative_error(kept.to(DType::Float64), conv2d(x64, w64, b64, {1, 1}, pad)), bound) << where;
      EXPECT_EQ(kept.suggest_memory_format(), x.suggest_memory_format()) << where;
      // Recorded: the weight packed for the call, then the gradients through it.
      const Tensor leaf = x.detach().requires_grad_(), wleaf = w.detach().requires_grad_();
      const Tensor y = conv2d(leaf, wleaf, b, {1, 1}, pad);
      EXPECT_TRUE(same_bits(y, kept)) << where;
      const Tensor dy = randn_of(y.shape(), DType::Float32, 4);
      y.backward(dy);
      const Tensor leaf64 = x64.detach().requires_grad_(), wleaf64 = w64.detach().requires_grad_();
      conv2d(leaf64, wleaf64, b64, {1, 1}, pad).backward(dy.to(DType::Float64));
      EXPECT_LE(relative_error(leaf.grad().to(DType::Float64), leaf64.grad()), 2e-6) << where;
      EXPECT_LE(relative_error(wleaf.grad().to(DType::Float64), wleaf64.grad()), 2e-6) << where;
      // The whole epilogue: scale, shift, a residual of other strides or channels-last (a
      // channels-last output's own layout), an activation.
      const Tensor scale = randn_of({c.O}, DType::Float32, 5), shift = randn_of({c.O}, DType::Float32, 6);
      const Tensor r = randn_of(y.shape(), DType::Float32, 7);
      for (const Tensor& residual :
           {r.transpose(2, 3).contiguous().transpose(2, 3), r.contiguous(MemoryFormat::ChannelsLast)}) {
        Tensor fused;
        {
          NoGradGuard no_grad;
          fused = conv2d_epilogue(x, w, scale, shift, residual, EpilogueActivation::ReLU6, {1, 1}, pad);
        }
        const Tensor want_fused =
            clamp(conv2d(x64, w64, Tensor(), {1, 1}, pad) * scale.to(DType::Float64).view({1, c.O, 1, 1}) +
                      shift.to(DType::Float64).view({1, c.O, 1, 1}) + residual.to(DType::Float64),
                  0.0, 6.0);
        EXPECT_LE(relative_error(fused.to(DType::Float64), want_fused), bound)
            << where << " residual strides " << residual.strides();
      }
    }
}

// The position rows split each product over the threads in a grid of tiles by output-channel panels
// (each thread padding the input rows its own windows read, storing its own sums): the same bits
// on 1, 2 and 3 threads, for a split by tiles (one panel; a 7x7 map's 7 tiles unevenly), by panels
// (a weight larger than the input), a channels-last input (its positions at a step) and strided
// 1x1 convolutions (their input a view of every other row and column, or every third, gathered
// densely: one sample and samples side by side; channels-last, read in place through offsets).
// Without the 7-row kernel, the same on its paths (Winograd for the 3x3 layers of 16 tiles).
TEST(NnOps, Conv2dPositionRowsGiveTheSameBitsOnAnyThreads) {
  struct Case {
    Shape x;
    int64_t O, k, stride;
    bool channels_last;
  };
  const int threads = get_num_threads();
  NoGradGuard no_grad;
  for (const Case& c : {Case{{1, 128, 14, 14}, 32, 3, 1, false}, Case{{1, 64, 7, 7}, 24, 3, 1, false},
                        Case{{1, 160, 7, 7}, 300, 1, 1, false}, Case{{2, 256, 14, 14}, 80, 1, 1, true},
                        Case{{1, 64, 14, 14}, 48, 3, 1, true}, Case{{1, 256, 28, 28}, 96, 1, 2, false},
                        Case{{2, 160, 14, 14}, 40, 1, 2, false}, Case{{1, 256, 21, 21}, 64, 1, 3, false},
                        Case{{1, 256, 28, 28}, 96, 1, 2, true}}) {
    const std::string where =
        cat_str(c.x, " O ", c.O, " k ", c.k, " stride ", c.stride, c.channels_last ? " channels-last" : "");
    const Tensor x = randn_of(c.x, DType::Float32, 1)
                         .contiguous(c.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
    const Tensor w = randn_of({c.O, c.x[1], c.k, c.k}, DType::Float32, 2), b = randn_of({c.O}, DType::Float32, 3);
    const std::array<int64_t, 2> pad{c.k / 2, c.k / 2}, stride{c.stride, c.stride};
    Tensor want;
    bool winograd = false;  // (the 3x3 layers without the 7-row kernel)
    for (int t : {1, 2, 3}) {
      set_num_threads(t);
      KernelProfiler profiler;
      const Tensor y = conv2d(x, w, b, stride, pad);
      ASSERT_EQ(profiler.records().size(), 1u) << where;
      if (cpu::has_rows_of_7_kernel()) {
        EXPECT_EQ(profiler.records()[0].path.rfind("position rows gemm", 0), 0u) << where;
      }
      winograd = profiler.records()[0].path.rfind("winograd", 0) == 0;
      if (t == 1)
        want = y;
      else
        EXPECT_TRUE(same_bits(y, want)) << where << " threads " << t;
    }
    EXPECT_LE(relative_error(want.to(DType::Float64),
                             conv2d(x.to(DType::Float64), w.to(DType::Float64), b.to(DType::Float64), stride, pad)),
              winograd ? 5e-6 : 2e-6)
        << where;
  }
  set_num_threads(threads);
}

// The weight forms kept with the weight's storage (7x7 maps: the packed W^T of the position rows
// where the CPU has them; 24x24: Winograd's transformed weights) follow every change of the
// weight: an in-place op, a copy into it, a write through its pointer followed by bump_version,
// and memory wrapped with from_blob written behind tvc's back (never kept): each result equals
// the convolution by a fresh copy of the weight's new values, bit for bit.
TEST(NnOps, Conv2dKeptWeightFollowsChangesOfTheWeight) {
  NoGradGuard no_grad;
  for (const auto& [map, path] :
       {std::pair<int64_t, std::string>{7, cpu::has_rows_of_7_kernel() ? "position rows" : "im2col+gemm"},
        std::pair<int64_t, std::string>{24, "winograd"}}) {
    const Tensor x = randn_of({1, 96, map, map}, DType::Float32, 1);
    Tensor w = randn_of({64, 96, 3, 3}, DType::Float32, 2);
    auto conv = [&](const Tensor& weight) { return conv2d(x, weight, Tensor(), {1, 1}, {1, 1}); };
    auto conv_by_copy = [&](const Tensor& weight) { return conv(weight.clone()); };
    Tensor first;
    {
      KernelProfiler profiler;
      first = conv(w);
      EXPECT_EQ(profiler.records().at(0).path.rfind(path, 0), 0u) << map;
    }
    EXPECT_TRUE(same_bits(first, conv_by_copy(w))) << map;
    EXPECT_TRUE(same_bits(conv(w), first)) << map;  // the kept form
    w.mul_(-0.5);
    EXPECT_TRUE(same_bits(conv(w), conv_by_copy(w))) << map;
    w.copy_(randn_of(w.shape(), DType::Float32, 3));
    EXPECT_TRUE(same_bits(conv(w), conv_by_copy(w))) << map;
    w.data_ptr<float>()[5] = 7.f;
    w.storage()->bump_version();
    EXPECT_TRUE(same_bits(conv(w), conv_by_copy(w))) << map;
    // Views of one storage: each keeps its own form.
    const Tensor both = randn_of({2, 64, 96, 3, 3}, DType::Float32, 4);
    EXPECT_TRUE(same_bits(conv(both[1]), conv_by_copy(both[1]))) << map;
    EXPECT_TRUE(same_bits(conv(both[0]), conv_by_copy(both[0]))) << map;
    EXPECT_TRUE(same_bits(conv(both[1]), conv_by_copy(both[1]))) << map;
    std::vector<float> outside(static_cast<size_t>(w.numel()));
    std::copy(w.data_ptr<float>(), w.data_ptr<float>() + w.numel(), outside.begin());
    const Tensor wrapped = from_blob(outside.data(), w.shape(), DType::Float32);
    EXPECT_TRUE(same_bits(conv(wrapped), conv_by_copy(wrapped))) << map;
    outside[9] = -3.f;
    EXPECT_TRUE(same_bits(conv(wrapped), conv_by_copy(wrapped))) << map;
    const Tensor kept = conv(w);
    set_keep_derived_data(false);  // the forms made for each call
    EXPECT_TRUE(same_bits(conv(w), kept)) << map;
    set_keep_derived_data(true);
  }
}

// A float32 input with a bfloat16 weight (nn::convert_weights_to_bfloat16): without autograd the
// input is rounded to bfloat16 and the products summed in float32 (float32 output), so the result
// is the float64 product of the rounded input and the weight within float32 sums; with autograd,
// or depthwise, the float32 ops on the weight converted back, with the weight's gradient.
TEST(NnOps, BFloat16WeightsWithFloat32Inputs) {
  const Tensor x = randn_of({2, 8, 9, 10}, DType::Float32, 1);
  const Tensor rounded = x.to(DType::BFloat16).to(DType::Float64);
  const Tensor w = randn_of({12, 8, 3, 3}, DType::BFloat16, 2), bias = randn_of({12}, DType::Float32, 3);
  const Tensor scale = randn_of({12}, DType::Float32, 4), shift = randn_of({12}, DType::Float32, 5);
  Tensor y, fused, lin;
  const Tensor lw = randn_of({7, 10}, DType::BFloat16, 6), lb = randn_of({7}, DType::Float32, 7);
  {
    NoGradGuard no_grad;
    y = conv2d(x, w, bias, {2, 1}, {1, 1});
    fused = conv2d_epilogue(x, w, scale, shift, Tensor(), EpilogueActivation::ReLU, {1, 1}, {1, 1});
    lin = linear(x, lw, lb);
  }
  const Tensor w64 = w.to(DType::Float64);
  EXPECT_EQ(y.dtype(), DType::Float32);
  EXPECT_LE(relative_error(y.to(DType::Float64), conv2d(rounded, w64, bias.to(DType::Float64), {2, 1}, {1, 1})), 1e-6);
  const Tensor fused64 = conv2d_epilogue(rounded, w64, scale.to(DType::Float64), shift.to(DType::Float64), Tensor(),
                                         EpilogueActivation::ReLU, {1, 1}, {1, 1});
  EXPECT_LE(relative_error(fused.to(DType::Float64), fused64), 1e-6);
  EXPECT_EQ(lin.dtype(), DType::Float32);
  EXPECT_EQ(lin.shape(), (Shape{2, 8, 9, 7}));
  EXPECT_LE(relative_error(lin.to(DType::Float64), linear(rounded, lw.to(DType::Float64), lb.to(DType::Float64))),
            1e-6);
  // Recorded by autograd: float32 with the exact weight; the gradient reaches the bfloat16 weight.
  const Tensor leaf = w.detach().requires_grad_();
  const Tensor recorded = conv2d(x, leaf, bias, {2, 1}, {1, 1});
  EXPECT_LE(relative_error(recorded, conv2d(x, w.to(DType::Float32), bias, {2, 1}, {1, 1})), 1e-7);
  recorded.sum().backward();
  ASSERT_TRUE(leaf.grad().defined());
  EXPECT_EQ(leaf.grad().dtype(), DType::BFloat16);
  // Depthwise: float32 with the exact weight.
  const Tensor dw = randn_of({8, 1, 3, 3}, DType::BFloat16, 8);
  NoGradGuard no_grad;
  EXPECT_LE(relative_error(conv2d(x, dw, Tensor(), {1, 1}, {1, 1}, {1, 1}, 8),
                           conv2d(x, dw.to(DType::Float32), Tensor(), {1, 1}, {1, 1}, {1, 1}, 8)),
            1e-7);
  // Other mixes stay errors.
  expect_error([&] { conv2d(x.to(DType::Float64), w); }, {"conv2d", "float64", "bfloat16", "differ"});
  expect_error([&] { conv2d(x, w.to(DType::Float64)); }, {"conv2d", "float32", "float64", "differ"});
}

TEST(NnOps, Conv2dEpilogueRejectsBadOperands) {
  Tensor x = randn_of({2, 4, 5, 5}, DType::Float32, 1), w = randn_of({3, 4, 3, 3}, DType::Float32, 2);
  Tensor c3 = randn_of({3}, DType::Float32, 3);
  NoGradGuard no_grad;
  const auto relu = EpilogueActivation::ReLU;
  expect_error([&] { conv2d_epilogue(x, w, randn_of({4}, DType::Float32, 3), c3, Tensor(), relu); },
               {"conv2d_epilogue", "scale", "[4]", "3"});
  expect_error([&] { conv2d_epilogue(x, w, c3, Tensor(), Tensor(), relu); }, {"conv2d_epilogue", "shift", "undefined"});
  expect_error([&] { conv2d_epilogue(x, w, c3, c3.to(DType::Float64), Tensor(), relu); },
               {"conv2d_epilogue", "shift", "float64"});
  expect_error(
      [&] {
        conv2d_epilogue(x, w, c3, c3, randn_of({2, 3, 5, 5}, DType::Float32, 4), relu);
      },
      {"conv2d_epilogue", "residual", "[2, 3, 5, 5]", "[2, 3, 3, 3]"});
  expect_error([&] { conv2d_epilogue(x[0], w, c3, c3, Tensor(), relu); }, {"conv2d_epilogue", "[4, 5, 5]"});
}

// An inverted residual block in one kernel gives the bits of its conv2d_epilogue calls one after
// the other, on every instruction set, by each of its ways (2 threads): bands of output rows of
// large maps (rows read by two bands, the map's edges padded), whole maps of several
// samples side by side, and layer by layer; with and without the expansion and the projection,
// 3x3 and 5x5, stride 1 and 2, the input added.
TEST(NnOps, InvertedResidualGivesTheBitsOfItsConvolutions) {
  struct Case {
    Shape x;
    int64_t E, O, k, stride;
    bool expand, project;
    const char* path;
  };
  const Case cases[] = {
      {{1, 16, 96, 96}, 64, 24, 3, 2, true, true, "inverted residual, bands of rows"},
      {{2, 24, 40, 40}, 144, 24, 3, 1, true, true, "inverted residual, bands of rows"},  // input added
      {{1, 32, 112, 112}, 32, 16, 3, 1, false, true, "inverted residual, bands of rows"},
      {{1, 16, 112, 112}, 96, 0, 3, 2, true, false, "inverted residual, bands of rows"},
      {{1, 24, 75, 75}, 72, 40, 5, 2, true, true, "inverted residual, bands of rows"},
      {{1, 64, 150, 150}, 64, 24, 5, 2, false, true, "inverted residual, bands of rows"},     // edge rows copied
      {{8, 40, 7, 7}, 240, 40, 5, 1, true, true, "inverted residual, samples side by side"},  // input added
      {{3, 80, 14, 14}, 480, 0, 5, 1, true, false, "inverted residual, bands of rows"},       // a map a band
      {{1, 40, 7, 7}, 240, 40, 5, 1, true, true, "inverted residual, layer by layer"},
      {{2, 16, 64, 64}, 96, 0, 3, 1, true, false, "inverted residual, layer by layer"},
  };
  const int threads = get_num_threads();
  set_num_threads(2);
  NoGradGuard no_grad;
  uint64_t seed = 30;
  for (const Case& c : cases) {
    const int64_t C = c.x[1], E = c.expand ? c.E : C;
    auto layer = [&](int64_t out, int64_t in, int64_t k, EpilogueActivation activation) {
      return ConvEpilogueLayer{randn_of({out, in, k, k}, DType::Float32, ++seed) * 0.3,
                               randn_of({out}, DType::Float32, ++seed), randn_of({out}, DType::Float32, ++seed),
                               activation};
    };
    const Tensor x = randn_of(c.x, DType::Float32, ++seed);
    const ConvEpilogueLayer expand = c.expand ? layer(E, C, 1, EpilogueActivation::ReLU6) : ConvEpilogueLayer{};
    const ConvEpilogueLayer depthwise = layer(E, 1, c.k, EpilogueActivation::Hardswish);
    const ConvEpilogueLayer project = c.project ? layer(c.O, E, 1, EpilogueActivation::None) : ConvEpilogueLayer{};
    const bool add_input = c.project && c.stride == 1 && c.O == C;
    const std::array<int64_t, 2> stride{c.stride, c.stride}, padding{c.k / 2, c.k / 2};
    const std::string where = cat_str(c.x, " E ", E, " O ", c.O, " ", c.k, "x", c.k, " stride ", c.stride);
    for (Isa isa : available_isas()) {
      set_isa(isa);
      Tensor want = x;
      if (c.expand)
        want = conv2d_epilogue(want, expand.weight, expand.scale, expand.shift, Tensor(), expand.activation);
      want = conv2d_epilogue(want, depthwise.weight, depthwise.scale, depthwise.shift, Tensor(), depthwise.activation,
                             stride, padding, {1, 1}, E);
      if (c.project)
        want = conv2d_epilogue(want, project.weight, project.scale, project.shift, add_input ? x : Tensor(),
                               project.activation);
      std::vector<KernelRecord> records;
      Tensor y;
      {
        KernelProfiler profiler;
        y = inverted_residual(x, expand, depthwise, stride, padding, project, add_input);
        records = profiler.records();
      }
      EXPECT_TRUE(same_bits(y, want)) << where << " " << isa_name(isa);
      ASSERT_EQ(records.size(), 1u) << where;
      EXPECT_EQ(records[0].op, "inverted_residual") << where;
      EXPECT_EQ(records[0].path, c.path) << where;
    }
  }
  set_isa(available_isas().back());
  set_num_threads(threads);
}

TEST(NnOps, InvertedResidualRejectsBadOperands) {
  const Tensor x = randn_of({2, 4, 6, 6}, DType::Float32, 1);
  auto layer = [](int64_t out, int64_t in, int64_t k) {
    return ConvEpilogueLayer{randn_of({out, in, k, k}, DType::Float32, 2), randn_of({out}, DType::Float32, 3),
                             randn_of({out}, DType::Float32, 4), EpilogueActivation::ReLU};
  };
  const ConvEpilogueLayer expand = layer(8, 4, 1), depthwise = layer(8, 1, 3), project = layer(4, 8, 1);
  const std::array<int64_t, 2> one{1, 1}, two{2, 2};
  NoGradGuard no_grad;
  expect_error([&] { inverted_residual(x, layer(8, 3, 1), depthwise, one, one, project, true); },
               {"inverted_residual", "expand", "(out, 4, 1, 1)", "[8, 3, 1, 1]"});
  expect_error([&] { inverted_residual(x, expand, layer(8, 2, 3), one, one, project, true); },
               {"inverted_residual", "depthwise", "(8, 1, kh, kw)", "[8, 2, 3, 3]"});
  expect_error([&] { inverted_residual(x, expand, depthwise, one, one, layer(4, 6, 1), true); },
               {"inverted_residual", "project", "(out, 8, 1, 1)", "[4, 6, 1, 1]"});
  expect_error([&] { inverted_residual(x, expand, depthwise, one, one, ConvEpilogueLayer{}, true); },
               {"inverted_residual", "add_input", "project"});
  expect_error([&] { inverted_residual(x, expand, depthwise, two, one, project, true); },
               {"inverted_residual", "add_input", "[2, 4, 3, 3]", "[2, 4, 6, 6]"});
  ConvEpilogueLayer short_scale = depthwise;
  short_scale.scale = randn_of({7}, DType::Float32, 5);
  expect_error([&] { inverted_residual(x, expand, short_scale, one, one, project, true); },
               {"inverted_residual", "scale", "(8)", "[7]"});
  expect_error([&] { inverted_residual(x[0], expand, depthwise, one, one, project, true); },
               {"inverted_residual", "(N, C, H, W)", "[4, 6, 6]"});
}

// ---------------------------------------------------------------- pooling

TEST(NnOps, PoolingMatchesTorch) {
  using Pair = std::array<int64_t, 2>;
  struct PoolCase {
    std::string torch;  // expression over x
    std::function<Tensor(const Tensor&)> ours;
    Shape shape;
    bool channels_last = false;
  };
  std::vector<PoolCase> cases = {
      {"F.max_pool2d(x, 3, 2, 1, ceil_mode=True)",
       [](const Tensor& x) {
         return max_pool2d(x, {3, 3}, Pair{2, 2}, {1, 1}, {1, 1}, true);
       },
       {2, 3, 8, 10}},
      {"F.max_pool2d(x, (2, 3), (2, 2), (1, 1), dilation=(2, 1), ceil_mode=True)",
       [](const Tensor& x) {
         return max_pool2d(x, {2, 3}, Pair{2, 2}, {1, 1}, {2, 1}, true);
       },
       {2, 3, 9, 8},
       true},
      {"F.max_pool2d(x, 2)",
       [](const Tensor& x) {
         return max_pool2d(x, {2, 2});
       },
       {2, 32, 7, 7},
       true},
      {"F.avg_pool2d(x, 3, 2, 1, ceil_mode=True)",
       [](const Tensor& x) {
         return avg_pool2d(x, {3, 3}, Pair{2, 2}, {1, 1}, true);
       },
       {2, 3, 8, 10}},
      {"F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)",
       [](const Tensor& x) {
         return avg_pool2d(x, {3, 3}, Pair{2, 2}, {1, 1}, true, false);
       },
       {2, 3, 8, 10},
       true},
      {"F.avg_pool2d(x, (2, 3), (3, 2), (1, 1), ceil_mode=True, divisor_override=5)",
       [](const Tensor& x) {
         return avg_pool2d(x, {2, 3}, Pair{3, 2}, {1, 1}, true, true, 5);
       },
       {2, 3, 8, 9}},
      {"F.avg_pool2d(x, 4, 3, 2, ceil_mode=True, count_include_pad=True)",
       [](const Tensor& x) {
         return avg_pool2d(x, {4, 4}, Pair{3, 3}, {2, 2}, true, true);
       },
       {1, 2, 6, 7}},
      // 2x2 blocks at stride 2 (the blocks' own path): an odd width left out, channels-last, and
      // adaptive pooling to half the size; under ceil_mode a last partial window (the windows' path)
      {"F.avg_pool2d(x, 2)",
       [](const Tensor& x) {
         return avg_pool2d(x, {2, 2});
       },
       {2, 5, 8, 9}},
      {"F.avg_pool2d(x, 2, divisor_override=3)",
       [](const Tensor& x) {
         return avg_pool2d(x, {2, 2}, std::nullopt, {0, 0}, false, true, 3);
       },
       {2, 4, 6, 6},
       true},
      {"F.adaptive_avg_pool2d(x, (3, 4))",
       [](const Tensor& x) {
         return adaptive_avg_pool2d(x, {3, 4});
       },
       {2, 3, 6, 8}},
      {"F.avg_pool2d(x, 2, ceil_mode=True)",
       [](const Tensor& x) {
         return avg_pool2d(x, {2, 2}, std::nullopt, {0, 0}, true);
       },
       {1, 3, 7, 7}},
      {"F.adaptive_avg_pool2d(x, (3, 5))",
       [](const Tensor& x) {
         return adaptive_avg_pool2d(x, {3, 5});
       },
       {2, 3, 7, 11}},
      {"F.adaptive_avg_pool2d(x, (4, 5))",
       [](const Tensor& x) {
         return adaptive_avg_pool2d(x, {4, 5});
       },
       {2, 3, 3, 2},
       true},
      {"F.adaptive_max_pool2d(x, (3, 5))",
       [](const Tensor& x) {
         return adaptive_max_pool2d(x, {3, 5});
       },
       {2, 3, 7, 11}},
      {"F.adaptive_max_pool2d(x, (2, 2))",
       [](const Tensor& x) {
         return adaptive_max_pool2d(x, {2, 2});
       },
       {2, 3, 5, 5},
       true},
  };
  std::ostringstream code;
  code << "import torch.nn.functional as F\n";
  std::vector<std::pair<Tensor, Tensor>> ours;
  for (size_t i = 0; i < cases.size(); ++i) {
    const PoolCase& c = cases[i];
    Tensor x = randn_of(c.shape, DType::Float32, 50 + i);
    if (c.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
    x.requires_grad_();
    Tensor y = c.ours(x);
    EXPECT_EQ(y.suggest_memory_format() == MemoryFormat::ChannelsLast, c.channels_last) << c.torch;
    Tensor r = randn_of(y.shape(), DType::Float32, 70 + i);
    sum(mul(y, r)).backward();
    ours.push_back({y, x.grad()});
    code << "x = " << py_tensor(x) << ".requires_grad_()\ny = " << c.torch << "\n(y * " << py_tensor(r)
         << ").sum().backward()\nout += [y, x.grad]\n";
  }
  std::vector<Tensor> ref = torch_tensors(code.str());
  ASSERT_EQ(ref.size(), 2 * cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_LE(relative_error(ours[i].first, ref[2 * i]), 1e-5) << cases[i].torch << ": output";
    EXPECT_LE(relative_error(ours[i].second, ref[2 * i + 1]), 1e-5) << cases[i].torch << ": grad input";
  }
}

// Inference skips the indices and reduces each window's rows first: the values must equal the
// indexed scan's (what a tensor requiring grad gets) exactly, NaNs in the windows included; on
// maps narrower than a vector and wide enough for the instruction set's vectors (max_into, its
// last partial vector masked: rows of 45, 23 outputs at stride 2).
TEST(NnOps, MaxPoolWithoutIndicesEqualsTheIndexedPath) {
  using Pair = std::array<int64_t, 2>;
  struct Config {
    Pair kernel, stride, padding, dilation;
    bool ceil_mode, channels_last;
    DType dtype;
  };
  const std::vector<Config> configs = {{{3, 3}, {2, 2}, {1, 1}, {1, 1}, false, false, DType::Float32},
                                       {{3, 3}, {2, 2}, {1, 1}, {1, 1}, true, true, DType::Float32},
                                       {{2, 3}, {2, 1}, {1, 1}, {2, 1}, true, false, DType::Float64},
                                       {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, true, DType::Float32},
                                       {{3, 2}, {1, 3}, {1, 0}, {1, 2}, false, false, DType::Float32}};
  for (const Shape& shape : {Shape{2, 3, 11, 9}, Shape{2, 3, 33, 45}})
    for (size_t i = 0; i < configs.size(); ++i) {
      const Config& c = configs[i];
      Tensor x = randn_of(shape, c.dtype, 90 + i);
      x.select(0, 0).select(0, 1).select(0, 3).select(0, 4).fill_(std::nan(""));                       // inside
      x.select(0, 1).select(0, 2).select(0, 0).select(0, 8).fill_(std::nan(""));                       // on the border
      if (shape[3] > 40) x.select(0, 0).select(0, 2).select(0, 20).select(0, 30).fill_(std::nan(""));  // in a vector
      if (c.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
      Tensor fast;
      {
        NoGradGuard no_grad;
        fast = max_pool2d(x, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
      }
      Tensor indexed = max_pool2d(x.detach().requires_grad_(), c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
      ASSERT_EQ(fast.shape(), indexed.shape()) << "config " << i;
      std::vector<double> a = fast.to_vector(), b = indexed.detach().to_vector();
      int nans = 0;
      for (size_t j = 0; j < a.size(); ++j) {
        nans += std::isnan(b[j]);
        EXPECT_TRUE(a[j] == b[j] || (std::isnan(a[j]) && std::isnan(b[j])))
            << "config " << i << " shape " << shape << ", output " << j;
      }
      EXPECT_GT(nans, 0) << "config " << i << " shape " << shape << ": the NaNs reach some window";
    }
}

// A channels-last input is pooled a position's channels at a time: inference (float32) reduces each
// window as the planes' path does (rows first, then the window's columns, in order), training scans
// it in PyTorch's order and its backward adds each output's gradient at its index in output order.
// The bits of the NCHW input's values, indices and input gradient (from a channels-last or an NCHW
// output gradient), with NaNs in windows, ties of +0 and -0 and of values on a coarse grid,
// padding, dilation, ceil_mode's last window, strides 1 to 3, on one and two threads.
bool same_float_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr<float>(), cb.data_ptr<float>(), sizeof(float) * ca.numel()) == 0;
}
TEST(NnOps, MaxPoolOfChannelsLastGivesTheBitsOfNchw) {
  using Pair = std::array<int64_t, 2>;
  struct Config {
    Pair kernel, stride, padding, dilation;
    bool ceil_mode;
  };
  const std::vector<Config> configs = {{{3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
                                       {{3, 3}, {2, 2}, {1, 1}, {1, 1}, true},
                                       {{2, 3}, {2, 1}, {1, 1}, {2, 1}, true},
                                       {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false},
                                       {{3, 2}, {1, 3}, {1, 0}, {1, 2}, false}};
  const int threads = get_num_threads();
  for (int t : {1, 2}) {
    set_num_threads(t);
    for (const Shape& shape : {Shape{2, 3, 11, 9}, Shape{2, 70, 13, 15}, Shape{1, 16, 8, 8}})
      for (size_t i = 0; i < configs.size(); ++i) {
        const Config& c = configs[i];
        // Values of a few quarters, +0 and -0 among them: many ties within a window; NaNs of two
        // payloads.
        std::vector<float> values(shape_numel(shape));
        for (size_t v = 0; v < values.size(); ++v) {
          const uint64_t hash = (v + 17 * i) * 0x9E3779B97F4A7C15ull >> 59;  // 0..31
          values[v] = hash < 4 ? -0.f : static_cast<float>(static_cast<int64_t>(hash % 7) - 3) * 0.25f;
        }
        values[5] = std::nanf("1"), values[values.size() / 2] = std::nanf("2"),
        values[values.size() / 2 + 1] = -std::nanf("3");
        const Tensor x = tensor(values, shape), x_cl = x.contiguous(MemoryFormat::ChannelsLast);
        NoGradGuard no_grad;
        const Tensor planes = max_pool2d(x, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
        const Tensor rows = max_pool2d(x_cl, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
        EXPECT_EQ(rows.suggest_memory_format(), MemoryFormat::ChannelsLast) << "config " << i;
        ASSERT_EQ(rows.shape(), planes.shape()) << "config " << i;
        EXPECT_TRUE(same_float_bits(rows, planes)) << "config " << i << " shape " << shape << ", " << t << " threads";
        // Training: the values (the input at each index) and the input's gradient.
        const Tensor dy = randn_of(planes.shape(), DType::Float32, 140 + i);
        for (const Tensor& dy_any : {dy, dy.contiguous(MemoryFormat::ChannelsLast)}) {
          GradModeGuard grad(true);
          Tensor xp = x.detach().requires_grad_(), xr = x_cl.detach().requires_grad_();
          const Tensor yp = max_pool2d(xp, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
          const Tensor yr = max_pool2d(xr, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
          EXPECT_TRUE(same_float_bits(yr, yp)) << "config " << i << " shape " << shape << ", " << t << " threads";
          yp.backward(dy);
          yr.backward(dy_any);
          EXPECT_TRUE(same_float_bits(xr.grad(), xp.grad()))
              << "config " << i << " shape " << shape << ", " << t << " threads";
        }
      }
  }
  set_num_threads(threads);
}

// A convolution with its epilogue and a max pool in one kernel (conv2d_epilogue_max_pool2d) gives
// the bits of conv2d_epilogue then max_pool2d, on every instruction set, on one and two threads:
// inputs of few channels on the few-channel rows (each pooled row's window of convolution rows made
// once, in a ring: pool strides below, at and above the window's rows, a dilated window, ceil_mode,
// 7x7 stride 2 and 3x3 stride 1 and 2, several samples, maps smaller than the windows, NaNs of two
// payloads), and an input of more channels through the convolution's own path and the pooled rows.
TEST(NnOps, ConvMaxPoolGivesTheBitsOfItsTwoOps) {
  using Pair = std::array<int64_t, 2>;
  struct Pool {
    Pair kernel, stride, padding, dilation;
    bool ceil_mode;
  };
  const std::vector<Pool> pools = {{{3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
                                   {{3, 3}, {2, 2}, {1, 1}, {1, 1}, true},
                                   {{2, 3}, {1, 1}, {1, 1}, {2, 1}, true},
                                   {{2, 2}, {3, 2}, {0, 0}, {1, 1}, false},
                                   {{3, 2}, {1, 3}, {1, 0}, {1, 2}, false}};
  struct Conv {
    Shape x, w;
    int64_t stride;
    EpilogueActivation activation;
    const char* path;  // the kernel's, with few channels
  };
  const char* rows = "few-channel rows, max pool rows";
  const std::vector<Conv> convs = {{{2, 3, 29, 26}, {16, 3, 7, 7}, 2, EpilogueActivation::ReLU, rows},
                                   {{2, 3, 17, 20}, {8, 3, 3, 3}, 1, EpilogueActivation::None, rows},
                                   {{1, 1, 21, 19}, {8, 1, 3, 3}, 2, EpilogueActivation::SiLU, rows},
                                   // maps of fewer rows than the window's (a sample's rows are not the last one's)
                                   {{3, 3, 6, 6}, {8, 3, 7, 7}, 2, EpilogueActivation::ReLU, rows},
                                   {{2, 6, 15, 13}, {5, 6, 3, 3}, 1, EpilogueActivation::ReLU, nullptr}};
  const int threads = get_num_threads();
  NoGradGuard no_grad;
  uint64_t seed = 60;
  for (const Conv& c : convs) {
    const std::vector<double> normal = randn_of(c.x, DType::Float32, ++seed).to_vector();
    std::vector<float> values(normal.begin(), normal.end());
    values[40] = std::nanf("1"), values[values.size() / 2] = -std::nanf("2");
    const Tensor x = tensor(values, c.x), w = randn_of(c.w, DType::Float32, ++seed) * 0.3;
    const Tensor scale = randn_of({c.w[0]}, DType::Float32, ++seed), shift = randn_of({c.w[0]}, DType::Float32, ++seed);
    const Pair stride{c.stride, c.stride}, padding{c.w[2] / 2, c.w[3] / 2};
    for (Isa isa : available_isas()) {
      set_isa(isa);
      for (int t : {1, 2}) {
        set_num_threads(t);
        const Tensor conv = conv2d_epilogue(x, w, scale, shift, Tensor(), c.activation, stride, padding);
        for (size_t i = 0; i < pools.size(); ++i) {
          const Pool& p = pools[i];
          const std::string where =
              cat_str(c.x, " weight ", c.w, " pool ", i, ", ", isa_name(isa), ", ", t, " threads");
          const Tensor want = max_pool2d(conv, p.kernel, p.stride, p.padding, p.dilation, p.ceil_mode);
          std::vector<KernelRecord> records;
          Tensor y;
          {
            KernelProfiler profiler;
            y = conv2d_epilogue_max_pool2d(x, {w, scale, shift, c.activation}, stride, padding, {1, 1}, 1, p.kernel,
                                           p.stride, p.padding, p.dilation, p.ceil_mode);
            records = profiler.records();
          }
          ASSERT_EQ(y.shape(), want.shape()) << where;
          EXPECT_TRUE(same_float_bits(y, want)) << where;
          ASSERT_EQ(records.size(), 1u) << where;
          EXPECT_EQ(records[0].op, "conv2d_epilogue_max_pool2d") << where;
          if (c.path) EXPECT_EQ(records[0].path, c.path) << where;
        }
      }
    }
  }
  set_isa(available_isas().back());
  set_num_threads(threads);
}

TEST(NnOps, ConvMaxPoolRejectsBadOperands) {
  const Tensor x = randn_of({2, 3, 9, 9}, DType::Float32, 1), w = randn_of({8, 3, 3, 3}, DType::Float32, 2);
  const Tensor c8 = randn_of({8}, DType::Float32, 3);
  const auto relu = EpilogueActivation::ReLU;
  using Pair = std::array<int64_t, 2>;
  NoGradGuard no_grad;
  expect_error(
      [&] {
        conv2d_epilogue_max_pool2d(x, {w, randn_of({7}, DType::Float32, 4), c8, relu}, {1, 1}, {1, 1}, {1, 1}, 1,
                                   {3, 3});
      },
      {"conv2d_epilogue_max_pool2d", "scale", "[7]", "8"});
  expect_error(
      [&] {
        conv2d_epilogue_max_pool2d(x, {w, c8, c8, relu}, {1, 1}, {1, 1}, {1, 1}, 1, {3, 3}, Pair{2, 2}, {2, 2});
      },
      {"conv2d_epilogue_max_pool2d", "padding", "[2, 2]", "[3, 3]"});
  expect_error(
      [&] {
        conv2d_epilogue_max_pool2d(x, {w, c8, c8, relu}, {1, 1}, {0, 0}, {1, 1}, 1, {9, 9});
      },
      {"conv2d_epilogue_max_pool2d", "output size", "[2, 8, 7, 7]"});
  expect_error(
      [&] {
        conv2d_epilogue_max_pool2d(x[0], {w, c8, c8, relu}, {1, 1}, {1, 1}, {1, 1}, 1, {3, 3});
      },
      {"conv2d_epilogue_max_pool2d", "[3, 9, 9]"});
}

// The indexed path (training) on inputs full of ties (ReLU zeros, values on a coarse grid) and
// with NaNs, several in one window: each output's index (where its gradient goes) must be the
// one PyTorch's scan picks, the first maximum in row-major order or the last NaN.
TEST(NnOps, MaxPoolIndicesMatchTorchOnTiesAndNaNs) {
  using Pair = std::array<int64_t, 2>;
  struct Config {
    const char* torch;
    Pair kernel, stride, padding, dilation;
    bool ceil_mode, channels_last;
  };
  const std::vector<Config> configs = {
      {"F.max_pool2d(x, 3, 2, 1)", {3, 3}, {2, 2}, {1, 1}, {1, 1}, false, false},
      {"F.max_pool2d(x, 3, 2, 1, ceil_mode=True)", {3, 3}, {2, 2}, {1, 1}, {1, 1}, true, true},
      {"F.max_pool2d(x, (2, 3), (2, 1), (1, 1), dilation=(2, 1), ceil_mode=True)",
       {2, 3},
       {2, 1},
       {1, 1},
       {2, 1},
       true,
       false},
      {"F.max_pool2d(x, (3, 2), (1, 3), (1, 0), dilation=(1, 2))", {3, 2}, {1, 3}, {1, 0}, {1, 2}, false, false}};
  std::ostringstream code;
  code << "import torch.nn.functional as F\nnan = float('nan')\n";
  std::vector<std::pair<Tensor, Tensor>> ours;
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    Generator gen(120 + i);
    Tensor x = relu(randint(-2, 3, {2, 3, 11, 9}, {.dtype = DType::Int64}, &gen).to(DType::Float32));
    x.select(0, 0).select(0, 1).select(0, 3).select(0, 4).fill_(std::nan(""));
    x.select(0, 0).select(0, 1).select(0, 4).select(0, 4).fill_(std::nan(""));  // the same windows:
    x.select(0, 0).select(0, 1).select(0, 3).select(0, 5).fill_(std::nan(""));  // NaNs in one column, one row
    x.select(0, 1).select(0, 2).select(0, 0).select(0, 8).fill_(std::nan(""));  // on the border
    if (c.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
    x.requires_grad_();
    const Tensor y = max_pool2d(x, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
    const Tensor r = randn_of(y.shape(), DType::Float32, 140 + i);
    sum(mul(y, r)).backward();
    ours.push_back({y.detach(), x.grad()});
    code << "x = " << py_tensor(x) << ".requires_grad_()\ny = " << c.torch << "\n(y * " << py_tensor(r)
         << ").sum().backward()\nout += [y, x.grad]\n";
  }
  const std::vector<Tensor> ref = torch_tensors(code.str());
  ASSERT_EQ(ref.size(), 2 * configs.size());
  for (size_t i = 0; i < configs.size(); ++i) {
    const std::vector<double> a = ours[i].first.to_vector(), b = ref[2 * i].to_vector();
    ASSERT_EQ(a.size(), b.size()) << configs[i].torch;
    for (size_t j = 0; j < a.size(); ++j)
      EXPECT_TRUE(a[j] == b[j] || (std::isnan(a[j]) && std::isnan(b[j]))) << configs[i].torch << ": output " << j;
    EXPECT_LE(relative_error(ours[i].second, ref[2 * i + 1]), 1e-6) << configs[i].torch << ": grad input";
  }
}

// ---------------------------------------------------------------- normalisation, softmax

// Three training steps with running statistics, then one evaluation step, for momentum 0.1 and
// None (cumulative average over num_batches_tracked).
TEST(NnOps, BatchNormRunningStatsMatchTorch) {
  for (bool cumulative : {false, true}) {
    Tensor rm = zeros({3}), rv = ones({3});
    Tensor nbt = zeros({}, {.dtype = DType::Int64});
    Tensor w = randn_of({3}, DType::Float32, 1), b = randn_of({3}, DType::Float32, 2);
    std::optional<double> momentum = cumulative ? std::nullopt : std::optional<double>(0.1);
    std::ostringstream code;
    code << "import torch.nn.functional as F\nrm = torch.zeros(3)\nrv = torch.ones(3)\nw = " << py_tensor(w)
         << "\nb = " << py_tensor(b) << "\n";
    std::vector<Tensor> ours;
    for (int step = 0; step < 4; ++step) {
      bool training = step < 3;
      Tensor x = randn_of({4, 3, 5, 2}, DType::Float32, 20 + step);
      x = add(mul(x, scalar_like(step + 1, DType::Float32)), scalar_like(step, DType::Float32));
      ours.push_back(batch_norm(x, rm, rv, w, b, training, momentum, 1e-5, nbt));
      ours.push_back(rm.clone());
      ours.push_back(rv.clone());
      std::string factor = cumulative ? "1.0 / " + std::to_string(step + 1) : "0.1";
      code << "out.append(F.batch_norm(" << py_tensor(x) << ", rm, rv, w, b, training=" << (training ? "True" : "False")
           << ", momentum=" << factor << "))\nout += [rm.clone(), rv.clone()]\n";
    }
    EXPECT_EQ(nbt.item<int64_t>(), 3);
    std::vector<Tensor> ref = torch_tensors(code.str());
    ASSERT_EQ(ref.size(), ours.size());
    for (size_t i = 0; i < ours.size(); ++i)
      EXPECT_LE(relative_error(ours[i], ref[i]), 1e-5)
          << (cumulative ? "momentum None" : "momentum 0.1") << ", step " << i / 3 << ", tensor " << i % 3;
  }
}

// batch_norm_relu in training: one backward node (NativeBatchNormReluBackward) whose output,
// running statistics and gradients of x, weight and bias are those of batch_norm then relu_ bit
// for bit: float32 (the instruction-set kernels: maps of 63 and 256 positions, whole vectors and
// tails; and channels-last) and float64, a channel holding a NaN; in evaluation mode the two ops.
TEST(NnOps, BatchNormReluGivesTheBitsOfBatchNormThenRelu) {
  auto bits = [](const Tensor& t) {
    std::vector<uint64_t> u;
    for (double v : t.to_vector()) {
      uint64_t b;
      std::memcpy(&b, &v, sizeof b);
      u.push_back(b);
    }
    return u;
  };
  for (DType dtype : {DType::Float32, DType::Float64})
    for (const Shape& shape : {Shape{3, 5, 7, 9}, Shape{2, 4, 16, 16}, Shape{4, 3, 1, 1}})
      for (bool channels_last : {false, true}) {
        const std::string where = cat_str(dtype_name(dtype), " ", shape, channels_last ? " channels-last" : "");
        Tensor x = randn_of(shape, dtype, 1);
        {
          NoGradGuard no_grad;
          x.select(0, 1).select(0, 2).view({-1}).select(0, 0).fill_(std::nan(""));
        }
        if (channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
        const Tensor g = randn_of(shape, dtype, 2), w = randn_of({shape[1]}, dtype, 3),
                     b = randn_of({shape[1]}, dtype, 4);
        struct Run {
          Tensor y, x_grad, w_grad, b_grad, running_mean, running_var;
          std::string node;
        };
        auto run = [&](bool fused, bool training) {
          const Tensor xl = x.detach().requires_grad_(), wl = w.detach().requires_grad_(),
                       bl = b.detach().requires_grad_();
          Run r;
          r.running_mean = zeros({shape[1]}, {.dtype = dtype}), r.running_var = ones({shape[1]}, {.dtype = dtype});
          if (fused) {
            r.y = batch_norm_relu(xl, r.running_mean, r.running_var, wl, bl, training);
          } else {
            r.y = batch_norm(xl, r.running_mean, r.running_var, wl, bl, training);
            r.y.relu_();
          }
          r.node = r.y.grad_fn()->name();
          r.y.backward(g);
          r.x_grad = xl.grad(), r.w_grad = wl.grad(), r.b_grad = bl.grad();
          return r;
        };
        for (bool training : {true, false}) {
          const Run fused = run(true, training), separate = run(false, training);
          if (training) {
            EXPECT_EQ(fused.node, "NativeBatchNormReluBackward") << where;
          }
          EXPECT_EQ(bits(fused.y), bits(separate.y)) << where << " training " << training;
          EXPECT_EQ(bits(fused.x_grad), bits(separate.x_grad)) << where << " training " << training;
          EXPECT_EQ(bits(fused.w_grad), bits(separate.w_grad)) << where << " training " << training;
          EXPECT_EQ(bits(fused.b_grad), bits(separate.b_grad)) << where << " training " << training;
          EXPECT_EQ(bits(fused.running_mean), bits(separate.running_mean)) << where << " training " << training;
          EXPECT_EQ(bits(fused.running_var), bits(separate.running_var)) << where << " training " << training;
        }
      }
}

TEST(NnOps, NormsAndSoftmaxMatchTorch) {
  Tensor x = randn_of({2, 6, 3, 5}, DType::Float32, 1).contiguous(MemoryFormat::ChannelsLast).requires_grad_();
  Tensor w = randn_of({6}, DType::Float32, 2).requires_grad_(), b = randn_of({6}, DType::Float32, 3).requires_grad_();
  Tensor lw = randn_of({3, 5}, DType::Float32, 4).requires_grad_(),
         lb = randn_of({3, 5}, DType::Float32, 5).requires_grad_();
  Tensor big = mul(randn_of({4, 7}, DType::Float32, 6), scalar_like(200, DType::Float32)).requires_grad_();
  std::vector<Tensor> ys = {
      group_norm(x, 3, w, b), layer_norm(x, {3, 5}, lw, lb), batch_norm(x, Tensor(), Tensor(), w, b, true),
      softmax(x, 1),          log_softmax(big, -1),          softmax(big, 0)};
  Tensor loss = zeros({});
  std::ostringstream code;
  code << "import torch.nn.functional as F\nx = " << py_tensor(x) << ".requires_grad_()\nw = " << py_tensor(w)
       << ".requires_grad_()\nb = " << py_tensor(b) << ".requires_grad_()\nlw = " << py_tensor(lw)
       << ".requires_grad_()\nlb = " << py_tensor(lb) << ".requires_grad_()\nbig = " << py_tensor(big)
       << ".requires_grad_()\nys = [F.group_norm(x, 3, w, b), F.layer_norm(x, (3, 5), lw, lb), "
       << "F.batch_norm(x, None, None, w, b, training=True), torch.softmax(x, 1), "
          "torch.log_softmax(big, -1), "
       << "torch.softmax(big, 0)]\nloss = 0\n";
  for (size_t i = 0; i < ys.size(); ++i) {
    Tensor r = randn_of(ys[i].shape(), DType::Float32, 30 + i);
    loss = add(loss, sum(mul(ys[i], r)));
    code << "loss = loss + (ys[" << i << "] * " << py_tensor(r) << ").sum()\n";
  }
  loss.backward();
  code << "loss.backward()\nout += ys + [x.grad, w.grad, b.grad, lw.grad, lb.grad, big.grad]\n";
  std::vector<Tensor> ours = ys;
  for (const Tensor& t : {x, w, b, lw, lb, big}) ours.push_back(t.grad());
  std::vector<Tensor> ref = torch_tensors(code.str());
  ASSERT_EQ(ref.size(), ours.size());
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_LE(relative_error(ours[i], ref[i]), 1e-5) << "tensor " << i;
}

}  // namespace
}  // namespace tvc::test
