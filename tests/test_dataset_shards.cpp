// Sharded datasets (dataset_shards.h), at 1, 2 and 3 ranks, with both kinds of file access: the
// shards `write_dataset_shards` cuts from a file read back, through an index and through a glob,
// as exactly that file (every sample's bytes and label, the sizes, the statistics bit for bit),
// reads that span shards included; the index parser's rules; and every way a set can be wrong
// (no match, a layout or statistics mismatch, counts that disagree with the index, a missing
// shard) refused alike on every rank with a DataError that names the files.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>

#include "hpc_train/data/dataset_file.h"
#include "hpc_train/data/dataset_shards.h"
#include "hpc_train/error.h"
#include "hpc_train/runtime/runtime.h"
#include "expect_error.h"
#include "file_accesses.h"
#include "mpi_world.h"
#include "synthetic_dataset.h"

using namespace hpc_train;
namespace fs = std::filesystem;

namespace {

using ::test_support::world_rank;
namespace test_world = ::test_support;

using ::test_support::access_name;
using ::test_support::accesses;
using ::test_support::thread_multiple;

using ::test_support::expect_data_error;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A directory shared by all ranks (rank 0 makes it and the files in it).
class DatasetShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir;
    if (world_rank() == 0) {
      std::string pattern = (fs::temp_directory_path() / "hpc_train_shards_XXXXXX").string();
      if (mkdtemp(pattern.data())) dir = pattern;
    }
    dir_ = broadcast_string(MPI_COMM_WORLD, dir, 0);
    ASSERT_FALSE(dir_.empty());
    whole_ = path("whole.h5");
    if (world_rank() == 0) {
      hpc_train::test_support::SyntheticShape shape;
      shape.train = 37;  // 13 + 12 + 12 at 3 shards
      shape.test = 5;    // fewer than 7 shards: some shards hold no test sample
      shape.channels = 2;
      shape.height = 3;
      shape.width = 5;
      shape.classes = 4;
      hpc_train::test_support::write_synthetic_dataset(whole_, shape, 7);
      write_dataset_shards(whole_, 3, path("three"));
      write_dataset_shards(whole_, 7, path("seven"));
      shape.train = 20;  // other images: other statistics
      hpc_train::test_support::write_synthetic_dataset(path("other.h5"), shape, 8);
      write_dataset_shards(path("other.h5"), 2, path("other"));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(dir_);
  }

  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // Rank 0 writes `text` as `name`; every rank then sees it.
  std::string shared_text(const std::string& name, const std::string& text) {
    if (world_rank() == 0) write_text(path(name), text);
    MPI_Barrier(MPI_COMM_WORLD);
    return path(name);
  }

  std::string dir_;
  std::string whole_;
};

// The samples at `indices` of `split`, images then labels as bytes.
std::vector<uint8_t> read(const DatasetFile& file, Split split,
                          const std::vector<int64_t>& indices) {
  const size_t sample_bytes = static_cast<size_t>(file.info().sample_bytes());
  std::vector<uint8_t> images(indices.size() * sample_bytes);
  std::vector<int64_t> labels(indices.size());
  file.read_samples(split, indices, images.data(), labels.data());
  const size_t image_bytes = images.size();
  images.resize(image_bytes + labels.size() * sizeof(int64_t));
  std::memcpy(images.data() + image_bytes, labels.data(), labels.size() * sizeof(int64_t));
  return images;
}

std::vector<uint32_t> bits(const std::vector<float>& values) {
  std::vector<uint32_t> out(values.size());
  std::memcpy(out.data(), values.data(), values.size() * sizeof(float));
  return out;
}

}  // namespace

TEST(SplitEvenly, ContiguousRangesDifferingByAtMostOne) {
  auto ranges = [](int64_t samples, int64_t parts) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const SampleRange& r : split_evenly(samples, parts)) out.emplace_back(r.begin, r.count);
    return out;
  };
  using R = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(ranges(37, 3), (R{{0, 13}, {13, 12}, {25, 12}}));
  EXPECT_EQ(ranges(5, 7), (R{{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 0}, {5, 0}}));
  EXPECT_EQ(ranges(6, 1), (R{{0, 6}}));
  EXPECT_EQ(shard_file_path("d/x", 2, 3), "d/x-00002-of-00003.h5");
  EXPECT_EQ(shard_index_path("d/x"), "d/x.shards");
}

TEST(ShardIndex, ParsesPathsCountsAndComments) {
  const std::string text =
      "hpc_train-shards 1\r\n"
      "# a comment\n"
      "\n"
      "a-0.h5 10 2\r\n"
      "  sub dir/with space.h5\t 7   0  \n"
      "/abs/b.h5 1 1";
  const std::vector<ShardSource> shards = parse_shard_index(text, "data/set.shards");
  ASSERT_EQ(shards.size(), 3u);
  EXPECT_EQ(shards[0].path, "data/a-0.h5");
  EXPECT_EQ(shards[0].train_size, 10);
  EXPECT_EQ(shards[0].test_size, 2);
  EXPECT_EQ(shards[0].index_line, 4);
  EXPECT_EQ(shards[1].path, "data/sub dir/with space.h5");
  EXPECT_EQ(shards[1].train_size, 7);
  EXPECT_EQ(shards[1].test_size, 0);
  EXPECT_EQ(shards[2].path, "/abs/b.h5");
  // format_shard_index writes what parse_shard_index reads.
  const std::vector<ShardSource> again =
      parse_shard_index(format_shard_index(shards), "elsewhere.shards");
  ASSERT_EQ(again.size(), shards.size());
  for (size_t s = 0; s < shards.size(); ++s) {
    EXPECT_EQ(again[s].path, shards[s].path);
    EXPECT_EQ(again[s].train_size, shards[s].train_size);
    EXPECT_EQ(again[s].test_size, shards[s].test_size);
  }
}

TEST(ShardIndex, RejectsWhatIsNotAnIndex) {
  struct Case {
    std::string text;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"", {"i.shards line 1", "is not a shard index's first line"}},
      {"hpc_train-shards 2\na.h5 1 1\n", {"line 1", "format version '2'"}},
      {"hpc_train-shards 1\n", {"i.shards: lists no shard"}},
      {"hpc_train-shards 1\n# only a comment\n", {"lists no shard"}},
      {"hpc_train-shards 1\na.h5 1\n", {"line 2", "is not 'PATH TRAIN_SAMPLES TEST_SAMPLES'"}},
      {"hpc_train-shards 1\na.h5 -1 0\n", {"line 2", "train samples '-1' is not a count"}},
      {"hpc_train-shards 1\na.h5 1 x\n", {"line 2", "test samples 'x' is not a count"}},
      {"hpc_train-shards 1\na.h5 1234567890123456789 0\n", {"is not a count"}},
      {"hpc_train-shards 1\na.h5 0 3\n", {"line 2", "shard a.h5 has no train samples"}},
      {"hpc_train-shards 1\na.h5 1 0\n./a.h5 2 0\n", {"line 3", "listed already on line 2"}},
      {"hpc_train-shards 1\na.h5 999999999999999999 0\nb.h5 999999999999999999 0\n"
       "c.h5 999999999999999999 0\nd.h5 999999999999999999 0\ne.h5 999999999999999999 0\n"
       "f.h5 999999999999999999 0\ng.h5 999999999999999999 0\nh.h5 999999999999999999 0\n"
       "i.h5 999999999999999999 0\nj.h5 999999999999999999 0\n",
       {"line 11", "overflow a 64-bit count"}},
      {std::string("hpc_train-shards 1\na\0.h5 1 0\n", 30), {"line 2", "NUL byte"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    expect_data_error([&] { parse_shard_index(c.text, "i.shards"); }, c.parts);
  }
}

TEST_F(DatasetShardsTest, ShardsReadBackAsTheirFileThroughAnIndexAndAPattern) {
  for (FileAccess access : accesses()) {
    SCOPED_TRACE(access_name(access));
    const DatasetFile whole = DatasetFile::open(whole_, access, MPI_COMM_WORLD);
    ASSERT_EQ(whole.shards().size(), 1u);
    for (const auto& [spec, shards] :
         std::vector<std::pair<std::string, size_t>>{{path("three.shards"), 3},
                                                     {path("three-*-of-00003.h5"), 3},
                                                     {path("seven.shards"), 7},
                                                     {path("seven-0000?-of-00007.h5"), 7}}) {
      SCOPED_TRACE(spec);
      const DatasetFile set = DatasetFile::open(spec, access, MPI_COMM_WORLD);
      ASSERT_EQ(set.shards().size(), shards);
      EXPECT_EQ(set.path(), spec);
      const DatasetInfo& a = set.info();
      const DatasetInfo& b = whole.info();
      EXPECT_EQ(a.train_size, b.train_size);
      EXPECT_EQ(a.test_size, b.test_size);
      EXPECT_EQ(a.num_classes, b.num_classes);
      EXPECT_EQ(a.class_names, b.class_names);
      EXPECT_EQ(a.sample_bytes(), b.sample_bytes());
      EXPECT_EQ(a.source, b.source);
      EXPECT_EQ(bits(a.mean), bits(b.mean));  // Note [Shard layout]: the file's, bit for bit
      EXPECT_EQ(bits(a.std), bits(b.std));
      int64_t train = 0;
      for (size_t s = 0; s < shards; ++s) {
        EXPECT_EQ(set.shards()[s].path, shard_file_path(path(shards == 3 ? "three" : "seven"),
                                                        static_cast<int64_t>(s),
                                                        static_cast<int64_t>(shards)));
        train += set.shards()[s].train_size;
      }
      EXPECT_EQ(train, b.train_size);
      std::mt19937_64 random(static_cast<uint64_t>(world_rank()) * 31 + shards);
      for (Split split : {Split::kTrain, Split::kTest}) {
        const int64_t n = b.size(split);
        std::vector<int64_t> all(static_cast<size_t>(n));
        std::iota(all.begin(), all.end(), 0);
        EXPECT_EQ(read(set, split, all), read(whole, split, all));  // every sample, in order
        std::vector<int64_t> reversed(all.rbegin(), all.rend());
        EXPECT_EQ(read(set, split, reversed), read(whole, split, reversed));
        for (int batch = 0; batch < 20; ++batch) {  // random batches with repeats
          std::vector<int64_t> indices(1 + random() % 9);
          for (int64_t& index : indices) index = static_cast<int64_t>(random() % n);
          EXPECT_EQ(read(set, split, indices), read(whole, split, indices));
        }
      }
      expect_data_error([&] { read(set, Split::kTrain, {b.train_size}); },
                        {spec, "index 37 is outside /train (37 samples)"});
    }
  }
}

TEST_F(DatasetShardsTest, WrongSetsAreRefusedNamingTheFiles) {
  // Indexes edited from the one write_dataset_shards wrote for three shards.
  std::string index_text;
  {
    std::ifstream in(path("three.shards"));
    index_text.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = index_text;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  const std::string wrong_count =
      shared_text("count.shards", replaced("three-00001-of-00003.h5 12 2",
                                           "three-00001-of-00003.h5 12 3"));
  const std::string missing = shared_text(
      "missing.shards", replaced("three-00002-of-00003.h5", "three-00009-of-00003.h5"));
  // Shard 1 of another file: another mean and std.
  const std::string mixed = shared_text(
      "mixed.shards", replaced("three-00001-of-00003.h5 12 2", "other-00001-of-00002.h5 10 2"));
  const std::string foreign = shared_text(
      "foreign.shards", replaced("three-00001-of-00003.h5", "not-a-dataset.shards"));
  shared_text("not-a-dataset.shards", "hello\n");
  if (world_rank() == 0) fs::create_directory(path("sub"));
  shared_text("dir.shards", "hpc_train-shards 1\nsub 1 0\n");

  for (FileAccess access : accesses()) {
    SCOPED_TRACE(access_name(access));
    auto open = [&](const std::string& spec) {
      return [&, spec] { DatasetFile::open(spec, access, MPI_COMM_WORLD); };
    };
    expect_data_error(open(path("nothing-*.h5")),
                      {"the pattern '" + path("nothing-*.h5") + "' matches no file"});
    expect_data_error(open(wrong_count),
                      {wrong_count + " line 4: shard " + path("three-00001-of-00003.h5"),
                       "holds 2 test samples, the index says 3"});
    expect_data_error(open(missing), {missing + " line 5: shard " +
                                          path("three-00009-of-00003.h5") + ": no such file"});
    expect_data_error(open(mixed), {"shard " + path("other-00001-of-00002.h5") + " has mean",
                                    "but shard " + path("three-00000-of-00003.h5") + " has",
                                    "share one layout"});
    expect_data_error(open(path("*-00000-of-*.h5")),  // other-, seven-, three-: other statistics
                      {"shard " + path("seven-00000-of-00007.h5") + " has mean",
                       "but shard " + path("other-00000-of-00002.h5")});
    expect_data_error(open(foreign), {path("not-a-dataset.shards"), "not an HDF5 file"});
    expect_data_error(open(path("dir.shards")), {"line 2: shard", "not a regular file"});
  }
}

TEST_F(DatasetShardsTest, WritingRefusesBadCountsBeforeWritingAnything) {
  if (world_rank() != 0) return;
  for (int64_t shards : {int64_t{0}, int64_t{-1}, int64_t{38}}) {
    try {
      write_dataset_shards(whole_, shards, path("bad"));
      ADD_FAILURE() << "no ConfigError for --shards " << shards;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--shards " + std::to_string(shards)),
                std::string::npos)
          << e.what();
    }
  }
  // An input that does not open: a DataError, and again nothing written.
  expect_data_error([&] { write_dataset_shards(path("absent.h5"), 2, path("bad")); },
                    {path("absent.h5"), "no such file"});
  for (const auto& entry : fs::directory_iterator(dir_))
    EXPECT_EQ(entry.path().filename().string().rfind("bad", 0), std::string::npos)
        << entry.path();
  // 37 shards of 37 samples: one train sample each, the largest count allowed.
  const std::vector<std::string> written = write_dataset_shards(whole_, 37, path("each"));
  EXPECT_EQ(written.size(), 38u);
  EXPECT_EQ(written.back(), path("each.shards"));
  EXPECT_EQ(DatasetFile::open(path("each.shards")).info().train_size, 37);
  // No temporary file is left beside them.
  for (const auto& entry : fs::directory_iterator(dir_))
    EXPECT_EQ(entry.path().string().find(".partial"), std::string::npos) << entry.path();
}

// write_dataset_slice (what shard writes each shard with): a slice read back is those samples of
// its source, with the source's statistics bit for bit, whatever the block it copies by: one
// sample, three, whole chunks (32 of 40 bytes), all at once; from a set of shards too. A range
// outside its split or an empty train range is refused before anything is written.
TEST_F(DatasetShardsTest, SlicesAreTheirSamplesWhateverTheBlock) {
  if (world_rank() != 0) return;
  const DatasetFile whole = DatasetFile::open(whole_);
  const DatasetFile set = DatasetFile::open(path("three.shards"));
  const int64_t sample_bytes = whole.info().sample_bytes();
  const SampleRange train{5, 30}, test{1, 3};
  for (const DatasetFile* source : {&whole, &set})
    for (int64_t block_bytes :
         {int64_t{1}, 3 * sample_bytes, 40 * sample_bytes, kSliceBlockBytes}) {
      SCOPED_TRACE(source->path() + ", blocks of " + std::to_string(block_bytes) + " bytes");
      write_dataset_slice(*source, path("slice.h5"), train, test, block_bytes);
      const DatasetFile slice = DatasetFile::open(path("slice.h5"));
      EXPECT_EQ(slice.info().train_size, train.count);
      EXPECT_EQ(slice.info().test_size, test.count);
      EXPECT_EQ(slice.info().class_names, whole.info().class_names);
      EXPECT_EQ(bits(slice.info().mean), bits(whole.info().mean));
      EXPECT_EQ(bits(slice.info().std), bits(whole.info().std));
      for (Split split : {Split::kTrain, Split::kTest}) {
        const SampleRange range = split == Split::kTrain ? train : test;
        std::vector<int64_t> local(static_cast<size_t>(range.count));
        std::iota(local.begin(), local.end(), 0);
        std::vector<int64_t> global(local.size());
        std::iota(global.begin(), global.end(), range.begin);
        EXPECT_EQ(read(slice, split, local), read(whole, split, global));
      }
    }
  const std::vector<std::pair<SampleRange, SampleRange>> refused = {
      {{30, 8}, {0, 1}}, {{-1, 2}, {0, 1}}, {{0, 2}, {4, 2}}, {{0, 0}, {0, 1}}};
  const std::vector<std::string> messages = {"train samples [30, 38) are outside the 37 of",
                                             "train samples [-1, 1) are outside",
                                             "test samples [4, 6) are outside the 5 of",
                                             "the train split is empty"};
  for (size_t i = 0; i < refused.size(); ++i)
    expect_data_error(
        [&] {
          write_dataset_slice(whole, path("refused.h5"), refused[i].first, refused[i].second);
        },
        {"cannot write " + path("refused.h5"), messages[i]});
  for (const auto& entry : fs::directory_iterator(dir_))
    EXPECT_EQ(entry.path().filename().string().rfind("refused", 0), std::string::npos)
        << entry.path();
}

// Note [Agreed shard list]: ranks that expand a pattern to different files (here: each rank in a
// folder of its own, rank 0's with one shard more) or fail to expand it all throw, rather than
// leave the others in a collective open.
TEST_F(DatasetShardsTest, RanksThatSeeOtherFilesAllFailWithMpiIo) {
  if (test_world::world_size() < 2 ||
      preferred_file_access(thread_multiple()) != FileAccess::kMpiIo)
    GTEST_SKIP() << "needs 2 or more ranks and MPI-IO";
  if (world_rank() == 0)
    for (int rank = 0; rank < test_world::world_size(); ++rank) {
      for (const char* view : {"view", "empty"})
        fs::create_directory(path(std::string(view) + "-" + std::to_string(rank)));
      for (int64_t s = 0; s < (rank == 0 ? 3 : 2); ++s) {
        const std::string shard = shard_file_path("three", s, 3);
        fs::create_symlink(path(shard), path("view-" + std::to_string(rank)) + "/" + shard);
      }
    }
  MPI_Barrier(MPI_COMM_WORLD);
  const fs::path start = fs::current_path();
  const std::string rank = std::to_string(world_rank());
  fs::current_path(path("view-" + rank));
  expect_data_error([] { DatasetFile::open("three-*.h5", FileAccess::kMpiIo, MPI_COMM_WORLD); },
                    {"three-*.h5: the ranks see different files (this rank " +
                     std::string(world_rank() == 0 ? "3" : "2") + " shard(s))"});
  // Rank 0 finds its shards; the others find none.
  fs::current_path(world_rank() == 0 ? path("view-0") : path("empty-" + rank));
  expect_data_error([] { DatasetFile::open("three-*.h5", FileAccess::kMpiIo, MPI_COMM_WORLD); },
                    {world_rank() == 0 ? "another rank could not resolve the dataset"
                                       : "the pattern 'three-*.h5' matches no file"});
  fs::current_path(start);
}
