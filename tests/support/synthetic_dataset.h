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

// Removes a directory tree. Not std::filesystem::remove_all: test programs that link the
// LibTorch of PyTorch's wheel bind that symbol to the wheel's own copy, which crashes.
void remove_directory(const std::string& path);

}  // namespace hpc_train::test_support
