#include "fuzz_support.h"

#include <hdf5.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace hpc_train::fuzz {

namespace fs = std::filesystem;

namespace {

void remove_scratch_directory() {
  std::error_code ignored;
  fs::remove_all(scratch_directory(), ignored);
}

// Note [Several files in one input]: the input's files under `names` in a fresh scratch directory
// `directory_name`; returns the directory.
std::string write_input_files(const std::string& directory_name, const uint8_t* data, size_t size,
                              const std::vector<std::string>& names) {
  const std::string directory = scratch_path(directory_name);
  std::filesystem::remove_all(directory);
  std::filesystem::create_directory(directory);
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  for (const std::string& name : names) {
    const size_t separator = rest.find(kFileSeparator);
    write_file(directory + "/" + name, rest.substr(0, separator));
    if (separator == std::string_view::npos) break;  // the rest of the files do not exist
    rest.remove_prefix(separator + kFileSeparator.size());
  }
  return directory;
}

}  // namespace

const std::string& scratch_directory() {
  static const std::string directory = [] {
    const fs::path path =
        fs::temp_directory_path() / ("hpc_train_fuzz." + std::to_string(::getpid()));
    fs::create_directories(path);
    return path.string();
  }();
  // Registered after `directory` is complete, so that it runs before its destructor.
  static const bool remove_at_exit = std::atexit(remove_scratch_directory) == 0;
  (void)remove_at_exit;
  return directory;
}

std::string scratch_path(const std::string& name) {
  return (fs::path(scratch_directory()) / name).string();
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

void convert_input_files(SourceFormat format, const std::string& directory_name,
                         const uint8_t* data, size_t size, const std::vector<std::string>& names,
                         const std::function<void(const DatasetContents&)>& check) {
  const std::string directory = write_input_files(directory_name, data, size, names);
  parse_or_reject([&] { check(read_source_dataset(format, directory, ConvertOptions{})); });
}

namespace {

void check_cifar10_split(const DatasetInfo& info, const std::vector<uint8_t>& images,
                         const std::vector<int64_t>& labels) {
  fail_unless(images.size() == labels.size() * 3 * 32 * 32,
              "the image bytes are not labels x 3 x 32 x 32");
  for (int64_t label : labels)
    fail_unless(label >= 0 && label < info.num_classes, "a label outside the classes");
}

}  // namespace

void check_cifar10_contents(const DatasetContents& contents) {
  const DatasetInfo& info = contents.info;
  fail_unless(info.channels == 3 && info.height == 32 && info.width == 32,
              "the image shape is not 3x32x32");
  check_cifar10_split(info, contents.train_images, contents.train_labels);
  check_cifar10_split(info, contents.test_images, contents.test_labels);
}

void report_rejection(const Error& error) {
  static const bool verbose = std::getenv("HPC_TRAIN_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "fuzz: rejected: %s\n", error.what());
}

void fail_unless(bool holds, const std::string& what) {
  if (holds) return;
  std::fprintf(stderr, "fuzz: accepted input breaks a promise of the parser: %s\n", what.c_str());
  std::abort();
}

void require_no_open_hdf5_objects() {
  const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (open == 0) return;
  std::fprintf(stderr, "fuzz: %zd HDF5 object(s) left open after the parser returned\n", open);
  std::abort();
}

void prepare_hdf5() {
  H5open();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  // HDF5 allocates a metadata cache of over 512 KiB for every open file. Its free lists return
  // blocks that large to malloc, and under AddressSanitizer each came back as fresh, zeroed
  // pages: 65 inputs/s. Kept on HDF5's free lists instead, they are reused.
  H5set_free_list_limits(-1, -1, -1, -1, -1, -1);
}

std::optional<uint64_t> checked_product(uint64_t a, uint64_t b) {
  uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

}  // namespace hpc_train::fuzz
