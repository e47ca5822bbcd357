#include "curves.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "tvc/error.h"
#include "tvc/serialize.h"

namespace tvc::tools {

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

struct Series {
  std::string name, color;
  std::vector<double> y;  // NaN: no point
};

// One panel at (x0, y0) of size w x h: axes, 5 y ticks between lo and hi, one x tick per epoch
// (at most 10 labelled), the series as polylines with points, a legend at the top right.
void panel(std::ostringstream& svg, double x0, double y0, double w, double h, const std::string& title,
           const std::vector<int64_t>& epochs, const std::vector<Series>& series, double lo, double hi,
           const char* tick_format) {
  const double left = 56, right = 12, top = 28, bottom = 36;
  const double pw = w - left - right, ph = h - top - bottom;
  const int64_t first = epochs.empty() ? 1 : epochs.front(), last = epochs.empty() ? 1 : epochs.back();
  auto xs = [&](double e) { return x0 + left + (last == first ? pw / 2 : pw * (e - first) / (last - first)); };
  auto ys = [&](double v) { return y0 + top + ph * (1 - (v - lo) / (hi - lo)); };
  svg << "<text x='" << x0 + w / 2 << "' y='" << y0 + 18 << "' text-anchor='middle' font-weight='bold'>"
      << escape(title) << "</text>\n";
  svg << "<rect x='" << x0 + left << "' y='" << y0 + top << "' width='" << pw << "' height='" << ph
      << "' fill='none' stroke='#444'/>\n";
  for (int i = 0; i <= 4; ++i) {
    double v = lo + (hi - lo) * i / 4;
    svg << "<line x1='" << x0 + left << "' x2='" << x0 + left + pw << "' y1='" << ys(v) << "' y2='" << ys(v)
        << "' stroke='#ddd'/><text x='" << x0 + left - 6 << "' y='" << ys(v) + 4 << "' text-anchor='end'>"
        << fmt(tick_format, v) << "</text>\n";
  }
  const int64_t every = std::max<int64_t>(1, (last - first + 1 + 9) / 10);
  for (int64_t e = first; e <= last; e += every)
    svg << "<text x='" << xs(e) << "' y='" << y0 + top + ph + 16 << "' text-anchor='middle'>" << e << "</text>\n";
  svg << "<text x='" << x0 + left + pw / 2 << "' y='" << y0 + h - 4 << "' text-anchor='middle'>epoch</text>\n";
  double legend_y = y0 + top + 14;
  for (const Series& s : series) {
    std::string points;
    for (size_t i = 0; i < epochs.size(); ++i) {
      if (std::isnan(s.y[i])) continue;
      points += fmt("%.1f", xs(static_cast<double>(epochs[i]))) + "," + fmt("%.1f", ys(s.y[i])) + " ";
      svg << "<circle cx='" << xs(static_cast<double>(epochs[i])) << "' cy='" << ys(s.y[i]) << "' r='3' fill='"
          << s.color << "'/>\n";
    }
    if (points.empty()) continue;
    svg << "<polyline fill='none' stroke-width='2' stroke='" << s.color << "' points='" << points << "'/>\n";
    svg << "<rect x='" << x0 + left + pw - 150 << "' y='" << legend_y - 9 << "' width='12' height='4' fill='" << s.color
        << "'/><text x='" << x0 + left + pw - 132 << "' y='" << legend_y - 4 << "'>" << escape(s.name) << "</text>\n";
    legend_y += 16;
  }
}

// Rounded-out bounds of the finite values (a flat series gets some room).
std::pair<double, double> bounds(const std::vector<Series>& series, double floor_lo, double ceil_hi) {
  double lo = INFINITY, hi = -INFINITY;
  for (const Series& s : series)
    for (double v : s.y)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo)) return {floor_lo, ceil_hi};
  double pad = std::max((hi - lo) * 0.1, 1e-3);
  return {std::max(floor_lo, lo - pad), std::min(ceil_hi, hi + pad)};
}

}  // namespace

void write_curves(const std::string& path, const std::vector<EpochMetrics>& history, const std::string& average_name) {
  std::vector<int64_t> epochs;
  Series loss{"training loss", "#1f77b4", {}}, train{"training", "#1f77b4", {}}, val{"validation", "#ff7f0e", {}},
      avg{"validation, " + average_name, "#2ca02c", {}};
  for (const EpochMetrics& m : history) {
    epochs.push_back(m.epoch);
    loss.y.push_back(m.train_loss);
    train.y.push_back(100 * m.train_accuracy);
    val.y.push_back(100 * m.val_accuracy);
    avg.y.push_back(100 * m.val_accuracy_average);
  }
  std::vector<Series> accuracy{train, val};
  if (!average_name.empty()) accuracy.push_back(avg);
  std::ostringstream svg;
  const double w = 960, h = 360;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  auto [loss_lo, loss_hi] = bounds({loss}, 0, INFINITY);
  panel(svg, 0, 0, w / 2, h, "loss", epochs, {loss}, loss_lo, loss_hi, "%.3f");
  auto [acc_lo, acc_hi] = bounds(accuracy, 0, 100);
  panel(svg, w / 2, 0, w / 2, h, "accuracy (%)", epochs, accuracy, acc_lo, acc_hi, "%.1f");
  svg << "</svg>\n";
  io::write_file_atomic(path, svg.str());
}

std::string confusion_text(const std::vector<std::string>& classes,
                           const std::vector<std::vector<int64_t>>& confusion) {
  std::vector<std::string> names;  // class folder names, escaped for the terminal
  size_t name_width = 10;
  for (const std::string& c : classes) {
    names.push_back(printable(c));
    name_width = std::max(name_width, names.back().size());
  }
  int64_t largest = 1;
  for (const auto& row : confusion)
    for (int64_t v : row) largest = std::max(largest, v);
  const int cell = std::max<int>(4, static_cast<int>(std::to_string(largest).size()) + 1);
  std::ostringstream out;
  char buf[64];
  out << "confusion matrix (rows: true class, columns: predicted class index)\n";
  out << std::string(name_width + 6, ' ');
  for (size_t j = 0; j < classes.size(); ++j) out << std::setw(cell) << j;
  out << "  accuracy\n";
  for (size_t i = 0; i < classes.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%3zu ", i);
    out << buf << names[i] << std::string(name_width - names[i].size() + 2, ' ');
    int64_t total = 0;
    for (size_t j = 0; j < classes.size(); ++j) {
      out << std::setw(cell) << confusion[i][j];
      total += confusion[i][j];
    }
    if (total > 0)
      std::snprintf(buf, sizeof buf, "  %7.2f%%\n", 100.0 * confusion[i][i] / total);
    else
      std::snprintf(buf, sizeof buf, "        -\n");
    out << buf;
  }
  return out.str();
}

std::string confusion_svg(const std::vector<std::string>& classes, const std::vector<std::vector<int64_t>>& confusion) {
  const double cell = 44, left = 170, top = 60;
  const double n = static_cast<double>(classes.size());
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << left + n * cell + 20 << "' height='"
      << top + n * cell + 40
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  svg << "<text x='" << left + n * cell / 2
      << "' y='20' text-anchor='middle' font-weight='bold'>predicted class</text>\n";
  for (size_t j = 0; j < classes.size(); ++j)
    svg << "<text x='" << left + (j + 0.5) * cell << "' y='" << top - 8 << "' text-anchor='middle'>" << j
        << "</text>\n";
  for (size_t i = 0; i < classes.size(); ++i) {
    int64_t total = 0;
    for (int64_t v : confusion[i]) total += v;
    svg << "<text x='" << left - 8 << "' y='" << top + (i + 0.5) * cell + 4 << "' text-anchor='end'>" << i << " "
        << escape(classes[i]) << "</text>\n";
    for (size_t j = 0; j < classes.size(); ++j) {
      double share = total > 0 ? static_cast<double>(confusion[i][j]) / total : 0;
      int shade = static_cast<int>(std::lround(255 * (1 - share)));
      svg << "<rect x='" << left + j * cell << "' y='" << top + i * cell << "' width='" << cell << "' height='" << cell
          << "' fill='rgb(" << shade << "," << shade << ",255)' stroke='#ccc'/>"
          << "<text x='" << left + (j + 0.5) * cell << "' y='" << top + (i + 0.5) * cell + 4
          << "' text-anchor='middle' fill='" << (share > 0.5 ? "white" : "black") << "'>" << confusion[i][j]
          << "</text>\n";
    }
  }
  svg << "<text x='14' y='" << top + n * cell / 2 << "' transform='rotate(-90 14 " << top + n * cell / 2
      << ")' text-anchor='middle' font-weight='bold'>true class</text>\n</svg>\n";
  return svg.str();
}

}  // namespace tvc::tools
