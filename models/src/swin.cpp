// Swin Transformer (v1): swin_t, swin_s, swin_b, as torchvision's models/swin_transformer.py
// builds them.
//
// Shape legend: N batch, H,W the token grid, C channels (embed_dim E at stage 1, doubling at each
// merge), h heads, d = C/h, w the window side (7), T = w*w tokens per window, Hp,Wp the grid
// padded to multiples of w, nW = (Hp/w)*(Wp/w) windows per image, B = N*nW.
//
//   x (N, 3, H0, W0) -> features.0: Conv2d 4x4/4, Permute to NHWC, LayerNorm  (N, H0/4, W0/4, E)
//     -> features.1: blocks (N, H, W, E) -> features.2: PatchMerging (N, ceil(H/2), ceil(W/2), 2E)
//     -> features.3: blocks -> features.4: merging -> features.5: blocks -> features.6: merging
//     -> features.7: blocks                                              (N, H0/32, W0/32, 8E)
//     -> norm -> permute to (N, 8E, H, W) -> avgpool (1x1) -> flatten -> head (N, num_classes)
// The features are NHWC throughout, as torchvision's; features.1, .3, .5, .7 are the stages.
//
// A block (SwinTransformerBlock) maps (N, H, W, C) to itself:
//   x = x + stochastic_depth(attn(norm1(x))),  x = x + stochastic_depth(mlp(norm2(x)))
// with attn the (shifted) window attention below, mlp Linear(C, 4C), GELU, Dropout(0),
// Linear(4C, C), Dropout(0), and blocks alternating shift 0 and w/2. Stochastic depth (per
// sample) drops block k of the K blocks of the model with probability p * k / (K - 1).
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "registry.h"
#include "torchvision_ops.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/init.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"

namespace tvc::models {

namespace {

using nn::LayerNorm;
using nn::Linear;

// torchvision's ShiftedWindowAttention (shifted_window_attention): multi-head self-attention
// within each w x w window of the grid (padded at the bottom and right to multiples of w), the
// grid first rolled up and left by the shift and the attention between tokens that came from
// different regions of the rolled grid masked with -100; no shift along a dim whose padded size
// is not larger than w. Each head adds a learned bias per relative position (dy, dx) in the
// window: relative_position_bias_table ((2w-1)^2, h) indexed by the persistent int64 buffer
// relative_position_index (T*T). (N, H, W, C) -> (N, H, W, C).
class ShiftedWindowAttention : public nn::Cloneable<ShiftedWindowAttention> {
 public:
  ShiftedWindowAttention(int64_t dim, int64_t window, int64_t shift, int64_t num_heads)
      : window_(window), shift_(shift), num_heads_(num_heads) {
    register_module("qkv", std::make_shared<Linear>(dim, 3 * dim));
    register_module("proj", std::make_shared<Linear>(dim, dim));
    Tensor table = zeros({(2 * window - 1) * (2 * window - 1), num_heads});
    nn::init::trunc_normal_(table, 0, 0.02);
    register_parameter("relative_position_bias_table", table);
    // Tokens i = (yi, xi), j = (yj, xj) of a window: row (yi - yj + w - 1) * (2w - 1) + xi - xj + w - 1.
    std::vector<int64_t> index;
    for (int64_t i = 0; i < window * window; ++i)
      for (int64_t j = 0; j < window * window; ++j)
        index.push_back((i / window - j / window + window - 1) * (2 * window - 1) + i % window - j % window + window -
                        1);
    register_buffer("relative_position_index", tensor(index));
  }

  Tensor forward(const Tensor& input) override {
    const int64_t n = input.size(0), height = input.size(1), width = input.size(2), c = input.size(3);
    const int64_t w = window_, tokens = w * w, d = c / num_heads_;
    const int64_t pad_w = (w - width % w) % w, pad_h = (w - height % w) % w;
    Tensor x = pad_w + pad_h > 0 ? pad(input, {0, 0, 0, pad_w, 0, pad_h}) : input;  // (N, Hp, Wp, C)
    const int64_t hp = x.size(1), wp = x.size(2), windows = (hp / w) * (wp / w);
    const std::array<int64_t, 2> shift = {w >= hp ? 0 : shift_, w >= wp ? 0 : shift_};
    const bool shifted = shift[0] + shift[1] > 0;
    if (shifted) x = roll(x, {-shift[0], -shift[1]}, {1, 2});
    // Partition: (N, Hp/w, w, Wp/w, w, C) -> (B, T, C), windows and tokens row-major.
    x = x.view({n, hp / w, w, wp / w, w, c}).permute({0, 1, 3, 2, 4, 5}).reshape({n * windows, tokens, c});

    // softmax(q k^T + bias [+ mask]) v per window and head, the heads as views (B, h, T, d) of
    // (B, T, h, d) memory, so the result's transpose back to (B, T, C) is a view.
    Tensor qkv = child("qkv")(x).reshape({n * windows, tokens, 3, num_heads_, d});  // (B, T, 3, h, d)
    auto heads = [&](const Tensor& t) { return t.permute({0, 2, 1, 3}); };          // (B, T, h, d) -> (B, h, T, d)
    Tensor q = heads(qkv.select(2, 0) * std::pow(static_cast<double>(d), -0.5));
    Tensor k = heads(qkv.select(2, 1)), v = heads(qkv.select(2, 2));
    Tensor attended;  // (B, h, T, d)
    if (shifted) {
      // Windows apart from samples, (N, nW, h, T, *), for the mask (1, nW, 1, T, T).
      auto windowed = [&](const Tensor& t) { return t.view({n, windows, num_heads_, tokens, t.size(3)}); };
      Tensor mask = attention_mask(hp, wp, shift, x).unsqueeze(1).unsqueeze(0);
      attended = attention(windowed(q), windowed(k), windowed(v), relative_position_bias().unsqueeze(0), mask)
                     .view({n * windows, num_heads_, tokens, d});
    } else {
      attended = attention(q, k, v, relative_position_bias());
    }
    x = child("proj")(attended.transpose(1, 2).reshape({n * windows, tokens, c}));  // (B, T, C)

    // Reverse the partition, the roll and the padding.
    x = x.view({n, hp / w, wp / w, w, w, c}).permute({0, 1, 3, 2, 4, 5}).reshape({n, hp, wp, c});
    if (shifted) x = roll(x, {shift[0], shift[1]}, {1, 2});
    return x.slice(1, 0, height).slice(2, 0, width).contiguous();
  }

 private:
  // (1, h, T, T): the table's row for each pair of tokens, per head.
  Tensor relative_position_bias() const {
    const int64_t tokens = window_ * window_;
    Tensor bias = index_select(parameter("relative_position_bias_table"), 0, buffer("relative_position_index"));
    // Contiguous (h * T * T values, once per call): the add to every window then reads it in rows.
    return bias.view({tokens, tokens, num_heads_}).permute({2, 0, 1}).contiguous().unsqueeze(0);
  }

  // (nW, T, T) in like's dtype and device: 0 where two tokens of a window come from the same
  // region of the rolled (Hp, Wp) grid, -100 elsewhere. Along each dim the regions are
  // [0, P - w), [P - w, P - s) and [P - s, P) (P the padded size, s the shift): torchvision's slices.
  Tensor attention_mask(int64_t hp, int64_t wp, std::array<int64_t, 2> shift, const Tensor& like) const {
    const int64_t w = window_, tokens = w * w, windows_x = wp / w;
    auto region = [w](int64_t pos, int64_t size, int64_t s) { return pos < size - w ? 0 : pos < size - s ? 1 : 2; };
    auto label = [&](int64_t window, int64_t token) {
      int64_t y = window / windows_x * w + token / w, x = window % windows_x * w + token % w;
      return 3 * region(y, hp, shift[0]) + region(x, wp, shift[1]);
    };
    const int64_t windows = (hp / w) * windows_x;
    std::vector<int64_t> labels;  // (nW, T)
    labels.reserve(static_cast<size_t>(windows * tokens));
    for (int64_t win = 0; win < windows; ++win)
      for (int64_t token = 0; token < tokens; ++token) labels.push_back(label(win, token));
    const Tensor l = tensor(labels, Shape{windows, tokens}).to(like.device());
    return masked_fill(zeros({windows, tokens, tokens}, {.dtype = like.dtype(), .device = like.device()}),
                       ne(l.unsqueeze(2), l.unsqueeze(1)), -100.0);
  }

  int64_t window_, shift_, num_heads_;
};

// torchvision's SwinTransformerBlock (see the top of the file). (N, H, W, C) -> (N, H, W, C).
class SwinBlock : public nn::Cloneable<SwinBlock> {
 public:
  SwinBlock(int64_t dim, int64_t num_heads, int64_t window, int64_t shift, double stochastic_depth_prob) {
    register_module("norm1", std::make_shared<LayerNorm>(dim));
    register_module("attn", std::make_shared<ShiftedWindowAttention>(dim, window, shift, num_heads));
    register_module("stochastic_depth", std::make_shared<detail::StochasticDepth>(stochastic_depth_prob, "row"));
    register_module("norm2", std::make_shared<LayerNorm>(dim));
    register_module("mlp", detail::gelu_mlp(dim, {4 * dim, dim}, 0.0));
  }
  Tensor forward(const Tensor& input) override {
    Tensor x = input + child("stochastic_depth")(child("attn")(child("norm1")(input)));
    return x + child("stochastic_depth")(child("mlp")(child("norm2")(x)));
  }
};

// torchvision's PatchMerging: each 2x2 patch's tokens concatenated (odd H or W padded with zeros
// at the bottom or right first), normalised and projected.
// (N, H, W, C) -> (N, ceil(H/2), ceil(W/2), 2C).
class PatchMerging : public nn::Cloneable<PatchMerging> {
 public:
  explicit PatchMerging(int64_t dim) {
    register_module("reduction", std::make_shared<Linear>(4 * dim, 2 * dim, false));
    register_module("norm", std::make_shared<LayerNorm>(4 * dim));
  }
  Tensor forward(const Tensor& input) override {
    const int64_t pad_w = input.size(-2) % 2, pad_h = input.size(-3) % 2;
    Tensor x = pad_w + pad_h > 0 ? pad(input, {0, 0, 0, pad_w, 0, pad_h}) : input;
    auto part = [&](int64_t y, int64_t x0) { return x.slice(-3, y, x.size(-3), 2).slice(-2, x0, x.size(-2), 2); };
    x = cat({part(0, 0), part(1, 0), part(0, 1), part(1, 1)}, -1);  // (N, H/2, W/2, 4C)
    return child("reduction")(child("norm")(x));
  }
};

struct SwinConfig {
  int64_t embed_dim;
  std::vector<int64_t> depths, num_heads;
  double stochastic_depth_prob;
};

class SwinTransformer : public nn::Cloneable<SwinTransformer, Backbone> {
 public:
  static constexpr int64_t kPatch = 4, kWindow = 7;

  SwinTransformer(std::string name, const SwinConfig& config, int64_t num_classes) : Cloneable(std::move(name)) {
    const int64_t stages = static_cast<int64_t>(config.depths.size());
    auto features = std::make_shared<nn::Sequential>();
    features->append(patch_embedding(config.embed_dim));
    int64_t total_blocks = 0, first_block = 0;
    for (int64_t depth : config.depths) total_blocks += depth;
    for (int64_t s = 0; s < stages; ++s) {
      const int64_t dim = config.embed_dim << s;
      // Stochastic depth of the model's block k: p * k / (K - 1).
      std::vector<double> drop;
      for (int64_t k = first_block; k < first_block + config.depths[s]; ++k)
        drop.push_back(config.stochastic_depth_prob * static_cast<double>(k) / static_cast<double>(total_blocks - 1));
      first_block += config.depths[s];
      features->append(stage(dim, config.num_heads[s], drop));
      stages_.push_back("features." + std::to_string(features->size() - 1));
      if (s + 1 < stages) features->append(std::make_shared<PatchMerging>(dim));
    }
    const int64_t num_features = config.embed_dim << (stages - 1);
    register_module("features", features);
    register_module("norm", std::make_shared<LayerNorm>(num_features));
    register_module("permute", std::make_shared<detail::Permute>(std::vector<int64_t>{0, 3, 1, 2}));
    register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
    register_module("flatten", std::make_shared<nn::Flatten>(1));
    register_module("head", std::make_shared<Linear>(num_features, num_classes));
    // torchvision: every Linear (the blocks' MLPs too, overriding their xavier init) weight
    // trunc_normal(std 0.02), bias 0; the patch convolution and LayerNorms keep PyTorch's defaults.
    for (const auto& m : modules())
      if (auto* linear = dynamic_cast<Linear*>(m.get())) {
        nn::init::trunc_normal_(linear->weight(), 0, 0.02);
        if (linear->bias().defined()) nn::init::zeros_(linear->bias());
      }
  }

  Tensor forward(const Tensor& x) override {
    Tensor out = child("norm")(child("features")(x));                 // (N, H/32, W/32, 8E)
    out = child("flatten")(child("avgpool")(child("permute")(out)));  // (N, 8E)
    return child("head")(out);
  }

  // The output of each stage's blocks: features.1, .3, .5, .7 (NHWC).
  std::vector<std::string> stage_nodes() const override { return stages_; }

 private:
  // features.0: (N, 3, H0, W0) -> Conv2d 4x4/4 -> NHWC -> LayerNorm (N, H0/4, W0/4, E).
  static std::shared_ptr<nn::Sequential> patch_embedding(int64_t embed_dim) {
    return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        std::make_shared<nn::Conv2d>(3, embed_dim, kPatch, nn::ConvOptions{.stride = kPatch}),
        std::make_shared<detail::Permute>(std::vector<int64_t>{0, 2, 3, 1}), std::make_shared<LayerNorm>(embed_dim)});
  }

  // A stage's blocks, one per stochastic depth probability, shifts alternating 0 and w/2.
  static std::shared_ptr<nn::Sequential> stage(int64_t dim, int64_t num_heads, const std::vector<double>& drop) {
    auto blocks = std::make_shared<nn::Sequential>();
    for (size_t i = 0; i < drop.size(); ++i)
      blocks->append(std::make_shared<SwinBlock>(dim, num_heads, kWindow, i % 2 == 0 ? 0 : kWindow / 2, drop[i]));
    return blocks;
  }

  std::vector<std::string> stages_;
};

detail::ModelSpec swin(const std::string& name, const SwinConfig& config) {
  return {.name = name,
          .make = [name, config](const Options& o) -> BackbonePtr {
            return std::make_shared<SwinTransformer>(name, config, *o.num_classes);
          },
          .classifier = "head"};
}

}  // namespace

namespace detail {

std::vector<ModelSpec> swin_models() {
  return {
      // torchvision's swin_t/s/b: embed_dim, depths, num_heads, stochastic_depth_prob.
      swin("swin_t", {96, {2, 2, 6, 2}, {3, 6, 12, 24}, 0.2}),
      swin("swin_s", {96, {2, 2, 18, 2}, {3, 6, 12, 24}, 0.3}),
      swin("swin_b", {128, {2, 2, 18, 2}, {4, 8, 16, 32}, 0.5}),
  };
}

}  // namespace detail

}  // namespace tvc::models
