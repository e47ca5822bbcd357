// `tvc inspect` and `tvc convert`: weight files from the command line.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tvc/dtype.h"
#include "tvc/swa/average_files.h"

namespace tvc::tools {

struct InspectOptions {
  bool widen = false;   // show element types tvc lacks (uint16, float8, ...) of .pth files widened
  bool opaque = false;  // read other classes' objects as data (io::ReadOptions::opaque_objects)
};

// Prints the file's format, then one line per tensor (dotted name, dtype, shape), the totals
// (tensors, elements, bytes), the safetensors metadata and the non-tensor values of a checkpoint
// (io::repr: opaque objects by their class name and recorded fields).
// The whole file is validated (and, for .pth, read); a malformed file throws naming the fault.
void inspect_weights(const std::string& path, const InspectOptions& options);

struct ConvertOptions {
  std::optional<DType> dtype;  // floating tensors converted to it; integer tensors kept
  bool widen = false;          // load element types tvc lacks as their widened dtype
  bool unwrap = false;         // keep only the weights of a training checkpoint
  bool opaque = false;         // read other classes' objects as data (io::ReadOptions::opaque_objects)
};

// Converts between safetensors and .pth (zip), by the output's extension: .safetensors, or
// .pth / .pt. safetensors to safetensors without --dtype copies every tensor's bytes, whatever
// its element type, and the metadata. Prints one summary line.
void convert_weights(const std::string& in, const std::string& out, const ConvertOptions& options);

// `tvc average`: averages weight files into out (tvc::swa::average_weight_files) and prints
// one summary line.
void average_weights(const std::vector<std::string>& files, const std::string& out,
                     const swa::AverageFilesOptions& options);

}  // namespace tvc::tools
