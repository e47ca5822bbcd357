// The registry of models: every family's list, lookup by name with a suggestion, creation.
#include "registry.h"

#include <algorithm>

#include "torchvision_ops.h"
#include "tvc/error.h"
#include "tvc/nn/layers.h"
#include "tvc/serialize.h"

namespace tvc::models {

namespace {

const std::vector<detail::ModelSpec>& specs() {
  static const std::vector<detail::ModelSpec> all = [] {
    std::vector<detail::ModelSpec> out;
    for (auto family : {detail::resnet_models, detail::vgg_models, detail::densenet_models, detail::mobilenet_models,
                        detail::efficientnet_models, detail::convnext_models, detail::vit_models, detail::swin_models})
      for (auto& spec : family()) out.push_back(std::move(spec));
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return out;
  }();
  return all;
}

}  // namespace

namespace detail {

const ModelSpec& spec(const std::string& name) {
  const auto& all = specs();
  for (const auto& s : all)
    if (s.name == name) return s;
  TVC_CHECK(!all.empty(), "no models are registered");
  std::vector<std::string> names;
  for (const auto& s : all) names.push_back(s.name);
  throw Error(cat_str("unknown model '", printable(name), "'; did you mean '", nearest_names(name, names, 1)[0],
                      "'? (tvc list prints all ", all.size(), ")"));
}

}  // namespace detail

std::vector<std::string> list() {
  std::vector<std::string> names;
  for (const auto& s : specs()) names.push_back(s.name);
  return names;
}

const std::string& classifier_path(const std::string& name) { return detail::spec(name).classifier; }

BackbonePtr create(const std::string& name, const Options& options, LoadReport* report) {
  const detail::ModelSpec& s = detail::spec(name);
  TVC_CHECK(!options.num_classes || *options.num_classes >= 1, name, ": num_classes must be at least 1, got ",
            options.num_classes.value_or(0));
  TVC_CHECK(!options.dropout || s.has_dropout, name, " has no dropout option (torchvision's ", name,
            " has no dropout layer)");
  if (options.dropout)
    TVC_CHECK(*options.dropout >= 0 && *options.dropout <= 1, name, ": dropout must be in [0, 1], got ",
              *options.dropout);
  TVC_CHECK(!options.image_size || s.default_image_size, name,
            " has no image_size option (it takes images of any "
            "size; only the Vision Transformers are built for one)");
  Options o = options;
  if (s.has_dropout && !o.dropout) o.dropout = s.default_dropout;
  // A ViT loaded by tag is built for the tag's size, as torchvision does (its SWAG weights are
  // for 384 and 512 px).
  if (s.default_image_size && !o.image_size)
    o.image_size = is_weights_tag(options.weights) ? weights_tag(name, options.weights).preprocessing.crop_size
                                                   : s.default_image_size;
  LoadReport loaded;
  nn::StateDict state;
  if (!options.weights.empty()) {
    loaded.file = weights_file(name, options.weights);
    state = io::load_state_dict(loaded.file, {.read = options.read});
    // Without num_classes, the classifier takes the weights' class count.
    const Tensor* classifier = state.find(s.classifier + ".weight");
    if (!o.num_classes && classifier && classifier->dim() >= 1) o.num_classes = classifier->shape()[0];
  }
  if (!o.num_classes) o.num_classes = 1000;
  BackbonePtr model = s.make(o);
  if (!options.weights.empty()) detail::load_state(*model, std::move(state), loaded);
  if (report) *report = std::move(loaded);
  return model;
}

void train_without_dropout(nn::Module& model) {
  model.train();
  for (const auto& m : model.modules())
    if (dynamic_cast<nn::Dropout*>(m.get()) || dynamic_cast<detail::StochasticDepth*>(m.get())) m->eval();
}

}  // namespace tvc::models
