// StagingCopies of a GPU build (device_input_staging.h; Note [Staging ring] in device_input.cpp):
// a slot's copies run on a copy stream of their own, ordered with the compute stream by the
// slot's events `copied` and `consumed`. A DeviceInput on the CPU of a GPU build has nothing to
// copy, as in a CPU build (device_input_cpu.cpp).
#include "data/device_input_staging.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <optional>

#include "hpc_train/data/device_input.h"
#include "hpc_train/data/input_kernel.h"
#include "hpc_train/runtime/kernel_dtype_torch.h"

namespace hpc_train {

struct StagingCopies::Streams {
  c10::DeviceIndex device_index = -1;                // the DeviceInput's GPU
  std::optional<c10::cuda::CUDAStream> copy_stream;  // engaged when the device is a GPU
  std::array<at::cuda::CUDAEvent, DeviceInput::kStagingSlots> copied;
  std::array<at::cuda::CUDAEvent, DeviceInput::kStagingSlots> consumed;
};

StagingCopies::StagingCopies(c10::Device& device) : streams_(std::make_unique<Streams>()) {
  if (!device.is_cuda()) return;
  if (!device.has_index()) device = c10::Device(c10::kCUDA, c10::cuda::current_device());
  streams_->device_index = device.index();
  streams_->copy_stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
}

StagingCopies::~StagingCopies() = default;

void StagingCopies::wait_host_buffers_free(int slot_index) {
  Streams& s = *streams_;
  if (s.copy_stream) s.copied[slot_index].synchronize();
}

void StagingCopies::start_copy(int slot_index, StagingSlot& slot) {
  Streams& s = *streams_;
  if (!s.copy_stream) return;
  c10::cuda::CUDAStreamGuard on_copy_stream(*s.copy_stream);
  s.consumed[slot_index].block(*s.copy_stream);
  if (!slot.resident)
    slot.device_images.narrow(0, 0, slot.size)
        .copy_(slot.host_images.narrow(0, 0, slot.size), /*non_blocking=*/true);
  const int64_t fields = kFieldRows * slot.size;
  slot.device_fields.narrow(0, 0, fields)
      .copy_(slot.host_fields.narrow(0, 0, fields), /*non_blocking=*/true);
  s.copied[slot_index].record(*s.copy_stream);
}

void StagingCopies::order_after_copy(int slot_index) {
  Streams& s = *streams_;
  if (s.copy_stream) s.copied[slot_index].block(c10::cuda::getCurrentCUDAStream(s.device_index));
}

void StagingCopies::release_after_use(int slot_index) {
  Streams& s = *streams_;
  if (s.copy_stream)
    s.consumed[slot_index].record(c10::cuda::getCurrentCUDAStream(s.device_index));
}

// The device buffers return to the caching allocator for reuse on the stream they were made
// on, which knows nothing of the copy stream: no copy may still be writing them.
void StagingCopies::wait_for_copies() noexcept {
  Streams& s = *streams_;
  if (!s.copy_stream) return;
  for (at::cuda::CUDAEvent& event : s.copied) {
    try {
      event.synchronize();
    } catch (...) {  // destructors never throw; a CUDA error here resurfaces at the next call
    }
  }
}

bool launch_input_kernel(const InputBatchArgs& args, const at::Tensor& input) {
  if (!input.is_cuda()) return false;
  const std::optional<KernelDtype> dtype = kernel_dtype_of(input.scalar_type());
  if (!dtype) return false;
  launch_input_batch(args, *dtype, c10::cuda::getCurrentCUDAStream(input.device().index()));
  return true;
}

}  // namespace hpc_train
