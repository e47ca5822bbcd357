#include "io/file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tvc/error.h"
#include "tvc/serialize.h"

namespace tvc::io {

namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

// ---------------------------------------------------------------- InputFile

InputFile::InputFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TVC_CHECK(fd_ >= 0, "cannot open '", printable(path), "': ", errno_text());
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    std::string why = S_ISDIR(st.st_mode) ? std::string("it is a directory") : errno_text();
    ::close(fd_);
    throw Error(cat_str("cannot read '", printable(path), "': ", why));
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read(uint64_t offset, void* dst, size_t n, const std::string& what) const {
  TVC_CHECK(offset <= size_ && n <= size_ - offset, "'", printable(path_), "': ", what, " (bytes ", offset, " to ",
            offset + static_cast<uint64_t>(n), ") lies past the end of the file (", size_, " bytes)");
  auto* out = static_cast<uint8_t*>(dst);
  size_t done = 0;
  while (done < n) {
    ssize_t got = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    TVC_CHECK(got >= 0, "'", printable(path_), "': reading ", what, " failed: ", errno_text());
    TVC_CHECK(got > 0, "'", printable(path_), "': the file ended while reading ", what, " at byte ", offset + done,
              " (it was ", size_, " bytes when opened; was it truncated?)");
    done += static_cast<size_t>(got);
  }
}

std::vector<uint8_t> InputFile::read(uint64_t offset, size_t n, const std::string& what) const {
  TVC_CHECK(offset <= size_ && n <= size_ - offset, "'", printable(path_), "': ", what, " (bytes ", offset, " to ",
            offset + static_cast<uint64_t>(n), ") lies past the end of the file (", size_, " bytes)");
  std::vector<uint8_t> bytes(n);
  read(offset, bytes.data(), n, what);
  return bytes;
}

// ---------------------------------------------------------------- AtomicFileWriter

namespace {

constexpr size_t kBufferSize = size_t{1} << 20;
constexpr const char* kTempTag = ".tvc-tmp.";

// Removes ".NAME.tvc-tmp.PID.N" files in dir whose writer process no longer exists.
void remove_stale_temporaries(const std::filesystem::path& dir, const std::string& name) {
  std::string prefix = "." + name + kTempTag;
  DIR* d = ::opendir(dir.empty() ? "." : dir.c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    std::string entry = e->d_name;
    if (entry.compare(0, prefix.size(), prefix) != 0) continue;
    std::string rest = entry.substr(prefix.size());
    size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos || rest.find_first_not_of("0123456789") != dot) continue;
    long pid = std::strtol(rest.substr(0, dot).c_str(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::error_code ignored;  // another writer may remove it first
      std::filesystem::remove(dir / entry, ignored);
    }
  }
  ::closedir(d);
}

void fsync_folder(const std::filesystem::path& dir, const std::string& path) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TVC_CHECK(fd >= 0, "cannot open the folder of '", printable(path), "' to sync it: ", errno_text());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  TVC_CHECK(rc == 0, "cannot sync the folder of '", printable(path), "': ", std::strerror(err));
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(const std::string& path) : path_(path) {
  std::filesystem::path target(path);
  TVC_CHECK(!target.filename().empty(), "cannot write '", printable(path), "': not a file name");
  std::filesystem::path dir = target.parent_path();
  std::string name = target.filename().string();
  remove_stale_temporaries(dir, name);
  static std::atomic<uint64_t> counter{0};
  std::string temp_name = cat_str(".", name, kTempTag, ::getpid(), ".", counter++);
  temp_path_ = (dir / temp_name).string();
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  TVC_CHECK(fd_ >= 0, "cannot write '", printable(path), "': creating '", printable(temp_path_),
            "' failed: ", errno_text());
  buffer_.reserve(kBufferSize);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::flush_buffer() {
  size_t done = 0;
  while (done < buffer_.size()) {
    ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    TVC_CHECK(n > 0, "cannot write '", printable(path_), "': ", errno_text());
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
}

void AtomicFileWriter::write(const void* data, size_t n) {
  TVC_CHECK(!committed_ && fd_ >= 0, "AtomicFileWriter: '", printable(path_), "' was already committed");
  const auto* bytes = static_cast<const uint8_t*>(data);
  while (n > 0) {
    size_t take = std::min(n, kBufferSize - buffer_.size());
    buffer_.insert(buffer_.end(), bytes, bytes + take);
    bytes += take;
    n -= take;
    position_ += take;
    if (buffer_.size() == kBufferSize) flush_buffer();
  }
}

void AtomicFileWriter::write_zeros(size_t n) {
  static const uint8_t zeros[64] = {};
  while (n > 0) {
    size_t take = std::min(n, sizeof zeros);
    write(zeros, take);
    n -= take;
  }
}

void AtomicFileWriter::commit() {
  TVC_CHECK(!committed_ && fd_ >= 0, "AtomicFileWriter: '", printable(path_), "' was already committed");
  flush_buffer();
  TVC_CHECK(::fsync(fd_) == 0, "cannot sync '", printable(temp_path_), "': ", errno_text());
  int rc = ::close(fd_);
  fd_ = -1;
  TVC_CHECK(rc == 0, "cannot close '", printable(temp_path_), "': ", errno_text());
  TVC_CHECK(::rename(temp_path_.c_str(), path_.c_str()) == 0, "cannot rename '", printable(temp_path_), "' to '",
            printable(path_), "': ", errno_text());
  committed_ = true;
  fsync_folder(std::filesystem::path(path_).parent_path(), path_);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFileWriter writer(path);
  writer.write(bytes.data(), bytes.size());
  writer.commit();
}

}  // namespace tvc::io
