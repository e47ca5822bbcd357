// `tvc train` with a backbone: fine-tunes a customised backbone (hybrid/) on Fashion-MNIST or an
// image folder, with an EMA or SWA average, checkpoints, resume, metrics and exports.
//
// OUT (recipe.out) receives:
//   recipe.yaml                 the effective recipe (what --resume and tvc eval read)
//   classes.txt                 the class names, one per line in label order (tvc predict)
//   metrics.csv                 one row per epoch (rewritten from the checkpoint's history on resume)
//   curves.svg                  loss and accuracy per epoch, raw vs averaged, redrawn each epoch
//   checkpoints/last.pth        model, average, optimizer, schedulers, step, RNG, loader position
//   final.safetensors/.pth      the trained weights (torchvision names without patches, else the
//                               HybridModel's), plain state_dicts that torch.load(weights_only=True) reads
//   best.safetensors/.pth       the weights of the epoch with the best validation accuracy
//   final_ema.* / final_swa.*   the averaged model's weights (same names)
#pragma once

#include <string>
#include <vector>

#include "recipe.h"

namespace tvc::tools {

// Trains recipe (check_recipe'd) into recipe.out, or resumes the run in resume_dir when not
// empty (its recipe.yaml and checkpoints/last.pth; threads and workers may differ). Returns the
// exit status: 0 when finished, 130 / 143 when SIGINT / SIGTERM stopped it after saving a
// checkpoint. Throws tvc::Error on bad data, weights or recipe values.
int train_recipe(const Recipe& recipe, const std::string& resume_dir = "");

// `tvc eval`: the accuracy of weights (a file of train's exports) built by the recipe of a run
// folder or file, on the recipe's test data (or data when given): overall, per class, and the
// confusion matrix as text and as an SVG file (svg_out, when not empty).
struct EvalOptions {
  std::string recipe;      // a run folder (its recipe.yaml) or a recipe file
  std::string weights;     // a .safetensors/.pth of train's exports
  std::string data;        // an image folder; "": the recipe's test data
  std::string svg_out;     // confusion matrix as SVG
  int64_t batch_size = 0;  // 0: the recipe's
  bool opaque = false;     // read the weights file with io::ReadOptions::opaque_objects
};
void evaluate(const EvalOptions& options);

// `tvc predict --recipe RUN`: the images (JPEG/PNG) through the eval transform of the run's
// recipe and the weights, printing each image's five likeliest of the run's classes
// (RUN/classes.txt) with probabilities, as `tvc predict` does.
void predict_with_recipe(const std::string& run, const std::string& weights, const std::vector<std::string>& images,
                         bool opaque = false);

}  // namespace tvc::tools
