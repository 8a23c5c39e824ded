// `hpc_train_data convert imagefolder ROOT OUT.h5 --size HxW`: a torchvision ImageFolder tree of
// JPEG and PNG files to the dataset file of dataset_file.h, decoded over the ranks of an MPI job.
//
//   ROOT/train/<class>/**/*.{jpg,jpeg,png}  and  ROOT/val/<class>/...   (train and test splits)
//   ROOT/<class>/**/*.{jpg,jpeg,png}  with --test-fraction F  (a seeded split, per class)
//
// Classes are the folder names, sorted bytewise (torchvision's find_classes); a class's files are
// found recursively and sorted by path; other files, and folders starting with '.', are ignored.
// Every image becomes 3 x H x W RGB (image_decode.h): scaled, keeping its aspect ratio, to the
// smallest size that covers H x W (for a square target: the shorter side to the target), with
// PIL's bilinear filter (Image.resize(..., BILINEAR): a triangle filter widened by the scale
// factor when shrinking, so it averages like an area filter), then the centre H x W cut out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "hpc_train/data/image_decode.h"

namespace hpc_train {

class Runtime;

// Each side of --size: a sample is 3 x H x W bytes.
inline constexpr int64_t kMaxImageFolderSide = 4096;

struct ImageFolderOptions {
  int64_t height = 0;
  int64_t width = 0;
  std::optional<double> test_fraction;  // one tree: the share of each class that is test data
  uint64_t seed = 0;                    // of the --test-fraction split
  bool skip_bad_images = false;         // report and skip a file that does not decode
  bool rank_zero_writes = false;        // gather to rank 0, which writes, also with parallel HDF5
};

// "HxW" (or "S" for SxS) into options.height/width; ConfigError unless both are in
// [1, kMaxImageFolderSide].
void parse_image_folder_size(const std::string& text, ImageFolderOptions& options);

struct ImageFolderSummary {
  int64_t train = 0;
  int64_t test = 0;
  int64_t classes = 0;
  int64_t skipped = 0;  // files that did not decode (--skip-bad-images)
};

// Scales `image` and cuts out its centre as described above, into `chw` (3 x height x width).
void resize_and_crop(const DecodedImage& image, int64_t height, int64_t width, uint8_t* chw);

// Collective over the runtime's world: rank 0 lists the tree and sends the plan to the others,
// which open the files from rank 0's working directory (Note [One listing of the tree]); every
// rank decodes its contiguous 1/N of the images. Note [Image folder writes]: with a parallel
// HDF5 every rank then writes its own images into the file (write_dataset_file_collective); with
// a serial HDF5, or rank_zero_writes, rank 0 gathers them and writes (write_dataset_file: the
// whole dataset in rank 0's memory). Either way the file is the same, and one that would not
// fit in memory is refused before decoding. Errors go through run_agreed_phase (runtime.h):
// every rank throws JobEnded with the worst exit code after rank 0 printed the messages.
// DataError for a tree without classes, an empty class, train/ and val/ with different classes,
// a file that does not decode (without --skip-bad-images); ConfigError for --test-fraction with
// train/ and val/, a missing --test-fraction with one tree, or a build without image decoding.
// Nothing is written unless everything decoded (or was skipped). The summary is rank 0's (the
// others' may be partial).
ImageFolderSummary convert_image_folder(const Runtime& runtime, const std::string& root,
                                        const std::string& output_path,
                                        const ImageFolderOptions& options);

}  // namespace hpc_train
