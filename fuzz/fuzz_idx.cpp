// The IDX reader of the MNIST / Fashion-MNIST converter: four files (train and t10k images and
// labels, raw or gzip) in one input, Note [Several files in one input].
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "hpc_train/data/converters.h"

using namespace hpc_train;

namespace {

const std::vector<std::string> kFiles = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte"};

// What write_dataset_file relies on: whole samples, one label each, labels inside the classes.
void check_split(const DatasetInfo& info, const std::vector<uint8_t>& images,
                 const std::vector<int64_t>& labels) {
  const auto plane = fuzz::checked_product(static_cast<uint64_t>(info.height),
                                           static_cast<uint64_t>(info.width));
  const auto expected = plane ? fuzz::checked_product(*plane, labels.size()) : std::nullopt;
  fuzz::fail_unless(info.channels == 1 && info.height > 0 && info.width > 0,
                    "the image shape is not 1 x positive x positive");
  fuzz::fail_unless(expected && *expected == images.size(),
                    "the image bytes are not labels x height x width");
  for (int64_t label : labels)
    fuzz::fail_unless(label >= 0 && label < info.num_classes, "a label outside the classes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::convert_input_files(SourceFormat::kMnist, "idx", data, size, kFiles,
                            [](const DatasetContents& contents) {
                              check_split(contents.info, contents.train_images,
                                          contents.train_labels);
                              check_split(contents.info, contents.test_images,
                                          contents.test_labels);
                            });
  return 0;
}
