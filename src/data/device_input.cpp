#include "hpc_train/data/device_input.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <utility>

#include "data/device_input_staging.h"
#include "hpc_train/data/input_items.h"
#include "hpc_train/error.h"
#include "hpc_train/runtime/test_hooks.h"

namespace hpc_train {

namespace {

// Bytes read per chunk while keep_split_resident() uploads a split: bounds host memory.
constexpr int64_t kResidentUploadChunkBytes = int64_t{64} << 20;

// SplitMix64's output function (Steele, Lea, Flood 2014): a bijection of 64-bit words that
// mixes every input bit into every output bit.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// Note [Augmentation draws]: the key of one batch's draws. Each part is folded in after mixing
// what came before, so that nearby tuples give unrelated keys.
uint64_t batch_key(uint64_t seed, int rank, int64_t epoch, int64_t index_in_epoch) {
  uint64_t key = mix64(seed + kGolden);
  for (const uint64_t part : {static_cast<uint64_t>(rank), static_cast<uint64_t>(epoch),
                              static_cast<uint64_t>(index_in_epoch)})
    key = mix64((key ^ part) + kGolden);
  return key;
}

// Uniform in [0, range) from one random word (Lemire's multiply-shift). The bias, at most
// range / 2^64, is far below anything a training run can see, so there is no rejection loop.
int64_t draw_below(uint64_t word, int64_t range) {
  __extension__ typedef unsigned __int128 Wide;  // GCC and Clang
  return static_cast<int64_t>((static_cast<Wide>(word) * static_cast<uint64_t>(range)) >> 64);
}

// Crop of the zero-padded images and flip, as one gather: output pixel (y, x) of sample s comes
// from row y + top_s - padding and column (flip_s ? W-1-x : x) + left_s - padding of the
// unpadded image, or is 0 where that falls into the padding. A fixed number of kernels for the
// whole batch, exact (uint8 index moves), the same on every device.
at::Tensor crop_and_flip(const at::Tensor& images, const at::Tensor& top, const at::Tensor& left,
                         const at::Tensor& flip, int64_t padding) {
  const int64_t n = images.size(0), channels = images.size(1);
  const int64_t height = images.size(2), width = images.size(3);
  const at::TensorOptions index_options = top.options();
  const at::Tensor rows = at::arange(height, index_options).view({1, height}) +
                          (top - padding).view({n, 1});  // [n, H]
  const at::Tensor columns = at::arange(width, index_options).view({1, width});
  const at::Tensor source_columns =
      at::where(flip.view({n, 1}).to(at::kBool), columns.flip({1}), columns) +
      (left - padding).view({n, 1});  // [n, W]
  const at::Tensor inside = ((rows >= 0) & (rows < height)).view({n, height, 1}) &
                            ((source_columns >= 0) & (source_columns < width)).view({n, 1, width});
  const at::Tensor source = rows.clamp(0, height - 1).view({n, height, 1}) * width +
                            source_columns.clamp(0, width - 1).view({n, 1, width});  // [n, H, W]
  const at::Tensor gathered =
      images.reshape({n, channels, height * width})
          .gather(2, source.view({n, 1, height * width}).expand({n, channels, height * width}));
  return gathered.view({n, channels, height, width})
      .masked_fill(inside.logical_not().view({n, 1, height, width}), 0);
}

std::string shape_text(at::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + std::to_string(sizes[i]);
  return text + "]";
}

}  // namespace

AugmentOptions default_augmentation(const DatasetInfo& info, Switch setting) {
  AugmentOptions on;
  on.random_crop = true;
  on.horizontal_flip = true;
  switch (setting) {
    case Switch::kOn:
      return on;
    case Switch::kOff:
      return AugmentOptions{};
    case Switch::kAuto:
      break;
  }
  // Crop and flip are the standard recipe for CIFAR-like photos; for digits and clothing items
  // centred on a blank background they change the classes' look, so they stay off.
  const bool cifar_like = info.channels == 3 && info.height >= 32 && info.width >= 32;
  return cifar_like ? on : AugmentOptions{};
}

int64_t resident_split_bytes(const DatasetInfo& info, Split split) {
  return info.size(split) * (info.sample_bytes() + static_cast<int64_t>(sizeof(int64_t)));
}

// Note [Staging ring]
// kStagingSlots slots, used round robin. Each holds one batch: uint8 images and the int64
// per-sample fields (FieldRow), in host buffers (pinned on CUDA) and device buffers. On the CPU
// the host buffers are the device buffers. On CUDA:
//   prepare(): the host writes a slot's host buffers only after the copy that last read them has
//     finished (event `copied`: a host wait, normally long satisfied); the copy stream overwrites
//     the slot's device buffers only after the compute stream has finished reading them (event
//     `consumed`: a wait on the device, not on the host); then it copies and records `copied`.
//   take(): the current (compute) stream waits for `copied` on the device, reads the device
//     buffers into new tensors, and records `consumed`.
// So there is no host synchronisation per batch, and the copy of batch k+1 runs while the
// compute stream is busy with batch k. The copies and events are the build's StagingCopies
// (device_input_staging.h).
struct DeviceInput::Impl {
  using Slot = StagingSlot;

  DatasetInfo info;
  c10::Device device;
  c10::ScalarType dtype;
  AugmentOptions augment;
  uint64_t seed;
  int rank;
  int64_t max_batch_size;
  at::Tensor mean;  // [1, C, 1, 1] float, on the device
  at::Tensor std;
  std::array<Slot, kStagingSlots> slots;
  int64_t prepared = 0;  // batches prepared so far; slot of batch b: b % kStagingSlots
  int64_t taken = 0;
  at::Tensor resident_images;  // [split size, C, H, W] uint8 on the device, or undefined
  at::Tensor resident_labels;  // [split size] int64
  std::optional<StagingCopies> copies;  // the build's (device_input_staging.h); set at once

  Impl(const DatasetInfo& dataset, c10::Device where, c10::ScalarType model_dtype,
       AugmentOptions augmentation, uint64_t augment_seed, int this_rank, int64_t max_batch)
      : info(dataset), device(where), dtype(model_dtype), augment(augmentation),
        seed(augment_seed), rank(this_rank), max_batch_size(max_batch) {
    if (max_batch_size < 1)
      throw Error("DeviceInput: max_batch_size = " + std::to_string(max_batch_size) +
                  ", expected >= 1");
    if (augment.crop_padding_px < 0)
      throw ConfigError("crop padding " + std::to_string(augment.crop_padding_px) +
                        " px: use a number of pixels >= 0");
    if (static_cast<int64_t>(info.mean.size()) != info.channels ||
        static_cast<int64_t>(info.std.size()) != info.channels)
      throw Error("DeviceInput: the dataset has " + std::to_string(info.channels) +
                  " channels but " + std::to_string(info.mean.size()) + " means and " +
                  std::to_string(info.std.size()) + " standard deviations");
    copies.emplace(device);
    const at::TensorOptions on_device = at::TensorOptions().device(device);
    mean = at::tensor(info.mean, at::kFloat).view({1, info.channels, 1, 1}).to(device);
    std = at::tensor(info.std, at::kFloat).view({1, info.channels, 1, 1}).to(device);
    const bool separate_host_buffers = !device.is_cpu();
    for (Slot& slot : slots) {
      const at::TensorOptions on_host = at::TensorOptions().pinned_memory(separate_host_buffers);
      slot.host_images = at::empty({max_batch_size, info.channels, info.height, info.width},
                                   on_host.dtype(at::kByte));
      slot.host_fields = at::empty({kFieldRows * max_batch_size}, on_host.dtype(at::kLong));
      slot.device_images = separate_host_buffers
                               ? at::empty(slot.host_images.sizes(), on_device.dtype(at::kByte))
                               : slot.host_images;
      slot.device_fields = separate_host_buffers
                               ? at::empty(slot.host_fields.sizes(), on_device.dtype(at::kLong))
                               : slot.host_fields;
    }
  }

  // The slot the next prepare() fills, once its host buffers may be written.
  Slot& claim_slot(int64_t size) {
    if (prepared - taken >= kStagingSlots)
      throw Error("DeviceInput::prepare: " + std::to_string(kStagingSlots) +
                  " batches are already prepared and not taken; take() one first");
    if (size < 1 || size > max_batch_size)
      throw Error("DeviceInput::prepare: a batch of " + std::to_string(size) +
                  " samples; expected 1 to " + std::to_string(max_batch_size));
    const int index = static_cast<int>(prepared % kStagingSlots);
    copies->wait_host_buffers_free(index);
    return slots[index];
  }

  // The per-sample fields of a staged batch: row kLabelOrIndex is already written; the draws go
  // into the others (Note [Augmentation draws]). Three words per sample, always, so that a
  // sample's draws depend only on its position in the batch, not on the options or batch size.
  void write_draws(Slot& slot) const {
    const int64_t n = slot.size;
    int64_t* fields = slot.host_fields.data_ptr<int64_t>();
    const int64_t padding = augment.crop_padding_px;
    const int64_t offsets = 2 * padding + 1;
    uint64_t counter = batch_key(seed, rank, slot.epoch, slot.index_in_epoch);
    for (int64_t s = 0; s < n; ++s) {
      const uint64_t top_word = mix64(counter += kGolden);
      const uint64_t left_word = mix64(counter += kGolden);
      const uint64_t flip_word = mix64(counter += kGolden);
      fields[kCropTop * n + s] = augment.random_crop ? draw_below(top_word, offsets) : padding;
      fields[kCropLeft * n + s] = augment.random_crop ? draw_below(left_word, offsets) : padding;
      fields[kFlip * n + s] = augment.horizontal_flip ? static_cast<int64_t>(flip_word >> 63) : 0;
    }
  }

  void finish_prepare(Slot& slot) {
    write_draws(slot);
    copies->start_copy(static_cast<int>(prepared % kStagingSlots), slot);
    ++prepared;
  }

  void prepare(const HostBatch& batch, int64_t epoch) {
    if (static_cast<int64_t>(batch.images.size()) != batch.size * info.sample_bytes() ||
        static_cast<int64_t>(batch.labels.size()) != batch.size)
      throw Error("DeviceInput::prepare: batch " + std::to_string(batch.index_in_epoch) +
                  " of " + std::to_string(batch.size) + " samples holds " +
                  std::to_string(batch.images.size()) + " image bytes and " +
                  std::to_string(batch.labels.size()) + " labels; expected " +
                  std::to_string(batch.size * info.sample_bytes()) + " and " +
                  std::to_string(batch.size));
    Slot& slot = claim_slot(batch.size);
    slot.size = batch.size;
    slot.resident = false;
    slot.epoch = epoch;
    slot.index_in_epoch = batch.index_in_epoch;
    std::memcpy(slot.host_images.data_ptr<uint8_t>(), batch.images.data(), batch.images.size());
    std::memcpy(slot.host_fields.data_ptr<int64_t>() + kLabelOrIndex * batch.size,
                batch.labels.data(), batch.labels.size() * sizeof(int64_t));
    finish_prepare(slot);
  }

  void keep_split_resident(const DatasetFile& file, Split split) {
    if (prepared != taken)
      throw Error("DeviceInput::keep_split_resident: batches are prepared and not taken");
    const int64_t count = info.size(split);
    const int64_t sample_bytes = info.sample_bytes();
    resident_images = at::empty({count, info.channels, info.height, info.width},
                                at::TensorOptions().dtype(at::kByte).device(device));
    resident_labels = at::empty({count}, at::TensorOptions().dtype(at::kLong).device(device));
    const int64_t chunk = std::max<int64_t>(1, kResidentUploadChunkBytes / sample_bytes);
    std::vector<int64_t> indices;
    std::vector<uint8_t> images;
    std::vector<int64_t> labels;
    for (int64_t begin = 0; begin < count; begin += chunk) {
      const int64_t n = std::min(chunk, count - begin);
      indices.resize(static_cast<size_t>(n));
      std::iota(indices.begin(), indices.end(), begin);
      images.resize(static_cast<size_t>(n * sample_bytes));
      labels.resize(static_cast<size_t>(n));
      file.read_samples(split, indices, images.data(), labels.data());
      // Blocking copies from pageable memory: the vectors are reused only after they are done.
      resident_images.narrow(0, begin, n)
          .copy_(at::from_blob(images.data(), {n, info.channels, info.height, info.width},
                               at::kByte));
      resident_labels.narrow(0, begin, n).copy_(at::from_blob(labels.data(), {n}, at::kLong));
    }
  }

  void prepare_resident(const std::vector<int64_t>& dataset_indices, int64_t index_in_epoch,
                        int64_t epoch) {
    if (!resident_images.defined())
      throw Error("DeviceInput::prepare_resident: no resident split; call keep_split_resident()");
    const int64_t split_size = resident_images.size(0);
    for (const int64_t index : dataset_indices)
      if (index < 0 || index >= split_size)
        throw Error("DeviceInput::prepare_resident: sample index " + std::to_string(index) +
                    " outside the resident split of " + std::to_string(split_size) + " samples");
    const int64_t size = static_cast<int64_t>(dataset_indices.size());
    Slot& slot = claim_slot(size);
    slot.size = size;
    slot.resident = true;
    slot.epoch = epoch;
    slot.index_in_epoch = index_in_epoch;
    std::memcpy(slot.host_fields.data_ptr<int64_t>() + kLabelOrIndex * size,
                dataset_indices.data(), dataset_indices.size() * sizeof(int64_t));
    finish_prepare(slot);
  }

  Slot& oldest_prepared(const char* caller) {
    if (prepared == taken)
      throw Error(std::string("DeviceInput::") + caller + ": no batch is prepared");
    return slots[taken % kStagingSlots];
  }

  // Note [One input kernel]
  // A batch becomes the model's input in one kernel on a GPU (input_kernel.cu): the resident
  // split's gather (or the staged batch), crop, flip, normalisation, cast to the model dtype and
  // the caller's layout, and the labels, where LibTorch's ops took about ten launches (index
  // selects, a gather and a mask for the crop, a cast, three arithmetic passes, a cast, and the
  // copies into a CUDA graph's static buffers), each a pass over the batch on the GPU before the
  // step. Its arithmetic is those ops', op for op (input_items.h). On the CPU, LibTorch's ops
  // run, as they always have: CPU runs stay bitwise the same.
  //
  // Writes the oldest prepared batch into `input` ([size, C, H, W], the model dtype, any
  // strides) and `labels` ([size] int64), on the current stream. The caller then calls
  // finish_take().
  void write_oldest(const at::Tensor& input, const at::Tensor& labels) {
    Slot& slot = slots[taken % kStagingSlots];
    copies->order_after_copy(static_cast<int>(taken % kStagingSlots));
    const at::Tensor fields = slot.device_fields.narrow(0, 0, kFieldRows * slot.size)
                                  .view({kFieldRows, slot.size});
    const bool augmented = augment.random_crop || augment.horizontal_flip;
    InputBatchArgs args;
    args.batch = slot.size;
    args.channels = info.channels;
    args.height = info.height;
    args.width = info.width;
    args.images = (slot.resident ? resident_images : slot.device_images).data_ptr<uint8_t>();
    args.source_row = slot.resident ? fields[kLabelOrIndex].data_ptr<int64_t>() : nullptr;
    args.source_labels = slot.resident ? resident_labels.data_ptr<int64_t>()
                                       : fields[kLabelOrIndex].data_ptr<int64_t>();
    if (augmented) {
      args.crop_top = fields[kCropTop].data_ptr<int64_t>();
      args.crop_left = fields[kCropLeft].data_ptr<int64_t>();
      args.flip = fields[kFlip].data_ptr<int64_t>();
      args.crop_padding = augment.crop_padding_px;
    }
    args.mean = mean.data_ptr<float>();
    args.std = std.data_ptr<float>();
    args.input = input.data_ptr();
    for (int d = 0; d < 4; ++d) args.input_stride[d] = input.stride(d);
    args.labels = labels.data_ptr<int64_t>();
    if (launch_input_kernel(args, input)) return;

    at::Tensor images, source_labels;
    if (slot.resident) {
      const at::Tensor indices = fields[kLabelOrIndex];
      images = resident_images.index_select(0, indices);
      source_labels = resident_labels.index_select(0, indices);
    } else {
      images = slot.device_images.narrow(0, 0, slot.size);
      source_labels = fields[kLabelOrIndex];
    }
    if (augmented)
      images = crop_and_flip(images, fields[kCropTop], fields[kCropLeft], fields[kFlip],
                             augment.crop_padding_px);
    // The trainer's normalisation before this class, op for op: CPU runs stay bitwise the same.
    input.copy_(images.to(at::kFloat).div_(255.0).sub_(mean).div_(std));  // and cast
    labels.copy_(source_labels);
  }

  void finish_take() {
    copies->release_after_use(static_cast<int>(taken % kStagingSlots));
    ++taken;
  }

  DeviceBatch take() {
    const Slot& slot = oldest_prepared("take");
    const at::TensorOptions on_device = at::TensorOptions().device(device);
    DeviceBatch batch;
    batch.input = at::empty({slot.size, info.channels, info.height, info.width},
                            on_device.dtype(dtype));
    batch.labels = at::empty({slot.size}, on_device.dtype(at::kLong));
    write_oldest(batch.input, batch.labels);
    finish_take();
    return batch;
  }

  void check_static(const at::Tensor& tensor, const char* name, at::IntArrayRef sizes,
                    c10::ScalarType expected_dtype) const {
    if (!tensor.defined() || tensor.sizes() != sizes || tensor.scalar_type() != expected_dtype ||
        tensor.device() != device)
      throw Error(std::string("DeviceInput: ") + name + " is " +
                  (tensor.defined() ? shape_text(tensor.sizes()) + " " +
                                          std::string(c10::toString(tensor.scalar_type())) +
                                          " on " + tensor.device().str()
                                    : std::string("undefined")) +
                  "; expected " + shape_text(sizes) + " " + c10::toString(expected_dtype) +
                  " on " + device.str());
  }

  void check_static_buffers(const at::Tensor& static_input, const at::Tensor& static_labels) const {
    check_static(static_input, "the static input",
                 {max_batch_size, info.channels, info.height, info.width}, dtype);
    check_static(static_labels, "the static labels", {max_batch_size}, at::kLong);
  }

  void take_into(at::Tensor& static_input, at::Tensor& static_labels) {
    const Slot& slot = oldest_prepared("take_into");
    check_static_buffers(static_input, static_labels);
    if (slot.size != max_batch_size)
      throw Error("DeviceInput::take_into: batch " + std::to_string(slot.index_in_epoch) +
                  " of epoch " + std::to_string(slot.epoch) + " has " +
                  std::to_string(slot.size) + " samples, the static buffers " +
                  std::to_string(max_batch_size) +
                  "; take() it and run that step without the graph (or use --drop-last)");
    write_oldest(static_input, static_labels);
    finish_take();
  }
};

DeviceInput::DeviceInput(const DatasetInfo& info, c10::Device device, c10::ScalarType dtype,
                         AugmentOptions augment, uint64_t seed, int rank,
                         int64_t max_batch_size)
    : impl_(std::make_unique<Impl>(info, device, dtype, augment, seed, rank, max_batch_size)) {}

DeviceInput::~DeviceInput() {
  if (impl_) impl_->copies->wait_for_copies();
}

void DeviceInput::prepare(const HostBatch& batch, int64_t epoch) { impl_->prepare(batch, epoch); }

void DeviceInput::keep_split_resident(const DatasetFile& file, Split split) {
  impl_->keep_split_resident(file, split);
}

void DeviceInput::prepare_resident(const std::vector<int64_t>& dataset_indices,
                                   int64_t index_in_epoch, int64_t epoch) {
  impl_->prepare_resident(dataset_indices, index_in_epoch, epoch);
}

DeviceBatch DeviceInput::take() { return impl_->take(); }

void DeviceInput::take_into(at::Tensor& static_input, at::Tensor& static_labels) {
  impl_->take_into(static_input, static_labels);
}

DeviceBatch DeviceInput::to_device(const HostBatch& batch, int64_t epoch) {
  prepare(batch, epoch);
  return take();
}

// Note [Test hooks]: test_device_input's fill.
void TestHooks::fill(DeviceInput& input, const HostBatch& batch, int64_t epoch,
                     at::Tensor& static_input, at::Tensor& static_labels) {
  DeviceInput::Impl& impl = *input.impl_;
  if (batch.size != impl.max_batch_size)
    throw Error("TestHooks::fill: batch " + std::to_string(batch.index_in_epoch) + " of epoch " +
                std::to_string(epoch) + " has " + std::to_string(batch.size) +
                " samples, the static buffers " + std::to_string(impl.max_batch_size));
  impl.check_static_buffers(static_input, static_labels);
  input.prepare(batch, epoch);
  input.take_into(static_input, static_labels);
}

}  // namespace hpc_train
