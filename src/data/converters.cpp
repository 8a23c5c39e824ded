#include "hpc_train/data/converters.h"

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "data/source_formats.h"
#include "io/hdf5_attributes.h"
#include "io/hdf5_util.h"
#include "hpc_train/error.h"

namespace hpc_train {

namespace {

namespace fs = std::filesystem;

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
constexpr int64_t kCifarSide = 32;
constexpr int64_t kCifarImageBytes = 3 * kCifarSide * kCifarSide;  // R, G, B planes of 32x32
constexpr int64_t kCifarRecordBytes = 1 + kCifarImageBytes;        // label byte + image
constexpr int64_t kTenClasses = 10;

const std::vector<std::string> kFashionMnistClasses = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
const std::vector<std::string> kMnistClasses = {"0", "1", "2", "3", "4",
                                                "5", "6", "7", "8", "9"};
const std::vector<std::string> kCifar10Classes = {"airplane", "automobile", "bird", "cat",
                                                  "deer",     "dog",        "frog", "horse",
                                                  "ship",     "truck"};

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

struct IdxArray {
  std::string path;
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // the values after the header
};

std::string hex_magic(uint32_t magic) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08X", magic);
  return text;
}

// `dir/name`, or `dir/name.gz` when only that exists.
IdxArray read_idx(const std::string& dir, const std::string& name, uint32_t expected_magic) {
  IdxArray array;
  array.path = (fs::path(dir) / name).string();
  if (!regular_file_exists(array.path)) {
    const std::string gz = array.path + ".gz";
    if (!regular_file_exists(gz)) throw DataError(array.path + ": no such file (nor " + gz + ")");
    array.path = gz;
  }
  std::vector<uint8_t> bytes = read_whole_file(array.path);
  if (bytes.empty()) throw DataError(array.path + ": empty file");
  if (bytes.size() < 4) throw DataError(array.path + ": truncated IDX header");
  const uint32_t magic = big_endian_u32(bytes.data());
  if (magic != expected_magic)
    throw DataError(array.path + ": wrong magic number " + hex_magic(magic) + ", expected " +
                    hex_magic(expected_magic) + " (IDX " +
                    (expected_magic == kIdxImagesMagic ? "images" : "labels") + ")");
  const size_t rank = magic & 0xFF;
  const size_t header_bytes = 4 + 4 * rank;
  if (bytes.size() < header_bytes) throw DataError(array.path + ": truncated IDX header");
  // Three 32-bit dimensions can multiply past 2^64: 16 x 2^30 x 2^30 wrapped to 0, and a file
  // without image bytes passed for 16 images (the fuzz target's checks, fuzz/fuzz_idx.cpp).
  uint64_t expected_bytes = 1;
  bool too_large = false;
  std::string shape;
  for (size_t i = 0; i < rank; ++i) {
    array.dims.push_back(big_endian_u32(bytes.data() + 4 + 4 * i));
    too_large |= __builtin_mul_overflow(expected_bytes, static_cast<uint64_t>(array.dims.back()),
                                        &expected_bytes);
    shape += (i ? "x" : "") + std::to_string(array.dims.back());
  }
  const uint64_t data_bytes = bytes.size() - header_bytes;
  if (too_large)
    throw DataError(array.path + ": truncated: " + std::to_string(data_bytes) +
                    " data bytes, the header says " + shape + " (over 2^64 bytes)");
  if (data_bytes != expected_bytes)
    throw DataError(array.path + ": " + (data_bytes < expected_bytes ? "truncated" : "too long") +
                    ": " + std::to_string(data_bytes) + " data bytes, the header says " +
                    std::to_string(expected_bytes));
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header_bytes), bytes.end());
  return array;
}

// One IDX split: images [N, H, W] and labels [N] of the same N.
void read_idx_split(const std::string& dir, const std::string& prefix, DatasetInfo& info,
                    std::vector<uint8_t>& images, std::vector<int64_t>& labels, int64_t max) {
  IdxArray image_array = read_idx(dir, prefix + "-images-idx3-ubyte", kIdxImagesMagic);
  const IdxArray label_array = read_idx(dir, prefix + "-labels-idx1-ubyte", kIdxLabelsMagic);
  if (image_array.dims[0] != label_array.dims[0])
    throw DataError(image_array.path + " has " + std::to_string(image_array.dims[0]) +
                    " images but " + label_array.path + " has " +
                    std::to_string(label_array.dims[0]) + " labels");
  if (image_array.dims[1] == 0 || image_array.dims[2] == 0)
    throw DataError(image_array.path + ": images of " + std::to_string(image_array.dims[1]) + "x" +
                    std::to_string(image_array.dims[2]) + " pixels; both must be at least 1");
  // A split of no images has no data bytes to bound its header's H x W, which would then
  // overflow the 64-bit byte counts downstream (C x H x W); no real image is 2 GiB.
  if (static_cast<uint64_t>(image_array.dims[1]) * static_cast<uint64_t>(image_array.dims[2]) >
      static_cast<uint64_t>(INT32_MAX))
    throw DataError(image_array.path + ": images of " + std::to_string(image_array.dims[1]) + "x" +
                    std::to_string(image_array.dims[2]) + " pixels (over 2^31 bytes each)");
  if (info.height == 0) {  // the train split sets the shape; the test split must agree
    info.height = image_array.dims[1];
    info.width = image_array.dims[2];
  } else if (image_array.dims[1] != info.height || image_array.dims[2] != info.width) {
    throw DataError(image_array.path + ": images are " + std::to_string(image_array.dims[1]) +
                    "x" + std::to_string(image_array.dims[2]) + " but the train images are " +
                    std::to_string(info.height) + "x" + std::to_string(info.width));
  }
  images = std::move(image_array.data);
  labels.assign(label_array.data.begin(), label_array.data.end());
  check_labels(label_array.path, labels, info.num_classes);
  keep_first(images, labels, info.sample_bytes(), max);
}

// The CIFAR-10 archive unpacks into cifar-10-batches-bin/; accept that folder or its parent.
std::string cifar_dir(const std::string& source_dir) {
  const fs::path nested = fs::path(source_dir) / "cifar-10-batches-bin";
  std::error_code error;
  if (!fs::exists(fs::path(source_dir) / "data_batch_1.bin", error) &&
      fs::exists(nested / "data_batch_1.bin", error))
    return nested.string();
  return source_dir;
}

// Appends the records of one CIFAR-10 binary file: 1 label byte, then 3072 image bytes (the
// R, G and B planes, row-major), which is already the [C, H, W] layout.
void read_cifar_file(const std::string& path, std::vector<uint8_t>& images,
                     std::vector<int64_t>& labels) {
  if (!regular_file_exists(path)) throw DataError(path + ": no such file");
  const std::vector<uint8_t> bytes = read_whole_file(path);
  if (bytes.empty()) throw DataError(path + ": empty file");
  if (bytes.size() % kCifarRecordBytes != 0)
    throw DataError(path + ": " + std::to_string(bytes.size()) + " bytes is not a whole number " +
                    "of " + std::to_string(kCifarRecordBytes) +
                    "-byte CIFAR-10 records (truncated or not CIFAR-10 binary)");
  const size_t records = bytes.size() / kCifarRecordBytes;
  for (size_t r = 0; r < records; ++r) {
    const uint8_t* record = bytes.data() + r * kCifarRecordBytes;
    if (record[0] >= kTenClasses)
      throw DataError(path + ": record " + std::to_string(r) + " has label " +
                      std::to_string(record[0]) + ", outside [0, 10)");
    labels.push_back(record[0]);
    images.insert(images.end(), record + 1, record + kCifarRecordBytes);
  }
}

}  // namespace

bool regular_file_exists(const std::string& path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (status.type() == fs::file_type::not_found) return false;
  if (error) throw DataError(path + ": cannot access: " + error.message());
  if (status.type() == fs::file_type::directory)
    throw DataError(path + ": is a directory, expected a file");
  if (status.type() != fs::file_type::regular) throw DataError(path + ": not a regular file");
  return true;
}

// zlib reads files that are not gzip through unchanged.
std::vector<uint8_t> read_whole_file(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) throw DataError(path + ": cannot open");
  std::vector<uint8_t> bytes;
  // Appended as read: growing `bytes` by a zero-filled block before each read cost more than the
  // read itself for small files (the fuzz target of the converters ran at 60 inputs/s).
  std::vector<uint8_t> block(1 << 16);
  while (true) {
    const int got = gzread(file, block.data(), static_cast<unsigned>(block.size()));
    int zlib_error = Z_OK;
    const char* message = gzerror(file, &zlib_error);
    if (got < 0 || (zlib_error != Z_OK && zlib_error != Z_STREAM_END)) {
      const std::string text = message ? message : "read error";
      gzclose(file);
      throw DataError(path + ": cannot read (truncated or corrupt gzip?): " + text);
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), block.begin(), block.begin() + got);
  }
  gzclose(file);
  return bytes;
}

void check_labels(const std::string& path, const std::vector<int64_t>& labels,
                  int64_t num_classes) {
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] < 0 || labels[i] >= num_classes)
      throw DataError(path + ": label[" + std::to_string(i) + "] = " + std::to_string(labels[i]) +
                      " is outside [0, " + std::to_string(num_classes) + ")");
}

void keep_first(std::vector<uint8_t>& images, std::vector<int64_t>& labels, int64_t sample_bytes,
                int64_t max) {
  if (max < 0 || max >= static_cast<int64_t>(labels.size())) return;
  labels.resize(static_cast<size_t>(max));
  images.resize(static_cast<size_t>(max * sample_bytes));
}

SourceFormat parse_source_format(const std::string& name) {
  if (name == "fashion-mnist") return SourceFormat::kFashionMnist;
  if (name == "mnist") return SourceFormat::kMnist;
  if (name == "cifar10") return SourceFormat::kCifar10;
  if (name == "cifar10-python") return SourceFormat::kCifar10Python;
  if (name == "npz") return SourceFormat::kNpz;
  if (name == "imagefolder") return SourceFormat::kImageFolder;
  throw ConfigError("unknown dataset format '" + name +
                    "'; known formats: fashion-mnist, mnist, cifar10, cifar10-python, npz, "
                    "imagefolder");
}

ImageLayout parse_image_layout(const std::string& name) {
  if (name == "nhwc") return ImageLayout::kNhwc;
  if (name == "nchw") return ImageLayout::kNchw;
  throw ConfigError("unknown image layout '" + name + "'; known layouts: nhwc, nchw");
}

DatasetContents read_source_dataset(SourceFormat format, const std::string& source_dir,
                                    const ConvertOptions& options) {
  if (format == SourceFormat::kNpz) return read_npz_dataset(source_dir, options);
  if (format == SourceFormat::kImageFolder)
    throw ConfigError("imagefolder is converted by convert_image_folder (image_folder.h)");
  std::error_code error;
  if (!fs::is_directory(source_dir, error))
    throw DataError(source_dir + ": no such directory (the dataset's source files go there)");
  if (format == SourceFormat::kCifar10Python)
    return read_cifar10_python_dataset(source_dir, options);
  DatasetContents contents;
  DatasetInfo& info = contents.info;
  info.num_classes = kTenClasses;
  if (format == SourceFormat::kCifar10) {
    const std::string dir = cifar_dir(source_dir);
    info.class_names = kCifar10Classes;
    info.channels = 3;
    info.height = info.width = kCifarSide;
    info.source = "cifar10 binary files in " + dir;
    for (int b = 1; b <= 5; ++b)
      read_cifar_file((fs::path(dir) / ("data_batch_" + std::to_string(b) + ".bin")).string(),
                      contents.train_images, contents.train_labels);
    read_cifar_file((fs::path(dir) / "test_batch.bin").string(), contents.test_images,
                    contents.test_labels);
    keep_first(contents.train_images, contents.train_labels, info.sample_bytes(),
               options.max_train);
    keep_first(contents.test_images, contents.test_labels, info.sample_bytes(), options.max_test);
  } else {
    const bool fashion = format == SourceFormat::kFashionMnist;
    info.class_names = fashion ? kFashionMnistClasses : kMnistClasses;
    info.channels = 1;
    info.source = std::string(fashion ? "fashion-mnist" : "mnist") + " IDX files in " + source_dir;
    read_idx_split(source_dir, "train", info, contents.train_images, contents.train_labels,
                   options.max_train);
    read_idx_split(source_dir, "t10k", info, contents.test_images, contents.test_labels,
                   options.max_test);
  }
  return contents;
}

void convert_dataset(SourceFormat format, const std::string& source_dir,
                     const std::string& output_path, const ConvertOptions& options) {
  write_dataset_file(output_path, read_source_dataset(format, source_dir, options));
}

std::string describe_dataset_file(const std::string& path) {
  DatasetInfo info;
  {
    const DatasetFile file = DatasetFile::open(path);  // validates; serial
    info = file.info();
  }
  // What DatasetInfo does not carry: the storage layout and the format version.
  std::string chunks = "contiguous";
  int64_t format_version = 0;
  {
    h5::Lock lock;  // Note [HDF5 lock]
    h5::File file(H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)));
    h5::Dataset images(H5_CHECK(H5Dopen2(file.get(), "/train/images", H5P_DEFAULT)));
    h5::PropertyList layout(H5_CHECK(H5Dget_create_plist(images.get())));
    if (H5Pget_layout(layout.get()) == H5D_CHUNKED) {
      hsize_t chunk[4] = {};
      const int rank = H5_CHECK(H5Pget_chunk(layout.get(), 4, chunk));
      chunks.clear();
      uint64_t chunk_bytes = 1;
      for (int i = 0; i < rank; ++i) {
        chunks += (i ? "x" : "") + std::to_string(chunk[i]);
        chunk_bytes *= chunk[i];
      }
      chunks += " (" + std::to_string(chunk_bytes) + " bytes)";
      const int filters = H5_CHECK(H5Pget_nfilters(layout.get()));
      if (filters > 0) chunks += ", " + std::to_string(filters) + " filter(s)";
    }
    std::error_code error;
    const uintmax_t file_bytes = fs::file_size(path, error);
    const h5::AttributeReader attributes(file.get(), "", path + ": ", error ? 0 : file_bytes);
    if (attributes.has("format_version")) format_version = attributes.integer("format_version");
  }

  std::string text;
  text += path + "\n";
  text += "  source:          " + info.source + "\n";
  text += "  format version:  " +
          (format_version ? std::to_string(format_version) : std::string("(not set)")) + "\n";
  text += describe_samples(info);
  text += "  chunks:          /train/images " + chunks + "\n";
  return text;
}

}  // namespace hpc_train
