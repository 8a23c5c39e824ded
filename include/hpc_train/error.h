// Errors and exit codes.
//
// Library code throws `Error` (or a subclass naming the kind of problem); `main` catches once,
// prints the message with the rank and host, and ends the whole job with the exception's exit
// code (runtime.h). Destructors never throw. One check macro per library (MPI_CHECK here,
// H5_CHECK in the HDF5 code) turns a failed call into an `Error` that names file:line, the
// expression and the library's own error string.
#pragma once

#include <stdexcept>
#include <string>

namespace hpc_train {

// Exit codes of both executables (documented in docs/usage.md, "Exit codes").
enum ExitCode : int {
  kExitOk = 0,
  kExitRuntimeError = 1,  // a library call failed, or an internal invariant broke
  kExitUsageError = 2,    // bad command line, config file or option value
  kExitDataError = 3,     // a missing, foreign, truncated or inconsistent input file
  // Stopped by SIGUSR1 or SIGTERM after writing a checkpoint: run again with --resume auto
  // (EX_TEMPFAIL; jobscripts/train_requeue.sbatch turns it into `scontrol requeue`).
  kExitPreempted = 75,
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, int exit_code = kExitRuntimeError)
      : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const noexcept { return exit_code_; }

 private:
  int exit_code_;
};

// The user asked for something that cannot work: the message says what to change.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(what, kExitUsageError) {}
};

// An input file is missing or wrong: the message names the file and what is wrong with it.
class DataError : public Error {
 public:
  explicit DataError(const std::string& what) : Error(what, kExitDataError) {}
};

// "file:line: expr failed: detail" — used by the per-library check macros.
std::string describe_failed_call(const char* file, int line, const char* expr,
                                 const std::string& detail);

}  // namespace hpc_train

// MPI calls: throws Error with MPI's own error string.
#define MPI_CHECK(expr)                                                                   \
  do {                                                                                    \
    int mpi_check_rc_ = (expr);                                                           \
    if (mpi_check_rc_ != MPI_SUCCESS)                                                     \
      throw ::hpc_train::Error(::hpc_train::describe_failed_call(                         \
          __FILE__, __LINE__, #expr, ::hpc_train::mpi_error_string(mpi_check_rc_)));      \
  } while (0)

namespace hpc_train {
std::string mpi_error_string(int mpi_error_code);
}
