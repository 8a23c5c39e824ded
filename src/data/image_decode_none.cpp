// image_decode.h for a build without libjpeg or libpng (CMake found one of them missing): the
// rest of hpc_train builds and works; `convert imagefolder` refuses with this message.
#include "hpc_train/data/image_decode.h"

#include "hpc_train/error.h"

namespace hpc_train {

namespace {
const char* const kMissing =
    "this build of hpc_train lacks libjpeg/libpng (CMake did not find them; install "
    "libjpeg62-turbo-dev or libjpeg-turbo8-dev, and libpng-dev, and rebuild)";
}  // namespace

bool image_decoding_available() { return false; }

std::string image_decoder_libraries() { return kMissing; }

DecodedImage decode_image(const std::string& name, const uint8_t*, size_t, int64_t) {
  throw ConfigError("cannot decode " + name + ": " + kMissing);
}

}  // namespace hpc_train
