// The convolutional blocks (see tvc/hybrid/block_modules.h): ConvBlock, ResidualBlock,
// DepthwiseBlock, InceptionModule, DenseConnectionBlock, the three bottlenecks, CoordConv,
// ConvBNAct, MBConv, FusedMBConv. Maps are (N, C, H, W) here.
#include "block_types.h"
#include "tvc/hybrid/block_modules.h"
#include "tvc/ops.h"

namespace tvc::hybrid {

namespace {

std::shared_ptr<nn::Conv2d> conv(int64_t in, int64_t out, int64_t k, nn::ConvOptions options = {.bias = false}) {
  return std::make_shared<nn::Conv2d>(in, out, k, options);
}

void check_channels(int64_t in_channels, int64_t out_channels, const char* who) {
  TVC_CHECK(in_channels >= 1, who, ": in_channels must be positive, got ", in_channels);
  TVC_CHECK(out_channels >= 1, who, ": out_channels must be positive, got ", out_channels);
}

}  // namespace

// ---------------------------------------------------------------- ConvBlock

ConvBlock::ConvBlock(int64_t in_channels, int64_t out_channels, const ConvBlockOptions& o, Layout layout)
    : Cloneable(layout, out_channels) {
  check_channels(in_channels, out_channels, "ConvBlock");
  TVC_CHECK(o.dropout_rate >= 0 && o.dropout_rate <= 1, "ConvBlock: dropout_rate must be between 0 and 1, got ",
            o.dropout_rate);
  register_module(
      "conv",
      conv(in_channels, out_channels, o.kernel_size,
           {.stride = o.stride, .padding = o.padding, .dilation = o.dilation, .groups = o.groups, .bias = o.bias}));
  if (o.use_batchnorm) register_module("bn", std::make_shared<nn::BatchNorm2d>(out_channels));
  if (o.activation != "none") register_module("activation", make_activation(o.activation));
  if (o.dropout_rate > 0) register_module("dropout", std::make_shared<Dropout2d>(o.dropout_rate));
  nn::Sizes kernel = {o.pooling_kernel_size, o.pooling_kernel_size};
  nn::Sizes stride = {o.pooling_stride, o.pooling_stride};
  if (o.pooling_type == "max")
    register_module("pooling", std::make_shared<nn::MaxPool2d>(kernel, nn::MaxPool2dOptions{.stride = stride}));
  else if (o.pooling_type == "avg")
    register_module("pooling", std::make_shared<nn::AvgPool2d>(kernel, nn::AvgPool2dOptions{.stride = stride}));
  else if (o.pooling_type == "adaptive_avg")
    register_module("pooling", std::make_shared<nn::AdaptiveAvgPool2d>(kernel));
  else
    TVC_CHECK(o.pooling_type == "none", "ConvBlock: unknown pooling type '", o.pooling_type,
              "'; available options: max, avg, adaptive_avg");
}

Tensor ConvBlock::forward_map(const Tensor& x) {
  Tensor y = child("conv")(x);
  for (const char* name : {"bn", "activation", "dropout", "pooling"})
    if (has_child(name)) y = child(name)(y);
  return y;
}

// ---------------------------------------------------------------- ResidualBlock

ResidualBlock::ResidualBlock(int64_t in_channels, int64_t out_channels, const ResidualBlockOptions& o, Layout layout)
    : Cloneable(layout, out_channels) {
  check_channels(in_channels, out_channels, "ResidualBlock");
  register_module("activation_fn", make_activation(o.activation));
  if (o.bottleneck) {
    int64_t mid = std::max<int64_t>(1, out_channels / 4);
    register_module("conv1", conv(in_channels, mid, 1));
    register_module("bn1", make_normalization(o.norm_type, mid));
    register_module("conv2", conv(mid, mid, 3, {.stride = o.stride, .padding = 1, .bias = false}));
    register_module("bn2", make_normalization(o.norm_type, mid));
    register_module("conv3", conv(mid, out_channels, 1));
    register_module("bn3", make_normalization(o.norm_type, out_channels));
  } else {
    register_module("conv1", conv(in_channels, out_channels, 3, {.stride = o.stride, .padding = 1, .bias = false}));
    register_module("bn1", make_normalization(o.norm_type, out_channels));
    register_module("conv2", conv(out_channels, out_channels, 3, {.padding = 1, .bias = false}));
    register_module("bn2", make_normalization(o.norm_type, out_channels));
  }
  if (o.stride != 1 || in_channels != out_channels || o.downsample)
    register_module("downsample_layer", std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                                            conv(in_channels, out_channels, 1, {.stride = o.stride, .bias = false}),
                                            make_normalization(o.norm_type, out_channels)}));
  if (o.use_se) register_module("se_block", std::make_shared<SEBlock>(out_channels, o.se_reduction, o.activation));
}

Tensor ResidualBlock::forward_map(const Tensor& x) {
  nn::Module& act = child("activation_fn");
  Tensor out = act(child("bn1")(child("conv1")(x)));
  out = child("bn2")(child("conv2")(out));
  if (has_child("conv3")) out = child("bn3")(child("conv3")(act(out)));
  if (has_child("se_block")) out = child("se_block")(out);
  Tensor identity = has_child("downsample_layer") ? child("downsample_layer")(x) : x;
  return act(out + identity);
}

// ---------------------------------------------------------------- DepthwiseBlock

DepthwiseBlock::DepthwiseBlock(int64_t in_channels, int64_t out_channels, const DepthwiseBlockOptions& o, Layout layout)
    : Cloneable(layout, out_channels), add_residual(o.add_residual && in_channels == out_channels) {
  check_channels(in_channels, out_channels, "DepthwiseBlock");
  register_module("activation_fn", make_activation(o.activation));
  register_module("depthwise", conv(in_channels, in_channels, o.kernel_size,
                                    {.stride = o.stride, .padding = o.padding, .groups = in_channels, .bias = false}));
  register_module("bn1", make_normalization(o.norm_type, in_channels));
  register_module("pointwise", conv(in_channels, out_channels, 1));
  register_module("bn2", make_normalization(o.norm_type, out_channels));
}

Tensor DepthwiseBlock::forward_map(const Tensor& x) {
  nn::Module& act = child("activation_fn");
  Tensor out = act(child("bn1")(child("depthwise")(x)));
  out = child("bn2")(child("pointwise")(out));
  if (add_residual) out = out + x;
  return act(out);
}

// ---------------------------------------------------------------- InceptionModule

InceptionModule::InceptionModule(int64_t in_channels, int64_t out_1x1, int64_t out_3x3, int64_t out_5x5,
                                 const InceptionModuleOptions& o, Layout layout)
    : Cloneable(layout, std::nullopt) {
  int64_t out_pool = o.out_pool.value_or(out_1x1 / 2);
  TVC_CHECK(in_channels >= 1 && out_1x1 >= 1 && out_3x3 >= 2 && out_5x5 >= 1 && out_pool >= 1,
            "InceptionModule: channel counts must be positive (out_3x3 at least 2), got in_channels ", in_channels,
            ", out_1x1 ", out_1x1, ", out_3x3 ", out_3x3, ", out_5x5 ", out_5x5, ", out_pool ", out_pool);
  output_channels_ = out_1x1 + out_3x3 + out_5x5 + out_pool;
  auto norm = [&](int64_t c) { return make_normalization(o.norm_type, c); };
  using Seq = std::initializer_list<nn::ModulePtr>;
  register_module("activation_fn", make_activation(o.activation));
  register_module("branch_1x1", std::make_shared<nn::Sequential>(Seq{conv(in_channels, out_1x1, 1), norm(out_1x1)}));
  register_module("branch_3x3", std::make_shared<nn::Sequential>(
                                    Seq{conv(in_channels, out_3x3 / 2, 1), norm(out_3x3 / 2),
                                        conv(out_3x3 / 2, out_3x3, 3, {.padding = 1, .bias = false}), norm(out_3x3)}));
  register_module("branch_5x5", std::make_shared<nn::Sequential>(
                                    Seq{conv(in_channels, out_5x5, 1), norm(out_5x5),
                                        conv(out_5x5, out_5x5, 5, {.padding = 2, .bias = false}), norm(out_5x5)}));
  auto pool = std::make_shared<nn::MaxPool2d>(3, nn::MaxPool2dOptions{.stride = 1, .padding = 1});
  register_module("branch_pool",
                  std::make_shared<nn::Sequential>(Seq{pool, conv(in_channels, out_pool, 1), norm(out_pool)}));
}

Tensor InceptionModule::forward_map(const Tensor& x) {
  nn::Module& act = child("activation_fn");
  std::vector<Tensor> branches;
  for (const char* name : {"branch_1x1", "branch_3x3", "branch_5x5", "branch_pool"})
    branches.push_back(act(child(name)(x)));
  return cat(branches, 1);
}

// ---------------------------------------------------------------- DenseConnectionBlock

DenseConnectionBlock::DenseConnectionBlock(int64_t in_channels, const DenseConnectionBlockOptions& o, Layout layout)
    : Cloneable(layout, std::nullopt) {
  TVC_CHECK(o.num_layers >= 1, "DenseConnectionBlock: num_layers must be >= 1, got ", o.num_layers);
  TVC_CHECK(o.growth_rate >= 1, "DenseConnectionBlock: growth_rate must be >= 1, got ", o.growth_rate);
  auto norm_or_identity = [&](int64_t c) -> nn::ModulePtr {
    if (o.use_batchnorm) return std::make_shared<nn::BatchNorm2d>(c);
    return std::make_shared<nn::Identity>();
  };
  auto layers = std::make_shared<nn::ModuleList>();
  int64_t channels = in_channels;
  int64_t mid = o.bottleneck_ratio * o.growth_rate;
  for (int64_t i = 0; i < o.num_layers; ++i, channels += o.growth_rate) {
    nn::ModulePtr dropout = std::make_shared<nn::Identity>();
    if (o.dropout_rate > 0) dropout = std::make_shared<Dropout2d>(o.dropout_rate);
    layers->append(std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        norm_or_identity(channels), std::make_shared<nn::ReLU>(), conv(channels, mid, 1, {.bias = !o.use_batchnorm}),
        norm_or_identity(mid), std::make_shared<nn::ReLU>(),
        conv(mid, o.growth_rate, o.kernel_size, {.padding = o.kernel_size / 2, .bias = !o.use_batchnorm}), dropout}));
  }
  output_channels_ = channels;
  register_module("layers", layers);
}

Tensor DenseConnectionBlock::forward_map(const Tensor& x) {
  auto& layers = child_as<nn::ModuleList>("layers");
  std::vector<Tensor> features = {x};
  for (size_t i = 0; i < layers.size(); ++i) features.push_back((*layers[static_cast<int64_t>(i)])(cat(features, 1)));
  return cat(features, 1);
}

// ---------------------------------------------------------------- bottlenecks

BottleneckBlock::BottleneckBlock(int64_t in_channels, int64_t out_channels, int64_t mid, int64_t groups,
                                 const BottleneckOptions& o, Layout layout)
    : MapBlock(layout, out_channels) {
  check_channels(in_channels, out_channels, "bottleneck");
  register_module("activation_fn", make_activation(o.activation));
  register_module("conv1", conv(in_channels, mid, 1));
  register_module("bn1", make_normalization(o.norm_type, mid));
  register_module("conv2", conv(mid, mid, 3, {.stride = o.stride, .padding = 1, .groups = groups, .bias = false}));
  register_module("bn2", make_normalization(o.norm_type, mid));
  register_module("conv3", conv(mid, out_channels, 1));
  register_module("bn3", make_normalization(o.norm_type, out_channels));
  if (o.stride != 1 || in_channels != out_channels || o.use_downsample)
    register_module("downsample", std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                                      conv(in_channels, out_channels, 1, {.stride = o.stride, .bias = false}),
                                      make_normalization(o.norm_type, out_channels)}));
}

Tensor BottleneckBlock::forward_map(const Tensor& x) {
  nn::Module& act = child("activation_fn");
  Tensor out = act(child("bn1")(child("conv1")(x)));
  out = act(child("bn2")(child("conv2")(out)));
  out = child("bn3")(child("conv3")(out));
  Tensor identity = has_child("downsample") ? child("downsample")(x) : x;
  return act(out + identity);
}

namespace {
int64_t standard_mid(int64_t out_channels, int64_t expansion) {
  TVC_CHECK(expansion >= 1, "bottleneck: expansion must be positive, got ", expansion);
  return std::max<int64_t>(1, out_channels / expansion);
}
int64_t grouped_mid(int64_t out_channels, int64_t expansion, int64_t num_groups) {
  TVC_CHECK(num_groups >= 1, "GroupedBottleneck: num_groups must be positive, got ", num_groups);
  int64_t mid = standard_mid(out_channels, expansion) / num_groups * num_groups;
  return mid == 0 ? num_groups : mid;
}
}  // namespace

StandardBottleneck::StandardBottleneck(int64_t in_channels, int64_t out_channels, const BottleneckOptions& o,
                                       Layout layout)
    : Cloneable(in_channels, out_channels, standard_mid(out_channels, o.expansion), 1, o, layout) {}

WideBottleneck::WideBottleneck(int64_t in_channels, int64_t out_channels, double width_multiplier,
                               const BottleneckOptions& o, Layout layout)
    : Cloneable(in_channels, out_channels,
                std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(out_channels) /
                                                          static_cast<double>(o.expansion) * width_multiplier)),
                1, o, layout) {}

GroupedBottleneck::GroupedBottleneck(int64_t in_channels, int64_t out_channels, int64_t num_groups,
                                     const BottleneckOptions& o, Layout layout)
    : Cloneable(in_channels, out_channels, grouped_mid(out_channels, o.expansion, num_groups),
                std::min(num_groups, grouped_mid(out_channels, o.expansion, num_groups)), o, layout) {}

// ---------------------------------------------------------------- CoordConv

CoordConv::CoordConv(int64_t in_channels, int64_t out_channels, const CoordConvOptions& o, Layout layout)
    : Cloneable(layout, out_channels), with_r(o.with_r) {
  check_channels(in_channels, out_channels, "CoordConv");
  register_module("conv",
                  std::make_shared<nn::Conv2d>(in_channels + (o.with_r ? 3 : 2), out_channels, o.kernel_size, o.conv));
}

Tensor CoordConv::forward_map(const Tensor& x) {
  int64_t n = x.size(0), h = x.size(2), w = x.size(3);
  Tensor xx = linspace(-1, 1, w, {.dtype = x.dtype()}).view({1, 1, 1, w}).expand({n, 1, h, w});
  Tensor yy = linspace(-1, 1, h, {.dtype = x.dtype()}).view({1, 1, h, 1}).expand({n, 1, h, w});
  std::vector<Tensor> parts = {x, xx, yy};
  if (with_r) parts.push_back(sqrt(xx.pow(2) + yy.pow(2)));
  return child("conv")(cat(parts, 1));
}

// ---------------------------------------------------------------- ConvBNAct

ConvBNAct::ConvBNAct(int64_t in_channels, int64_t out_channels, const ConvBNActOptions& o, Layout layout)
    : Cloneable(layout, out_channels) {
  check_channels(in_channels, out_channels, "ConvBNAct");
  register_module("conv", conv(in_channels, out_channels, o.kernel_size,
                               {.stride = o.stride,
                                .padding = o.padding.value_or(o.kernel_size / 2),
                                .groups = o.groups,
                                .bias = !o.use_bn}));
  if (o.use_bn)
    register_module("bn", std::make_shared<nn::BatchNorm2d>(out_channels));
  else
    register_module("bn", std::make_shared<nn::Identity>());
  nn::ModulePtr act;
  if (o.activation == "swish")
    act = std::make_shared<nn::SiLU>();
  else if (o.activation == "gelu")
    act = std::make_shared<nn::GELU>();
  else if (o.activation == "mish")
    act = std::make_shared<Mish>();
  else if (o.activation == "none")
    act = std::make_shared<nn::Identity>();
  else
    act = std::make_shared<nn::ReLU>();
  register_module("act", act);
}

Tensor ConvBNAct::forward_map(const Tensor& x) { return child("act")(child("bn")(child("conv")(x))); }

// ---------------------------------------------------------------- MBConv, FusedMBConv

namespace {

nn::ModulePtr se_or_identity(bool use_se, int64_t hidden, int64_t reduction) {
  if (use_se) return std::make_shared<SqueezeExcitation>(hidden, reduction, "swish");
  return std::make_shared<nn::Identity>();
}

nn::ModulePtr drop_path_or_identity(double drop_path) {
  if (drop_path > 0) return std::make_shared<DropPath>(drop_path);
  return std::make_shared<nn::Identity>();
}

}  // namespace

Tensor InvertedResidualBlock::forward_map(const Tensor& x) {
  Tensor y = x;
  for (const char* name : {"expand", "depthwise", "se", "project"})
    if (has_child(name)) y = child(name)(y);
  return use_skip ? x + child("drop_path")(y) : y;
}

MBConv::MBConv(int64_t in_channels, int64_t out_channels, const MBConvOptions& o, Layout layout)
    : Cloneable(in_channels, out_channels, o.stride, layout) {
  check_channels(in_channels, out_channels, "MBConv");
  int64_t hidden = in_channels * o.expansion;
  if (o.expansion != 1)
    register_module("expand", std::make_shared<ConvBNAct>(in_channels, hidden,
                                                          ConvBNActOptions{.kernel_size = 1, .activation = "swish"}));
  else
    register_module("expand", std::make_shared<nn::Identity>());
  register_module("depthwise", std::make_shared<ConvBNAct>(hidden, hidden,
                                                           ConvBNActOptions{.kernel_size = o.kernel_size,
                                                                            .stride = o.stride,
                                                                            .padding = o.kernel_size / 2,
                                                                            .groups = hidden,
                                                                            .activation = "swish"}));
  register_module("se", se_or_identity(o.use_se, hidden, o.expansion * o.se_reduction));
  register_module("project", std::make_shared<ConvBNAct>(hidden, out_channels,
                                                         ConvBNActOptions{.kernel_size = 1, .activation = "none"}));
  register_module("drop_path", drop_path_or_identity(o.drop_path));
}

FusedMBConv::FusedMBConv(int64_t in_channels, int64_t out_channels, const FusedMBConvOptions& o, Layout layout)
    : Cloneable(in_channels, out_channels, o.stride, layout) {
  check_channels(in_channels, out_channels, "FusedMBConv");
  int64_t hidden = in_channels * o.expansion;
  register_module("expand",
                  std::make_shared<ConvBNAct>(
                      in_channels, hidden,
                      ConvBNActOptions{.kernel_size = o.kernel_size, .stride = o.stride, .activation = "swish"}));
  register_module("se", se_or_identity(o.use_se, hidden, o.expansion * 4));
  register_module("project", std::make_shared<ConvBNAct>(hidden, out_channels,
                                                         ConvBNActOptions{.kernel_size = 1, .activation = "none"}));
  register_module("drop_path", drop_path_or_identity(o.drop_path));
}

// ---------------------------------------------------------------- registration

namespace detail {

namespace {

std::vector<ParamSpec> in_out() {
  return {channels_param("in_channels", ChannelRole::In), channels_param("out_channels", ChannelRole::Out)};
}

// in_channels, out_channels, then rest.
std::vector<ParamSpec> in_out(std::vector<ParamSpec> rest) {
  std::vector<ParamSpec> params = in_out();
  params.insert(params.end(), rest.begin(), rest.end());
  return params;
}

// T(in_channels, out_channels, options, layout), the constructor of most conv blocks.
template <typename T, typename Options>
nn::ModulePtr make_in_out(const BlockArgs& a, const Options& options) {
  return std::make_shared<T>(a.get_int("in_channels"), a.get_int("out_channels"), options, a.layout());
}

ParamSpec activation_param() { return string_param("activation", "relu", activation_choices()); }
ParamSpec norm_param() { return string_param("norm_type", "batch", norm_choices()); }

BottleneckOptions bottleneck_options(const BlockArgs& a) {
  return {.stride = a.get_int("stride"),
          .expansion = a.get_int("expansion"),
          .activation = a.get_string("activation"),
          .norm_type = a.get_string("norm_type"),
          .use_downsample = a.get_bool("use_downsample")};
}

std::vector<ParamSpec> bottleneck_params(std::vector<ParamSpec> first) {
  first.insert(first.end(), {int_param("stride", 1), int_param("expansion", 4), activation_param(), norm_param(),
                             bool_param("use_downsample", false)});
  return in_out(first);
}

}  // namespace

std::vector<BlockType> conv_block_types() {
  return {
      {.name = "conv",
       .aliases = {"conv2d", "convblock"},
       .category = "block",
       .class_name = "ConvBlock",
       .description = "conv, batchnorm, activation, dropout and pooling",
       .params = in_out({int_param("kernel_size", 3), int_param("stride", 1), int_param("padding", 1),
                         string_param("activation", "relu", activation_choices(true)),
                         bool_param("use_batchnorm", true), float_param("dropout_rate", 0.0),
                         string_param("pooling_type", "none", {"max", "avg", "adaptive_avg", "none"}),
                         int_param("pooling_kernel_size", 2), int_param("pooling_stride", 2), int_param("dilation", 1),
                         int_param("groups", 1), bool_param("bias", true)}),
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return make_in_out<ConvBlock>(a, ConvBlockOptions{.kernel_size = a.get_int("kernel_size"),
                                                           .stride = a.get_int("stride"),
                                                           .padding = a.get_int("padding"),
                                                           .activation = a.get_string("activation"),
                                                           .use_batchnorm = a.get_bool("use_batchnorm"),
                                                           .dropout_rate = a.get_float("dropout_rate"),
                                                           .pooling_type = a.get_string("pooling_type"),
                                                           .pooling_kernel_size = a.get_int("pooling_kernel_size"),
                                                           .pooling_stride = a.get_int("pooling_stride"),
                                                           .dilation = a.get_int("dilation"),
                                                           .groups = a.get_int("groups"),
                                                           .bias = a.get_bool("bias")});
       }},
      {.name = "residual",
       .aliases = {"res", "resblock"},
       .category = "block",
       .class_name = "ResidualBlock",
       .description = "ResNet basic (or bottleneck) block with an optional SE block",
       .params = in_out({int_param("stride", 1), bool_param("downsample", false), activation_param(), norm_param(),
                         bool_param("use_se", false), int_param("se_reduction", 16), bool_param("bottleneck", false)}),
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return make_in_out<ResidualBlock>(a, ResidualBlockOptions{.stride = a.get_int("stride"),
                                                                   .downsample = a.get_bool("downsample"),
                                                                   .activation = a.get_string("activation"),
                                                                   .norm_type = a.get_string("norm_type"),
                                                                   .use_se = a.get_bool("use_se"),
                                                                   .se_reduction = a.get_int("se_reduction"),
                                                                   .bottleneck = a.get_bool("bottleneck")});
       }},
      {.name = "depthwise",
       .aliases = {"dw", "depthwise_separable"},
       .category = "block",
       .class_name = "DepthwiseBlock",
       .description = "depthwise separable convolution (depthwise k x k, pointwise 1x1)",
       .params = in_out({int_param("kernel_size", 3), int_param("stride", 1), int_param("padding", 1),
                         activation_param(), norm_param(), bool_param("add_residual", false)}),
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return make_in_out<DepthwiseBlock>(a, DepthwiseBlockOptions{.kernel_size = a.get_int("kernel_size"),
                                                                     .stride = a.get_int("stride"),
                                                                     .padding = a.get_int("padding"),
                                                                     .activation = a.get_string("activation"),
                                                                     .norm_type = a.get_string("norm_type"),
                                                                     .add_residual = a.get_bool("add_residual")});
       }},
      {.name = "inception",
       .aliases = {"inception_module"},
       .category = "block",
       .class_name = "InceptionModule",
       .description = "four parallel branches (1x1, 3x3, 5x5, pool) concatenated",
       .params = {channels_param("in_channels", ChannelRole::In), required_int_param("out_1x1"),
                  required_int_param("out_3x3"), required_int_param("out_5x5"), optional_int_param("out_pool"),
                  activation_param(), norm_param()},
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         InceptionModuleOptions o{.activation = a.get_string("activation"), .norm_type = a.get_string("norm_type")};
         if (a.has("out_pool")) o.out_pool = a.get_int("out_pool");
         return std::make_shared<InceptionModule>(a.get_int("in_channels"), a.get_int("out_1x1"), a.get_int("out_3x3"),
                                                  a.get_int("out_5x5"), o, a.layout());
       }},
      {.name = "dense",
       .aliases = {"dense_block", "densenet"},
       .category = "block",
       .class_name = "DenseConnectionBlock",
       .description = "DenseNet-style block: each layer sees every earlier output",
       .params = {int_param("num_layers", 4), channels_param("in_channels", ChannelRole::In),
                  int_param("growth_rate", 32), int_param("kernel_size", 3), int_param("bottleneck_ratio", 4),
                  string_param("activation", "relu"), bool_param("use_batchnorm", true),
                  float_param("dropout_rate", 0.0)},
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return std::make_shared<DenseConnectionBlock>(
             a.get_int("in_channels"),
             DenseConnectionBlockOptions{.num_layers = a.get_int("num_layers"),
                                         .growth_rate = a.get_int("growth_rate"),
                                         .kernel_size = a.get_int("kernel_size"),
                                         .bottleneck_ratio = a.get_int("bottleneck_ratio"),
                                         .activation = a.get_string("activation"),
                                         .use_batchnorm = a.get_bool("use_batchnorm"),
                                         .dropout_rate = a.get_float("dropout_rate")},
             a.layout());
       }},
      {.name = "bottleneck",
       .category = "block",
       .class_name = "StandardBottleneck",
       .description = "1x1 reduce, 3x3, 1x1 expand with a residual shortcut",
       .params = bottleneck_params({}),
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return make_in_out<StandardBottleneck>(a, bottleneck_options(a));
       }},
      {.name = "wide_bottleneck",
       .category = "block",
       .class_name = "WideBottleneck",
       .description = "bottleneck with width_multiplier times the mid channels",
       .params = bottleneck_params({float_param("width_multiplier", 1.0)}),
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return std::make_shared<WideBottleneck>(a.get_int("in_channels"), a.get_int("out_channels"),
                                                 a.get_float("width_multiplier"), bottleneck_options(a), a.layout());
       }},
      {.name = "grouped_bottleneck",
       .category = "block",
       .class_name = "GroupedBottleneck",
       .description = "bottleneck with a grouped 3x3 convolution",
       .params = bottleneck_params({int_param("num_groups", 2)}),
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return std::make_shared<GroupedBottleneck>(a.get_int("in_channels"), a.get_int("out_channels"),
                                                    a.get_int("num_groups"), bottleneck_options(a), a.layout());
       }},
      {.name = "coord_conv",
       .aliases = {"CoordConv"},
       .category = "block",
       .class_name = "CoordConv",
       .description = "convolution of the map with its x, y (and r) coordinate channels",
       .params =
           in_out({int_param("kernel_size", 3), bool_param("with_r", false), int_param("stride", 1),
                   int_param("padding", 0), int_param("dilation", 1), int_param("groups", 1), bool_param("bias", true),
                   string_param("padding_mode", "zeros", {"zeros", "reflect", "replicate", "circular"})}),
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return make_in_out<CoordConv>(
             a, CoordConvOptions{.kernel_size = a.get_int("kernel_size"),
                                 .with_r = a.get_bool("with_r"),
                                 .conv = {.stride = a.get_int("stride"),
                                          .padding = a.get_int("padding"),
                                          .dilation = a.get_int("dilation"),
                                          .groups = a.get_int("groups"),
                                          .bias = a.get_bool("bias"),
                                          .padding_mode = parse_mode<PaddingMode>(a.get_string("padding_mode"))}});
       }},
      {.name = "conv_bn_act",
       .aliases = {"ConvBNAct"},
       .category = "block",
       .class_name = "ConvBNAct",
       .description = "conv, batchnorm, activation",
       .params = in_out(
           {int_param("kernel_size", 3), int_param("stride", 1), optional_int_param("padding"), int_param("groups", 1),
            string_param("activation", "relu", {"relu", "swish", "gelu", "mish", "none"}), bool_param("use_bn", true)}),
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         ConvBNActOptions o{.kernel_size = a.get_int("kernel_size"),
                            .stride = a.get_int("stride"),
                            .groups = a.get_int("groups"),
                            .activation = a.get_string("activation"),
                            .use_bn = a.get_bool("use_bn")};
         if (a.has("padding")) o.padding = a.get_int("padding");
         return make_in_out<ConvBNAct>(a, o);
       }},
      {.name = "mbconv",
       .aliases = {"MBConv", "inverted_residual"},
       .category = "block",
       .class_name = "MBConv",
       .description = "mobile inverted bottleneck: expand, depthwise, SE, project",
       .params = in_out({int_param("expansion", 4), int_param("stride", 1), int_param("kernel_size", 3),
                         bool_param("use_se", true), int_param("se_reduction", 4), float_param("drop_path", 0.0)}),
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return make_in_out<MBConv>(a, MBConvOptions{.expansion = a.get_int("expansion"),
                                                     .stride = a.get_int("stride"),
                                                     .kernel_size = a.get_int("kernel_size"),
                                                     .use_se = a.get_bool("use_se"),
                                                     .se_reduction = a.get_int("se_reduction"),
                                                     .drop_path = a.get_float("drop_path")});
       }},
      {.name = "fused_mbconv",
       .aliases = {"FusedMBConv"},
       .category = "block",
       .class_name = "FusedMBConv",
       .description = "fused inverted bottleneck: k x k expand, SE, project",
       .params = in_out({int_param("expansion", 4), int_param("stride", 1), int_param("kernel_size", 3),
                         bool_param("use_se", false), float_param("drop_path", 0.0)}),
       .make = [](const BlockArgs& a) -> nn::ModulePtr {
         return make_in_out<FusedMBConv>(a, FusedMBConvOptions{.expansion = a.get_int("expansion"),
                                                               .stride = a.get_int("stride"),
                                                               .kernel_size = a.get_int("kernel_size"),
                                                               .use_se = a.get_bool("use_se"),
                                                               .drop_path = a.get_float("drop_path")});
       }},
  };
}

}  // namespace detail

}  // namespace tvc::hybrid
