// Vision Transformer (vit_b_16, vit_b_32, vit_l_16, vit_l_32), as torchvision's
// models/vision_transformer.py builds them (no conv stem, no representation layer).
//
//   x (N, 3, S, S), S = image_size -> conv_proj: PxP convolution, stride P  (N, D, G, G), G = S/P
//     -> flatten to tokens, class_token (1, 1, D) prepended                (N, T, D), T = G^2 + 1
//     -> encoder: + pos_embedding (1, T, D), dropout, L encoder blocks, ln (N, T, D)
//     -> the class token's features                                         (N, D)
//     -> heads.head (Linear)                                                (N, num_classes)
// An encoder block (encoder.layers.encoder_layer_K) maps (N, T, D) to (N, T, D):
//   x = x + dropout(self_attention(ln_1(x)))   H heads, nn::MultiheadAttention batch_first
//   x = x + mlp(ln_2(x))                       Linear(D, M), GELU, Dropout, Linear(M, D), Dropout
// with LayerNorms of eps 1e-6. The model only takes S x S images (torchvision asserts it);
// weights made for another image size load with their position embedding interpolated as
// torchvision's interpolate_embeddings does.
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "registry.h"
#include "torchvision_ops.h"
#include "tvc/autograd.h"
#include "tvc/nn/attention.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/init.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"

namespace tvc::models {

namespace {

struct ViTConfig {
  int64_t patch_size, num_layers, num_heads, hidden_dim, mlp_dim;
};

constexpr double kLayerNormEps = 1e-6;

// Older torchvision files name the MLP's Linears linear_1 and linear_2; torchvision's
// MLPBlock._load_from_state_dict renames them to "0" and "3" (files without its version 2).
void rename_old_mlp_keys(nn::StateDict& state_dict, const std::string& prefix) {
  for (int i = 0; i < 2; ++i)
    for (const char* type : {"weight", "bias"}) {
      std::string old_key = prefix + "linear_" + std::to_string(i + 1) + "." + type;
      if (const Tensor* t = state_dict.find(old_key)) {
        Tensor value = *t;
        state_dict.erase(old_key);
        state_dict.insert(prefix + std::to_string(3 * i) + "." + type, value);
      }
    }
}

class EncoderBlock : public nn::Cloneable<EncoderBlock> {
 public:
  EncoderBlock(int64_t num_heads, int64_t hidden_dim, int64_t mlp_dim, double dropout) {
    register_module("ln_1", std::make_shared<nn::LayerNorm>(hidden_dim, kLayerNormEps));
    register_module("self_attention", std::make_shared<nn::MultiheadAttention>(
                                          hidden_dim, num_heads, nn::MultiheadAttentionOptions{.batch_first = true}));
    register_module("dropout", std::make_shared<nn::Dropout>(dropout));
    register_module("ln_2", std::make_shared<nn::LayerNorm>(hidden_dim, kLayerNormEps));
    auto mlp = register_module("mlp", detail::gelu_mlp(hidden_dim, {mlp_dim, hidden_dim}, dropout));
    // torchvision's MLPBlock: xavier_uniform_ weights, N(0, 1e-6^2) biases.
    for (const auto& m : mlp->modules())
      if (auto* linear = dynamic_cast<nn::Linear*>(m.get())) {
        nn::init::xavier_uniform_(linear->weight());
        nn::init::normal_(linear->bias(), 0, 1e-6);
      }
    mlp->register_load_state_dict_pre_hook([](Module&, nn::StateDict& state_dict, const std::string& prefix, bool,
                                              std::vector<std::string>&, std::vector<std::string>&,
                                              std::vector<std::string>&) { rename_old_mlp_keys(state_dict, prefix); });
  }

  // (N, T, D) -> (N, T, D)
  Tensor forward(const Tensor& input) override {
    TVC_CHECK(input.dim() == 3, "EncoderBlock: expected (batch_size, seq_length, hidden_dim) got ", input.shape());
    Tensor x = child("dropout")(child("self_attention")(child("ln_1")(input))) + input;
    return x + child("mlp")(child("ln_2")(x));
  }
};

// torchvision's interpolate_embeddings, for load_state_dict: a position embedding (1, 1 + g^2, D)
// made for another image size becomes the model's (1, 1 + G^2, D): the class token's row kept,
// the g x g grid resized to G x G (bicubic, align_corners=True). Other mismatches are left to
// the load's own size check.
void interpolate_pos_embedding(const nn::Module& encoder, nn::StateDict& state_dict, const std::string& prefix,
                               std::vector<std::string>& error_msgs) {
  Tensor* theirs = state_dict.find(prefix + "pos_embedding");
  Tensor own = encoder.parameter("pos_embedding");
  if (!theirs || theirs->dim() != 3 || theirs->shape() == own.shape() || theirs->size(0) != 1 ||
      theirs->size(2) != own.size(2))
    return;
  const int64_t hidden = own.size(2), seq = theirs->size(1) - 1, new_seq = own.size(1) - 1;
  const auto grid = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(seq))));
  const auto new_grid = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(new_seq))));
  if (grid * grid != seq) {
    error_msgs.push_back(cat_str("the position embedding ", prefix, "pos_embedding ", theirs->shape(),
                                 " has no square grid of ", seq, " patches to interpolate to ", own.shape()));
    return;
  }
  NoGradGuard no_grad;
  Tensor token = theirs->narrow(1, 0, 1);                                                        // (1, 1, D)
  Tensor image = theirs->narrow(1, 1, seq).permute({0, 2, 1}).reshape({1, hidden, grid, grid});  // (1, D, g, g)
  image = interpolate(image, std::array<int64_t, 2>{new_grid, new_grid}, std::nullopt, InterpolateMode::Bicubic, true);
  *theirs = cat({token, image.reshape({1, hidden, new_seq}).permute({0, 2, 1})}, 1);  // (1, 1 + G^2, D)
}

class Encoder : public nn::Cloneable<Encoder> {
 public:
  Encoder(int64_t seq_length, const ViTConfig& c, double dropout) {
    register_parameter("pos_embedding", empty({1, seq_length, c.hidden_dim}));
    nn::init::normal_(parameter("pos_embedding"), 0, 0.02);  // from BERT
    register_module("dropout", std::make_shared<nn::Dropout>(dropout));
    auto layers = std::make_shared<nn::Sequential>();
    for (int64_t i = 0; i < c.num_layers; ++i)
      layers->add_module("encoder_layer_" + std::to_string(i),
                         std::make_shared<EncoderBlock>(c.num_heads, c.hidden_dim, c.mlp_dim, dropout));
    register_module("layers", layers);
    register_module("ln", std::make_shared<nn::LayerNorm>(c.hidden_dim, kLayerNormEps));
    register_load_state_dict_pre_hook([](Module& encoder, nn::StateDict& state_dict, const std::string& prefix, bool,
                                         std::vector<std::string>&, std::vector<std::string>&,
                                         std::vector<std::string>& error_msgs) {
      interpolate_pos_embedding(encoder, state_dict, prefix, error_msgs);
    });
  }

  // (N, T, D) -> (N, T, D)
  Tensor forward(const Tensor& input) override {
    TVC_CHECK(input.dim() == 3, "Encoder: expected (batch_size, seq_length, hidden_dim) got ", input.shape());
    return child("ln")(child("layers")(child("dropout")(input + parameter("pos_embedding"))));
  }
};

class VisionTransformer : public nn::Cloneable<VisionTransformer, Backbone> {
 public:
  VisionTransformer(std::string name, const ViTConfig& c, int64_t image_size, int64_t num_classes, double dropout)
      : Cloneable(std::move(name)), image_size_(image_size), num_layers_(c.num_layers) {
    TVC_CHECK(image_size > 0 && image_size % c.patch_size == 0, model_name(),
              ": image_size must be a positive multiple of the patch size ", c.patch_size, ", got ", image_size);
    const int64_t grid = image_size / c.patch_size;
    register_module("conv_proj", std::make_shared<nn::Conv2d>(3, c.hidden_dim, c.patch_size,
                                                              nn::ConvOptions{.stride = c.patch_size}));
    register_parameter("class_token", zeros({1, 1, c.hidden_dim}));
    register_module("encoder", std::make_shared<Encoder>(grid * grid + 1, c, dropout));
    auto heads = std::make_shared<nn::Sequential>();
    heads->add_module("head", std::make_shared<nn::Linear>(c.hidden_dim, num_classes));
    register_module("heads", heads);
    // torchvision: the patchify stem truncated-normal with std sqrt(1 / fan_in) (bounds +-2),
    // zero bias; the head zeros.
    auto& conv = child_as<nn::Conv2d>("conv_proj");
    const auto fan_in = static_cast<double>(3 * c.patch_size * c.patch_size);
    nn::init::trunc_normal_(conv.weight(), 0, std::sqrt(1 / fan_in));
    nn::init::zeros_(conv.bias());
    auto& head = heads->child_as<nn::Linear>("head");
    nn::init::zeros_(head.weight());
    nn::init::zeros_(head.bias());
  }

  // (N, 3, S, S) -> (N, num_classes)
  Tensor forward(const Tensor& x) override {
    TVC_CHECK(x.dim() == 4, model_name(), ": expected images (N, 3, H, W), got ", x.shape());
    TVC_CHECK(x.size(2) == image_size_ && x.size(3) == image_size_, model_name(), " is built for ", image_size_, "x",
              image_size_, " images (Options::image_size), got ", x.size(2), "x", x.size(3));
    Tensor tokens = child("conv_proj")(x);  // (N, D, G, G)
    const int64_t n = tokens.size(0), hidden = tokens.size(1);
    tokens = tokens.reshape({n, hidden, -1}).permute({0, 2, 1});              // (N, G^2, D)
    tokens = cat({parameter("class_token").expand({n, -1, -1}), tokens}, 1);  // (N, T, D)
    tokens = child("encoder")(tokens);
    return child("heads")(tokens.select(1, 0));  // (N, num_classes)
  }

  // The encoder blocks' outputs at a quarter, half and three quarters of the depth, then the
  // final norm (what the head reads): vit_b_*: encoder.layers.encoder_layer_2, _5, _8,
  // encoder.ln; vit_l_*: _5, _11, _17, encoder.ln. Each is (N, 1 + G^2, D), the class token's
  // row first.
  std::vector<std::string> stage_nodes() const override {
    std::vector<std::string> nodes;
    for (int64_t quarter = 1; quarter <= 3; ++quarter)
      nodes.push_back("encoder.layers.encoder_layer_" + std::to_string(num_layers_ * quarter / 4 - 1));
    nodes.push_back("encoder.ln");
    return nodes;
  }

 private:
  int64_t image_size_;
  int64_t num_layers_;
};

detail::ModelSpec vit(const std::string& name, const ViTConfig& config) {
  return {.name = name,
          .make = [name, config](const Options& o) -> BackbonePtr {
            return std::make_shared<VisionTransformer>(name, config, *o.image_size, *o.num_classes, *o.dropout);
          },
          .has_dropout = true,
          .default_dropout = 0.0,
          .classifier = "heads.head",
          .default_image_size = 224};
}

}  // namespace

namespace detail {

std::vector<ModelSpec> vit_models() {
  return {
      vit("vit_b_16", {.patch_size = 16, .num_layers = 12, .num_heads = 12, .hidden_dim = 768, .mlp_dim = 3072}),
      vit("vit_b_32", {.patch_size = 32, .num_layers = 12, .num_heads = 12, .hidden_dim = 768, .mlp_dim = 3072}),
      vit("vit_l_16", {.patch_size = 16, .num_layers = 24, .num_heads = 16, .hidden_dim = 1024, .mlp_dim = 4096}),
      vit("vit_l_32", {.patch_size = 32, .num_layers = 24, .num_heads = 16, .hidden_dim = 1024, .mlp_dim = 4096}),
  };
}

}  // namespace detail

}  // namespace tvc::models
