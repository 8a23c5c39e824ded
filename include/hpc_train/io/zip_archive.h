// Zip archives as PyTorch (TorchScript files, torch.save) and numpy (.npz) write them: the
// central directory (the end of central directory record, zip64 when the archive needs it,
// every entry's header) and one member's bytes, stored or deflated (zlib), CRC-checked. Every
// size comes from outside: each is checked against the file and a limit before a buffer exists,
// and a bad one is a DataError naming the file and the entry (PKWARE's APPNOTE.TXT, sections
// 4.3.7 local header, 4.3.12 directory header, 4.3.14-16 end records, 4.5.3 zip64 field).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hpc_train {

// One entry of a zip archive's central directory.
struct ZipEntry {
  std::string name;                 // the full name in the archive, e.g. "net/code/__torch__/x.py"
  uint16_t method = 0;              // kZipStored, kZipDeflated, ...
  uint32_t crc32 = 0;               // of the uncompressed bytes
  uint64_t compressed_bytes = 0;
  uint64_t uncompressed_bytes = 0;
  uint64_t local_header_offset = 0;
};
inline constexpr uint16_t kZipStored = 0;
inline constexpr uint16_t kZipDeflated = 8;

// Reads the central directory of the zip archive `path`. Throws DataError naming the file when
// it cannot be opened, is not a zip archive, or its directory is truncated or inconsistent
// (entries that run past the directory or the file, more than kMaxZipEntries entries, a
// directory larger than kMaxZipDirectoryBytes).
std::vector<ZipEntry> read_zip_directory(const std::string& path);
inline constexpr uint64_t kMaxZipEntries = 1'000'000;
inline constexpr uint64_t kMaxZipDirectoryBytes = uint64_t{64} << 20;

// The uncompressed bytes of `entry` of the archive `path`: stored or deflated, CRC-checked.
// Refuses (DataError naming the file and the entry) other methods, encryption, a member over
// `max_bytes` or over this machine's memory or over what deflate can expand its compressed bytes
// to (all before anything is allocated), a local header that does not match, data past the end
// of the file, a truncated or corrupt deflate stream, and a CRC mismatch.
std::vector<uint8_t> read_zip_member(const std::string& path, const ZipEntry& entry,
                                     uint64_t max_bytes);

}  // namespace hpc_train
