// The safetensors header reader (read_safetensors_header), then every tensor's bytes
// (read_safetensors_tensor), which is what the header's validation is there for.
#include "fuzz_support.h"
#include "hpc_train/io/safetensors.h"

using namespace hpc_train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch_path("weights.safetensors");
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::parse_or_reject([&] {
    const SafetensorsHeader header = read_safetensors_header(path);
    fuzz::fail_unless(header.file_bytes == size && header.data_start <= size,
                      "file size or data start wrong");
    for (const SafetensorsTensorInfo& tensor : header.tensors) {
      std::optional<uint64_t> bytes = safetensors_dtype_bytes(tensor.dtype);
      fuzz::fail_unless(*bytes != 0, "a tensor of dtype '" + tensor.dtype + "'");
      for (int64_t dimension : tensor.shape) {
        fuzz::fail_unless(dimension >= 0, "a negative dimension");
        if (bytes) bytes = fuzz::checked_product(*bytes, static_cast<uint64_t>(dimension));
      }
      fuzz::fail_unless(bytes && *bytes == tensor.bytes() &&
                            tensor.end <= size - header.data_start,
                        "tensor '" + tensor.name + "': offsets that do not fit shape or file");
      const std::vector<uint8_t> values = read_safetensors_tensor(path, header, tensor.name);
      fuzz::fail_unless(values.size() == tensor.bytes(), "a tensor read back at another size");
    }
  });
  return 0;
}
