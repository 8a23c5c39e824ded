#include "hpc_train/monitor/tensorboard_events.h"

#include <unistd.h>

#include <array>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "hpc_train/error.h"
#include "hpc_train/io/byte_order.h"

namespace hpc_train {
namespace {

constexpr uint32_t kCrc32cPolynomial = 0x82F63B78u;  // Castagnoli, reflected
constexpr uint32_t kCrcMaskDelta = 0xa282ead8u;      // tensorflow/core/lib/hash/crc32c.h
constexpr const char* kFileVersion = "brain.Event:2";

// Protobuf wire types (https://protobuf.dev/programming-guides/encoding/).
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

// Field numbers of event.proto and summary.proto.
constexpr uint32_t kEventWallTime = 1;     // double
constexpr uint32_t kEventStep = 2;         // int64
constexpr uint32_t kEventFileVersion = 3;  // string
constexpr uint32_t kEventSummary = 5;      // Summary
constexpr uint32_t kEventSessionLog = 7;   // SessionLog
constexpr uint32_t kSummaryValue = 1;      // repeated Summary.Value
constexpr uint32_t kValueTag = 1;          // string
constexpr uint32_t kValueSimpleValue = 2;  // float
constexpr uint32_t kSessionLogStatus = 1;          // enum SessionStatus
constexpr uint32_t kSessionLogCheckpointPath = 2;  // string
constexpr uint32_t kSessionLogMessage = 3;         // string
constexpr uint64_t kSessionStatusStart = 1;        // SessionLog.START

const std::array<uint32_t, 256>& crc32c_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> entries{};
    for (uint32_t byte = 0; byte < 256; ++byte) {
      uint32_t crc = byte;
      for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kCrc32cPolynomial : 0u);
      entries[byte] = crc;
    }
    return entries;
  }();
  return table;
}

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (uint64_t{field} << 3) | wire_type);
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

void put_double(std::string& out, uint32_t field, double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed64);
  append_little_endian(out, bits);
}

void put_float(std::string& out, uint32_t field, float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed32);
  append_little_endian(out, bits);
}

// Event's wall_time and step; the caller adds file_version, summary or session_log.
std::string event_header(double wall_time_s, int64_t step) {
  std::string event;
  put_double(event, kEventWallTime, wall_time_s);
  if (step != 0) {  // proto3: a zero int64 is left out
    put_key(event, kEventStep, kVarint);
    put_varint(event, static_cast<uint64_t>(step));  // negative int64: ten bytes, as protobuf
  }
  return event;
}

double wall_time_now_s() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  const std::array<uint32_t, 256>& table = crc32c_table();
  uint32_t crc = 0xffffffffu;
  for (const char c : data) crc = (crc >> 8) ^ table[(crc ^ static_cast<uint8_t>(c)) & 0xffu];
  return crc ^ 0xffffffffu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + kCrcMaskDelta;
}

std::string tfrecord(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  append_little_endian(record, static_cast<uint64_t>(data.size()));
  append_little_endian(record, masked_crc32c(std::string_view(record.data(), sizeof(uint64_t))));
  record.append(data.data(), data.size());
  append_little_endian(record, masked_crc32c(data));
  return record;
}

std::string event_file_version(double wall_time_s) {
  std::string event = event_header(wall_time_s, 0);
  put_bytes(event, kEventFileVersion, kFileVersion);
  return event;
}

std::string event_scalar(double wall_time_s, int64_t step, const std::string& tag, float value) {
  std::string summary_value;
  put_bytes(summary_value, kValueTag, tag);
  put_float(summary_value, kValueSimpleValue, value);
  std::string summary;
  put_bytes(summary, kSummaryValue, summary_value);
  std::string event = event_header(wall_time_s, step);
  put_bytes(event, kEventSummary, summary);
  return event;
}

std::string event_session_start(double wall_time_s, int64_t step,
                                const std::string& checkpoint_path, const std::string& message) {
  std::string session_log;
  put_key(session_log, kSessionLogStatus, kVarint);
  put_varint(session_log, kSessionStatusStart);
  if (!checkpoint_path.empty()) put_bytes(session_log, kSessionLogCheckpointPath, checkpoint_path);
  if (!message.empty()) put_bytes(session_log, kSessionLogMessage, message);
  std::string event = event_header(wall_time_s, step);
  put_bytes(event, kEventSessionLog, session_log);
  return event;
}

TensorBoardWriter::TensorBoardWriter(const std::string& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error || !std::filesystem::is_directory(directory)) {
    throw Error("TensorBoard directory " + directory + ": cannot create it" +
                (error ? " (" + error.message() + ")" : ""));
  }
  const double now_s = wall_time_now_s();
  // TensorBoard reads every events.out.tfevents.* file of a directory: a resumed run adds its
  // own. Two writers in the same second on the same host (a quick restart) get the pid too,
  // rather than one appending to the other's file.
  std::string path = directory + "/events.out.tfevents." +
                     std::to_string(static_cast<int64_t>(now_s)) + "." + host_name();
  if (std::filesystem::exists(path)) path += "." + std::to_string(getpid());
  file_ = MonitorFile(path, "the TensorBoard monitor");
  file_.append(tfrecord(event_file_version(now_s)));
}

void TensorBoardWriter::write(const std::vector<ScalarEvent>& events) {
  if (path().empty()) return;
  const double now_s = wall_time_now_s();
  // One append: a full disk leaves the file at the previous interval's end, whole records only.
  std::string records;
  for (const ScalarEvent& event : events)
    records +=
        tfrecord(event_scalar(now_s, event.step, event.tag, static_cast<float>(event.value)));
  file_.append(records);
}

void TensorBoardWriter::session_start(int64_t step, const std::string& checkpoint_path,
                                      const std::string& message) {
  if (path().empty()) return;
  file_.append(tfrecord(event_session_start(wall_time_now_s(), step, checkpoint_path, message)));
}

}  // namespace hpc_train
