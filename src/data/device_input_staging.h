// The build's half of Note [Staging ring] (device_input.cpp), private to DeviceInput: one slot of
// the ring, StagingCopies, which moves a staged batch from a slot's host buffers to its device
// buffers and orders those copies with the compute stream, and the input kernel's launch. The build picks one of two
// implementations: device_input_cuda.cpp (a copy stream, and events `copied` and `consumed` per
// slot) or device_input_cpu.cpp (the host buffers are the device buffers: nothing to copy or
// order).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

namespace hpc_train {

// Rows of a slot's per-sample fields, an int64 [kFieldRows, size] block: one copy carries the
// labels and the augmentation draws together.
enum FieldRow : int64_t {
  kLabelOrIndex = 0,  // the label; for a resident batch, the sample's index in the split
  kCropTop = 1,       // the window's top row in the padded image, in [0, 2 * padding]
  kCropLeft = 2,      // its left column, likewise
  kFlip = 3,          // 1: mirror left-right
  kFieldRows = 4,
};

// One slot of the ring: one batch, in host buffers (pinned on CUDA) and device buffers.
struct StagingSlot {
  at::Tensor host_images;    // [max_batch_size, C, H, W] uint8
  at::Tensor host_fields;    // [kFieldRows * max_batch_size] int64
  at::Tensor device_images;  // the same tensors as the host ones on the CPU
  at::Tensor device_fields;
  int64_t size = 0;          // samples of the batch staged here
  bool resident = false;     // images come from the resident split, not from host_images
  int64_t epoch = 0;         // for messages
  int64_t index_in_epoch = 0;
};

// The hooks of Note [Staging ring], for the slot `slot_index` of DeviceInput's ring.
class StagingCopies {
 public:
  // For a DeviceInput on `device`; a CUDA device without an index becomes the current device.
  // Throws Error for a device that this build cannot reach.
  explicit StagingCopies(c10::Device& device);
  ~StagingCopies();
  StagingCopies(const StagingCopies&) = delete;
  StagingCopies& operator=(const StagingCopies&) = delete;

  // Before the host writes the slot's host buffers: the copy that last read them has finished.
  void wait_host_buffers_free(int slot_index);
  // Once `slot` (the slot `slot_index`) is staged: starts the copy of its fields, and of its
  // images unless resident, to its device buffers.
  void start_copy(int slot_index, StagingSlot& slot);
  // Before the current stream reads the slot's device buffers: they hold the copied batch.
  void order_after_copy(int slot_index);
  // After the current stream has queued its reads of them: the next copy waits for those.
  void release_after_use(int slot_index);
  // No copy is writing any device buffers any more (before they are freed). Never throws.
  void wait_for_copies() noexcept;

 private:
  struct Streams;  // device_input_cuda.cpp's copy stream and events; nothing in a CPU build
  std::unique_ptr<Streams> streams_;
};

struct InputBatchArgs;  // input_items.h

// Note [One input kernel]: launches the build's input kernel for `args` on the current stream,
// writing `input` (the model dtype, on a GPU) and the labels; false where there is none (a CPU
// build, or `input` on the CPU): the caller then runs LibTorch's ops.
bool launch_input_kernel(const InputBatchArgs& args, const at::Tensor& input);

}  // namespace hpc_train
