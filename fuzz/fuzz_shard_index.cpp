// The shard index file (dataset_shards.h: `--dataset INDEX`): parse_shard_index on any text, and
// the round trip the header promises: format_shard_index's text of what was read reads back as
// the same shards. Paths are resolved against a folder, as the index's own would be.
#include <string>

#include "fuzz_support.h"
#include "hpc_train/data/dataset_shards.h"

using namespace hpc_train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::parse_or_reject([&] {
    // A bare name: the paths stay as written, so that they can be written again.
    const std::vector<ShardSource> shards = parse_shard_index(text, "set.shards");
    fuzz::fail_unless(!shards.empty(), "an index of no shard accepted");
    int64_t train_total = 0;
    for (const ShardSource& shard : shards) {
      fuzz::fail_unless(!shard.path.empty(), "a shard without a path");
      fuzz::fail_unless(shard.train_size > 0 && shard.test_size >= 0, "a count out of range");
      fuzz::fail_unless(shard.index_line >= 2, "a shard on the first line");
      fuzz::fail_unless(!__builtin_add_overflow(train_total, shard.train_size, &train_total),
                        "train samples over int64 accepted");
    }
    std::vector<ShardSource> again;
    try {
      again = parse_shard_index(format_shard_index(shards), "set.shards");
    } catch (const Error& e) {
      fuzz::fail_unless(false, std::string("format_shard_index's text does not read back: ") +
                                   e.what());
    }
    fuzz::fail_unless(again.size() == shards.size(), "the round trip changes the shard count");
    for (size_t s = 0; s < shards.size(); ++s)
      fuzz::fail_unless(again[s].path == shards[s].path &&
                            again[s].train_size == shards[s].train_size &&
                            again[s].test_size == shards[s].test_size,
                        "the round trip changes a shard");
    // In a folder, a relative path is joined to it.
    const std::vector<ShardSource> placed = parse_shard_index(text, "dir/set.shards");
    fuzz::fail_unless(placed.size() == shards.size(), "the folder changes the shard count");
  });
  return 0;
}
