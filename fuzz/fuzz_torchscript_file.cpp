// The TorchScript file checks before LibTorch loads a module (torchscript_file.h): the zip's
// central directory (read_zip_directory), the version record and content identity
// (read_torchscript_file_info), and every entry's bytes (read_zip_member, io/zip_archive.h).
#include "fuzz_support.h"
#include "hpc_train/model/torchscript_file.h"

using namespace hpc_train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch_path("module.pt");
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::parse_or_reject([&] {
    const TorchScriptFileInfo info = read_torchscript_file_info(path);
    fuzz::fail_unless(info.format_version >= 0 && !info.version_record.empty() &&
                          info.content_identity.size() == 16,
                      "an accepted file without a version or an identity");
  });
  fuzz::parse_or_reject([&] {
    for (const ZipEntry& entry : read_zip_directory(path)) {
      fuzz::fail_unless(entry.local_header_offset <= size && entry.compressed_bytes <= size,
                        "entry '" + entry.name + "' beyond the file");
      fuzz::parse_or_reject([&] {
        const std::vector<uint8_t> bytes = read_zip_member(path, entry, 1 << 20);
        fuzz::fail_unless(bytes.size() == entry.uncompressed_bytes,
                          "entry '" + entry.name + "' read back at another size");
      });
    }
  });
  return 0;
}
