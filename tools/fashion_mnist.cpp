#include "fashion_mnist.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "tvc/error.h"

namespace tvc::tools {

namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<gzFile_s, GzCloser>;

// The zlib error of f, or errno's message for a system error.
std::string gz_error(gzFile f) {
  int code = 0;
  const char* msg = gzerror(f, &code);
  if (code == Z_ERRNO) return std::strerror(errno);
  return msg ? msg : "unknown zlib error";
}

// Reads exactly n bytes; throws naming what was being read when the file ends early.
void read_exact(gzFile f, const std::string& path, void* dst, size_t n, const char* what) {
  auto* out = static_cast<unsigned char*>(dst);
  size_t done = 0;
  while (done < n) {
    unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
    int got = gzread(f, out + done, chunk);
    if (got < 0) throw Error(cat_str(printable(path), ": read error in the ", what, ": ", gz_error(f)));
    if (got == 0)
      throw Error(cat_str(printable(path), ": truncated: the ", what, " needs ", n, " bytes, the file has ", done));
    done += static_cast<size_t>(got);
  }
}

uint32_t big_endian_u32(const unsigned char* b) {
  return uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | uint32_t{b[3]};
}

}  // namespace

std::vector<uint8_t> read_idx_gz(const std::string& path, int ndim, std::vector<int64_t>& dims) {
  errno = 0;
  GzHandle f(gzopen(path.c_str(), "rb"));
  if (!f) throw Error(cat_str(printable(path), ": cannot open: ", errno ? std::strerror(errno) : "out of memory"));
  // gzread passes plain files through; an IDX file must be gzip-compressed here.
  unsigned char header[4];
  read_exact(f.get(), path, header, 4, "IDX magic number");
  if (gzdirect(f.get()))
    throw Error(cat_str(printable(path), ": not a gzip file (expected the .gz IDX files of the dataset)"));
  uint32_t magic = big_endian_u32(header);
  uint32_t expected = 0x0800u | static_cast<uint32_t>(ndim);
  if (magic != expected) {
    std::ostringstream hex;
    hex << std::hex << "0x" << magic << ", expected 0x" << expected;
    throw Error(cat_str(printable(path), ": bad IDX magic number ", hex.str(), " (unsigned bytes, ", ndim, " dims)"));
  }
  dims.assign(ndim, 0);
  size_t total = 1;
  for (int i = 0; i < ndim; ++i) {
    read_exact(f.get(), path, header, 4, "IDX dimensions");
    dims[i] = big_endian_u32(header);
    if (dims[i] == 0) throw Error(cat_str(printable(path), ": IDX dimension ", i, " is 0"));
    if (total > (size_t{1} << 34) / static_cast<size_t>(dims[i]))
      throw Error(cat_str(printable(path), ": IDX dimensions ", dims, " are implausibly large"));
    total *= static_cast<size_t>(dims[i]);
  }
  std::vector<uint8_t> data(total);
  read_exact(f.get(), path, data.data(), total, "IDX data");
  unsigned char extra;
  int more = gzread(f.get(), &extra, 1);
  if (more < 0) throw Error(cat_str(printable(path), ": read error after the IDX data: ", gz_error(f.get())));
  if (more > 0) throw Error(cat_str(printable(path), ": more data than the IDX dimensions ", dims, " declare"));
  return data;
}

ImageSet load_fashion_mnist(const std::string& dir, const std::string& split) {
  std::string images_path = dir + "/" + split + "-images-idx3-ubyte.gz";
  std::string labels_path = dir + "/" + split + "-labels-idx1-ubyte.gz";
  ImageSet set;
  std::vector<int64_t> idims, ldims;
  set.pixels = read_idx_gz(images_path, 3, idims);
  if (idims[1] != 28 || idims[2] != 28)
    throw Error(cat_str(printable(images_path), ": images are ", idims[1], "x", idims[2], ", expected 28x28"));
  set.labels = read_idx_gz(labels_path, 1, ldims);
  if (ldims[0] != idims[0])
    throw Error(cat_str(printable(labels_path), ": ", ldims[0], " labels for the ", idims[0], " images of ",
                        printable(images_path)));
  for (size_t i = 0; i < set.labels.size(); ++i)
    if (set.labels[i] >= 10)
      throw Error(cat_str(printable(labels_path), ": label ", int{set.labels[i]}, " at index ", i,
                          " is not a class in [0, 10)"));
  set.count = idims[0];
  set.rows = idims[1];
  set.cols = idims[2];
  return set;
}

}  // namespace tvc::tools
