#include "hpc_train/io/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "io/hdf5_attributes.h"
#include "io/hdf5_util.h"
#include "hpc_train/io/atomic_file.h"
#include "hpc_train/io/checkpoint_files.h"
#include "hpc_train/config/config_choices.h"
#include "hpc_train/error.h"
#include "hpc_train/runtime/runtime.h"
#include "hpc_train/io/safetensors.h"

// The optimizer arrays go to the file (and into their checksums) as the host's float bytes.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint files store little-endian floats without conversion");

namespace hpc_train {

namespace {

constexpr char kFormatName[] = "hpc_train checkpoint";
constexpr char kWeightsFormatName[] = "hpc_train weights";
constexpr char kChecksumAttribute[] = "crc32";

#if defined(HPC_TRAIN_HDF5_PARALLEL) && defined(H5_HAVE_PARALLEL)
constexpr bool kParallelHdf5 = true;
#else
constexpr bool kParallelHdf5 = false;
#endif

std::string system_error() { return std::strerror(errno); }

std::string format_shape(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string describe_input(int64_t channels, int64_t height, int64_t width, int64_t classes) {
  return std::to_string(channels) + "x" + std::to_string(height) + "x" + std::to_string(width) +
         " images, " + std::to_string(classes) + " classes";
}

uint32_t crc32_of(const void* data, size_t bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* cursor = static_cast<const Bytef*>(data);
  while (bytes > 0) {  // zlib takes at most 4 GiB - 1 per call
    const size_t chunk = std::min<size_t>(bytes, size_t{1} << 30);
    crc = crc32(crc, cursor, static_cast<uInt>(chunk));
    cursor += chunk;
    bytes -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

template <typename T>
uint32_t crc32_of(const std::vector<T>& values) {
  return crc32_of(values.data(), values.size() * sizeof(T));
}

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "I64") return 8;
  return 0;
}

// The HDF5 type of a dtype's little-endian elements, in the file and in CheckpointTensor::data.
hid_t hdf5_type(const std::string& dtype) {
  return dtype == "F32" ? H5T_IEEE_F32LE : H5T_STD_I64LE;
}

// The first inconsistency in `checkpoint`, or "" when there is none. The writer refuses what the
// reader would refuse, so that every file written reads back.
std::string find_inconsistency(const Checkpoint& checkpoint) {
  std::set<std::string> names;
  for (const CheckpointTensor& tensor : checkpoint.model_state) {
    const std::string where = "model tensor \"" + tensor.name + "\"";
    if (tensor.name.empty() || tensor.name == "." || tensor.name.find('/') != std::string::npos)
      return where + ": an HDF5 link name cannot be empty, \".\" or contain '/'";
    if (!names.insert(tensor.name).second) return where + " appears twice";
    const size_t element_bytes = dtype_bytes(tensor.dtype);
    if (element_bytes == 0)
      return where + " has dtype \"" + tensor.dtype + "\"; a checkpoint holds F32 or I64";
    uint64_t elements = 1;
    for (int64_t dimension : tensor.shape) {
      if (dimension < 0)
        return where + " has a negative dimension in " + format_shape(tensor.shape);
      if (dimension > 0 && elements > std::numeric_limits<uint64_t>::max() / 8 / dimension)
        return where + ": shape " + format_shape(tensor.shape) + " is too large";
      elements *= static_cast<uint64_t>(dimension);
    }
    if (tensor.data.size() != elements * element_bytes)
      return where + " has " + std::to_string(tensor.data.size()) + " bytes, but " + tensor.dtype +
             " " + format_shape(tensor.shape) + " needs " +
             std::to_string(elements * element_bytes);
  }
  const TrainingPosition& p = checkpoint.position;
  if (checkpoint.format_version >= 2 && (p.samples_in_epoch < 0 || p.micro_batch < 1 || p.grad_accum < 1))
    return "/training: samples_in_epoch " + std::to_string(p.samples_in_epoch) + ", micro_batch " +
           std::to_string(p.micro_batch) + ", grad_accum " + std::to_string(p.grad_accum) +
           ": want >= 0, >= 1 and >= 1";
  if (checkpoint.exp_avg.size() != checkpoint.master.size() ||
      checkpoint.exp_avg_sq.size() != checkpoint.master.size())
    return "the optimizer arrays differ in length: master " +
           std::to_string(checkpoint.master.size()) + ", exp_avg " +
           std::to_string(checkpoint.exp_avg.size()) + ", exp_avg_sq " +
           std::to_string(checkpoint.exp_avg_sq.size());
  if (!checkpoint.ema.empty() && checkpoint.ema.size() != checkpoint.master.size())
    return "/optimizer/ema holds " + std::to_string(checkpoint.ema.size()) +
           " values, master " + std::to_string(checkpoint.master.size());
  return "";
}

// --- Files and directories ----------------------------------------------------------------

// Listing and removing use POSIX calls, as the atomic write does (Note [Atomic file write]:
// std::filesystem::remove_all crashed on the GPU machine with the PyTorch wheel's LibTorch).

// mkdir -p: every missing component of `directory`, then a check that it is one.
void make_directories(const std::string& directory) {
  for (size_t slash = directory.find('/', 1);; slash = directory.find('/', slash + 1)) {
    const std::string prefix = directory.substr(0, slash);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST)
      throw Error("cannot create directory " + prefix + ": " + system_error());
    if (slash == std::string::npos) break;
  }
  struct stat status {};
  if (::stat(directory.c_str(), &status) != 0 || !S_ISDIR(status.st_mode))
    throw Error(directory + " is not a directory");
}

// --- Space for a checkpoint (Note [Checkpoint space] in checkpoint.h) --------------------------

// What HDF5 adds to the data: the superblock, object headers (with the crc32 attributes), the
// groups' link indexes and heaps. The allowance is many times what simple_cnn's checkpoint for
// Fashion-MNIST holds beyond its arrays, its configuration and random state included, and still a
// rounding error beside the data (bench/results-notes.md, Note [Checkpoint space]).
constexpr uint64_t kCheckpointMetadataBytes = 256 * 1024;
constexpr uint64_t kCheckpointMetadataBytesPerDataset = 4 * 1024;

// An upper bound of the file's size: the data, plus the metadata allowance. The data of the
// small datasets (the configuration, the random state: a few KiB) count as metadata.
uint64_t checkpoint_file_bytes(const Checkpoint& c) {
  uint64_t bytes = kCheckpointMetadataBytes + c.config_ini.size() +
                   sizeof(float) * (c.master.size() + c.exp_avg.size() + c.exp_avg_sq.size() +
                                    c.ema.size()) +
                   c.rng_state.size() + c.cuda_rng_state.size();
  for (const CheckpointTensor& tensor : c.model_state) bytes += tensor.data.size();
  // The model's datasets, the optimizer's three, and the training state's few, with room.
  const uint64_t datasets = c.model_state.size() + 4 + 8;
  return bytes + datasets * kCheckpointMetadataBytesPerDataset;
}

// Throws Error when the file system that holds `path`'s directory has less than `bytes` free,
// before anything is written; says nothing when it cannot tell (the write then will).
void check_free_space(const std::string& path, uint64_t bytes) {
  const std::string directory = directory_of(path);
  struct statvfs file_system {};
  if (::statvfs(directory.c_str(), &file_system) != 0) return;
  const uint64_t free_bytes = uint64_t{file_system.f_bavail} * file_system.f_frsize;
  if (free_bytes < bytes)
    throw Error("it takes about " + memory_text(static_cast<double>(bytes)) + " and " + directory +
                " has " + memory_text(static_cast<double>(free_bytes)) + " free (" +
                std::strerror(ENOSPC) + "); make room, or keep fewer checkpoints "
                "(--keep-checkpoints)");
}

// --- Writing (h5::Lock held) ---------------------------------------------------------------

// Which part of the file this process writes. Under MPI-IO every rank makes the same metadata
// calls (HDF5 requires it) and writes its share of the optimizer arrays; rank 0 alone writes the
// small datasets.
struct WriterPart {
  bool collective = false;
  int rank = 0;
  int count = 1;
};

class CheckpointWriter {
 public:
  explicit CheckpointWriter(WriterPart part) : part_(part) {}

  h5::Group group(hid_t parent, const char* name, bool track_order = false) const {
    h5::PropertyList creation(H5_CHECK(H5Pcreate(H5P_GROUP_CREATE)));
    if (track_order)
      H5_CHECK(H5Pset_link_creation_order(creation.get(),
                                          H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED));
    return h5::Group(H5_CHECK(H5Gcreate2(parent, name, H5P_DEFAULT, creation.get(), H5P_DEFAULT)));
  }

  // A dataset that rank 0 writes whole (`memory_type` describes `data`).
  void small_dataset(hid_t group, const std::string& name, hid_t file_type, hid_t memory_type,
                     hid_t space, const void* data, uint32_t crc) const {
    h5::Dataset dataset(H5_CHECK(
        H5Dcreate2(group, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    checksum_attribute(dataset.get(), crc);
    if (part_.rank == 0 && H5_CHECK(H5Sget_simple_extent_npoints(space)) > 0)
      H5_CHECK(H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
  }

  // A 1-D float array of which this process writes its contiguous share, [n r / W, n (r+1) / W).
  void shared_floats(hid_t group, const char* name, const std::vector<float>& values,
                     uint32_t crc) const {
    const hsize_t n = values.size();
    h5::Dataspace file_space(H5_CHECK(H5Screate_simple(1, &n, nullptr)));
    h5::Dataset dataset(H5_CHECK(H5Dcreate2(group, name, H5T_IEEE_F32LE, file_space.get(),
                                            H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    checksum_attribute(dataset.get(), crc);
    if (n == 0) return;  // the same on every rank: nobody enters the collective write
    const hsize_t begin = n * part_.rank / part_.count;
    const hsize_t count = n * (part_.rank + 1) / part_.count - begin;
    // A rank with nothing to write still joins the collective transfer, selecting nothing.
    const hsize_t memory_elements = std::max<hsize_t>(count, 1);
    h5::Dataspace memory_space(H5_CHECK(H5Screate_simple(1, &memory_elements, nullptr)));
    if (count > 0) {
      H5_CHECK(
          H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &begin, nullptr, &count, nullptr));
    } else {
      H5_CHECK(H5Sselect_none(file_space.get()));
      H5_CHECK(H5Sselect_none(memory_space.get()));
    }
    h5::PropertyList transfer(H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
#if defined(HPC_TRAIN_HDF5_PARALLEL) && defined(H5_HAVE_PARALLEL)
    if (part_.collective) H5_CHECK(H5Pset_dxpl_mpio(transfer.get(), H5FD_MPIO_COLLECTIVE));
#endif
    H5_CHECK(H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, memory_space.get(), file_space.get(),
                      transfer.get(), values.data() + begin));
  }

 private:
  void checksum_attribute(hid_t dataset, uint32_t crc) const {
    h5::Dataspace space(H5_CHECK(H5Screate(H5S_SCALAR)));
    h5::Attribute attribute(H5_CHECK(H5Acreate2(dataset, kChecksumAttribute, H5T_STD_U32LE,
                                                space.get(), H5P_DEFAULT, H5P_DEFAULT)));
    H5_CHECK(H5Awrite(attribute.get(), H5T_NATIVE_UINT32, &crc));
  }

  WriterPart part_;
};

// The file being written. Under MPI-IO its close is collective: after a failure the other ranks
// may never join it, so then it is left open (Note [Ending the job] in runtime.h). With HDF5's
// POSIX driver, the first HDF5 call that fails sends the file's remaining writes nowhere, and a
// file given up on is closed so (Note [Checkpoint space], step 3).
class OutputFile {
 public:
  OutputFile(hid_t id, bool collective) : id_(id), collective_(collective) {
    if (collective_) return;
    void* handle = nullptr;
    if (H5Fget_vfd_handle(id_, H5P_DEFAULT, &handle) >= 0 && handle != nullptr)
      fd_ = *static_cast<const int*>(handle);
    // HDF5 calls its error handler when an API call fails, before that call returns: before the
    // exception that H5_CHECK makes unwinds the handles, whose closes write too.
    H5Eset_auto2(H5E_DEFAULT, &OutputFile::on_hdf5_error, this);
  }
  ~OutputFile() {
    if (collective_) return;
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    if (id_ < 0) return;
    discard_writes();
    H5Fclose(id_);
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  hid_t get() const { return id_; }
  // Every object in the file must be closed first: the MPI-IO driver refuses otherwise.
  void close() { H5_CHECK(H5Fclose(std::exchange(id_, H5I_INVALID_HID))); }

  // Note [Checkpoint space], step 2: claims the file's first `bytes` of disk (POSIX driver)
  // without changing its size, so that the writes there find their blocks. Throws Error when the
  // file system or a quota refuses; a file system that cannot reserve is passed over.
  void reserve(uint64_t bytes) {
    if (fd_ < 0) return;
    int rc = 0;
    while ((rc = ::fallocate(fd_, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes))) != 0 &&
           errno == EINTR) {
    }
    if (rc != 0 && errno != EOPNOTSUPP && errno != ENOSYS)
      throw Error("cannot reserve " + memory_text(static_cast<double>(bytes)) + ": " +
                  system_error());
  }

 private:
  static herr_t on_hdf5_error(hid_t /*stack*/, void* file) {
    static_cast<OutputFile*>(file)->discard_writes();
    return 0;  // the stack stays for H5_CHECK's message
  }

  // Points the driver's descriptor at an anonymous memory file (once), so that no later write of
  // this file can fail. POSIX calls only: it runs inside HDF5's error handling. Best effort.
  void discard_writes() noexcept {
    if (discarded_ || fd_ < 0) return;
    discarded_ = true;
    const int sink = ::memfd_create("hpc_train discarded checkpoint", MFD_CLOEXEC);
    if (sink < 0) return;
    (void)::dup2(sink, fd_);
    ::close(sink);
  }

  hid_t id_;
  bool collective_;
  int fd_ = -1;  // the POSIX driver's
  bool discarded_ = false;
};

// Writes the whole layout of checkpoint.h into `temporary`, flushed and closed. Collective over
// `comm` when part.collective. Throws Error (HDF5's DataError made a runtime error: the file being
// written is ours, not the user's input).
void write_file(const std::string& temporary, const Checkpoint& checkpoint, MPI_Comm comm,
                WriterPart part) {
  try {
    h5::Lock lock;  // Note [HDF5 lock]; before every handle below
    h5::PropertyList access(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
    H5_CHECK(H5Pset_libver_bounds(access.get(), H5F_LIBVER_V18, H5F_LIBVER_V18));
#if defined(HPC_TRAIN_HDF5_PARALLEL) && defined(H5_HAVE_PARALLEL)
    if (part.collective) H5_CHECK(H5Pset_fapl_mpio(access.get(), comm, MPI_INFO_NULL));
#else
    (void)comm;
#endif
    OutputFile file(
        H5_CHECK(H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get())),
        part.collective);
    if (!part.collective) file.reserve(checkpoint_file_bytes(checkpoint));
    {
      const CheckpointWriter writer(part);
      const Checkpoint& c = checkpoint;
      h5::Group root(H5_CHECK(H5Gopen2(file.get(), "/", H5P_DEFAULT)));
      h5::write_fixed_string_attribute(root.get(), "format", kFormatName);
      h5::write_integer_attribute(root.get(), "format_version", kCheckpointFormatVersion);
      h5::write_fixed_string_attribute(root.get(), "model", c.model);
      h5::write_fixed_string_attribute(root.get(), "precision", c.precision);
      h5::write_integer_attribute(root.get(), "channels", c.channels);
      h5::write_integer_attribute(root.get(), "height", c.height);
      h5::write_integer_attribute(root.get(), "width", c.width);
      h5::write_integer_attribute(root.get(), "num_classes", c.num_classes);
      h5::write_integer_attribute(root.get(), "zero_stage", c.zero_stage);
      h5::write_integer_attribute(root.get(), "world_size", c.world_size);

      const h5::Group model = writer.group(root.get(), "model", /*track_order=*/true);
      for (const CheckpointTensor& tensor : c.model_state) {
        const std::vector<hsize_t> dims(tensor.shape.begin(), tensor.shape.end());
        h5::Dataspace space(H5_CHECK(
            dims.empty() ? H5Screate(H5S_SCALAR)
                         : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
        writer.small_dataset(model.get(), tensor.name, hdf5_type(tensor.dtype),
                             hdf5_type(tensor.dtype), space.get(), tensor.data.data(),
                             crc32_of(tensor.data));
      }

      const h5::Group optimizer = writer.group(root.get(), "optimizer");
      h5::write_integer_attribute(optimizer.get(), "steps", c.optimizer_steps);
      writer.shared_floats(optimizer.get(), "master", c.master, crc32_of(c.master));
      writer.shared_floats(optimizer.get(), "exp_avg", c.exp_avg, crc32_of(c.exp_avg));
      writer.shared_floats(optimizer.get(), "exp_avg_sq", c.exp_avg_sq, crc32_of(c.exp_avg_sq));
      // The same on every rank (the state is whole everywhere): all make the same HDF5 calls.
      if (!c.ema.empty()) writer.shared_floats(optimizer.get(), "ema", c.ema, crc32_of(c.ema));

      const h5::Group training = writer.group(root.get(), "training");
      h5::write_integer_attribute(training.get(), "global_step", c.position.global_step);
      h5::write_integer_attribute(training.get(), "micro_step", c.position.micro_step);
      h5::write_integer_attribute(training.get(), "epoch", c.position.epoch);
      h5::write_integer_attribute(training.get(), "micro_steps_in_epoch",
                               c.position.micro_steps_in_epoch);
      h5::write_integer_attribute(training.get(), "skipped_steps", c.position.skipped_steps);
      h5::write_integer_attribute(training.get(), "samples_in_epoch", c.position.samples_in_epoch);
      h5::write_integer_attribute(training.get(), "micro_batch", c.position.micro_batch);
      h5::write_integer_attribute(training.get(), "grad_accum", c.position.grad_accum);
      {
        const h5::Type type = h5::fixed_string_type(c.config_ini.size());
        const h5::Dataspace space = h5::fixed_string_space(c.config_ini);
        writer.small_dataset(training.get(), "config_ini", type.get(), type.get(), space.get(),
                             c.config_ini.data(),
                             crc32_of(c.config_ini.data(), c.config_ini.size()));
      }
      for (const auto& [name, state] :
           {std::pair{"rng_state", &c.rng_state}, {"cuda_rng_state", &c.cuda_rng_state}}) {
        const hsize_t bytes = state->size();
        h5::Dataspace space(H5_CHECK(H5Screate_simple(1, &bytes, nullptr)));
        writer.small_dataset(training.get(), name, H5T_STD_U8LE, H5T_NATIVE_UINT8, space.get(),
                             state->data(), crc32_of(*state));
      }

      const h5::Group scaler = writer.group(root.get(), "loss_scaler");
      h5::write_integer_attribute(scaler.get(), "enabled", c.has_loss_scaler ? 1 : 0);
      h5::write_integer_attribute(scaler.get(), "dynamic", c.loss_scaler_dynamic ? 1 : 0);
      h5::write_double_attribute(scaler.get(), "scale", c.loss_scaler.scale);
      h5::write_integer_attribute(scaler.get(), "hysteresis_left", c.loss_scaler.hysteresis_left);
      h5::write_integer_attribute(scaler.get(), "steps", c.loss_scaler.steps);
      h5::write_integer_attribute(scaler.get(), "last_overflow_step",
                               c.loss_scaler.last_overflow_step);
      h5::write_integer_attribute(scaler.get(), "skipped_steps", c.loss_scaler.skipped_steps);
    }
    // Note [Checkpoint space]: what the flush writes lands on blocks the file already holds.
    if (!part.collective) {
      hsize_t file_bytes = 0;
      H5_CHECK(H5Fget_filesize(file.get(), &file_bytes));
      file.reserve(file_bytes);
    }
    // Under MPI-IO the flush syncs every rank's writes (MPI_File_sync); the close does not.
    H5_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL));
    file.close();
    // What the reservation claimed beyond the file's end goes back (a truncation to the same
    // size frees the blocks past it).
    struct stat status {};
    if (!part.collective && ::stat(temporary.c_str(), &status) == 0)
      (void)::truncate(temporary.c_str(), status.st_size);
  } catch (const Error& e) {
    throw Error(std::string("writing ") + temporary + ": " + e.what());
  }
}

// --- Reading (h5::Lock held) ---------------------------------------------------------------
// Errors here say what is wrong inside the file; read_checkpoint puts the file's name in front.

using Object = h5::Handle<H5Oclose>;

class CheckpointReader {
 public:
  explicit CheckpointReader(uint64_t file_bytes) : file_bytes_(file_bytes) {}

  // The attributes of `object`, named `where` in messages.
  h5::AttributeReader attributes(hid_t object, const std::string& where) const {
    return h5::AttributeReader(object, where, "", file_bytes_);
  }

  h5::Group group(hid_t file, const char* name) const {
    if (H5_CHECK(H5Lexists(file, name, H5P_DEFAULT)) <= 0)
      throw DataError(std::string("missing group ") + name);
    Object object(H5_CHECK(H5Oopen(file, name, H5P_DEFAULT)));
    if (H5Iget_type(object.get()) != H5I_GROUP)
      throw DataError(std::string(name) + " is not a group");
    return h5::Group(H5_CHECK(H5Gopen2(file, name, H5P_DEFAULT)));
  }

  h5::Dataset dataset(hid_t group, const std::string& group_name, const std::string& name) const {
    const std::string where = group_name + "/" + name;
    if (H5_CHECK(H5Lexists(group, name.c_str(), H5P_DEFAULT)) <= 0)
      throw DataError("missing dataset " + where);
    Object object(H5_CHECK(H5Oopen(group, name.c_str(), H5P_DEFAULT)));
    if (H5Iget_type(object.get()) != H5I_DATASET) throw DataError(where + " is not a dataset");
    return h5::Dataset(H5_CHECK(H5Dopen2(group, name.c_str(), H5P_DEFAULT)));
  }

  // A dataset's shape: [] for a scalar dataspace.
  std::vector<int64_t> shape(hid_t dataset, const std::string& where) const {
    h5::Dataspace space(H5_CHECK(H5Dget_space(dataset)));
    const H5S_class_t space_class = H5Sget_simple_extent_type(space.get());
    if (space_class == H5S_SCALAR) return {};
    if (space_class != H5S_SIMPLE) throw DataError(where + " holds no data (a null dataspace)");
    const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space.get()));
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
    return std::vector<int64_t>(dims.begin(), dims.end());
  }

  // Reads `elements` elements of `element_bytes` as `memory_type` and checks the crc32.
  std::vector<uint8_t> data(hid_t dataset, const std::string& where, hid_t memory_type,
                            uint64_t elements, size_t element_bytes) const {
    std::vector<uint8_t> bytes(h5::checked_bytes(elements, element_bytes, file_bytes_, where));
    if (!bytes.empty())
      H5_CHECK(H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()));
    verify_checksum(dataset, where, bytes.data(), bytes.size());
    return bytes;
  }

  std::vector<float> floats(hid_t group, const std::string& group_name, const char* name) const {
    const std::string where = group_name + "/" + name;
    const h5::Dataset d = dataset(group, group_name, name);
    h5::Type type(H5_CHECK(H5Dget_type(d.get())));
    const std::vector<int64_t> dims = shape(d.get(), where);
    if (H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != 4 || dims.size() != 1)
      throw DataError(where + " must be a 1-D array of 32-bit floats");
    std::vector<float> values(h5::checked_bytes(dims[0], sizeof(float), file_bytes_, where) /
                              sizeof(float));
    if (!values.empty())
      H5_CHECK(H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()));
    verify_checksum(d.get(), where, values.data(), values.size() * sizeof(float));
    return values;
  }

  // A 1-D array of bytes (opaque state), possibly empty.
  std::vector<uint8_t> bytes(hid_t group, const std::string& group_name, const char* name) const {
    const std::string where = group_name + "/" + name;
    const h5::Dataset d = dataset(group, group_name, name);
    h5::Type type(H5_CHECK(H5Dget_type(d.get())));
    const std::vector<int64_t> dims = shape(d.get(), where);
    if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != 1 || dims.size() != 1)
      throw DataError(where + " must be a 1-D array of bytes");
    return data(d.get(), where, H5T_NATIVE_UINT8, static_cast<uint64_t>(dims[0]), 1);
  }

  std::string text(hid_t group, const std::string& group_name, const char* name) const {
    const std::string where = group_name + "/" + name;
    const h5::Dataset d = dataset(group, group_name, name);
    h5::Type type(H5_CHECK(H5Dget_type(d.get())));
    h5::Dataspace space(H5_CHECK(H5Dget_space(d.get())));
    std::string value = h5::fixed_string_buffer(type.get(), space.get(), where, file_bytes_);
    if (!value.empty())
      H5_CHECK(H5Dread(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, value.data()));
    verify_checksum(d.get(), where, value.data(), value.size());
    return value;
  }

  // The names of a group's links in the order they were created.
  std::vector<std::string> names_in_creation_order(hid_t group, const std::string& where) const {
    h5::PropertyList creation(H5_CHECK(H5Gget_create_plist(group)));
    unsigned order_flags = 0;
    H5_CHECK(H5Pget_link_creation_order(creation.get(), &order_flags));
    if (!(order_flags & H5P_CRT_ORDER_TRACKED))
      throw DataError(where + " does not record the order of its tensors");
    H5G_info_t info;
    H5_CHECK(H5Gget_info(group, &info));
    std::vector<std::string> names;
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      const ssize_t length = H5_CHECK(H5Lget_name_by_idx(group, ".", H5_INDEX_CRT_ORDER,
                                                         H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT));
      std::string name(static_cast<size_t>(length) + 1, '\0');
      H5_CHECK(H5Lget_name_by_idx(group, ".", H5_INDEX_CRT_ORDER, H5_ITER_INC, i, name.data(),
                                  name.size(), H5P_DEFAULT));
      name.resize(static_cast<size_t>(length));
      names.push_back(std::move(name));
    }
    return names;
  }

 private:
  void verify_checksum(hid_t dataset, const std::string& where, const void* data,
                       size_t bytes) const {
    const int64_t stored = attributes(dataset, where).integer(kChecksumAttribute);
    const uint32_t actual = crc32_of(data, bytes);
    if (stored != actual) {
      char text[96];
      std::snprintf(text, sizeof(text),
                    "crc32 of the data is %08" PRIx32 ", the file says %08" PRIx64, actual,
                    static_cast<uint64_t>(stored));
      throw DataError(where + " is corrupt: " + text);
    }
  }

  uint64_t file_bytes_;
};

Checkpoint read_contents(hid_t file, uint64_t file_bytes) {
  const CheckpointReader reader(file_bytes);
  Checkpoint c;
  h5::Group root(H5_CHECK(H5Gopen2(file, "/", H5P_DEFAULT)));
  const h5::AttributeReader root_attributes = reader.attributes(root.get(), "/");
  if (!root_attributes.has("format"))
    throw DataError("not an hpc_train checkpoint: the root group has no attribute 'format'");
  const std::string format = root_attributes.fixed_string("format");
  if (format != kFormatName)
    throw DataError("not an hpc_train checkpoint: its format is \"" + format + "\", not \"" +
                    kFormatName + "\"");
  c.format_version = root_attributes.small_integer("format_version");
  if (c.format_version < kOldestReadableCheckpointFormatVersion ||
      c.format_version > kCheckpointFormatVersion)
    throw DataError("format_version " + std::to_string(c.format_version) +
                    " is not one this program reads (" +
                    std::to_string(kOldestReadableCheckpointFormatVersion) + " to " +
                    std::to_string(kCheckpointFormatVersion) + ")");
  const bool version1 = c.format_version == 1;
  c.model = root_attributes.fixed_string("model");
  c.precision = root_attributes.fixed_string("precision");
  c.channels = root_attributes.integer("channels");
  c.height = root_attributes.integer("height");
  c.width = root_attributes.integer("width");
  c.num_classes = root_attributes.integer("num_classes");
  c.zero_stage = root_attributes.small_integer("zero_stage");
  c.world_size = root_attributes.small_integer("world_size");

  {
    const h5::Group model = reader.group(file, "/model");
    for (const std::string& name : reader.names_in_creation_order(model.get(), "/model")) {
      const std::string where = "/model/" + name;
      const h5::Dataset dataset = reader.dataset(model.get(), "/model", name);
      h5::Type type(H5_CHECK(H5Dget_type(dataset.get())));
      CheckpointTensor tensor;
      tensor.name = name;
      if (H5Tget_class(type.get()) == H5T_FLOAT && H5Tget_size(type.get()) == 4)
        tensor.dtype = "F32";
      else if (H5Tget_class(type.get()) == H5T_INTEGER && H5Tget_size(type.get()) == 8 &&
               H5Tget_sign(type.get()) == H5T_SGN_2)
        tensor.dtype = "I64";
      else
        throw DataError(where + " is neither 32-bit floats nor 64-bit signed integers");
      tensor.shape = reader.shape(dataset.get(), where);
      uint64_t elements = 1;
      for (int64_t dimension : tensor.shape) {
        if (dimension != 0 && elements > file_bytes / static_cast<uint64_t>(dimension))
          throw DataError(where + " has shape " + format_shape(tensor.shape) +
                          ", larger than the file");
        elements *= static_cast<uint64_t>(dimension);
      }
      tensor.data = reader.data(dataset.get(), where, hdf5_type(tensor.dtype), elements,
                                dtype_bytes(tensor.dtype));
      c.model_state.push_back(std::move(tensor));
    }
  }
  {
    const h5::Group optimizer = reader.group(file, "/optimizer");
    const h5::AttributeReader attributes = reader.attributes(optimizer.get(), "/optimizer");
    c.optimizer_steps = attributes.integer("steps");
    c.master = reader.floats(optimizer.get(), "/optimizer", "master");
    c.exp_avg = reader.floats(optimizer.get(), "/optimizer", "exp_avg");
    c.exp_avg_sq = reader.floats(optimizer.get(), "/optimizer", "exp_avg_sq");
    if (H5_CHECK(H5Lexists(optimizer.get(), "ema", H5P_DEFAULT)) > 0)
      c.ema = reader.floats(optimizer.get(), "/optimizer", "ema");
  }
  {
    const h5::Group training = reader.group(file, "/training");
    const h5::AttributeReader attributes = reader.attributes(training.get(), "/training");
    c.position.global_step = attributes.integer("global_step");
    c.position.micro_step = attributes.integer("micro_step");
    c.position.epoch = attributes.integer("epoch");
    c.position.micro_steps_in_epoch = attributes.integer("micro_steps_in_epoch");
    c.position.skipped_steps = attributes.integer("skipped_steps");
    // Version 1 did not record them (checkpoint.h says what stands in for them).
    c.position.samples_in_epoch = version1 ? -1 : attributes.integer("samples_in_epoch");
    c.position.micro_batch = version1 ? 0 : attributes.integer("micro_batch");
    c.position.grad_accum = version1 ? 0 : attributes.integer("grad_accum");
    c.config_ini = reader.text(training.get(), "/training", "config_ini");
    c.rng_state = reader.bytes(training.get(), "/training", "rng_state");
    // Before version 3 there was none (checkpoint.h: the resume leaves the CUDA generator).
    if (c.format_version >= 3)
      c.cuda_rng_state = reader.bytes(training.get(), "/training", "cuda_rng_state");
  }
  {
    const h5::Group scaler = reader.group(file, "/loss_scaler");
    const h5::AttributeReader attributes = reader.attributes(scaler.get(), "/loss_scaler");
    c.has_loss_scaler = attributes.integer("enabled") != 0;
    c.loss_scaler_dynamic = version1 ? c.has_loss_scaler : attributes.integer("dynamic") != 0;
    c.loss_scaler.scale = attributes.real("scale");
    c.loss_scaler.hysteresis_left = attributes.small_integer("hysteresis_left");
    c.loss_scaler.steps = attributes.integer("steps");
    c.loss_scaler.last_overflow_step = attributes.integer("last_overflow_step");
    c.loss_scaler.skipped_steps = attributes.integer("skipped_steps");
  }
  const std::string problem = find_inconsistency(c);
  if (!problem.empty()) throw DataError(problem);
  return c;
}

}  // namespace

bool continues_loss_scaler(const Checkpoint& checkpoint,
                           const std::optional<LossScalerOptions>& run_scaling) {
  const bool run_dynamic = run_scaling && run_scaling->fixed_scale <= 0;
  // The file holds the precision's name (Note [Choice names] in config_choices.h).
  return run_dynamic && parse_choice<Precision>(checkpoint.precision) == Precision::kFp16 &&
         checkpoint.has_loss_scaler && checkpoint.loss_scaler_dynamic;
}

void write_checkpoint(MPI_Comm comm, const std::string& path, const Checkpoint& checkpoint) {
  write_checkpoint(comm, path, checkpoint, CheckpointWriteMode::kAuto);
}

namespace {

// What every write refuses before it touches a file. `failed` starts the message.
void check_writable(const Checkpoint& checkpoint, const std::string& failed) {
  if (checkpoint.format_version != kCheckpointFormatVersion)
    throw Error(failed + "format_version " + std::to_string(checkpoint.format_version) +
                " is not the one this program writes (" + std::to_string(kCheckpointFormatVersion) +
                ")");
  if (const std::string problem = find_inconsistency(checkpoint); !problem.empty())
    throw Error(failed + problem);
}

// The whole file by this process alone (HDF5's POSIX driver, no MPI), into `file`'s temporary,
// then committed under its final name.
void write_whole_file(const std::string& path, const Checkpoint& checkpoint, AtomicFile& file) {
  make_directories(directory_of(path));
  check_free_space(path, checkpoint_file_bytes(checkpoint));  // Note [Checkpoint space]
  write_file(file.temporary(), checkpoint, MPI_COMM_SELF, WriterPart{});
  file.commit();
}

}  // namespace

void write_checkpoint_file(const std::string& path, const Checkpoint& checkpoint) {
  const std::string failed = "cannot write checkpoint " + path + ": ";
  check_writable(checkpoint, failed);
  AtomicFile file(path, kCheckpointTemporarySuffix);
  try {
    write_whole_file(path, checkpoint, file);
  } catch (const std::exception& e) {
    throw Error(failed + e.what());
  }
}

void write_checkpoint(MPI_Comm comm, const std::string& path, const Checkpoint& checkpoint,
                      CheckpointWriteMode mode) {
  const std::string failed = "cannot write checkpoint " + path + ": ";
  check_writable(checkpoint, failed);
  if (mode == CheckpointWriteMode::kAuto)
    mode = kParallelHdf5 ? CheckpointWriteMode::kCollective : CheckpointWriteMode::kRankZero;
  if (mode == CheckpointWriteMode::kCollective && !kParallelHdf5)
    throw Error(failed + "a collective write needs a parallel HDF5 library; this one is serial");

  int rank = 0, world = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &world));
  // Note [Atomic file write]: rank 0 owns the temporary file (it removes it unless committed);
  // in a collective write the other ranks write their shares into it by name.
  const std::string temporary = path + kCheckpointTemporarySuffix;
  std::optional<AtomicFile> file;
  if (rank == 0) file.emplace(path, kCheckpointTemporarySuffix);
  // Runs `rank_zero_part` on rank 0; every rank then throws its error, or none does, so that no
  // rank waits for another that gave up.
  auto agree = [&](auto&& rank_zero_part) {
    std::string failure;
    if (rank == 0) {
      try {
        rank_zero_part();
      } catch (const std::exception& e) {
        failure = failed + e.what();
      }
    }
    failure = broadcast_string(comm, failure, 0);
    if (!failure.empty()) throw Error(failure);
  };

  if (mode == CheckpointWriteMode::kRankZero) {
    agree([&] { write_whole_file(path, checkpoint, *file); });
    return;
  }
  agree([&] {
    make_directories(directory_of(path));
    check_free_space(path, checkpoint_file_bytes(checkpoint));  // Note [Checkpoint space]
  });
  try {
    write_file(temporary, checkpoint, comm, WriterPart{true, rank, world});
  } catch (const Error& e) {
    throw Error(failed + e.what());
  }
  // Every rank's share is in the file, synced and closed, before rank 0 renames it.
  MPI_CHECK(MPI_Barrier(comm));
  agree([&] { file->commit(); });
}

Checkpoint read_checkpoint(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0)
    throw DataError(path +
                    (errno == ENOENT ? ": no such file" : ": cannot access: " + system_error()));
  if (S_ISDIR(status.st_mode)) throw DataError(path + ": is a directory, not a checkpoint file");
  if (!S_ISREG(status.st_mode)) throw DataError(path + ": not a regular file");

  h5::Lock lock;  // Note [HDF5 lock]; before every handle below
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 <= 0)
    throw DataError(path + ": not an HDF5 file" +
                    (is_hdf5 < 0 ? " (" + h5::error_stack_message() + ")" : std::string()));
  const hid_t file_id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_id < 0)
    throw DataError(path + ": cannot open as HDF5 (" + h5::error_stack_message() + ")");
  const h5::File file(file_id);
  try {
    return read_contents(file.get(), static_cast<uint64_t>(status.st_size));
  } catch (const DataError& e) {
    throw DataError(path + ": " + e.what());
  }
}

void check_checkpoint_fits(
    const Checkpoint& checkpoint, const std::string& path, const std::string& model,
    int64_t channels, int64_t height, int64_t width, int64_t num_classes,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& expected,
    int64_t expected_numel) {
  const Checkpoint& c = checkpoint;
  if (c.model != model || c.channels != channels || c.height != height || c.width != width ||
      c.num_classes != num_classes)
    throw DataError(path + ": the checkpoint holds " + c.model + " for " +
                    describe_input(c.channels, c.height, c.width, c.num_classes) +
                    "; this run has " + model + " for " +
                    describe_input(channels, height, width, num_classes));
  const size_t common = std::min(c.model_state.size(), expected.size());
  for (size_t i = 0; i < common; ++i) {
    const CheckpointTensor& saved = c.model_state[i];
    const auto& [name, shape] = expected[i];
    if (saved.name != name || saved.shape != shape)
      throw DataError(path + ": model tensor " + std::to_string(i) + " is " + saved.name + " " +
                      format_shape(saved.shape) + " in the checkpoint, " + name + " " +
                      format_shape(shape) + " in this run");
  }
  if (c.model_state.size() != expected.size()) {
    const bool checkpoint_longer = c.model_state.size() > expected.size();
    throw DataError(path + ": the checkpoint has " + std::to_string(c.model_state.size()) +
                    " model tensors, this run " + std::to_string(expected.size()) + " (" +
                    (checkpoint_longer ? c.model_state[common].name + " is only in the checkpoint"
                                       : expected[common].first + " is only in this run") +
                    ")");
  }
  if (static_cast<int64_t>(c.master.size()) != expected_numel)
    throw DataError(path + ": the checkpoint's optimizer state holds " +
                    std::to_string(c.master.size()) + " parameters, this run's model has " +
                    std::to_string(expected_numel));
}

void write_weights_safetensors(const std::string& path, const Checkpoint& checkpoint) {
  std::vector<SafetensorsEntry> entries;
  for (const CheckpointTensor& tensor : checkpoint.model_state)
    entries.push_back(
        {tensor.name, tensor.dtype, tensor.shape, tensor.data.data(), tensor.data.size()});
  const std::map<std::string, std::string> metadata = {
      {"format", kWeightsFormatName},
      {"model", checkpoint.model},
      {"channels", std::to_string(checkpoint.channels)},
      {"height", std::to_string(checkpoint.height)},
      {"width", std::to_string(checkpoint.width)},
      {"num_classes", std::to_string(checkpoint.num_classes)},
      {"step", std::to_string(checkpoint.position.global_step)},
  };
  write_safetensors(path, entries, metadata);
}

}  // namespace hpc_train
