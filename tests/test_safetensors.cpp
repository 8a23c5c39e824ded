// safetensors: files written by write_safetensors are read back by a reader written here, apart
// from the library (length field, JSON header, dtypes, shapes, offsets, bytes), and by the
// library's reader; malformed entries are refused; corrupt and truncated files give a DataError
// that names the file; a failed write leaves the previous file and no temporary behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <tuple>

#include "hpc_train/error.h"
#include "hpc_train/io/safetensors.h"
#include "expect_error.h"

using namespace hpc_train;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "hpc_train_safetensors_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  std::vector<std::string> directory_listing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
};

using ::test_support::expect_data_error;
using ::test_support::expect_error;
using ::test_support::read_bytes;
using ::test_support::write_bytes;

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// A file made by hand: the length field, `header` padded to 8 bytes, `data_bytes` bytes of data.
std::vector<uint8_t> handmade_file(const std::string& header, size_t data_bytes, bool pad = true) {
  std::string text = header;
  while (pad && text.size() % 8 != 0) text += ' ';
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 8; ++i)
    bytes.push_back(static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i)));
  bytes.insert(bytes.end(), text.begin(), text.end());
  for (size_t i = 0; i < data_bytes; ++i) bytes.push_back(static_cast<uint8_t>(i * 7 + 1));
  return bytes;
}

// The tensors of the round-trip tests: several dtypes, a scalar, an empty tensor, odd sizes.
struct Sample {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  size_t element_bytes;
};

std::vector<Sample> sample_tensors() {
  std::vector<float> conv(2 * 3 * 3);
  for (size_t i = 0; i < conv.size(); ++i) conv[i] = 0.25f * static_cast<float>(i) - 1.0f;
  return {
      {"conv1.weight", "F32", {2, 1, 3, 3}, as_bytes(conv), 4},
      {"bn1.num_batches_tracked", "I64", {}, as_bytes(std::vector<int64_t>{123456789012}), 8},
      {"half", "F16", {3}, as_bytes(std::vector<uint16_t>{0x3c00, 0xc000, 0x7bff}), 2},
      {"brain", "BF16", {1, 3}, as_bytes(std::vector<uint16_t>{0x3f80, 0x4000, 0xbf80}), 2},
      {"empty", "F32", {0, 4}, {}, 4},
      {"bytes", "U8", {5}, {1, 2, 3, 250, 255}, 1},
      {"layer1.0.downsample.1.running_var",
       "F64",
       {2},
       as_bytes(std::vector<double>{1.5, -2.25}),
       8},
      {"ints", "I32", {2, 2, 1}, as_bytes(std::vector<int32_t>{-1, 2, -3, 2147483647}), 4},
  };
}

std::vector<SafetensorsEntry> entries_of(const std::vector<Sample>& samples) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& s : samples)
    entries.push_back(
        {s.name, s.dtype, s.shape, s.bytes.empty() ? nullptr : s.bytes.data(), s.bytes.size()});
  return entries;
}

const std::map<std::string, std::string> kMetadata = {
    {"format", "hpc_train weights"}, {"model", "simple_cnn"}, {"channels", "1"}};

}  // namespace

// The reader of this test: the file as bytes, the length field and the JSON taken apart here.
TEST_F(SafetensorsTest, IndependentReaderSeesWhatWasWritten) {
  const auto samples = sample_tensors();
  const std::string file = path("weights.safetensors");
  write_safetensors(file, entries_of(samples), kMetadata);

  const std::vector<uint8_t> bytes = read_bytes(file);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_length = 0;
  for (int i = 0; i < 8; ++i) header_length |= uint64_t{bytes[i]} << (8 * i);
  ASSERT_LE(8 + header_length, bytes.size());
  EXPECT_EQ(header_length % 8, 0u) << "the header is padded to a multiple of 8";
  const std::string header_text(bytes.begin() + 8, bytes.begin() + 8 + header_length);
  EXPECT_EQ(header_text.front(), '{');
  const size_t close = header_text.find_last_not_of(' ');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(header_text[close], '}') << "only spaces pad the header";
  EXPECT_LT(header_text.size() - close - 1, 8u);

  const json header = json::parse(header_text);
  ASSERT_TRUE(header.is_object());
  EXPECT_EQ(header.size(), samples.size() + 1);
  ASSERT_TRUE(header.contains("__metadata__"));
  EXPECT_EQ(header["__metadata__"], json(kMetadata));

  const uint64_t data_start = 8 + header_length;
  uint64_t data_bytes = 0;
  // (begin, end, name): an empty tensor sorts before the one that starts where it is.
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> by_offset;
  for (const auto& s : samples) {
    SCOPED_TRACE(s.name);
    ASSERT_TRUE(header.contains(s.name));
    const json& entry = header[s.name];
    EXPECT_EQ(entry.size(), 3u);
    EXPECT_EQ(entry["dtype"], s.dtype);
    EXPECT_EQ(entry["shape"], json(s.shape));
    ASSERT_TRUE(entry["shape"].is_array());
    const json& offsets = entry["data_offsets"];
    ASSERT_TRUE(offsets.is_array());
    ASSERT_EQ(offsets.size(), 2u);
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    ASSERT_EQ(end - begin, s.bytes.size());
    EXPECT_EQ(begin % s.element_bytes, 0u)
        << "each tensor starts at a multiple of its element size";
    ASSERT_LE(data_start + end, bytes.size());
    EXPECT_EQ(
        std::vector<uint8_t>(bytes.begin() + data_start + begin, bytes.begin() + data_start + end),
        s.bytes);
    data_bytes += s.bytes.size();
    by_offset.emplace_back(begin, end, s.name);
  }
  EXPECT_EQ(bytes.size(), data_start + data_bytes) << "the data ends the file, no gap, no tail";

  // Contiguous, larger elements first, otherwise in the order given.
  std::sort(by_offset.begin(), by_offset.end());
  std::vector<std::string> layout;
  for (const auto& [begin, end, name] : by_offset) layout.push_back(name);
  const std::vector<std::string> expected_layout = {"bn1.num_batches_tracked",
                                                    "layer1.0.downsample.1.running_var",
                                                    "conv1.weight",
                                                    "empty",
                                                    "ints",
                                                    "half",
                                                    "brain",
                                                    "bytes"};
  EXPECT_EQ(layout, expected_layout);
  uint64_t covered = 0;
  for (const auto& name : layout) {
    const json& offsets = header[name]["data_offsets"];
    EXPECT_EQ(offsets[0].get<uint64_t>(), covered) << name;
    covered = offsets[1].get<uint64_t>();
  }
  EXPECT_EQ(covered, data_bytes);
}

TEST_F(SafetensorsTest, LibraryReaderSeesWhatWasWritten) {
  const auto samples = sample_tensors();
  const std::string file = path("weights.safetensors");
  write_safetensors(file, entries_of(samples), kMetadata);

  const SafetensorsHeader header = read_safetensors_header(file);
  EXPECT_EQ(header.metadata, kMetadata);
  EXPECT_EQ(header.file_bytes, fs::file_size(file));
  EXPECT_EQ(header.data_start % 8, 0u);
  ASSERT_EQ(header.tensors.size(), samples.size());
  EXPECT_EQ(header.tensors.front().name, "bn1.num_batches_tracked");  // in data order
  for (const auto& s : samples) {
    SCOPED_TRACE(s.name);
    const SafetensorsTensorInfo* info = header.find(s.name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, s.dtype);
    EXPECT_EQ(info->shape, s.shape);
    EXPECT_EQ(info->bytes(), s.bytes.size());
    EXPECT_EQ(read_safetensors_tensor(file, header, s.name), s.bytes);
  }
  EXPECT_EQ(header.find("missing"), nullptr);
  expect_data_error([&] { read_safetensors_tensor(file, header, "missing"); },
                    {file, "\"missing\""});
}

// The bytes the format prescribes, spelled out: length, compact JSON, space padding, data.
TEST_F(SafetensorsTest, ExactBytesOfASmallFile) {
  const std::vector<float> values = {1.0f, -2.0f};
  const std::string file = path("small.safetensors");
  write_safetensors(file, {{"w", "F32", {2}, values.data(), 8}});
  const std::string json_text = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<uint8_t> expected = handmade_file(json_text, 0);
  const auto data = as_bytes(values);
  expected.insert(expected.end(), data.begin(), data.end());
  EXPECT_EQ(read_bytes(file), expected);
  EXPECT_EQ(expected[0], 56);  // 53 bytes of JSON, padded to 56

  // No tensors and no metadata: "{}" and six spaces.
  const std::string nothing = path("nothing.safetensors");
  write_safetensors(nothing, {});
  EXPECT_EQ(read_bytes(nothing), handmade_file("{}", 0));
  const SafetensorsHeader header = read_safetensors_header(nothing);
  EXPECT_TRUE(header.tensors.empty());
  EXPECT_TRUE(header.metadata.empty());
}

TEST_F(SafetensorsTest, MalformedEntriesAreRefused) {
  const std::string file = path("bad.safetensors");
  const std::vector<float> four(4, 1.0f);
  // One refused write: `entries` to `file`, an Error whose message has every one of `parts`.
  const auto refused = [&](std::vector<SafetensorsEntry> entries,
                           std::initializer_list<std::string> parts) {
    expect_error<Error>([&] { write_safetensors(file, entries); }, parts);
  };
  refused({{"fc.weight", "F32", {2, 3}, four.data(), 16}},
          {file, "fc.weight", "[2, 3]", "24 bytes", "16"});
  refused({{"x", "F33", {4}, four.data(), 16}}, {file, "\"x\"", "unknown dtype \"F33\"", "F32"});
  refused({{"x", "F32", {-1, 4}, four.data(), 16}}, {file, "negative"});
  refused({{"a", "F32", {4}, four.data(), 16}, {"a", "F32", {2}, four.data(), 8}},
          {file, "\"a\"", "twice"});
  refused({{"__metadata__", "F32", {4}, four.data(), 16}}, {file, "reserved"});
  refused({{"x", "F32", {4}, nullptr, 16}}, {file, "null"});
  refused({{"bad\xff", "F32", {4}, four.data(), 16}}, {file, "UTF-8"});
  expect_error<Error>([&] { write_safetensors(path("no/such/dir/w.safetensors"), {}); },
                      {"no/such/dir"});
  EXPECT_TRUE(directory_listing().empty()) << "nothing written for a refused entry";
}

// Rewriting replaces the file; a write that fails half-way (the file-size limit stands in for a
// full disk) leaves the previous file whole and no temporary file.
TEST_F(SafetensorsTest, WritesAreAtomic) {
  const std::string file = path("model.safetensors");
  const std::vector<float> small(3, 2.0f);
  write_safetensors(file, {{"w", "F32", {3}, small.data(), 12}});
  const std::vector<uint8_t> first = read_bytes(file);

  const std::vector<float> other(3, -7.0f);
  write_safetensors(file, {{"w", "F32", {3}, other.data(), 12}}, {{"step", "2"}});
  EXPECT_EQ(read_safetensors_header(file).metadata.at("step"), "2");
  EXPECT_EQ(read_safetensors_tensor(file, read_safetensors_header(file), "w"), as_bytes(other));
  const std::vector<uint8_t> second = read_bytes(file);
  EXPECT_NE(first, second);
  EXPECT_EQ(directory_listing(), std::vector<std::string>{"model.safetensors"});

  const std::vector<float> large(1 << 18, 3.0f);  // 1 MiB
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto previous_handler = signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG
  rlimit limited = saved;
  limited.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  bool threw = false;
  try {
    write_safetensors(file, {{"w", "F32", {1 << 18}, large.data(), large.size() * 4}});
  } catch (const Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, previous_handler);
  EXPECT_TRUE(threw);
  EXPECT_EQ(read_bytes(file), second);
  EXPECT_EQ(directory_listing(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsTest, EveryTruncationIsADataError) {
  const auto samples = sample_tensors();
  const std::string file = path("weights.safetensors");
  write_safetensors(file, entries_of(samples), kMetadata);
  const std::vector<uint8_t> whole = read_bytes(file);
  const std::string cut = path("cut.safetensors");
  for (size_t length = 0; length < whole.size(); ++length) {
    write_bytes(cut, std::vector<uint8_t>(whole.begin(), whole.begin() + length));
    SCOPED_TRACE("truncated to " + std::to_string(length) + " bytes");
    expect_data_error([&] { read_safetensors_header(cut); }, {cut});
  }
  // Cut inside the data: the message says so.
  write_bytes(cut, std::vector<uint8_t>(whole.begin(), whole.end() - 1));
  expect_data_error([&] { read_safetensors_header(cut); }, {cut, "truncated"});
  // One byte too many is as wrong.
  std::vector<uint8_t> longer = whole;
  longer.push_back(0);
  write_bytes(cut, longer);
  expect_data_error([&] { read_safetensors_header(cut); }, {cut, "1 bytes after"});
}

TEST_F(SafetensorsTest, CorruptFilesAreDataErrors) {
  const std::string file = path("corrupt.safetensors");
  const auto expect_header_error = [&](const std::vector<uint8_t>& bytes,
                                       std::initializer_list<std::string> parts) {
    write_bytes(file, bytes);
    expect_data_error([&] { read_safetensors_header(file); }, parts);
  };
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  write_bytes(file, handmade_file(ok, 8));
  ASSERT_NO_THROW(read_safetensors_header(file));

  // The length field.
  auto huge = handmade_file(ok, 8);
  huge[5] = 0x10;
  expect_header_error(huge, {file, "limit"});
  auto past_end = handmade_file(ok, 8);
  past_end[0] = static_cast<uint8_t>(past_end[0] + 17);
  expect_header_error(past_end, {file, "past the end"});
  expect_header_error({1, 2, 3}, {file, "too short"});
  expect_header_error({}, {file, "too short"});

  // The JSON.
  expect_header_error(handmade_file(R"({"a":{"dtype":"F32",)", 0), {file, "not valid JSON"});
  expect_header_error(handmade_file("\x89PNG\r\n\x1a\n", 0), {file, "not valid JSON"});
  expect_header_error(handmade_file("[1, 2]", 0), {file, "not a JSON object"});
  expect_header_error(handmade_file(ok + "x", 8), {file, "not valid JSON"});
  expect_header_error(handmade_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                    R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                    8),
                      {file, "\"a\" twice"});
  // A number beyond a double's range: nlohmann throws out_of_range, not parse_error.
  expect_header_error(handmade_file(R"({"a":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}})",
                                    4),
                      {file, "not valid JSON", "number overflow parsing '1e400'"});
  // 100,000 nested arrays overflowed the stack while the message quoted them.
  expect_header_error(
      handmade_file(R"({"a":)" + std::string(100000, '[') + std::string(100000, ']') + "}", 0),
      {file, "more than 128 levels deep"});
  expect_header_error(
      handmade_file(R"({"a":)" + std::string(126, '[') + std::string(126, ']') + "}", 0),
      {file, "\"a\"", "expected an object"});

  // An entry.
  expect_header_error(handmade_file(R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8),
                      {file, "\"a\"", "unknown dtype"});
  expect_header_error(handmade_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8),
                      {file, "\"a\"", "no \"dtype\""});
  expect_header_error(
      handmade_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
      {file, "\"a\"", "non-negative"});
  expect_header_error(
      handmade_file(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
      {file, "\"a\"", "non-negative"});
  expect_header_error(handmade_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                      {file, "\"a\"", "needs 12 bytes"});
  expect_header_error(handmade_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
                      {file, "\"a\"", "end before"});
  expect_header_error(handmade_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
                      {file, "\"a\"", "[begin, end]"});
  expect_header_error(
      handmade_file(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],)"
                    R"("data_offsets":[0,8]}})",
                    8),
      {file, "\"a\"", "too large"});
  expect_header_error(handmade_file(R"({"a":[1]})", 8), {file, "\"a\"", "expected an object"});

  // Offsets against each other and against the file.
  expect_header_error(handmade_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                    12),
                      {file, "\"b\"", "gap"});
  expect_header_error(handmade_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                    8),
                      {file, "overlap"});
  expect_header_error(handmade_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                      {file, "\"a\"", "gap"});
  expect_header_error(handmade_file(ok, 4), {file, "truncated"});

  // The metadata.
  expect_header_error(handmade_file(R"({"__metadata__":{"epoch":3}})", 0),
                      {file, "__metadata__", "epoch", "strings"});
  expect_header_error(handmade_file(R"({"__metadata__":"x"})", 0), {file, "__metadata__"});

  // Not a file at all.
  expect_data_error([&] { read_safetensors_header(path("missing.safetensors")); },
                    {"missing.safetensors", "cannot open"});
  expect_data_error([&] { read_safetensors_header(dir_); }, {dir_});

  // The exit code of a data error.
  try {
    read_safetensors_header(path("missing.safetensors"));
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitDataError);
  }
}

// Files of other writers: no padding, tensors in any order in the JSON, metadata first or last.
TEST_F(SafetensorsTest, ReadsFilesOfOtherWriters) {
  const std::string file = path("other.safetensors");
  write_bytes(file, handmade_file(R"({"b":{"dtype":"I32","shape":[1],"data_offsets":[4,8]},)"
                                  R"( "a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                                  R"( "__metadata__":{"format":"pt"}})",
                                  8, /*pad=*/false));
  const SafetensorsHeader header = read_safetensors_header(file);
  ASSERT_EQ(header.tensors.size(), 2u);
  EXPECT_EQ(header.tensors[0].name, "a");
  EXPECT_TRUE(header.tensors[0].shape.empty());
  EXPECT_EQ(header.tensors[1].name, "b");
  EXPECT_EQ(header.metadata.at("format"), "pt");
  const auto b = read_safetensors_tensor(file, header, "b");
  EXPECT_EQ(b, (std::vector<uint8_t>{4 * 7 + 1, 5 * 7 + 1, 6 * 7 + 1, 7 * 7 + 1}));
}
