// `tvc backbones`, `tvc blocks`, `tvc info`, `tvc explain` and `tvc run --hybrid`: the hybrid
// layer from the command line.
#pragma once

#include <cstdint>
#include <string>

namespace tvc::tools {

// Prints the supported backbones, one per line.
void list_backbones();
// Prints every block type: name, aliases, category, parameters with defaults, description.
void list_blocks();
// Prints get_backbone_info(BACKBONE).summary() (random weights: the structure only).
void backbone_info(const std::string& backbone);

struct HybridOptions {
  std::string backbone;
  std::string patches = "{}";  // JSON
  int64_t num_classes = 1000;
  double dropout = 0;
};
// Prints the hybrid's explain() box (random weights: the structure only).
void explain_hybrid(const HybridOptions& options);

struct HybridRunOptions {
  HybridOptions hybrid;
  std::string weights;  // a torchvision tag, or a file of HybridModel or torchvision names
  std::string input;    // safetensors file holding float32 `input` (N, 3, H, W)
  std::string output;   // safetensors file to write: `output`, and with features `stage.K`
  bool features = false;
  bool opaque = false;  // read the weights file with io::ReadOptions::opaque_objects
};
// Builds the hybrid, loads the weights (what did not load is reported on stderr), runs it in
// eval mode and writes the output file.
void run_hybrid(const HybridRunOptions& options);

}  // namespace tvc::tools
