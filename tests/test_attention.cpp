// nn::MultiheadAttention against torch 1.13's nn.MultiheadAttention (tests/torch_golden.h): the
// state_dict and repr of each configuration, initialisation, outputs, attention weights and the
// gradients of the inputs and every parameter with the same weights, in float32 (err <= 1e-5)
// and float64 (err <= 1e-8), with and without masks, batch_first, unbatched input, kdim/vdim,
// add_bias_kv and add_zero_attn; hooks, dropout and errors. The attention op (tvc::attention)
// that serves it: row blocks against the whole products, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "../kernels/cpu/gemm.h"
#include "compare.h"
#include "test_helpers.h"
#include "torch_golden.h"
#include "tvc/autograd.h"
#include "tvc/internal/kernel.h"
#include "tvc/nn/attention.h"
#include "tvc/nn/init.h"
#include "tvc/profiler.h"

namespace tvc::test {
namespace {

using nn::AttentionArgs;
using nn::MultiheadAttention;
using nn::MultiheadAttentionOptions;

Tensor randn_of(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, {}, &gen);
}

// A bool mask with about a quarter of the entries set, never the first key of a row (a row with
// every key masked gives NaN).
Tensor bool_mask(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  Tensor u = rand(shape, {}, &gen);
  u.narrow(u.dim() - 1, 0, 1).fill_(1.0);
  return u < 0.25;
}

// One configuration and call. E = 8, H = 2 (head_dim 4), N = 3, L = 4, S = 5.
struct AttentionCase {
  std::string py_options;  // nn.MultiheadAttention(8, 2, <py_options>)
  MultiheadAttentionOptions options;
  Shape query, key;  // key empty: self-attention, the query passed as key and value
  int64_t vdim = 8;
  Tensor key_padding_mask{}, attn_mask{};
  bool need_weights = true, average_attn_weights = true;
};

std::vector<AttentionCase> attention_cases() {
  const bool avg = true;
  return {
      {"", {}, {4, 3, 8}, {5, 3, 8}},
      {"batch_first=True", {.batch_first = true}, {3, 4, 8}, {}},
      {"batch_first=True",
       {.batch_first = true},
       {3, 4, 8},
       {3, 5, 8},
       8,
       bool_mask({3, 5}, 1),
       bool_mask({4, 5}, 2),
       true,
       !avg},
      {"", {}, {4, 3, 8}, {5, 3, 8}, 8, bool_mask({3, 5}, 3), randn_of({6, 4, 5}, 4)},
      {"", {}, {4, 3, 8}, {}, 8, Tensor(), randn_of({4, 4}, 5), true, !avg},
      {"batch_first=True", {.batch_first = true}, {3, 4, 8}, {3, 5, 8}, 8, randn_of({3, 5}, 6), Tensor(), false},
      {"bias=False, kdim=6, vdim=7", {.bias = false, .kdim = 6, .vdim = 7}, {4, 3, 8}, {5, 3, 6}, 7},
      {"add_bias_kv=True, add_zero_attn=True",
       {.add_bias_kv = true, .add_zero_attn = true},
       {4, 3, 8},
       {5, 3, 8},
       8,
       bool_mask({3, 5}, 7),
       bool_mask({4, 5}, 8)},
      {"batch_first=True", {.batch_first = true}, {4, 8}, {5, 8}, 8, bool_mask({5}, 9), bool_mask({2, 4, 5}, 10)},
  };
}

std::string py_or_none(const Tensor& t, const std::string& dtype) {
  if (!t.defined()) return "None";
  return py_tensor(t) + (t.dtype() == DType::Bool ? "" : ".to(" + dtype + ")");
}

TEST(MultiheadAttention, StateDictReprAndInitialisationArePyTorchs) {
  std::vector<AttentionCase> cases = attention_cases();
  std::string code = "import torch.nn as nn\nres = []\n";
  for (const auto& c : cases) {
    code += "m = nn.MultiheadAttention(8, 2, " + c.py_options + ")\n";
    code += "res.append([repr(m)] + [f\"{k} {list(v.shape)}\" for k, v in m.state_dict().items()])\n";
  }
  nlohmann::json want = torch_json(code + "print(json.dumps(res))\n");
  ASSERT_EQ(want.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    MultiheadAttention m(8, 2, cases[i].options);
    std::vector<std::string> got = {m.repr()};
    for (const auto& [k, v] : m.state_dict()) got.push_back(k + " " + shape_str(v.shape()));
    EXPECT_EQ(got, want[i].get<std::vector<std::string>>()) << cases[i].py_options;
  }

  // xavier_uniform_ in_proj_weight (3E, E): bound sqrt(6 / 4E); out_proj.weight Linear's
  // U(+-1/sqrt(E)); zero biases.
  manual_seed(1);
  MultiheadAttention m(64, 4);
  auto max_abs = [](const Tensor& t) { return max(abs(t.detach())).item_double(); };
  double bound = std::sqrt(6.0 / 256);
  EXPECT_LE(max_abs(m.parameter("in_proj_weight")), bound);
  EXPECT_GT(max_abs(m.parameter("in_proj_weight")), 0.99 * bound);
  EXPECT_LE(max_abs(m.child_as<nn::Linear>("out_proj").weight()), 1 / 8.0);
  EXPECT_GT(max_abs(m.child_as<nn::Linear>("out_proj").weight()), 0.95 / 8.0);
  EXPECT_EQ(max_abs(m.parameter("in_proj_bias")), 0);
  EXPECT_EQ(max_abs(m.child_as<nn::Linear>("out_proj").bias()), 0);
}

// Output, weights, input gradients and parameter gradients of each case against PyTorch's, with
// the same weights, in float32 and float64.
TEST(MultiheadAttention, OutputsAndGradientsMatchPyTorch) {
  manual_seed(2);
  std::vector<AttentionCase> cases = attention_cases();
  std::string code = "import torch.nn as nn\nres = []\n";
  std::vector<std::vector<Tensor>> ours;
  for (size_t i = 0; i < cases.size(); ++i) {
    const AttentionCase& c = cases[i];
    auto m = std::make_shared<MultiheadAttention>(8, 2, c.options);
    for (auto& p : m->parameters()) nn::init::uniform_(p, -0.5, 0.5);  // non-zero biases too
    const bool self = c.key.empty();
    Tensor q = randn_of(c.query, 100 + i), k = self ? q : randn_of(c.key, 200 + i);
    Shape value_shape = self ? c.query : c.key;
    value_shape.back() = c.vdim;
    Tensor v = self ? q : randn_of(value_shape, 300 + i);
    nn::StateDict weights = m->state_dict();
    for (auto [dtype, py_dtype] :
         {std::pair{DType::Float32, "torch.float32"}, std::pair{DType::Float64, "torch.float64"}}) {
      m->to(dtype);
      m->zero_grad();
      Tensor qi = q.to(dtype).detach().requires_grad_();
      Tensor ki = self ? qi : k.to(dtype).detach().requires_grad_();
      Tensor vi = self ? qi : v.to(dtype).detach().requires_grad_();
      Tensor kpm = c.key_padding_mask.defined() && c.key_padding_mask.dtype() != DType::Bool
                       ? c.key_padding_mask.to(dtype)
                       : c.key_padding_mask;
      Tensor am = c.attn_mask.defined() && c.attn_mask.dtype() != DType::Bool ? c.attn_mask.to(dtype) : c.attn_mask;
      auto [out, w] = (*m)(qi, ki, vi,
                           {.key_padding_mask = kpm,
                            .need_weights = c.need_weights,
                            .attn_mask = am,
                            .average_attn_weights = c.average_attn_weights});
      Tensor gout = randn_of(out.shape(), 400 + i).to(dtype);
      Tensor loss = (out * gout).sum();
      Tensor gw;
      if (w.defined()) {
        gw = randn_of(w.shape(), 500 + i).to(dtype);
        loss = loss + (w * gw).sum();
      }
      loss.backward();
      std::vector<Tensor> r = {out, w, qi.grad(), ki.grad(), vi.grad()};
      for (const auto& p : m->parameters()) r.push_back(p.grad());
      ours.push_back(r);

      code += "m = nn.MultiheadAttention(8, 2, " + c.py_options + ")\nm.load_state_dict({";
      for (const auto& [name, t] : weights) code += "'" + name + "': " + py_tensor(t) + ",\n";
      code += std::string("})\nm.to(") + py_dtype + ")\n";
      code += "q = " + py_tensor(q) + ".to(" + py_dtype + ").requires_grad_()\n";
      code += self ? "k = v = q\n"
                   : "k = " + py_tensor(k) + ".to(" + py_dtype + ").requires_grad_()\nv = " + py_tensor(v) + ".to(" +
                         py_dtype + ").requires_grad_()\n";
      code += "out, w = m(q, k, v, key_padding_mask=" + py_or_none(kpm, py_dtype) +
              ", need_weights=" + (c.need_weights ? "True" : "False") + ", attn_mask=" + py_or_none(am, py_dtype) +
              ", average_attn_weights=" + (c.average_attn_weights ? "True" : "False") + ")\n";
      code += "loss = (out * " + py_tensor(gout) + ").sum()\n";
      if (w.defined()) code += "loss = loss + (w * " + py_tensor(gw) + ").sum()\n";
      code += "loss.backward()\n";
      code +=
          "res.append([_t(out), None if w is None else _t(w), _t(q.grad), _t(k.grad), _t(v.grad)] + "
          "[_t(p.grad) for p in m.parameters()])\n";
    }
  }
  nlohmann::json want = torch_json(code + "print(json.dumps(res))\n");
  ASSERT_EQ(want.size(), ours.size());
  double worst[2] = {0, 0};  // float32, float64
  for (size_t i = 0; i < ours.size(); ++i) {
    const AttentionCase& c = cases[i / 2];
    const bool float64 = i % 2 == 1;
    ASSERT_EQ(want[i].size(), ours[i].size()) << c.py_options;
    for (size_t k = 0; k < ours[i].size(); ++k) {
      SCOPED_TRACE("case " + std::to_string(i / 2) + " (" + c.py_options + ") " + (float64 ? "float64" : "float32") +
                   " tensor " + std::to_string(k));
      if (want[i][k].is_null()) {
        EXPECT_FALSE(ours[i][k].defined());
        continue;
      }
      Tensor expected = tensor_from_json(want[i][k]);
      EXPECT_EQ(ours[i][k].shape(), expected.shape());
      double err = relative_error(ours[i][k], expected);
      EXPECT_LE(err, float64 ? 1e-8 : 1e-5);
      worst[float64] = std::max(worst[float64], err);
    }
  }
  std::printf("MultiheadAttention against torch: largest err float32 %.2e, float64 %.2e\n", worst[0], worst[1]);
}

// forward(x) is the self-attention output; both calls run the hooks, the three-input call with
// (query, key, value, key_padding_mask, attn_mask) in and (output, weights) out.
TEST(MultiheadAttention, CallsRunHooks) {
  manual_seed(3);
  auto m = std::make_shared<MultiheadAttention>(8, 2, MultiheadAttentionOptions{.batch_first = true});
  std::vector<std::pair<size_t, size_t>> seen;
  m->register_forward_hook([&](nn::Module&, const nn::TensorList& args, const nn::TensorList& out) {
    seen.emplace_back(args.size(), out.size());
    return std::nullopt;
  });
  Tensor x = randn_of({2, 4, 8}, 4);
  Tensor self = (*m)(x);
  auto [out, weights] = (*m)(x, x, x, {.need_weights = false});
  EXPECT_FALSE(weights.defined());
  EXPECT_EQ(relative_error(self, out), 0);
  EXPECT_EQ(seen, (std::vector<std::pair<size_t, size_t>>{{1, 1}, {5, 2}}));
  // A pre-hook may replace the inputs, masks included.
  m->register_forward_pre_hook([](nn::Module&, const nn::TensorList& args) -> std::optional<nn::TensorList> {
    nn::TensorList a = args;
    a[4] = full({4, 4}, 0.0) < 0.0;  // an all-false attn_mask
    a[4].narrow(1, 1, 3).fill_(1);
    return a;
  });
  auto [masked, w] = (*m)(x, x, x);
  EXPECT_EQ(w.narrow(2, 1, 3).abs().sum().item_double(), 0);  // only the first key is attended
}

TEST(MultiheadAttention, DropoutAppliesInTrainingOnly) {
  manual_seed(4);
  MultiheadAttention m(8, 2, {.dropout = 0.5, .batch_first = true});
  Tensor x = randn_of({2, 6, 8}, 5);
  m.eval();
  Tensor eval_w = m(x, x, x, {.average_attn_weights = false}).second;  // (N, H, L, S)
  m.train();
  Tensor train_w = m(x, x, x, {.average_attn_weights = false}).second;
  EXPECT_EQ(train_w.shape(), (Shape{2, 2, 6, 6}));
  Tensor kept = abs(train_w) > 0.0;
  double kept_share = kept.to(DType::Float64).mean().item_double();
  EXPECT_GT(kept_share, 0.3);
  EXPECT_LT(kept_share, 0.7);
  // The kept weights are scaled by 1 / (1 - p).
  Tensor none = zeros_like(train_w);
  EXPECT_LE(relative_error(train_w, where(kept, eval_w * 2.0, none)), 1e-6);
}

TEST(MultiheadAttention, ErrorsNameTheArgument) {
  EXPECT_NE(
      test::error_of([] { MultiheadAttention(10, 3); }).find("embed_dim must be divisible by num_heads, got 10 and 3"),
      std::string::npos);
  MultiheadAttention m(8, 2);
  Tensor q = randn_of({4, 3, 8}, 6);
  EXPECT_NE(test::error_of([&] {
              m(q, q, q, {.attn_mask = bool_mask({4, 5}, 7)});
            }).find("the shape of the 2D attn_mask is [4, 5], but should be [4, 4]"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              m(q, q, q, {.key_padding_mask = ones({3, 4}, {.dtype = DType::Int64})});
            }).find("only bool and floating key_padding_mask are supported, got int64"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              m(randn_of({4, 3, 6}, 8));
            }).find("was expecting embedding dimension of 8, but got 6"),
            std::string::npos);
}

// The attention op computes its scores in blocks of rows when (L, S) is large (here 300 x 250
// in two blocks): every element is the same sum in the same order as the whole products' (bmm,
// the bias added, softmax, bmm), bit for bit; and the result keeps q's memory order.
TEST(AttentionOp, RowBlocksGiveTheBitsOfTheWholeProducts) {
  const Tensor q = randn_of({2, 300, 5}, 9), k = randn_of({2, 250, 5}, 10), v = randn_of({2, 250, 3}, 11),
               bias = randn_of({300, 250}, 12);
  const Tensor fused = attention(q, k, v, bias);
  const Tensor composed = matmul(softmax(matmul(q, k.transpose(1, 2)) + bias, -1), v);
  ASSERT_EQ(fused.shape(), composed.shape());
  EXPECT_EQ(max(abs(fused - composed)).item<float>(), 0.f);
  // Heads as views (N, H, L, D) of (N, L, H, D): the result's memory is (N, L, H, Dv).
  const Tensor heads = randn_of({2, 7, 3, 4}, 13).permute({0, 2, 1, 3});
  const Tensor out = attention(heads, heads, heads);
  EXPECT_TRUE(out.permute({0, 2, 1, 3}).is_contiguous());
  EXPECT_LT(relative_error(out, matmul(softmax(matmul(heads, heads.transpose(2, 3)), -1), heads)), 1e-6);
}

// Masked pairs (-100, as Swin's shifted windows) get weights in the denormal range, which the
// kernel and the backward read and make as zeros (a microcode assist each otherwise), on every
// thread they use: the output and the gradients keep the bits of the composed ops, which keep the
// denormals, and the caller's arithmetic keeps them after.
TEST(AttentionOp, MaskedPairsGiveTheBitsOfTheComposedOps) {
  const Tensor q = randn_of({4, 49, 32}, 18).requires_grad_(), k = randn_of({4, 49, 32}, 19).requires_grad_(),
               v = randn_of({4, 49, 32}, 20).requires_grad_(), r = randn_of({4, 49, 32}, 22);
  std::vector<float> masked;
  for (double x : randn_of({49, 49}, 21).to_vector()) masked.push_back(x < 0 ? -100.f : 0.f);
  const Tensor mask = tensor(masked, Shape{49, 49});
  const Tensor weights = softmax(matmul(q, k.transpose(1, 2)) + mask, -1);
  int64_t denormals = 0;
  for (double w : weights.to_vector()) denormals += w > 0 && w < 1.17549435e-38;
  ASSERT_GT(denormals, 100);  // the case the kernel meets
  const Tensor composed = matmul(weights, v), fused = attention(q, k, v, Tensor(), mask);
  EXPECT_EQ(max(abs(fused - composed)).item<float>(), 0.f);
  const std::vector<Tensor> composed_grads = grad({sum(composed * r)}, {q, k, v});
  const std::vector<Tensor> fused_grads = grad({sum(fused * r)}, {q, k, v});
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(max(abs(fused_grads[i] - composed_grads[i])).item<float>(), 0.f) << i;
  // This thread still makes denormals (1e-41 here) after the kernel.
  const Tensor tiny = tensor(std::vector<float>{1e-38f, 2e-38f}), small = tensor(std::vector<float>{1e-3f, 1e-3f});
  EXPECT_GT(min(tiny * small).item<double>(), 0.0);
}

// The backward kernel (attention_backward) against the composed ops' gradients: q, k and v as
// strided views of one tensor (as ViT's and Swin's heads are), a bias broadcast over the batch and
// a mask over the heads, both requiring grad (their gradients the kernel's dS summed to their
// shapes); 300 keys make the weights' rows two blocks (kAttentionScores: 218 rows), dk and dv
// summed over them; 7 rows take gemm's dot-product form. Exact bits are not asked for (the blocks
// split the sums over the rows).
TEST(AttentionOp, BackwardKernelGivesTheComposedOpsGradients) {
  struct Case {
    int64_t windows, L, heads, D;
  };
  uint64_t seed = 60;
  for (const Case c : {Case{6, 49, 3, 8}, Case{2, 300, 2, 5}, Case{3, 7, 2, 4}}) {
    const Tensor qkv = randn_of({2, c.windows, c.L, 3, c.heads, c.D}, ++seed);
    std::vector<Tensor> in;
    for (int64_t i = 0; i < 3; ++i) in.push_back(qkv.select(3, i).permute({0, 1, 3, 2, 4}).detach().requires_grad_());
    in.push_back(randn_of({c.heads, c.L, c.L}, ++seed).requires_grad_());
    in.push_back(randn_of({c.windows, 1, c.L, c.L}, ++seed).requires_grad_());
    const Tensor r = randn_of({2, c.windows, c.heads, c.L, c.D}, ++seed);
    const Tensor fused = attention(in[0], in[1], in[2], in[3], in[4]);
    const Tensor composed = matmul(softmax(matmul(in[0], in[1].transpose(-2, -1)) + in[3] + in[4], -1), in[2]);
    EXPECT_EQ(max(abs(fused - composed)).item<float>(), 0.f);
    KernelProfiler profiler;
    const std::vector<Tensor> fused_grads = grad({sum(fused * r)}, in);
    int64_t runs = 0;
    for (const KernelRecord& record : profiler.records()) runs += record.op == "attention_backward";
    EXPECT_EQ(runs, 1);
    const std::vector<Tensor> composed_grads = grad({sum(composed * r)}, in);
    for (size_t i = 0; i < in.size(); ++i)
      EXPECT_LE(relative_error(fused_grads[i], composed_grads[i]), 1e-6) << "L " << c.L << " input " << i;
  }
}

// With few keys (S up to 4 vectors of the instruction set's lanes) and more than 8 rows the kernel
// keeps each row's scores in registers through one pass ("few keys, rows in registers"), with the
// sums of the composed ops: bit for bit on every instruction set, taken in turn, for partial
// vectors of keys and of v's columns, rows not a multiple of the pass's 4, q with strided rows, k
// contiguous and transposed, a bias broadcast over the batch and a mask of -100 and -inf entries.
TEST(AttentionOp, FewKeysGiveTheBitsOfTheComposedOps) {
  struct Case {
    int64_t L, S, D, Dv;
  };
  uint64_t seed = 30;
  for (const Case c : {Case{49, 49, 32, 32}, Case{13, 7, 9, 6}, Case{9, 17, 16, 40}, Case{30, 33, 24, 18},
                       Case{11, 64, 9, 70}, Case{8, 49, 32, 32}, Case{100, 2, 40, 16}, Case{12, 65, 8, 8}}) {
    const Tensor q = randn_of({2, 3, c.L, 2 * c.D}, ++seed).narrow(3, 0, c.D);
    const Tensor k = seed % 2 ? randn_of({2, 3, c.S, c.D}, ++seed) : randn_of({2, 3, c.D, c.S}, ++seed).transpose(2, 3);
    const Tensor v = randn_of({2, 3, c.S, c.Dv}, ++seed), bias = randn_of({3, c.L, c.S}, ++seed);
    std::vector<float> masked;
    int64_t at = 0;
    for (double x : randn_of({c.L, c.S}, ++seed).to_vector())
      masked.push_back(at++ % c.S == 0 ? 0.f : x < -1 ? -INFINITY : x < 0 ? -100.f : 0.f);
    const Tensor mask = tensor(masked, Shape{c.L, c.S});
    for (Isa isa : available_isas()) {
      set_isa(isa);
      const Tensor composed = matmul(softmax(matmul(q, k.transpose(2, 3)) + bias + mask, -1), v);
      const std::string where = cat_str("L ", c.L, " S ", c.S, " D ", c.D, " Dv ", c.Dv, " ", isa_name(isa));
      KernelProfiler profiler;
      const Tensor fused = attention(q, k, v, bias, mask);
      const std::vector<KernelRecord> records = profiler.records();
      ASSERT_EQ(fused.shape(), composed.shape()) << where;
      EXPECT_EQ(fused.to_vector(), composed.to_vector()) << where;
      ASSERT_EQ(records.size(), 1u) << where;
      EXPECT_EQ(records[0].path,
                c.L > 8 && c.S <= cpu::attention_short_keys() ? "few keys, rows in registers" : "gemm, softmax, gemm")
          << where;
    }
    set_isa(available_isas().back());
  }
}

// A parallel region's workers take the floating-point mode of the thread that starts it: with
// denormals flushed on the caller, a product of many elements (split over threads) has none.
TEST(AttentionOp, KernelThreadsTakeTheCallersFloatMode) {
  const int64_t n = int64_t{1} << 20;
  const Tensor tiny = full({n}, 1e-38), small = full({n}, 1e-3);
  EXPECT_GT(min(tiny * small).item<double>(), 0.0);
  Tensor flushed;
  {
    const DenormalsAsZero no_denormals;
    flushed = tiny * small;
  }
  EXPECT_EQ(max(flushed).item<double>(), 0.0);  // read here, where a denormal is read as such
  EXPECT_GT(min(tiny * small).item<double>(), 0.0);
}

TEST(AttentionOp, ErrorsNameTheTensor) {
  const Tensor q = randn_of({2, 3, 4}, 14);
  EXPECT_NE(test::error_of([&] {
              attention(q, randn_of({2, 5, 3}, 15), randn_of({2, 5, 3}, 16));
            }).find("attention: q [2, 3, 4], k [2, 5, 3] and v [2, 5, 3] do not fit (*, L, D), (*, S, D), (*, S, Dv)"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              attention(q, q, q, randn_of({2, 4, 3}, 17));
            }).find("attention: bias of shape [2, 4, 3] does not broadcast to the scores' shape [2, 3, 3]"),
            std::string::npos);
}

}  // namespace
}  // namespace tvc::test
