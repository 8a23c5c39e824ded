// Converters from the formats datasets are published in to the HDF5 layout of dataset_file.h,
// and a summary printer. Every input is validated (IDX magic and sizes, CIFAR record sizes,
// labels inside the number of classes); a truncated or foreign file is a DataError naming the
// file and what is wrong.
#pragma once

#include <cstdint>
#include <string>

#include "hpc_train/data/dataset_file.h"

namespace hpc_train {

// kImageFolder is converted by convert_image_folder (image_folder.h), over MPI ranks, not by
// read_source_dataset.
enum class SourceFormat { kFashionMnist, kMnist, kCifar10, kCifar10Python, kNpz, kImageFolder };

// "fashion-mnist" | "mnist" | "cifar10" | "cifar10-python" | "npz" | "imagefolder"; throws ConfigError listing
// the known names otherwise.
SourceFormat parse_source_format(const std::string& name);

// How a .npz file's 4-D image arrays order their axes.
enum class ImageLayout { kNhwc, kNchw };

// "nhwc" | "nchw"; throws ConfigError otherwise.
ImageLayout parse_image_layout(const std::string& name);

struct ConvertOptions {
  int64_t max_train = -1;  // keep only the first N train samples; -1 = all
  int64_t max_test = -1;   // keep only the first N test samples; -1 = all
  ImageLayout layout = ImageLayout::kNhwc;  // npz: the axes of 4-D x arrays
  int64_t num_classes = -1;  // npz: the number of classes; -1 = the largest label + 1
};

// The most classes a converter derives from the labels (npz): beyond that a label is more likely
// a mistake than a class, and every class gets a name in the file.
inline constexpr int64_t kMaxDerivedClasses = 100'000;

// Reads the source files from `source` (a folder; for npz, the .npz file) and returns the
// dataset. IDX: train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
// t10k-labels-idx1-ubyte, each raw or .gz; CIFAR-10 binary: data_batch_1..5.bin and
// test_batch.bin; CIFAR-10 python: data_batch_1..5, test_batch and batches.meta (pickles);
// npz: x_train, y_train, x_test, y_test.
DatasetContents read_source_dataset(SourceFormat format, const std::string& source,
                                    const ConvertOptions& options);

// read_source_dataset + write_dataset_file.
void convert_dataset(SourceFormat format, const std::string& source_dir,
                     const std::string& output_path, const ConvertOptions& options);

// A human-readable summary of a dataset file (sizes, shape, classes, mean/std, source, chunking).
std::string describe_dataset_file(const std::string& path);

}  // namespace hpc_train
