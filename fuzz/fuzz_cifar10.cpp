// The CIFAR-10 binary reader of the converter: data_batch_1..5.bin and test_batch.bin in one
// input, Note [Several files in one input].
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "hpc_train/data/converters.h"

using namespace hpc_train;

namespace {

const std::vector<std::string> kFiles = {
    "data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
    "data_batch_5.bin", "test_batch.bin"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::convert_input_files(SourceFormat::kCifar10, "cifar10", data, size, kFiles,
                            fuzz::check_cifar10_contents);
  return 0;
}
