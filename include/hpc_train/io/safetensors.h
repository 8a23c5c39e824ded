// The safetensors file format: weights that PyTorch (`safetensors.torch.load_file`) and other
// frameworks read without running code from the file.
//
// Layout:
//   8 bytes    N, the header's length, unsigned 64-bit little-endian
//   N bytes    a UTF-8 JSON object, padded with spaces to a multiple of 8 bytes:
//                {"__metadata__": {"key": "value", ...},               (optional, strings only)
//                 "name": {"dtype": "F32", "shape": [64, 3, 3, 3], "data_offsets": [begin, end]},
//                 ...}
//   the data   every tensor's bytes, row-major and little-endian, back to back with no gaps;
//              offsets count from the first byte after the header, and the last tensor ends at
//              the end of the file
//
// No LibTorch here: the data tool and the tests use it without linking LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hpc_train {

// One tensor to write. `data` points at `bytes` bytes, little-endian, row-major; it may be null
// when `bytes` is 0. `dtype` is a safetensors name: BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16,
// F16, BF16, I32, U32, F32, I64, U64, F64. An empty `shape` is a scalar (one element).
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

// One tensor as a file describes it.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the first data byte
  uint64_t end = 0;
  uint64_t bytes() const { return end - begin; }
};

// A validated header.
struct SafetensorsHeader {
  std::vector<SafetensorsTensorInfo> tensors;   // in the order of their data in the file
  std::map<std::string, std::string> metadata;  // "__metadata__"; empty when the file has none
  uint64_t data_start = 0;                      // file offset of the first data byte: 8 + N
  uint64_t file_bytes = 0;

  // The tensor of that name, or null.
  const SafetensorsTensorInfo* find(const std::string& name) const;
};

// Bytes per element of a safetensors dtype name; 0 for a name this code does not know.
size_t safetensors_dtype_bytes(const std::string& dtype);

// Writes `tensors` and `metadata` to `path` atomically: a temporary file in the same directory,
// fsynced, then renamed over `path`, so that a crash leaves either the old file or the new one,
// never half a file. Tensors with larger elements come first (otherwise in the order given), as
// the reference implementation lays them out, so that every tensor starts at a multiple of its
// element size: readers that map the file view the bytes in place as the element type. The
// metadata is written only when it is not empty.
// Throws Error naming the file (and the tensor) for a malformed entry (unknown dtype, negative
// dimension, `bytes` that is not product(shape) x element size, a name given twice, the name
// "__metadata__") and for a failed write.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads and checks the header of `path`: the length against the file's size (and the reference
// implementation's 100 MB limit), the JSON, every entry's dtype, shape and offsets, offsets
// that cover the data exactly with no gap or overlap, and metadata of strings only.
// Throws DataError naming the file (and the tensor) when anything is wrong.
SafetensorsHeader read_safetensors_header(const std::string& path);

// The bytes of one tensor of a file whose header `header` is. Throws DataError naming the file
// for an unknown name or a file that changed since its header was read.
std::vector<uint8_t> read_safetensors_tensor(const std::string& path,
                                             const SafetensorsHeader& header,
                                             const std::string& name);

}  // namespace hpc_train
