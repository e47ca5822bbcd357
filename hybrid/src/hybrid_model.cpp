// HybridModel: stem -> stages -> head, stage outputs as NCHW maps, freezing, explain().
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "hybrid_internal.h"
#include "tvc/autograd.h"
#include "tvc/error.h"
#include "tvc/hybrid/hybrid.h"
#include "tvc/nn/layers.h"

namespace tvc::hybrid {

namespace {

// A stage output as an NCHW map: NHWC permuted; ViT tokens (N, 1 + G^2, C) without the class
// token, reshaped to (N, C, G, G).
Tensor to_map(const Tensor& t, Layout layout) {
  switch (layout) {
    case Layout::NCHW:
      return t;
    case Layout::NHWC:
      return t.permute({0, 3, 1, 2}).contiguous();
    case Layout::Tokens: {
      TVC_CHECK(t.dim() == 3, "get_stage_outputs: expected tokens (N, 1 + L, C), got ", t.shape());
      const int64_t n = t.size(0), len = t.size(1) - 1, channels = t.size(2);
      const auto grid = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(len))));
      TVC_CHECK(grid * grid == len, "get_stage_outputs: ", len, " patch tokens do not form a square grid");
      return t.narrow(1, 1, len).permute({0, 2, 1}).reshape({n, channels, grid, grid});
    }
  }
  return t;
}

bool starts_with_any(const std::string& name, const std::vector<std::string>& prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return name.rfind(p, 0) == 0; });
}

// Python's text.ljust(width) for the box lines (ASCII).
std::string ljust(std::string text, size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

// Python's str.center (CPython puts the odd space on the left only when the width is odd).
std::string center(const std::string& text, size_t width) {
  if (text.size() >= width) return text;
  const size_t pad = width - text.size(), left = pad / 2 + (pad & width & 1);
  return std::string(left, ' ') + text + std::string(pad - left, ' ');
}

}  // namespace

HybridModel::HybridModel(nn::ModulePtr stem, std::shared_ptr<nn::ModuleList> stages, nn::ModulePtr head,
                         std::string backbone_name, std::vector<std::string> modifications, HybridLayout layout)
    : backbone_name_(std::move(backbone_name)), modifications_(std::move(modifications)), layout_(std::move(layout)) {
  register_module("stem", std::move(stem));
  register_module("stages", std::move(stages));
  register_module("head", std::move(head));
}

Tensor HybridModel::forward_features(const Tensor& x) {
  Tensor out = child("stem")(x);
  for (const nn::ModulePtr& stage : child("stages").children()) out = (*stage)(out);
  return out;
}

Tensor HybridModel::forward(const Tensor& x) { return child("head")(forward_features(x)); }

std::vector<Tensor> HybridModel::get_stage_outputs(const Tensor& x) {
  const std::vector<std::string>& nodes = layout_.stage_nodes;
  std::vector<Tensor> outputs(nodes.size() + 1);
  nn::ScopedHooks hooks;  // removed however the forward pass ends
  auto capture = [&outputs](size_t i) {
    return
        [&outputs, i](nn::Module&, const nn::TensorList&, const nn::TensorList& out) -> std::optional<nn::TensorList> {
          // The first call's output, copied: a later in-place op (ReLU(inplace)) must not change it.
          if (!outputs[i].defined() && !out.empty()) outputs[i] = out[0].clone();
          return std::nullopt;
        };
  };
  hooks.add(get_submodule("stem")->register_forward_hook(capture(0)));
  for (size_t i = 0; i < nodes.size(); ++i) hooks.add(get_submodule(nodes[i])->register_forward_hook(capture(i + 1)));
  forward_features(x);
  for (size_t i = 0; i < outputs.size(); ++i) {
    TVC_CHECK(outputs[i].defined(), "HybridModel(", backbone_name_, ").get_stage_outputs: '",
              i == 0 ? std::string("stem") : nodes[i - 1], "' did not run in forward");
    outputs[i] = to_map(outputs[i], i == 0 ? layout_.stem_layout : layout_.stage_layout);
  }
  return outputs;
}

HybridModel& HybridModel::freeze_backbone(const std::vector<int64_t>& unfreeze_stages, bool batchnorm_eval) {
  const auto stage_count = static_cast<int64_t>(layout_.stage_prefixes.size());
  for (int64_t s : unfreeze_stages)
    TVC_CHECK(s >= 0 && s < stage_count, "HybridModel(", backbone_name_, ").freeze_backbone: stage ", s,
              " does not exist (unfreeze_stages are 0..", stage_count - 1, ", the stages after the stem)");
  std::vector<std::string> frozen = layout_.stem_prefixes;
  for (int64_t s = 0; s < stage_count; ++s)
    if (std::find(unfreeze_stages.begin(), unfreeze_stages.end(), s) == unfreeze_stages.end())
      frozen.insert(frozen.end(), layout_.stage_prefixes[s].begin(), layout_.stage_prefixes[s].end());
  for (auto& [name, p] : named_parameters())
    if (name.rfind("head.", 0) != 0) p.requires_grad_(!starts_with_any(name, frozen));
  frozen_batchnorm_prefixes_ = batchnorm_eval ? frozen : std::vector<std::string>{};
  train(is_training());
  return *this;
}

HybridModel& HybridModel::unfreeze_all() {
  requires_grad_(true);
  frozen_batchnorm_prefixes_.clear();
  train(is_training());
  return *this;
}

nn::Module& HybridModel::train(bool mode) {
  Module::train(mode);
  if (frozen_batchnorm_prefixes_.empty() || !mode) return *this;
  // The BatchNorms of the frozen parts keep their running statistics: eval mode.
  for (auto& [name, m] : named_modules())
    if (dynamic_cast<nn::BatchNorm*>(m.get()) != nullptr && starts_with_any(name + ".", frozen_batchnorm_prefixes_))
      m->eval();
  return *this;
}

nn::StateDict HybridModel::to_torchvision_names(const nn::StateDict& state) const {
  TVC_CHECK(modifications_.empty(), "HybridModel ", backbone_name_, ": patched modules (", modifications_.front(),
            ") have no torchvision names; keep the HybridModel's");
  std::map<std::string, std::string> torchvision_of;
  for (const auto& [tv, own] : layout_.torchvision_names) torchvision_of[own] = tv;
  for (const auto& [key, t] : state)
    TVC_CHECK(torchvision_of.count(key), "HybridModel ", backbone_name_, ": '", key, "' has no torchvision name");
  nn::StateDict out;
  for (const auto& [tv, own] : layout_.torchvision_names) {
    const Tensor* t = state.find(own);
    TVC_CHECK(t != nullptr, "HybridModel ", backbone_name_, ": the state_dict lacks '", own, "' (torchvision's '", tv,
              "')");
    out.insert(tv, *t);
  }
  return out;
}

nn::StateDict HybridModel::from_torchvision_names(const nn::StateDict& state) const {
  std::map<std::string, std::string> own_of(layout_.torchvision_names.begin(), layout_.torchvision_names.end());
  nn::StateDict out;
  for (const auto& [key, t] : state) {
    auto found = own_of.find(key);
    out.insert(found != own_of.end() ? found->second : key, t);
  }
  return out;
}

int64_t HybridModel::count_parameters(bool trainable_only) const {
  int64_t n = 0;
  for (const Tensor& p : parameters())
    if (!trainable_only || p.requires_grad()) n += p.numel();
  return n;
}

std::string HybridModel::explain() const {
  const std::string rule = "+" + std::string(60, '=') + "+", thin = "+" + std::string(60, '-') + "+";
  std::vector<std::string> lines = {rule, "|" + center(" HybridModel (" + backbone_name_ + ") ", 60) + "|", rule};
  auto line = [&lines](const std::string& text) { lines.push_back(ljust(text, 61) + "|"); };
  line("| Stem: " + detail::thousands(detail::parameter_count(child("stem"))) + " params");
  lines.push_back("|" + ljust(" Stages: ", 60) + "|");
  const std::vector<nn::ModulePtr> stages = child("stages").children();
  for (size_t i = 0; i < stages.size(); ++i)
    line("|   Stage " + std::to_string(i + 1) + ": " + detail::thousands(detail::parameter_count(*stages[i])) +
         " params");
  line("| Head: " + detail::thousands(detail::parameter_count(child("head"))) + " params");
  lines.push_back(thin);
  if (!modifications_.empty()) {
    line("| Modifications:");
    for (size_t i = 0; i < std::min<size_t>(5, modifications_.size()); ++i) line("|   - " + modifications_[i]);
    if (modifications_.size() > 5) line("|   ... and " + std::to_string(modifications_.size() - 5) + " more");
    lines.push_back(thin);
  }
  line("| Total: " + detail::thousands(count_parameters()) +
       " | Trainable: " + detail::thousands(count_parameters(true)));
  lines.push_back(rule);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" : "") + lines[i];
  return out;
}

int64_t detail::parameter_count(const nn::Module& module) {
  int64_t n = 0;
  for (const Tensor& p : module.parameters()) n += p.numel();
  return n;
}

std::string detail::thousands(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace tvc::hybrid
