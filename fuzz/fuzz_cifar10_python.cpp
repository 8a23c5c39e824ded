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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::convert_input_files(
      SourceFormat::kCifar10Python, "cifar10_python", data, size, kFiles,
      [](const DatasetContents& contents) {
        fuzz::check_cifar10_contents(contents);
        // batches.meta names the classes: label_names must have one name per class.
        const DatasetInfo& info = contents.info;
        fuzz::fail_unless(info.num_classes >= 1 &&
                              static_cast<int64_t>(info.class_names.size()) == info.num_classes,
                          "classes without a name each");
      });
  return 0;
}
