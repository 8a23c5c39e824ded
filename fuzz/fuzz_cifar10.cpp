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

// What write_dataset_file relies on: whole 3x32x32 samples, one label each, inside the classes.
void check_split(const DatasetInfo& info, const std::vector<uint8_t>& images,
                 const std::vector<int64_t>& labels) {
  fuzz::fail_unless(images.size() == labels.size() * 3 * 32 * 32,
                    "the image bytes are not labels x 3 x 32 x 32");
  for (int64_t label : labels)
    fuzz::fail_unless(label >= 0 && label < info.num_classes, "a label outside the classes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string directory = fuzz::write_input_files("cifar10", data, size, kFiles);

  fuzz::parse_or_reject([&] {
    const DatasetContents contents =
        read_source_dataset(SourceFormat::kCifar10, directory, ConvertOptions{});
    fuzz::fail_unless(contents.info.channels == 3 && contents.info.height == 32 &&
                          contents.info.width == 32,
                      "the image shape is not 3x32x32");
    check_split(contents.info, contents.train_images, contents.train_labels);
    check_split(contents.info, contents.test_images, contents.test_labels);
  });
  return 0;
}
