#include "hpc_train/io/zip_archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "hpc_train/error.h"
#include "hpc_train/io/byte_order.h"
#include "hpc_train/runtime/runtime.h"

namespace hpc_train {
namespace {

// Zip's records (PKWARE APPNOTE.TXT, sections 4.3.7, 4.3.12, 4.3.14-16, 4.5.3).
constexpr uint32_t kEndOfDirectorySignature = 0x06054b50;
constexpr uint32_t kZip64EndOfDirectorySignature = 0x06064b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint32_t kDirectoryEntrySignature = 0x02014b50;
constexpr uint32_t kLocalHeaderSignature = 0x04034b50;
constexpr uint64_t kEndOfDirectoryBytes = 22;
constexpr uint64_t kZip64LocatorBytes = 20;
constexpr uint64_t kZip64EndOfDirectoryBytes = 56;
constexpr uint64_t kDirectoryEntryBytes = 46;
constexpr uint64_t kLocalHeaderBytes = 30;
constexpr uint64_t kMaxCommentBytes = 0xffff;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint16_t kEncryptedFlag = 1;
// Deflate expands at most 1032:1 (zlib's FAQ; each 258-byte match costs at least 2 bits): a
// member that claims more than that of its compressed bytes is refused before its buffer exists.
constexpr uint64_t kMaxDeflateRatio = 1032;
// zlib counts in uInt: large members go through in pieces.
constexpr uint64_t kZlibPieceBytes = uint64_t{1} << 30;

std::string system_error() { return std::strerror(errno); }

// ZIP's fields are little-endian.
constexpr auto u16 = load_little_endian<uint16_t>;
constexpr auto u32 = load_little_endian<uint32_t>;
constexpr auto u64 = load_little_endian<uint64_t>;

// A file opened for reading, closed when it goes.
class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw DataError(path + ": cannot open: " + system_error());
    struct stat status {};
    if (::fstat(fd_, &status) != 0 || !S_ISREG(status.st_mode)) {
      ::close(fd_);
      throw DataError(path + ": not a regular file");
    }
    bytes_ = static_cast<uint64_t>(status.st_size);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t bytes() const { return bytes_; }

  // `count` bytes at `offset`, which the caller has checked lie inside the file.
  std::vector<uint8_t> read(uint64_t offset, uint64_t count) const {
    std::vector<uint8_t> data(count);
    uint64_t done = 0;
    while (done < count) {
      const ssize_t got = ::pread(fd_, data.data() + done, count - done,
                                  static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw DataError(path_ + ": cannot read: " + system_error());
      if (got == 0) throw DataError(path_ + ": the file ended early (truncated while being read?)");
      done += static_cast<uint64_t>(got);
    }
    return data;
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
};

struct DirectoryPlace {
  uint64_t entries = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

[[noreturn]] void not_zip(const std::string& path, const std::string& why) {
  throw DataError(path + ": not a zip archive (" + why + ")");
}

// The end of central directory record is the last thing in the file, followed only by its
// comment: search back from the end for its signature with a comment length that ends there.
DirectoryPlace find_directory(const InputFile& file, const std::string& path) {
  if (file.bytes() < kEndOfDirectoryBytes)
    not_zip(path, std::to_string(file.bytes()) + " bytes, too short");
  const uint64_t tail_bytes = std::min(file.bytes(), kEndOfDirectoryBytes + kMaxCommentBytes);
  const uint64_t tail_start = file.bytes() - tail_bytes;
  const std::vector<uint8_t> tail = file.read(tail_start, tail_bytes);
  uint64_t at = tail_bytes - kEndOfDirectoryBytes;
  for (;; --at) {
    const uint8_t* p = tail.data() + at;
    if (u32(p) == kEndOfDirectorySignature &&
        at + kEndOfDirectoryBytes + u16(p + 20) == tail_bytes)
      break;
    if (at == 0) not_zip(path, "no end of central directory record");
  }
  const uint8_t* end = tail.data() + at;
  const uint64_t end_offset = tail_start + at;
  if (u16(end + 4) != 0 || u16(end + 6) != 0 || u16(end + 8) != u16(end + 10))
    throw DataError(path + ": a zip archive split over several disks");
  DirectoryPlace place{u16(end + 10), u32(end + 16), u32(end + 12)};
  // Zip64: a locator just before the record points at the zip64 end of central directory record,
  // whose 64-bit counts replace the 16- and 32-bit ones.
  if (end_offset >= kZip64LocatorBytes) {
    const std::vector<uint8_t> locator =
        file.read(end_offset - kZip64LocatorBytes, kZip64LocatorBytes);
    if (u32(locator.data()) == kZip64LocatorSignature) {
      const uint64_t record_offset = u64(locator.data() + 8);
      if (record_offset > end_offset - kZip64LocatorBytes ||
          end_offset - kZip64LocatorBytes - record_offset < kZip64EndOfDirectoryBytes)
        throw DataError(path + ": the zip64 end of central directory record lies outside the file");
      const std::vector<uint8_t> record = file.read(record_offset, kZip64EndOfDirectoryBytes);
      const uint8_t* r = record.data();
      if (u32(r) != kZip64EndOfDirectorySignature)
        throw DataError(path + ": no zip64 end of central directory record where its locator points");
      if (u32(r + 16) != 0 || u32(r + 20) != 0 || u64(r + 24) != u64(r + 32))
        throw DataError(path + ": a zip archive split over several disks");
      place = DirectoryPlace{u64(r + 32), u64(r + 48), u64(r + 40)};
    }
  }
  if (place.offset > end_offset || place.bytes > end_offset - place.offset)
    throw DataError(path + ": the zip central directory (" + std::to_string(place.bytes) +
                    " bytes at " + std::to_string(place.offset) + ") runs past its end record");
  if (place.bytes > kMaxZipDirectoryBytes)
    throw DataError(path + ": a zip central directory of " + std::to_string(place.bytes) +
                    " bytes, over the " + std::to_string(kMaxZipDirectoryBytes) + " read here");
  if (place.entries > kMaxZipEntries)
    throw DataError(path + ": " + std::to_string(place.entries) + " zip entries, over the " +
                    std::to_string(kMaxZipEntries) + " read here");
  return place;
}

// The zip64 extended information field replaces the 32-bit fields that hold 0xffffffff, in
// the order uncompressed size, compressed size, local header offset.
void apply_zip64_extra(const uint8_t* extra, uint64_t extra_bytes, ZipEntry& entry,
                       bool wide_uncompressed, bool wide_compressed, bool wide_offset,
                       const std::string& where) {
  uint64_t at = 0;
  while (at + 4 <= extra_bytes) {
    const uint16_t id = u16(extra + at);
    const uint64_t size = u16(extra + at + 2);
    if (at + 4 + size > extra_bytes) break;
    if (id == kZip64ExtraId) {
      const uint8_t* field = extra + at + 4;
      uint64_t used = 0;
      for (auto [wide, value] : {std::pair{wide_uncompressed, &entry.uncompressed_bytes},
                                 std::pair{wide_compressed, &entry.compressed_bytes},
                                 std::pair{wide_offset, &entry.local_header_offset}}) {
        if (!wide) continue;
        if (used + 8 > size) throw DataError(where + "a zip64 extra field too short for its sizes");
        *value = u64(field + used);
        used += 8;
      }
      return;
    }
    at += 4 + size;
  }
  if (wide_uncompressed || wide_compressed || wide_offset)
    throw DataError(where + "sizes of 0xffffffff without a zip64 extra field");
}

}  // namespace

std::vector<ZipEntry> read_zip_directory(const std::string& path) {
  const InputFile file(path);
  const DirectoryPlace place = find_directory(file, path);
  const std::vector<uint8_t> directory = file.read(place.offset, place.bytes);
  std::vector<ZipEntry> entries;
  uint64_t at = 0;
  for (uint64_t i = 0; i < place.entries; ++i) {
    const std::string where = path + ": zip entry " + std::to_string(i) + ": ";
    if (place.bytes - at < kDirectoryEntryBytes)
      throw DataError(where + "the central directory ends inside it");
    const uint8_t* p = directory.data() + at;
    if (u32(p) != kDirectoryEntrySignature)
      throw DataError(where + "no central directory header where one should begin");
    const uint64_t name_bytes = u16(p + 28), extra_bytes = u16(p + 30), comment_bytes = u16(p + 32);
    if (place.bytes - at - kDirectoryEntryBytes < name_bytes + extra_bytes + comment_bytes)
      throw DataError(where + "its name and fields run past the central directory");
    ZipEntry entry;
    entry.name.assign(reinterpret_cast<const char*>(p + kDirectoryEntryBytes), name_bytes);
    entry.method = u16(p + 10);
    entry.crc32 = u32(p + 16);
    entry.compressed_bytes = u32(p + 20);
    entry.uncompressed_bytes = u32(p + 24);
    entry.local_header_offset = u32(p + 42);
    apply_zip64_extra(p + kDirectoryEntryBytes + name_bytes, extra_bytes, entry,
                      entry.uncompressed_bytes == 0xffffffff, entry.compressed_bytes == 0xffffffff,
                      entry.local_header_offset == 0xffffffff, where + "\"" + entry.name + "\": ");
    if (entry.local_header_offset > place.offset ||
        entry.compressed_bytes > place.offset - entry.local_header_offset)
      throw DataError(where + "\"" + entry.name + "\": its data runs into the central directory");
    entries.push_back(std::move(entry));
    at += kDirectoryEntryBytes + name_bytes + extra_bytes + comment_bytes;
  }
  return entries;
}

std::vector<uint8_t> read_zip_member(const std::string& path, const ZipEntry& entry,
                                     uint64_t max_bytes) {
  const std::string where = path + ": zip entry \"" + entry.name + "\": ";
  if (entry.method != kZipStored && entry.method != kZipDeflated)
    throw DataError(where + "compression method " + std::to_string(entry.method) +
                    "; only stored (0) and deflated (8) entries are read");
  if (entry.uncompressed_bytes > max_bytes)
    throw DataError(where + std::to_string(entry.uncompressed_bytes) + " bytes, over the " +
                    std::to_string(max_bytes) + " expected");
  if (entry.method == kZipStored && entry.compressed_bytes != entry.uncompressed_bytes)
    throw DataError(where + "stored, yet its compressed and uncompressed sizes differ");
  if (entry.method == kZipDeflated &&
      entry.uncompressed_bytes / kMaxDeflateRatio > entry.compressed_bytes)
    throw DataError(where + "claims " + std::to_string(entry.uncompressed_bytes) +
                    " bytes from " + std::to_string(entry.compressed_bytes) +
                    " compressed ones, more than deflate can expand to");
  const int64_t memory_bytes = physical_memory_bytes();
  if (memory_bytes > 0 && entry.uncompressed_bytes > static_cast<uint64_t>(memory_bytes))
    throw DataError(where + memory_text(static_cast<double>(entry.uncompressed_bytes)) +
                    " uncompressed, more than this machine's memory (" +
                    memory_text(static_cast<double>(memory_bytes)) + ")");

  const InputFile file(path);
  const uint64_t file_bytes = file.bytes();
  if (file_bytes < kLocalHeaderBytes || entry.local_header_offset > file_bytes - kLocalHeaderBytes)
    throw DataError(where + "its local header lies outside the file (truncated?)");
  const std::vector<uint8_t> header_bytes = file.read(entry.local_header_offset, kLocalHeaderBytes);
  const uint8_t* header = header_bytes.data();
  if (u32(header) != kLocalHeaderSignature)
    throw DataError(where + "no local header where the central directory points");
  if (u16(header + 6) & kEncryptedFlag) throw DataError(where + "encrypted");
  const uint64_t data_offset =
      entry.local_header_offset + kLocalHeaderBytes + u16(header + 26) + u16(header + 28);
  if (data_offset > file_bytes || entry.compressed_bytes > file_bytes - data_offset)
    throw DataError(where + "its data runs past the end of the file (truncated)");

  std::vector<uint8_t> compressed = file.read(data_offset, entry.compressed_bytes);
  std::vector<uint8_t> bytes;
  if (entry.method == kZipStored) {
    bytes = std::move(compressed);
  } else {
    bytes.resize(entry.uncompressed_bytes);
    z_stream stream{};
    if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) throw Error(where + "inflateInit2 failed");
    uint64_t in_done = 0, out_done = 0;
    Bytef empty_output = 0;
    int status = Z_OK;
    // Raw deflate (zip has no zlib header). Pieces of at most kZlibPieceBytes, fed as zlib
    // consumes them.
    while (status == Z_OK) {
      if (stream.avail_in == 0) {
        const uint64_t piece = std::min(kZlibPieceBytes, compressed.size() - in_done);
        stream.next_in = compressed.data() + in_done;
        stream.avail_in = static_cast<uInt>(piece);
        in_done += piece;
      }
      if (stream.avail_out == 0) {
        const uint64_t piece = std::min(kZlibPieceBytes, bytes.size() - out_done);
        // zlib refuses a null next_out, which an empty vector's data() may be.
        stream.next_out = bytes.empty() ? &empty_output : bytes.data() + out_done;
        stream.avail_out = static_cast<uInt>(piece);
        out_done += piece;
      }
      const uLong before_in = stream.total_in, before_out = stream.total_out;
      status = inflate(&stream, Z_NO_FLUSH);
      // No progress possible: input or output exhausted (Z_BUF_ERROR) with nothing left to give.
      if ((status == Z_BUF_ERROR || status == Z_OK) && stream.total_in == before_in &&
          stream.total_out == before_out &&
          ((stream.avail_in == 0 && in_done == compressed.size()) ||
           (stream.avail_out == 0 && out_done == bytes.size())))
        break;
      if (status == Z_BUF_ERROR) status = Z_OK;
    }
    const uint64_t produced = stream.total_out;
    const char* message = stream.msg;
    const std::string zlib_text = message ? message : "";
    inflateEnd(&stream);
    if (status != Z_STREAM_END) {
      if (status == Z_OK || status == Z_BUF_ERROR)
        throw DataError(where + "the deflate stream ends early or runs past its " +
                        std::to_string(entry.uncompressed_bytes) +
                        " uncompressed bytes (truncated or corrupt)");
      throw DataError(where + "corrupt deflate data" +
                      (zlib_text.empty() ? "" : " (" + zlib_text + ")"));
    }
    if (produced != entry.uncompressed_bytes)
      throw DataError(where + "inflates to " + std::to_string(produced) +
                      " bytes, the zip directory says " +
                      std::to_string(entry.uncompressed_bytes));
  }
  const uint32_t crc = static_cast<uint32_t>(crc32_z(0, bytes.data(), bytes.size()));
  if (crc != entry.crc32) {
    char text[64];
    std::snprintf(text, sizeof text, "CRC-32 mismatch: %08x, the zip directory says %08x", crc,
                  entry.crc32);
    throw DataError(where + text + " (corrupt)");
  }
  return bytes;
}

}  // namespace hpc_train
