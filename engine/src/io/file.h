// Checked file reading and crash-safe file writing for the weight-file readers and writers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tvc::io {

// A file opened for reading by offset. Every read is checked against the size the file had
// when opened and against what pread() returns, so a file truncated meanwhile is an error
// naming the file, never a fault.
class InputFile {
 public:
  explicit InputFile(const std::string& path);  // throws naming the file
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // Reads n bytes at offset into dst; `what` names the part read for the error message, which
  // takes it as it is (names from the file in it already printable()).
  void read(uint64_t offset, void* dst, size_t n, const std::string& what) const;
  std::vector<uint8_t> read(uint64_t offset, size_t n, const std::string& what) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Writes a file crash-safely: the bytes go to a temporary file in the same folder
// (".NAME.tvc-tmp.PID.N"), which commit() fsyncs, renames over path and follows with an fsync
// of the folder. Destroyed without commit() (an error midway), it removes the temporary file.
// Opening also removes temporaries of path left by writers that were killed (their process
// is gone), so a crashed save leaves no stray file after the next one.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  void write(const void* data, size_t n);
  void write_zeros(size_t n);
  uint64_t position() const { return position_; }
  void commit();
  const std::string& temp_path() const { return temp_path_; }

 private:
  void flush_buffer();
  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  uint64_t position_ = 0;
  std::vector<uint8_t> buffer_;
  bool committed_ = false;
};

}  // namespace tvc::io
