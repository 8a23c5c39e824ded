// Converters: IDX (raw and gz) and CIFAR-10 binary files written here, read back exactly; every
// kind of broken input gives a DataError that names the file and the problem.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "hpc_train/data/converters.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/data/npz_file.h"
#include "hpc_train/data/pickle_reader.h"
#include "hpc_train/error.h"
#include "expect_error.h"

using namespace hpc_train;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards.
class ConvertersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "hpc_train_converters_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  void write_file(const std::string& name, const std::vector<uint8_t>& bytes, bool gz = false) {
    if (gz) {
      gzFile file = gzopen(path(name + ".gz").c_str(), "wb");
      ASSERT_NE(file, nullptr);
      ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
                static_cast<int>(bytes.size()));
      gzclose(file);
    } else {
      std::ofstream(path(name), std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    }
  }

  std::string dir_;
};

void append_u32(std::vector<uint8_t>& bytes, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(value >> shift));
}

uint8_t pixel(int64_t sample, int64_t offset) { return static_cast<uint8_t>(sample * 37 + offset * 11); }
int64_t label(int64_t sample) { return (sample * 3 + 1) % 10; }

std::vector<uint8_t> idx_images(int64_t n, int64_t h, int64_t w, int64_t first = 0) {
  std::vector<uint8_t> bytes;
  append_u32(bytes, 0x00000803);
  for (int64_t d : {n, h, w}) append_u32(bytes, static_cast<uint32_t>(d));
  for (int64_t s = 0; s < n; ++s)
    for (int64_t i = 0; i < h * w; ++i) bytes.push_back(pixel(first + s, i));
  return bytes;
}

std::vector<uint8_t> idx_labels(int64_t n, int64_t first = 0) {
  std::vector<uint8_t> bytes;
  append_u32(bytes, 0x00000801);
  append_u32(bytes, static_cast<uint32_t>(n));
  for (int64_t s = 0; s < n; ++s) bytes.push_back(static_cast<uint8_t>(label(first + s)));
  return bytes;
}

// CIFAR-10 records numbered globally from `first` so that the concatenation order is visible.
std::vector<uint8_t> cifar_records(int64_t n, int64_t first) {
  std::vector<uint8_t> bytes;
  for (int64_t s = first; s < first + n; ++s) {
    bytes.push_back(static_cast<uint8_t>(label(s)));
    for (int64_t i = 0; i < 3072; ++i) bytes.push_back(pixel(s, i));
  }
  return bytes;
}

using ::test_support::expect_data_error;

}  // namespace

class IdxTest : public ConvertersTest {
 protected:
  // 5 train and 3 test images of 4x6; train files gz, test files raw.
  void write_valid_set() {
    write_file("train-images-idx3-ubyte", idx_images(5, 4, 6), true);
    write_file("train-labels-idx1-ubyte", idx_labels(5), true);
    write_file("t10k-images-idx3-ubyte", idx_images(3, 4, 6, 100));
    write_file("t10k-labels-idx1-ubyte", idx_labels(3, 100));
  }
};

TEST_F(IdxTest, ReadsExactBytesGzAndRaw) {
  write_valid_set();
  const DatasetContents c = read_source_dataset(SourceFormat::kFashionMnist, dir_, {});
  EXPECT_EQ(c.info.channels, 1);
  EXPECT_EQ(c.info.height, 4);
  EXPECT_EQ(c.info.width, 6);
  EXPECT_EQ(c.info.num_classes, 10);
  ASSERT_EQ(c.info.class_names.size(), 10u);
  EXPECT_EQ(c.info.class_names[0], "T-shirt/top");
  EXPECT_EQ(c.info.class_names[9], "Ankle boot");
  ASSERT_EQ(c.train_labels.size(), 5u);
  ASSERT_EQ(c.test_labels.size(), 3u);
  for (int64_t s = 0; s < 5; ++s) {
    EXPECT_EQ(c.train_labels[s], label(s));
    for (int64_t i = 0; i < 24; ++i) ASSERT_EQ(c.train_images[s * 24 + i], pixel(s, i));
  }
  for (int64_t s = 0; s < 3; ++s) {
    EXPECT_EQ(c.test_labels[s], label(100 + s));
    for (int64_t i = 0; i < 24; ++i) ASSERT_EQ(c.test_images[s * 24 + i], pixel(100 + s, i));
  }
  const DatasetContents mnist = read_source_dataset(SourceFormat::kMnist, dir_, {});
  EXPECT_EQ(mnist.info.class_names[3], "3");
  EXPECT_EQ(mnist.train_images, c.train_images);
}

TEST_F(IdxTest, MaxTrainAndTestKeepTheFirst) {
  write_valid_set();
  const DatasetContents c = read_source_dataset(SourceFormat::kMnist, dir_, {2, 0});
  EXPECT_EQ(c.train_labels, (std::vector<int64_t>{label(0), label(1)}));
  EXPECT_EQ(c.train_images.size(), 2u * 24);
  EXPECT_TRUE(c.test_labels.empty());
  EXPECT_TRUE(c.test_images.empty());
}

TEST_F(IdxTest, ConvertRoundTripAndDescribe) {
  write_valid_set();
  const std::string out = path("out.h5");
  convert_dataset(SourceFormat::kFashionMnist, dir_, out, {});
  const DatasetFile file = DatasetFile::open(out);
  EXPECT_EQ(file.info().train_size, 5);
  EXPECT_EQ(file.info().test_size, 3);
  std::vector<uint8_t> images(3 * 24);
  std::vector<int64_t> labels(3);
  file.read_samples(Split::kTest, {2, 0, 1}, images.data(), labels.data());
  EXPECT_EQ(labels, (std::vector<int64_t>{label(102), label(100), label(101)}));
  EXPECT_EQ(images[0], pixel(102, 0));
  EXPECT_EQ(images[24 + 23], pixel(100, 23));

  const std::string text = describe_dataset_file(out);
  for (const char* part : {"train:           5 samples", "test:            3 samples",
                           "1x4x6 (C x H x W)", "10: 0 T-shirt/top, 1 Trouser", "9 Ankle boot",
                           "format version:  1", "fashion-mnist IDX files in", "chunks:"})
    EXPECT_NE(text.find(part), std::string::npos) << part << "\nin:\n" << text;
}

TEST_F(IdxTest, WrongMagic) {
  write_valid_set();
  write_file("train-labels-idx1-ubyte", idx_images(5, 4, 6), true);  // images where labels go
  expect_data_error([&] { read_source_dataset(SourceFormat::kMnist, dir_, {}); },
                    {"train-labels-idx1-ubyte.gz", "wrong magic number 0x00000803",
                     "expected 0x00000801"});
}

TEST_F(IdxTest, Truncated) {
  write_valid_set();
  std::vector<uint8_t> bytes = idx_images(3, 4, 6, 100);
  bytes.resize(bytes.size() - 5);
  write_file("t10k-images-idx3-ubyte", bytes);
  expect_data_error([&] { read_source_dataset(SourceFormat::kMnist, dir_, {}); },
                    {"t10k-images-idx3-ubyte", "truncated", "67 data bytes", "says 72"});
}

// 16 x 2^30 x 2^30 bytes is 2^64, which wrapped to 0: a header without image bytes passed.
TEST_F(IdxTest, DimensionsOverTwoToThe64) {
  write_valid_set();
  std::vector<uint8_t> bytes = idx_images(0, int64_t{1} << 30, int64_t{1} << 30);
  write_file("t10k-images-idx3-ubyte", bytes);  // 0 x 2^30 x 2^30: 0 bytes, right
  write_file("t10k-labels-idx1-ubyte", idx_labels(0));
  bytes[7] = 16;  // 16 x 2^30 x 2^30, with no data bytes
  write_file("train-images-idx3-ubyte", bytes);
  write_file("train-labels-idx1-ubyte", idx_labels(16));
  expect_data_error([&] { read_source_dataset(SourceFormat::kMnist, dir_, {}); },
                    {"train-images-idx3-ubyte", "truncated: 0 data bytes",
                     "16x1073741824x1073741824 (over 2^64 bytes)"});
}

TEST_F(IdxTest, ZeroHeightOrWidth) {
  write_valid_set();
  write_file("t10k-images-idx3-ubyte", idx_images(3, 0, 6, 100));
  expect_data_error([&] { read_source_dataset(SourceFormat::kMnist, dir_, {}); },
                    {"t10k-images-idx3-ubyte", "images of 0x6 pixels"});
  write_file("t10k-images-idx3-ubyte", idx_images(3, 4, 6, 100));
  write_file("train-images-idx3-ubyte", idx_images(5, 4, 0));
  expect_data_error([&] { read_source_dataset(SourceFormat::kMnist, dir_, {}); },
                    {"train-images-idx3-ubyte", "images of 4x0 pixels"});
}

TEST_F(IdxTest, TruncatedGzipStream) {
  write_valid_set();
  const std::string gz = path("train-images-idx3-ubyte.gz");
  fs::resize_file(gz, fs::file_size(gz) / 2);
  expect_data_error([&] { read_source_dataset(SourceFormat::kMnist, dir_, {}); },
                    {"train-images-idx3-ubyte.gz"});
}

TEST_F(IdxTest, EmptyFile) {
  write_valid_set();
  write_file("t10k-labels-idx1-ubyte", {});
  expect_data_error([&] { read_source_dataset(SourceFormat::kMnist, dir_, {}); },
                    {"t10k-labels-idx1-ubyte", "empty file"});
}

TEST_F(IdxTest, LabelOutOfRange) {
  write_valid_set();
  std::vector<uint8_t> bytes = idx_labels(5);
  bytes[8 + 3] = 12;
  write_file("train-labels-idx1-ubyte", bytes, true);
  expect_data_error([&] { read_source_dataset(SourceFormat::kMnist, dir_, {}); },
                    {"train-labels-idx1-ubyte.gz", "label[3] = 12", "outside [0, 10)"});
}

TEST_F(IdxTest, CountMismatch) {
  write_valid_set();
  write_file("t10k-labels-idx1-ubyte", idx_labels(2, 100));
  expect_data_error([&] { read_source_dataset(SourceFormat::kMnist, dir_, {}); },
                    {"t10k-images-idx3-ubyte", "3 images", "2 labels"});
}

TEST_F(IdxTest, TestShapeDiffers) {
  write_valid_set();
  write_file("t10k-images-idx3-ubyte", idx_images(3, 5, 6, 100));
  expect_data_error([&] { read_source_dataset(SourceFormat::kMnist, dir_, {}); },
                    {"t10k-images-idx3-ubyte", "5x6", "4x6"});
}

TEST_F(IdxTest, MissingFileAndDirectory) {
  write_valid_set();
  fs::remove(path("t10k-images-idx3-ubyte"));
  expect_data_error([&] { read_source_dataset(SourceFormat::kMnist, dir_, {}); },
                    {"t10k-images-idx3-ubyte", "no such file"});
  fs::create_directory(path("t10k-images-idx3-ubyte"));
  expect_data_error([&] { read_source_dataset(SourceFormat::kMnist, dir_, {}); },
                    {"t10k-images-idx3-ubyte", "is a directory"});
  expect_data_error([&] { read_source_dataset(SourceFormat::kMnist, path("nowhere"), {}); },
                    {"nowhere", "no such directory"});
}

TEST_F(IdxTest, FailedConversionLeavesNoFile) {
  write_valid_set();
  write_file("t10k-labels-idx1-ubyte", idx_labels(2, 100));
  EXPECT_THROW(convert_dataset(SourceFormat::kMnist, dir_, path("out.h5"), {}), DataError);
  EXPECT_FALSE(fs::exists(path("out.h5")));
}

class CifarTest : public ConvertersTest {
 protected:
  // Train batches of 2 records each (global numbers 0..9), a test batch of 3 (100..102).
  void write_valid_set(const std::string& sub = "") {
    if (!sub.empty()) fs::create_directory(path(sub));
    const std::string prefix = sub.empty() ? "" : sub + "/";
    for (int b = 1; b <= 5; ++b)
      write_file(prefix + "data_batch_" + std::to_string(b) + ".bin", cifar_records(2, 2 * (b - 1)));
    write_file(prefix + "test_batch.bin", cifar_records(3, 100));
  }
};

TEST_F(CifarTest, ReadsExactBytesInBatchOrder) {
  write_valid_set();
  const DatasetContents c = read_source_dataset(SourceFormat::kCifar10, dir_, {});
  EXPECT_EQ(c.info.channels, 3);
  EXPECT_EQ(c.info.height, 32);
  EXPECT_EQ(c.info.width, 32);
  EXPECT_EQ(c.info.class_names[0], "airplane");
  EXPECT_EQ(c.info.class_names[9], "truck");
  ASSERT_EQ(c.train_labels.size(), 10u);
  for (int64_t s = 0; s < 10; ++s) {
    EXPECT_EQ(c.train_labels[s], label(s));
    for (int64_t i = 0; i < 3072; i += 97) ASSERT_EQ(c.train_images[s * 3072 + i], pixel(s, i));
  }
  ASSERT_EQ(c.test_labels.size(), 3u);
  EXPECT_EQ(c.test_labels[2], label(102));
  EXPECT_EQ(c.test_images[2 * 3072 + 3071], pixel(102, 3071));

  const DatasetContents cut = read_source_dataset(SourceFormat::kCifar10, dir_, {7, 1});
  EXPECT_EQ(cut.train_labels.size(), 7u);
  EXPECT_EQ(cut.train_images.size(), 7u * 3072);
  EXPECT_EQ(cut.test_labels.size(), 1u);
}

TEST_F(CifarTest, AcceptsTheArchiveFolder) {
  write_valid_set("cifar-10-batches-bin");
  const DatasetContents c = read_source_dataset(SourceFormat::kCifar10, dir_, {});
  EXPECT_EQ(c.train_labels.size(), 10u);
}

TEST_F(CifarTest, BadFiles) {
  write_valid_set();
  std::vector<uint8_t> bytes = cifar_records(2, 4);
  bytes.pop_back();
  write_file("data_batch_3.bin", bytes);
  expect_data_error([&] { read_source_dataset(SourceFormat::kCifar10, dir_, {}); },
                    {"data_batch_3.bin", "6145 bytes", "3073-byte"});

  bytes = cifar_records(2, 4);
  bytes[3073] = 10;  // the second record's label
  write_file("data_batch_3.bin", bytes);
  expect_data_error([&] { read_source_dataset(SourceFormat::kCifar10, dir_, {}); },
                    {"data_batch_3.bin", "record 1 has label 10"});

  write_file("data_batch_3.bin", {});
  expect_data_error([&] { read_source_dataset(SourceFormat::kCifar10, dir_, {}); },
                    {"data_batch_3.bin", "empty file"});

  write_valid_set();
  fs::remove(path("test_batch.bin"));
  expect_data_error([&] { read_source_dataset(SourceFormat::kCifar10, dir_, {}); },
                    {"test_batch.bin", "no such file"});
}

TEST(SourceFormat, Names) {
  EXPECT_EQ(parse_source_format("fashion-mnist"), SourceFormat::kFashionMnist);
  EXPECT_EQ(parse_source_format("mnist"), SourceFormat::kMnist);
  EXPECT_EQ(parse_source_format("cifar10"), SourceFormat::kCifar10);
  EXPECT_THROW(parse_source_format("cifar100"), ConfigError);
}

// --- The npz and pickle parsers on bytes written here: what numpy and pickle do not write (and
// test_convert_sources.sh therefore cannot reach).

namespace {

std::vector<uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

// A .npy member of format `version` with `header` (padded as numpy pads) and `data_bytes` zeros.
std::vector<uint8_t> npy(int version, const std::string& header, size_t data_bytes) {
  std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(version) + '\0';
  const size_t length_bytes = version == 1 ? 2 : 4;
  std::string padded = header;
  while ((out.size() + length_bytes + padded.size() + 1) % 64 != 0) padded += ' ';
  padded += '\n';
  for (size_t i = 0; i < length_bytes; ++i) out += static_cast<char>((padded.size() >> (8 * i)) & 0xff);
  out += padded;
  out.append(data_bytes, '\0');
  return bytes_of(out);
}

}  // namespace

TEST(NpyParse, VersionsOneTwoThree) {
  for (int version : {1, 2, 3}) {
    const NpyArray array = parse_npy(
        "f.npz: x.npy", npy(version, "{'descr': '<i2', 'fortran_order': False, 'shape': (3, 2), }", 12));
    EXPECT_EQ(array.descr, "<i2");
    EXPECT_EQ(array.kind, 'i');
    EXPECT_EQ(array.item_bytes, 2);
    EXPECT_EQ(array.shape, (std::vector<int64_t>{3, 2}));
    EXPECT_EQ(array.count(), 6);
  }
  expect_data_error([] { parse_npy("f.npz: x.npy", npy(4, "{}", 0)); },
                    {"f.npz: x.npy", "version 4"});
}

TEST(NpyParse, Refusals) {
  const std::string where = "f.npz: x.npy";
  expect_data_error([&] { parse_npy(where, bytes_of("PK\x03\x04 not npy")); }, {where, "magic"});
  expect_data_error(
      [&] { parse_npy(where, npy(1, "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,), }", 4)); },
      {where, "structured"});
  expect_data_error(
      [&] { parse_npy(where, npy(1, "{'descr': '|u1', 'shape': (1,), }", 1)); },
      {where, "lacks one of"});
  expect_data_error(
      [&] { parse_npy(where, npy(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (-1,), }", 1)); },
      {where, "not a non-negative integer"});
  expect_data_error(
      [&] { parse_npy(where, npy(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (99999999999999999999,), }", 1)); },
      {where, "over 2^63"});
  expect_data_error(
      [&] { parse_npy(where, npy(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", 5)); },
      {where, "too long: 5 data bytes"});
}

namespace {

Pickle parse(const std::string& bytes) {
  return parse_pickle("p.pkl", reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

}  // namespace

TEST(PickleParse, IntegersAndMemo) {
  // [LONG1 -2, BININT2 513, BININT -7, the list itself again (BINGET 0: a cycle, freed once)]
  static const char kBytes[] = "\x80\x02]q\x00(\x8a\x01\xfeM\x01\x02J\xf9\xff\xff\xffh\x00" "e.";
  const Pickle pickle = parse(std::string(kBytes, sizeof kBytes - 1));
  ASSERT_EQ(pickle.root->kind, PickleValue::Kind::kList);
  ASSERT_EQ(pickle.root->items.size(), 4u);
  EXPECT_EQ(pickle.root->items[0]->integer, -2);
  EXPECT_EQ(pickle.root->items[1]->integer, 513);
  EXPECT_EQ(pickle.root->items[2]->integer, -7);
  EXPECT_EQ(pickle.root->items[3], pickle.root);
}

TEST(PickleParse, Refusals) {
  expect_data_error([] { parse("\x80\x02" "cos\nsystem\n."); }, {"p.pkl", "global os.system"});
  expect_data_error([] { parse(std::string("\x80\x02G\0\0\0\0\0\0\0\0.", 12)); },
                    {"p.pkl", "opcode 0x47 ('G')", "at byte 2"});
  expect_data_error([] { parse("\x80\x02h\x05."); }, {"p.pkl", "memo index 5"});
  expect_data_error([] { parse(std::string("\x80\x02\x8a\x09\0\0\0\0\0\0\0\0\0.", 14)); },
                    {"p.pkl", "over 64 bits"});
  expect_data_error([] { parse("\x80\x02]"); }, {"p.pkl", "truncated pickle"});
  expect_data_error([] { parse("\x80\x02" "a."); }, {"p.pkl", "empty stack"});
  expect_data_error([] { parse("\x80\x06."); }, {"p.pkl", "protocol 6"});
}

TEST(SourceFormat, NewNamesAndLayouts) {
  EXPECT_EQ(parse_source_format("cifar10-python"), SourceFormat::kCifar10Python);
  EXPECT_EQ(parse_source_format("npz"), SourceFormat::kNpz);
  EXPECT_EQ(parse_image_layout("nhwc"), ImageLayout::kNhwc);
  EXPECT_EQ(parse_image_layout("nchw"), ImageLayout::kNchw);
  EXPECT_THROW(parse_image_layout("chw"), ConfigError);
}
