// The arrays of a NumPy .npz file (numpy.savez, numpy.savez_compressed): a zip archive of .npy
// members, stored or deflated, read by io/zip_archive.h; here: the .npy header (magic, version
// 1, 2 or 3, the dict of descr, fortran_order and shape) and its data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>


namespace hpc_train {

// One .npy array: its dtype and shape, and its values in C order, as the file has them.
struct NpyArray {
  std::string where;       // "FILE.npz: x_train.npy", the prefix of messages about it
  std::string descr;       // the dtype as numpy writes it, e.g. "|u1", "<i8"
  char kind = 0;           // 'u' unsigned, 'i' signed, 'f' float, 'b' bool, ...
  int64_t item_bytes = 0;  // 1, 2, 4, 8, ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // the whole member; the values begin at data_offset
  size_t data_offset = 0;

  const uint8_t* data() const { return bytes.data() + data_offset; }
  int64_t count() const;  // product of shape (1 for a 0-d array)
};

// Parses a whole .npy member. Throws DataError prefixed with `where` for a missing magic, an
// unknown version, a header that is not the dict numpy writes, a structured or big-endian
// multi-byte dtype, fortran_order True, negative or overflowing sizes, and a data part shorter or
// longer than the shape says.
NpyArray parse_npy(const std::string& where, std::vector<uint8_t> bytes);

}  // namespace hpc_train
