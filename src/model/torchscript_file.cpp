#include "hpc_train/model/torchscript_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "hpc_train/error.h"

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
constexpr uint16_t kStored = 0;
// A version record holds a few digits and a newline.
constexpr uint64_t kMaxVersionRecordBytes = 64;

std::string system_error() { return std::strerror(errno); }

uint16_t u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t u32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint64_t u64(const uint8_t* p) { return uint64_t{u32(p)} | uint64_t{u32(p + 4)} << 32; }

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

std::string hex(uint64_t value, int digits) {
  char text[17];
  std::snprintf(text, sizeof text, "%0*llx", digits, static_cast<unsigned long long>(value));
  return text;
}

uint64_t fnv1a(uint64_t hash, const std::string& bytes) {
  for (const unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

int64_t parse_version(const std::vector<uint8_t>& bytes, const std::string& where) {
  std::string text(bytes.begin(), bytes.end());
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  const bool digits = !text.empty() && text.size() <= 18 &&
                      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) throw DataError(where + "is not a decimal version number");
  return std::stoll(text);
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

std::vector<uint8_t> read_stored_zip_entry(const std::string& path, const ZipEntry& entry,
                                           uint64_t max_bytes) {
  const std::string where = path + ": zip entry \"" + entry.name + "\": ";
  if (entry.method != kStored)
    throw DataError(where + "compressed (method " + std::to_string(entry.method) +
                    "); PyTorch stores it uncompressed");
  if (entry.compressed_bytes != entry.uncompressed_bytes)
    throw DataError(where + "stored, yet its compressed and uncompressed sizes differ");
  if (entry.uncompressed_bytes > max_bytes)
    throw DataError(where + std::to_string(entry.uncompressed_bytes) + " bytes, over the " +
                    std::to_string(max_bytes) + " expected");
  const InputFile file(path);
  if (file.bytes() < kLocalHeaderBytes || entry.local_header_offset > file.bytes() - kLocalHeaderBytes)
    throw DataError(where + "its local header lies outside the file");
  const std::vector<uint8_t> header = file.read(entry.local_header_offset, kLocalHeaderBytes);
  if (u32(header.data()) != kLocalHeaderSignature)
    throw DataError(where + "no local header where the central directory points");
  const uint64_t data_offset =
      entry.local_header_offset + kLocalHeaderBytes + u16(header.data() + 26) + u16(header.data() + 28);
  if (data_offset > file.bytes() || entry.compressed_bytes > file.bytes() - data_offset)
    throw DataError(where + "its data runs past the end of the file");
  return file.read(data_offset, entry.compressed_bytes);
}

TorchScriptFileInfo read_torchscript_file_info(const std::string& path) {
  const std::vector<ZipEntry> entries = read_zip_directory(path);
  if (entries.empty()) throw DataError(path + ": an empty zip archive, not a TorchScript file");
  // As PyTorch's reader: the records live in the first entry's top folder; entries elsewhere
  // are not part of the archive's content.
  const size_t slash = entries.front().name.find('/');
  if (slash == std::string::npos)
    throw DataError(path + ": a zip archive whose first entry \"" + entries.front().name +
                    "\" is not in a folder, so not one PyTorch wrote");
  const std::string top = entries.front().name.substr(0, slash + 1);
  TorchScriptFileInfo info;
  const ZipEntry* version = nullptr;
  std::vector<std::pair<std::string, const ZipEntry*>> records;
  for (const ZipEntry& entry : entries) {
    if (entry.name.compare(0, top.size(), top) != 0) continue;
    const std::string record = entry.name.substr(top.size());
    if (record == ".data/version" || (record == "version" && version == nullptr)) version = &entry;
    if (record.rfind("code/", 0) == 0) info.has_code = true;
    if (record == "data.pkl") info.has_data = true;
    records.emplace_back(record, &entry);
  }
  if (version == nullptr)
    throw DataError(path + ": a zip archive without the version record that PyTorch writes (" +
                    top + "version): not a TorchScript file");
  info.version_record = version->name;
  info.format_version =
      parse_version(read_stored_zip_entry(path, *version, kMaxVersionRecordBytes),
                    path + ": the zip's " + version->name + " record ");
  // Note [TorchScript identity]
  std::sort(records.begin(), records.end());
  uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a's offset basis
  for (const auto& [record, entry] : records)
    hash = fnv1a(hash, record + '\0' + hex(entry->crc32, 8) + '\0' +
                           std::to_string(entry->uncompressed_bytes) + '\n');
  info.content_identity = hex(hash, 16);
  return info;
}

}  // namespace hpc_train
