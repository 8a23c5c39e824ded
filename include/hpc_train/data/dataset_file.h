// The HDF5 dataset file: layout, validation on open, and reads of chosen samples.
//
// Layout (data/README.md says the same for people who write such files with h5py):
//   /train/images  uint8  [N, C, H, W], chunked for random access
//   /train/labels  int64  [N]          (any integer type of up to 64 bits is accepted on read)
//   /test/images   uint8  [M, C, H, W]
//   /test/labels   int64  [M]
//   attributes on the root group: num_classes, class_names, channels, height, width,
//   mean and std (per channel, of the train images scaled to [0, 1]), source.
// A dataset may also be several such files of one layout, its shards (dataset_shards.h): a
// DatasetFile opened on a pattern or an index reads them as one dataset.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hpc_train {

enum class Split { kTrain, kTest };
const char* split_name(Split split);  // "train" / "test"

struct DatasetInfo {
  int64_t num_classes = 0;
  std::vector<std::string> class_names;  // num_classes names
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  std::vector<float> mean;  // per channel, images scaled to [0, 1]
  std::vector<float> std;   // per channel
  std::string source;       // where the data came from, e.g. "fashion-mnist IDX files in DIR"
  int64_t train_size = 0;
  int64_t test_size = 0;

  int64_t sample_bytes() const { return channels * height * width; }
  // "CxHxW", e.g. "3x32x32": how messages name a sample's shape.
  std::string sample_shape() const {
    return std::to_string(channels) + "x" + std::to_string(height) + "x" + std::to_string(width);
  }
  int64_t size(Split split) const { return split == Split::kTrain ? train_size : test_size; }
};

// inspect's lines for what a dataset holds, from "  train:" to "  std:" (one file or a set).
std::string describe_samples(const DatasetInfo& info);

// How a rank opens the file. kMpiIo uses the MPI-IO driver of a parallel HDF5 build (the open
// and close are collective over the communicator given to open(); reads are independent);
// kSerial is a plain read-only open, every rank on its own.
enum class FileAccess { kSerial, kMpiIo };

// kMpiIo where the HDF5 library is parallel and MPI gives MPI_THREAD_MULTIPLE (reads happen on
// the loader thread), else kSerial.
FileAccess preferred_file_access(bool mpi_thread_multiple);

// One file of an opened dataset and its samples (dataset_shards.h).
struct DatasetShard {
  std::string path;
  int64_t train_size = 0;
  int64_t test_size = 0;
};

// A validated, read-only dataset file, or a set of shards read as one (Note [Shard order]).
// Thread-safe: every HDF5 call of the data part goes
// through one lock, because HDF5 builds (parallel ones always) are not thread-safe.
class DatasetFile {
 public:
  // Opens and validates: the datasets exist, have the dtypes and shapes above, agree with the
  // attributes and with each other; byte counts (C x H x W, N x C x H x W) fit in 64 bits;
  // mean is finite and std finite and > 0 for every channel; every label of both splits is in
  // [0, num_classes) (they are read here, once, and kept: 8 bytes a sample). Throws DataError
  // naming the file and what is wrong (for a label: split, index and value).
  // With FileAccess::kMpiIo this is collective over `comm`.
  // `path` may also name a set of shards, a glob pattern or an index (resolve_dataset_sources):
  // then every shard is opened and validated so, once, and must have the first shard's layout
  // (Note [Shard layout]) and the counts its index declares; a DataError names both files and
  // the value that differs. info() is then the set's: summed sizes, the first shard's source.
  // `reads_in_flight` (kMinReaderThreads to kMaxReaderThreads, reader_threads.h): how many of
  // one read_samples' reads run at once (Note [Reads in flight]); 1 reads them in turn.
  static DatasetFile open(const std::string& path, FileAccess access = FileAccess::kSerial,
                          MPI_Comm comm = MPI_COMM_NULL, int reads_in_flight = 1);
  ~DatasetFile();
  DatasetFile(DatasetFile&&) noexcept;
  DatasetFile& operator=(DatasetFile&&) noexcept;
  DatasetFile(const DatasetFile&) = delete;
  DatasetFile& operator=(const DatasetFile&) = delete;

  const std::string& path() const;  // as given to open(): a file, pattern or index
  const DatasetInfo& info() const;
  // The files, in the order of their samples (Note [Shard order]); one for a dataset file.
  const std::vector<DatasetShard>& shards() const;

  // Reads the samples at `indices` (any order, repeats allowed) of one split: images into
  // `images` (indices.size() * sample_bytes() bytes, in the order of `indices`) and labels into
  // `labels` (indices.size() values, from those read at open). Reads only those samples' images,
  // never the whole split. Throws DataError for an index out of range, naming the file, split,
  // index and value.
  void read_samples(Split split, const std::vector<int64_t>& indices, uint8_t* images,
                    int64_t* labels) const;

 private:
  struct Impl;
  explicit DatasetFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The consecutive samples [begin, begin + count) of a split.
struct SampleRange {
  int64_t begin = 0;
  int64_t count = 0;
};

// Everything needed to write a dataset file (used by the converters and by tests).
struct DatasetContents {
  DatasetInfo info;            // train_size/test_size and mean/std are derived on write
  std::vector<uint8_t> train_images;  // train_size * C*H*W
  std::vector<int64_t> train_labels;
  std::vector<uint8_t> test_images;
  std::vector<int64_t> test_labels;
};

// Writes `contents` in the layout above (serial; truncates an existing file), atomically, with
// the per-channel mean/std of its train images. Throws DataError for inconsistent sizes, labels
// or statistics.
void write_dataset_file(const std::string& path, DatasetContents contents);

// The samples `train` and `test` of `source`'s splits as a dataset file at `path` (serial,
// atomic, as write_dataset_file), with `source`'s layout, mean and std (Note [Shard layout]).
// Copied a block of at most `block_bytes` at a time (one sample where that holds none), so that
// what it holds in memory does not grow with the slice. DataError for a range outside its split
// or an empty train range, before anything is written, and for a failed read or write, naming
// `path`.
inline constexpr int64_t kSliceBlockBytes = 16 << 20;
void write_dataset_slice(const DatasetFile& source, const std::string& path, SampleRange train,
                         SampleRange test, int64_t block_bytes = kSliceBlockBytes);

// Whether write_dataset_file_collective works in this build: the HDF5 library is parallel.
bool collective_dataset_writes_available();

// One rank's consecutive samples of each split, for write_dataset_file_collective.
struct DatasetShare {
  int64_t first_train = 0;  // the index in the file of train_labels[0]
  std::vector<uint8_t> train_images;  // train_labels.size() * C*H*W
  std::vector<int64_t> train_labels;
  int64_t first_test = 0;
  std::vector<uint8_t> test_images;
  std::vector<int64_t> test_labels;
};

// write_dataset_file of the samples of every rank, collective over `comm` through the MPI-IO
// driver of a parallel HDF5: `info` is the same on every rank, with train_size and test_size
// set; each rank writes its own share, and mean/std come from every rank's train images (sums
// of integers, so the file equals write_dataset_file's of the whole). The same checks, before
// anything is written; atomic, rank 0 owning the temporary file. A refused share throws
// DataError on every rank (the others': "another rank's share failed").
void write_dataset_file_collective(MPI_Comm comm, const std::string& path, DatasetInfo info,
                                   const DatasetShare& share);

}  // namespace hpc_train
