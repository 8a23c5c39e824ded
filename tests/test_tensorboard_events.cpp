// The monitors' writers on known bytes: CRC-32C against RFC 3720's test vectors, Event
// protobufs (a scalar, a SessionLog START) spelt out byte by byte from event.proto's and
// summary.proto's field numbers, the TFRecord framing, the event file's name and first record,
// and DeepSpeed's CSV layout.
// tests/test_tensorboard_run.sh reads a real run's files with an independent reader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "hpc_train/monitor/csv_monitor.h"
#include "hpc_train/monitor/tensorboard_events.h"

using namespace hpc_train;
namespace fs = std::filesystem;

namespace {

std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (int value : values) out.push_back(static_cast<char>(value));
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

uint32_t little_endian_32(const std::string& data, size_t at) {
  uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(data[at + i]);
  return value;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "hpc_train_tensorboard_XXXXXX").string();
    if (mkdtemp(pattern.data())) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

// RFC 3720 (iSCSI), appendix B.4: CRC-32C of 32-byte patterns; and the customary check value.
TEST(Crc32c, MatchesRfc3720TestVectors) {
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
}

// TensorFlow's crc32c::Mask: rotate right by 15 bits, add 0xa282ead8.
TEST(Crc32c, MaskIsRotateAndOffset) {
  const uint32_t crc = 0xE3069283u;  // of "123456789"
  EXPECT_EQ(masked_crc32c("123456789"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  EXPECT_EQ(masked_crc32c(""), 0xa282ead8u);  // CRC 0 rotates to 0
}

TEST(TensorBoardEvents, ScalarEventBytes) {
  // Event{wall_time=1.0, step=5, summary=Summary{value=[Value{tag="a", simple_value=0.5}]}}
  const std::string expected =
      bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f,  // field 1, fixed64: 1.0
             0x10, 0x05,                           // field 2, varint: 5
             0x2a, 0x0a,                           // field 5, 10 bytes: Summary
             0x0a, 0x08,                           //   field 1, 8 bytes: Value
             0x0a, 0x01, 'a',                      //     field 1: tag "a"
             0x15, 0, 0, 0, 0x3f});                //     field 2, fixed32: 0.5f
  EXPECT_EQ(event_scalar(1.0, 5, "a", 0.5f), expected);
}

TEST(TensorBoardEvents, LargeStepIsAVarint) {
  // 300 = 0b1_0010_1100: low seven bits with the continuation bit, then 2.
  const std::string event = event_scalar(0.0, 300, "t", 1.0f);
  EXPECT_EQ(event.substr(9, 3), bytes({0x10, 0xac, 0x02}));
}

TEST(TensorBoardEvents, FileVersionEventBytes) {
  const std::string expected = bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x1a, 13}) + "brain.Event:2";
  EXPECT_EQ(event_file_version(0.0), expected);
}

TEST(TensorBoardEvents, SessionStartEventBytes) {
  // Event{wall_time=1.0, step=73, session_log=SessionLog{status=START, checkpoint_path="c.h5",
  // msg="m"}}: event.proto's Event.session_log = 7, SessionLog's status = 1 (START = 1),
  // checkpoint_path = 2, msg = 3.
  const std::string expected =
      bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f,  // field 1, fixed64: 1.0
             0x10, 73,                             // field 2, varint: 73
             0x3a, 0x0b,                           // field 7, 11 bytes: SessionLog
             0x08, 0x01,                           //   field 1, varint: START
             0x12, 0x04, 'c', '.', 'h', '5',       //   field 2: checkpoint_path
             0x1a, 0x01, 'm'});                    //   field 3: msg
  EXPECT_EQ(event_session_start(1.0, 73, "c.h5", "m"), expected);
}

TEST(TensorBoardEvents, TfRecordFraming) {
  const std::string data = "123456789";
  const std::string record = tfrecord(data);
  ASSERT_EQ(record.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(record.substr(0, 8), bytes({9, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(little_endian_32(record, 8), masked_crc32c(record.substr(0, 8)));
  EXPECT_EQ(record.substr(12, data.size()), data);
  EXPECT_EQ(little_endian_32(record, 12 + data.size()), masked_crc32c(data));
}

TEST(TensorBoardWriter, NamesTheFileAndStartsWithTheFileVersion) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string directory = dir.path() + "/nested/tensorboard";
  const int64_t before_s = static_cast<int64_t>(std::time(nullptr));
  TensorBoardWriter writer(directory);
  writer.write({{"Train/Samples/lr", 0.25, 64}, {"Train/Samples/train_loss", 1.5, 64}});
  const std::string name = fs::path(writer.path()).filename().string();
  const std::string prefix = "events.out.tfevents.";
  ASSERT_EQ(name.rfind(prefix, 0), 0u) << name;
  const std::string rest = name.substr(prefix.size());
  const int64_t stamp_s = std::stoll(rest.substr(0, rest.find('.')));
  EXPECT_GE(stamp_s, before_s);
  EXPECT_LE(stamp_s, before_s + 5);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  EXPECT_EQ(rest.substr(rest.find('.') + 1), std::string(host));

  // Flushed: the file holds all three records now, while the writer is open.
  const std::string file = read_file(writer.path());
  size_t at = 0;
  std::vector<std::string> events;
  while (at < file.size()) {
    ASSERT_LE(at + 12, file.size());
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(file[at + i]);
    ASSERT_LE(at + 16 + length, file.size());
    events.push_back(file.substr(at + 12, length));
    EXPECT_EQ(little_endian_32(file, at + 12 + length), masked_crc32c(events.back()));
    at += 16 + length;
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_NE(events[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(events[1].find("Train/Samples/lr"), std::string::npos);
  EXPECT_EQ(events[2].substr(9), event_scalar(0.0, 64, "Train/Samples/train_loss", 1.5f).substr(9));
}

TEST(TensorBoardWriter, DefaultWriterDropsEvents) {
  TensorBoardWriter writer;
  EXPECT_NO_THROW(writer.write({{"x", 1.0, 1}}));
  EXPECT_TRUE(writer.path().empty());
}

TEST(TensorBoardWriter, UncreatableDirectoryIsNamed) {
  TempDir dir;
  const std::string blocker = dir.path() + "/file";
  std::ofstream(blocker) << "x";
  try {
    TensorBoardWriter writer(blocker + "/tensorboard");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(blocker + "/tensorboard"), std::string::npos) << e.what();
  }
}

TEST(CsvMonitor, FileNamesAsDeepSpeed) {
  EXPECT_EQ(csv_monitor_file_name("Train/Samples/train_loss"), "Train_Samples_train_loss.csv");
  EXPECT_EQ(csv_monitor_file_name("my tag/x"), "my_tag_x.csv");
  EXPECT_EQ(csv_monitor_file_name("plain"), "plain.csv");
}

TEST(CsvMonitor, HeaderOnceThenRows) {
  TempDir dir;
  const std::string directory = dir.path() + "/job";
  {
    CsvMonitorWriter writer(directory);
    writer.write({{"Train/Samples/lr", 0.001, 64}, {"plain", 2.0, 64}});
    writer.write({{"Train/Samples/lr", 0.0005, 128}});
  }
  // A second writer (a resumed run) appends rows without a second header.
  CsvMonitorWriter(directory).write({{"Train/Samples/lr", 0.1, 192}});
  EXPECT_EQ(read_file(directory + "/Train_Samples_lr.csv"),
            "step,lr\r\n64,0.001\r\n128,0.0005\r\n192,0.1\r\n");
  EXPECT_EQ(read_file(directory + "/plain.csv"), "step,plain\r\n64,2.0\r\n");
}
