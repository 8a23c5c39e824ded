// The CIFAR-10 python converter and its restricted pickle reader (pickle_reader.h):
// data_batch_1..5, test_batch and batches.meta in one input, Note [Several files in one input].
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "hpc_train/data/converters.h"

using namespace hpc_train;

namespace {

const std::vector<std::string> kFiles = {"data_batch_1", "data_batch_2", "data_batch_3",
                                         "data_batch_4", "data_batch_5", "test_batch",
                                         "batches.meta"};

void check_split(const DatasetInfo& info, const std::vector<uint8_t>& images,
                 const std::vector<int64_t>& labels) {
  fuzz::fail_unless(images.size() == labels.size() * 3 * 32 * 32,
                    "the image bytes are not labels x 3 x 32 x 32");
  for (int64_t label : labels)
    fuzz::fail_unless(label >= 0 && label < info.num_classes, "a label outside the classes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string directory = fuzz::write_input_files("cifar10_python", data, size, kFiles);
  fuzz::parse_or_reject([&] {
    const DatasetContents contents =
        read_source_dataset(SourceFormat::kCifar10Python, directory, ConvertOptions{});
    const DatasetInfo& info = contents.info;
    fuzz::fail_unless(info.channels == 3 && info.height == 32 && info.width == 32,
                      "the image shape is not 3x32x32");
    fuzz::fail_unless(info.num_classes >= 1 &&
                          static_cast<int64_t>(info.class_names.size()) == info.num_classes,
                      "classes without a name each");
    check_split(info, contents.train_images, contents.train_labels);
    check_split(info, contents.test_images, contents.test_labels);
  });
  return 0;
}
