// Note [Test hooks]: the environment switches are read as the tests that set them expect, and a
// value that cannot be meant is refused rather than ignored (a test must not pass by a typo).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "environment_set_aside.h"
#include "hpc_train/error.h"
#include "hpc_train/runtime/test_hooks.h"

namespace {

using hpc_train::Error;
using hpc_train::testing::EnvironmentSetAside;

TEST(TestFault, UnsetAsksNothing) {
  const EnvironmentSetAside aside({"HPC_TRAIN_TEST_FAULT"});
  EXPECT_FALSE(hpc_train::test_fault("alloc", 0));
  setenv("HPC_TRAIN_TEST_FAULT", "", 1);
  EXPECT_FALSE(hpc_train::test_fault("alloc", 0));
}

TEST(TestFault, OnlyTheNamedKindAtTheNamedRank) {
  const EnvironmentSetAside aside({"HPC_TRAIN_TEST_FAULT"});
  setenv("HPC_TRAIN_TEST_FAULT", "capture@2", 1);
  EXPECT_TRUE(hpc_train::test_fault("capture", 2));
  EXPECT_FALSE(hpc_train::test_fault("capture", 1));
  EXPECT_FALSE(hpc_train::test_fault("alloc", 2));
}

TEST(TestFault, ATypoIsRefused) {
  const EnvironmentSetAside aside({"HPC_TRAIN_TEST_FAULT"});
  for (const char* value : {"allocate@1", "alloc", "alloc@", "alloc@-1", "alloc@1x", "@1"}) {
    setenv("HPC_TRAIN_TEST_FAULT", value, 1);
    EXPECT_THROW(hpc_train::test_fault("alloc", 1), Error) << value;
  }
  setenv("HPC_TRAIN_TEST_FAULT", "allocate@1", 1);
  try {
    hpc_train::test_fault("alloc", 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "HPC_TRAIN_TEST_FAULT=allocate@1: expected KIND@RANK, KIND one of "
                           "init-weights, alloc, resident-upload, capture");
  }
}

TEST(TestStallReplayRank, UnsetIsMinusOne) {
  const EnvironmentSetAside aside({"HPC_TRAIN_TEST_STALL_REPLAY_RANK"});
  EXPECT_EQ(hpc_train::test_stall_replay_rank(), -1);
  setenv("HPC_TRAIN_TEST_STALL_REPLAY_RANK", "", 1);
  EXPECT_EQ(hpc_train::test_stall_replay_rank(), -1);
}

TEST(TestStallReplayRank, ARankOrAnError) {
  const EnvironmentSetAside aside({"HPC_TRAIN_TEST_STALL_REPLAY_RANK"});
  setenv("HPC_TRAIN_TEST_STALL_REPLAY_RANK", "0", 1);
  EXPECT_EQ(hpc_train::test_stall_replay_rank(), 0);
  setenv("HPC_TRAIN_TEST_STALL_REPLAY_RANK", "12", 1);
  EXPECT_EQ(hpc_train::test_stall_replay_rank(), 12);
  for (const char* value : {"x", "-1", "1 ", "3rd", "99999999999"}) {
    setenv("HPC_TRAIN_TEST_STALL_REPLAY_RANK", value, 1);
    EXPECT_THROW(hpc_train::test_stall_replay_rank(), Error) << value;
  }
}

TEST(SampleTrace, OffWhenUnset) {
  const EnvironmentSetAside aside({"HPC_TRAIN_TEST_SAMPLE_TRACE"});
  EXPECT_FALSE(hpc_train::SampleTrace(0).on());
}

TEST(SampleTrace, AppendsOneLinePerMicroBatchToTheRanksFile) {
  const EnvironmentSetAside aside({"HPC_TRAIN_TEST_SAMPLE_TRACE"});
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("hpc_train_test_hooks." + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string prefix = (dir / "trace").string();
  setenv("HPC_TRAIN_TEST_SAMPLE_TRACE", prefix.c_str(), 1);
  {
    hpc_train::SampleTrace trace(3);
    ASSERT_TRUE(trace.on());
    trace.write(0, 1, {4, 0, 7});
  }
  {
    hpc_train::SampleTrace resumed(3);  // a resumed run appends
    resumed.write(1, 2, {});
  }
  std::ifstream file(prefix + ".3");
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "0 1 4 0 7\n1 2\n");

  setenv("HPC_TRAIN_TEST_SAMPLE_TRACE", (dir / "missing" / "trace").c_str(), 1);
  EXPECT_THROW(hpc_train::SampleTrace(0), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
