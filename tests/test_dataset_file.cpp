// The dataset file and the loader, at 1, 2 and 3 ranks, with both kinds of file access (MPI-IO
// where HDF5 is parallel, and serial): exact round trips, closed-form mean/std, every kind of
// foreign file rejected alike on every rank (nothing hangs in the collective open), flipped bits
// in the string attributes refused or harmless, a write that fails or is killed part-way leaving
// no file under its name, and the
// loader's order, last batch, early stop and error path, with the main thread communicating while
// the loader thread reads.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "hpc_train/data/batch_loader.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/data/epoch_plan.h"
#include "hpc_train/error.h"
#include "hpc_train/io/reader_threads.h"
#include "hpc_train/monitor/storage_io.h"
#include "hpc_train/runtime/runtime.h"
#include "expect_error.h"
#include "file_accesses.h"
#include "mpi_world.h"

using namespace hpc_train;
namespace fs = std::filesystem;

namespace {

using test_support::world_rank;
using test_support::world_size;
using ::test_support::access_name;
using ::test_support::accesses;

constexpr int64_t kTrain = 37, kTest = 5, kChannels = 2, kHeight = 3, kWidth = 5, kClasses = 4;
constexpr int64_t kSampleBytes = kChannels * kHeight * kWidth;

uint8_t pixel(Split split, int64_t sample, int64_t offset) {
  return static_cast<uint8_t>(sample * 13 + offset * 7 + (split == Split::kTest ? 101 : 0));
}
int64_t label(Split split, int64_t sample) {
  return (sample * 7 + (split == Split::kTest ? 1 : 3)) % kClasses;
}

DatasetContents make_contents() {
  DatasetContents c;
  c.info.num_classes = kClasses;
  c.info.class_names = {"zero", "one", "two", "three"};
  c.info.channels = kChannels;
  c.info.height = kHeight;
  c.info.width = kWidth;
  c.info.source = "test_dataset_file";
  for (Split split : {Split::kTrain, Split::kTest}) {
    const bool train = split == Split::kTrain;
    auto& images = train ? c.train_images : c.test_images;
    auto& labels = train ? c.train_labels : c.test_labels;
    for (int64_t s = 0; s < (train ? kTrain : kTest); ++s) {
      labels.push_back(label(split, s));
      for (int64_t i = 0; i < kSampleBytes; ++i) images.push_back(pixel(split, s, i));
    }
  }
  return c;
}

// Contents of two classes "a" and "b" and images of C x H x W, no samples yet.
DatasetContents two_classes(int64_t channels, int64_t height, int64_t width) {
  DatasetContents c;
  c.info.num_classes = 2;
  c.info.class_names = {"a", "b"};
  c.info.channels = channels;
  c.info.height = height;
  c.info.width = width;
  return c;
}

void expect_sample(Split split, int64_t index, const uint8_t* image, int64_t got_label) {
  EXPECT_EQ(got_label, label(split, index)) << "sample " << index;
  for (int64_t i = 0; i < kSampleBytes; ++i)
    ASSERT_EQ(image[i], pixel(split, index, i)) << "sample " << index << ", byte " << i;
}

using ::test_support::expect_data_error;

// Opens `path` for writing with the plain HDF5 API and lets `edit` change it: this is how the
// foreign files below are made, bypassing every check of write_dataset_file.
void edit_file(const std::string& path, const std::function<void(hid_t)>& edit) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  edit(file);
  ASSERT_GE(H5Fclose(file), 0);
}

void replace_dataset(hid_t file, const char* name, hid_t type, std::vector<hsize_t> dims,
                     const void* data = nullptr) {
  ASSERT_GE(H5Ldelete(file, name, H5P_DEFAULT), 0);
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t dataset = H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(dataset, 0);
  if (data) {
    ASSERT_GE(H5Dwrite(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
  }
  H5Dclose(dataset);
  H5Sclose(space);
}

// A chunked dataset of `dims` that is never written: HDF5 stores no data for it, so a tiny
// file can declare a split of any size, even one whose byte count overflows 64 bits.
void replace_with_unwritten_dataset(hid_t file, const char* name, hid_t type,
                                    std::vector<hsize_t> dims) {
  ASSERT_GE(H5Ldelete(file, name, H5P_DEFAULT), 0);
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  std::vector<hsize_t> chunk(dims);
  chunk[0] = 16;
  const hid_t layout = H5Pcreate(H5P_DATASET_CREATE);
  ASSERT_GE(H5Pset_chunk(layout, static_cast<int>(chunk.size()), chunk.data()), 0);
  const hid_t dataset = H5Dcreate2(file, name, type, space, H5P_DEFAULT, layout, H5P_DEFAULT);
  ASSERT_GE(dataset, 0);
  H5Dclose(dataset);
  H5Pclose(layout);
  H5Sclose(space);
}

void write_label(hid_t file, const char* name, hsize_t index, int64_t value) {
  const hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
  const hid_t space = H5Dget_space(dataset);
  const hsize_t one = 1;
  H5Sselect_hyperslab(space, H5S_SELECT_SET, &index, nullptr, &one, nullptr);
  const hid_t memory = H5Screate_simple(1, &one, nullptr);
  EXPECT_GE(H5Dwrite(dataset, H5T_NATIVE_INT64, memory, space, H5P_DEFAULT, &value), 0);
  H5Sclose(memory);
  H5Sclose(space);
  H5Dclose(dataset);
}

void replace_integer_attribute(hid_t file, const char* name, int64_t value) {
  H5Adelete(file, name);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attribute = H5Acreate2(file, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(attribute, 0);
  H5Awrite(attribute, H5T_NATIVE_INT64, &value);
  H5Aclose(attribute);
  H5Sclose(space);
}

void replace_float_attribute(hid_t file, const char* name, std::vector<float> values) {
  ASSERT_GE(H5Adelete(file, name), 0);
  const hsize_t count = values.size();
  const hid_t space = H5Screate_simple(1, &count, nullptr);
  const hid_t attribute = H5Acreate2(file, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attribute, H5T_NATIVE_FLOAT, values.data());
  H5Aclose(attribute);
  H5Sclose(space);
}

// Fixed-length strings (not what we write): the reader accepts both kinds.
void replace_class_names(hid_t file, const std::vector<std::string>& names) {
  ASSERT_GE(H5Adelete(file, "class_names"), 0);
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, 8);
  std::vector<char> buffer(names.size() * 8, '\0');
  for (size_t i = 0; i < names.size(); ++i) names[i].copy(buffer.data() + 8 * i, 8);
  const hsize_t count = names.size();
  const hid_t space = H5Screate_simple(1, &count, nullptr);
  const hid_t attribute = H5Acreate2(file, "class_names", type, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attribute, type, buffer.data());
  H5Aclose(attribute);
  H5Sclose(space);
  H5Tclose(type);
}

// A directory shared by all ranks (rank 0 makes it) with a valid dataset file in it.
class DatasetFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir;
    if (world_rank() == 0) {
      std::string pattern = (fs::temp_directory_path() / "hpc_train_dataset_XXXXXX").string();
      if (mkdtemp(pattern.data())) dir = pattern;
    }
    dir_ = broadcast_string(MPI_COMM_WORLD, dir, 0);
    ASSERT_FALSE(dir_.empty());
    valid_ = path("valid.h5");
    if (world_rank() == 0) write_dataset_file(valid_, make_contents());
    MPI_Barrier(MPI_COMM_WORLD);
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(dir_);
  }

  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // A copy of the valid file, edited on rank 0, then visible to every rank.
  std::string foreign(const std::string& name, const std::function<void(hid_t)>& edit) {
    const std::string copy = path(name);
    if (world_rank() == 0) {
      fs::copy_file(valid_, copy, fs::copy_options::overwrite_existing);
      edit_file(copy, edit);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return copy;
  }

  std::string dir_;
  std::string valid_;
};

}  // namespace

TEST_F(DatasetFileTest, RoundTripExactBytes) {
  for (FileAccess access : accesses()) {
    SCOPED_TRACE(access_name(access));
    const DatasetFile file = DatasetFile::open(valid_, access, MPI_COMM_WORLD);
    const DatasetInfo& info = file.info();
    EXPECT_EQ(file.path(), valid_);
    EXPECT_EQ(info.train_size, kTrain);
    EXPECT_EQ(info.test_size, kTest);
    EXPECT_EQ(info.num_classes, kClasses);
    EXPECT_EQ(info.class_names, (std::vector<std::string>{"zero", "one", "two", "three"}));
    EXPECT_EQ(info.channels, kChannels);
    EXPECT_EQ(info.height, kHeight);
    EXPECT_EQ(info.width, kWidth);
    EXPECT_EQ(info.sample_bytes(), kSampleBytes);
    EXPECT_EQ(info.source, "test_dataset_file");

    // Any order, repeats, runs that cross chunk boundaries (16 samples a chunk).
    std::vector<int64_t> indices = {36, 0, 5, 5, 17, 36, 1, 2, 3, 4};
    for (int64_t i = 10; i < kTrain; ++i) indices.push_back(i);
    std::vector<uint8_t> images(indices.size() * kSampleBytes);
    std::vector<int64_t> labels(indices.size());
    file.read_samples(Split::kTrain, indices, images.data(), labels.data());
    for (size_t k = 0; k < indices.size(); ++k)
      expect_sample(Split::kTrain, indices[k], images.data() + k * kSampleBytes, labels[k]);

    // Increasing indices (a resident upload, evaluation's batches) are read straight into the
    // output, across chunk boundaries and with gaps.
    const std::vector<int64_t> increasing = {1, 2, 3, 15, 16, 17, 30, 31, kTrain - 1};
    file.read_samples(Split::kTrain, increasing, images.data(), labels.data());
    for (size_t k = 0; k < increasing.size(); ++k)
      expect_sample(Split::kTrain, increasing[k], images.data() + k * kSampleBytes, labels[k]);

    const std::vector<int64_t> test_indices = {4, 3, 2, 1, 0};
    file.read_samples(Split::kTest, test_indices, images.data(), labels.data());
    for (size_t k = 0; k < test_indices.size(); ++k)
      expect_sample(Split::kTest, test_indices[k], images.data() + k * kSampleBytes, labels[k]);

    file.read_samples(Split::kTrain, {}, nullptr, nullptr);  // nothing to do
  }
}

// Per channel, of the train images scaled to [0, 1]: channel 0 is half 0, half 255 (mean 0.5,
// std 0.5); channel 1 of sample s is 51 s for s = 0..3, i.e. 0, 0.2, 0.4, 0.6 (mean 0.3,
// std sqrt(0.05)).
TEST_F(DatasetFileTest, MeanStdClosedForm) {
  const std::string out = path("mean_std.h5");
  if (world_rank() == 0) {
    DatasetContents c = two_classes(2, 1, 2);
    for (int s = 0; s < 4; ++s) {
      c.train_images.insert(c.train_images.end(), {0, 255, static_cast<uint8_t>(51 * s),
                                                   static_cast<uint8_t>(51 * s)});
      c.train_labels.push_back(s % 2);
    }
    write_dataset_file(out, std::move(c));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const DatasetFile file = DatasetFile::open(out);
  ASSERT_EQ(file.info().mean.size(), 2u);
  EXPECT_NEAR(file.info().mean[0], 0.5, 1e-6);
  EXPECT_NEAR(file.info().std[0], 0.5, 1e-6);
  EXPECT_NEAR(file.info().mean[1], 0.3, 1e-6);
  EXPECT_NEAR(file.info().std[1], std::sqrt(0.05), 1e-6);
  EXPECT_EQ(file.info().test_size, 0);  // an empty test split is allowed
}

TEST_F(DatasetFileTest, WriteRejectsInconsistentContents) {
  if (world_rank() != 0) return;  // serial writer; nothing collective here
  const std::string out = path("bad.h5");
  auto expect_rejected = [&](const std::function<void(DatasetContents&)>& spoil,
                             std::initializer_list<std::string> parts) {
    DatasetContents c = make_contents();
    spoil(c);
    expect_data_error([&] { write_dataset_file(out, std::move(c)); }, parts);
  };
  expect_rejected([](DatasetContents& c) { c.train_images.pop_back(); },
                  {out, "train images have 1109 bytes, expected 1110"});
  expect_rejected([](DatasetContents& c) { c.test_labels.push_back(0); },
                  {out, "test images have 150 bytes, expected 180"});
  expect_rejected([](DatasetContents& c) { c.train_labels[2] = 4; },
                  {out, "train label[2] = 4 is outside [0, 4)"});
  expect_rejected([](DatasetContents& c) { c.info.class_names.pop_back(); },
                  {out, "3 class names for num_classes = 4"});
  expect_rejected(
      [](DatasetContents& c) {
        c.train_labels.clear();
        c.train_images.clear();
      },
      {out, "the train split is empty"});
  // Channel 1 is 200 in every pixel of every train image: its std is 0, which the reader
  // refuses (the test images do not count).
  expect_rejected(
      [](DatasetContents& c) {
        for (int64_t s = 0; s < kTrain; ++s)
          std::fill_n(c.train_images.begin() + s * kSampleBytes + kHeight * kWidth,
                      kHeight * kWidth, uint8_t{200});
      },
      {"cannot write " + out, "channel 1 has the same value in every pixel of every train "
                               "image (std 0)"});
  expect_rejected(
      [](DatasetContents& c) {
        c.info.channels = int64_t{1} << 40;
        c.info.height = int64_t{1} << 40;
      },
      {out, "image shape 1099511627776x1099511627776x5 (attributes channels, height, width): "
            "C x H x W bytes a sample overflows a 64-bit count"});
  // Nothing left behind: neither the final name nor the temporary one.
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir_)) left.push_back(entry.path().string());
  EXPECT_EQ(left, std::vector<std::string>{valid_});

  expect_data_error([&] { write_dataset_file(path("no/such/dir.h5"), make_contents()); },
                    {"cannot write", "no/such/dir.h5", "no such directory"});
  // A failure inside HDF5 (its temporary name is taken by a directory) names the file, the
  // call and HDF5's own reason.
  fs::create_directory(out + ".partial-" + std::to_string(getpid()));
  expect_data_error([&] { write_dataset_file(out, make_contents()); },
                    {"cannot write " + out, "H5Fcreate", "unable to create file"});
}

// Runs write_dataset_file(out, make_contents()) in a child process whose files cannot grow past
// `limit_bytes` (RLIMIT_FSIZE: as if the disk filled up there). With `killed`, the first write
// past the limit kills the child (SIGXFSZ); else it fails (EFBIG) and the child reports the
// DataError. In a child because HDF5 1.10 crashes when it terminates after a file's close has
// failed, as a close must when its writes fail: the child ends with _exit, before that. Returns
// what the child reported: its error message, "" for a write that succeeded, or "killed by
// signal N".
std::string write_in_child(const std::string& out, uintmax_t limit_bytes, bool killed) {
  int pipe_ends[2];
  if (pipe(pipe_ends) != 0) return "pipe failed";
  const pid_t child = fork();
  if (child < 0) return "fork failed";
  if (child == 0) {
    close(pipe_ends[0]);
    std::string message;
    rlimit limit{};
    getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = limit_bytes;
    if (!killed) std::signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) message = "setrlimit failed";
    try {
      if (message.empty()) write_dataset_file(out, make_contents());
    } catch (const std::exception& e) {
      message = e.what();
    }
    (void)!write(pipe_ends[1], message.data(), message.size());
    _exit(0);
  }
  close(pipe_ends[1]);
  std::string message;
  char buffer[4096];
  for (ssize_t n; (n = read(pipe_ends[0], buffer, sizeof buffer)) > 0;) message.append(buffer, n);
  close(pipe_ends[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return message;
}

// Note [Atomic file write]: a write that fails part-way (the disk is full: at every point of the
// file in turn) throws a DataError naming the file and leaves neither the final name nor the
// temporary file; one killed part-way leaves no file under the final name.
TEST_F(DatasetFileTest, AWriteThatFailsOrIsKilledPartWayLeavesNoFile) {
  if (world_rank() != 0) return;  // serial writer; nothing collective here
  const std::string out = path("full_disk.h5");
  const uintmax_t complete_bytes = fs::file_size(valid_);  // what make_contents() takes
  auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  int kills = 0;
  for (uintmax_t point = 0; point < 16; ++point) {  // 16 points spread over the file
    const uintmax_t limit = complete_bytes * point / 16;
    SCOPED_TRACE("room for " + std::to_string(limit) + " of " + std::to_string(complete_bytes) +
                 " bytes");
    const std::string failed = write_in_child(out, limit, false);
    EXPECT_NE(failed.find("cannot write " + out), std::string::npos) << "child: " << failed;
    EXPECT_EQ(listing(), std::vector<std::string>{valid_});

    const std::string killed = write_in_child(out, limit, true);
    EXPECT_EQ(killed, "killed by signal " + std::to_string(SIGXFSZ));
    EXPECT_FALSE(fs::exists(out));
    for (const std::string& name : listing()) {  // at most the killed write's temporary file
      if (name == valid_) continue;
      EXPECT_EQ(name.rfind(out + ".partial-", 0), 0u) << name;
      fs::remove(name);
      ++kills;
    }
    if (HasFailure()) break;
  }
  EXPECT_GE(kills, 3);  // the kills came part-way, after the temporary file was made
  // With room for it the same write succeeds, and reads back.
  EXPECT_EQ(write_in_child(out, complete_bytes, false), "");
  EXPECT_EQ(fs::file_size(out), complete_bytes);
  EXPECT_EQ(DatasetFile::open(out).info().train_size, kTrain);
}

// Every rank sees the same bad file and throws the same DataError; with MPI-IO nobody is left
// waiting in the collective open or close.
TEST_F(DatasetFileTest, OpenRejectsForeignFiles) {
  const std::string directory = path("a_directory.h5");
  const std::string text = path("text.h5");
  if (world_rank() == 0) {
    fs::create_directory(directory);
    std::ofstream(text) << "not an HDF5 file\n";
  }
  MPI_Barrier(MPI_COMM_WORLD);

  const uint8_t image_bytes[kTrain * kSampleBytes] = {};
  const float float_images[kTrain * kSampleBytes] = {};
  std::vector<int64_t> short_labels(kTrain - 1, 0);
  std::vector<int32_t> int32_labels;
  for (int64_t s = 0; s < kTrain; ++s) int32_labels.push_back(static_cast<int32_t>(label(Split::kTrain, s)));

  struct Case {
    std::string file;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {path("missing.h5"), {"missing.h5: no such file"}},
      {directory, {"a_directory.h5: is a directory"}},
      {text, {"text.h5: not an HDF5 file"}},
      {foreign("no_images.h5", [](hid_t f) { H5Ldelete(f, "/train/images", H5P_DEFAULT); }),
       {"no_images.h5: missing dataset /train/images"}},
      {foreign("no_test.h5", [](hid_t f) { H5Ldelete(f, "/test", H5P_DEFAULT); }),
       {"no_test.h5: missing group /test"}},
      {foreign("float_images.h5",
               [&](hid_t f) {
                 replace_dataset(f, "/train/images", H5T_NATIVE_FLOAT,
                                 {kTrain, kChannels, kHeight, kWidth}, float_images);
               }),
       {"float_images.h5: /train/images has dtype 32-bit float",
        "expected 8-bit unsigned integer"}},
      {foreign("rank3.h5",
               [&](hid_t f) {
                 replace_dataset(f, "/train/images", H5T_NATIVE_UINT8,
                                 {kTrain, kChannels * kHeight, kWidth}, image_bytes);
               }),
       {"rank3.h5: /train/images has shape 37x6x5, expected 4-D [N, C, H, W]"}},
      {foreign("height.h5", [](hid_t f) { replace_integer_attribute(f, "height", 4); }),
       {"height.h5: /train/images has shape 37x2x3x5",
        "attributes channels, height, width say 2x4x5"}},
      {foreign("short_labels.h5",
               [&](hid_t f) {
                 replace_dataset(f, "/train/labels", H5T_NATIVE_INT64, {kTrain - 1},
                                 short_labels.data());
               }),
       {"short_labels.h5: /train/labels has 36 labels but /train/images has 37 samples"}},
      {foreign("float_labels.h5",
               [&](hid_t f) {
                 replace_dataset(f, "/test/labels", H5T_NATIVE_FLOAT, {kTest}, float_images);
               }),
       {"float_labels.h5: /test/labels has dtype 32-bit float, expected integers"}},
      {foreign("names.h5", [](hid_t f) { replace_class_names(f, {"a", "b", "c"}); }),
       {"names.h5: class_names has 3 names but num_classes = 4"}},
      {foreign("one_class.h5", [](hid_t f) { replace_integer_attribute(f, "num_classes", 1); }),
       {"one_class.h5: num_classes = 1, expected at least 2"}},
      {foreign("no_mean.h5", [](hid_t f) { H5Adelete(f, "mean"); }),
       {"no_mean.h5: missing attribute 'mean'"}},
      {foreign("std.h5", [](hid_t f) { replace_float_attribute(f, "std", {0.5f}); }),
       {"std.h5: attribute 'std' has 1 values but channels = 2"}},
      {foreign("version.h5", [](hid_t f) { replace_integer_attribute(f, "format_version", 2); }),
       {"version.h5: format_version 2"}},
      {foreign("empty_train.h5",
               [](hid_t f) {
                 replace_dataset(f, "/train/images", H5T_NATIVE_UINT8,
                                 {0, kChannels, kHeight, kWidth});
                 replace_dataset(f, "/train/labels", H5T_NATIVE_INT64, {0});
               }),
       {"empty_train.h5: the train split is empty"}},
  };
  for (FileAccess access : accesses()) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(access_name(access)) + ": " + c.file);
      try {
        DatasetFile::open(c.file, access, MPI_COMM_WORLD);
        ADD_FAILURE() << "no DataError thrown";
      } catch (const DataError& e) {
        for (const std::string& part : c.parts)
          EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
              << "message: " << e.what() << "\nmissing: " << part;
      }
    }
    // Still usable afterwards, and other integer label types and fixed-length names are fine.
    const std::string int32 = foreign(std::string("int32_") + access_name(access) + ".h5", [&](hid_t f) {
      replace_dataset(f, "/train/labels", H5T_NATIVE_INT32, {kTrain}, int32_labels.data());
      replace_class_names(f, {"zero", "one", "two", "three"});
    });
    const DatasetFile file = DatasetFile::open(int32, access, MPI_COMM_WORLD);
    EXPECT_EQ(file.info().class_names, (std::vector<std::string>{"zero", "one", "two", "three"}));
    std::vector<uint8_t> images(kSampleBytes);
    int64_t got = -1;
    file.read_samples(Split::kTrain, {30}, images.data(), &got);
    expect_sample(Split::kTrain, 30, images.data(), got);
  }
}

TEST_F(DatasetFileTest, ReadRejectsBadIndex) {
  std::vector<uint8_t> images(3 * kSampleBytes);
  std::vector<int64_t> labels(3);
  for (FileAccess access : accesses()) {
    SCOPED_TRACE(access_name(access));
    const DatasetFile file = DatasetFile::open(valid_, access, MPI_COMM_WORLD);
    expect_data_error(
        [&] { file.read_samples(Split::kTrain, {1, 37, 2}, images.data(), labels.data()); },
        {"valid.h5: index 37 is outside /train (37 samples)"});
    expect_data_error(
        [&] { file.read_samples(Split::kTest, {-1}, images.data(), labels.data()); },
        {"index -1 is outside /test (5 samples)"});
    file.read_samples(Split::kTrain, {19, 21, 0}, images.data(), labels.data());  // fine
    expect_sample(Split::kTrain, 21, images.data() + kSampleBytes, labels[1]);
  }
}

// What open() refuses beyond the layout: every label of both splits out of [0, num_classes),
// wherever it sits (the last train sample, a test sample: reads of the first steps would not
// meet them); mean/std that would make the inputs inf or NaN; byte counts that overflow 64 bits;
// labels that could not fit in memory. Every rank alike, nothing hangs.
TEST_F(DatasetFileTest, OpenChecksEveryLabelAttributesAndSizes) {
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  const int64_t big = int64_t{1} << 32;
  struct Case {
    std::string file;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {foreign("last_train_label.h5", [](hid_t f) { write_label(f, "/train/labels", 36, 4); }),
       {"last_train_label.h5: /train/labels[36] = 4 is outside [0, 4)"}},
      {foreign("test_label.h5", [](hid_t f) { write_label(f, "/test/labels", 3, -1); }),
       {"test_label.h5: /test/labels[3] = -1 is outside [0, 4)"}},
      {foreign("std_zero.h5", [](hid_t f) { replace_float_attribute(f, "std", {0.5f, 0.0f}); }),
       {"std_zero.h5: attribute 'std'[1] = 0, expected a finite number > 0"}},
      {foreign("std_nan.h5", [&](hid_t f) { replace_float_attribute(f, "std", {nan, 0.5f}); }),
       {"std_nan.h5: attribute 'std'[0] = nan, expected a finite number > 0"}},
      {foreign("std_negative.h5",
               [](hid_t f) { replace_float_attribute(f, "std", {0.5f, -0.25f}); }),
       {"std_negative.h5: attribute 'std'[1] = -0.25, expected a finite number > 0"}},
      {foreign("std_inf.h5", [&](hid_t f) { replace_float_attribute(f, "std", {inf, 0.5f}); }),
       {"std_inf.h5: attribute 'std'[0] = inf"}},
      {foreign("mean_nan.h5", [&](hid_t f) { replace_float_attribute(f, "mean", {0.5f, nan}); }),
       {"mean_nan.h5: attribute 'mean'[1] = nan, expected a finite number"}},
      {foreign("mean_inf.h5", [&](hid_t f) { replace_float_attribute(f, "mean", {-inf, 0.5f}); }),
       {"mean_inf.h5: attribute 'mean'[0] = -inf, expected a finite number"}},
      {foreign("sample_overflow.h5",
               [&](hid_t f) {
                 replace_integer_attribute(f, "channels", big);
                 replace_integer_attribute(f, "height", big);
               }),
       {"sample_overflow.h5: image shape 4294967296x4294967296x5 (attributes channels, height, "
        "width): C x H x W bytes a sample overflows a 64-bit count"}},
      {foreign("split_overflow.h5",
               [](hid_t f) {
                 const hsize_t n = hsize_t{1} << 62;
                 replace_with_unwritten_dataset(f, "/train/images", H5T_STD_U8LE,
                                                {n, kChannels, kHeight, kWidth});
                 replace_with_unwritten_dataset(f, "/train/labels", H5T_STD_I64LE, {n});
               }),
       {"split_overflow.h5: /train/images has shape 4611686018427387904x2x3x5: N x C x H x W "
        "bytes (and 8 bytes of label a sample) overflows a 64-bit count"}},
      {foreign("huge_split.h5",
               [](hid_t f) {
                 const hsize_t n = hsize_t{1} << 50;  // 8 PiB of labels
                 replace_with_unwritten_dataset(f, "/test/images", H5T_STD_U8LE,
                                                {n, kChannels, kHeight, kWidth});
                 replace_with_unwritten_dataset(f, "/test/labels", H5T_STD_I64LE, {n});
               }),
       {"huge_split.h5: /test/labels has 1125899906842624 labels: reading them (8 PiB) needs "
        "more than this node's memory"}},
  };
  for (FileAccess access : accesses()) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(access_name(access)) + ": " + c.file);
      expect_data_error([&] { DatasetFile::open(c.file, access, MPI_COMM_WORLD); },
                        {c.parts.begin(), c.parts.end()});
    }
  }
}

// Each rank loads its part of an epoch while the main thread does MPI collectives between
// batches (the trainer's pattern: the reads on the loader thread need MPI_THREAD_MULTIPLE).
TEST_F(DatasetFileTest, LoaderDeliversThePlanInOrder) {
  for (FileAccess access : accesses()) {
    SCOPED_TRACE(access_name(access));
    const DatasetFile file = DatasetFile::open(valid_, access, MPI_COMM_WORLD);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      const std::vector<int64_t> plan = rank_epoch_indices(
          5, epoch, kTrain, world_size(), world_rank(), EpochTail::kPad, true);
      const int64_t batch_size = 4;
      BatchLoader loader(file, Split::kTrain, plan, batch_size, 2);
      ASSERT_EQ(loader.num_batches(), (static_cast<int64_t>(plan.size()) + 3) / 4);
      HostBatch batch;
      int64_t expected_index = 0, seen = 0;
      while (loader.next(batch)) {
        EXPECT_EQ(batch.index_in_epoch, expected_index++);
        const int64_t expected_size =
            std::min<int64_t>(batch_size, static_cast<int64_t>(plan.size()) - seen);
        ASSERT_EQ(batch.size, expected_size);  // the last batch is partial
        ASSERT_EQ(batch.images.size(), static_cast<size_t>(batch.size * kSampleBytes));
        for (int64_t k = 0; k < batch.size; ++k)
          expect_sample(Split::kTrain, plan[seen + k], batch.images.data() + k * kSampleBytes,
                        batch.labels[k]);
        seen += batch.size;
        int64_t total = 0;
        MPI_Allreduce(&seen, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
      }
      EXPECT_EQ(seen, static_cast<int64_t>(plan.size()));
      EXPECT_FALSE(loader.next(batch));
      EXPECT_GE(loader.wait_ms(), 0.0);
    }
    // An empty plan: no batches, no thread trouble.
    BatchLoader empty(file, Split::kTest, {}, 4, 1);
    HostBatch batch;
    EXPECT_EQ(empty.num_batches(), 0);
    EXPECT_FALSE(empty.next(batch));
  }
}

TEST_F(DatasetFileTest, LoaderStopsEarlyWithoutHanging) {
  for (FileAccess access : accesses()) {
    SCOPED_TRACE(access_name(access));
    const DatasetFile file = DatasetFile::open(valid_, access, MPI_COMM_WORLD);
    std::vector<int64_t> plan;
    for (int repeat = 0; repeat < 200; ++repeat)
      for (int64_t i = 0; i < kTrain; ++i) plan.push_back(i);
    const auto start = std::chrono::steady_clock::now();
    for (int taken = 0; taken < 3; ++taken) {
      BatchLoader loader(file, Split::kTrain, plan, 1, 1 + taken);
      HostBatch batch;
      for (int k = 0; k < taken; ++k) ASSERT_TRUE(loader.next(batch));
    }  // destroyed with thousands of batches left
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  }
}

TEST_F(DatasetFileTest, LoaderRethrowsErrorsFromItsThread) {
  for (FileAccess access : accesses()) {
    SCOPED_TRACE(access_name(access));
    const DatasetFile file = DatasetFile::open(valid_, access, MPI_COMM_WORLD);
    BatchLoader loader(file, Split::kTrain, {0, 1, 2, 3, 4, 5, 99, 7}, 2, 4);
    HostBatch batch;
    ASSERT_TRUE(loader.next(batch));  // batches before the bad one still arrive, in order
    ASSERT_TRUE(loader.next(batch));
    ASSERT_TRUE(loader.next(batch));
    EXPECT_EQ(batch.index_in_epoch, 2);
    expect_data_error([&] { loader.next(batch); }, {"index 99 is outside /train (37 samples)"});
    EXPECT_THROW(loader.next(batch), DataError);  // and again, not a hang
  }
}

TEST_F(DatasetFileTest, LoaderRejectsBadArguments) {
  const DatasetFile file = DatasetFile::open(valid_);
  EXPECT_THROW(BatchLoader(file, Split::kTrain, {0, 1}, 0, 1), Error);
  EXPECT_THROW(BatchLoader(file, Split::kTrain, {0, 1}, 2, 0), Error);
}

// HDF5 writes an attribute of 2^61 + 3 variable-length strings (16 x that many bytes wraps to 48
// in its own size check); the reader must not try to allocate them.
TEST_F(DatasetFileTest, OpenRejectsAttributesLargerThanTheFile) {
  const std::string huge = foreign("huge_names.h5", [](hid_t f) {
    ASSERT_GE(H5Adelete(f, "class_names"), 0);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    const hsize_t count = (hsize_t{1} << 61) + 3;
    const hid_t space = H5Screate_simple(1, &count, nullptr);
    const hid_t attribute = H5Acreate2(f, "class_names", type, space, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(attribute, 0);
    H5Aclose(attribute);
    H5Sclose(space);
    H5Tclose(type);
  });
  for (FileAccess access : accesses()) {
    SCOPED_TRACE(access_name(access));
    expect_data_error([&] { DatasetFile::open(huge, access, MPI_COMM_WORLD); },
                      {"huge_names.h5: attribute 'class_names' claims 2305843009213693955 values",
                       "more than the file holds"});
  }
}

// Note [Variable-length strings read here]: single flipped bits in the string attributes'
// descriptors, in the attribute messages before them and in the global heap's first objects made
// HDF5 1.10 segfault or allocate and clear gigabytes inside H5Aread. Each such file now opens
// (the bit was harmless) or is refused with an hpc_train Error; anything else fails the test.
TEST_F(DatasetFileTest, FlippedBitsInTheStringsAreRefusedOrHarmless) {
  if (world_rank() != 0) return;
  const std::vector<uint8_t> bytes = test_support::read_bytes(valid_);
  const std::string text(bytes.begin(), bytes.end());
  const size_t heap = text.find("GCOL");  // the one global heap collection: the strings' bytes
  ASSERT_NE(heap, std::string::npos);
  // A descriptor: the string's length (4 bytes), the heap's address (8), the object's index (4).
  auto descriptor_of = [&](uint64_t length) {
    std::string start(12, '\0');
    for (size_t i = 0; i < 4; ++i) start[i] = static_cast<char>((length >> (8 * i)) & 0xff);
    for (size_t i = 0; i < 8; ++i) start[4 + i] = static_cast<char>((heap >> (8 * i)) & 0xff);
    const size_t at = text.find(start);
    EXPECT_NE(at, std::string::npos) << "no descriptor of a string of " << length << " bytes";
    return at;
  };
  const size_t names = descriptor_of(4);    // class_names: "zero", "one", "two", "three"
  const size_t source = descriptor_of(17);  // "test_dataset_file"
  ASSERT_TRUE(names != std::string::npos && source != std::string::npos);
  const size_t first = std::min(names, source), last = std::max(names + 4 * 16, source + 16);
  ASSERT_GE(first, 100u);
  ASSERT_LT(last, heap);
  int64_t opened = 0, refused = 0;
  for (const auto& [begin, end] : {std::pair{first - 100, last}, std::pair{heap, heap + 160}})
    for (size_t offset = begin; offset < end; ++offset)
      for (int bit = 0; bit < 8; ++bit) {
        std::vector<uint8_t> flipped = bytes;
        flipped[offset] ^= static_cast<uint8_t>(1 << bit);
        test_support::write_bytes(path("flipped.h5"), flipped);
        try {
          DatasetFile::open(path("flipped.h5"));
          ++opened;
        } catch (const Error&) {
          ++refused;
        }
      }
  EXPECT_GT(opened, 0);
  EXPECT_GT(refused, 0);
  std::printf("flipped bits: %lld files opened, %lld refused\n", static_cast<long long>(opened),
              static_cast<long long>(refused));
}

// Labels that the file declares but does not hold read as zeros: a 20 kB file that declared 2^27
// samples made open allocate 1 GiB for them. Here 37 unwritten labels, the same case made small.
TEST_F(DatasetFileTest, OpenRejectsLabelsTheFileDoesNotHold) {
  const std::string unwritten = foreign("unwritten_labels.h5", [](hid_t f) {
    replace_dataset(f, "/train/labels", H5T_STD_I64LE, {kTrain});
  });
  for (FileAccess access : accesses()) {
    SCOPED_TRACE(access_name(access));
    expect_data_error([&] { DatasetFile::open(unwritten, access, MPI_COMM_WORLD); },
                      {"unwritten_labels.h5: /train/labels declares 37 labels",
                       "the file does not hold them all"});
  }
}

// Note [Reading only the samples]: a sample read asks the file system for its own bytes, not
// for the rest of its chunk. Samples of 3x32x32 (3 KiB), 16 to a chunk (48 KiB): a chunk cache
// would read the whole chunk for one sample. The bytes asked for are read calls' (rchar),
// independent of what the page cache holds; with MPI-IO too.
TEST_F(DatasetFileTest, ASampleReadReadsOnlyItsBytes) {
  DatasetContents contents = two_classes(3, 32, 32);
  const int64_t sample_bytes = contents.info.sample_bytes();
  for (int64_t s = 0; s < 32; ++s) {
    contents.train_labels.push_back(s % 2);
    for (int64_t i = 0; i < sample_bytes; ++i)
      contents.train_images.push_back(static_cast<uint8_t>(s + i));
  }
  const std::string cifar_shaped = path("cifar_shaped.h5");
  if (world_rank() == 0) write_dataset_file(cifar_shaped, contents);
  MPI_Barrier(MPI_COMM_WORLD);
  for (FileAccess access : accesses()) {
    SCOPED_TRACE(access_name(access));
    const DatasetFile file = DatasetFile::open(cifar_shaped, access, MPI_COMM_WORLD);
    std::vector<uint8_t> image(static_cast<size_t>(sample_bytes));
    int64_t label_read = 0;
    // The first read of a chunk may read its index (metadata): read chunk 1 first.
    file.read_samples(Split::kTrain, {20}, image.data(), &label_read);
    const std::optional<StorageReadBytes> before = process_storage_reads();
    file.read_samples(Split::kTrain, {1}, image.data(), &label_read);
    const std::optional<StorageReadBytes> read =
        storage_reads_between(before, process_storage_reads());
    ASSERT_TRUE(read) << "/proc/self/io is not readable here";
    // Reading /proc/self/io itself goes through read() too: a page's worth of slack.
    EXPECT_GE(read->syscall_read_bytes, sample_bytes);
    EXPECT_LE(read->syscall_read_bytes, sample_bytes + 4096);
    EXPECT_EQ(image[0], 1);
    EXPECT_EQ(image[static_cast<size_t>(sample_bytes) - 1], static_cast<uint8_t>(sample_bytes));
  }
}

// Note [Reads in flight]: a batch read with several reads in flight gives the bytes and labels of
// reading them one after another, and a file cut short under an open dataset fails with the same
// DataError (file, split, byte offset) whatever the count: the first failing read in order.
TEST_F(DatasetFileTest, ReadsInFlightEqualReadsInTurn) {
  DatasetContents contents = two_classes(3, 16, 16);  // 768-byte samples, 16 to a chunk
  const int64_t sample_bytes = contents.info.sample_bytes();
  const int64_t samples = 200;
  for (int64_t s = 0; s < samples; ++s) {
    contents.train_labels.push_back(s % 2);
    for (int64_t i = 0; i < sample_bytes; ++i)
      contents.train_images.push_back(static_cast<uint8_t>(s * 31 + i * 7));
  }
  const std::string whole = path("in_flight.h5");
  const std::string cut = path("cut_short.h5");
  if (world_rank() == 0) {
    write_dataset_file(whole, contents);
    fs::copy_file(whole, cut);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Every sample, shuffled, some twice (runs of neighbours too), as an epoch's batch would be.
  std::vector<int64_t> indices = rank_epoch_indices(world_rank() + 1, 0, samples, 1, 0,
                                                    EpochTail::kPad, true);
  indices.insert(indices.end(), {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 7});
  const size_t batch_bytes = indices.size() * static_cast<size_t>(sample_bytes);
  const std::vector<int> counts = {1, 3, kMaxReaderThreads};
  for (FileAccess access : accesses()) {
    SCOPED_TRACE(access_name(access));
    std::vector<uint8_t> in_turn;
    for (int reads_in_flight : counts) {
      SCOPED_TRACE("reads in flight: " + std::to_string(reads_in_flight));
      const DatasetFile file = DatasetFile::open(whole, access, MPI_COMM_WORLD, reads_in_flight);
      std::vector<uint8_t> images(batch_bytes);
      std::vector<int64_t> labels(indices.size());
      file.read_samples(Split::kTrain, indices, images.data(), labels.data());
      for (size_t k = 0; k < indices.size(); ++k) ASSERT_EQ(labels[k], indices[k] % 2);
      if (in_turn.empty()) {
        in_turn = images;
        for (size_t k = 0; k < indices.size(); ++k)
          ASSERT_TRUE(std::equal(images.begin() + k * sample_bytes,
                                 images.begin() + (k + 1) * sample_bytes,
                                 contents.train_images.begin() + indices[k] * sample_bytes));
      }
      EXPECT_EQ(images, in_turn);  // bitwise
    }

    // Opened and read once (every chunk's address known), then cut to half its size: the reads
    // of the samples beyond the cut find the file's end.
    std::vector<DatasetFile> files;
    for (int reads_in_flight : counts) {
      files.push_back(DatasetFile::open(cut, access, MPI_COMM_WORLD, reads_in_flight));
      std::vector<uint8_t> images(batch_bytes);
      std::vector<int64_t> labels(indices.size());
      files.back().read_samples(Split::kTrain, indices, images.data(), labels.data());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const uintmax_t cut_bytes = fs::file_size(whole) / 2;
    if (world_rank() == 0) fs::resize_file(cut, cut_bytes);
    MPI_Barrier(MPI_COMM_WORLD);
    std::string first_message;
    for (size_t f = 0; f < files.size(); ++f) {
      SCOPED_TRACE("reads in flight: " + std::to_string(counts[f]));
      std::vector<uint8_t> images(batch_bytes);
      std::vector<int64_t> labels(indices.size());
      const std::string message = test_support::data_error_naming(
          cut, [&] { files[f].read_samples(Split::kTrain, indices, images.data(), labels.data()); });
      const std::string at = ": reading /train/images at byte ";
      ASSERT_EQ(message.rfind(cut + at, 0), 0u) << message;
      EXPECT_GE(std::stoull(message.substr(cut.size() + at.size())), cut_bytes) << message;
      EXPECT_NE(message.find("the file ends there (truncated?)"), std::string::npos) << message;
      if (f == 0) first_message = message;
      EXPECT_EQ(message, first_message);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    files.clear();  // collective closes with MPI-IO
    if (world_rank() == 0) fs::copy_file(whole, cut, fs::copy_options::overwrite_existing);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_F(DatasetFileTest, OpenRejectsAThreadCountOutOfRange) {
  for (int reads_in_flight : {kMinReaderThreads - 1, kMaxReaderThreads + 1})
    EXPECT_THROW(DatasetFile::open(valid_, FileAccess::kSerial, MPI_COMM_NULL, reads_in_flight),
                 Error);
}

TEST(FileAccessChoice, PreferredAccess) {
  EXPECT_EQ(preferred_file_access(false), FileAccess::kSerial);
#if defined(HPC_TRAIN_HDF5_PARALLEL) && defined(H5_HAVE_PARALLEL)
  EXPECT_EQ(preferred_file_access(true), FileAccess::kMpiIo);
#else
  EXPECT_EQ(preferred_file_access(true), FileAccess::kSerial);
#endif
}
