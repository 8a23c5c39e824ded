// TensorBoard's event files, written by hand: no TensorFlow, no protobuf library (DESIGN.md: no
// new third-party dependency). Two layers, both small:
//
//   TFRecord framing   each record is  uint64 length | uint32 masked crc32c(length bytes) |
//                      data | uint32 masked crc32c(data), all little-endian
//                      (tensorflow/core/lib/io/record_writer.cc); mask = rotate right by 15,
//                      plus 0xa282ead8 (tensorflow/core/lib/hash/crc32c.h)
//   Event protobuf     wall_time = 1 (double), step = 2 (int64), file_version = 3 (string,
//                      "brain.Event:2" in the file's first event), summary = 5 (Summary: repeated
//                      Value value = 1; Value: tag = 1 (string), simple_value = 2 (float)),
//                      session_log = 7 (SessionLog: status = 1 (enum; START = 1),
//                      checkpoint_path = 2 (string), msg = 3 (string))
//                      (tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto)
//
// TensorBoardWriter puts them in a file named events.out.tfevents.<unix seconds>.<hostname>, as
// TensorBoard expects, and writes every batch of events at once so that a live TensorBoard sees
// each log interval as it is written.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hpc_train/monitor/metrics.h"

namespace hpc_train {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses; RFC 3720 B.4 gives
// test vectors.
uint32_t crc32c(std::string_view data);
// TFRecord's masked CRC: a CRC stored next to the data it covers would be confusing to CRC
// again, so it is rotated and offset.
uint32_t masked_crc32c(std::string_view data);

// One TFRecord: the framing around `data`.
std::string tfrecord(std::string_view data);

// Event protobufs (serialized, not framed).
std::string event_file_version(double wall_time_s);  // file_version "brain.Event:2"
std::string event_scalar(double wall_time_s, int64_t step, const std::string& tag, float value);
// A SessionLog with status START: a restart at `step` (Note [Resume in TensorBoard]).
std::string event_session_start(double wall_time_s, int64_t step,
                                const std::string& checkpoint_path, const std::string& message);

// Appends scalar events to one event file in `directory` (created with its parents). A
// default-constructed writer (other ranks, TensorBoard off) drops everything; so does one whose
// file cannot be written, after one warning (Note [Monitors never end the run] in metrics.h).
class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  // Throws Error naming the directory when it cannot be created.
  explicit TensorBoardWriter(const std::string& directory);
  // One Event per scalar, written at once.
  void write(const std::vector<ScalarEvent>& events);
  // A SessionLog START at `step` (samples seen, as the scalars' steps), naming the checkpoint
  // the run resumed from, written at once (Note [Resume in TensorBoard]).
  void session_start(int64_t step, const std::string& checkpoint_path, const std::string& message);
  const std::string& path() const { return file_.path(); }

 private:
  MonitorFile file_;
};

}  // namespace hpc_train
