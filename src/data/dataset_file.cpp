#include "hpc_train/data/dataset_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <system_error>

#include "io/hdf5_attributes.h"
#include "io/hdf5_util.h"
#include "hpc_train/data/dataset_shards.h"
#include "hpc_train/io/atomic_file.h"
#include "hpc_train/io/file_descriptor.h"
#include "hpc_train/io/reader_threads.h"
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
  // Note [Reading only the samples]: samples per chunk where the images can be read directly
  // (chunks of whole samples, unfiltered), else 0. Each chunk's file address, looked up when
  // first needed (0: not yet; HADDR_UNDEF: never written, read through HDF5 as fill values).
  hsize_t direct_chunk_samples = 0;
  mutable std::vector<haddr_t> chunk_addresses;
};

// Note [Reading only the samples]: a training read is one sample, or a short run of consecutive
// ones, at a random place in a file that may be larger than memory, so every byte fetched beyond
// it is waste. HDF5 itself reads exactly the selection of an uncached, unfiltered chunk (the
// chunk cache is off: open_split; tests/test_dataset_file.cpp checks the bytes asked for). The
// waste is below it: the kernel's readahead reads on beyond a read when the pages before it are
// cached, taking a random read for part of a sequential one, up to the device's read_ahead_kb
// (128 KiB by default, MiBs on some virtual disks) a read. Measured with 3 ranks through MPI-IO
// (bench/data_bench.sh), readahead fetched measurably more than the samples delivered, the more
// from a file small beside memory (more of whose pages are cached), and the reads below leave
// little beyond a sample's pages, prefetched batches and evaluation. POSIX_FADV_RANDOM turns
// readahead off, but only for one file description, and the MPI-IO driver keeps its own to itself.
// So where the chunks hold whole samples unfiltered (every file the converters wrote, any number
// of samples a chunk), the samples are read with pread from the file's own descriptor, advised
// random, at their chunk's address (H5Dget_chunk_info_by_coord, HDF5 >= 1.10.5) plus their offset
// in it: one read a run (split where its chunks are not adjacent in the file), the same bytes HDF5
// would ask for, without the HDF5 lock. Other layouts (compressed, chunks of part of a sample,
// contiguous) and chunks never written go through H5Dread. Measured throughput does not settle
// whether this is faster on a host-cached virtual disk
// (bench/results-notes.md, Note [Reading only the samples]).
//
// Note [Reads in flight]: one such read at a time leaves a disk (an SSD, a virtual disk, a
// parallel file system) idle while the rank copies and waits, and the deep queues that such
// devices serve best are never filled. So a batch's reads are planned first, under the HDF5
// lock, then issued together on the dataset's ReaderThreads (--reader-threads in flight a
// rank), each into its own part of the staging buffer: the bytes, and where they land, are
// those of reading them one after another, and a failed read throws the DataError the first
// failing one in order would have thrown. Measured with 3 ranks reading ~150 KB samples without
// training, 8 in flight read more than 1 does and come closer to dd's sequential figure; 4 to 16
// alike, 32 slower; the bytes read per byte delivered unchanged (bench/results-notes.md,
// Note [Reads in flight]).
#if H5_VERSION_GE(1, 10, 5)
constexpr bool kDirectChunkReads = true;
#else
constexpr bool kDirectChunkReads = false;
#endif

// Samples per chunk when `images` ([N, C, H, W]) is read directly, else 0.
hsize_t direct_chunk_samples(hid_t images, const std::vector<hsize_t>& image_dims) {
  if (!kDirectChunkReads || image_dims[0] == 0) return 0;
  h5::PropertyList layout(H5_CHECK(H5Dget_create_plist(images)));
  if (H5_CHECK(H5Pget_layout(layout.get())) != H5D_CHUNKED) return 0;
  if (H5_CHECK(H5Pget_nfilters(layout.get())) != 0) return 0;
  hsize_t chunk[4] = {};
  if (H5_CHECK(H5Pget_chunk(layout.get(), 4, chunk)) != 4) return 0;
  for (int d = 1; d < 4; ++d)
    if (chunk[d] != image_dims[d]) return 0;
  return chunk[0];
}

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
  // without a cache HDF5 reads just the sample's bytes instead of the whole chunk (random samples
  // read measurably faster without than with the default 1 MiB cache: bench/results-notes.md,
  // dataset_file.cpp chunk cache). A compressed chunk is inflated whole for every read either way.
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
                    " but the attributes channels, height, width say " + info.sample_shape());
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
  // Up to 64 bits, as they are read: a corrupt datatype message can claim integers of gigabytes
  // each, and H5Dread then allocated and cleared a conversion buffer of that size per label (one
  // flipped byte of a file's size field: minutes, or the process killed for its memory).
  if (H5Tget_class(label_type.get()) != H5T_INTEGER ||
      H5Tget_size(label_type.get()) > sizeof(int64_t))
    throw DataError(labels_name + " has dtype " + h5::describe_type(label_type.get()) +
                    ", expected integers of up to 64 bits");
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
  // After the labels' checks, which bound the split's size by what the file holds.
  d.direct_chunk_samples = direct_chunk_samples(d.images.get(), image_dims);
  if (d.direct_chunk_samples > 0)
    d.chunk_addresses.assign((image_dims[0] + d.direct_chunk_samples - 1) / d.direct_chunk_samples,
                             0);
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

// A dataset file at `path` with `info`'s attributes and splits (info complete), each split's
// rows written by `write_rows`; flushed and closed. The caller holds the HDF5 lock.
void write_splits(const std::string& path, const DatasetInfo& info,
                  const std::function<void(const SplitOutput&, Split)>& write_rows) {
  h5::File file(H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)));
  write_root_attributes(file.get(), info);
  for (Split split : {Split::kTrain, Split::kTest})
    write_rows(create_split(file.get(), split, info), split);
  H5_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL));  // errors surface here, not in the close
}

// The whole of `contents` (its info complete) as a dataset file at `path`.
void write_contents(const std::string& path, const DatasetContents& contents) {
  const DatasetInfo& info = contents.info;
  h5::Lock lock;  // Note [HDF5 lock]
  write_splits(path, info, [&](const SplitOutput& output, Split split) {
    const bool train = split == Split::kTrain;
    const hsize_t n = static_cast<hsize_t>(info.size(split));
    if (n > 0)
      write_split_rows(output, info, 0, n,
                       (train ? contents.train_images : contents.test_images).data(),
                       (train ? contents.train_labels : contents.test_labels).data(), false);
  });
}

// write_dataset_slice's file at `path` (`info` that of the slice), copied from `source` a block
// at a time: a whole number of chunks (Note [Chunk shape]) where `block_bytes` holds one.
void copy_slice(const DatasetFile& source, const std::string& path, const DatasetInfo& info,
                SampleRange train, SampleRange test, int64_t block_bytes) {
  const int64_t sample_bytes = info.sample_bytes();
  int64_t block_samples = std::max<int64_t>(1, block_bytes / sample_bytes);
  const int64_t chunk = static_cast<int64_t>(kChunkSamples);
  if (block_samples >= chunk) block_samples -= block_samples % chunk;
  std::vector<int64_t> indices, labels;
  std::vector<uint8_t> images;
  h5::Lock lock;  // Note [HDF5 lock]; let go while `source` reads, which takes it itself
  write_splits(path, info, [&](const SplitOutput& output, Split split) {
    const SampleRange range = split == Split::kTrain ? train : test;
    for (int64_t done = 0; done < range.count; done += block_samples) {
      const int64_t count = std::min(block_samples, range.count - done);
      indices.resize(static_cast<size_t>(count));
      std::iota(indices.begin(), indices.end(), range.begin + done);
      images.resize(static_cast<size_t>(count * sample_bytes));
      labels.resize(static_cast<size_t>(count));
      {
        h5::Unlocked reading(lock);
        source.read_samples(split, indices, images.data(), labels.data());
      }
      write_split_rows(output, info, static_cast<hsize_t>(done), static_cast<hsize_t>(count),
                       images.data(), labels.data(), false);
    }
  });
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

void require_output_directory(const std::string& path) {
  const fs::path directory = fs::absolute(path).parent_path();
  std::error_code error;
  if (!fs::is_directory(directory, error))
    throw DataError("cannot write " + path + ": no such directory " + directory.string());
}

// Note [Atomic file write]: a failed or killed conversion never leaves a half-written file under
// the final name; a killed one may leave <path>.partial-<pid> beside it. `write` makes the file
// it is given.
void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write) {
  AtomicFile file(path, ".partial-" + std::to_string(getpid()));
  try {
    write(file.temporary());
    file.commit();
  } catch (const Error& e) {  // `file` removes the temporary file
    throw DataError("cannot write " + path + ": " + e.what());
  }
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
// element, several times slower than one read per run (bench/results-notes.md,
// Note [Reading runs]).
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

// One opened file of a dataset (the only one, or a shard).
struct OpenFile {
  std::string path;
  // Declared before the datasets so that it is closed after them: the MPI-IO driver refuses to
  // close a file that still has open objects.
  h5::File file;
  SplitDatasets train;
  SplitDatasets test;
  FileDescriptor samples;  // Note [Reading only the samples]: where a split is read directly

  const SplitDatasets& split(Split s) const { return s == Split::kTrain ? train : test; }
};

// A read of a run of samples' bytes at `offset` of a file, done outside the HDF5 lock.
struct DirectRead {
  const OpenFile* file;
  off_t offset;
  size_t bytes;
  uint8_t* out;
};

// The file address of chunk `chunk` of `images` (lock held).
haddr_t chunk_address(const SplitDatasets& images, hsize_t chunk) {
  haddr_t& address = images.chunk_addresses[chunk];
  if (address == 0) {
    hsize_t offset[4] = {chunk * images.direct_chunk_samples, 0, 0, 0};
    unsigned filter_mask = 0;
    hsize_t bytes = 0;
    H5_CHECK(H5Dget_chunk_info_by_coord(images.images.get(), offset, &filter_mask, &address,
                                        &bytes));
  }
  return address;
}

// The runs' images of `split` into `out`, in increasing index order (lock held): through
// H5Dread now where the split is not read directly, else as DirectReads added to `direct`, one
// per run, or per run within a chunk where the next chunk is elsewhere in the file (Note
// [Reading only the samples]).
void plan_image_runs(const OpenFile& file, Split split,
                     const std::vector<std::pair<hsize_t, hsize_t>>& runs, size_t sample_bytes,
                     uint8_t* out, std::vector<DirectRead>& direct) {
  const SplitDatasets& images = file.split(split);
  const hsize_t per_chunk = images.direct_chunk_samples;
  if (per_chunk == 0) return read_image_runs(images.images.get(), runs, sample_bytes, out);
  for (auto [index, left] : runs) {
    while (left > 0) {
      const hsize_t chunk = index / per_chunk;
      const hsize_t samples = std::min(left, (chunk + 1) * per_chunk - index);
      const haddr_t address = chunk_address(images, chunk);
      const off_t offset =
          static_cast<off_t>(address + (index - chunk * per_chunk) * sample_bytes);
      DirectRead* last = direct.empty() ? nullptr : &direct.back();
      if (address == HADDR_UNDEF)
        read_image_runs(images.images.get(), {{index, samples}}, sample_bytes, out);
      else if (last && last->file == &file && last->out + last->bytes == out &&
               last->offset + static_cast<off_t>(last->bytes) == offset)
        last->bytes += samples * sample_bytes;  // a run on into the next chunk, adjacent on disk
      else
        direct.push_back({&file, offset, samples * sample_bytes, out});
      out += samples * sample_bytes;
      index += samples;
      left -= samples;
    }
  }
}

void read_fully(const DirectRead& read, Split split) {
  size_t done = 0;
  while (done < read.bytes) {
    const ssize_t got = ::pread(read.file->samples.get(), read.out + done, read.bytes - done,
                                read.offset + static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw DataError(read.file->path + ": reading /" + split_name(split) + "/images at byte " +
                      std::to_string(read.offset + static_cast<off_t>(done)) + ": " +
                      (got < 0 ? std::strerror(errno) : "the file ends there (truncated?)"));
    done += static_cast<size_t>(got);
  }
}

// open_file, whose errors may not name the file.
OpenFile open_and_validate(const std::string& path, FileAccess access, MPI_Comm comm,
                           DatasetInfo& info) {
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
#else
  (void)access;
  (void)comm;
#endif
  OpenFile opened;
  opened.path = path;
  const hid_t file_id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, access_list.get());
  if (file_id < 0)
    throw DataError(path + ": cannot open as HDF5 (" + h5::error_stack_message() + ")");
  opened.file = h5::File(file_id);
  {
    h5::Group root(H5_CHECK(H5Gopen2(opened.file.get(), "/", H5P_DEFAULT)));
    info = read_info(path, root.get());
  }
  opened.train = open_split(path, opened.file.get(), Split::kTrain, info);
  opened.test = open_split(path, opened.file.get(), Split::kTest, info);
  info.train_size = opened.train.size;
  info.test_size = opened.test.size;
  if (info.train_size == 0) throw DataError(path + ": the train split is empty");
  if (opened.train.direct_chunk_samples > 0 || opened.test.direct_chunk_samples > 0) {
    opened.samples = FileDescriptor(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (opened.samples.get() < 0)
      throw DataError(path + ": cannot open for reading: " + std::strerror(errno));
    // Advice, not a requirement: where it is refused, reads are as exact, readahead aside.
    posix_fadvise(opened.samples.get(), 0, 0, POSIX_FADV_RANDOM);
  }
  return opened;
}

// Opens and validates one file (DatasetFile::open's contract), its info in `info` (the sizes
// set). Collective over `comm` with FileAccess::kMpiIo. Every error names the file: the checks'
// own messages begin with it, and an HDF5 call that fails on a damaged file (H5_CHECK: the
// call, file:line and HDF5's own stack) gets it put in front, with what it likely means.
OpenFile open_file(const std::string& path, FileAccess access, MPI_Comm comm, DatasetInfo& info) {
  try {
    return open_and_validate(path, access, comm, info);
  } catch (const DataError& e) {
    const std::string message = e.what();
    if (message.compare(0, path.size() + 2, path + ": ") == 0) throw;
    throw DataError(path + ": HDF5 cannot read this file's structure (a damaged file?): " +
                    message);
  }
}

std::string floats_text(const std::vector<float>& values) {
  std::string text;
  char number[32];
  for (size_t i = 0; i < values.size(); ++i) {
    // 9 significant digits tell any two floats apart.
    std::snprintf(number, sizeof number, "%s%.9g", i ? ", " : "", static_cast<double>(values[i]));
    text += number;
  }
  return text;
}

// Note [Shard layout]: `info` of the shard at `path` against `first`, the first shard's. The
// sizes may differ; the floats must be equal bit for bit, as the inputs are normalised by them.
void require_same_layout(const std::string& first_path, const DatasetInfo& first,
                         const std::string& path, const DatasetInfo& info) {
  auto differs = [&](const std::string& what, const std::string& value,
                     const std::string& first_value) {
    throw DataError("shard " + path + " has " + what + " " + value + " but shard " + first_path +
                    " has " + first_value + ": the shards of a dataset share one layout and "
                    "its statistics (hpc_train_data shard writes them so)");
  };
  auto shape = [](const DatasetInfo& i) {
    return std::to_string(i.channels) + "x" + std::to_string(i.height) + "x" +
           std::to_string(i.width);
  };
  if (shape(info) != shape(first)) differs("image shape (C x H x W)", shape(info), shape(first));
  if (info.num_classes != first.num_classes)
    differs("num_classes", std::to_string(info.num_classes), std::to_string(first.num_classes));
  for (size_t k = 0; k < info.class_names.size(); ++k)
    if (info.class_names[k] != first.class_names[k])
      differs("class_names[" + std::to_string(k) + "]", "'" + info.class_names[k] + "'",
              "'" + first.class_names[k] + "'");
  auto bits = [](const std::vector<float>& values) {
    std::vector<uint32_t> out(values.size());
    std::memcpy(out.data(), values.data(), values.size() * sizeof(float));
    return out;
  };
  if (bits(info.mean) != bits(first.mean))
    differs("mean", floats_text(info.mean), floats_text(first.mean));
  if (bits(info.std) != bits(first.std))
    differs("std", floats_text(info.std), floats_text(first.std));
}

// Note [Agreed shard list]: with MPI-IO every shard's open is collective, so the ranks must open
// the same files in the same order. Each rank expands the pattern or reads the index itself; a
// rank that fails to, or that sees other files (no shared file system, a shard written while the
// job starts), would leave the others waiting in a collective open. So the ranks agree first, by
// one all-reduce of a digest of the list: every rank throws, the failing one its own error.
DatasetSources agreed_dataset_sources(const std::string& path, MPI_Comm comm) {
  DatasetSources sources;
  std::exception_ptr error;
  try {
    sources = resolve_dataset_sources(path);
  } catch (...) {
    error = std::current_exception();
  }
  uint64_t digest = 14695981039346656037ull;  // FNV-1a over the paths and counts
  auto mix = [&digest](const std::string& bytes) {
    for (unsigned char byte : bytes) digest = (digest ^ byte) * 1099511628211ull;
    digest = (digest ^ 0xff) * 1099511628211ull;  // a separator no path byte can fake
  };
  for (const ShardSource& shard : sources.shards)
    mix(shard.path + " " + std::to_string(shard.train_size) + " " +
        std::to_string(shard.test_size));
  // {failed, digest, ~digest} under MAX: any failure, the largest and the smallest digest.
  unsigned long long mine[3] = {error ? 1ull : 0ull, digest, ~digest};
  unsigned long long all[3] = {};
  MPI_CHECK(MPI_Allreduce(mine, all, 3, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm));
  if (error) std::rethrow_exception(error);
  if (all[0] != 0)
    throw DataError(path + ": another rank could not resolve the dataset (its message says why)");
  if (all[1] != ~all[2])
    throw DataError(path + ": the ranks see different files (this rank " +
                    std::to_string(sources.shards.size()) + " shard(s)); every rank must see the "
                    "same shards, as on a shared file system");
  return sources;
}

}  // namespace

const char* split_name(Split split) { return split == Split::kTrain ? "train" : "test"; }

std::string describe_samples(const DatasetInfo& info) {
  auto per_channel = [](const std::vector<float>& values) {
    std::string text;
    char number[32];
    for (size_t c = 0; c < values.size(); ++c) {
      std::snprintf(number, sizeof(number), "%s%.4f", c ? ", " : "", values[c]);
      text += number;
    }
    return text;
  };
  std::string classes;
  for (size_t k = 0; k < info.class_names.size(); ++k)
    classes += (k ? ", " : "") + std::to_string(k) + " " + info.class_names[k];
  std::string text;
  text += "  train:           " + std::to_string(info.train_size) + " samples\n";
  text += "  test:            " + std::to_string(info.test_size) + " samples\n";
  text += "  shape:           " + std::to_string(info.channels) + "x" +
          std::to_string(info.height) + "x" + std::to_string(info.width) +
          " (C x H x W), uint8\n";
  text += "  classes:         " + std::to_string(info.num_classes) + ": " + classes + "\n";
  text += "  mean:            " + per_channel(info.mean) + "\n";
  text += "  std:             " + per_channel(info.std) + "\n";
  return text;
}

FileAccess preferred_file_access(bool mpi_thread_multiple) {
  // MPI-IO reads happen on the loader thread while the main thread communicates: that needs
  // MPI_THREAD_MULTIPLE. Without it (or with a serial HDF5) every rank opens the file alone.
  return kParallelHdf5 && mpi_thread_multiple ? FileAccess::kMpiIo : FileAccess::kSerial;
}

struct DatasetFile::Impl {
  explicit Impl(int reads_in_flight) : readers(reads_in_flight) {}

  std::string path;
  FileAccess access = FileAccess::kSerial;
  DatasetInfo info;
  std::vector<OpenFile> files;  // Note [Shard order]
  std::vector<DatasetShard> shards;
  // first(s) of each file in each split, and the split's size last: file s holds the global
  // indices [first[s], first[s + 1]).
  std::vector<int64_t> train_first{0};
  std::vector<int64_t> test_first{0};
  // Note [Reads in flight]: mutable because reading is const; ReaderThreads is thread-safe.
  mutable ReaderThreads readers;

  const std::vector<int64_t>& first(Split s) const {
    return s == Split::kTrain ? train_first : test_first;
  }
  // The file that holds global index `index` of a split (in range).
  size_t file_of(Split s, int64_t index) const {
    const std::vector<int64_t>& starts = first(s);
    return static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), index) -
                               starts.begin() - 1);
  }
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
const std::vector<DatasetShard>& DatasetFile::shards() const { return impl_->shards; }

DatasetFile DatasetFile::open(const std::string& path, FileAccess access, MPI_Comm comm,
                              int reads_in_flight) {
  if (access == FileAccess::kMpiIo) {
    if (!kParallelHdf5)
      throw Error("cannot open " + path + " with MPI-IO: this HDF5 library is serial");
    if (comm == MPI_COMM_NULL) throw Error("cannot open " + path + " with MPI-IO: no communicator");
  }
  const DatasetSources sources = access == FileAccess::kMpiIo
                                     ? agreed_dataset_sources(path, comm)
                                     : resolve_dataset_sources(path);
  auto impl = std::make_unique<Impl>(reads_in_flight);
  impl->path = path;
  impl->access = access;
  impl->files.reserve(sources.shards.size());
  // Note [Shard order]: every file in order, validated, checked against the index's counts and
  // the first file's layout, its range recorded.
  try {
    for (size_t s = 0; s < sources.shards.size(); ++s) {
      const ShardSource& source = sources.shards[s];
      DatasetInfo info;
      impl->files.push_back(open_file(source.path, access, comm, info));
      const OpenFile& file = impl->files.back();
      if (sources.kind == DatasetSources::Kind::kIndex)
        for (Split split : {Split::kTrain, Split::kTest}) {
          const int64_t declared =
              split == Split::kTrain ? source.train_size : source.test_size;
          if (file.split(split).size != declared)
            throw DataError(sources.describe(s) + " holds " +
                            std::to_string(file.split(split).size) + " " + split_name(split) +
                            " samples, the index says " + std::to_string(declared));
        }
      if (s == 0)
        impl->info = info;
      else
        require_same_layout(impl->files.front().path, impl->info, file.path, info);
      impl->shards.push_back({file.path, file.train.size, file.test.size});
      for (Split split : {Split::kTrain, Split::kTest}) {
        std::vector<int64_t>& first = split == Split::kTrain ? impl->train_first : impl->test_first;
        int64_t end = 0;
        if (__builtin_add_overflow(first.back(), file.split(split).size, &end))
          throw DataError(path + ": the " + std::string(split_name(split)) +
                          " samples of its shards overflow a 64-bit count");
        first.push_back(end);
      }
    }
  } catch (...) {
    h5::Lock lock;  // Note [HDF5 lock]: the files opened so far close inside
    impl.reset();
    throw;
  }
  impl->info.train_size = impl->train_first.back();
  impl->info.test_size = impl->test_first.back();
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
  // Indices that already increase (a resident split's upload, evaluation's batches) are their
  // own sorted list: they are read straight into `images`, with no staging copy.
  const bool increasing =
      std::adjacent_find(indices.begin(), indices.end(), std::greater_equal<int64_t>()) ==
      indices.end();
  std::vector<int64_t> sorted(indices);
  if (!increasing) {
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  }
  // Note [Shard order]: the sorted indices fall into the files in file order; each file reads
  // its part as local runs, in the same handle it was opened with.
  const std::vector<int64_t>& first = d.first(split);
  const size_t sample_bytes = static_cast<size_t>(d.info.sample_bytes());
  std::vector<uint8_t> staged_images(increasing ? 0 : sorted.size() * sample_bytes);
  std::vector<DirectRead> direct;  // Note [Reading only the samples]
  {
    h5::Lock lock;  // Note [HDF5 lock]
    uint8_t* out = increasing ? images : staged_images.data();
    std::vector<int64_t> local;
    for (auto begin = sorted.begin(); begin != sorted.end();) {
      const size_t f = d.file_of(split, *begin);
      const auto end = std::lower_bound(begin, sorted.end(), first[f + 1]);
      local.assign(begin, end);
      for (int64_t& index : local) index -= first[f];
      const OpenFile& file = d.files[f];
      try {
        plan_image_runs(file, split, consecutive_runs(local), sample_bytes, out, direct);
      } catch (const DataError& e) {
        throw DataError(file.path + ": reading /" + split_name(split) + ": " + e.what());
      }
      out += local.size() * sample_bytes;
      begin = end;
    }
  }
  // Note [Reads in flight]
  d.readers.run(direct.size(), [&](size_t r) { read_fully(direct[r], split); });
  for (size_t k = 0; k < indices.size(); ++k) {
    if (!increasing) {
      const size_t u = std::lower_bound(sorted.begin(), sorted.end(), indices[k]) - sorted.begin();
      std::copy_n(staged_images.data() + u * sample_bytes, sample_bytes, images + k * sample_bytes);
    }
    const size_t f = d.files.size() == 1 ? 0 : d.file_of(split, indices[k]);
    // Checked at open (Note [Labels read at open]).
    labels[k] = d.files[f].split(split).labels[static_cast<size_t>(indices[k] - first[f])];
  }
}

void write_dataset_file(const std::string& path, DatasetContents contents) {
  require_output_directory(path);
  validate_contents(path, contents);
  DatasetInfo& info = contents.info;
  info.train_size = static_cast<int64_t>(contents.train_labels.size());
  info.test_size = static_cast<int64_t>(contents.test_labels.size());
  compute_mean_std(info, contents.train_images);
  require_nonzero_std(path, info);

  write_atomically(path,
                   [&](const std::string& temporary) { write_contents(temporary, contents); });
}

void write_dataset_slice(const DatasetFile& source, const std::string& path, SampleRange train,
                         SampleRange test, int64_t block_bytes) {
  require_output_directory(path);
  DatasetInfo info = source.info();  // validated at open: layout, mean and std, labels
  for (Split split : {Split::kTrain, Split::kTest}) {
    const SampleRange range = split == Split::kTrain ? train : test;
    if (range.begin < 0 || range.count < 0 || range.count > info.size(split) - range.begin)
      throw DataError("cannot write " + path + ": " + split_name(split) + " samples [" +
                      std::to_string(range.begin) + ", " +
                      std::to_string(range.begin + range.count) + ") are outside the " +
                      std::to_string(info.size(split)) + " of " + source.path());
  }
  if (train.count == 0) throw DataError("cannot write " + path + ": the train split is empty");
  info.train_size = train.count;
  info.test_size = test.count;
  write_atomically(path, [&](const std::string& temporary) {
    copy_slice(source, temporary, info, train, test, block_bytes);
  });
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
