// The HDF5 attributes that dataset files and checkpoints share (src/io/hdf5_attributes.h, a
// private header): every writer's value reads back exactly; every reader refuses every other
// class, count and size with a DataError in the words the two owners' messages use (a named
// object for checkpoints, the unnamed root group of a dataset file); sizes are bounded by the
// file's before anything is allocated.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "io/hdf5_attributes.h"
#include "io/hdf5_util.h"
#include "hpc_train/error.h"

using namespace hpc_train;
namespace fs = std::filesystem;

namespace {

// `call` throws a DataError whose message is exactly `message`.
void expect_message(const std::function<void()>& call, const std::string& message) {
  try {
    call();
    ADD_FAILURE() << "no DataError; expected: " << message;
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

// A file with a root group and a group /g, each holding one attribute of every kind the writers
// write, plus a few no writer writes.
class Hdf5AttributesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "hpc_train_attributes_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    h5::Lock lock;  // Note [HDF5 lock]
    file_ = h5::File(H5_CHECK(H5Fcreate((dir_ + "/a.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT,
                                        H5P_DEFAULT)));
    root_ = h5::Group(H5_CHECK(H5Gopen2(file_.get(), "/", H5P_DEFAULT)));
    group_ = h5::Group(
        H5_CHECK(H5Gcreate2(file_.get(), "g", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    for (hid_t object : {root_.get(), group_.get()}) {
      h5::write_integer_attribute(object, "integer", -1234567890123);
      h5::write_integer_attribute(object, "small", std::numeric_limits<int>::min());
      h5::write_integer_attribute(object, "big", int64_t{1} << 40);
      h5::write_double_attribute(object, "double", 0.1);
      h5::write_floats_attribute(object, "floats", {1.5f, -2.0f, 3.25e-20f});
      h5::write_variable_strings_attribute(object, "names", {"zero", "caf\xc3\xa9", ""}, false);
      h5::write_variable_strings_attribute(object, "source", {"converter"}, true);
      h5::write_fixed_string_attribute(object, "text", "line 1\nline 2");
      h5::write_fixed_string_attribute(object, "empty", "");
      // Three 4-byte fixed-length strings: what some writers of dataset files store for names.
      const h5::Type type = h5::fixed_string_type(4);
      const hsize_t count = 3;
      h5::Dataspace space(H5_CHECK(H5Screate_simple(1, &count, nullptr)));
      h5::Attribute fixed(H5_CHECK(
          H5Acreate2(object, "fixed_names", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)));
      H5_CHECK(H5Awrite(fixed.get(), type.get(), "ab\0\0cdefg\0\0\0"));
    }
  }

  void TearDown() override {
    {
      h5::Lock lock;
      group_.reset();
      root_.reset();
      file_.reset();
    }
    fs::remove_all(dir_);
  }

  // Large enough for every attribute here.
  static constexpr uint64_t kFileBytes = 1 << 20;

  std::string dir_;
  h5::File file_;
  h5::Group root_;
  h5::Group group_;
};

TEST_F(Hdf5AttributesTest, WhatTheWritersWriteReadsBackExactly) {
  h5::Lock lock;
  const h5::AttributeReader read(group_.get(), "/g", "", kFileBytes);
  EXPECT_TRUE(read.has("integer"));
  EXPECT_FALSE(read.has("nothing"));
  EXPECT_EQ(read.integer("integer"), -1234567890123);
  EXPECT_EQ(read.integer("big"), int64_t{1} << 40);
  EXPECT_EQ(read.real("double"), 0.1);  // stored as 64 bits: not rounded
  EXPECT_EQ(read.floats("floats"), (std::vector<float>{1.5f, -2.0f, 3.25e-20f}));
  // Integers read as numbers too (a dataset file's mean and std may be stored either way).
  EXPECT_EQ(read.floats("big"), (std::vector<float>{1099511627776.0f}));
  EXPECT_EQ(read.strings("names"), (std::vector<std::string>{"zero", "caf\xc3\xa9", ""}));
  EXPECT_EQ(read.strings("source"), (std::vector<std::string>{"converter"}));
  EXPECT_EQ(read.strings("fixed_names"), (std::vector<std::string>{"ab", "cdef", "g"}));
  EXPECT_EQ(read.strings("text"), (std::vector<std::string>{"line 1\nline 2"}));
  EXPECT_EQ(read.fixed_string("text"), "line 1\nline 2");
  EXPECT_EQ(read.fixed_string("empty"), "");
  EXPECT_EQ(read.small_integer("small"), std::numeric_limits<int>::min());
}

TEST_F(Hdf5AttributesTest, ANamedObjectsMessagesNameTheAttributeAndTheObject) {
  h5::Lock lock;
  const h5::AttributeReader read(group_.get(), "/g", "", kFileBytes);
  expect_message([&] { read.integer("nothing"); }, "missing attribute 'nothing' on /g");
  expect_message([&] { read.integer("double"); }, "attribute 'double' of /g is not one integer");
  expect_message([&] { read.integer("floats"); }, "attribute 'floats' of /g is not one integer");
  expect_message([&] { read.small_integer("big"); },
                 "attribute 'big' of /g = 1099511627776 is out of range");
  expect_message([&] { read.small_integer("integer"); },
                 "attribute 'integer' of /g = -1234567890123 is out of range");
  expect_message([&] { read.real("integer"); }, "attribute 'integer' of /g is not one float");
  expect_message([&] { read.real("floats"); }, "attribute 'floats' of /g is not one float");
  expect_message([&] { read.floats("names"); },
                 "attribute 'names' of /g must be numbers, not string");
  expect_message([&] { read.strings("integer"); },
                 "attribute 'integer' of /g must be strings, not 64-bit signed integer");
  expect_message([&] { read.strings("floats"); },
                 "attribute 'floats' of /g must be strings, not 32-bit float");
  expect_message([&] { read.fixed_string("source"); },
                 "attribute 'source' of /g is not a fixed-length string");
  expect_message([&] { read.fixed_string("integer"); },
                 "attribute 'integer' of /g is not a fixed-length string");
  expect_message([&] { read.fixed_string("fixed_names"); },
                 "attribute 'fixed_names' of /g is not a single string");
}

TEST_F(Hdf5AttributesTest, ADatasetFilesRootGroupIsNamedByTheFileAlone) {
  h5::Lock lock;
  const h5::AttributeReader read(root_.get(), "", "data.h5: ", kFileBytes);
  expect_message([&] { read.floats("mean"); },
                 "data.h5: missing attribute 'mean' on the root group");
  expect_message([&] { read.integer("names"); }, "data.h5: attribute 'names' is not one integer");
  expect_message([&] { read.floats("source"); },
                 "data.h5: attribute 'source' must be numbers, not string");
  EXPECT_EQ(read.integer("integer"), -1234567890123);
}

// A corrupt dataspace can claim more values than any file holds; the file's size bounds them.
TEST_F(Hdf5AttributesTest, SizesBeyondTheFileAreRefusedBeforeTheyAreAllocated) {
  h5::Lock lock;
  const h5::AttributeReader read(group_.get(), "/g", "", 11);  // a file of 11 bytes
  expect_message([&] { read.floats("floats"); },
                 "attribute 'floats' of /g claims 3 values of 4 bytes, more than the file holds");
  expect_message([&] { read.strings("fixed_names"); },
                 "attribute 'fixed_names' of /g claims 3 values of 4 bytes, more than the file "
                 "holds");
  expect_message([&] { read.fixed_string("text"); },
                 "attribute 'text' of /g claims 13 elements of 1 bytes, more than the file's 11 "
                 "bytes");
  // One value of each fits.
  EXPECT_EQ(read.integer("integer"), -1234567890123);
  EXPECT_EQ(read.strings("source"), (std::vector<std::string>{"converter"}));

  EXPECT_EQ(h5::checked_bytes(5, 8, 40, "x"), 40u);
  expect_message([] { h5::checked_bytes(6, 8, 40, "/optimizer/master"); },
                 "/optimizer/master claims 6 elements of 8 bytes, more than the file's 40 bytes");
  // elements x element_bytes would wrap a 64-bit count: refused, not wrapped.
  expect_message(
      [] { h5::checked_bytes(uint64_t{1} << 61, 16, std::numeric_limits<uint64_t>::max(), "y"); },
      "y claims 2305843009213693952 elements of 16 bytes, more than the file's "
      "18446744073709551615 bytes");
}

TEST(Hdf5Types, DescribeTypeNamesClassWidthAndSign) {
  h5::Lock lock;
  EXPECT_EQ(h5::describe_type(H5T_NATIVE_UINT8), "8-bit unsigned integer");
  EXPECT_EQ(h5::describe_type(H5T_STD_I32LE), "32-bit signed integer");
  EXPECT_EQ(h5::describe_type(H5T_IEEE_F64LE), "64-bit float");
  EXPECT_EQ(h5::describe_type(H5T_C_S1), "string");
  EXPECT_EQ(h5::describe_type(H5T_STD_REF_OBJ), "non-numeric type");
}

}  // namespace
