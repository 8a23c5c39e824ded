// JPEG and PNG files to 8-bit RGB pixels, for `convert imagefolder` (image_folder.h).
//
// Optional at build time: with libjpeg(-turbo) and libpng found by CMake the decoder is
// image_decode_libs.cpp; without either, image_decode_none.cpp, whose decode_image throws
// ConfigError and image_decoding_available() says false (the GPU machine has neither header).
//
// Decoding is a parser of bytes from outside (fuzz/fuzz_image_decode.cpp): every malformed input
// ends in a DataError, never in the libraries' default error handlers (libjpeg's calls exit()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hpc_train {

// Note [Decompression bombs]: a few hundred bytes of JPEG or PNG can declare (and a few KiB of
// PNG can hold) an image of 65535 x 65535 pixels, 12 GiB of RGB. The header's width x height is
// checked against a limit before any pixel buffer is allocated: 16384 x 16384 (768 MiB of RGB)
// is above any photograph a training set holds.
inline constexpr int64_t kMaxImagePixels = int64_t{16384} * 16384;

struct DecodedImage {
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> rgb;  // height x width x 3, row-major, R G B interleaved
};

// Whether this build decodes images (it found libjpeg and libpng).
bool image_decoding_available();

// The libraries that decode, for hpc_train_data --version: "libjpeg-turbo 2.1.5, libpng 1.6.39";
// in a build without them, the message that says so.
std::string image_decoder_libraries();

// Decodes a JPEG or PNG file's bytes (the format by its signature, not by the name) to RGB the
// way PIL's Image.convert("RGB") sees it: grayscale is replicated, alpha dropped (not
// composited), palettes and bit depths below 8 expanded, 16-bit samples cut to their high byte,
// CMYK JPEGs converted as PIL does. `name` (the file's path) starts every message. Throws
// DataError for anything else: another format, a truncated or corrupt stream, an image over
// `max_pixels` (Note [Decompression bombs]); ConfigError in a build without the libraries.
DecodedImage decode_image(const std::string& name, const uint8_t* bytes, size_t size,
                          int64_t max_pixels = kMaxImagePixels);

}  // namespace hpc_train
