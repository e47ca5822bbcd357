// Weight utilities of the hybrid layer: loading a state_dict that only partly fits, copying
// weights between models by name with filters and renames, and what each load did.
//
//   WeightLoadingReport r = tvc::hybrid::partial_load(model, tvc::io::load_state_dict("old.pth"));
//   std::cout << r.summary();
//   tvc::hybrid::transfer_weights(pretrained, custom, {.exclude_patterns = {"fc", "classifier"}});
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tvc/nn/module.h"

namespace tvc::hybrid {

struct ShapeMismatch {
  std::string name{};
  Shape source{};  // the state_dict's tensor
  Shape target{};  // the model's
};

// What a load did, by state_dict key (model order for the model's keys, source order for the
// source's).
struct WeightLoadingReport {
  std::vector<std::string> loaded{};
  std::vector<ShapeMismatch> skipped_shape_mismatch{};
  std::vector<std::string> skipped_missing{};     // the model's keys the source lacks
  std::vector<std::string> skipped_unexpected{};  // the source's keys the model lacks
  std::vector<std::string> newly_initialized{};   // parameters initialised by init_new_layers

  int64_t total_loaded() const { return static_cast<int64_t>(loaded.size()); }
  int64_t total_skipped() const {
    return static_cast<int64_t>(skipped_shape_mismatch.size() + skipped_missing.size() + skipped_unexpected.size());
  }
  // loaded / (loaded + skipped); 0 when both are 0.
  double load_ratio() const;
  // The Python library's text: counts, load ratio, the first five shape mismatches
  // ("  name: (src shape) -> (dst shape)", shapes as Python tuples).
  std::string summary() const;
};

// How parameters of new layers are initialised: kaiming_normal_(fan_out, relu) for weights of
// 2 dims or more and zeros otherwise; xavier_uniform_ and zeros; zeros; or left as they are.
// A norm layer's weight (BatchNorm, LayerNorm, GroupNorm) starts at one except with Zero.
enum class InitMethod { Kaiming, Xavier, Zero, None };
// "kaiming", "xavier", "zero", "none"; throws listing them for another name.
InitMethod init_method(const std::string& name);

struct PartialLoadOptions {
  bool ignore_mismatch = true;  // a shape mismatch is skipped and reported (false: an error)
  bool strict = false;          // any mismatch, missing or unexpected key is an error
  bool verbose = true;          // print summary()
  InitMethod init_new_layers = InitMethod::Kaiming;
};

// Loads every tensor of state_dict whose name and shape fit model (converted to the model's
// dtype), reports the rest, then initialises the new layers: the layers (modules holding
// parameters) none of whose tensors the source has. A layer the source has in part keeps its
// other values: parameters merely absent from the dict are never re-initialised (the Python
// library re-initialises them, destroying pretrained values). An error (strict, or
// ignore_mismatch off) is raised before anything is loaded: the model is unchanged.
WeightLoadingReport partial_load(nn::Module& model, const nn::StateDict& state_dict,
                                 const PartialLoadOptions& options = {});

struct TransferOptions {
  std::map<std::string, std::string> layer_mapping{};  // source key -> target key
  std::vector<std::string> include_patterns{};         // regular expressions (std::regex ECMAScript,
  std::vector<std::string> exclude_patterns{};         // searched anywhere in the source key)
};

// Copies source's state_dict into target by name: only source keys matching an include pattern
// (all when none) and no exclude pattern, renamed by layer_mapping, present in target; then
// partial_load with init_new_layers None (target's layers that receive nothing keep their
// values). A bad regular expression is an error naming it.
WeightLoadingReport transfer_weights(const nn::Module& source, nn::Module& target, const TransferOptions& options = {});

}  // namespace tvc::hybrid
