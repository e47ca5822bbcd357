// Weight tags, the search for their files, and loading weights into a model.
#include <cstdlib>
#include <filesystem>

#include "registry.h"
#include "tvc/error.h"
#include "tvc/serialize.h"

namespace tvc::models {

namespace fs = std::filesystem;

const char* interpolation_name(Interpolation interpolation) {
  switch (interpolation) {
    case Interpolation::Bilinear:
      return "bilinear";
    case Interpolation::Bicubic:
      return "bicubic";
  }
  throw Error(cat_str("interpolation_name: unknown interpolation ", static_cast<int>(interpolation)));
}

std::vector<std::string> weights_tags(const std::string& model) {
  std::vector<std::string> tags;
  for (const auto& t : detail::weight_tags())
    if (t.model == model) tags.push_back(t.tag);
  if (tags.empty()) detail::spec(model);  // neither tagged nor registered: an unknown model
  return tags;
}

const WeightsTag& weights_tag(const std::string& model, const std::string& tag) {
  const std::vector<std::string> tags = weights_tags(model);  // an unknown model is an error
  for (const auto& t : detail::weight_tags())
    if (t.model == model && (t.tag == tag || (tag == "DEFAULT" && t.is_default))) return t;
  std::string known;
  for (const auto& t : tags) known += ", " + t;
  throw Error(cat_str(model, " has no weights tagged '", printable(tag), "'",
                      tags.empty() ? std::string(" (it has no tags)") : cat_str(" (its tags: DEFAULT", known, ")")));
}

std::vector<std::string> weights_search_path() {
  std::vector<std::string> dirs;
  if (const char* v = std::getenv("TVC_WEIGHTS"); v && *v) dirs.push_back(v);
  if (const char* v = std::getenv("TORCH_HOME"); v && *v)
    dirs.push_back((fs::path(v) / "hub" / "checkpoints").string());
  if (const char* v = std::getenv("HOME"); v && *v)
    dirs.push_back((fs::path(v) / ".cache" / "torch" / "hub" / "checkpoints").string());
  return dirs;
}

std::string find_weights(const std::string& model, const std::string& tag) {
  const WeightsTag& t = weights_tag(model, tag);
  std::string safetensors = fs::path(t.file_name).replace_extension(".safetensors").string();
  std::string tried;
  for (const auto& dir : weights_search_path())
    for (const auto& name : {t.file_name, safetensors}) {
      fs::path candidate = fs::path(dir) / name;
      if (fs::is_regular_file(candidate)) return candidate.string();
      tried += "\n  " + printable(candidate.string());
    }
  throw Error(cat_str(model, " weights ", t.tag, ": no file named ", t.file_name, " (or ", safetensors,
                      ") in the search path ($TVC_WEIGHTS, $TORCH_HOME/hub/checkpoints, "
                      "~/.cache/torch/hub/checkpoints); tried:",
                      tried.empty() ? std::string("\n  (none of those variables is set)") : tried));
}

bool is_weights_tag(const std::string& weights) { return weights == "DEFAULT" || weights.rfind("IMAGENET", 0) == 0; }

std::string weights_file(const std::string& model, const std::string& weights) {
  return is_weights_tag(weights) ? find_weights(model, weights) : weights;
}

namespace detail {

void load_state(Backbone& model, nn::StateDict state, LoadReport& report) {
  const ModelSpec& spec = detail::spec(model.model_name());
  // A classifier of another size keeps its own initial values (they "load" unchanged).
  std::string prefix = spec.classifier + ".";
  for (const auto& [name, own] : model.state_dict()) {
    Tensor* theirs = state.find(name);
    if (name.compare(0, prefix.size(), prefix) == 0 && theirs && theirs->shape() != own.shape()) {
      *theirs = own;
      report.skipped.push_back(name);
    }
  }
  try {
    io::load_converted(model, std::move(state));
  } catch (const Error& e) {
    throw Error(cat_str(spec.name, ": the weights in '", printable(report.file), "' do not fit: ", e.what()));
  }
}

}  // namespace detail

LoadReport load_weights(Backbone& model, const std::string& weights, const io::ReadOptions& read) {
  LoadReport report;
  report.file = weights_file(model.model_name(), weights);
  detail::load_state(model, io::load_state_dict(report.file, {.read = read}), report);
  return report;
}

}  // namespace tvc::models
