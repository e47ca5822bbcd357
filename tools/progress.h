// A progress line for training loops, written to stderr.
//
// On a terminal the line is redrawn in place (carriage return) at most every 0.1 s; otherwise
// (a log file, a pipe) a full line is written at every tenth of the work, so logs stay short.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace tvc::tools {

class Progress {
 public:
  // label: e.g. "epoch 1/3"; total: number of steps (batches); stream nullptr: draws nothing.
  Progress(std::string label, int64_t total, std::FILE* stream = stderr);
  // Reports that step (1-based) is done, having processed `items` more images, with the
  // running mean loss (and, when >= 0, the running accuracy in [0, 1]) so far.
  void update(int64_t step, int64_t items, double running_loss, double running_accuracy = -1);
  // Writes the final state and ends the line.
  void finish();

 private:
  void draw(bool newline);
  std::string label_;
  int64_t total_, step_ = 0, items_ = 0, next_decile_ = 1;
  int64_t first_step_ = -1;  // the step before the first update (a resumed epoch starts midway)
  double loss_ = 0, accuracy_ = -1;
  std::FILE* stream_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace tvc::tools
