// Zip archives for .pth files: a checked reader (libzip) and a writer of stored entries.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/file.h"

struct zip;

namespace tvc::io {

// A zip archive opened for reading (libzip, with its consistency checks; when they fail, the
// error names the entry whose sizes are implausible). Entry sizes are checked before anything
// is allocated: compressed bytes within the file, a stored entry's size equal to its
// compressed size, a deflated one's within the deflate ratio limit (compressed * 1032 + 1024),
// so a lying header cannot ask for a giant buffer. Reads check the byte count and the CRC.
class ZipReader {
 public:
  explicit ZipReader(const std::string& path);  // throws naming the file
  ~ZipReader();
  ZipReader(const ZipReader&) = delete;
  ZipReader& operator=(const ZipReader&) = delete;

  const std::string& path() const { return path_; }
  // Entry names in archive order (no duplicates: a duplicate name is an error at open).
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // The declared uncompressed size, checked as above; throws naming an absent entry.
  uint64_t size(const std::string& name) const;
  // Reads the whole entry into dst; n must equal size(name).
  void read(const std::string& name, void* dst, uint64_t n) const;
  // The whole entry, which may hold at most max_size bytes.
  std::vector<uint8_t> read(const std::string& name, uint64_t max_size) const;

 private:
  uint64_t entry_index(const std::string& name) const;
  std::string path_;
  uint64_t file_size_ = 0;
  ::zip* archive_ = nullptr;
  std::vector<std::string> names_;
  std::unordered_map<std::string, uint64_t> index_;
};

// Writes a zip archive of stored (uncompressed) entries, each entry's data aligned to 64 bytes
// (padding in an extra field with id "FB", as torch's writer does), crash-safely through
// AtomicFileWriter. Entries are written as they are added, so the archive is never held in
// memory. Zip64 records are written when a size, offset or count exceeds the 32-bit fields,
// or for every entry with force_zip64 (to test that path on small files).
class ZipWriter {
 public:
  explicit ZipWriter(const std::string& path, bool force_zip64 = false);
  void add(const std::string& name, const void* data, uint64_t size);
  // Writes the central directory and end records and commits the file.
  void finish();

 private:
  struct Entry {
    std::string name;
    uint32_t crc = 0;
    uint64_t size = 0;
    uint64_t offset = 0;  // of the local header
  };
  AtomicFileWriter out_;
  bool force_zip64_;
  std::vector<Entry> entries_;
};

}  // namespace tvc::io
