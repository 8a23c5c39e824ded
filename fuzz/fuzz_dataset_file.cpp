// The dataset file's open and validation (DatasetFile::open, serial access), then a read of the
// first and last sample of each split, which is what the validation is there for: a file that
// opens can be read. The input is a recipe of the file, Note [HDF5 recipes].
#include "fuzz_support.h"
#include "hdf5_recipe.h"
#include "hpc_train/data/dataset_file.h"

using namespace hpc_train;

namespace {

// Samples up to this size are read back. A file may declare samples of any size without storing
// them (HDF5 reads unwritten chunks as zeros); whether a batch of them fits in memory is for the
// trainer to check, not the file.
constexpr uint64_t kMaxSampleBytesRead = 16 << 20;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::prepare_hdf5();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch_path("dataset.h5");
  fuzz::build_hdf5_file(data, size, path);
  fuzz::parse_or_reject([&] {
    const DatasetFile file = DatasetFile::open(path);
    const DatasetInfo& info = file.info();
    fuzz::fail_unless(info.channels > 0 && info.height > 0 && info.width > 0 &&
                          info.num_classes >= 2 && info.train_size > 0 && info.test_size >= 0,
                      "a shape, class count or split size out of range");
    const auto plane = fuzz::checked_product(static_cast<uint64_t>(info.height),
                                             static_cast<uint64_t>(info.width));
    const auto sample_bytes =
        plane ? fuzz::checked_product(*plane, static_cast<uint64_t>(info.channels)) : std::nullopt;
    fuzz::fail_unless(sample_bytes && *sample_bytes <= uint64_t{INT64_MAX},
                      "C x H x W bytes a sample overflows int64 (sample_bytes())");
    if (*sample_bytes > kMaxSampleBytesRead) return;
    for (Split split : {Split::kTrain, Split::kTest}) {
      const int64_t samples = info.size(split);
      if (samples == 0) continue;
      const std::vector<int64_t> indices = {0, samples - 1};
      std::vector<uint8_t> images(indices.size() * *sample_bytes);
      std::vector<int64_t> labels(indices.size());
      file.read_samples(split, indices, images.data(), labels.data());
      for (int64_t label : labels)
        fuzz::fail_unless(label >= 0 && label < info.num_classes, "a label outside the classes");
    }
  });
  fuzz::require_no_open_hdf5_objects();
  return 0;
}
