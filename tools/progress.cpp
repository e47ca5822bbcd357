#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "tvc/error.h"

namespace tvc::tools {

Progress::Progress(std::string label, int64_t total, std::FILE* stream)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      stream_(stream),
      tty_(stream != nullptr && isatty(fileno(stream)) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void Progress::update(int64_t step, int64_t items, double running_loss, double running_accuracy) {
  if (first_step_ < 0) first_step_ = step - 1;
  step_ = step;
  accuracy_ = running_accuracy;
  items_ += items;
  loss_ = running_loss;
  auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ >= std::chrono::milliseconds(100)) draw(false);
  } else if (step_ * 10 >= next_decile_ * total_) {
    while (step_ * 10 >= next_decile_ * total_) ++next_decile_;
    draw(true);
  }
}

void Progress::finish() {
  if (tty_)
    draw(true);
  else if (next_decile_ <= 10)  // the last decile was not printed yet
    draw(true);
}

void Progress::draw(bool newline) {
  if (stream_ == nullptr) return;
  last_draw_ = std::chrono::steady_clock::now();
  double seconds = std::chrono::duration<double>(last_draw_ - start_).count();
  double rate = seconds > 0 ? static_cast<double>(items_) / seconds : 0.0;
  constexpr int kWidth = 24;
  int filled = static_cast<int>(kWidth * step_ / total_);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::string accuracy = accuracy_ >= 0 ? cat_str("  acc ", std::lround(1000 * accuracy_) / 10.0, "%") : "";
  // The time left at this epoch's pace so far.
  int64_t done = step_ - std::max<int64_t>(first_step_, 0);
  double eta = done > 0 ? seconds * static_cast<double>(total_ - step_) / static_cast<double>(done) : 0.0;
  std::fprintf(stream_, "%s%s [%s] %lld/%lld batches  loss %.4f%s  %.0f images/s  %.1fs  ETA %.0fs%s", tty_ ? "\r" : "",
               label_.c_str(), bar.c_str(), static_cast<long long>(step_), static_cast<long long>(total_), loss_,
               accuracy.c_str(), rate, seconds, eta, newline ? "\n" : "");
  std::fflush(stream_);
}

}  // namespace tvc::tools
