// The npz converter: the zip archive (read_zip_directory, read_zip_member: local headers,
// inflating, CRC), the .npy headers (parse_npy) and the arrays' checks (read_npz_dataset).
#include "fuzz_support.h"
#include "hpc_train/data/converters.h"

using namespace hpc_train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch_path("arrays.npz");
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  ConvertOptions options;
  // Both layouts, chosen by the input, so that one run covers the transpose and the copy.
  options.layout = size % 2 ? ImageLayout::kNchw : ImageLayout::kNhwc;
  fuzz::parse_or_reject([&] {
    const DatasetContents contents = read_source_dataset(SourceFormat::kNpz, path, options);
    const DatasetInfo& info = contents.info;
    fuzz::fail_unless(info.channels >= 1 && info.height >= 1 && info.width >= 1,
                      "an accepted image shape with an empty side");
    fuzz::fail_unless(info.num_classes >= 1 &&
                          static_cast<int64_t>(info.class_names.size()) == info.num_classes,
                      "classes without a name each");
    for (const auto* split : {&contents.train_images, &contents.test_images}) {
      const auto& labels = split == &contents.train_images ? contents.train_labels
                                                           : contents.test_labels;
      fuzz::fail_unless(split->size() == labels.size() * static_cast<size_t>(info.sample_bytes()),
                        "the image bytes are not labels x C x H x W");
      for (int64_t label : labels)
        fuzz::fail_unless(label >= 0 && label < info.num_classes, "a label outside the classes");
    }
  });
  return 0;
}
