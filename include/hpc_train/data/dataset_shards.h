// A dataset given as several HDF5 files ("shards") of one layout: what `--dataset` names, the
// shard index file, and the writer of a sharded set (`hpc_train_data shard`).
//
// `--dataset` names one of three things (resolve_dataset_sources):
//   - a dataset file (dataset_file.h);
//   - a glob pattern (`'data/train-*.h5'`, quoted so that hpc_train expands it, the same in an
//     INI file, a job script and a shell): the matching files in byte order of their names;
//   - a shard index file: a small text file that lists the shards and their sample counts:
//
//       hpc_train-shards 1
//       # PATH TRAIN_SAMPLES TEST_SAMPLES (a relative PATH is relative to this file's folder)
//       cifar10-00000-of-00003.h5 16667 3334
//       cifar10-00001-of-00003.h5 16667 3333
//       cifar10-00002-of-00003.h5 16666 3333
//
//     The first line is the format and its version; blank lines and lines starting with '#'
//     are skipped; PATH is the line without its last two fields (so it may hold spaces, not a
//     line break). The counts are checked against the shards when they are opened.
//
// Note [Shard order]: the shards are one dataset in their order (sorted names for a glob, the
// lines of an index): global sample i of a split is local sample i - first(s) of the shard s
// whose range holds it, and both splits are concatenated the same way. DatasetFile owns that
// mapping (read_samples); everything after it (epoch plan, loader, resident data, evaluation,
// checkpoints) sees one dataset of the summed sizes. `hpc_train_data shard` cuts each split into
// contiguous ranges in that order, so the shards of a file are, sample for sample, the file.
//
// Note [Shard layout]: every shard has the layout and the attributes of the first (shape, classes
// and their names, mean and std). mean and std are those of the whole set: inputs are normalised
// with them, so a shard written with its own statistics would train differently from the file
// it came from; `hpc_train_data shard` writes the source file's statistics into every shard.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hpc_train/data/dataset_file.h"

namespace hpc_train {

// The first line of a shard index file, without its version number.
inline constexpr const char* kShardIndexMagic = "hpc_train-shards";
inline constexpr int64_t kShardIndexVersion = 1;

// One shard as `--dataset` gave it: its path (resolved: an index's relative path joined to the
// index's folder) and, from an index, the counts it declares and its line there.
struct ShardSource {
  std::string path;
  int64_t train_size = -1;  // -1: not declared (a glob or a single file)
  int64_t test_size = -1;
  int index_line = 0;       // 0: not from an index
};

// What `--dataset` names (see above). `index_path` is set for an index; `shards` has one entry
// for a single file.
struct DatasetSources {
  enum class Kind { kFile, kGlob, kIndex };
  Kind kind = Kind::kFile;
  std::string spec;        // as given
  std::string index_path;  // kIndex: the index file
  std::vector<ShardSource> shards;

  bool is_set() const { return kind != Kind::kFile; }
  // Where a shard came from, for messages: "data/x.shards line 3: shard a.h5" or "shard a.h5".
  std::string describe(size_t shard) const;
};

// Resolves `spec`: an existing file is an index if it starts with kShardIndexMagic, else a
// dataset file; a name that is no file and holds a glob character (* ? [) is a pattern,
// expanded with glob(3) and sorted by name. Throws DataError naming the pattern when it matches
// nothing, and the index file and line for anything wrong in an index (a listed shard that does
// not exist included). Does not open the shards (DatasetFile::open does).
DatasetSources resolve_dataset_sources(const std::string& spec);

// Parses the text of a shard index; `index_path` is for messages and relative paths. Throws
// DataError naming the file and line: a missing or unknown first line, a line without a path
// and two counts, a count that is not a non-negative decimal integer or does not fit in int64,
// a shard without train samples, a shard listed twice, no shard, or totals over int64.
std::vector<ShardSource> parse_shard_index(const std::string& text, const std::string& index_path);

// The text of an index listing `shards` (their path fields as given), which parse_shard_index
// reads back.
std::string format_shard_index(const std::vector<ShardSource>& shards);

// [begin, begin + count) of each of `parts` contiguous ranges that cover [0, samples): the first
// samples % parts ranges have one sample more. parts >= 1.
std::vector<SampleRange> split_evenly(int64_t samples, int64_t parts);

// OUT_PREFIX-00000-of-00003.h5: shard `shard` (from 0) of `shards`; and OUT_PREFIX.shards.
std::string shard_file_path(const std::string& out_prefix, int64_t shard, int64_t shards);
std::string shard_index_path(const std::string& out_prefix);

// `hpc_train_data shard`: splits the dataset `input` (a file, pattern or index) into `shards`
// files OUT_PREFIX-0000i-of-0000K.h5, each split cut into contiguous ranges (split_evenly), each
// with the layout and the statistics of the input (Note [Shard layout]), and then writes the
// index OUT_PREFIX.shards. The samples are copied a block at a time (write_dataset_slice): what
// it holds in memory does not grow with the shards. Throws ConfigError when shards < 1 or more
// than the train samples (every shard has some), before anything is written. Every file is
// written whole under a temporary name first and renamed once all are written, the index last:
// an error leaves none of them (Note [Atomic file write]). Returns the paths written, the index
// last.
std::vector<std::string> write_dataset_shards(const std::string& input, int64_t shards,
                                              const std::string& out_prefix);

// `hpc_train_data inspect` of a set: the shards with their counts, the totals and the layout.
std::string describe_dataset_shards(const std::string& spec);

}  // namespace hpc_train
