#include "hpc_train/data/dataset_file.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <optional>
#include <system_error>

#include "io/hdf5_attributes.h"
#include "io/hdf5_util.h"
#include "hpc_train/io/atomic_file.h"
#include "hpc_train/error.h"
#include "hpc_train/runtime/runtime.h"

namespace hpc_train {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kFormatVersion = 1;

// Note [Chunk shape]: training reads single samples in random order, so a read should touch as
// few bytes beyond the sample as possible, while the chunk index (a B-tree with one entry per
// chunk) should stay small and shallow. 16 samples per chunk gives 12 KiB chunks for 28x28 and
// 48 KiB for 3x32x32, and 3,750 chunks for 60,000 samples. Uncompressed, because a compressed
// chunk must be read and inflated whole for every sample in it.
constexpr hsize_t kChunkSamples = 16;

#if defined(HPC_TRAIN_HDF5_PARALLEL) && defined(H5_HAVE_PARALLEL)
constexpr bool kParallelHdf5 = true;
#else
constexpr bool kParallelHdf5 = false;
#endif

std::string join_dims(const std::vector<hsize_t>& dims) {
  std::string text;
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? "x" : "") + std::to_string(dims[i]);
  return dims.empty() ? "scalar" : text;
}

// A float attribute's value for messages: "0", "nan", "1e-40".
std::string float_text(float value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", static_cast<double>(value));
  return text;
}

// C x H x W, the bytes of one sample. Each dimension is a positive int64, but their product may
// not fit in one: then every byte count derived from it (batches, the resident split) would wrap.
int64_t checked_sample_bytes(const std::string& path, int64_t channels, int64_t height,
                             int64_t width) {
  int64_t plane = 0, bytes = 0;
  if (__builtin_mul_overflow(height, width, &plane) ||
      __builtin_mul_overflow(channels, plane, &bytes))
    throw DataError(path + ": image shape " + std::to_string(channels) + "x" +
                    std::to_string(height) + "x" + std::to_string(width) +
                    " (attributes channels, height, width): C x H x W bytes a sample overflows "
                    "a 64-bit count");
  return bytes;
}

void require_regular_file(const std::string& path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (status.type() == fs::file_type::not_found) throw DataError(path + ": no such file");
  if (error) throw DataError(path + ": cannot access: " + error.message());
  if (status.type() == fs::file_type::directory)
    throw DataError(path + ": is a directory, not a dataset file");
  if (status.type() != fs::file_type::regular) throw DataError(path + ": not a regular file");
}

// --- One split's datasets ---------------------------------------------------------------

struct SplitDatasets {
  h5::Dataset images;
  std::vector<int64_t> labels;  // Note [Labels read at open]
  int64_t size = 0;
};

std::vector<hsize_t> dataset_dims(hid_t dataset) {
  h5::Dataspace space(H5_CHECK(H5Dget_space(dataset)));
  const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space.get()));
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
  return dims;
}

h5::Dataset open_dataset(const std::string& path, hid_t file, const std::string& name,
                         hid_t access_list = H5P_DEFAULT) {
  // H5Lexists checks one link at a time: the group first, then the dataset in it.
  const std::string group = name.substr(0, name.rfind('/'));
  for (const std::string& link : {group, name})
    if (H5_CHECK(H5Lexists(file, link.c_str(), H5P_DEFAULT)) <= 0)
      throw DataError(path + ": missing " + (link == name ? "dataset " : "group ") + link);
  H5O_info_t object_info;
  H5_CHECK(H5Oget_info_by_name(file, name.c_str(), &object_info, H5P_DEFAULT));
  if (object_info.type != H5O_TYPE_DATASET) throw DataError(path + ": " + name + " is not a dataset");
  return h5::Dataset(H5_CHECK(H5Dopen2(file, name.c_str(), access_list)));
}

SplitDatasets open_split(const std::string& path, hid_t file, Split split,
                         const DatasetInfo& info) {
  const std::string group = std::string("/") + split_name(split);
  SplitDatasets d;
  // No chunk cache for the images: a random sample's chunk is rarely needed again soon, and
  // without a cache HDF5 reads just the sample's bytes instead of the whole chunk (measured:
  // 60,000 random Fashion-MNIST samples in about 0.4 s without, 0.7 s with the default 1 MiB
  // cache). A compressed chunk is inflated whole for every read either way.
  h5::PropertyList image_access(H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS)));
  H5_CHECK(H5Pset_chunk_cache(image_access.get(), H5D_CHUNK_CACHE_NSLOTS_DEFAULT, 0,
                              H5D_CHUNK_CACHE_W0_DEFAULT));
  d.images = open_dataset(path, file, group + "/images", image_access.get());
  const h5::Dataset labels = open_dataset(path, file, group + "/labels");

  const std::string images_name = path + ": " + group + "/images";
  h5::Type image_type(H5_CHECK(H5Dget_type(d.images.get())));
  if (H5Tget_class(image_type.get()) != H5T_INTEGER || H5Tget_size(image_type.get()) != 1 ||
      H5Tget_sign(image_type.get()) != H5T_SGN_NONE)
    throw DataError(images_name + " has dtype " + h5::describe_type(image_type.get()) +
                    ", expected 8-bit unsigned integer");
  const std::vector<hsize_t> image_dims = dataset_dims(d.images.get());
  if (image_dims.size() != 4)
    throw DataError(images_name + " has shape " + join_dims(image_dims) +
                    ", expected 4-D [N, C, H, W]");
  if (static_cast<int64_t>(image_dims[1]) != info.channels ||
      static_cast<int64_t>(image_dims[2]) != info.height ||
      static_cast<int64_t>(image_dims[3]) != info.width)
    throw DataError(images_name + " has shape " + join_dims(image_dims) +
                    " but the attributes channels, height, width say " +
                    std::to_string(info.channels) + "x" + std::to_string(info.height) + "x" +
                    std::to_string(info.width));
  // HDF5 accepts a dataspace of any extent, even one whose byte count overflows 64 bits, and
  // a chunked dataset that was never written costs no space in the file. The byte counts of
  // the split (N x C x H x W images, 8 bytes of label a sample: resident_split_bytes) must fit.
  const int64_t sample_bytes = info.sample_bytes();  // checked_sample_bytes in read_info
  if (image_dims[0] > static_cast<hsize_t>(std::numeric_limits<int64_t>::max() /
                                           (sample_bytes + static_cast<int64_t>(sizeof(int64_t)))))
    throw DataError(images_name + " has shape " + join_dims(image_dims) +
                    ": N x C x H x W bytes (and 8 bytes of label a sample) overflows a 64-bit "
                    "count");
  d.size = static_cast<int64_t>(image_dims[0]);

  const std::string labels_name = path + ": " + group + "/labels";
  h5::Type label_type(H5_CHECK(H5Dget_type(labels.get())));
  if (H5Tget_class(label_type.get()) != H5T_INTEGER)
    throw DataError(labels_name + " has dtype " + h5::describe_type(label_type.get()) +
                    ", expected integers");
  const std::vector<hsize_t> label_dims = dataset_dims(labels.get());
  if (label_dims.size() != 1)
    throw DataError(labels_name + " has shape " + join_dims(label_dims) + ", expected 1-D [N]");
  if (static_cast<int64_t>(label_dims[0]) != d.size)
    throw DataError(labels_name + " has " + std::to_string(label_dims[0]) + " labels but " +
                    group + "/images has " + std::to_string(d.size) + " samples");

  // Note [Labels read at open]: every label of the split is read here, once, and checked against
  // num_classes, so that a bad label stops the run before its first step, wherever it sits in
  // the split (a check per batch only sees the labels that the steps so far happened to read).
  // Labels are 8 bytes a sample, so they stay in memory and read_samples takes them from there:
  // no label is read from the file twice, and none is used unchecked. A file may declare a huge
  // split that holds no data (see above); its labels must fit in this node's memory before they
  // are allocated.
  const int64_t label_bytes = d.size * static_cast<int64_t>(sizeof(int64_t));
  const int64_t memory_bytes = physical_memory_bytes();
  if (label_bytes > memory_bytes)
    throw DataError(labels_name + " has " + std::to_string(d.size) + " labels: reading them (" +
                    memory_text(static_cast<double>(label_bytes)) +
                    ") needs more than this node's memory (" +
                    memory_text(static_cast<double>(memory_bytes)) + ")");
  // A labels dataset that the file does not hold (never written: HDF5 reads it as zeros) would
  // make a file of a few kB allocate up to the node's memory: 2^27 declared samples took 1 GiB
  // (fuzz/fuzz_dataset_file.cpp reports it). Stored labels bound what is allocated by the file.
  H5D_space_status_t label_storage = H5D_SPACE_STATUS_ERROR;
  H5_CHECK(H5Dget_space_status(labels.get(), &label_storage));
  if (d.size > 0 && label_storage != H5D_SPACE_STATUS_ALLOCATED)
    throw DataError(labels_name + " declares " + std::to_string(d.size) +
                    " labels but the file does not hold them all (never written, or an "
                    "incomplete file)");
  d.labels.resize(static_cast<size_t>(d.size));
  if (d.size > 0)
    H5_CHECK(H5Dread(labels.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                     d.labels.data()));
  for (int64_t i = 0; i < d.size; ++i)
    if (d.labels[i] < 0 || d.labels[i] >= info.num_classes)
      throw DataError(path + ": " + group + "/labels[" + std::to_string(i) + "] = " +
                      std::to_string(d.labels[i]) + " is outside [0, " +
                      std::to_string(info.num_classes) + ")");
  return d;
}

DatasetInfo read_info(const std::string& path, hid_t root) {
  // Every attribute of a dataset file is on its root group.
  std::error_code error;
  const uintmax_t file_bytes = fs::file_size(path, error);
  const h5::AttributeReader attributes(root, "", path + ": ", error ? 0 : file_bytes);
  DatasetInfo info;
  if (attributes.has("format_version")) {
    const int64_t version = attributes.integer("format_version");
    if (version != kFormatVersion)
      throw DataError(path + ": format_version " + std::to_string(version) +
                      " is not the one this program reads (" + std::to_string(kFormatVersion) +
                      ")");
  }
  info.num_classes = attributes.integer("num_classes");
  info.class_names = attributes.strings("class_names");
  info.channels = attributes.integer("channels");
  info.height = attributes.integer("height");
  info.width = attributes.integer("width");
  info.mean = attributes.floats("mean");
  info.std = attributes.floats("std");
  if (attributes.has("source")) {
    const std::vector<std::string> source = attributes.strings("source");
    info.source = source.empty() ? "" : source.front();
  }

  if (info.num_classes < 2)
    throw DataError(path + ": num_classes = " + std::to_string(info.num_classes) +
                    ", expected at least 2");
  if (static_cast<int64_t>(info.class_names.size()) != info.num_classes)
    throw DataError(path + ": class_names has " + std::to_string(info.class_names.size()) +
                    " names but num_classes = " + std::to_string(info.num_classes));
  auto require_positive = [&](const char* name, int64_t value) {
    if (value < 1)
      throw DataError(path + ": attribute '" + name + "' = " + std::to_string(value) +
                      ", expected at least 1");
  };
  require_positive("channels", info.channels);
  require_positive("height", info.height);
  require_positive("width", info.width);
  checked_sample_bytes(path, info.channels, info.height, info.width);
  auto require_per_channel = [&](const char* name, const std::vector<float>& values) {
    if (static_cast<int64_t>(values.size()) != info.channels)
      throw DataError(path + ": attribute '" + name + "' has " + std::to_string(values.size()) +
                      " values but channels = " + std::to_string(info.channels));
  };
  require_per_channel("mean", info.mean);
  require_per_channel("std", info.std);
  // The inputs are normalised as (x - mean) / std per channel: a mean that is not finite, or a
  // std that is not a finite number > 0, would make every input inf or NaN (or flip its sign)
  // and training would go on without a word.
  for (int64_t c = 0; c < info.channels; ++c) {
    if (!std::isfinite(info.mean[c]))
      throw DataError(path + ": attribute 'mean'[" + std::to_string(c) + "] = " +
                      float_text(info.mean[c]) + ", expected a finite number");
    if (!(std::isfinite(info.std[c]) && info.std[c] > 0))
      throw DataError(path + ": attribute 'std'[" + std::to_string(c) + "] = " +
                      float_text(info.std[c]) +
                      ", expected a finite number > 0 (the images are divided by it)");
  }
  return info;
}

// --- Writing (lock held) -----------------------------------------------------------------

// One split's datasets, created (collectively under MPI-IO: every rank alike).
struct SplitOutput {
  h5::Dataset images;
  h5::Dataset labels;
};

SplitOutput create_split(hid_t file, Split split, const DatasetInfo& info) {
  h5::Group group(H5_CHECK(
      H5Gcreate2(file, split_name(split), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  const hsize_t n = static_cast<hsize_t>(info.size(split));

  const hsize_t image_dims[4] = {n, static_cast<hsize_t>(info.channels),
                                 static_cast<hsize_t>(info.height),
                                 static_cast<hsize_t>(info.width)};
  h5::Dataspace image_space(H5_CHECK(H5Screate_simple(4, image_dims, nullptr)));
  h5::PropertyList image_layout(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  if (n > 0) {  // a chunk may not be larger than the dataset; an empty split stays contiguous
    const hsize_t chunk[4] = {std::min(n, kChunkSamples), image_dims[1], image_dims[2],
                              image_dims[3]};
    H5_CHECK(H5Pset_chunk(image_layout.get(), 4, chunk));  // Note [Chunk shape]
  }
  // Every sample is written: filling the chunks first would write the split twice (parallel
  // HDF5 allocates them all at creation).
  H5_CHECK(H5Pset_fill_time(image_layout.get(), H5D_FILL_TIME_NEVER));
  SplitOutput output;
  output.images = h5::Dataset(H5_CHECK(H5Dcreate2(group.get(), "images", H5T_STD_U8LE,
                                                  image_space.get(), H5P_DEFAULT,
                                                  image_layout.get(), H5P_DEFAULT)));
  // Labels are 8 bytes a sample: contiguous, so a scattered read needs no chunk index at all.
  h5::Dataspace label_space(H5_CHECK(H5Screate_simple(1, &n, nullptr)));
  output.labels = h5::Dataset(H5_CHECK(H5Dcreate2(group.get(), "labels", H5T_STD_I64LE,
                                                  label_space.get(), H5P_DEFAULT, H5P_DEFAULT,
                                                  H5P_DEFAULT)));
  return output;
}

// Samples [first, first + count) of one split's datasets. `collective`: an MPI-IO transfer that
// every rank joins, a rank with no samples selecting none.
void write_split_rows(const SplitOutput& output, const DatasetInfo& info, hsize_t first,
                      hsize_t count, const uint8_t* images, const int64_t* labels,
                      bool collective) {
  h5::PropertyList transfer(H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
#if defined(HPC_TRAIN_HDF5_PARALLEL) && defined(H5_HAVE_PARALLEL)
  if (collective) H5_CHECK(H5Pset_dxpl_mpio(transfer.get(), H5FD_MPIO_COLLECTIVE));
#else
  (void)collective;
#endif
  const hsize_t sample_dims[3] = {static_cast<hsize_t>(info.channels),
                                  static_cast<hsize_t>(info.height),
                                  static_cast<hsize_t>(info.width)};
  for (hid_t dataset : {output.images.get(), output.labels.get()}) {
    const bool is_images = dataset == output.images.get();
    const int rank = is_images ? 4 : 1;
    h5::Dataspace file_space(H5_CHECK(H5Dget_space(dataset)));
    const hsize_t start[4] = {first, 0, 0, 0};
    const hsize_t counts[4] = {count, sample_dims[0], sample_dims[1], sample_dims[2]};
    hsize_t memory_dims[4] = {std::max<hsize_t>(count, 1), sample_dims[0], sample_dims[1],
                              sample_dims[2]};
    h5::Dataspace memory_space(H5_CHECK(H5Screate_simple(rank, memory_dims, nullptr)));
    if (count > 0) {
      H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, counts,
                                   nullptr));
    } else {
      H5_CHECK(H5Sselect_none(file_space.get()));
      H5_CHECK(H5Sselect_none(memory_space.get()));
    }
    H5_CHECK(H5Dwrite(dataset, is_images ? H5T_NATIVE_UINT8 : H5T_NATIVE_INT64,
                      memory_space.get(), file_space.get(), transfer.get(),
                      is_images ? static_cast<const void*>(images)
                                : static_cast<const void*>(labels)));
  }
}

// The root group's attributes (collective under MPI-IO: every rank the same values).
void write_root_attributes(hid_t file, const DatasetInfo& info) {
  h5::Group root(H5_CHECK(H5Gopen2(file, "/", H5P_DEFAULT)));
  h5::write_integer_attribute(root.get(), "format_version", kFormatVersion);
  h5::write_integer_attribute(root.get(), "num_classes", info.num_classes);
  h5::write_variable_strings_attribute(root.get(), "class_names", info.class_names, false);
  h5::write_integer_attribute(root.get(), "channels", info.channels);
  h5::write_integer_attribute(root.get(), "height", info.height);
  h5::write_integer_attribute(root.get(), "width", info.width);
  h5::write_floats_attribute(root.get(), "mean", info.mean);
  h5::write_floats_attribute(root.get(), "std", info.std);
  h5::write_variable_strings_attribute(root.get(), "source", {info.source}, true);
}

// The whole of `contents` (its info complete) as a dataset file at `path`, flushed and closed.
void write_contents(const std::string& path, const DatasetContents& contents) {
  const DatasetInfo& info = contents.info;
  h5::Lock lock;  // Note [HDF5 lock]
  h5::File file(H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)));
  write_root_attributes(file.get(), info);
  for (Split split : {Split::kTrain, Split::kTest}) {
    const SplitOutput output = create_split(file.get(), split, info);
    const bool train = split == Split::kTrain;
    const hsize_t n = static_cast<hsize_t>(info.size(split));
    if (n > 0)
      write_split_rows(output, info, 0, n,
                       (train ? contents.train_images : contents.test_images).data(),
                       (train ? contents.train_labels : contents.test_labels).data(), false);
  }
  H5_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL));  // errors surface here, not in the close
}

// Per-channel sums of the values and of their squares over `images` (whole samples), added to
// `sums` and `squares` (info.channels each): exact integers, which ranks can add up.
void add_channel_sums(const DatasetInfo& info, const std::vector<uint8_t>& images,
                      std::vector<uint64_t>& sums, std::vector<uint64_t>& squares) {
  const int64_t plane = info.height * info.width;
  const int64_t samples = static_cast<int64_t>(images.size()) / info.sample_bytes();
  for (int64_t c = 0; c < info.channels; ++c) {
    uint64_t sum = 0, sum_squares = 0;
    for (int64_t s = 0; s < samples; ++s) {
      const uint8_t* pixel = images.data() + s * info.sample_bytes() + c * plane;
      for (int64_t i = 0; i < plane; ++i) {
        sum += pixel[i];
        sum_squares += static_cast<uint64_t>(pixel[i]) * pixel[i];
      }
    }
    sums[static_cast<size_t>(c)] += sum;
    squares[static_cast<size_t>(c)] += sum_squares;
  }
}

// Per-channel mean and (population) standard deviation of `samples` train images scaled to
// [0, 1], from their channel sums. Only the final division is floating point, so the result does
// not depend on how the sums were split over ranks.
void set_mean_std(DatasetInfo& info, const std::vector<uint64_t>& sums,
                  const std::vector<uint64_t>& squares, int64_t samples) {
  const int64_t plane = info.height * info.width;
  info.mean.assign(info.channels, 0.0f);
  info.std.assign(info.channels, 0.0f);
  for (int64_t c = 0; c < info.channels; ++c) {
    const uint64_t sum = sums[static_cast<size_t>(c)];
    const uint64_t sum_squares = squares[static_cast<size_t>(c)];
    const double count = static_cast<double>(samples) * static_cast<double>(plane);
    const double mean = static_cast<double>(sum) / count / 255.0;
    const double variance = static_cast<double>(sum_squares) / count / (255.0 * 255.0) - mean * mean;
    // A channel with one value everywhere has variance exactly 0 (count x sum of squares = sum^2
    // in integers); the floating-point difference above may leave a rounding residue instead,
    // which would slip past the writer's check for std 0.
    __extension__ typedef unsigned __int128 Wide;  // GCC and Clang
    const bool constant = static_cast<Wide>(sum_squares) * static_cast<uint64_t>(samples * plane) ==
                          static_cast<Wide>(sum) * sum;
    info.mean[c] = static_cast<float>(mean);
    info.std[c] = constant ? 0.0f : static_cast<float>(std::sqrt(std::max(0.0, variance)));
  }
}

void compute_mean_std(DatasetInfo& info, const std::vector<uint8_t>& images) {
  std::vector<uint64_t> sums(static_cast<size_t>(info.channels), 0);
  std::vector<uint64_t> squares(static_cast<size_t>(info.channels), 0);
  add_channel_sums(info, images, sums, squares);
  set_mean_std(info, sums, squares, static_cast<int64_t>(images.size()) / info.sample_bytes());
}

// What the reader refuses (read_info), the writer does not write: inputs are divided by std.
void require_nonzero_std(const std::string& path, const DatasetInfo& info) {
  for (int64_t c = 0; c < info.channels; ++c)
    if (info.std[c] == 0.0f)
      throw DataError("cannot write " + path + ": channel " + std::to_string(c) +
                      " has the same value in every pixel of every train image (std 0), so "
                      "normalising the inputs would divide by zero");
}

// The checks of info alone: classes, names, the image shape.
void validate_info(const std::string& path, const DatasetInfo& info) {
  if (info.num_classes < 2)
    throw DataError(path + ": num_classes = " + std::to_string(info.num_classes) +
                    ", expected at least 2");
  if (static_cast<int64_t>(info.class_names.size()) != info.num_classes)
    throw DataError(path + ": " + std::to_string(info.class_names.size()) +
                    " class names for num_classes = " + std::to_string(info.num_classes));
  if (info.channels < 1 || info.height < 1 || info.width < 1)
    throw DataError(path + ": image shape " + std::to_string(info.channels) + "x" +
                    std::to_string(info.height) + "x" + std::to_string(info.width) +
                    " must be positive");
  checked_sample_bytes(path, info.channels, info.height, info.width);
}

// Consecutive samples of one split, the first at index `first` in the file: whole images, one a
// label, each label a class.
void validate_samples(const std::string& path, Split split, const DatasetInfo& info,
                      const std::vector<uint8_t>& images, const std::vector<int64_t>& labels,
                      int64_t first) {
  const uint64_t expected = labels.size() * static_cast<uint64_t>(info.sample_bytes());
  if (images.size() != expected)
    throw DataError(path + ": " + split_name(split) + " images have " +
                    std::to_string(images.size()) + " bytes, expected " +
                    std::to_string(expected) + " (" + std::to_string(labels.size()) +
                    " labels x " + std::to_string(info.sample_bytes()) + " bytes)");
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] < 0 || labels[i] >= info.num_classes)
      throw DataError(path + ": " + split_name(split) + " label[" +
                      std::to_string(first + static_cast<int64_t>(i)) + "] = " +
                      std::to_string(labels[i]) + " is outside [0, " +
                      std::to_string(info.num_classes) + ")");
}

void validate_contents(const std::string& path, const DatasetContents& contents) {
  validate_info(path, contents.info);
  if (contents.train_labels.empty()) throw DataError(path + ": the train split is empty");
  validate_samples(path, Split::kTrain, contents.info, contents.train_images,
                   contents.train_labels, 0);
  validate_samples(path, Split::kTest, contents.info, contents.test_images, contents.test_labels,
                   0);
}

// Consecutive runs [start, start + count) of sorted, unique indices.
std::vector<std::pair<hsize_t, hsize_t>> consecutive_runs(const std::vector<int64_t>& sorted) {
  std::vector<std::pair<hsize_t, hsize_t>> runs;
  for (int64_t index : sorted) {
    if (!runs.empty() && runs.back().first + runs.back().second == static_cast<hsize_t>(index))
      ++runs.back().second;
    else
      runs.emplace_back(static_cast<hsize_t>(index), 1);
  }
  return runs;
}

// Note [Reading runs]: reads the runs' images in increasing index order into `out`: one H5Dread
// per run, with a file selection of one hyperslab and a memory space of the same shape. That
// shape match is what keeps HDF5 1.10 on its fast path. One H5Dread of a union of hyperslabs into
// a flat buffer looks cheaper but makes HDF5 map the selection onto the chunks element by
// element: 60,000 Fashion-MNIST samples in batches of 64 took 4.0 s that way, 0.8 s with one
// read per run (same machine, same cache settings).
void read_image_runs(hid_t dataset, const std::vector<std::pair<hsize_t, hsize_t>>& runs,
                     size_t sample_bytes, uint8_t* out) {
  h5::Dataspace file_space(H5_CHECK(H5Dget_space(dataset)));
  const int rank = H5_CHECK(H5Sget_simple_extent_ndims(file_space.get()));
  std::vector<hsize_t> start(rank, 0), count(rank);
  H5_CHECK(H5Sget_simple_extent_dims(file_space.get(), count.data(), nullptr));
  h5::Dataspace memory_space;
  hsize_t memory_samples = 0;
  for (const auto& [first, samples] : runs) {
    start[0] = first;
    count[0] = samples;
    H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                 count.data(), nullptr));
    if (memory_samples != samples) {  // most runs are single samples: reuse the space
      memory_space = h5::Dataspace(H5_CHECK(H5Screate_simple(rank, count.data(), nullptr)));
      memory_samples = samples;
    }
    H5_CHECK(H5Dread(dataset, H5T_NATIVE_UINT8, memory_space.get(), file_space.get(),
                     H5P_DEFAULT, out));
    out += samples * sample_bytes;
  }
}

}  // namespace

const char* split_name(Split split) { return split == Split::kTrain ? "train" : "test"; }

FileAccess preferred_file_access(bool mpi_thread_multiple) {
  // MPI-IO reads happen on the loader thread while the main thread communicates: that needs
  // MPI_THREAD_MULTIPLE. Without it (or with a serial HDF5) every rank opens the file alone.
  return kParallelHdf5 && mpi_thread_multiple ? FileAccess::kMpiIo : FileAccess::kSerial;
}

struct DatasetFile::Impl {
  std::string path;
  FileAccess access = FileAccess::kSerial;
  DatasetInfo info;
  // Declared before the datasets so that it is closed after them: the MPI-IO driver refuses to
  // close a file that still has open objects.
  h5::File file;
  SplitDatasets train;
  SplitDatasets test;

  const SplitDatasets& split(Split s) const { return s == Split::kTrain ? train : test; }
};

DatasetFile::DatasetFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DatasetFile::~DatasetFile() {
  if (!impl_) return;
  // An MPI-IO close is collective. While an exception unwinds towards MPI_Abort, the other
  // ranks will not join it, so the handles are left open rather than hanging the job
  // (Note [Ending the job] in runtime.h).
  if (impl_->access == FileAccess::kMpiIo && std::uncaught_exceptions() > 0) {
    impl_.release();
    return;
  }
  h5::Lock lock;  // Note [HDF5 lock]: the handles close inside
  impl_.reset();
}

DatasetFile::DatasetFile(DatasetFile&&) noexcept = default;

DatasetFile& DatasetFile::operator=(DatasetFile&& other) noexcept {
  if (this != &other) {
    if (impl_) {
      h5::Lock lock;
      impl_.reset();
    }
    impl_ = std::move(other.impl_);
  }
  return *this;
}

const std::string& DatasetFile::path() const { return impl_->path; }
const DatasetInfo& DatasetFile::info() const { return impl_->info; }

DatasetFile DatasetFile::open(const std::string& path, FileAccess access, MPI_Comm comm) {
  if (access == FileAccess::kMpiIo) {
    if (!kParallelHdf5)
      throw Error("cannot open " + path + " with MPI-IO: this HDF5 library is serial");
    if (comm == MPI_COMM_NULL) throw Error("cannot open " + path + " with MPI-IO: no communicator");
  }
  // Checked before the collective H5Fopen: every rank sees the same file and throws alike,
  // where a failed collective open could leave some ranks waiting.
  require_regular_file(path);

  h5::Lock lock;  // Note [HDF5 lock]; before every handle below
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 <= 0)
    throw DataError(path + ": not an HDF5 file" +
                    (is_hdf5 < 0 ? " (" + h5::error_stack_message() + ")" : std::string()));

  h5::PropertyList access_list(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
#if defined(HPC_TRAIN_HDF5_PARALLEL) && defined(H5_HAVE_PARALLEL)
  if (access == FileAccess::kMpiIo)
    H5_CHECK(H5Pset_fapl_mpio(access_list.get(), comm, MPI_INFO_NULL));
#endif
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  const hid_t file_id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, access_list.get());
  if (file_id < 0)
    throw DataError(path + ": cannot open as HDF5 (" + h5::error_stack_message() + ")");
  impl->file = h5::File(file_id);
  impl->access = access;
  {
    h5::Group root(H5_CHECK(H5Gopen2(impl->file.get(), "/", H5P_DEFAULT)));
    impl->info = read_info(path, root.get());
  }
  impl->train = open_split(path, impl->file.get(), Split::kTrain, impl->info);
  impl->test = open_split(path, impl->file.get(), Split::kTest, impl->info);
  impl->info.train_size = impl->train.size;
  impl->info.test_size = impl->test.size;
  if (impl->info.train_size == 0) throw DataError(path + ": the train split is empty");
  return DatasetFile(std::move(impl));
}

void DatasetFile::read_samples(Split split, const std::vector<int64_t>& indices, uint8_t* images,
                               int64_t* labels) const {
  const Impl& d = *impl_;
  const int64_t size = d.info.size(split);
  for (int64_t index : indices)
    if (index < 0 || index >= size)
      throw DataError(d.path + ": index " + std::to_string(index) + " is outside /" +
                      split_name(split) + " (" + std::to_string(size) + " samples)");
  if (indices.empty()) return;

  // HDF5 reads a selection in file order, so read the unique indices sorted, then scatter.
  std::vector<int64_t> sorted(indices);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  const auto runs = consecutive_runs(sorted);
  const size_t sample_bytes = static_cast<size_t>(d.info.sample_bytes());
  std::vector<uint8_t> staged_images(sorted.size() * sample_bytes);
  {
    h5::Lock lock;  // Note [HDF5 lock]
    try {
      read_image_runs(d.split(split).images.get(), runs, sample_bytes, staged_images.data());
    } catch (const DataError& e) {
      throw DataError(d.path + ": reading /" + split_name(split) + ": " + e.what());
    }
  }
  const std::vector<int64_t>& split_labels = d.split(split).labels;  // checked at open
  for (size_t k = 0; k < indices.size(); ++k) {
    const size_t u = std::lower_bound(sorted.begin(), sorted.end(), indices[k]) - sorted.begin();
    std::copy_n(staged_images.data() + u * sample_bytes, sample_bytes, images + k * sample_bytes);
    labels[k] = split_labels[static_cast<size_t>(indices[k])];
  }
}

void write_dataset_file(const std::string& path, DatasetContents contents) {
  const fs::path directory = fs::absolute(path).parent_path();
  std::error_code error;
  if (!fs::is_directory(directory, error))
    throw DataError("cannot write " + path + ": no such directory " + directory.string());
  validate_contents(path, contents);
  DatasetInfo& info = contents.info;
  info.train_size = static_cast<int64_t>(contents.train_labels.size());
  info.test_size = static_cast<int64_t>(contents.test_labels.size());
  compute_mean_std(info, contents.train_images);
  require_nonzero_std(path, info);

  // Note [Atomic file write]: a failed or killed conversion never leaves a half-written file
  // under the final name; a killed one may leave <path>.partial-<pid> beside it.
  AtomicFile file(path, ".partial-" + std::to_string(getpid()));
  try {
    write_contents(file.temporary(), contents);
    file.commit();
  } catch (const Error& e) {  // `file` removes the temporary file
    throw DataError("cannot write " + path + ": " + e.what());
  }
}

}  // namespace hpc_train

namespace hpc_train {

bool collective_dataset_writes_available() { return kParallelHdf5; }

namespace {

// Throws on every rank when any rank has a failure: its own message, or one saying that another
// rank's share was refused; returns on every rank otherwise.
void agree_on_failure(MPI_Comm comm, const std::string& failure, const std::string& path) {
  const int failed = failure.empty() ? 0 : 1;
  int any_failed = 0;
  MPI_CHECK(MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, comm));
  if (!any_failed) return;
  throw DataError(failed ? failure : "cannot write " + path + ": another rank's share failed");
}

}  // namespace

void write_dataset_file_collective(MPI_Comm comm, const std::string& path, DatasetInfo info,
                                   const DatasetShare& share) {
  if (!kParallelHdf5)
    throw Error("cannot write " + path + " collectively: this HDF5 library is serial");
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  // The checks of write_dataset_file, each rank on its share, agreed before any collective call.
  std::string failure;
  std::vector<uint64_t> sums, squares;
  try {
    const fs::path directory = fs::absolute(path).parent_path();
    std::error_code error;
    if (!fs::is_directory(directory, error))
      throw DataError("cannot write " + path + ": no such directory " + directory.string());
    validate_info(path, info);
    if (info.train_size < 1) throw DataError(path + ": the train split is empty");
    for (Split split : {Split::kTrain, Split::kTest}) {
      const bool train = split == Split::kTrain;
      const auto& labels = train ? share.train_labels : share.test_labels;
      const int64_t first = train ? share.first_train : share.first_test;
      if (first < 0 || first + static_cast<int64_t>(labels.size()) > info.size(split))
        throw Error(path + ": a share of " + split_name(split) + " samples [" +
                    std::to_string(first) + ", " +
                    std::to_string(first + static_cast<int64_t>(labels.size())) +
                    ") outside the split's " + std::to_string(info.size(split)));
      validate_samples(path, split, info, train ? share.train_images : share.test_images, labels,
                       first);
    }
    sums.assign(static_cast<size_t>(info.channels), 0);
    squares.assign(static_cast<size_t>(info.channels), 0);
    add_channel_sums(info, share.train_images, sums, squares);
  } catch (const Error& e) {
    failure = e.what();
  }
  agree_on_failure(comm, failure, path);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_UINT64_T,
                          MPI_SUM, comm));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, squares.data(), static_cast<int>(squares.size()),
                          MPI_UINT64_T, MPI_SUM, comm));
  set_mean_std(info, sums, squares, info.train_size);
  require_nonzero_std(path, info);  // the same sums on every rank: all throw or none

  // Note [Atomic file write]: rank 0 owns the temporary file (it removes it unless committed);
  // the other ranks write their shares into it by the name rank 0's process id makes.
  long writer_pid = static_cast<long>(getpid());
  MPI_CHECK(MPI_Bcast(&writer_pid, 1, MPI_LONG, 0, comm));
  const std::string suffix = ".partial-" + std::to_string(writer_pid);
  std::optional<AtomicFile> file;
  if (rank == 0) file.emplace(path, suffix);
  const std::string temporary = path + suffix;
  try {
    h5::Lock lock;  // Note [HDF5 lock]
    h5::PropertyList access(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
#if defined(HPC_TRAIN_HDF5_PARALLEL) && defined(H5_HAVE_PARALLEL)
    H5_CHECK(H5Pset_fapl_mpio(access.get(), comm, MPI_INFO_NULL));
#endif
    h5::File output(
        H5_CHECK(H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get())));
    write_root_attributes(output.get(), info);
    for (Split split : {Split::kTrain, Split::kTest}) {
      const bool train = split == Split::kTrain;
      const SplitOutput datasets = create_split(output.get(), split, info);
      if (info.size(split) == 0) continue;  // the same on every rank: nobody enters the write
      const auto& labels = train ? share.train_labels : share.test_labels;
      write_split_rows(datasets, info,
                       static_cast<hsize_t>(train ? share.first_train : share.first_test),
                       labels.size(),
                       (train ? share.train_images : share.test_images).data(), labels.data(),
                       true);
    }
    H5_CHECK(H5Fflush(output.get(), H5F_SCOPE_GLOBAL));
  } catch (const Error& e) {
    throw DataError("cannot write " + path + ": " + e.what());
  }
  // Every rank's share is in the file, flushed and closed, before rank 0 renames it.
  MPI_CHECK(MPI_Barrier(comm));
  failure.clear();
  if (rank == 0) {
    try {
      file->commit();
    } catch (const Error& e) {
      failure = "cannot write " + path + ": " + e.what();
    }
  }
  agree_on_failure(comm, failure, path);
}

}  // namespace hpc_train
