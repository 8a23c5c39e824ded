#include "hpc_train/data/dataset_shards.h"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <system_error>

#include "hpc_train/data/dataset_file.h"
#include "hpc_train/error.h"
#include "hpc_train/io/atomic_file.h"

namespace hpc_train {

namespace {

namespace fs = std::filesystem;

// An index lists paths and counts: far below this. A larger file is not an index someone wrote.
constexpr uintmax_t kMaxShardIndexBytes = 16 << 20;
// 18 decimal digits always fit in int64.
constexpr size_t kMaxCountDigits = 18;

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

std::string trimmed(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && is_blank(text[begin])) ++begin;
  while (end > begin && is_blank(text[end - 1])) --end;
  return text.substr(begin, end - begin);
}

// A line as messages quote it: at most 80 characters.
std::string quote_text(const std::string& line) {
  return "'" + (line.size() > 80 ? line.substr(0, 77) + "..." : line) + "'";
}

bool has_glob_characters(const std::string& spec) {
  return spec.find_first_of("*?[") != std::string::npos;
}

// Whether the regular file at `path` starts with kShardIndexMagic.
bool starts_with_index_magic(const std::string& path) {
  const size_t length = std::strlen(kShardIndexMagic);
  std::ifstream in(path, std::ios::binary);
  std::string head(length, '\0');
  return in.read(head.data(), static_cast<std::streamsize>(length)) && head == kShardIndexMagic;
}

std::string read_index_text(const std::string& path) {
  std::error_code error;
  const uintmax_t bytes = fs::file_size(path, error);
  if (error) throw DataError(path + ": cannot read the shard index: " + error.message());
  if (bytes > kMaxShardIndexBytes)
    throw DataError(path + ": a shard index of " + std::to_string(bytes) +
                    " bytes; an index lists paths and counts and stays below " +
                    std::to_string(kMaxShardIndexBytes) + " bytes");
  std::ifstream in(path, std::ios::binary);
  std::string text(static_cast<size_t>(bytes), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(bytes)))
    throw DataError(path + ": cannot read the shard index");
  return text;
}

// glob(3) of `pattern`, sorted by name (bytes), so that the order of the shards does not depend on
// the locale or the file system.
std::vector<std::string> expand_pattern(const std::string& pattern) {
  glob_t matches{};
  const int status = glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> paths;
  if (status == 0)
    for (size_t i = 0; i < matches.gl_pathc; ++i) paths.emplace_back(matches.gl_pathv[i]);
  globfree(&matches);
  if (status == GLOB_NOMATCH || (status == 0 && paths.empty()))
    throw DataError("the pattern '" + pattern + "' matches no file");
  if (status != 0)
    throw DataError("the pattern '" + pattern + "': cannot list the files it matches (" +
                    (status == GLOB_NOSPACE ? "out of memory" : "a folder could not be read") +
                    ")");
  std::sort(paths.begin(), paths.end());
  return paths;
}

// A count field of an index line: decimal digits only.
int64_t parse_count(const std::string& field, const std::string& where, const char* what) {
  if (field.empty() || field.size() > kMaxCountDigits ||
      !std::all_of(field.begin(), field.end(), [](char c) { return c >= '0' && c <= '9'; }))
    throw DataError(where + ": " + what + " " + quote_text(field) +
                    " is not a count (decimal digits, at most " +
                    std::to_string(kMaxCountDigits) + ")");
  return std::stoll(field);
}

// Splits off the last blank-separated field of `text` (trimmed at its end).
std::string pop_last_field(std::string& text) {
  size_t end = text.size();
  while (end > 0 && is_blank(text[end - 1])) --end;
  size_t begin = end;
  while (begin > 0 && !is_blank(text[begin - 1])) --begin;
  std::string field = text.substr(begin, end - begin);
  text.resize(begin);
  return field;
}

// Every path of `shards` without the folder part, for an index written beside them.
std::string file_name(const std::string& path) { return fs::path(path).filename().string(); }

// Temporary files of a set being written; removed unless released (an error unwound).
class TemporaryFiles {
 public:
  ~TemporaryFiles() {
    for (const std::string& path : paths_) std::remove(path.c_str());
  }
  void add(const std::string& path) { paths_.push_back(path); }
  void release() { paths_.clear(); }

 private:
  std::vector<std::string> paths_;
};

}  // namespace

std::string DatasetSources::describe(size_t shard) const {
  const ShardSource& source = shards.at(shard);
  const std::string name = "shard " + source.path;
  return kind == Kind::kIndex ? index_path + " line " + std::to_string(source.index_line) + ": " +
                                    name
                              : name;
}

DatasetSources resolve_dataset_sources(const std::string& spec) {
  DatasetSources sources;
  sources.spec = spec;
  std::error_code error;
  const fs::file_status status = fs::status(spec, error);
  if (status.type() == fs::file_type::regular && starts_with_index_magic(spec)) {
    sources.kind = DatasetSources::Kind::kIndex;
    sources.index_path = spec;
    sources.shards = parse_shard_index(read_index_text(spec), spec);
    // Every shard exists before any is opened: a missing one is named with its line, and no
    // rank starts a collective open that another cannot join.
    for (size_t s = 0; s < sources.shards.size(); ++s) {
      const fs::file_status shard = fs::status(sources.shards[s].path, error);
      if (shard.type() == fs::file_type::not_found)
        throw DataError(sources.describe(s) + ": no such file");
      if (shard.type() != fs::file_type::regular)
        throw DataError(sources.describe(s) + ": not a regular file");
    }
    return sources;
  }
  if (status.type() == fs::file_type::not_found && has_glob_characters(spec)) {
    sources.kind = DatasetSources::Kind::kGlob;
    for (std::string& path : expand_pattern(spec)) sources.shards.push_back({std::move(path)});
    return sources;
  }
  // One dataset file: DatasetFile::open says what is wrong with it, if anything.
  sources.shards.push_back({spec});
  return sources;
}

std::vector<ShardSource> parse_shard_index(const std::string& text,
                                           const std::string& index_path) {
  const std::string folder = fs::path(index_path).parent_path().string();
  std::vector<ShardSource> shards;
  std::map<std::string, int> line_of_path;  // the normalised path -> its line
  int64_t train_total = 0, test_total = 0;
  size_t begin = 0;
  for (int line_number = 1; begin <= text.size(); ++line_number) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    const std::string where = index_path + " line " + std::to_string(line_number);
    if (line.find('\0') != std::string::npos) throw DataError(where + ": holds a NUL byte");
    std::string content = trimmed(line);
    if (line_number == 1) {
      const std::string expected =
          std::string(kShardIndexMagic) + " " + std::to_string(kShardIndexVersion);
      std::string version = pop_last_field(content);
      if (trimmed(content) != kShardIndexMagic)
        throw DataError(where + ": " + quote_text(line) + " is not a shard index's first line ('" +
                        expected + "')");
      if (version != std::to_string(kShardIndexVersion))
        throw DataError(where + ": shard index format version " + quote_text(version) +
                        "; this program reads version " + std::to_string(kShardIndexVersion));
      continue;
    }
    if (content.empty() || content[0] == '#') continue;
    const std::string test_field = pop_last_field(content);
    const std::string train_field = pop_last_field(content);
    const std::string path = trimmed(content);
    if (path.empty())
      throw DataError(where + ": " + quote_text(line) +
                      " is not 'PATH TRAIN_SAMPLES TEST_SAMPLES'");
    ShardSource shard;
    shard.train_size = parse_count(train_field, where, "train samples");
    shard.test_size = parse_count(test_field, where, "test samples");
    shard.index_line = line_number;
    if (shard.train_size == 0)
      throw DataError(where + ": shard " + path + " has no train samples; every shard needs some");
    shard.path = fs::path(path).is_absolute() || folder.empty()
                     ? path
                     : (fs::path(folder) / path).string();
    const std::string normalised = fs::path(shard.path).lexically_normal().string();
    const auto [previous, inserted] = line_of_path.emplace(normalised, line_number);
    if (!inserted)
      throw DataError(where + ": shard " + path + " is listed already on line " +
                      std::to_string(previous->second));
    if (__builtin_add_overflow(train_total, shard.train_size, &train_total) ||
        __builtin_add_overflow(test_total, shard.test_size, &test_total))
      throw DataError(where + ": the samples of the shards so far overflow a 64-bit count");
    shards.push_back(std::move(shard));
  }
  if (shards.empty()) throw DataError(index_path + ": lists no shard");
  return shards;
}

std::string format_shard_index(const std::vector<ShardSource>& shards) {
  std::string text = std::string(kShardIndexMagic) + " " + std::to_string(kShardIndexVersion) +
                     "\n# PATH TRAIN_SAMPLES TEST_SAMPLES (a relative PATH is relative to this "
                     "file's folder)\n";
  for (const ShardSource& shard : shards)
    text += shard.path + " " + std::to_string(shard.train_size) + " " +
            std::to_string(shard.test_size) + "\n";
  return text;
}

std::vector<SampleRange> split_evenly(int64_t samples, int64_t parts) {
  std::vector<SampleRange> ranges(static_cast<size_t>(parts));
  int64_t begin = 0;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t count = samples / parts + (p < samples % parts ? 1 : 0);
    ranges[static_cast<size_t>(p)] = {begin, count};
    begin += count;
  }
  return ranges;
}

std::string shard_file_path(const std::string& out_prefix, int64_t shard, int64_t shards) {
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, "-%05lld-of-%05lld.h5", static_cast<long long>(shard),
                static_cast<long long>(shards));
  return out_prefix + suffix;
}

std::string shard_index_path(const std::string& out_prefix) { return out_prefix + ".shards"; }

std::vector<std::string> write_dataset_shards(const std::string& input, int64_t shards,
                                              const std::string& out_prefix) {
  if (shards < 1)
    throw ConfigError("--shards " + std::to_string(shards) + ": must be at least 1");
  if (out_prefix.empty() || out_prefix.find('\n') != std::string::npos)
    throw ConfigError("OUT_PREFIX " + quote_text(out_prefix) +
                      ": must be a non-empty path without a line break");
  const fs::path folder = fs::absolute(out_prefix).parent_path();
  std::error_code error;
  if (!fs::is_directory(folder, error))
    throw DataError("cannot write " + shard_file_path(out_prefix, 0, shards) +
                    ": no such directory " + folder.string());
  const DatasetFile dataset = DatasetFile::open(input);  // serial; validates
  const DatasetInfo& info = dataset.info();
  if (shards > info.train_size)
    throw ConfigError("--shards " + std::to_string(shards) + ": more than the " +
                      std::to_string(info.train_size) + " train samples of " + input +
                      " (every shard holds some)");
  const std::vector<SampleRange> train = split_evenly(info.train_size, shards);
  const std::vector<SampleRange> test = split_evenly(info.test_size, shards);

  // Note [Atomic file write], for a set: every shard is written whole under a temporary name;
  // only when all are there are they renamed, and the index is written last. A pattern over the
  // final names never sees part of a set being written.
  const std::string temporary_suffix = ".partial-set-" + std::to_string(getpid());
  TemporaryFiles temporaries;
  std::vector<std::string> written;
  std::vector<ShardSource> listed;
  for (int64_t s = 0; s < shards; ++s) {
    const std::string path = shard_file_path(out_prefix, s, shards);
    temporaries.add(path + temporary_suffix);
    // Note [Shard layout]: the input's mean and std, not the shard's own.
    write_dataset_slice(dataset, path + temporary_suffix, train[static_cast<size_t>(s)],
                        test[static_cast<size_t>(s)]);
    written.push_back(path);
    ShardSource entry;
    entry.path = file_name(path);  // the index lies beside the shards
    entry.train_size = train[static_cast<size_t>(s)].count;
    entry.test_size = test[static_cast<size_t>(s)].count;
    listed.push_back(entry);
  }
  for (const std::string& path : written)
    if (std::rename((path + temporary_suffix).c_str(), path.c_str()) != 0)
      throw DataError("cannot rename " + path + temporary_suffix + " to " + path + ": " +
                      std::strerror(errno));
  temporaries.release();
  const std::string index = shard_index_path(out_prefix);
  write_file_atomically(index, format_shard_index(listed));
  written.push_back(index);
  return written;
}

std::string describe_dataset_shards(const std::string& spec) {
  const DatasetSources sources = resolve_dataset_sources(spec);
  const DatasetFile dataset = DatasetFile::open(spec);  // serial; validates every shard
  const DatasetInfo& info = dataset.info();
  const char* kind = sources.kind == DatasetSources::Kind::kIndex  ? "shard index"
                     : sources.kind == DatasetSources::Kind::kGlob ? "pattern"
                                                                   : "file";
  std::string text = spec + " (" + kind + "): " + std::to_string(dataset.shards().size()) +
                     " shard(s)\n";
  for (const DatasetShard& shard : dataset.shards())
    text += "  " + shard.path + ": " + std::to_string(shard.train_size) + " train, " +
            std::to_string(shard.test_size) + " test\n";
  text += "  source:          " + info.source + "\n";
  text += describe_samples(info);
  return text;
}

}  // namespace hpc_train
