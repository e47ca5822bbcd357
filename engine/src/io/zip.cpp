#include "io/zip.h"

#include <zip.h>
#include <zlib.h>

#include <algorithm>
#include <memory>

#include "tvc/error.h"

namespace tvc::io {

// ---------------------------------------------------------------- reader

namespace {

// What is wrong with an entry's declared sizes, or "" when they are plausible: a stored
// entry's size must equal its compressed size, a deflated one's may not exceed the deflate
// ratio limit (1032:1), and the compressed bytes must fit in the file.
std::string size_fault(const zip_stat_t& st, uint64_t file_size) {
  const zip_uint64_t needed = ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD;
  if ((st.valid & needed) != needed) return "has no size";
  if (st.encryption_method != ZIP_EM_NONE) return "is encrypted";
  if (st.comp_size > file_size) return cat_str("claims ", st.comp_size, " compressed bytes in a file of ", file_size);
  if (st.comp_method == ZIP_CM_STORE) {
    if (st.size != st.comp_size) return cat_str("is stored but declares ", st.size, " bytes and holds ", st.comp_size);
  } else if (st.comp_method == ZIP_CM_DEFLATE) {
    if (st.size > st.comp_size * 1032 + 1024)  // comp_size <= file_size: no overflow
      return cat_str("declares ", st.size, " bytes from ", st.comp_size,
                     " deflated bytes, beyond the deflate ratio limit");
  } else {
    return cat_str("uses compression method ", st.comp_method, " (only stored and deflated entries are supported)");
  }
  return "";
}

// Why libzip's consistency check refused the archive, if an entry's sizes say: the archive
// opened without the check, each entry's sizes checked.
std::string inconsistent_entry(const std::string& path, uint64_t file_size) {
  int code = 0;
  zip_t* archive = zip_open(path.c_str(), ZIP_RDONLY, &code);
  if (!archive) return "";
  std::string fault;
  zip_int64_t n = zip_get_num_entries(archive, 0);
  for (zip_int64_t i = 0; i < n && fault.empty(); ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(archive, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW, &st) != 0 || !st.name) continue;
    std::string why = size_fault(st, file_size);
    if (!why.empty()) fault = cat_str(" (entry '", printable(st.name), "' ", why, ")");
  }
  zip_discard(archive);
  return fault;
}

}  // namespace

ZipReader::ZipReader(const std::string& path) : path_(path) {
  InputFile file(path);  // a clear error for a missing file or a folder
  file_size_ = file.size();
  int code = 0;
  archive_ = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code);
  if (!archive_) {
    zip_error_t error;
    zip_error_init_with_code(&error, code);
    std::string why = zip_error_strerror(&error);
    zip_error_fini(&error);
    throw Error(
        cat_str("'", printable(path), "': not a readable zip archive: ", why, inconsistent_entry(path, file_size_)));
  }
  zip_int64_t n = zip_get_num_entries(archive_, 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* name = zip_get_name(archive_, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW);
    if (!name || !index_.emplace(name, static_cast<uint64_t>(i)).second) {
      std::string why =
          name ? cat_str("the entry '", printable(name), "' appears twice") : std::string(zip_strerror(archive_));
      zip_discard(archive_);
      throw Error(cat_str("'", printable(path), "': bad zip archive: ", why));
    }
    names_.emplace_back(name);
  }
}

ZipReader::~ZipReader() { zip_discard(archive_); }  // read-only: nothing to write back

uint64_t ZipReader::entry_index(const std::string& name) const {
  auto it = index_.find(name);
  TVC_CHECK(it != index_.end(), "'", printable(path_), "': the zip archive has no entry '", printable(name), "'");
  return it->second;
}

uint64_t ZipReader::size(const std::string& name) const {
  zip_stat_t st;
  zip_stat_init(&st);
  TVC_CHECK(zip_stat_index(archive_, entry_index(name), 0, &st) == 0, "'", printable(path_), "': zip entry '",
            printable(name), "': ", zip_strerror(archive_));
  std::string fault = size_fault(st, file_size_);
  TVC_CHECK(fault.empty(), "'", printable(path_), "': zip entry '", printable(name), "' ", fault);
  return st.size;
}

void ZipReader::read(const std::string& name, void* dst, uint64_t n) const {
  uint64_t declared = size(name);
  TVC_CHECK(declared == n, "'", printable(path_), "': zip entry '", printable(name), "' holds ", declared,
            " bytes, expected ", n);
  zip_file_t* file = zip_fopen_index(archive_, entry_index(name), 0);
  TVC_CHECK(file != nullptr, "'", printable(path_), "': cannot open zip entry '", printable(name),
            "': ", zip_strerror(archive_));
  std::unique_ptr<zip_file_t, int (*)(zip_file_t*)> closer(file, zip_fclose);
  auto* out = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  // Reading one byte past the declared size makes libzip check the CRC (and shows extra data).
  uint8_t extra;
  for (;;) {
    uint64_t want = done < n ? std::min<uint64_t>(n - done, uint64_t{1} << 30) : 1;
    zip_int64_t got = zip_fread(file, done < n ? out + done : &extra, want);
    TVC_CHECK(got >= 0, "'", printable(path_), "': reading zip entry '", printable(name),
              "' failed: ", zip_file_strerror(file));
    if (got == 0) break;
    done += static_cast<uint64_t>(got);
    TVC_CHECK(done <= n, "'", printable(path_), "': zip entry '", printable(name), "' holds more than its declared ", n,
              " bytes");
  }
  TVC_CHECK(done == n, "'", printable(path_), "': zip entry '", printable(name), "' ends after ", done,
            " of its declared ", n, " bytes");
}

std::vector<uint8_t> ZipReader::read(const std::string& name, uint64_t max_size) const {
  uint64_t n = size(name);
  TVC_CHECK(n <= max_size, "'", printable(path_), "': zip entry '", printable(name), "' holds ", n,
            " bytes, more than the ", max_size, " expected");
  std::vector<uint8_t> bytes(static_cast<size_t>(n));
  read(name, bytes.data(), n);
  return bytes;
}

// ---------------------------------------------------------------- writer

namespace {

constexpr uint32_t kMax32 = 0xffffffffu;
constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;  // 1980-01-01: fixed, so output is reproducible

class Bytes {
 public:
  Bytes& u16(uint64_t v) { return put(v, 2); }
  Bytes& u32(uint64_t v) { return put(v, 4); }
  Bytes& u64(uint64_t v) { return put(v, 8); }
  Bytes& str(const std::string& s) {
    data.insert(data.end(), s.begin(), s.end());
    return *this;
  }
  std::vector<uint8_t> data;

 private:
  Bytes& put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) data.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
};

uint32_t crc_of(const void* data, uint64_t n) {
  uLong crc = crc32(0, nullptr, 0);
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    auto take = static_cast<uInt>(std::min<uint64_t>(n, uint64_t{1} << 30));
    crc = crc32(crc, p, take);
    p += take;
    n -= take;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace

ZipWriter::ZipWriter(const std::string& path, bool force_zip64) : out_(path), force_zip64_(force_zip64) {}

void ZipWriter::add(const std::string& name, const void* data, uint64_t size) {
  TVC_CHECK(!name.empty() && name.size() < 0xffff, "zip: bad entry name '", printable(name), "'");
  Entry e{name, crc_of(data, size), size, out_.position()};
  bool zip64 = force_zip64_ || size >= kMax32;
  Bytes extra;
  if (zip64) extra.u16(0x0001).u16(16).u64(size).u64(size);  // zip64: uncompressed, compressed sizes
  // Pad with an extra field "FB" (as torch's writer) so the data starts at a multiple of 64.
  uint64_t data_start = e.offset + 30 + name.size() + extra.data.size() + 4;
  uint64_t pad = (64 - data_start % 64) % 64;
  extra.u16(0x4246).u16(pad).str(std::string(pad, 'Z'));
  Bytes header;
  header.u32(0x04034b50).u16(zip64 ? 45 : 20).u16(0).u16(0).u16(0).u16(kDosDate).u32(e.crc);
  header.u32(zip64 ? kMax32 : size).u32(zip64 ? kMax32 : size).u16(name.size()).u16(extra.data.size());
  header.str(name);
  out_.write(header.data.data(), header.data.size());
  out_.write(extra.data.data(), extra.data.size());
  if (size > 0) out_.write(data, size);
  entries_.push_back(std::move(e));
}

void ZipWriter::finish() {
  uint64_t cd_offset = out_.position();
  for (const Entry& e : entries_) {
    bool big_size = force_zip64_ || e.size >= kMax32, big_offset = force_zip64_ || e.offset >= kMax32;
    Bytes extra;  // zip64 fields, only for the header fields that overflow, in this order
    if (big_size || big_offset) {
      extra.u16(0x0001).u16((big_size ? 16 : 0) + (big_offset ? 8 : 0));
      if (big_size) extra.u64(e.size).u64(e.size);
      if (big_offset) extra.u64(e.offset);
    }
    Bytes h;
    h.u32(0x02014b50).u16(big_size || big_offset ? 45 : 20).u16(big_size || big_offset ? 45 : 20);
    h.u16(0).u16(0).u16(0).u16(kDosDate).u32(e.crc).u32(big_size ? kMax32 : e.size).u32(big_size ? kMax32 : e.size);
    h.u16(e.name.size()).u16(extra.data.size()).u16(0).u16(0).u16(0).u32(0);
    h.u32(big_offset ? kMax32 : e.offset).str(e.name);
    out_.write(h.data.data(), h.data.size());
    out_.write(extra.data.data(), extra.data.size());
  }
  uint64_t cd_size = out_.position() - cd_offset;
  uint64_t count = entries_.size();
  bool zip64 = force_zip64_ || count >= 0xffff || cd_size >= kMax32 || cd_offset >= kMax32;
  Bytes end;
  if (zip64) {
    uint64_t record = out_.position();
    end.u32(0x06064b50).u64(44).u16(45).u16(45).u32(0).u32(0).u64(count).u64(count).u64(cd_size).u64(cd_offset);
    end.u32(0x07064b50).u32(0).u64(record).u32(1);  // zip64 end locator
  }
  uint64_t count16 = zip64 ? 0xffff : count;
  end.u32(0x06054b50).u16(0).u16(0).u16(count16).u16(count16);
  end.u32(zip64 ? kMax32 : cd_size).u32(zip64 ? kMax32 : cd_offset).u16(0);
  out_.write(end.data.data(), end.data.size());
  out_.commit();
}

}  // namespace tvc::io
