// The attention blocks (see tvc/hybrid/block_modules.h): SEBlock, ChannelAttention,
// SpatialAttention, ChannelSpatialAttention, CBAMBlock, ECABlock, SqueezeExcitation,
// MultiHeadAttention, AttentionBlock. Maps are (N, C, H, W) here.
#include <cmath>

#include "block_types.h"
#include "tvc/hybrid/block_modules.h"
#include "tvc/ops.h"

namespace tvc::hybrid {

namespace {

int64_t reduced_channels(int64_t channels, int64_t reduction, const char* who) {
  TVC_CHECK(channels >= 1, who, ": channels must be positive, got ", channels);
  TVC_CHECK(reduction >= 1, who, ": reduction must be positive, got ", reduction);
  return std::max<int64_t>(1, channels / reduction);
}

// x * sigmoid(conv([mean over C, max over C])), the spatial step of CBAM and SpatialAttention:
// (N, C, H, W) -> (N, C, H, W) through (N, 2, H, W) and the (N, 1, H, W) gate.
Tensor spatial_gate(const Tensor& x, nn::Module& conv, nn::Module& sigmoid) {
  Tensor stats = cat({mean(x, {1}, true), max(x, 1, true).first}, 1);
  return x * sigmoid(conv(stats));
}

}  // namespace

// ---------------------------------------------------------------- SEBlock

SEBlock::SEBlock(int64_t channels, int64_t reduction, const std::string& activation, Layout layout)
    : Cloneable(layout, channels) {
  int64_t reduced = reduced_channels(channels, reduction, "SEBlock");
  register_module("squeeze", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  register_module("excitation", std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                                    std::make_shared<nn::Linear>(channels, reduced), make_activation(activation),
                                    std::make_shared<nn::Linear>(reduced, channels), std::make_shared<nn::Sigmoid>()}));
}

Tensor SEBlock::forward_map(const Tensor& x) {
  int64_t n = x.size(0), c = x.size(1);
  Tensor s = child("squeeze")(x).reshape({n, c});
  return x * child("excitation")(s).reshape({n, c, 1, 1});
}

// ---------------------------------------------------------------- ChannelAttention, SpatialAttention

ChannelAttention::ChannelAttention(int64_t channels, int64_t reduction, const std::string& activation, Layout layout)
    : Cloneable(layout, channels), relu(activation == "relu") {
  int64_t reduced = reduced_channels(channels, reduction, "ChannelAttention");
  register_module("fc1", std::make_shared<nn::Linear>(channels, reduced));
  register_module("fc2", std::make_shared<nn::Linear>(reduced, channels));
  register_module("sigmoid", std::make_shared<nn::Sigmoid>());
}

Tensor ChannelAttention::forward_map(const Tensor& x) {
  int64_t n = x.size(0), c = x.size(1);
  Tensor e = child("fc1")(adaptive_avg_pool2d(x, {1, 1}).reshape({n, c}));
  e = relu ? tvc::relu(e) : gelu(e);  // functional in the library: no child
  return x * child("sigmoid")(child("fc2")(e)).reshape({n, c, 1, 1});
}

SpatialAttention::SpatialAttention(int64_t kernel_size, Layout layout) : Cloneable(layout, std::nullopt) {
  TVC_CHECK(kernel_size % 2 == 1, "SpatialAttention: kernel_size must be odd, got ", kernel_size);
  register_module("conv", std::make_shared<nn::Conv2d>(2, 1, kernel_size,
                                                       nn::ConvOptions{.padding = kernel_size / 2, .bias = false}));
  register_module("sigmoid", std::make_shared<nn::Sigmoid>());
}

Tensor SpatialAttention::forward_map(const Tensor& x) { return spatial_gate(x, child("conv"), child("sigmoid")); }

ChannelSpatialAttention::ChannelSpatialAttention(int64_t channels, int64_t channel_reduction, int64_t spatial_kernel,
                                                 Layout layout)
    : Cloneable(layout, channels) {
  register_module("channel_attn", std::make_shared<ChannelAttention>(channels, channel_reduction));
  register_module("spatial_attn", std::make_shared<SpatialAttention>(spatial_kernel));
}

Tensor ChannelSpatialAttention::forward_map(const Tensor& x) { return child("spatial_attn")(child("channel_attn")(x)); }

// ---------------------------------------------------------------- CBAMBlock, ECABlock

CBAMBlock::CBAMBlock(int64_t channels, int64_t reduction, int64_t spatial_kernel, Layout layout)
    : Cloneable(layout, channels) {
  int64_t reduced = reduced_channels(channels, reduction, "CBAMBlock");
  register_module("avg_pool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  register_module("max_pool", std::make_shared<nn::AdaptiveMaxPool2d>(1));
  register_module("channel_fc",
                  std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                      std::make_shared<nn::Linear>(channels, reduced, false), std::make_shared<nn::ReLU>(),
                      std::make_shared<nn::Linear>(reduced, channels, false)}));
  register_module("spatial_conv",
                  std::make_shared<nn::Conv2d>(2, 1, spatial_kernel,
                                               nn::ConvOptions{.padding = spatial_kernel / 2, .bias = false}));
  register_module("sigmoid", std::make_shared<nn::Sigmoid>());
}

Tensor CBAMBlock::forward_map(const Tensor& x) {
  int64_t n = x.size(0), c = x.size(1);
  nn::Module& mlp = child("channel_fc");
  Tensor avg = mlp(child("avg_pool")(x).reshape({n, c}));
  Tensor mx = mlp(child("max_pool")(x).reshape({n, c}));
  Tensor y = x * child("sigmoid")(avg + mx).reshape({n, c, 1, 1});
  return spatial_gate(y, child("spatial_conv"), child("sigmoid"));
}

ECABlock::ECABlock(int64_t channels, std::optional<int64_t> kernel_size, double gamma, double beta, Layout layout)
    : Cloneable(layout, channels) {
  TVC_CHECK(channels >= 1, "ECABlock: channels must be positive, got ", channels);
  if (kernel_size) {
    this->kernel_size = *kernel_size;
  } else {
    auto t = static_cast<int64_t>(std::abs((std::log2(static_cast<double>(channels)) + beta) / gamma));
    this->kernel_size = t % 2 ? t : t + 1;
  }
  TVC_CHECK(this->kernel_size >= 1, "ECABlock: kernel_size must be positive, got ", this->kernel_size);
  register_module("avg_pool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  register_module("conv",
                  std::make_shared<nn::Conv1d>(1, 1, this->kernel_size,
                                               nn::ConvOptions{.padding = (this->kernel_size - 1) / 2, .bias = false}));
  register_module("sigmoid", std::make_shared<nn::Sigmoid>());
}

Tensor ECABlock::forward_map(const Tensor& x) {
  int64_t n = x.size(0), c = x.size(1);
  Tensor y = child("conv")(child("avg_pool")(x).reshape({n, 1, c}));  // across channels
  return x * child("sigmoid")(y.reshape({n, c, 1, 1}));
}

// ---------------------------------------------------------------- SqueezeExcitation

SqueezeExcitation::SqueezeExcitation(int64_t channels, int64_t reduction, const std::string& activation,
                                     const std::string& gate_activation, bool use_bn, Layout layout)
    : Cloneable(layout, channels) {
  int64_t reduced = reduced_channels(channels, reduction, "SqueezeExcitation");
  register_module("avg_pool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  std::vector<nn::ModulePtr> fc = {std::make_shared<nn::Linear>(channels, reduced, !use_bn)};
  if (use_bn) fc.push_back(std::make_shared<nn::BatchNorm1d>(reduced));
  if (activation == "swish")
    fc.push_back(std::make_shared<nn::SiLU>());
  else if (activation == "gelu")
    fc.push_back(std::make_shared<nn::GELU>());
  else
    fc.push_back(std::make_shared<nn::ReLU>());
  fc.push_back(std::make_shared<nn::Linear>(reduced, channels));
  if (gate_activation == "hardsigmoid")
    fc.push_back(std::make_shared<nn::Hardsigmoid>());
  else
    fc.push_back(std::make_shared<nn::Sigmoid>());
  register_module("fc", std::make_shared<nn::Sequential>(fc));
}

Tensor SqueezeExcitation::forward_map(const Tensor& x) {
  int64_t n = x.size(0), c = x.size(1);
  return x * child("fc")(child("avg_pool")(x).reshape({n, c})).reshape({n, c, 1, 1});
}

// ---------------------------------------------------------------- MultiHeadAttention

MultiHeadAttention::MultiHeadAttention(int64_t embed_dim, int64_t num_heads, double dropout, bool bias, Layout layout)
    : Cloneable(layout, embed_dim), embed_dim(embed_dim), num_heads(num_heads) {
  TVC_CHECK(num_heads >= 1 && embed_dim % num_heads == 0, "MultiHeadAttention: embed_dim (", embed_dim,
            ") must be divisible by num_heads (", num_heads, ")");
  head_dim = embed_dim / num_heads;
  for (const char* name : {"q_proj", "k_proj", "v_proj", "out_proj"})
    register_module(name, std::make_shared<nn::Linear>(embed_dim, embed_dim, bias));
  register_module("dropout_layer", std::make_shared<nn::Dropout>(dropout));
}

Tensor MultiHeadAttention::attend(const Tensor& tokens) {
  int64_t n = tokens.size(0), l = tokens.size(1);
  auto heads = [&](const char* proj) {  // (N, L, E) -> (N, H, L, D)
    return child(proj)(tokens).reshape({n, l, num_heads, head_dim}).transpose(1, 2);
  };
  Tensor q = heads("q_proj"), k = heads("k_proj"), v = heads("v_proj");
  Tensor scores = matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(head_dim)));
  Tensor weights = child("dropout_layer")(softmax(scores, -1));
  Tensor context = matmul(weights, v).transpose(1, 2).reshape({n, l, embed_dim});
  return child("out_proj")(context);
}

Tensor MultiHeadAttention::forward(const Tensor& x) {
  int64_t channel_dim = layout_ == Layout::NCHW ? 1 : x.dim() - 1;
  TVC_CHECK(x.dim() == (layout_ == Layout::Tokens ? 3 : 4) && x.size(channel_dim) == embed_dim, "MultiHeadAttention(",
            embed_dim, "): expected ", layout_name(layout_), " with ", embed_dim, " channels, got shape ", x.shape());
  if (layout_ == Layout::Tokens) return attend(x);
  if (layout_ == Layout::NHWC)  // positions as tokens: (N, H*W, C)
    return attend(x.reshape({x.size(0), x.size(1) * x.size(2), embed_dim})).reshape(x.shape());
  Tensor tokens = x.flatten(2).transpose(1, 2);  // (N, H*W, C)
  return attend(tokens).transpose(1, 2).reshape(x.shape());
}

// ---------------------------------------------------------------- AttentionBlock

AttentionBlock::AttentionBlock(int64_t channels, const AttentionBlockOptions& options, Layout layout)
    : Cloneable(layout, channels) {
  if (options.use_channel)
    register_module("channel_attn", std::make_shared<ChannelAttention>(channels, options.channel_reduction));
  if (options.use_spatial) register_module("spatial_attn", std::make_shared<SpatialAttention>(options.spatial_kernel));
  if (options.use_cross) {
    TVC_CHECK(channels >= 2, "AttentionBlock: use_cross needs at least 2 channels, got ", channels);
    register_module("cross_attn",
                    std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                        std::make_shared<nn::Conv2d>(channels, channels / 2, 1), std::make_shared<nn::ReLU>(),
                        std::make_shared<nn::Conv2d>(channels / 2, channels, 1), std::make_shared<nn::Sigmoid>()}));
  }
}

Tensor AttentionBlock::forward_map(const Tensor& x) {
  Tensor y = x;
  if (has_child("channel_attn")) y = child("channel_attn")(y);
  if (has_child("spatial_attn")) y = child("spatial_attn")(y);
  if (has_child("cross_attn")) y = y * child("cross_attn")(y);
  return y;
}

// ---------------------------------------------------------------- registration

namespace detail {

std::vector<BlockType> attention_block_types() {
  return {
      {.name = "se",
       .aliases = {"squeeze_excitation", "seblock", "SEBlock"},
       .category = "block",
       .class_name = "SEBlock",
       .description = "squeeze-and-excitation: channel gates from the pooled map",
       .params = {channels_param("channels", ChannelRole::Out), int_param("reduction", 16),
                  string_param("activation", "relu", activation_choices())},
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return std::make_shared<SEBlock>(a.get_int("channels"), a.get_int("reduction"), a.get_string("activation"),
                                          a.layout());
       }},
      {.name = "channel_attention",
       .aliases = {"ca"},
       .category = "attention",
       .class_name = "ChannelAttention",
       .description = "SE-style channel attention with biased fc1/fc2",
       .params = {channels_param("channels", ChannelRole::Out), int_param("reduction", 16),
                  string_param("activation", "relu", {"relu", "gelu"})},
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return std::make_shared<ChannelAttention>(a.get_int("channels"), a.get_int("reduction"),
                                                   a.get_string("activation"), a.layout());
       }},
      {.name = "spatial_attention",
       .aliases = {"sa"},
       .category = "attention",
       .class_name = "SpatialAttention",
       .description = "spatial gate from the channel mean and max",
       .params = {int_param("kernel_size", 7)},
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return std::make_shared<SpatialAttention>(a.get_int("kernel_size"), a.layout());
       }},
      {.name = "cbam",
       .aliases = {"channel_spatial"},
       .category = "attention",
       .class_name = "ChannelSpatialAttention",
       .description = "channel attention then spatial attention",
       .params = {channels_param("channels", ChannelRole::Out), int_param("channel_reduction", 16),
                  int_param("spatial_kernel", 7)},
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return std::make_shared<ChannelSpatialAttention>(a.get_int("channels"), a.get_int("channel_reduction"),
                                                          a.get_int("spatial_kernel"), a.layout());
       }},
      {.name = "cbam_block",
       .aliases = {"CBAMBlock", "cbam_attention"},
       .category = "attention",
       .class_name = "CBAMBlock",
       .description = "CBAM: shared-MLP channel attention on avg and max pools, then a spatial gate",
       .params = {channels_param("channels", ChannelRole::Out), int_param("reduction", 16),
                  int_param("spatial_kernel", 7)},
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return std::make_shared<CBAMBlock>(a.get_int("channels"), a.get_int("reduction"), a.get_int("spatial_kernel"),
                                            a.layout());
       }},
      {.name = "eca",
       .aliases = {"eca_block", "ECABlock", "efficient_channel"},
       .category = "attention",
       .class_name = "ECABlock",
       .description = "efficient channel attention: a 1-d conv across the pooled channels",
       .params = {channels_param("channels", ChannelRole::Out), optional_int_param("kernel_size"),
                  float_param("gamma", 2), float_param("beta", 1)},
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         std::optional<int64_t> k;
         if (a.has("kernel_size")) k = a.get_int("kernel_size");
         return std::make_shared<ECABlock>(a.get_int("channels"), k, a.get_float("gamma"), a.get_float("beta"),
                                           a.layout());
       }},
      {.name = "se_enhanced",
       .aliases = {"squeeze_excite", "se_v2"},
       .category = "attention",
       .class_name = "SqueezeExcitation",
       .description = "squeeze-and-excitation with a choice of activations and BatchNorm",
       .params = {channels_param("channels", ChannelRole::Out), int_param("reduction", 16),
                  string_param("activation", "relu", {"relu", "swish", "gelu"}),
                  string_param("gate_activation", "sigmoid", {"sigmoid", "hardsigmoid"}), bool_param("use_bn", false)},
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return std::make_shared<SqueezeExcitation>(a.get_int("channels"), a.get_int("reduction"),
                                                    a.get_string("activation"), a.get_string("gate_activation"),
                                                    a.get_bool("use_bn"), a.layout());
       }},
      {.name = "multihead_attention",
       .aliases = {"mha"},
       .category = "attention",
       .class_name = "MultiHeadAttention",
       .description = "multi-head self-attention over tokens (or the positions of a map)",
       .params = {channels_param("embed_dim", ChannelRole::Out), int_param("num_heads", 8), float_param("dropout", 0.0),
                  bool_param("bias", true), bool_param("batch_first", true)},
       .layouts = {Layout::Tokens, Layout::NCHW, Layout::NHWC},
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         TVC_CHECK(a.get_bool("batch_first"),
                   "block 'multihead_attention' (MultiHeadAttention): batch_first=false is "
                   "not supported: tvc's tokens are (N, L, C)");
         return std::make_shared<MultiHeadAttention>(a.get_int("embed_dim"), a.get_int("num_heads"),
                                                     a.get_float("dropout"), a.get_bool("bias"), a.layout());
       }},
      {.name = "attention_block",
       .category = "attention",
       .class_name = "AttentionBlock",
       .description = "channel, spatial and cross-channel attention, each optional",
       .params = {channels_param("channels", ChannelRole::Out), bool_param("use_channel", true),
                  bool_param("use_spatial", true), bool_param("use_cross", false), int_param("channel_reduction", 16),
                  int_param("spatial_kernel", 7)},
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return std::make_shared<AttentionBlock>(
             a.get_int("channels"),
             AttentionBlockOptions{.use_channel = a.get_bool("use_channel"),
                                   .use_spatial = a.get_bool("use_spatial"),
                                   .use_cross = a.get_bool("use_cross"),
                                   .channel_reduction = a.get_int("channel_reduction"),
                                   .spatial_kernel = a.get_int("spatial_kernel")},
             a.layout());
       }},
  };
}

}  // namespace detail

}  // namespace tvc::hybrid
