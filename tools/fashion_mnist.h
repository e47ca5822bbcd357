// Fashion-MNIST (and MNIST) in the IDX format, read from the gzipped files.
//
// IDX: a big-endian u32 magic 0x0000080D (0x08 = unsigned bytes, D = number of dims), D
// big-endian u32 extents, then the bytes in row-major order. Images are (N,28,28), labels (N).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tvc::tools {

// The images and labels of one split: pixels holds count*rows*cols bytes, labels count values
// in [0, 10).
struct ImageSet {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> labels;
};

// Reads one gzipped IDX file of unsigned bytes with the given number of dims. Throws tvc::Error
// naming the file and the fault: missing, unreadable, not gzip, wrong magic, wrong number of
// dims, truncated, or data past the declared size.
std::vector<uint8_t> read_idx_gz(const std::string& path, int ndim, std::vector<int64_t>& dims);

// Reads `<dir>/<split>-images-idx3-ubyte.gz` and `<dir>/<split>-labels-idx1-ubyte.gz`
// (split "train" or "t10k"), checks that the counts agree, that images are 28x28 and that
// labels are < 10.
ImageSet load_fashion_mnist(const std::string& dir, const std::string& split);

// The directory of the Debian package dataset-fashion-mnist.
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

}  // namespace tvc::tools
