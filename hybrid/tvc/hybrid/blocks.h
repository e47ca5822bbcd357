// The block registry of the hybrid layer: the blocks a patch inserts into a backbone, looked up
// by name or alias ("se", "SEBlock", "cbam_block", ...), each built from the patch's parameters
// and the channel counts inferred from the patched module.
//
//   BlockParams params{{"reduction", int64_t{8}}};
//   nn::ModulePtr se = make_block("se", params, {.in_channels = 256, .out_channels = 256});
//                                                         // SEBlock(256, reduction=8)
//   register_block({.name = "my_block", .params = {...}, .make = ...});  // a user block type
//
// Every block keeps the Python library's (torchvision-customizer 2.1) module names, so its keys
// in a state_dict are the library's (SEBlock: excitation.0.weight, ...).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tvc/nn/module.h"

namespace tvc::hybrid {

// A parameter value as a patch gives it (JSON: true/false, integers, numbers, strings).
using ParamValue = std::variant<bool, int64_t, double, std::string>;
// A patch's block parameters by name ({"reduction": 8}).
using BlockParams = std::map<std::string, ParamValue>;

// How the tensors at a patched module are laid out: NCHW feature maps (the CNNs, ConvNeXt),
// NHWC maps (Swin's stages), or tokens (N, L, C) (ViT's encoder).
enum class Layout { NCHW, NHWC, Tokens };
const char* layout_name(Layout layout);  // "(N, C, H, W)", "(N, H, W, C)", "(N, L, C)"

// Channels inferred from the patched module (its input's and output's channel dim; for a wrap
// both are the module's output channels).
struct InferredChannels {
  std::optional<int64_t> in_channels{};
  std::optional<int64_t> out_channels{};
  Layout layout = Layout::NCHW;
};

// The kind of a parameter's value. Channels: an int filled from the inferred channels when
// the patch does not give it (role says which count).
enum class ParamKind { Int, Float, Bool, String, Channels };
enum class ChannelRole { In, Out };

// One parameter a block type accepts.
struct ParamSpec {
  std::string name{};  // "reduction"
  ParamKind kind = ParamKind::Int;
  std::optional<ParamValue> default_value{};  // unset: required (Channels: inferred)
  ChannelRole role = ChannelRole::Out;        // for Channels: the inferred count it takes
  std::vector<std::string> choices{};         // for String: the allowed values (empty: any)
  // Without default_value: may be left out, standing for Python's None ("auto": ECA's
  // kernel_size, ConvBNAct's padding); the block asks BlockArgs::has.
  bool optional = false;
};

// A block's checked arguments: every accepted parameter with its value (given, inferred or
// default). Construction checks them against the block type and throws naming the block, the
// parameter and what it accepts: an unknown name (listing the accepted ones), a value of the
// wrong kind, a String outside its choices, a Channels parameter neither given nor inferable.
class BlockArgs {
 public:
  BlockArgs(const std::string& block, const BlockParams& given, const InferredChannels& inferred);
  int64_t get_int(const std::string& name) const;   // Int and Channels
  double get_float(const std::string& name) const;  // Float (an Int given for it converts)
  bool get_bool(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;
  // Whether a parameter without default was given (optional parameters whose absence means
  // "auto", e.g. ECA's kernel_size).
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  Layout layout() const { return layout_; }
  const std::string& block() const { return block_; }  // canonical block name

 private:
  const ParamValue& value(const std::string& name) const;
  std::string block_;
  std::map<std::string, ParamValue> values_;
  Layout layout_;
};

// A block type: its names, parameters and constructor.
struct BlockType {
  std::string name{};                  // canonical name: "se"
  std::vector<std::string> aliases{};  // "squeeze_excitation", "seblock", "SEBlock"
  std::string category{};              // "block", "attention" or "other"
  std::string class_name{};            // the library's class: "SEBlock"
  std::string description{};           // one line, shown by `tvc blocks`
  std::vector<ParamSpec> params{};     // accepted parameters, in the class's argument order
  // The layouts the block takes; a patch whose target has another layout is an error naming
  // both. Blocks on NCHW maps also take NHWC ones (they permute around their computation).
  std::vector<Layout> layouts = {Layout::NCHW, Layout::NHWC};
  std::function<nn::ModulePtr(const BlockArgs&)> make;
};

// Adds a block type (a user's). Throws when its name or an alias is already taken.
void register_block(BlockType type);
// The block type called name (canonical or alias, exact); throws listing the known names.
const BlockType& find_block(const std::string& name);
// Every registered block type, by canonical name.
std::vector<const BlockType*> block_types();
// A new block: find_block(name).make(args) with args checked for it.
nn::ModulePtr make_block(const std::string& name, const BlockParams& given, const InferredChannels& inferred);

}  // namespace tvc::hybrid
