// The pictures and tables of a training run (tools/curves.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "curves.h"

namespace tvc::tools {
namespace {

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Curves, APolylinePerSeriesAndAPointPerEpoch) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("tvc-curves-" + std::to_string(::getpid()) + ".svg")).string();
  std::vector<EpochMetrics> history;
  for (int e = 1; e <= 3; ++e) {
    EpochMetrics m;
    m.epoch = e;
    m.train_loss = 2.0 / e;
    m.train_accuracy = 0.5 + 0.1 * e;
    m.val_accuracy = 0.45 + 0.1 * e;
    m.val_accuracy_average = e == 1 ? std::nan("") : 0.5 + 0.1 * e;  // an average from epoch 2 on
    history.push_back(m);
  }
  write_curves(path, history, "swa");
  std::string svg = read(path);
  EXPECT_EQ(svg.rfind("<svg xmlns='http://www.w3.org/2000/svg'", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 4);            // loss; training, validation, validation swa
  EXPECT_EQ(count(svg, "<circle"), 3 + 3 + 3 + 2);  // no point where the average is NaN
  EXPECT_NE(svg.find("validation, swa"), std::string::npos);
  write_curves(path, {history.front()}, "");  // one epoch, no average: points only
  svg = read(path);
  EXPECT_EQ(count(svg, "<circle"), 3);
  EXPECT_EQ(svg.find("validation, "), std::string::npos);
  std::filesystem::remove(path);
}

TEST(Confusion, TextRowsWithAccuraciesAndAnEscapedSvg) {
  const std::vector<std::string> classes{"cat", "dog & wolf"};
  const std::vector<std::vector<int64_t>> confusion{{8, 2}, {1, 9}};
  const std::string text = confusion_text(classes, confusion);
  EXPECT_NE(text.find("  0 cat            8   2    80.00%"), std::string::npos) << text;
  EXPECT_NE(text.find("  1 dog & wolf     1   9    90.00%"), std::string::npos) << text;
  const std::string svg = confusion_svg(classes, confusion);
  EXPECT_NE(svg.find("dog &amp; wolf"), std::string::npos);
  EXPECT_EQ(count(svg, "<rect x="), 4);
  // A class folder's name that would clear the screen prints escaped, the columns aligned to it.
  const std::string hostile = confusion_text({"\x1b[2Jcat", "dog"}, confusion);
  EXPECT_NE(hostile.find("  0 \\x1b[2Jcat     8   2    80.00%"), std::string::npos) << hostile;
  EXPECT_NE(hostile.find("  1 dog            1   9    90.00%"), std::string::npos) << hostile;
}

}  // namespace
}  // namespace tvc::tools
