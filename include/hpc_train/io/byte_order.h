// Unsigned integers in little-endian byte order, whatever the host's: the order of every binary
// format we read or write with our own code (ZIP, .npy, pickle, safetensors, HDF5's global heap,
// TFRecord and protobuf's fixed fields). The one place that spells it out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hpc_train {

// The unsigned integer stored in the `byte_count` (at most 8) bytes at `bytes`, least
// significant byte first.
inline uint64_t load_little_endian(const uint8_t* bytes, size_t byte_count) {
  uint64_t value = 0;
  for (size_t i = byte_count; i-- > 0;) value = (value << 8) | bytes[i];
  return value;
}

// The two's-complement integer stored in the `byte_count` (at most 8) bytes at `bytes`, least
// significant byte first: sign-extended from its top bit.
inline int64_t load_little_endian_signed(const uint8_t* bytes, size_t byte_count) {
  uint64_t bits = load_little_endian(bytes, byte_count);
  if (byte_count > 0 && byte_count < 8 && (bits >> (8 * byte_count - 1)) & 1)
    bits |= ~uint64_t{0} << (8 * byte_count);
  return static_cast<int64_t>(bits);
}

// The UInt stored in the sizeof(UInt) bytes at `bytes`, least significant byte first.
template <class UInt>
UInt load_little_endian(const uint8_t* bytes) {
  return static_cast<UInt>(load_little_endian(bytes, sizeof(UInt)));
}

// Appends `value`'s sizeof(UInt) bytes, least significant first.
template <class UInt>
void append_little_endian(std::string& out, UInt value) {
  for (size_t i = 0; i < sizeof(UInt); ++i)
    out.push_back(static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff));
}

}  // namespace hpc_train
