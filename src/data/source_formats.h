// The converters of the formats that have a unit of their own (npz_file.cpp,
// cifar10_python.cpp), and the helpers every converter shares (converters.cpp). Private to data/:
// callers go through read_source_dataset (hpc_train/data/converters.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hpc_train/data/converters.h"

namespace hpc_train {

// x_train, y_train, x_test, y_test of a numpy .npz file (numpy.savez, savez_compressed).
DatasetContents read_npz_dataset(const std::string& path, const ConvertOptions& options);

// data_batch_1..5, test_batch and batches.meta of cifar-10-batches-py (`dir` or its parent).
DatasetContents read_cifar10_python_dataset(const std::string& dir, const ConvertOptions& options);

// Throws DataError naming `path` and the index for a label outside [0, num_classes).
void check_labels(const std::string& path, const std::vector<int64_t>& labels,
                  int64_t num_classes);

// Keeps the first `max` samples (all when max < 0).
void keep_first(std::vector<uint8_t>& images, std::vector<int64_t>& labels, int64_t sample_bytes,
                int64_t max);

// The whole file (inflated if it is gzip); DataError naming it when it cannot be read.
std::vector<uint8_t> read_whole_file(const std::string& path);

// Throws unless `path` is a regular file; false when it does not exist.
bool regular_file_exists(const std::string& path);

}  // namespace hpc_train
