// Test helpers for refusals and raw files: an exception whose message names what it should, and
// a file's bytes read or written whole (to corrupt or truncate it).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "hpc_train/error.h"

namespace test_support {

// Expects `action` to throw an E whose message contains every one of `parts`.
template <typename E, typename F>
void expect_error(F&& action, const std::vector<std::string>& parts) {
  try {
    action();
    ADD_FAILURE() << "nothing thrown; expected a message with '" << parts.front() << "'";
  } catch (const E& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message: " << e.what() << "\nmissing: " << part;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "another exception: " << e.what();
  }
}

template <typename F>
void expect_data_error(F&& action, const std::vector<std::string>& parts) {
  expect_error<hpc_train::DataError>(std::forward<F>(action), parts);
}

// The message of the DataError that `action` throws for the file `path`; a test failure when
// nothing is thrown or the message does not name `path`.
template <typename F>
std::string data_error_naming(const std::string& path, F&& action) {
  try {
    action();
  } catch (const hpc_train::DataError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    return e.what();
  }
  ADD_FAILURE() << path << " was accepted";
  return "";
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

}  // namespace test_support
