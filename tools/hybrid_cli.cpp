#include "hybrid_cli.h"

#include <cstdio>
#include <utility>
#include <variant>
#include <vector>

#include "tvc/autograd.h"
#include "tvc/error.h"
#include "tvc/hybrid/backbone.h"
#include "tvc/hybrid/blocks.h"
#include "tvc/hybrid/hybrid.h"
#include "tvc/hybrid/weights.h"
#include "tvc/models/models.h"
#include "tvc/models/weights.h"
#include "tvc/nn/module.h"
#include "tvc/serialize.h"

namespace tvc::tools {

namespace {

// A parameter value as Python prints it: True, 16, 1e-05, 'relu'.
std::string py_value(const hybrid::ParamValue& v) {
  if (const bool* b = std::get_if<bool>(&v)) return *b ? "True" : "False";
  if (const int64_t* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const double* d = std::get_if<double>(&v)) return nn::py_float_repr(*d);
  return "'" + std::get<std::string>(v) + "'";
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += ", ";
    out += parts[i];
  }
  return out;
}

hybrid::HybridModelPtr random_hybrid(const HybridOptions& o) {
  return hybrid::HybridBuilder().from_torchvision(o.backbone, {.weights = "",
                                                               .patches = hybrid::parse_patches(o.patches),
                                                               .num_classes = o.num_classes,
                                                               .dropout = o.dropout,
                                                               .verbose = false});
}

}  // namespace

void list_backbones() {
  for (const std::string& name : hybrid::HybridBuilder::list_backbones()) std::printf("%s\n", name.c_str());
}

void list_blocks() {
  for (const hybrid::BlockType* type : hybrid::block_types()) {
    std::vector<std::string> aliases, params;
    for (const std::string& a : type->aliases) aliases.push_back(a);
    for (const hybrid::ParamSpec& p : type->params)
      params.push_back(p.default_value ? p.name + "=" + py_value(*p.default_value) : p.name);
    std::printf("%-20s %-10s %s(%s)\n", type->name.c_str(), type->category.c_str(), type->class_name.c_str(),
                join(params).c_str());
    if (!aliases.empty()) std::printf("%-20s aliases: %s\n", "", join(aliases).c_str());
    if (!type->description.empty()) std::printf("%-20s %s\n", "", type->description.c_str());
  }
}

void backbone_info(const std::string& backbone) {
  models::BackbonePtr model = models::create(backbone);
  std::printf("%s\n", hybrid::get_backbone_info(*model).summary().c_str());
}

void explain_hybrid(const HybridOptions& options) { std::printf("%s\n", random_hybrid(options)->explain().c_str()); }

void run_hybrid(const HybridRunOptions& options) {
  io::SafetensorsFile file = io::SafetensorsFile::open(options.input);
  const Tensor input = file.tensor("input");
  TVC_CHECK(input.dtype() == DType::Float32 && input.dim() == 4 && input.shape()[1] == 3, "'", printable(options.input),
            "': tensor 'input' must be float32 (N, 3, H, W), got ", dtype_name(input.dtype()), " ",
            shape_str(input.shape()));
  const HybridOptions& h = options.hybrid;
  const std::vector<hybrid::Patch> patches = hybrid::parse_patches(h.patches);
  hybrid::HybridModelPtr model;
  if (models::is_weights_tag(options.weights)) {
    model = hybrid::HybridBuilder().from_torchvision(h.backbone, {.weights = options.weights,
                                                                  .patches = patches,
                                                                  .num_classes = h.num_classes,
                                                                  .dropout = h.dropout,
                                                                  .verbose = false,
                                                                  .read = {.opaque_objects = options.opaque}});
    std::fprintf(stderr, "%s: weights %s, new layers initialised\n", h.backbone.c_str(),
                 printable(options.weights).c_str());
  } else {
    hybrid::WeightLoadingReport report;
    model = hybrid::HybridBuilder().from_checkpoint(options.weights, h.backbone,
                                                    {.patches = patches,
                                                     .num_classes = h.num_classes,
                                                     .dropout = h.dropout,
                                                     .verbose = false,
                                                     .report = &report,
                                                     .read = {.opaque_objects = options.opaque}});
    std::fprintf(stderr, "%s: %lld tensors from %s", h.backbone.c_str(), static_cast<long long>(report.total_loaded()),
                 printable(options.weights).c_str());
    std::string kept;
    for (const std::string& k : report.skipped_missing) kept += cat_str(" ", printable(k));
    for (const hybrid::ShapeMismatch& m : report.skipped_shape_mismatch) kept += cat_str(" ", printable(m.name));
    if (!kept.empty()) std::fprintf(stderr, " (not in the file or of another shape, kept initial:%s)", kept.c_str());
    std::fprintf(stderr, "\n");
  }
  model->eval();
  NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> tensors = {{"output", (*model)(input)}};
  if (options.features) {
    const std::vector<Tensor> stages = model->get_stage_outputs(input);
    for (size_t k = 0; k < stages.size(); ++k) tensors.emplace_back("stage." + std::to_string(k), stages[k]);
  }
  io::save_safetensors(options.output, tensors, {{"model", h.backbone}, {"hybrid", h.patches}});
  std::printf("wrote %s: output %s%s\n", printable(options.output).c_str(),
              shape_str(tensors[0].second.shape()).c_str(),
              options.features ? cat_str(" and ", tensors.size() - 1, " stage tensors").c_str() : "");
}

}  // namespace tvc::tools
