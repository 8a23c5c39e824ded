#include "synthetic_dataset.h"

#include <mpi.h>
#include <ftw.h>
#include <unistd.h>

#include <cstdio>

#include <cstdlib>
#include <filesystem>

#include "hpc_train/data/dataset_file.h"

namespace hpc_train::test_support {

void write_synthetic_dataset(const std::string& path, const SyntheticShape& shape, uint64_t seed) {
  DatasetContents contents;
  DatasetInfo& info = contents.info;
  info.num_classes = shape.classes;
  for (int64_t c = 0; c < shape.classes; ++c) info.class_names.push_back("class" + std::to_string(c));
  info.channels = shape.channels;
  info.height = shape.height;
  info.width = shape.width;
  info.source = "synthetic test data";
  const int64_t sample_bytes = shape.channels * shape.height * shape.width;
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&state] {  // xorshift64: enough for test noise
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  auto fill = [&](int64_t count, std::vector<uint8_t>& images, std::vector<int64_t>& labels) {
    images.resize(count * sample_bytes);
    labels.resize(count);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t label = static_cast<int64_t>(next() % shape.classes);
      labels[i] = label;
      for (int64_t b = 0; b < sample_bytes; ++b) {
        const int64_t row = (b / shape.width) % shape.height;
        const bool lit = row % shape.classes == label % shape.height ||
                         (row * 7 + b % shape.width) % shape.classes == label;
        images[i * sample_bytes + b] = static_cast<uint8_t>((lit ? 160 : 20) + next() % 64);
      }
    }
  };
  fill(shape.train, contents.train_images, contents.train_labels);
  fill(shape.test, contents.test_images, contents.test_labels);
  write_dataset_file(path, std::move(contents));
}

std::string make_test_directory(const std::string& name) {
  int rank = 0;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(tmp ? tmp : "/tmp") /
                                    ("hpc_train_test_" + name + "_" + std::to_string(getpid()) +
                                     "_r" + std::to_string(rank));
  remove_directory(dir.string());
  std::filesystem::create_directories(dir);
  return dir.string();
}

void remove_directory(const std::string& path) {
  nftw(path.c_str(), [](const char* entry, const struct stat*, int, struct FTW*) {
    return remove(entry);
  }, 16, FTW_DEPTH | FTW_PHYS);
}

}  // namespace hpc_train::test_support
