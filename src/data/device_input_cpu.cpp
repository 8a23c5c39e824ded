// StagingCopies of a CPU build (device_input_staging.h; Note [Staging ring] in device_input.cpp):
// the host buffers are the device buffers, so there is nothing to copy or order. The GPU build's
// is device_input_cuda.cpp. There is no input kernel: DeviceInput runs LibTorch's ops.
#include "data/device_input_staging.h"

#include "hpc_train/error.h"

namespace hpc_train {

struct StagingCopies::Streams {};  // none: streams_ stays empty

StagingCopies::StagingCopies(c10::Device& device) {
  if (!device.is_cpu())
    throw Error("DeviceInput: device " + device.str() +
                ", but this hpc_train was built with a LibTorch without CUDA");
}

StagingCopies::~StagingCopies() = default;

void StagingCopies::wait_host_buffers_free(int) {}
void StagingCopies::start_copy(int, StagingSlot&) {}
void StagingCopies::order_after_copy(int) {}
void StagingCopies::release_after_use(int) {}
void StagingCopies::wait_for_copies() noexcept {}

bool launch_input_kernel(const InputBatchArgs&, const at::Tensor&) { return false; }

}  // namespace hpc_train
