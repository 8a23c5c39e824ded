#include "hpc_train/model/torchscript_file.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "hpc_train/error.h"

namespace hpc_train {
namespace {

// A version record holds a few digits and a newline.
constexpr uint64_t kMaxVersionRecordBytes = 64;

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
  if (version->method != kZipStored)
    throw DataError(path + ": zip entry \"" + version->name + "\": compressed (method " +
                    std::to_string(version->method) + "); PyTorch stores it uncompressed");
  info.format_version =
      parse_version(read_zip_member(path, *version, kMaxVersionRecordBytes),
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
