// HybridBuilder::from_torchvision: the backbone with its weights, patches applied on the
// torchvision module tree, then split per family into stem, stages and head (docs/hybrid.md).
//
// Channels and layouts of patch targets are measured, not guessed: the unpatched backbone runs
// once at two input sizes (eval mode, no grad) with a forward hook on every target; the channel
// dim is the one that does not change with the input size (dims 2, 3 changing: NCHW; 1, 2:
// NHWC; a rank-3 output: tokens (N, L, C)). ViT, built for one size, runs once and tells maps
// from tokens by rank. The head's width is measured the same way on the patched network.
#include <algorithm>
#include <iostream>
#include <map>
#include <sstream>

#include "hybrid_internal.h"
#include "tvc/autograd.h"
#include "tvc/error.h"
#include "tvc/hybrid/backbone.h"
#include "tvc/hybrid/hybrid.h"
#include "tvc/hybrid/weights.h"
#include "tvc/models/models.h"
#include "tvc/models/weights.h"
#include "tvc/nn/layers.h"
#include "tvc/ops.h"
#include "tvc/serialize.h"

namespace tvc::hybrid {

namespace {

constexpr int64_t kProbeSize = 64, kSecondProbeSize = 96;

// ViT's stem: patchify convolution, tokens, class token prepended.
//   x (N, 3, S, S) -> conv_proj (N, D, G, G) -> (N, G^2, D) -> (N, 1 + G^2, D)
class ViTStem : public nn::Cloneable<ViTStem> {
 public:
  ViTStem(nn::ModulePtr conv_proj, const Tensor& class_token, int64_t image_size) : image_size_(image_size) {
    register_module("conv_proj", std::move(conv_proj));
    register_parameter("class_token", class_token, class_token.requires_grad());
  }
  Tensor forward(const Tensor& x) override {
    TVC_CHECK(x.dim() == 4 && x.size(2) == image_size_ && x.size(3) == image_size_, "this ViT hybrid is built for ",
              image_size_, "x", image_size_, " images (image_size), got ", x.shape());
    Tensor tokens = child("conv_proj")(x);
    const int64_t n = tokens.size(0), hidden = tokens.size(1);
    tokens = tokens.reshape({n, hidden, -1}).permute({0, 2, 1});
    return cat({parameter("class_token").expand({n, -1, -1}), tokens}, 1);
  }
  std::string type_name() const override { return "ViTStem"; }

 private:
  int64_t image_size_;
};

// The class token's features: (N, 1 + L, D) -> (N, D).
class ClassToken : public nn::Cloneable<ClassToken> {
 public:
  Tensor forward(const Tensor& x) override { return x.select(1, 0); }
};

struct Shapes {
  Shape in, out;
};

// The input and output shapes of each path's module in one eval forward of images size x size.
std::map<std::string, Shapes> probe(nn::Module& model, const std::vector<std::string>& paths, int64_t size) {
  std::map<std::string, Shapes> shapes;
  nn::ScopedHooks hooks;  // removed however the forward pass ends
  for (const std::string& path : paths)
    hooks.add(model.get_submodule(path)->register_forward_hook(
        [&shapes, path](nn::Module&, const nn::TensorList& in,
                        const nn::TensorList& out) -> std::optional<nn::TensorList> {
          if (!shapes.count(path) && !in.empty() && !out.empty()) shapes[path] = {in[0].shape(), out[0].shape()};
          return std::nullopt;
        }));
  const bool training = model.is_training();
  model.eval();
  {
    NoGradGuard no_grad;
    Generator gen(0);
    model(randn({1, 3, size, size}, {}, &gen));
  }
  model.train(training);
  return shapes;
}

// The layout of a tensor from its shapes at two input sizes (b empty: one size only).
Layout layout_of(const Shape& a, const Shape& b) {
  if (a.size() != 4) return Layout::Tokens;
  if (b.size() == 4 && a[3] == b[3] && a[1] != b[1]) return Layout::NHWC;
  return Layout::NCHW;
}

int64_t channels_of(const Shape& s, Layout layout) { return layout == Layout::NCHW ? s[1] : s.back(); }

// The size of the probe's images: a ViT's own image size (pos_embedding has 1 + (S/P)^2 rows),
// kProbeSize for the others.
int64_t probe_size(const models::Backbone& model, const std::string& family) {
  if (family != "vit") return kProbeSize;
  const int64_t patches = model.get_submodule("encoder")->parameter("pos_embedding").size(1) - 1;
  int64_t grid = 1;
  while ((grid + 1) * (grid + 1) <= patches) ++grid;
  return grid * dynamic_cast<const nn::ConvNd&>(*model.get_submodule("conv_proj")).kernel_size.at(0);
}

std::string family_of(const std::string& backbone) {
  for (const char* prefix : {"resnet", "wide_resnet", "resnext"})
    if (backbone.rfind(prefix, 0) == 0) return "resnet";
  for (const char* family :
       {"efficientnet", "vgg", "densenet", "mobilenet_v2", "mobilenet_v3", "convnext", "vit", "swin"})
    if (backbone.rfind(family, 0) == 0) return family;
  throw Error(cat_str("hybrid: no family for backbone '", backbone, "'"));
}

std::vector<std::string> module_paths(const nn::Module& model) {
  std::vector<std::string> paths;
  for (const auto& [name, m] : model.named_modules())
    if (!name.empty()) paths.push_back(name);
  return paths;
}

bool is_inside(const std::string& path, const std::string& ancestor) {
  return path.size() > ancestor.size() && path.rfind(ancestor + ".", 0) == 0;
}

size_t depth(const std::string& path) { return static_cast<size_t>(std::count(path.begin(), path.end(), '.')); }

// Checks every target before anything changes: it exists, runs in forward, is patched once, and
// no replace drops another patch.
void check_targets(const models::Backbone& model, const std::vector<Patch>& patches,
                   const std::map<std::string, Shapes>& shapes) {
  const std::vector<std::string> paths = module_paths(model);
  for (size_t i = 0; i < patches.size(); ++i) {
    const Patch& p = patches[i];
    if (std::find(paths.begin(), paths.end(), p.target) == paths.end()) {
      std::string near;
      for (const std::string& n : nearest_names(p.target, paths, 3)) near += (near.empty() ? "'" : ", '") + n + "'";
      throw Error(cat_str("patch '", p.target, "': ", model.model_name(), " has no module '", p.target,
                          "'; nearest paths: ", near));
    }
    TVC_CHECK(shapes.count(p.target), "patch '", p.target, "': the module does not run in ", model.model_name(),
              "'s forward pass (", model.get_submodule(p.target)->type_name(),
              "), so a block there would not be in the network");
    for (size_t j = 0; j < patches.size(); ++j) {
      if (j == i) continue;
      const Patch& q = patches[j];
      TVC_CHECK(q.target != p.target || j > i, "patch '", p.target, "': the module is patched twice");
      TVC_CHECK(!(p.op == PatchOp::Replace && is_inside(q.target, p.target)), "patch '", q.target, "' is inside '",
                p.target, "', which another patch replaces");
    }
  }
}

// A family's split of a (patched) torchvision model.
struct Split {
  nn::ModulePtr stem;
  std::vector<nn::ModulePtr> stages;
  std::vector<nn::ModulePtr> head_parts;  // the head before the hybrid's Dropout and Linear
  nn::ModulePtr classifier;               // what completes torchvision's forward after head_parts
  std::vector<std::string> tv_nodes;      // each resolution stage's output module (torchvision path)
  HybridLayout layout;
};

// features.K node paths -> stages.0.K, and each resolution stage's children of features.
void features_layout(const models::Backbone& model, HybridLayout& layout) {
  const std::vector<std::string> nodes = model.stage_nodes();
  std::vector<std::string> children;
  for (const auto& [name, m] : model.child("features").named_children()) children.push_back(name);
  size_t next = 0;
  for (size_t k = 0; k < nodes.size(); ++k) {
    TVC_CHECK(nodes[k].rfind("features.", 0) == 0, "hybrid: stage node '", nodes[k], "' outside features");
    const std::string rest = nodes[k].substr(9), child = rest.substr(0, rest.find('.'));
    layout.stage_nodes.push_back("stages.0." + rest);
    std::vector<std::string> prefixes;
    const bool last = k + 1 == nodes.size();
    while (next < children.size()) {
      prefixes.push_back("stages.0." + children[next] + ".");
      if (children[next++] == child && !last) break;
    }
    layout.stage_prefixes.push_back(prefixes);
  }
  layout.stem_prefixes = {"stem."};
}

nn::ModulePtr take(const models::Backbone& model, const std::string& path) { return model.get_submodule(path); }

// image_size: the probe size (a ViT's image size), measured before any patch.
Split split(const models::Backbone& model, const std::string& family, int64_t image_size) {
  Split t;
  t.layout.family = family;
  if (family == "resnet") {
    t.stem = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        take(model, "conv1"), take(model, "bn1"), take(model, "relu"), take(model, "maxpool")});
    for (int k = 0; k < 4; ++k) {
      t.tv_nodes.push_back("layer" + std::to_string(k + 1));
      t.stages.push_back(take(model, t.tv_nodes.back()));
      t.layout.stage_nodes.push_back("stages." + std::to_string(k));
      t.layout.stage_prefixes.push_back({"stages." + std::to_string(k) + "."});
    }
    t.layout.stem_prefixes = {"stem."};
    t.head_parts = {take(model, "avgpool"), std::make_shared<nn::Flatten>(1)};
    t.classifier = take(model, "fc");
    return t;
  }
  if (family == "vit") {
    nn::ModulePtr encoder = take(model, "encoder");
    t.stem = std::make_shared<ViTStem>(take(model, "conv_proj"), model.parameter("class_token"), image_size);
    t.stages = {encoder};
    const auto layers = static_cast<int64_t>(encoder->child("layers").children().size());
    int64_t previous = -1;
    for (int64_t quarter = 1; quarter <= 4; ++quarter) {
      const int64_t last = layers * quarter / 4 - 1;
      t.tv_nodes.push_back("encoder.layers.encoder_layer_" + std::to_string(last));
      t.layout.stage_nodes.push_back("stages.0.layers.encoder_layer_" + std::to_string(last));
      std::vector<std::string> prefixes;
      for (int64_t l = previous + 1; l <= last; ++l)
        prefixes.push_back("stages.0.layers.encoder_layer_" + std::to_string(l) + ".");
      if (quarter == 4) prefixes.push_back("stages.0.ln.");
      t.layout.stage_prefixes.push_back(prefixes);
      previous = last;
    }
    t.layout.stem_prefixes = {"stem.", "stages.0.pos_embedding"};
    t.layout.stem_layout = t.layout.stage_layout = Layout::Tokens;
    t.head_parts = {std::make_shared<ClassToken>()};
    t.classifier = take(model, "heads");
    return t;
  }
  // The families the Python library keeps as one `features` stage.
  t.stem = std::make_shared<nn::Identity>();
  t.stages = {take(model, "features")};
  t.tv_nodes = model.stage_nodes();
  features_layout(model, t.layout);
  auto flatten = std::make_shared<nn::Flatten>(1);
  if (family == "efficientnet" || family == "mobilenet_v3") {
    t.head_parts = {take(model, "avgpool"), flatten};
    t.classifier = take(model, "classifier");
  } else if (family == "mobilenet_v2") {
    t.head_parts = {std::make_shared<nn::AdaptiveAvgPool2d>(1), flatten};
    t.classifier = take(model, "classifier");
  } else if (family == "densenet") {
    t.head_parts = {std::make_shared<nn::ReLU>(), std::make_shared<nn::AdaptiveAvgPool2d>(1), flatten};
    t.classifier = take(model, "classifier");
  } else if (family == "vgg") {
    // torchvision's classifier but its last Linear: Linear(25088, 4096), ReLU, Dropout,
    // Linear(4096, 4096), ReLU, Dropout (pretrained).
    t.head_parts = {take(model, "avgpool"), flatten};
    const std::vector<nn::ModulePtr> classifier = take(model, "classifier")->children();
    t.head_parts.insert(t.head_parts.end(), classifier.begin(), classifier.end() - 1);
    t.classifier = classifier.back();
  } else if (family == "convnext") {
    t.head_parts = {take(model, "avgpool"), take(model, "classifier.0"), flatten};
    t.classifier = take(model, "classifier.2");
  } else if (family == "swin") {
    t.head_parts = {take(model, "norm"), take(model, "permute"), take(model, "avgpool"), take(model, "flatten")};
    t.classifier = take(model, "head");
    t.layout.stage_layout = Layout::NHWC;
  } else {
    throw Error(cat_str("hybrid: no split for family '", family, "'"));
  }
  return t;
}

std::string modification(const Patch& p) {
  switch (p.op) {
    case PatchOp::Wrap:
      return "Wrapped " + p.target + " with " + p.block;
    case PatchOp::Inject:
      return "Injected " + p.block + " after " + p.target;
    case PatchOp::Replace:
      return "Replaced " + p.target + " with " + p.block;
  }
  return "";
}

}  // namespace

std::vector<std::string> HybridBuilder::list_backbones() {
  return {"resnet18",
          "resnet34",
          "resnet50",
          "resnet101",
          "resnet152",
          "wide_resnet50_2",
          "wide_resnet101_2",
          "resnext50_32x4d",
          "resnext101_32x8d",
          "resnext101_64x4d",
          "efficientnet_b0",
          "efficientnet_b1",
          "efficientnet_b2",
          "efficientnet_b3",
          "efficientnet_b4",
          "efficientnet_b5",
          "efficientnet_b6",
          "efficientnet_b7",
          "efficientnet_v2_s",
          "efficientnet_v2_m",
          "efficientnet_v2_l",
          "vgg11",
          "vgg13",
          "vgg16",
          "vgg19",
          "vgg11_bn",
          "vgg13_bn",
          "vgg16_bn",
          "vgg19_bn",
          "densenet121",
          "densenet169",
          "densenet201",
          "densenet161",
          "mobilenet_v2",
          "mobilenet_v3_small",
          "mobilenet_v3_large",
          "convnext_tiny",
          "convnext_small",
          "convnext_base",
          "convnext_large",
          "vit_b_16",
          "vit_b_32",
          "vit_l_16",
          "vit_l_32",
          "swin_t",
          "swin_s",
          "swin_b"};
}

detail::BuiltHybrid detail::build_hybrid(models::BackbonePtr model, const std::vector<Patch>& patches,
                                         int64_t num_classes, double dropout, std::ostream* log) {
  const std::string name = model->model_name(), family = family_of(name);
  TVC_CHECK(num_classes > 0, "hybrid ", name, ": num_classes must be positive, got ", num_classes);
  TVC_CHECK(dropout >= 0 && dropout < 1, "hybrid ", name, ": dropout must be in [0, 1), got ", dropout);

  // The torchvision model's tensors by name, before any patch (the hybrid holds the same tensors).
  const nn::StateDict torchvision_state = model->state_dict("", /*keep_vars=*/true);

  // Measure every target, check the patches, then build every block before changing anything.
  std::vector<std::string> targets;
  for (const Patch& p : patches) targets.push_back(p.target);
  const bool one_size = family == "vit";
  const int64_t size = probe_size(*model, family);
  std::map<std::string, Shapes> shapes, second;
  if (!patches.empty()) {
    for (const std::string& t : targets)
      TVC_CHECK(!t.empty(), "patch '': the target is the whole model; patch one of its modules");
    std::vector<std::string> existing;
    const std::vector<std::string> paths = module_paths(*model);
    for (const std::string& t : targets)
      if (std::find(paths.begin(), paths.end(), t) != paths.end()) existing.push_back(t);
    shapes = probe(*model, existing, size);
    if (!one_size) second = probe(*model, existing, kSecondProbeSize);
    check_targets(*model, patches, shapes);
  }
  std::vector<nn::ModulePtr> blocks(patches.size()), replacements(patches.size());
  for (size_t i = 0; i < patches.size(); ++i) {
    const Patch& p = patches[i];
    const Shapes& a = shapes.at(p.target);
    const Shapes* b = second.count(p.target) ? &second.at(p.target) : nullptr;
    InferredChannels inferred;
    inferred.layout = layout_of(a.out, b ? b->out : Shape{});
    const Layout in_layout = layout_of(a.in, b ? b->in : Shape{});
    inferred.out_channels = channels_of(a.out, inferred.layout);
    inferred.in_channels = p.op == PatchOp::Replace ? channels_of(a.in, in_layout) : *inferred.out_channels;
    nn::ModulePtr& block = blocks[i];
    try {
      block = make_block(p.block, p.params, inferred);
    } catch (const Error& e) {
      throw Error(cat_str("patch '", p.target, "' (", patch_op_name(p.op), " ", p.block, "): ", e.what()));
    }
    replacements[i] = p.op == PatchOp::Replace ? block
                                               : std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                                                     model->get_submodule(p.target), block});
  }
  // Deepest targets first, so a wrapped ancestor wraps its patched descendants.
  std::vector<size_t> order(patches.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return depth(patches[x].target) > depth(patches[y].target); });
  for (size_t i : order) model->set_submodule(patches[i].target, replacements[i]);

  Split tiers = split(*model, family, size);
  auto stages = std::make_shared<nn::ModuleList>(tiers.stages);
  // The head's width: the head's parts on the patched network's features.
  int64_t width;
  {
    auto pre = std::make_shared<nn::Sequential>();
    pre->append(tiers.stem);
    for (const auto& s : tiers.stages) pre->append(s);
    for (const auto& h : tiers.head_parts) pre->append(h);
    const auto shape = probe(*pre, {""}, size);
    TVC_CHECK(shape.count("") && shape.at("").out.size() == 2, "hybrid ", name,
              ": the head's input is not (N, features) but ", shape.count("") ? shape.at("").out : Shape{});
    width = shape.at("").out[1];
  }
  auto head = std::make_shared<nn::Sequential>(tiers.head_parts);
  if (dropout > 0) head->append(std::make_shared<nn::Dropout>(dropout));
  head->append(std::make_shared<nn::Linear>(width, num_classes));
  const std::string linear = "head." + std::to_string(head->size() - 1);

  std::vector<std::string> modifications;
  for (const Patch& p : patches) modifications.push_back(modification(p));
  // torchvision names -> hybrid names, by tensor identity; the classifier's -> the new Linear's.
  {
    const HybridModel names_of(tiers.stem, stages, head, name, modifications, tiers.layout);
    std::map<const TensorImpl*, std::string> hybrid_names;
    for (const auto& [key, t] : names_of.state_dict("", /*keep_vars=*/true)) hybrid_names[t.impl()] = key;
    const std::string classifier = models::classifier_path(name) + ".";
    for (const auto& [key, t] : torchvision_state) {
      auto found = hybrid_names.find(t.impl());
      if (found != hybrid_names.end())
        tiers.layout.torchvision_names.emplace_back(key, found->second);
      else if (key.rfind(classifier, 0) == 0)
        tiers.layout.torchvision_names.emplace_back(key, linear + "." + key.substr(classifier.size()));
    }
  }
  BuiltHybrid built{std::make_shared<HybridModel>(tiers.stem, stages, head, name, modifications, tiers.layout), {}};
  HybridModel& hybrid = *built.model;
  for (const auto& [tv, own] : tiers.layout.torchvision_names) built.torchvision_names[tv] = own;

  // Every patch must be in the hybrid's network.
  std::map<const nn::Module*, std::string> kept;
  for (const auto& [path, m] : hybrid.named_modules()) kept[m.get()] = path;
  for (size_t i = 0; i < patches.size(); ++i) {
    auto where = kept.find(replacements[i].get());
    TVC_CHECK(where != kept.end(), "patch '", patches[i].target, "': the hybrid does not keep '", patches[i].target,
              "' (", name, "'s classifier is replaced by the hybrid's head), so the block would not be in the network");
    if (log)
      *log << modification(patches[i]) << ": " << blocks[i]->type_name() << " at " << where->second
           << (patches[i].op == PatchOp::Replace ? "" : ".1") << ", " << detail::parameter_count(*blocks[i])
           << " new parameters initialised\n";
  }
  if (log)
    *log << "Head: " << (dropout > 0 ? cat_str("Dropout(p=", dropout, "), ") : std::string()) << "Linear(" << width
         << ", " << num_classes << ") at " << linear << ", initialised\n";

  return built;
}

namespace {

void check_backbone(const std::string& backbone) {
  const std::vector<std::string> all = HybridBuilder::list_backbones();
  TVC_CHECK(std::find(all.begin(), all.end(), backbone) != all.end(), "unknown backbone '", printable(backbone),
            "'; did you mean '", nearest_names(backbone, all, 1)[0], "'? (tvc backbones lists all ", all.size(), ")");
}

// The index of the Python library's head Linear: [pool if torchvision's head pools] + Flatten +
// [Dropout] + Linear.
int64_t library_linear_index(const std::string& family, double dropout) {
  const bool pools = family != "densenet" && family != "mobilenet_v2" && family != "vit";
  return (pools ? 1 : 0) + 1 + (dropout > 0 ? 1 : 0);
}

}  // namespace

HybridModelPtr HybridBuilder::from_torchvision(const std::string& backbone, const BuildOptions& options) const {
  check_backbone(backbone);
  models::BackbonePtr model = models::create(backbone, {.image_size = options.image_size});
  std::ostringstream log;
  if (options.weights.empty()) {
    log << "Loaded " << backbone << " (random initialization)\n";
  } else {
    const models::LoadReport report = models::load_weights(*model, options.weights, options.read);
    log << "Loaded " << backbone << " with " << printable(options.weights) << " weights (" << printable(report.file)
        << ")\n";
    if (!report.skipped.empty()) {
      log << "Skipped (the file's classifier has another class count; the hybrid's head replaces it):";
      for (const std::string& key : report.skipped) log << " " << printable(key);
      log << "\n";
    }
  }
  HybridModelPtr hybrid =
      detail::build_hybrid(model, options.patches, options.num_classes, options.dropout, &log).model;
  if (options.freeze_backbone) hybrid->freeze_backbone(options.unfreeze_stages, options.freeze_batchnorm);
  if (options.verbose) std::cout << log.str() << std::flush;
  return hybrid;
}

HybridModelPtr HybridBuilder::from_checkpoint(const std::string& path, const std::string& backbone,
                                              const CheckpointOptions& options) const {
  check_backbone(backbone);
  nn::StateDict file = io::load_state_dict(path, {.read = options.read, .unwrap = true});
  std::ostringstream log;
  detail::BuiltHybrid built = detail::build_hybrid(models::create(backbone, {.image_size = options.image_size}),
                                                   options.patches, options.num_classes, options.dropout, &log);
  HybridModel& model = *built.model;
  const nn::StateDict own = model.state_dict();
  const bool hybrid_names = std::any_of(file.begin(), file.end(), [](const auto& item) {
    return item.first.rfind("stem.", 0) == 0 || item.first.rfind("stages.", 0) == 0 ||
           item.first.rfind("head.", 0) == 0;
  });
  // The Python library's head Linear sits at another index where tvc's head keeps more parts.
  const std::string library_linear =
      cat_str("head.", library_linear_index(model.layout().family, options.dropout), ".");
  const std::string linear = cat_str("head.", model.child_as<nn::Sequential>("head").size() - 1, ".");
  nn::StateDict renamed;
  int64_t renames = 0;
  for (const auto& [key, t] : file) {
    std::string name = key;
    if (!own.contains(key)) {
      if (!hybrid_names) {
        auto found = built.torchvision_names.find(key);
        if (found != built.torchvision_names.end()) name = found->second;
      } else if (key.rfind(library_linear, 0) == 0 && own.contains(linear + key.substr(library_linear.size()))) {
        name = linear + key.substr(library_linear.size());
      }
    }
    renames += name != key;
    TVC_CHECK(!renamed.contains(name), "from_checkpoint: ", printable(path), " gives '", printable(name),
              "' twice (once as '", printable(key), "')");
    renamed.insert(name, t);
  }
  if (renames > 0)
    log << "Mapped " << renames << " of " << file.size() << " names of " << printable(path) << " to the hybrid's ("
        << (hybrid_names ? "the Python library's head" : "torchvision's names") << ")\n";
  if (options.verbose) std::cout << log.str() << std::flush;
  WeightLoadingReport report = partial_load(
      model, renamed, {.ignore_mismatch = !options.strict, .strict = options.strict, .verbose = options.verbose});
  if (options.report) *options.report = std::move(report);
  return built.model;
}

Tiers extract_tiers(const models::Backbone& model) {
  const std::string family = family_of(model.model_name());
  Split s = split(model, family, probe_size(model, family));
  auto head = std::make_shared<nn::Sequential>(s.head_parts);
  head->append(s.classifier);
  return {s.stem, s.stages, head};
}

BackboneInfo get_backbone_info(models::Backbone& model) {
  const std::string family = family_of(model.model_name());
  BackboneInfo info{.name = model.model_name()};
  if (family == "resnet") {
    info.stem_parts = {"conv1", "bn1", "relu", "maxpool"};
    info.stage_parts = {"layer1", "layer2", "layer3", "layer4"};
    info.head_parts = {"avgpool", "fc"};
  } else if (family == "vit") {
    info.stem_parts = {"conv_proj", "class_token", "encoder.pos_embedding"};
    info.stage_parts = {"encoder"};
    info.head_parts = {"heads"};
  } else {
    info.stage_parts = {"features"};
    if (family == "densenet" || family == "mobilenet_v2")
      info.head_parts = {"classifier"};
    else if (family == "swin")
      info.head_parts = {"norm", "permute", "avgpool", "flatten", "head"};
    else
      info.head_parts = {"avgpool", "classifier"};
  }
  for (const Tensor& p : model.parameters()) {
    info.total_params += p.numel();
    if (p.requires_grad()) info.trainable_params += p.numel();
  }
  const int64_t size = probe_size(model, family);
  const std::vector<std::string> nodes = split(model, family, size).tv_nodes;
  const auto a = probe(model, nodes, size);
  const auto b = family == "vit" ? std::map<std::string, Shapes>{} : probe(model, nodes, kSecondProbeSize);
  for (const std::string& node : nodes) {
    const Shape& out = a.at(node).out;
    info.stage_channels.push_back(channels_of(out, layout_of(out, b.count(node) ? b.at(node).out : Shape{})));
  }
  return info;
}

std::string BackboneInfo::summary() const {
  auto join = [](const std::vector<std::string>& parts) {
    std::string out;
    for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
    return out;
  };
  std::string channels = "[";
  for (size_t i = 0; i < stage_channels.size(); ++i) channels += (i ? ", " : "") + std::to_string(stage_channels[i]);
  channels += "]";
  const std::string rule(40, '-');
  return cat_str("Backbone: ", name, "\n", rule, "\nStem:   ", stem_parts.empty() ? "N/A" : join(stem_parts),
                 "\nStages: ", join(stage_parts), "\nHead:   ", join(head_parts), "\n", rule,
                 "\nParameters: ", detail::thousands(total_params), "\nStage Channels: ", channels);
}

}  // namespace tvc::hybrid
