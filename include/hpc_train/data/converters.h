// Converters from the formats datasets are published in to the HDF5 layout of dataset_file.h,
// and a summary printer. Every input is validated (IDX magic and sizes, CIFAR record sizes,
// labels inside the number of classes); a truncated or foreign file is a DataError naming the
// file and what is wrong.
#pragma once

#include <cstdint>
#include <string>

#include "hpc_train/data/dataset_file.h"

namespace hpc_train {

enum class SourceFormat { kFashionMnist, kMnist, kCifar10 };

// "fashion-mnist" | "mnist" | "cifar10"; throws ConfigError listing the known names otherwise.
SourceFormat parse_source_format(const std::string& name);

struct ConvertOptions {
  int64_t max_train = -1;  // keep only the first N train samples; -1 = all
  int64_t max_test = -1;   // keep only the first N test samples; -1 = all
};

// Reads the source files from `source_dir` (IDX: train-images-idx3-ubyte, train-labels-idx1-ubyte,
// t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each raw or .gz; CIFAR-10 binary:
// data_batch_1..5.bin and test_batch.bin) and returns the dataset.
DatasetContents read_source_dataset(SourceFormat format, const std::string& source_dir,
                                    const ConvertOptions& options);

// read_source_dataset + write_dataset_file.
void convert_dataset(SourceFormat format, const std::string& source_dir,
                     const std::string& output_path, const ConvertOptions& options);

// A human-readable summary of a dataset file (sizes, shape, classes, mean/std, source, chunking).
std::string describe_dataset_file(const std::string& path);

}  // namespace hpc_train
