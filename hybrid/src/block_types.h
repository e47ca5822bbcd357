// Internal to hybrid/src: the built-in block types of each source file, collected by the
// registry (block_registry.cpp) when it is first used, and the parameter lists they share.
#pragma once

#include <string>
#include <vector>

#include "tvc/hybrid/blocks.h"

namespace tvc::hybrid::detail {

std::vector<BlockType> conv_block_types();       // blocks_conv.cpp
std::vector<BlockType> attention_block_types();  // blocks_attention.cpp
std::vector<BlockType> other_block_types();      // blocks_other.cpp

// ParamSpec builders.
ParamSpec channels_param(const std::string& name, ChannelRole role);
ParamSpec int_param(const std::string& name, int64_t value);
ParamSpec float_param(const std::string& name, double value);
ParamSpec bool_param(const std::string& name, bool value);
ParamSpec string_param(const std::string& name, const std::string& value, std::vector<std::string> choices = {});
ParamSpec required_int_param(const std::string& name);
ParamSpec optional_int_param(const std::string& name);  // absent = Python's None

// The names get_activation / get_normalization of the library accept (activation_choices()
// with "none" too for blocks whose activation may be None).
std::vector<std::string> activation_choices(bool with_none = false);
std::vector<std::string> norm_choices();

}  // namespace tvc::hybrid::detail
