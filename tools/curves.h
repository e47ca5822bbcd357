// The pictures and tables of a training run: curves.svg (loss and accuracy per epoch, raw vs
// averaged model) and the confusion matrix of `tvc eval` as text and SVG. Plain SVG 1.1 that a
// browser shows as it is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tvc::tools {

// One epoch of a run (a row of metrics.csv). val_accuracy_average is NaN without an average.
struct EpochMetrics {
  int64_t epoch = 0, step = 0;
  double lr = 0, train_loss = 0, train_accuracy = 0, val_accuracy = 0, val_accuracy_average = 0;
  double epoch_seconds = 0, model_images_per_s = 0, loader_images_per_s = 0;
};

// Writes (crash-safely) two panels side by side: training loss per epoch, and accuracy per epoch
// (training, validation of the raw model, validation of the average named average_name, e.g.
// "ema", when not empty). Axes with ticks, a legend; one epoch draws as points.
void write_curves(const std::string& path, const std::vector<EpochMetrics>& history, const std::string& average_name);

// confusion[true][predicted] as an aligned text table: a header of predicted class indices, one
// row per true class with its name, count per cell, and the class's accuracy.
std::string confusion_text(const std::vector<std::string>& classes, const std::vector<std::vector<int64_t>>& confusion);
// The same as an SVG heat map (cells shaded by their share of the row, counts written in).
std::string confusion_svg(const std::vector<std::string>& classes, const std::vector<std::vector<int64_t>>& confusion);

}  // namespace tvc::tools
