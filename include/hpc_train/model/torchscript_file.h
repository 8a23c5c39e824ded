// What hpc_train reads of a TorchScript file itself, before LibTorch loads it: that the file is
// a zip archive of PyTorch's layout, the file format version it records, and an identity of its
// content (scripted_model.h uses all three). No LibTorch here: the fuzz target of this parser
// builds without it.
//
// A TorchScript file (torch.jit.save, ScriptModule.save) is a zip archive whose entries all sit
// in one top folder, named after the file when it was saved ("net/..."):
//   net/version             the file format version, decimal ASCII ("3\n"); newer PyTorch
//                           releases write net/.data/version (and may keep net/version)
//   net/code/__torch__/...  the module's TorchScript code, one file per class (and a
//                           .debug_pkl beside each: source ranges, file names of the Python)
//   net/constants.pkl       constants of the code (tensors under net/constants/)
//   net/data.pkl, net/data/ the module object: attributes, parameters and buffers
// torch.save (a pickled state_dict or nn.Module) writes the same zip layout with data.pkl and
// data/ but no code: not a module LibTorch can run.
//
// Only the zip's central directory is read (the end of central directory record, zip64 when
// the archive needs it, then every entry's header), and the bytes of the version records, which
// PyTorch stores uncompressed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hpc_train {

// One entry of a zip archive's central directory.
struct ZipEntry {
  std::string name;                 // the full name in the archive, e.g. "net/code/__torch__/x.py"
  uint16_t method = 0;              // 0 stored, 8 deflated, ...
  uint32_t crc32 = 0;               // of the uncompressed bytes
  uint64_t compressed_bytes = 0;
  uint64_t uncompressed_bytes = 0;
  uint64_t local_header_offset = 0;
};

// Reads the central directory of the zip archive `path`. Throws DataError naming the file when
// it cannot be opened, is not a zip archive, or its directory is truncated or inconsistent
// (entries that run past the directory or the file, more than kMaxZipEntries entries, a
// directory larger than kMaxZipDirectoryBytes).
std::vector<ZipEntry> read_zip_directory(const std::string& path);
inline constexpr uint64_t kMaxZipEntries = 1'000'000;
inline constexpr uint64_t kMaxZipDirectoryBytes = uint64_t{64} << 20;

// The bytes of a stored (uncompressed) entry of `path`, at most `max_bytes` of them. Throws
// DataError naming the file and the entry for a compressed entry, a larger one, or a local
// header that does not match the directory.
std::vector<uint8_t> read_stored_zip_entry(const std::string& path, const ZipEntry& entry,
                                           uint64_t max_bytes);

// What a PyTorch zip archive says about itself.
struct TorchScriptFileInfo {
  // The file format version: the .data/version record where there is one (as PyTorch's reader
  // prefers it), else the version record; -1 when neither is there.
  int64_t format_version = -1;
  std::string version_record;  // the record it came from, e.g. "net/.data/version"; "" = none
  bool has_code = false;       // code/ records: TorchScript (not a torch.save file)
  bool has_data = false;       // data.pkl: a pickled object (module or state_dict)
  // Note [TorchScript identity]: 16 hex digits, a 64-bit FNV-1a hash over the name (without
  // the top folder), CRC-32 and size of every record in the top folder, as the central
  // directory lists them: the file's content, read without reading or decompressing a record.
  // A checkpoint records it, so that a resume with another file is refused (another module,
  // other initial weights, or the same module saved again: TorchScript's saved code is not
  // byte-stable across saves, it orders some class attributes by Python's string hashes),
  // while the same file copied, moved or renamed resumes.
  std::string content_identity;
};

// Reads `path` as a PyTorch zip archive. Throws DataError naming the file when it is not a zip
// archive, when its first entry is not in a folder (PyTorch's reader takes that folder as the
// archive's; entries outside it are ignored, here too), when the archive has no version record,
// or when the version record is not a decimal number (as read_zip_directory and
// read_stored_zip_entry do for what they check). An archive without code is returned as such
// (has_code false): what that means is the caller's to say.
TorchScriptFileInfo read_torchscript_file_info(const std::string& path);

}  // namespace hpc_train
