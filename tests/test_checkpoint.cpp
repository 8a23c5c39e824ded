// Checkpoint files at 1 and 3 ranks: written by every rank at once (MPI-IO, each rank its share of
// an optimizer state whose length does not divide by 3) and by rank 0 alone, they read back
// bitwise; a failed write leaves the previous file; a checkpoint that does not fit the run is
// refused naming both sides; find_latest_checkpoint and prune_checkpoints pick by step and deal
// with temporary and broken files; every kind of bad file gives a DataError naming it; the
// weights export holds the model's tensors and metadata.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <thread>

#include "example_checkpoints.h"
#include "hpc_train/io/checkpoint.h"
#include "hpc_train/io/checkpoint_files.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/error.h"
#include "hpc_train/runtime/runtime.h"
#include "hpc_train/io/safetensors.h"
#include "expect_error.h"
#include "mpi_world.h"

using namespace hpc_train;
namespace fs = std::filesystem;

namespace {

using ::test_support::world_rank;
using hpc_train::test_support::random_bytes;
using hpc_train::test_support::realistic_checkpoint;

#if defined(HPC_TRAIN_HDF5_PARALLEL) && defined(H5_HAVE_PARALLEL)
constexpr bool kParallelHdf5 = true;
#else
constexpr bool kParallelHdf5 = false;
#endif

constexpr size_t kOptimizerElements = hpc_train::test_support::kRealisticOptimizerElements;

using ::test_support::read_bytes;
using ::test_support::write_bytes;

// A small checkpoint of `step` for the tests of directories.
Checkpoint small_checkpoint(int64_t step) {
  Checkpoint c = realistic_checkpoint(static_cast<uint64_t>(step), 1000);
  c.position.global_step = step;
  return c;
}

void expect_same_floats(const std::vector<float>& actual, const std::vector<float>& expected,
                        const char* name) {
  ASSERT_EQ(actual.size(), expected.size()) << name;
  EXPECT_EQ(0, std::memcmp(actual.data(), expected.data(), actual.size() * sizeof(float)))
      << name << " differs bitwise";
}

void expect_bitwise_equal(const Checkpoint& actual, const Checkpoint& expected) {
  EXPECT_EQ(actual.format_version, kCheckpointFormatVersion);
  EXPECT_EQ(actual.model, expected.model);
  EXPECT_EQ(actual.channels, expected.channels);
  EXPECT_EQ(actual.height, expected.height);
  EXPECT_EQ(actual.width, expected.width);
  EXPECT_EQ(actual.num_classes, expected.num_classes);
  EXPECT_EQ(actual.precision, expected.precision);
  EXPECT_EQ(actual.zero_stage, expected.zero_stage);
  EXPECT_EQ(actual.world_size, expected.world_size);
  EXPECT_EQ(actual.config_ini, expected.config_ini);
  EXPECT_EQ(actual.position.global_step, expected.position.global_step);
  EXPECT_EQ(actual.position.micro_step, expected.position.micro_step);
  EXPECT_EQ(actual.position.epoch, expected.position.epoch);
  EXPECT_EQ(actual.position.micro_steps_in_epoch, expected.position.micro_steps_in_epoch);
  EXPECT_EQ(actual.position.skipped_steps, expected.position.skipped_steps);
  EXPECT_EQ(actual.position.samples_in_epoch, expected.position.samples_in_epoch);
  EXPECT_EQ(actual.position.micro_batch, expected.position.micro_batch);
  EXPECT_EQ(actual.position.grad_accum, expected.position.grad_accum);
  EXPECT_EQ(actual.loss_scaler_dynamic, expected.loss_scaler_dynamic);
  EXPECT_EQ(actual.optimizer_steps, expected.optimizer_steps);
  EXPECT_EQ(actual.has_loss_scaler, expected.has_loss_scaler);
  EXPECT_EQ(actual.loss_scaler.scale, expected.loss_scaler.scale);
  EXPECT_EQ(actual.loss_scaler.hysteresis_left, expected.loss_scaler.hysteresis_left);
  EXPECT_EQ(actual.loss_scaler.steps, expected.loss_scaler.steps);
  EXPECT_EQ(actual.loss_scaler.last_overflow_step, expected.loss_scaler.last_overflow_step);
  EXPECT_EQ(actual.loss_scaler.skipped_steps, expected.loss_scaler.skipped_steps);
  EXPECT_EQ(actual.rng_state, expected.rng_state);
  EXPECT_EQ(actual.cuda_rng_state, expected.cuda_rng_state);
  ASSERT_EQ(actual.model_state.size(), expected.model_state.size());
  for (size_t i = 0; i < actual.model_state.size(); ++i) {
    const CheckpointTensor& a = actual.model_state[i];
    const CheckpointTensor& e = expected.model_state[i];
    EXPECT_EQ(a.name, e.name) << "model tensor " << i;
    EXPECT_EQ(a.dtype, e.dtype) << e.name;
    EXPECT_EQ(a.shape, e.shape) << e.name;
    EXPECT_EQ(a.data, e.data) << e.name;
  }
  expect_same_floats(actual.master, expected.master, "master");
  expect_same_floats(actual.exp_avg, expected.exp_avg, "exp_avg");
  expect_same_floats(actual.exp_avg_sq, expected.exp_avg_sq, "exp_avg_sq");
}

// Runs `f`, expecting an exception of type E whose message contains every one of `parts`.
template <typename E, typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning " << *parts.begin();
  } catch (const E& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message lacks '" << part << "': " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

void expect_data_error(const std::string& path, std::initializer_list<std::string> parts) {
  try {
    read_checkpoint(path);
    ADD_FAILURE() << "read_checkpoint(" << path << ") succeeded";
  } catch (const DataError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(path, 0), 0u) << "message does not start with the file: " << message;
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos)
          << "message lacks '" << part << "': " << message;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a DataError: " << e.what();
  }
}

// Opens `path` read-write with plain HDF5 calls and lets `edit` change it, bypassing the writer.
void edit_file(const std::string& path, const std::function<void(hid_t)>& edit) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0) << path;
  edit(file);
  ASSERT_GE(H5Fclose(file), 0);
}

std::vector<std::string> directory_listing(const std::string& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory))
    names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// A directory shared by every rank (rank 0 makes it and removes it), with a subdirectory of each
// rank's own for the functions that are not collective.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir;
    if (world_rank() == 0) {
      std::string pattern = (fs::temp_directory_path() / "hpc_train_checkpoint_XXXXXX").string();
      if (mkdtemp(pattern.data())) dir = pattern;
    }
    shared_ = broadcast_string(MPI_COMM_WORLD, dir, 0);
    ASSERT_FALSE(shared_.empty());
    own_ = shared_ + "/rank" + std::to_string(world_rank());
    MPI_Barrier(MPI_COMM_WORLD);
    fs::create_directories(own_);
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(shared_);
  }

  std::string shared(const std::string& name) const { return shared_ + "/" + name; }
  std::string own(const std::string& name) const { return own_ + "/" + name; }

  std::string shared_;
  std::string own_;
};

class CheckpointRoundTrip : public CheckpointTest,
                            public ::testing::WithParamInterface<CheckpointWriteMode> {};

TEST_P(CheckpointRoundTrip, EveryRankReadsBackBitwiseWhatAllWrote) {
  if (GetParam() == CheckpointWriteMode::kCollective && !kParallelHdf5)
    GTEST_SKIP() << "this HDF5 library is serial";
  const Checkpoint written = realistic_checkpoint(42);
  const std::string path = shared("checkpoints/step-00012345.h5");  // the directory is made
  write_checkpoint(MPI_COMM_WORLD, path, written, GetParam());
  // write_checkpoint returned on this rank: the file is complete under its name for every rank.
  expect_bitwise_equal(read_checkpoint(path), written);
  EXPECT_EQ(directory_listing(shared("checkpoints")), std::vector<std::string>{"step-00012345.h5"});

  // Empty strings, RNG state, optimizer state and model; no loss scaler. (Rank 0 alone may
  // replace the file while the others still read it: let them finish.)
  MPI_Barrier(MPI_COMM_WORLD);
  Checkpoint empty;
  write_checkpoint(MPI_COMM_WORLD, path, empty, GetParam());
  expect_bitwise_equal(read_checkpoint(path), empty);
}

INSTANTIATE_TEST_SUITE_P(Modes, CheckpointRoundTrip,
                         ::testing::Values(CheckpointWriteMode::kAuto,
                                           CheckpointWriteMode::kCollective,
                                           CheckpointWriteMode::kRankZero),
                         [](const ::testing::TestParamInfo<CheckpointWriteMode>& info) {
                           switch (info.param) {
                             case CheckpointWriteMode::kAuto:
                               return std::string("auto");
                             case CheckpointWriteMode::kCollective:
                               return std::string("collective");
                             default:
                               return std::string("rank_zero");
                           }
                         });

TEST_F(CheckpointTest, AFailedWriteLeavesThePreviousFileAndNoTemporary) {
  const std::string path = shared("step-00000002.h5");
  const Checkpoint first = realistic_checkpoint(1);
  write_checkpoint(MPI_COMM_WORLD, path, first);
  expect_bitwise_equal(read_checkpoint(path), first);
  MPI_Barrier(MPI_COMM_WORLD);  // every rank has read it before it is replaced
  const Checkpoint second = realistic_checkpoint(2);
  write_checkpoint(MPI_COMM_WORLD, path, second);  // replaces the file
  expect_bitwise_equal(read_checkpoint(path), second);

  Checkpoint bad = realistic_checkpoint(3);
  bad.model_state[1].dtype = "F16";
  expect_error<Error>([&] { write_checkpoint(MPI_COMM_WORLD, path, bad); },
                      {path, "bn1.weight", "\"F16\""});
  bad = realistic_checkpoint(3);
  bad.model_state[0].data.pop_back();
  expect_error<Error>([&] { write_checkpoint(MPI_COMM_WORLD, path, bad); },
                      {path, "conv1.weight", "6911 bytes", "needs 6912"});
  bad = realistic_checkpoint(3);
  bad.model_state[2].name = "bn1/bias";
  expect_error<Error>([&] { write_checkpoint(MPI_COMM_WORLD, path, bad); }, {path, "bn1/bias"});
  bad = realistic_checkpoint(3);
  bad.format_version = 1;  // readable, but no longer written
  expect_error<Error>([&] { write_checkpoint(MPI_COMM_WORLD, path, bad); },
                      {path, "format_version 1"});
  bad = realistic_checkpoint(3);
  bad.position.micro_batch = 0;
  expect_error<Error>([&] { write_checkpoint(MPI_COMM_WORLD, path, bad); },
                      {path, "micro_batch 0"});
  bad = realistic_checkpoint(3);
  bad.exp_avg.pop_back();
  expect_error<Error>([&] { write_checkpoint(MPI_COMM_WORLD, path, bad); },
                      {path, "master 155530, exp_avg 155529"});

  // A directory that cannot be made: every rank throws the same error, nobody hangs.
  if (world_rank() == 0) write_bytes(shared("plain_file"), {1, 2, 3});
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string impossible = shared("plain_file/step-00000003.h5");
  for (CheckpointWriteMode mode : {CheckpointWriteMode::kAuto, CheckpointWriteMode::kRankZero})
    expect_error<Error>([&] { write_checkpoint(MPI_COMM_WORLD, impossible, second, mode); },
                        {impossible, "plain_file"});

  expect_bitwise_equal(read_checkpoint(path), second);
  for (const std::string& name : directory_listing(shared_))
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << "a temporary file is left: " << name;
}

// RunCheckpoints' background writes (Note [Background checkpoint writes] in training_state.h):
// one process writes the whole file without MPI, here from a thread of its own; it reads back
// bitwise, and a malformed checkpoint or an impossible path is refused naming the file, leaving
// the previous file and no temporary one.
TEST_F(CheckpointTest, OneProcessWritesTheWholeFileFromAThread) {
  const Checkpoint written = realistic_checkpoint(7);
  const std::string path = own("checkpoints/step-00000007.h5");  // the directory is made
  std::thread writer([&] { write_checkpoint_file(path, written); });
  writer.join();
  expect_bitwise_equal(read_checkpoint(path), written);

  Checkpoint bad = realistic_checkpoint(3);
  bad.model_state[1].dtype = "F16";
  expect_error<Error>([&] { write_checkpoint_file(path, bad); }, {path, "bn1.weight", "\"F16\""});
  write_bytes(own("plain_file"), {1, 2, 3});
  const std::string impossible = own("plain_file/step-00000003.h5");
  expect_error<Error>([&] { write_checkpoint_file(impossible, written); },
                      {impossible, "plain_file"});
  expect_bitwise_equal(read_checkpoint(path), written);
  EXPECT_EQ(directory_listing(own("checkpoints")), std::vector<std::string>{"step-00000007.h5"});
}

TEST_F(CheckpointTest, CheckFitsNamesWhatTheCheckpointHoldsAndWhatTheRunHas) {
  const Checkpoint c = realistic_checkpoint(5);
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
  for (const CheckpointTensor& tensor : c.model_state)
    expected.emplace_back(tensor.name, tensor.shape);
  const std::string path = "runs/x/checkpoints/step-00012345.h5";
  const int64_t numel = static_cast<int64_t>(kOptimizerElements);

  check_checkpoint_fits(c, path, "resnet18", 3, 32, 32, 10, expected, numel);  // fits

  expect_error<DataError>(
      [&] { check_checkpoint_fits(c, path, "simple_cnn", 3, 32, 32, 10, expected, numel); },
      {path, "resnet18", "simple_cnn"});
  expect_error<DataError>(
      [&] { check_checkpoint_fits(c, path, "resnet18", 1, 28, 28, 10, expected, numel); },
      {path, "3x32x32", "1x28x28"});
  expect_error<DataError>(
      [&] { check_checkpoint_fits(c, path, "resnet18", 3, 32, 32, 100, expected, numel); },
      {path, "10 classes", "100 classes"});

  auto renamed = expected;
  renamed[3].first = "bn1.running_average";
  expect_error<DataError>(
      [&] { check_checkpoint_fits(c, path, "resnet18", 3, 32, 32, 10, renamed, numel); },
      {path, "bn1.running_mean", "bn1.running_average"});
  auto reshaped = expected;
  reshaped[6].second = {10, 256};
  expect_error<DataError>(
      [&] { check_checkpoint_fits(c, path, "resnet18", 3, 32, 32, 10, reshaped, numel); },
      {path, "fc.weight [10, 512]", "fc.weight [10, 256]"});
  auto longer = expected;
  longer.emplace_back("fc2.weight", std::vector<int64_t>{10, 10});
  expect_error<DataError>(
      [&] { check_checkpoint_fits(c, path, "resnet18", 3, 32, 32, 10, longer, numel); },
      {path, "9 model tensors", "this run 10", "fc2.weight"});
  expect_error<DataError>(
      [&] { check_checkpoint_fits(c, path, "resnet18", 3, 32, 32, 10, expected, numel + 3); },
      {path, "155530", "155533"});
}

TEST_F(CheckpointTest, PathsSortByStep) {
  EXPECT_EQ(checkpoint_directory("runs/a"), "runs/a/checkpoints");
  EXPECT_EQ(checkpoint_path("runs/a", 1234), "runs/a/checkpoints/step-00001234.h5");
  EXPECT_EQ(checkpoint_path("runs/a", 0), "runs/a/checkpoints/step-00000000.h5");
  EXPECT_EQ(checkpoint_path("runs/a", 123456789), "runs/a/checkpoints/step-123456789.h5");
  expect_error<Error>([] { checkpoint_path("runs/a", -1); }, {"-1"});
}

TEST_F(CheckpointTest, FindLatestPicksTheNewestThatReadsBack) {
  const std::string run = own("run");
  EXPECT_EQ(find_latest_checkpoint(run), std::nullopt);  // no directory yet
  for (int64_t step : {3, 12, 7})
    write_checkpoint(MPI_COMM_SELF, checkpoint_path(run, step), small_checkpoint(step));
  EXPECT_EQ(find_latest_checkpoint(run), checkpoint_path(run, 12));

  // Ignored: a temporary (even a complete one), other names.
  const std::string directory = checkpoint_directory(run);
  fs::copy_file(checkpoint_path(run, 12), checkpoint_path(run, 99) + ".tmp");
  write_bytes(directory + "/notes.txt", {'h', 'i'});
  fs::copy_file(checkpoint_path(run, 12), directory + "/step-abc.h5");
  fs::copy_file(checkpoint_path(run, 12), directory + "/step-00000098.h5.bak");
  std::vector<std::string> warnings;
  EXPECT_EQ(find_latest_checkpoint(run, &warnings), checkpoint_path(run, 12));
  EXPECT_TRUE(warnings.empty());

  // Skipped with a warning: newer files that do not read back.
  const std::vector<uint8_t> bytes = read_bytes(checkpoint_path(run, 12));
  write_bytes(checkpoint_path(run, 50), {bytes.begin(), bytes.begin() + bytes.size() / 2});
  write_bytes(checkpoint_path(run, 40), {});
  EXPECT_EQ(find_latest_checkpoint(run, &warnings), checkpoint_path(run, 12));
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find(checkpoint_path(run, 50)), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find(checkpoint_path(run, 40)), std::string::npos) << warnings[1];
  EXPECT_EQ(find_latest_checkpoint(run), checkpoint_path(run, 12));  // no warnings wanted

  // Ordered by number, not by name: 9 digits after 8.
  write_checkpoint(MPI_COMM_SELF, checkpoint_path(run, 123456789), small_checkpoint(123456789));
  write_checkpoint(MPI_COMM_SELF, checkpoint_path(run, 99999999), small_checkpoint(99999999));
  EXPECT_EQ(find_latest_checkpoint(run), checkpoint_path(run, 123456789));
}

TEST_F(CheckpointTest, PruneKeepsTheNewestAndRemovesTemporaries) {
  const std::string run = own("run");
  prune_checkpoints(run, 2);  // no directory: nothing to do
  for (int64_t step = 1; step <= 5; ++step)
    write_checkpoint(MPI_COMM_SELF, checkpoint_path(run, step), small_checkpoint(step));
  const std::string directory = checkpoint_directory(run);
  write_bytes(checkpoint_path(run, 6) + ".tmp", {1, 2, 3});
  write_bytes(directory + "/notes.txt", {'h', 'i'});

  prune_checkpoints(run, 0);  // keeps every checkpoint, removes the temporary
  EXPECT_EQ(directory_listing(directory),
            (std::vector<std::string>{"notes.txt", "step-00000001.h5", "step-00000002.h5",
                                      "step-00000003.h5", "step-00000004.h5", "step-00000005.h5"}));
  write_checkpoint(MPI_COMM_SELF, checkpoint_path(run, 10), small_checkpoint(10));
  prune_checkpoints(run, 2);
  EXPECT_EQ(directory_listing(directory),
            (std::vector<std::string>{"notes.txt", "step-00000005.h5", "step-00000010.h5"}));
  prune_checkpoints(run, 2);
  EXPECT_EQ(directory_listing(directory).size(), 3u);
  EXPECT_EQ(find_latest_checkpoint(run), checkpoint_path(run, 10));
}

// Note [Checkpoint branches]: `latest` wins over a higher step; a broken one falls back to the
// newest below it; the abandoned branch is moved aside, where neither finding nor pruning looks.
TEST_F(CheckpointTest, LatestNamesTheBranchAndAbandonedOnesAreSetAside) {
  const std::string run = own("run");
  EXPECT_EQ(set_aside_checkpoints_after(run, 0), "");  // no directory: nothing to move
  for (int64_t step : {4, 6, 8, 10})
    write_checkpoint(MPI_COMM_SELF, checkpoint_path(run, step), small_checkpoint(step));
  point_latest_checkpoint(run, checkpoint_path(run, 6));
  const std::string directory = checkpoint_directory(run);
  EXPECT_EQ(read_bytes(directory + "/latest"),
            (std::vector<uint8_t>{'s', 't', 'e', 'p', '-', '0', '0', '0', '0', '0', '0', '0', '6',
                                  '.', 'h', '5', '\n'}));  // the name: the directory may move
  EXPECT_EQ(find_latest_checkpoint(run), checkpoint_path(run, 6));

  // The named file does not read back: the newest complete one below it, with a warning.
  const std::vector<uint8_t> bytes = read_bytes(checkpoint_path(run, 6));
  write_bytes(checkpoint_path(run, 6), {bytes.begin(), bytes.begin() + bytes.size() / 2});
  std::vector<std::string> warnings;
  EXPECT_EQ(find_latest_checkpoint(run, &warnings), checkpoint_path(run, 4));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(directory + "/latest"), std::string::npos) << warnings[0];

  // A file outside the directory is named by its path.
  const std::string elsewhere = own("elsewhere.h5");
  write_checkpoint(MPI_COMM_SELF, elsewhere, small_checkpoint(5));
  point_latest_checkpoint(run, elsewhere);
  EXPECT_EQ(find_latest_checkpoint(run), elsewhere);

  fs::create_directories(checkpoint_path(run, 12) + "/occupied");  // no checkpoint: stays
  const std::string aside = set_aside_checkpoints_after(run, 6);
  EXPECT_EQ(aside.rfind(directory + "/abandoned-after-step-6-", 0), 0u) << aside;
  EXPECT_EQ(directory_listing(aside),
            (std::vector<std::string>{"step-00000008.h5", "step-00000010.h5"}));
  EXPECT_EQ(set_aside_checkpoints_after(run, 6), "");  // no file above 6 is left
  EXPECT_TRUE(fs::is_directory(checkpoint_path(run, 12)));
  fs::remove(directory + "/latest");
  EXPECT_EQ(find_latest_checkpoint(run), checkpoint_path(run, 4));  // 6 is broken
  prune_checkpoints(run, 1);
  EXPECT_EQ(directory_listing(aside).size(), 2u);  // pruning leaves the abandoned branch alone
}

TEST_F(CheckpointTest, BadFilesGiveADataErrorNamingTheFile) {
  const std::string valid = own("valid.h5");
  write_checkpoint(MPI_COMM_SELF, valid, realistic_checkpoint(7));
  ASSERT_NO_THROW(read_checkpoint(valid));
  const std::vector<uint8_t> bytes = read_bytes(valid);
  auto copy = [&](const std::string& name) {
    const std::string path = own(name);
    write_bytes(path, bytes);
    return path;
  };

  expect_data_error(own("missing.h5"), {"no such file"});
  expect_data_error(own_, {"is a directory"});

  std::mt19937_64 rng(3);
  const std::string garbage = own("garbage.h5");
  write_bytes(garbage, random_bytes(rng, 4096));
  expect_data_error(garbage, {"not an HDF5 file"});

  for (size_t kept : {size_t{0}, size_t{100}, size_t{2048}, bytes.size() / 3, bytes.size() / 2,
                      bytes.size() - 1}) {
    const std::string truncated = own("truncated-" + std::to_string(kept) + ".h5");
    write_bytes(truncated, {bytes.begin(), bytes.begin() + kept});
    expect_data_error(truncated, {});
  }

  // HDF5 files that are not checkpoints: one made with plain HDF5 calls, and a dataset file.
  const std::string plain = own("plain.h5");
  {
    const hid_t file = H5Fcreate(plain.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t n = 4;
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t dataset =
        H5Dcreate2(file, "values", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(dataset);
    H5Sclose(space);
    ASSERT_GE(H5Fclose(file), 0);
  }
  expect_data_error(plain, {"not an hpc_train checkpoint"});
  const std::string dataset_file = own("dataset.h5");
  DatasetContents contents;
  contents.info.num_classes = 2;
  contents.info.class_names = {"a", "b"};
  contents.info.channels = 1;
  contents.info.height = 2;
  contents.info.width = 2;
  contents.train_images = {0, 1, 2, 3, 4, 5, 6, 7};  // not one value: std 0 is not written
  contents.train_labels = {0, 1};
  write_dataset_file(dataset_file, contents);
  expect_data_error(dataset_file, {"not an hpc_train checkpoint"});

  const std::string other_format = copy("other-format.h5");
  edit_file(other_format, [](hid_t file) {
    ASSERT_GE(H5Adelete(file, "format"), 0);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, 9);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attribute = H5Acreate2(file, "format", type, space, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Awrite(attribute, type, "something"), 0);
    H5Aclose(attribute);
    H5Sclose(space);
    H5Tclose(type);
  });
  expect_data_error(other_format, {"not an hpc_train checkpoint", "\"something\""});

  const std::string version = copy("version-4.h5");
  edit_file(version, [](hid_t file) {
    const hid_t attribute = H5Aopen(file, "format_version", H5P_DEFAULT);
    const int64_t four = 4;
    ASSERT_GE(H5Awrite(attribute, H5T_NATIVE_INT64, &four), 0);
    H5Aclose(attribute);
  });
  expect_data_error(version, {"format_version 4", "(1 to 3)"});

  const std::string no_epoch = copy("no-epoch.h5");
  edit_file(no_epoch, [](hid_t file) {
    ASSERT_GE(H5Adelete_by_name(file, "training", "epoch", H5P_DEFAULT), 0);
  });
  expect_data_error(no_epoch, {"missing attribute 'epoch' on /training"});

  const std::string no_moments = copy("no-exp-avg-sq.h5");
  edit_file(no_moments, [](hid_t file) {
    ASSERT_GE(H5Ldelete(file, "/optimizer/exp_avg_sq", H5P_DEFAULT), 0);
  });
  expect_data_error(no_moments, {"missing dataset /optimizer/exp_avg_sq"});

  // exp_avg replaced by a shorter array with a valid checksum: only the lengths disagree.
  const std::string short_moments = copy("short-exp-avg.h5");
  edit_file(short_moments, [](hid_t file) {
    ASSERT_GE(H5Ldelete(file, "/optimizer/exp_avg", H5P_DEFAULT), 0);
    const std::vector<float> values(10, 0.5f);
    const hsize_t n = values.size();
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t dataset = H5Dcreate2(file, "/optimizer/exp_avg", H5T_IEEE_F32LE, space, H5P_DEFAULT,
                                     H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Dwrite(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0L, reinterpret_cast<const Bytef*>(values.data()), n * sizeof(float)));
    const hid_t scalar = H5Screate(H5S_SCALAR);
    const hid_t attribute =
        H5Acreate2(dataset, "crc32", H5T_STD_U32LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Awrite(attribute, H5T_NATIVE_UINT32, &crc), 0);
    H5Aclose(attribute);
    H5Sclose(scalar);
    H5Dclose(dataset);
    H5Sclose(space);
  });
  expect_data_error(short_moments, {"master 155530, exp_avg 10"});

  // One flipped bit in the master weights: the checksum catches it.
  const std::string flipped = copy("flipped.h5");
  haddr_t master_offset = HADDR_UNDEF;
  edit_file(flipped, [&](hid_t file) {
    const hid_t dataset = H5Dopen2(file, "/optimizer/master", H5P_DEFAULT);
    master_offset = H5Dget_offset(dataset);
    H5Dclose(dataset);
  });
  ASSERT_NE(master_offset, HADDR_UNDEF);
  std::vector<uint8_t> corrupt = read_bytes(flipped);
  corrupt.at(master_offset + 4 * 77777 + 1) ^= 0x10;
  write_bytes(flipped, corrupt);
  expect_data_error(flipped, {"/optimizer/master is corrupt", "crc32"});
}

// A version 1 file (written before the resume position and the scaler's kind were recorded)
// still reads, with what checkpoint.h says stands in for the missing attributes.
TEST_F(CheckpointTest, Version1FilesReadWithTheirUnknownsMarked) {
  const std::string path = own("version-1.h5");
  Checkpoint written = realistic_checkpoint(5);
  write_checkpoint(MPI_COMM_SELF, path, written);
  edit_file(path, [](hid_t file) {
    const hid_t attribute = H5Aopen(file, "format_version", H5P_DEFAULT);
    const int64_t one = 1;
    ASSERT_GE(H5Awrite(attribute, H5T_NATIVE_INT64, &one), 0);
    H5Aclose(attribute);
    for (const char* name : {"samples_in_epoch", "micro_batch", "grad_accum"})
      ASSERT_GE(H5Adelete_by_name(file, "training", name, H5P_DEFAULT), 0);
    ASSERT_GE(H5Adelete_by_name(file, "loss_scaler", "dynamic", H5P_DEFAULT), 0);
  });
  const Checkpoint read = read_checkpoint(path);
  EXPECT_EQ(read.format_version, 1);
  EXPECT_EQ(read.position.samples_in_epoch, -1);
  EXPECT_EQ(read.position.micro_batch, 0);
  EXPECT_EQ(read.position.grad_accum, 0);
  EXPECT_EQ(read.position.micro_steps_in_epoch, written.position.micro_steps_in_epoch);
  EXPECT_TRUE(read.loss_scaler_dynamic);  // version 1 restored any saved scaler
  expect_same_floats(read.master, written.master, "master");

  // The same attributes missing from a version 2 file are an error naming them.
  const std::string incomplete = own("version-2-incomplete.h5");
  write_checkpoint(MPI_COMM_SELF, incomplete, written);
  edit_file(incomplete, [](hid_t file) {
    ASSERT_GE(H5Adelete_by_name(file, "training", "samples_in_epoch", H5P_DEFAULT), 0);
  });
  expect_error<DataError>([&] { read_checkpoint(incomplete); }, {incomplete, "samples_in_epoch"});
}

// Note [Random state in checkpoints]: version 3 added the CUDA generator's state. A version 2
// file (written before) reads with none, which the resume takes as "leave the CUDA generator as
// seeded", what version 2 resumes did; a version 3 file without it is refused, naming it.
TEST_F(CheckpointTest, Version2FilesReadWithoutCudaRngState) {
  const Checkpoint written = realistic_checkpoint(6);
  ASSERT_EQ(written.cuda_rng_state.size(), 16u);
  const std::string path = own("version-2.h5");
  write_checkpoint(MPI_COMM_SELF, path, written);
  const Checkpoint current = read_checkpoint(path);
  EXPECT_EQ(current.format_version, 3);
  EXPECT_EQ(current.cuda_rng_state, written.cuda_rng_state);

  // As a version 2 writer left it: no /training/cuda_rng_state.
  edit_file(path, [](hid_t file) {
    const hid_t attribute = H5Aopen(file, "format_version", H5P_DEFAULT);
    const int64_t two = 2;
    ASSERT_GE(H5Awrite(attribute, H5T_NATIVE_INT64, &two), 0);
    H5Aclose(attribute);
    ASSERT_GE(H5Ldelete(file, "/training/cuda_rng_state", H5P_DEFAULT), 0);
  });
  const Checkpoint read = read_checkpoint(path);
  EXPECT_EQ(read.format_version, 2);
  EXPECT_TRUE(read.cuda_rng_state.empty());
  Checkpoint expected = written;
  expected.format_version = 2;
  expected.cuda_rng_state.clear();
  EXPECT_EQ(read.rng_state, expected.rng_state);
  EXPECT_EQ(read.position.samples_in_epoch, expected.position.samples_in_epoch);
  expect_same_floats(read.master, expected.master, "master");

  // The same dataset missing from a version 3 file is an error naming it.
  const std::string incomplete = own("version-3-incomplete.h5");
  write_checkpoint(MPI_COMM_SELF, incomplete, written);
  edit_file(incomplete, [](hid_t file) {
    ASSERT_GE(H5Ldelete(file, "/training/cuda_rng_state", H5P_DEFAULT), 0);
  });
  expect_data_error(incomplete, {"missing dataset /training/cuda_rng_state"});

  // It is checksummed like every dataset.
  const std::string flipped = own("flipped-cuda-rng.h5");
  write_checkpoint(MPI_COMM_SELF, flipped, written);
  haddr_t offset = HADDR_UNDEF;
  edit_file(flipped, [&](hid_t file) {
    const hid_t dataset = H5Dopen2(file, "/training/cuda_rng_state", H5P_DEFAULT);
    offset = H5Dget_offset(dataset);
    H5Dclose(dataset);
  });
  ASSERT_NE(offset, HADDR_UNDEF);
  std::vector<uint8_t> corrupt = read_bytes(flipped);
  corrupt.at(offset + 3) ^= 0x01;
  write_bytes(flipped, corrupt);
  expect_data_error(flipped, {"/training/cuda_rng_state is corrupt", "crc32"});
}

TEST_F(CheckpointTest, WeightsExportHoldsTheModelAndItsMetadata) {
  const Checkpoint c = realistic_checkpoint(9);
  const std::string path = own("weights.safetensors");
  write_weights_safetensors(path, c);
  const SafetensorsHeader header = read_safetensors_header(path);
  ASSERT_EQ(header.tensors.size(), c.model_state.size());
  for (const CheckpointTensor& tensor : c.model_state) {
    const SafetensorsTensorInfo* info = header.find(tensor.name);
    ASSERT_NE(info, nullptr) << tensor.name;
    EXPECT_EQ(info->dtype, tensor.dtype) << tensor.name;
    EXPECT_EQ(info->shape, tensor.shape) << tensor.name;
    EXPECT_EQ(read_safetensors_tensor(path, header, tensor.name), tensor.data) << tensor.name;
  }
  EXPECT_EQ(header.find("bn1.num_batches_tracked")->dtype, "I64");
  EXPECT_TRUE(header.find("bn1.num_batches_tracked")->shape.empty());
  const std::map<std::string, std::string> metadata = {{"format", "hpc_train weights"},
                                                       {"model", "resnet18"},
                                                       {"channels", "3"},
                                                       {"height", "32"},
                                                       {"width", "32"},
                                                       {"num_classes", "10"},
                                                       {"step", "12345"}};
  EXPECT_EQ(header.metadata, metadata);
}

}  // namespace

// Note [Scaler on resume]
TEST(ContinuesLossScaler, OnlyDynamicFp16IntoDynamicFp16) {
  LossScalerOptions dynamic;
  LossScalerOptions fixed;
  fixed.fixed_scale = 128;
  LossScalerOptions other_fixed;
  other_fixed.fixed_scale = 256;
  auto saved = [](const std::string& precision, bool has_scaler, bool is_dynamic) {
    Checkpoint c;
    c.precision = precision;
    c.has_loss_scaler = has_scaler;
    c.loss_scaler_dynamic = is_dynamic;
    c.loss_scaler.scale = 1024;
    return c;
  };
  const std::optional<LossScalerOptions> none;  // a bf16 or fp32 run
  EXPECT_TRUE(continues_loss_scaler(saved("fp16", true, true), dynamic));
  EXPECT_FALSE(continues_loss_scaler(saved("fp16", true, true), none)) << "fp16 -> bf16";
  EXPECT_FALSE(continues_loss_scaler(saved("bf16", false, false), dynamic)) << "bf16 -> fp16";
  EXPECT_FALSE(continues_loss_scaler(saved("fp32", false, false), dynamic)) << "fp32 -> fp16";
  EXPECT_FALSE(continues_loss_scaler(saved("fp16", true, true), fixed)) << "dynamic -> fixed";
  EXPECT_FALSE(continues_loss_scaler(saved("fp16", true, false), dynamic)) << "fixed -> dynamic";
  EXPECT_FALSE(continues_loss_scaler(saved("fp16", true, false), other_fixed)) << "fixed 128 -> 256";
  EXPECT_FALSE(continues_loss_scaler(saved("fp16", true, false), fixed)) << "fixed: the run's own";
}
