// partial_load, transfer_weights and their report (tvc/hybrid/weights.h).
#include "tvc/hybrid/weights.h"

#include <cstdio>
#include <iostream>
#include <regex>
#include <set>

#include "tvc/autograd.h"
#include "tvc/error.h"
#include "tvc/nn/init.h"
#include "tvc/nn/layers.h"

namespace tvc::hybrid {

namespace {

// A shape as Python prints a tuple: (64, 3, 7, 7), (10,), ().
std::string py_tuple(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

void initialise(Tensor p, InitMethod method) {
  switch (method) {
    case InitMethod::Kaiming:
      if (p.dim() >= 2)
        nn::init::kaiming_normal_(p, 0, FanMode::FanOut, Nonlinearity::Relu);
      else
        nn::init::zeros_(p);
      return;
    case InitMethod::Xavier:
      if (p.dim() >= 2)
        nn::init::xavier_uniform_(p);
      else
        nn::init::zeros_(p);
      return;
    case InitMethod::Zero:
      nn::init::zeros_(p);
      return;
    case InitMethod::None:
      return;
  }
}

std::regex compile(const std::string& pattern) {
  try {
    return std::regex(pattern);
  } catch (const std::regex_error& e) {
    throw Error(cat_str("transfer_weights: bad regular expression '", pattern, "': ", e.what()));
  }
}

bool any_search(const std::vector<std::regex>& patterns, const std::string& key) {
  for (const std::regex& r : patterns)
    if (std::regex_search(key, r)) return true;
  return false;
}

}  // namespace

double WeightLoadingReport::load_ratio() const {
  const int64_t total = total_loaded() + total_skipped();
  return total > 0 ? static_cast<double>(total_loaded()) / static_cast<double>(total) : 0.0;
}

std::string WeightLoadingReport::summary() const {
  const std::string rule(60, '='), thin(60, '-');
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.1f%%", 100 * load_ratio());
  std::string out = cat_str(rule, "\nWeight Loading Report\n", rule, "\nLoaded:           ", total_loaded(),
                            " parameters\nShape Mismatch:   ", skipped_shape_mismatch.size(),
                            " parameters\nMissing (target): ", skipped_missing.size(),
                            " parameters\nUnexpected:       ", skipped_unexpected.size(),
                            " parameters\nNewly Initialized:", newly_initialized.size(), " parameters\n", thin,
                            "\nLoad Ratio:       ", ratio, "\n", rule);
  if (!skipped_shape_mismatch.empty()) {
    out += "\n\nShape Mismatches:";
    for (size_t i = 0; i < std::min<size_t>(5, skipped_shape_mismatch.size()); ++i) {
      const ShapeMismatch& m = skipped_shape_mismatch[i];
      out += cat_str("\n  ", printable(m.name), ": ", py_tuple(m.source), " -> ", py_tuple(m.target));
    }
    if (skipped_shape_mismatch.size() > 5) out += cat_str("\n  ... and ", skipped_shape_mismatch.size() - 5, " more");
  }
  return out;
}

InitMethod init_method(const std::string& name) {
  if (name == "kaiming") return InitMethod::Kaiming;
  if (name == "xavier") return InitMethod::Xavier;
  if (name == "zero") return InitMethod::Zero;
  if (name == "none") return InitMethod::None;
  throw Error(cat_str("init_new_layers: unknown method '", name, "' (known: kaiming, xavier, zero, none)"));
}

WeightLoadingReport partial_load(nn::Module& model, const nn::StateDict& state_dict,
                                 const PartialLoadOptions& options) {
  WeightLoadingReport report;
  const nn::StateDict own = model.state_dict();
  nn::StateDict fitting;
  for (const auto& [name, target] : own) {
    const Tensor* source = state_dict.find(name);
    if (source == nullptr) {
      report.skipped_missing.push_back(name);
    } else if (source->shape() != target.shape()) {
      report.skipped_shape_mismatch.push_back({name, source->shape(), target.shape()});
    } else {
      fitting.insert(name, *source);
      report.loaded.push_back(name);
    }
  }
  for (const auto& [name, source] : state_dict)
    if (!own.contains(name)) report.skipped_unexpected.push_back(name);

  if (!report.skipped_shape_mismatch.empty() && (options.strict || !options.ignore_mismatch)) {
    const ShapeMismatch& m = report.skipped_shape_mismatch.front();
    throw Error(cat_str("partial_load: shape mismatch for '", printable(m.name), "': source ", m.source, " vs target ",
                        m.target, " (", report.skipped_shape_mismatch.size(), " mismatches; the model is unchanged)"));
  }
  TVC_CHECK(!options.strict || (report.skipped_missing.empty() && report.skipped_unexpected.empty()),
            "partial_load (strict): ", report.skipped_missing.size(), " missing keys",
            report.skipped_missing.empty() ? "" : " (first '" + printable(report.skipped_missing.front()) + "')", ", ",
            report.skipped_unexpected.size(), " unexpected keys",
            report.skipped_unexpected.empty() ? "" : " (first '" + printable(report.skipped_unexpected.front()) + "')",
            "; the model is unchanged");

  model.load_state_dict(fitting, /*strict=*/false);

  // New layers: modules holding parameters of which the source has no tensor at all.
  if (options.init_new_layers != InitMethod::None) {
    NoGradGuard no_grad;
    for (const auto& [module_name, module] : model.named_modules()) {
      const std::string prefix = module_name.empty() ? "" : module_name + ".";
      std::vector<std::pair<std::string, Tensor>> params = module->named_parameters("", /*recurse=*/false);
      bool from_source = false;
      for (const auto& [name, t] : module->named_parameters(module_name, false))
        from_source |= state_dict.contains(name);
      for (const auto& [name, t] : module->named_buffers(module_name, false)) from_source |= state_dict.contains(name);
      if (from_source || params.empty()) continue;
      // A norm's scale starts at one (zero would silence the layer), unless zeros were asked.
      const bool norm = dynamic_cast<const nn::BatchNorm*>(module.get()) ||
                        dynamic_cast<const nn::LayerNorm*>(module.get()) ||
                        dynamic_cast<const nn::GroupNorm*>(module.get());
      for (const auto& [name, p] : params) {
        if (!p.defined()) continue;
        if (norm && name == "weight" && options.init_new_layers != InitMethod::Zero)
          nn::init::ones_(p);
        else
          initialise(p, options.init_new_layers);
        report.newly_initialized.push_back(prefix + name);
      }
    }
  }
  if (options.verbose) std::cout << report.summary() << std::endl;
  return report;
}

WeightLoadingReport transfer_weights(const nn::Module& source, nn::Module& target, const TransferOptions& options) {
  std::vector<std::regex> include, exclude;
  for (const std::string& p : options.include_patterns) include.push_back(compile(p));
  for (const std::string& p : options.exclude_patterns) exclude.push_back(compile(p));
  const nn::StateDict target_keys = target.state_dict();
  nn::StateDict filtered;
  for (const auto& [key, value] : source.state_dict()) {
    if (!include.empty() && !any_search(include, key)) continue;
    if (any_search(exclude, key)) continue;
    auto renamed = options.layer_mapping.find(key);
    const std::string target_key = renamed == options.layer_mapping.end() ? key : renamed->second;
    if (target_keys.contains(target_key)) filtered.insert(target_key, value);
  }
  return partial_load(target, filtered, {.verbose = false, .init_new_layers = InitMethod::None});
}

}  // namespace tvc::hybrid
