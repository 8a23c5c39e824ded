// What every fuzz target shares: files for parsers that take a path, one input split into
// several files, and the line between a rejection and a finding.
//
// Note [What a finding is]: a parser may reject any input, but only by throwing hpc_train::Error
// (or a subclass: DataError, ConfigError), the documented way (error.h). Everything else is a
// finding that ends the run and makes libFuzzer save the input: a crash, a sanitizer report
// (ASan, UBSan; all fatal), a leak (LeakSanitizer), an allocation over -malloc_limit_mb,
// any other exception (it escapes LLVMFuzzerTestOneInput, std::terminate prints its type and
// what()), an HDF5 object left open, and an accepted input that breaks what the parser promises
// its caller (fail_unless).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hpc_train/data/converters.h"
#include "hpc_train/error.h"

namespace hpc_train::fuzz {

// A directory of this process under $TMPDIR (CTest points it into the build tree), created on
// first use and removed at a normal exit; after a crash it stays next to the saved input.
const std::string& scratch_directory();

// `name` in the scratch directory.
std::string scratch_path(const std::string& name);

// Writes `bytes` to `path`, replacing the file.
void write_file(const std::string& path, std::string_view bytes);

// Note [Several files in one input]: a parser that reads several files (the IDX and CIFAR-10
// converters) gets them from one input, separated by kFileSeparator: the first `count` parts are
// the files, in order; a part that the input does not reach is a file that does not exist. The
// seed corpora hold such inputs (make_seeds.cpp).
inline constexpr std::string_view kFileSeparator = "#FILE#";
// The converters' fuzz targets: writes the input's files under `names` into a fresh scratch
// directory `directory_name`, converts that directory as `format` (read_source_dataset) and hands
// what it read to `check` (fail_unless); a rejection is not a finding (parse_or_reject).
void convert_input_files(SourceFormat format, const std::string& directory_name,
                         const uint8_t* data, size_t size, const std::vector<std::string>& names,
                         const std::function<void(const DatasetContents&)>& check);

// What write_dataset_file relies on, for both CIFAR-10 converters (binary and python): 3x32x32
// images, whole samples with one label each, labels inside the classes, in both splits.
void check_cifar10_contents(const DatasetContents& contents);

void report_rejection(const Error& error);  // parse_or_reject's

// Note [What a finding is]. Runs `parse`; an hpc_train::Error is a normal rejection (printed
// when HPC_TRAIN_FUZZ_VERBOSE is set, to see why an input is refused).
template <class Parse>
void parse_or_reject(Parse&& parse) {
  try {
    parse();
  } catch (const Error& e) {
    report_rejection(e);
  }
}

// Note [What a finding is]: an accepted input broke a promise of the parser. Prints `what` and
// aborts (libFuzzer saves the input).
void fail_unless(bool holds, const std::string& what);

// Note [What a finding is]: the parsers close every HDF5 object they open, also when they throw.
// A handle left open would also keep the file open inside HDF5, so that the next input written
// under the same name would be read through the stale metadata of the previous one.
void require_no_open_hdf5_objects();

// For LLVMFuzzerInitialize of the HDF5 targets: HDF5 prints its error stack to stderr unless
// told not to (the parsers turn it off under their lock; this, before any call), and its free
// lists are left unbounded, for speed (fuzz_support.cpp says why).
void prepare_hdf5();

// a x b, or nullopt when it does not fit in 64 bits.
std::optional<uint64_t> checked_product(uint64_t a, uint64_t b);

}  // namespace hpc_train::fuzz
