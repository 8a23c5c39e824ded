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
// Only the zip's central directory is read (io/zip_archive.h), and the bytes of the version
// records, which PyTorch stores uncompressed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hpc_train/io/zip_archive.h"

namespace hpc_train {

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

// What a TorchScript model's identity (TrainableModel::identity, which checkpoints record) starts
// with, before its content_identity: a file, unlike a registry name, cannot be found from it.
inline constexpr const char* kTorchScriptIdentityPrefix = "TorchScript content ";

// Reads `path` as a PyTorch zip archive. Throws DataError naming the file when it is not a zip
// archive, when its first entry is not in a folder (PyTorch's reader takes that folder as the
// archive's; entries outside it are ignored, here too), when the archive has no version record,
// or when the version record is not a decimal number (as read_zip_directory and
// read_zip_member do for what they check). An archive without code is returned as such
// (has_code false): what that means is the caller's to say.
TorchScriptFileInfo read_torchscript_file_info(const std::string& path);

}  // namespace hpc_train
