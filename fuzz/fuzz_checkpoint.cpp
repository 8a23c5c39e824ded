// The checkpoint reader (read_checkpoint): format marker and version, every field, sizes, CRCs.
// The input is a recipe of the file, Note [HDF5 recipes].
#include "fuzz_support.h"
#include "hdf5_recipe.h"
#include "hpc_train/io/checkpoint.h"

using namespace hpc_train;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::prepare_hdf5();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch_path("checkpoint.h5");
  fuzz::build_hdf5_file(data, size, path);
  fuzz::parse_or_reject([&] {
    const Checkpoint checkpoint = read_checkpoint(path);
    // read_checkpoint's promise (checkpoint.h): each tensor's bytes fill its shape, and the
    // optimizer arrays have one length.
    for (const CheckpointTensor& tensor : checkpoint.model_state) {
      std::optional<uint64_t> bytes = tensor.dtype == "F32" ? 4 : tensor.dtype == "I64" ? 8 : 0;
      fuzz::fail_unless(*bytes != 0, "a tensor of dtype '" + tensor.dtype + "'");
      for (int64_t dimension : tensor.shape) {
        fuzz::fail_unless(dimension >= 0, "a negative dimension");
        if (bytes) bytes = fuzz::checked_product(*bytes, static_cast<uint64_t>(dimension));
      }
      fuzz::fail_unless(bytes && *bytes == tensor.data.size(),
                        "tensor '" + tensor.name + "' has bytes that do not fill its shape");
    }
    fuzz::fail_unless(checkpoint.exp_avg.size() == checkpoint.master.size() &&
                          checkpoint.exp_avg_sq.size() == checkpoint.master.size(),
                      "optimizer arrays of unequal lengths");
  });
  fuzz::require_no_open_hdf5_objects();
  return 0;
}
