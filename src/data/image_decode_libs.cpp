// image_decode.h with libjpeg(-turbo) and libpng (the build found both).
//
// Note [Library errors]: libjpeg's default error_exit prints and calls exit(), and libpng's
// default error handler longjmps to a jmp_buf the caller must have set, or aborts. Both get an
// error function here that keeps the library's message and longjmps back to the setjmp in the
// decoding function, which destroys the library's state and throws DataError. Between the setjmp
// and the longjmp only C frames (the libraries') and the handlers run, so no C++ destructor is
// skipped; the C++ objects the decoding functions own are declared before the setjmp.
#include "hpc_train/data/image_decode.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <cstring>

#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

#include "hpc_train/error.h"

namespace hpc_train {

namespace {

// libjpeg-turbo decodes a progressive JPEG scan by scan, each over the whole image: a crafted
// file of thousands of tiny scans takes minutes (libjpeg-turbo's own fuzzers stop at 500).
constexpr int kMaxJpegScans = 1000;

std::string pixels_text(int64_t width, int64_t height) {
  return std::to_string(width) + "x" + std::to_string(height);
}

// What is wrong with a header's image size, or "" (a string, not an exception: the PNG decoder
// must leave through png_error, Note [Library errors]).
std::string pixel_count_problem(const std::string& name, const char* format, int64_t width,
                                int64_t height, int64_t max_pixels) {
  if (width < 1 || height < 1)
    return name + ": " + format + " of " + pixels_text(width, height) + " pixels (an empty image)";
  if (width > max_pixels / height)  // Note [Decompression bombs]
    return name + ": " + format + " of " + pixels_text(width, height) +
           " pixels is over the limit of " + std::to_string(max_pixels) +
           " pixels an image (a decompression bomb, or an image to shrink first)";
  return "";
}

// --- JPEG ---------------------------------------------------------------------------------

struct JpegErrorManager {
  jpeg_error_mgr base;  // first: libjpeg hands the handlers &base as cinfo->err
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {  // Note [Library errors]
  auto* manager = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, manager->message);
  std::longjmp(manager->jump, 1);
}

// libjpeg reports every warning and trace message here. A premature end of data is only a
// warning to libjpeg (it fills the rest of the image with grey); a truncated file is an error
// here, as PIL makes it. Other warnings (corrupt entropy data) are ignored, as PIL does.
void jpeg_message(j_common_ptr cinfo, int level) {
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_fail(cinfo);
  if (cinfo->is_decompressor &&
      reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number > kMaxJpegScans) {
    auto* manager = reinterpret_cast<JpegErrorManager*>(cinfo->err);
    std::snprintf(manager->message, sizeof manager->message, "more than %d scans",
                  kMaxJpegScans);
    std::longjmp(manager->jump, 1);
  }
}

// PIL's CMYK to RGB (Convert.c, cmyk2rgb): r = (255 - k) - c (255 - k) / 255, rounded its way.
uint8_t cmyk_channel(int ink, int black_complement) {
  const int product = ink * black_complement + 128;
  const int scaled = ((product >> 8) + product) >> 8;
  return static_cast<uint8_t>(black_complement - scaled);
}

DecodedImage decode_jpeg(const std::string& name, const uint8_t* bytes, size_t size,
                         int64_t max_pixels) {
  DecodedImage image;
  std::vector<uint8_t> cmyk_row;
  jpeg_decompress_struct cinfo;
  JpegErrorManager errors;
  cinfo.err = jpeg_std_error(&errors.base);
  errors.base.error_exit = jpeg_fail;
  errors.base.emit_message = jpeg_message;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw DataError(name + ": corrupt or unsupported JPEG: " + errors.message);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  const int64_t width = cinfo.image_width, height = cinfo.image_height;
  const std::string size_problem = pixel_count_problem(name, "a JPEG", width, height, max_pixels);
  if (!size_problem.empty()) {
    jpeg_destroy_decompress(&cinfo);
    throw DataError(size_problem);
  }
  // Coefficient buffers of a progressive image are ~6 bytes a pixel; beyond that libjpeg fails
  // (no backing store) instead of allocating what the header asks.
  cinfo.mem->max_memory_to_use = static_cast<long>(width * height * 8 + (64 << 20));
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const int components = cinfo.output_components;
  if (components != (cmyk ? 4 : 3)) {
    jpeg_destroy_decompress(&cinfo);
    throw DataError(name + ": JPEG decodes to " + std::to_string(components) +
                    " components, expected " + (cmyk ? "4 (CMYK)" : "3 (RGB)"));
  }
  image.width = cinfo.output_width;
  image.height = cinfo.output_height;
  image.rgb.resize(static_cast<size_t>(image.width * image.height * 3));
  if (cmyk) cmyk_row.resize(static_cast<size_t>(image.width * 4));
  // PIL reads Adobe CMYK JPEGs (Photoshop's) as inverted ink values.
  const bool inverted = cinfo.saw_Adobe_marker;
  while (cinfo.output_scanline < cinfo.output_height) {
    uint8_t* rgb_row = image.rgb.data() + static_cast<size_t>(cinfo.output_scanline) *
                                               static_cast<size_t>(image.width) * 3;
    JSAMPROW row = cmyk ? cmyk_row.data() : rgb_row;
    jpeg_read_scanlines(&cinfo, &row, 1);
    if (!cmyk) continue;
    for (int64_t x = 0; x < image.width; ++x) {
      int ink[4];
      for (int c = 0; c < 4; ++c) {
        ink[c] = cmyk_row[static_cast<size_t>(x * 4 + c)];
        if (inverted) ink[c] = 255 - ink[c];
      }
      for (int c = 0; c < 3; ++c) rgb_row[x * 3 + c] = cmyk_channel(ink[c], 255 - ink[3]);
    }
  }
  // The data after the last scanline (the EOI marker) is not needed: PIL does not read it either.
  jpeg_destroy_decompress(&cinfo);
  return image;
}

// --- PNG ----------------------------------------------------------------------------------

struct PngSource {
  const uint8_t* bytes;
  size_t size;
  size_t offset;
  char message[256];
};

[[noreturn]] void png_fail(png_structp png, png_const_charp message) {  // Note [Library errors]
  auto* source = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(source->message, sizeof source->message, "%s", message);
  png_longjmp(png, 1);
}

void png_ignore_warning(png_structp, png_const_charp) {}

void png_read_memory(png_structp png, png_bytep out, size_t count) {
  auto* source = static_cast<PngSource*>(png_get_io_ptr(png));
  if (count > source->size - source->offset) png_error(png, "truncated (the data ends early)");
  std::memcpy(out, source->bytes + source->offset, count);
  source->offset += count;
}

DecodedImage decode_png(const std::string& name, const uint8_t* bytes, size_t size,
                        int64_t max_pixels) {
  DecodedImage image;
  std::vector<png_bytep> rows;
  std::string limit_message;
  PngSource source{bytes, size, 0, {}};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &source, png_fail,
                                           png_ignore_warning);
  if (!png) throw Error(name + ": libpng cannot create a reader (out of memory?)");
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    throw Error(name + ": libpng cannot create a reader (out of memory?)");
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    if (!limit_message.empty()) throw DataError(limit_message);
    throw DataError(name + ": corrupt or unsupported PNG: " + source.message);
  }
  png_set_read_fn(png, &source, png_read_memory);
  png_read_info(png, info);
  const int64_t width = png_get_image_width(png, info), height = png_get_image_height(png, info);
  limit_message = pixel_count_problem(name, "a PNG", width, height, max_pixels);
  // Back to the setjmp, which frees libpng's state and throws limit_message.
  if (!limit_message.empty()) png_error(png, "over the pixel limit");
  // To 8-bit RGB (the comment of decode_image in image_decode.h).
  png_set_expand(png);  // palette -> RGB, gray < 8 bits -> 8, tRNS -> alpha
  png_set_strip_16(png);
  png_set_strip_alpha(png);
  png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(width) * 3)
    png_error(png, "does not decode to 8-bit RGB rows");
  image.width = width;
  image.height = height;
  image.rgb.resize(static_cast<size_t>(width * height * 3));
  rows.resize(static_cast<size_t>(height));
  for (int64_t y = 0; y < height; ++y)
    rows[static_cast<size_t>(y)] = image.rgb.data() + y * width * 3;
  png_read_image(png, rows.data());
  // The chunks after the image data (png_read_end) are not read: PIL ignores them too.
  png_destroy_read_struct(&png, &info, nullptr);
  return image;
}

const uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

}  // namespace

bool image_decoding_available() { return true; }

std::string image_decoder_libraries() {
#define HPC_TRAIN_TEXT(x) #x
#define HPC_TRAIN_EXPAND_TEXT(x) HPC_TRAIN_TEXT(x)
#ifdef LIBJPEG_TURBO_VERSION
  const std::string jpeg = "libjpeg-turbo " HPC_TRAIN_EXPAND_TEXT(LIBJPEG_TURBO_VERSION);
#else
  const std::string jpeg = "libjpeg " + std::to_string(JPEG_LIB_VERSION);
#endif
#undef HPC_TRAIN_EXPAND_TEXT
#undef HPC_TRAIN_TEXT
  return jpeg + ", libpng " + png_get_libpng_ver(nullptr);
}

DecodedImage decode_image(const std::string& name, const uint8_t* bytes, size_t size,
                          int64_t max_pixels) {
  if (size >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF)
    return decode_jpeg(name, bytes, size, max_pixels);
  if (size >= sizeof kPngSignature && std::memcmp(bytes, kPngSignature, sizeof kPngSignature) == 0)
    return decode_png(name, bytes, size, max_pixels);
  if (size == 0) throw DataError(name + ": empty file, not a JPEG or PNG image");
  char start[32] = {};
  for (size_t i = 0; i < std::min<size_t>(size, 4); ++i)
    std::snprintf(start + 3 * i, 4, "%02X ", bytes[i]);
  throw DataError(name + ": not a JPEG or PNG image (it starts with bytes " +
                  std::string(start, std::strlen(start) - 1) + ")");
}

}  // namespace hpc_train
