// The image decoder of convert imagefolder (image_decode.h): JPEG and PNG bytes to RGB pixels
// through libjpeg-turbo and libpng with the error handlers of image_decode_libs.cpp (Note
// [Library errors]), then the bilinear resize and centre crop (image_folder.h) of whatever
// decoded, to a size chosen by the input. The libraries themselves are the system's builds, not
// instrumented: what is fuzzed is how the decoder drives them and what it does with their output.
#include "fuzz_support.h"
#include "hpc_train/data/image_decode.h"
#include "hpc_train/data/image_folder.h"

using namespace hpc_train;

namespace {
// Note [Decompression bombs] with a smaller limit: a header may ask for this many pixels, which
// the decoder allocates (768 KiB of RGB), far below -malloc_limit_mb; decoding and resizing
// that many pixels is what an input costs at most (a few ms).
constexpr int64_t kFuzzMaxPixels = int64_t{1} << 18;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::parse_or_reject([&] {
    const DecodedImage image = decode_image("input", data, size, kFuzzMaxPixels);
    fuzz::fail_unless(image.height >= 1 && image.width >= 1, "a decoded image with an empty side");
    fuzz::fail_unless(image.width <= kFuzzMaxPixels / image.height,
                      "a decoded image over the pixel limit");
    fuzz::fail_unless(image.rgb.size() == static_cast<size_t>(image.width * image.height * 3),
                      "RGB bytes are not width x height x 3");
    // The last input bytes choose the output size, 1..32 a side: shrinking and enlarging, either
    // aspect ratio.
    const int64_t height = 1 + (size > 0 ? data[size - 1] % 32 : 0);
    const int64_t width = 1 + (size > 1 ? data[size - 2] % 32 : 0);
    std::vector<uint8_t> chw(static_cast<size_t>(3 * height * width));
    resize_and_crop(image, height, width, chw.data());
  });
  return 0;
}
