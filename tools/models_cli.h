// `tvc list`, `tvc run` and `tvc predict`: the model zoo from the command line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tvc/tensor.h"

namespace tvc::tools {

// Prints every model name, one per line.
void list_models();

struct RunOptions {
  std::string model;
  std::string weights;                 // a tag or a .pth/.safetensors path
  std::string input;                   // safetensors file holding float32 `input` (N, 3, H, W)
  std::string output;                  // safetensors file to write: `output` (N, num_classes), stage tensors
  std::optional<int64_t> num_classes;  // unset: the weights' class count
  bool train_mode = false;             // batch statistics, dropout off
  bool features = false;               // also write forward_stages under their node names
  bool opaque = false;                 // read the weights file with io::ReadOptions::opaque_objects
};

// Runs the model on the input file and writes the output file (crash-safe); a line on stdout
// says what was written, the weights report goes to stderr.
void run_model(const RunOptions& options);

struct PredictOptions {
  std::string model;
  std::string weights;              // a tag or a .pth/.safetensors path
  std::string preprocess_tag;       // whose preprocessing; "": the weights' tag, or DEFAULT for a file
  std::vector<std::string> images;  // JPEG or PNG files
  bool opaque = false;              // read the weights file with io::ReadOptions::opaque_objects
};

// Classifies the images (one batch, eval mode) with the preprocessing of the weights' tag and
// prints, for each image, its path then the five likeliest ImageNet classes:
// "  <probability %6.2f>%  <class index>  <class name>".
void predict(const PredictOptions& options);

// For each image, its path then the k likeliest classes of its row of probs (N, classes):
// "  <probability %6.2f>%  <class index>  <class name>".
void print_top_classes(const std::vector<std::string>& images, const Tensor& probs,
                       const std::vector<std::string>& names, int64_t k);

}  // namespace tvc::tools
