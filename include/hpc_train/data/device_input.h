// Input on the device: uint8 batches from host memory (or from a split kept resident on the
// device) become the model's input, normalised and augmented on the device.
//
// A batch crosses to the device as uint8 (a quarter of the bytes of float) with its labels and
// its augmentation draws, and is then, on the device: augmented (random crop of a zero-padded
// image, horizontal flip; index moves only), cast to float, normalised to (x/255 - mean) / std
// per channel, and cast to the model dtype.
//
// Two phases, so that the copy of the next batch overlaps the current step (Note [Staging ring]
// in device_input.cpp):
//   prepare(batch, epoch)   right after the loader hands the batch over: copies it into a
//                           staging slot and, on CUDA, starts its host-to-device copy on a copy
//                           stream; returns without waiting for the copy.
//   take()                  when the step needs the batch: orders the current stream after
//                           that copy (no host synchronisation) and returns the tensors.
//   take_into(in, labels)   the same, written into caller-owned tensors of fixed shape (inputs
//                           of a captured CUDA graph).
// Batches come out of take() in the order they went into prepare(); up to kStagingSlots may be
// prepared and not yet taken. to_device() does both phases at once (evaluation).
// On the CPU there is no stream and no copy: the same calls give the same values.
//
// Note [Augmentation draws]: each batch's random numbers are a pure function of
// (seed, rank, epoch, index of the batch in the epoch), drawn on the host, so an augmented batch
// is reproducible, needs no generator state in a checkpoint, and is the same on every device.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hpc_train/data/batch_loader.h"
#include "hpc_train/config/config_choices.h"
#include "hpc_train/data/dataset_file.h"

namespace hpc_train {

// Training-time augmentation (never for evaluation).
struct AugmentOptions {
  bool random_crop = false;  // a window of the image zero-padded by crop_padding_px on each side
  int crop_padding_px = 4;   // offsets are uniform in [0, 2 * crop_padding_px] on both axes
  bool horizontal_flip = false;  // each sample mirrored left-right with probability 1/2
};

// The --augment policy. auto: crop + flip for colour images of at least 32x32 (CIFAR-like),
// nothing otherwise (MNIST, Fashion-MNIST); on / off force it.
AugmentOptions default_augmentation(const DatasetInfo& info, Switch setting);

// Bytes that keep_split_resident() puts on the device for `split`: images and int64 labels.
int64_t resident_split_bytes(const DatasetInfo& info, Split split);

// The model's input layout: NHWC when `channels_last` (cuDNN's layout on tensor cores, the
// GPU's default: --channels-last), else the batch's NCHW as it is.
inline at::Tensor in_model_layout(const at::Tensor& input, bool channels_last) {
  return channels_last ? input.contiguous(at::MemoryFormat::ChannelsLast) : input;
}

// A batch on the device, ready for the model.
struct DeviceBatch {
  at::Tensor input;   // [size, C, H, W], model dtype, normalised (and augmented)
  at::Tensor labels;  // [size], int64
};

class DeviceInput {
 public:
  // How many batches may be prepared and not yet taken. Two let the copy of batch k+1 run while
  // batch k is in use.
  static constexpr int kStagingSlots = 2;

  // `info` gives the image shape and the per-channel mean/std. Batches may hold up to
  // `max_batch_size` samples. `seed` and `rank` key the augmentation draws (Note [Augmentation
  // draws]). On CUDA this allocates the staging ring: pinned host and device buffers of
  // kStagingSlots batches.
  DeviceInput(const DatasetInfo& info, c10::Device device, c10::ScalarType dtype,
              AugmentOptions augment, uint64_t seed, int rank, int64_t max_batch_size);
  ~DeviceInput();  // waits for copies in flight; never throws
  DeviceInput(const DeviceInput&) = delete;
  DeviceInput& operator=(const DeviceInput&) = delete;

  // Stages a loader batch of `epoch`. Throws Error for an empty batch, one larger than
  // max_batch_size or with the wrong number of bytes, and when kStagingSlots batches are
  // already waiting for take(). May wait on the host for the copy of the batch that used this
  // staging slot kStagingSlots batches ago (normally long finished).
  void prepare(const HostBatch& batch, int64_t epoch);

  // Resident mode: reads `split` of `file` once and keeps it (uint8 images and labels) on the
  // device; resident_split_bytes() says how much that takes. Batches are then gathers there.
  void keep_split_resident(const DatasetFile& file, Split split);
  // Stages the resident split's samples `dataset_indices` (an epoch plan's slice) as batch
  // `index_in_epoch` of `epoch`: only the indices and the draws cross to the device. Gives the
  // same batch as prepare() of a loader batch of those samples. Throws Error without a resident
  // split, or for an index outside it.
  void prepare_resident(const std::vector<int64_t>& dataset_indices, int64_t index_in_epoch,
                        int64_t epoch);

  // The oldest prepared batch, as new tensors on the device (on CUDA: ordered on the current
  // stream, which may use them at once). Throws Error when nothing is prepared.
  DeviceBatch take();
  // The oldest prepared batch written into `static_input` ([max_batch_size, C, H, W], model dtype,
  // on the device) and `static_labels` ([max_batch_size], int64, on the device), for CUDA-graph
  // replay; call it outside graph capture. The batch must be full-size: a smaller one (an
  // epoch's short last batch) throws Error and stays prepared, so the caller can take() it and
  // run that step eagerly. Throws Error for tensors of another shape, dtype or device.
  void take_into(at::Tensor& static_input, at::Tensor& static_labels);

  // prepare() then take().
  DeviceBatch to_device(const HostBatch& batch, int64_t epoch);

 private:
  friend struct TestHooks;  // fill: prepare() then take_into() (Note [Test hooks])
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hpc_train
