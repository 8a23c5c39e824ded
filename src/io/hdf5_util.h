// HDF5 helpers of the data part (private): the check macro, RAII handles, and the one lock.
#pragma once

#include <hdf5.h>

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "hpc_train/error.h"

namespace hpc_train::h5 {

// Note [HDF5 lock]: HDF5 keeps global state (the ID tables, the metadata cache, the error stack)
// and is not thread-safe unless built with --enable-threadsafe, which parallel builds never are
// (its configure refuses the combination).
// The loader thread reads while the main thread may open files or write checkpoints, so every
// HDF5 call of the data part — including the H5?close calls of the handles below — happens while
// this one mutex is held. Take it with `h5::Lock` at the top of each public entry point, before
// any handle is created, so that the handles close while it is still held.
inline std::mutex& mutex() {
  static std::mutex instance;
  return instance;
}

class Lock {
 public:
  Lock() : guard_(mutex()) {
    // Our errors travel as exceptions (H5_CHECK), so HDF5 must not print its own stack to
    // stderr. Set on every lock: in thread-safe builds the setting is per thread, and it is cheap.
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }

 private:
  friend class Unlocked;
  std::unique_lock<std::mutex> guard_;
};

// A scope in which `lock` is let go, for a call that takes the lock itself (a DatasetFile read
// inside a write). It is taken back when the scope ends, by an exception too, so that the
// handles made under `lock` still close while it is held.
class Unlocked {
 public:
  explicit Unlocked(Lock& lock) : lock_(lock) { lock_.guard_.unlock(); }
  ~Unlocked() { lock_.guard_.lock(); }
  Unlocked(const Unlocked&) = delete;
  Unlocked& operator=(const Unlocked&) = delete;

 private:
  Lock& lock_;
};

// HDF5's own description of the last failure: the messages of the default error stack, from
// the API call down towards the innermost cause, e.g. "H5Fopen(): unable to open file; ...". The
// first few say what failed and the innermost why; the ones between are plumbing and left out.
// The POSIX driver's innermost message of a failed read or write ("file write failed: time =
// ..., errno = 28, error message = 'No space left on device', buf = ...") is cut to what it says
// ("file write failed: No space left on device").
inline std::string error_stack_message() {
  std::vector<std::string> entries;
  auto collect = [](unsigned, const H5E_error2_t* error, void* data) -> herr_t {
    std::string description = error->desc ? error->desc : "";
    const std::string os_error = "error message = '";
    const size_t at = description.find(os_error);
    if (at != std::string::npos) {
      const size_t begin = at + os_error.size();
      description = description.substr(0, description.find(':')) + ": " +
                    description.substr(begin, description.find('\'', begin) - begin);
    }
    static_cast<std::vector<std::string>*>(data)->push_back(
        std::string(error->func_name ? error->func_name : "?") + "(): " + description);
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &entries);
  H5Eclear2(H5E_DEFAULT);
  constexpr size_t kFirstEntries = 6;
  std::string message;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i >= kFirstEntries && i + 1 < entries.size()) continue;
    message += (i == 0 ? "" : i > kFirstEntries ? "; ...; " : "; ") + entries[i];
  }
  for (char& c : message)  // some HDF5 messages embed a ctime() stamp with its newline
    if (c == '\n') c = ' ';
  return message.empty() ? std::string("HDF5 reported no details") : message;
}

// A negative hid_t/herr_t/htri_t becomes a DataError (every HDF5 call here touches a user's data
// file, so its failure is a problem with that file) naming file:line, the expression and HDF5's
// own message. Returns the value, so that `H5_CHECK(H5Dopen2(...))` can initialise a handle.
template <typename T>
T check(T value, const char* file, int line, const char* expr) {
  if (value < 0) throw DataError(describe_failed_call(file, line, expr, error_stack_message()));
  return value;
}

// An hid_t that closes itself. Non-copyable, movable; the destructor never throws (a failed
// close is ignored: there is nobody to tell and nothing to do).
template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  ~Handle() { reset(); }
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() noexcept {
    if (id_ >= 0) Close(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

using File = Handle<H5Fclose>;
using Group = Handle<H5Gclose>;
using Dataset = Handle<H5Dclose>;
using Dataspace = Handle<H5Sclose>;
using Type = Handle<H5Tclose>;  // only for types we own (H5Dget_type, H5Tcopy), never H5T_NATIVE_*
using Attribute = Handle<H5Aclose>;
using PropertyList = Handle<H5Pclose>;

}  // namespace hpc_train::h5

#define H5_CHECK(expr) ::hpc_train::h5::check((expr), __FILE__, __LINE__, #expr)
