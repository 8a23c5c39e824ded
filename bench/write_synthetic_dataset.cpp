// write_synthetic_dataset: a dataset file of random pixels in hpc_train's layout (data/README.md),
// written a chunk at a time, so that its size is bounded by the disk, not by memory: for
// benchmarks of the data path on datasets larger than the node's memory.
//   write_synthetic_dataset OUT.h5 TRAIN_SAMPLES [C H W]      (default 3 224 224, ImageNet's)
// The test split holds 64 samples; labels cycle through 10 classes; mean and std are those of
// uniform random bytes (0.5, 0.2887). Chunks of 16 samples, the format's (Note [Chunk shape]).
#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "io/hdf5_attributes.h"
#include "io/hdf5_util.h"
#include "hpc_train/error.h"

namespace {

using namespace hpc_train;

constexpr hsize_t kChunkSamples = 16;
constexpr int64_t kClasses = 10;
constexpr hsize_t kTestSamples = 64;

// xorshift64: fast enough to fill the disk's bandwidth from one core; any bytes would do.
struct RandomBytes {
  uint64_t state = 0x9e3779b97f4a7c15ull;
  void fill(std::vector<uint8_t>& out) {
    for (size_t i = 0; i + 8 <= out.size(); i += 8) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      for (int b = 0; b < 8; ++b) out[i + b] = static_cast<uint8_t>(state >> (8 * b));
    }
  }
};

void write_split(hid_t file, const char* name, hsize_t samples, const hsize_t shape[3],
                 RandomBytes& random) {
  h5::Group group(H5_CHECK(H5Gcreate2(file, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  const hsize_t dims[4] = {samples, shape[0], shape[1], shape[2]};
  const hsize_t chunk[4] = {std::min(samples, kChunkSamples), shape[0], shape[1], shape[2]};
  h5::Dataspace space(H5_CHECK(H5Screate_simple(4, dims, nullptr)));
  h5::PropertyList layout(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  H5_CHECK(H5Pset_chunk(layout.get(), 4, chunk));
  H5_CHECK(H5Pset_fill_time(layout.get(), H5D_FILL_TIME_NEVER));
  h5::Dataset images(H5_CHECK(H5Dcreate2(group.get(), "images", H5T_STD_U8LE, space.get(),
                                         H5P_DEFAULT, layout.get(), H5P_DEFAULT)));
  const size_t sample_bytes = shape[0] * shape[1] * shape[2];
  std::vector<uint8_t> block(kChunkSamples * sample_bytes);
  for (hsize_t first = 0; first < samples; first += kChunkSamples) {
    const hsize_t start[4] = {first, 0, 0, 0};
    const hsize_t count[4] = {std::min(kChunkSamples, samples - first), shape[0], shape[1],
                              shape[2]};
    random.fill(block);
    h5::Dataspace memory(H5_CHECK(H5Screate_simple(4, count, nullptr)));
    H5_CHECK(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr));
    H5_CHECK(H5Dwrite(images.get(), H5T_NATIVE_UINT8, memory.get(), space.get(), H5P_DEFAULT,
                      block.data()));
  }
  std::vector<int64_t> labels(samples);
  for (hsize_t i = 0; i < samples; ++i) labels[i] = static_cast<int64_t>(i) % kClasses;
  h5::Dataspace label_space(H5_CHECK(H5Screate_simple(1, &samples, nullptr)));
  h5::Dataset label_set(H5_CHECK(H5Dcreate2(group.get(), "labels", H5T_STD_I64LE,
                                            label_space.get(), H5P_DEFAULT, H5P_DEFAULT,
                                            H5P_DEFAULT)));
  H5_CHECK(H5Dwrite(label_set.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                    labels.data()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 6) {
    std::fprintf(stderr, "usage: %s OUT.h5 TRAIN_SAMPLES [C H W]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  const hsize_t train = std::stoull(argv[2]);
  const hsize_t shape[3] = {argc == 6 ? std::stoull(argv[3]) : 3,
                            argc == 6 ? std::stoull(argv[4]) : 224,
                            argc == 6 ? std::stoull(argv[5]) : 224};
  try {
    h5::Lock lock;
    h5::File file(H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)));
    h5::Group root(H5_CHECK(H5Gopen2(file.get(), "/", H5P_DEFAULT)));
    std::vector<std::string> names;
    for (int64_t k = 0; k < kClasses; ++k) names.push_back("class" + std::to_string(k));
    h5::write_integer_attribute(root.get(), "format_version", 1);
    h5::write_integer_attribute(root.get(), "num_classes", kClasses);
    h5::write_variable_strings_attribute(root.get(), "class_names", names, false);
    h5::write_integer_attribute(root.get(), "channels", static_cast<int64_t>(shape[0]));
    h5::write_integer_attribute(root.get(), "height", static_cast<int64_t>(shape[1]));
    h5::write_integer_attribute(root.get(), "width", static_cast<int64_t>(shape[2]));
    h5::write_floats_attribute(root.get(), "mean", std::vector<float>(shape[0], 0.5f));
    h5::write_floats_attribute(root.get(), "std", std::vector<float>(shape[0], 0.2887f));
    h5::write_variable_strings_attribute(
        root.get(), "source", {"synthetic random pixels (bench/write_synthetic_dataset.cpp)"},
        true);
    RandomBytes random;
    write_split(file.get(), "train", train, shape, random);
    write_split(file.get(), "test", kTestSamples, shape, random);
  } catch (const Error& e) {
    std::fprintf(stderr, "write_synthetic_dataset: %s: %s\n", path.c_str(), e.what());
    return 3;
  }
  return 0;
}
