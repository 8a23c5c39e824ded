// Small datasets written by the tests themselves, so that they need no download.
#pragma once

#include <cstdint>
#include <string>

namespace hpc_train::test_support {

struct SyntheticShape {
  int64_t train = 240;
  int64_t test = 60;
  int64_t channels = 1;
  int64_t height = 8;
  int64_t width = 8;
  int64_t classes = 10;
};

// A learnable dataset: each class brightens its own band of rows, plus deterministic noise.
// Written in the hpc_train layout (write_dataset_file).
void write_synthetic_dataset(const std::string& path, const SyntheticShape& shape, uint64_t seed);

// A fresh empty directory for this test (and this rank), under $TMPDIR or /tmp.
std::string make_test_directory(const std::string& name);

}  // namespace hpc_train::test_support
