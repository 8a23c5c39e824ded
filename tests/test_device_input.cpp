// DeviceInput: normalisation against a hand computation, crop and flip as exact index moves,
// deterministic draws, the two-phase staging, static buffers, the resident split, the --augment
// policy, and the GPU input kernel's per-element work run on the CPU. On the GPU when LibTorch sees one (HPC_TRAIN_TEST_DEVICE=cuda insists on it,
// HPC_TRAIN_TEST_DEVICE=cpu forbids it), where the results are also compared with the CPU's.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hpc_train/data/device_input.h"
#include "hpc_train/data/input_items.h"
#include "hpc_train/error.h"
#include "hpc_train/runtime/test_hooks.h"
#include "hpc_train/train/step_graph.h"
#include "host_convert.h"
#include "synthetic_dataset.h"

namespace hpc_train {
namespace {

constexpr uint64_t kSeed = 1234;
constexpr int kRank = 0;
constexpr int64_t kBatch = 64;

c10::Device test_device() {
  const char* setting = std::getenv("HPC_TRAIN_TEST_DEVICE");
  const std::string wanted = setting ? setting : "auto";
  if (wanted == "cpu") return c10::Device(c10::kCPU);
  if (torch::cuda::is_available()) return c10::Device(c10::kCUDA, 0);
  if (wanted == "cuda")
    throw std::runtime_error("HPC_TRAIN_TEST_DEVICE=cuda, but LibTorch sees no GPU");
  return c10::Device(c10::kCPU);
}

DatasetInfo image_info(int64_t channels, int64_t height, int64_t width) {
  DatasetInfo info;
  info.channels = channels;
  info.height = height;
  info.width = width;
  for (int64_t c = 0; c < channels; ++c) {
    info.mean.push_back(0.1f + 0.4f * static_cast<float>(c));
    info.std.push_back(0.2f + 0.1f * static_cast<float>(c));
  }
  return info;
}

// mean 0, std 1: the input is x / 255, from which the bytes come back exactly.
DatasetInfo identity_info(int64_t channels, int64_t height, int64_t width) {
  DatasetInfo info = image_info(channels, height, width);
  info.mean.assign(static_cast<size_t>(channels), 0.0f);
  info.std.assign(static_cast<size_t>(channels), 1.0f);
  return info;
}

HostBatch random_batch(const DatasetInfo& info, int64_t size, int64_t index_in_epoch,
                       uint64_t content_seed) {
  HostBatch batch;
  batch.index_in_epoch = index_in_epoch;
  batch.size = size;
  batch.images.resize(static_cast<size_t>(size * info.sample_bytes()));
  batch.labels.resize(static_cast<size_t>(size));
  uint64_t state = content_seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&state] {  // xorshift64: test content
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (uint8_t& byte : batch.images) byte = static_cast<uint8_t>(next() >> 56);
  for (int64_t& label : batch.labels) label = static_cast<int64_t>(next() % 10);
  return batch;
}

at::Tensor images_of(const HostBatch& batch, const DatasetInfo& info) {
  return at::from_blob(const_cast<uint8_t*>(batch.images.data()),
                       {batch.size, info.channels, info.height, info.width}, at::kByte)
      .clone();
}

at::Tensor labels_of(const HostBatch& batch) {
  return at::from_blob(const_cast<int64_t*>(batch.labels.data()), {batch.size}, at::kLong)
      .clone();
}

// The bytes behind an input made with identity_info().
at::Tensor recovered_bytes(const at::Tensor& input) {
  return input.cpu().to(at::kFloat).mul(255.0).round().to(at::kByte);
}

AugmentOptions crop_and_flip() {
  AugmentOptions augment;
  augment.random_crop = true;
  augment.horizontal_flip = true;
  return augment;
}

void expect_same_batch(const DeviceBatch& actual, const DeviceBatch& expected,
                       double tolerance) {
  ASSERT_EQ(actual.input.sizes(), expected.input.sizes());
  EXPECT_TRUE(at::equal(actual.labels.cpu(), expected.labels.cpu()));
  const at::Tensor a = actual.input.cpu().to(at::kFloat);
  const at::Tensor b = expected.input.cpu().to(at::kFloat);
  if (tolerance == 0.0)
    EXPECT_TRUE(at::equal(a, b));
  else
    EXPECT_TRUE(at::allclose(a, b, /*rtol=*/tolerance, /*atol=*/tolerance))
        << "max difference " << (a - b).abs().max().item<double>();
}

TEST(DeviceInput, NormalisesLikeTheHandComputation) {
  const c10::Device device = test_device();
  const DatasetInfo info = image_info(3, 4, 5);
  DeviceInput input(info, device, at::kFloat, AugmentOptions{}, kSeed, kRank, kBatch);
  const HostBatch batch = random_batch(info, 7, 0, 1);
  const DeviceBatch out = input.to_device(batch, 0);

  ASSERT_EQ(out.input.device(), device);
  ASSERT_EQ(out.input.scalar_type(), at::kFloat);
  ASSERT_EQ(out.input.sizes(), (std::vector<int64_t>{7, 3, 4, 5}));
  const at::Tensor result = out.input.cpu().contiguous();
  const float* values = result.data_ptr<float>();
  const int64_t plane = info.height * info.width;
  for (int64_t i = 0; i < result.numel(); ++i) {
    const int64_t channel = (i / plane) % info.channels;
    const float expected =
        (static_cast<float>(batch.images[static_cast<size_t>(i)]) / 255.0f - info.mean[channel]) /
        info.std[channel];
    ASSERT_NEAR(values[i], expected, 1e-6 * (1.0 + std::abs(expected))) << "element " << i;
  }
  EXPECT_TRUE(at::equal(out.labels.cpu(), labels_of(batch)));
  EXPECT_EQ(out.labels.device(), device);
}

// A CPU build (device_input_cpu.cpp) refuses a GPU device, naming it, before it allocates
// anything. A GPU build reaches GPUs, so there is nothing to refuse.
TEST(DeviceInput, ACpuBuildRefusesAGpuDevice) {
  if (cuda_graphs_available()) GTEST_SKIP() << "a GPU build";
  try {
    DeviceInput input(image_info(3, 4, 5), c10::Device(c10::kCUDA, 1), at::kFloat,
                      AugmentOptions{}, kSeed, kRank, kBatch);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "DeviceInput: device cuda:1, but this hpc_train was built with a "
                           "LibTorch without CUDA");
  }
}

TEST(DeviceInput, CastsToTheModelDtype) {
  const c10::Device device = test_device();
  const DatasetInfo info = image_info(3, 4, 5);
  const HostBatch batch = random_batch(info, 9, 0, 2);
  DeviceInput in_float(info, device, at::kFloat, AugmentOptions{}, kSeed, kRank, kBatch);
  DeviceInput in_bf16(info, device, at::kBFloat16, AugmentOptions{}, kSeed, kRank, kBatch);
  const at::Tensor reduced = in_bf16.to_device(batch, 0).input;
  EXPECT_EQ(reduced.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(reduced.cpu(), in_float.to_device(batch, 0).input.to(at::kBFloat16).cpu()));
}

TEST(DeviceInput, WithoutAugmentationTheImageIsUnchanged) {
  const DatasetInfo info = identity_info(3, 12, 10);
  AugmentOptions off;  // crop off, flip off, padding left at its default
  DeviceInput input(info, test_device(), at::kFloat, off, kSeed, kRank, kBatch);
  const HostBatch batch = random_batch(info, kBatch, 3, 3);
  EXPECT_TRUE(at::equal(recovered_bytes(input.to_device(batch, 5).input), images_of(batch, info)));
}

// Every output image is one window of its zero-padded input, offsets in [0, 2 * padding].
TEST(DeviceInput, RandomCropIsAWindowOfThePaddedImage) {
  const DatasetInfo info = identity_info(3, 12, 10);
  AugmentOptions crop;
  crop.random_crop = true;
  const int64_t padding = crop.crop_padding_px;
  DeviceInput input(info, test_device(), at::kFloat, crop, kSeed, kRank, kBatch);
  const HostBatch batch = random_batch(info, kBatch, 0, 4);
  const at::Tensor output = recovered_bytes(input.to_device(batch, 0).input);
  const at::Tensor padded =
      at::constant_pad_nd(images_of(batch, info), {padding, padding, padding, padding}, 0);

  std::set<std::pair<int64_t, int64_t>> offsets_seen;
  for (int64_t s = 0; s < kBatch; ++s) {
    std::vector<std::pair<int64_t, int64_t>> matches;
    for (int64_t top = 0; top <= 2 * padding; ++top)
      for (int64_t left = 0; left <= 2 * padding; ++left)
        if (at::equal(output[s], padded[s].narrow(1, top, info.height).narrow(2, left, info.width)))
          matches.emplace_back(top, left);
    ASSERT_EQ(matches.size(), 1u) << "sample " << s << " is not exactly one window";
    offsets_seen.insert(matches.front());
  }
  // 64 draws of 81 offsets: fewer than 20 distinct ones would mean the draws are not spread.
  EXPECT_GE(offsets_seen.size(), 20u);
}

TEST(DeviceInput, FlipMirrorsAboutHalfTheSamples) {
  const DatasetInfo info = identity_info(3, 12, 10);
  AugmentOptions flip;
  flip.horizontal_flip = true;
  DeviceInput input(info, test_device(), at::kFloat, flip, kSeed, kRank, kBatch);
  const HostBatch batch = random_batch(info, kBatch, 0, 5);
  const at::Tensor output = recovered_bytes(input.to_device(batch, 0).input);
  const at::Tensor original = images_of(batch, info);
  int64_t flipped = 0;
  for (int64_t s = 0; s < kBatch; ++s) {
    const bool is_flipped = at::equal(output[s], at::flip(original[s], {2}));
    const bool is_original = at::equal(output[s], original[s]);
    ASSERT_NE(is_flipped, is_original) << "sample " << s;
    flipped += is_flipped ? 1 : 0;
  }
  // Binomial(64, 1/2): outside [16, 48] with probability below 1e-4.
  EXPECT_GE(flipped, 16);
  EXPECT_LE(flipped, 48);
}

TEST(DeviceInput, CropAndFlipTogether) {
  const DatasetInfo info = identity_info(3, 12, 10);
  const AugmentOptions augment = crop_and_flip();
  const int64_t padding = augment.crop_padding_px;
  DeviceInput input(info, test_device(), at::kFloat, augment, kSeed, kRank, kBatch);
  const HostBatch batch = random_batch(info, kBatch, 0, 6);
  const at::Tensor output = recovered_bytes(input.to_device(batch, 0).input);
  const at::Tensor padded =
      at::constant_pad_nd(images_of(batch, info), {padding, padding, padding, padding}, 0);
  int64_t flipped = 0;
  for (int64_t s = 0; s < kBatch; ++s) {
    int64_t plain_matches = 0, flipped_matches = 0;
    for (int64_t top = 0; top <= 2 * padding; ++top)
      for (int64_t left = 0; left <= 2 * padding; ++left) {
        const at::Tensor window = padded[s].narrow(1, top, info.height).narrow(2, left, info.width);
        plain_matches += at::equal(output[s], window) ? 1 : 0;
        flipped_matches += at::equal(output[s], at::flip(window, {2})) ? 1 : 0;
      }
    ASSERT_EQ(plain_matches + flipped_matches, 1) << "sample " << s;
    flipped += flipped_matches;
  }
  EXPECT_GE(flipped, 16);
  EXPECT_LE(flipped, 48);
}

// Note [Augmentation draws]: a function of (seed, rank, epoch, index in the epoch) only.
TEST(DeviceInput, DrawsAreDeterministicPerBatch) {
  const c10::Device device = test_device();
  const DatasetInfo info = image_info(3, 12, 10);
  const HostBatch batch = random_batch(info, kBatch, 7, 7);
  auto augmented = [&](uint64_t seed, int rank, int64_t epoch, int64_t index) {
    DeviceInput input(info, device, at::kFloat, crop_and_flip(), seed, rank, kBatch);
    HostBatch copy = batch;
    copy.index_in_epoch = index;
    return input.to_device(copy, epoch).input.cpu();
  };
  const at::Tensor reference = augmented(kSeed, 1, 3, 7);
  EXPECT_TRUE(at::equal(augmented(kSeed, 1, 3, 7), reference));
  EXPECT_FALSE(at::equal(augmented(kSeed, 1, 3, 8), reference));
  EXPECT_FALSE(at::equal(augmented(kSeed, 1, 4, 7), reference));
  EXPECT_FALSE(at::equal(augmented(kSeed, 2, 3, 7), reference));
  EXPECT_FALSE(at::equal(augmented(kSeed + 1, 1, 3, 7), reference));

  // A sample's draws depend on its position, not on the batch size: the short last batch of
  // an epoch is the head of what a full one would have been.
  DeviceInput input(info, device, at::kFloat, crop_and_flip(), kSeed, 1, kBatch);
  HostBatch head = batch;
  head.size = 10;
  head.images.resize(static_cast<size_t>(10 * info.sample_bytes()));
  head.labels.resize(10);
  EXPECT_TRUE(at::equal(input.to_device(head, 3).input.cpu(), reference.narrow(0, 0, 10)));
}

// prepare() ahead of take(), as the trainer does it, gives what to_device() gives, in order;
// on CUDA this exercises the reuse of the staging slots while copies are in flight.
TEST(DeviceInput, TwoPhaseStagingKeepsOrder) {
  const c10::Device device = test_device();
  const DatasetInfo info = image_info(3, 12, 10);
  DeviceInput pipelined(info, device, at::kFloat, crop_and_flip(), kSeed, kRank, kBatch);
  DeviceInput direct(info, device, at::kFloat, crop_and_flip(), kSeed, kRank, kBatch);
  std::vector<HostBatch> batches;
  for (int64_t b = 0; b < 12; ++b)
    batches.push_back(random_batch(info, b == 11 ? 5 : kBatch, b, 100 + b));  // the last short

  pipelined.prepare(batches[0], 2);
  for (size_t b = 0; b < batches.size(); ++b) {
    if (b + 1 < batches.size()) pipelined.prepare(batches[b + 1], 2);
    const DeviceBatch out = pipelined.take();
    expect_same_batch(out, direct.to_device(batches[b], 2), 0.0);
  }
}

TEST(DeviceInput, StagingErrors) {
  const DatasetInfo info = image_info(1, 4, 4);
  DeviceInput input(info, test_device(), at::kFloat, AugmentOptions{}, kSeed, kRank, 8);
  EXPECT_THROW(input.take(), Error);
  EXPECT_THROW(input.prepare(random_batch(info, 9, 0, 1), 0), Error);  // > max batch size
  HostBatch truncated = random_batch(info, 4, 0, 1);
  truncated.images.pop_back();
  EXPECT_THROW(input.prepare(truncated, 0), Error);
  for (int b = 0; b < DeviceInput::kStagingSlots; ++b)
    input.prepare(random_batch(info, 8, b, 1), 0);
  EXPECT_THROW(input.prepare(random_batch(info, 8, 9, 1), 0), Error);  // ring full
  for (int b = 0; b < DeviceInput::kStagingSlots; ++b) EXPECT_EQ(input.take().labels.size(0), 8);
}

TEST(DeviceInput, FillWritesTheStaticBuffers) {
  const c10::Device device = test_device();
  const DatasetInfo info = image_info(3, 12, 10);
  const at::TensorOptions on_device = at::TensorOptions().device(device);
  at::Tensor static_input = at::zeros({kBatch, 3, 12, 10}, on_device.dtype(at::kFloat));
  at::Tensor static_labels = at::zeros({kBatch}, on_device.dtype(at::kLong));
  const void* input_storage = static_input.data_ptr();
  DeviceInput input(info, device, at::kFloat, crop_and_flip(), kSeed, kRank, kBatch);
  DeviceInput reference(info, device, at::kFloat, crop_and_flip(), kSeed, kRank, kBatch);

  for (int64_t b = 0; b < 3; ++b) {
    const HostBatch batch = random_batch(info, kBatch, b, 200 + b);
    TestHooks::fill(input, batch, 1, static_input, static_labels);
    expect_same_batch({static_input, static_labels}, reference.to_device(batch, 1), 0.0);
  }
  EXPECT_EQ(static_input.data_ptr(), input_storage);  // written in place, never reallocated

  // A short batch: TestHooks::fill refuses it and leaves nothing prepared; take_into() refuses
  // it and leaves it prepared, for take().
  const HostBatch short_batch = random_batch(info, 5, 3, 300);
  EXPECT_THROW(TestHooks::fill(input, short_batch, 1, static_input, static_labels), Error);
  EXPECT_THROW(input.take(), Error);
  input.prepare(short_batch, 1);
  EXPECT_THROW(input.take_into(static_input, static_labels), Error);
  expect_same_batch(input.take(), reference.to_device(short_batch, 1), 0.0);

  // Static buffers of the wrong shape or dtype.
  at::Tensor wrong_input = at::zeros({kBatch - 1, 3, 12, 10}, on_device.dtype(at::kFloat));
  at::Tensor wrong_labels = at::zeros({kBatch}, on_device.dtype(at::kInt));
  const HostBatch batch = random_batch(info, kBatch, 4, 400);
  EXPECT_THROW(TestHooks::fill(input, batch, 1, wrong_input, static_labels), Error);
  EXPECT_THROW(TestHooks::fill(input, batch, 1, static_input, wrong_labels), Error);
  EXPECT_THROW(input.take(), Error);  // nothing was prepared by those refusals
}

TEST(DeviceInput, ResidentSplitGivesTheLoaderBatches) {
  const c10::Device device = test_device();
  const std::string dir = test_support::make_test_directory("device_input_resident");
  const std::string path = dir + "/data.h5";
  test_support::SyntheticShape shape;
  shape.channels = 3;
  test_support::write_synthetic_dataset(path, shape, 11);
  const DatasetFile file = DatasetFile::open(path);
  const DatasetInfo& info = file.info();
  EXPECT_EQ(resident_split_bytes(info, Split::kTrain), shape.train * (3 * 8 * 8 + 8));

  DeviceInput resident(info, device, at::kFloat, crop_and_flip(), kSeed, kRank, kBatch);
  EXPECT_THROW(resident.prepare_resident({0, 1}, 0, 0), Error);  // nothing resident yet
  resident.keep_split_resident(file, Split::kTrain);
  DeviceInput loader_path(info, device, at::kFloat, crop_and_flip(), kSeed, kRank, kBatch);

  const std::vector<std::vector<int64_t>> plan = {
      {5, 17, 3, shape.train - 1, 0, 17}, {100, 101, 102}, {42}};
  for (size_t b = 0; b < plan.size(); ++b) {
    HostBatch batch;
    batch.index_in_epoch = static_cast<int64_t>(b);
    batch.size = static_cast<int64_t>(plan[b].size());
    batch.images.resize(static_cast<size_t>(batch.size * info.sample_bytes()));
    batch.labels.resize(static_cast<size_t>(batch.size));
    file.read_samples(Split::kTrain, plan[b], batch.images.data(), batch.labels.data());
    resident.prepare_resident(plan[b], static_cast<int64_t>(b), 4);
    expect_same_batch(resident.take(), loader_path.to_device(batch, 4), 0.0);
  }
  EXPECT_THROW(resident.prepare_resident({0, shape.train}, 0, 0), Error);
  EXPECT_THROW(resident.prepare_resident({-1}, 0, 0), Error);
  test_support::remove_directory(dir);
}

// The GPU gives the CPU's batches: labels and crops exactly, the normalisation to rounding.
TEST(DeviceInput, GpuMatchesCpu) {
  const c10::Device device = test_device();
  if (!device.is_cuda()) GTEST_SKIP() << "no GPU";
  const DatasetInfo info = image_info(3, 32, 32);
  DeviceInput gpu(info, device, at::kFloat, crop_and_flip(), kSeed, 2, kBatch);
  DeviceInput cpu(info, c10::Device(c10::kCPU), at::kFloat, crop_and_flip(), kSeed, 2, kBatch);
  for (int64_t b = 0; b < 6; ++b) {
    const HostBatch batch = random_batch(info, b == 5 ? 17 : kBatch, b, 500 + b);
    expect_same_batch(gpu.to_device(batch, 9), cpu.to_device(batch, 9), 1e-6);
  }
}

// On the GPU the input kernel writes a CUDA graph's static buffers in their own layout (NHWC
// here) and dtype: the CPU's batch, to bf16's rounding (the two round fp32 values that may
// differ in their last bit).
TEST(DeviceInput, GpuFillsChannelsLastBuffers) {
  const c10::Device device = test_device();
  if (!device.is_cuda()) GTEST_SKIP() << "no GPU";
  const DatasetInfo info = image_info(3, 32, 32);
  DeviceInput gpu(info, device, at::kBFloat16, crop_and_flip(), kSeed, 2, kBatch);
  DeviceInput cpu(info, c10::Device(c10::kCPU), at::kFloat, crop_and_flip(), kSeed, 2, kBatch);
  const at::TensorOptions on_gpu = at::TensorOptions().device(device);
  at::Tensor static_input =
      at::empty({kBatch, 3, 32, 32},
                on_gpu.dtype(at::kBFloat16).memory_format(at::MemoryFormat::ChannelsLast));
  at::Tensor static_labels = at::empty({kBatch}, on_gpu.dtype(at::kLong));
  for (int64_t b = 0; b < 3; ++b) {
    const HostBatch batch = random_batch(info, kBatch, b, 700 + b);
    TestHooks::fill(gpu, batch, 9, static_input, static_labels);
    ASSERT_TRUE(static_input.is_contiguous(at::MemoryFormat::ChannelsLast));
    const DeviceBatch expected = cpu.to_device(batch, 9);
    expect_same_batch({static_input, static_labels},
                      {expected.input.to(at::kBFloat16), expected.labels}, 1e-2);
  }
}

// Note [Staging ring] on a busy GPU: with seconds of work queued on the compute stream,
// prepare() and take() return at once (no host synchronisation), and the copy of a batch into a
// slot still waits for the transform that reads that slot's previous batch (else batch 0 would
// come out with batch 2's images).
TEST(DeviceInput, GpuStagingDoesNotWaitForTheComputeStream) {
  const c10::Device device = test_device();
  if (!device.is_cuda()) GTEST_SKIP() << "no GPU";
  const DatasetInfo info = image_info(3, 32, 32);
  DeviceInput gpu(info, device, at::kFloat, crop_and_flip(), kSeed, kRank, kBatch);
  DeviceInput cpu(info, c10::Device(c10::kCPU), at::kFloat, crop_and_flip(), kSeed, kRank, kBatch);
  std::vector<HostBatch> batches;
  for (int64_t b = 0; b < 3; ++b) batches.push_back(random_batch(info, kBatch, b, 600 + b));
  const at::Tensor matrix = at::randn({8192, 8192}, at::TensorOptions().device(device));
  torch::cuda::synchronize();

  const auto start = std::chrono::steady_clock::now();
  at::Tensor busy = matrix;
  for (int i = 0; i < 40; ++i) busy = busy.mm(matrix).div_(8192.0);  // queued, not yet run
  std::vector<DeviceBatch> out;
  for (const HostBatch& batch : batches) {
    gpu.prepare(batch, 0);
    out.push_back(gpu.take());
  }
  const double host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  torch::cuda::synchronize();
  const double total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(host_ms, 0.5 * total_ms) << "host " << host_ms << " ms, GPU " << total_ms << " ms";
  for (size_t b = 0; b < batches.size(); ++b)
    expect_same_batch(out[b], cpu.to_device(batches[b], 0), 1e-6);
}

using testing::HostConvert;

// The input kernel's per-element work (input_items.h, Note [One input kernel] in
// device_input.cpp), run on the CPU over every element of a batch: for resident rows and for a
// staged batch, with and without crop and flip, written NCHW and NHWC. Each sample must be its
// source image zero-padded, windowed at (top, left) and mirrored where flipped, normalised as
// LibTorch's ops normalise (within fp32 rounding: the kernel multiplies by 1/255 where the CPU's
// LibTorch divides), with its label.
TEST(InputKernel, ElementsAreTheCroppedFlippedNormalisedSources) {
  const DatasetInfo info = image_info(3, 6, 5);
  const int64_t batch = 5, rows = 9, padding = 2;
  at::Tensor source = at::randint(0, 256, {rows, 3, 6, 5}, at::kLong).to(at::kByte);
  at::Tensor source_labels = at::randint(0, 10, {rows}, at::kLong);
  const at::Tensor row = at::tensor(std::vector<int64_t>{4, 0, 8, 4, 2});
  const at::Tensor top = at::tensor(std::vector<int64_t>{0, 4, 2, 1, 3});
  const at::Tensor left = at::tensor(std::vector<int64_t>{4, 0, 2, 3, 1});
  const at::Tensor flip = at::tensor(std::vector<int64_t>{1, 0, 0, 1, 1});
  const at::Tensor mean = at::tensor(info.mean, at::kFloat), std = at::tensor(info.std, at::kFloat);
  for (const bool resident : {true, false}) {
    for (const bool augmented : {true, false}) {
      for (const auto format : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast}) {
        SCOPED_TRACE(std::string(resident ? "resident" : "staged") +
                     (augmented ? ", crop and flip" : "") +
                     (format == at::MemoryFormat::ChannelsLast ? ", NHWC" : ", NCHW"));
        InputBatchArgs args;
        args.batch = batch;
        args.channels = info.channels;
        args.height = info.height;
        args.width = info.width;
        // Staged: the batch's own images, row b for sample b.
        const at::Tensor images = resident ? source : source.index_select(0, row);
        const at::Tensor labels_in = resident ? source_labels : source_labels.index_select(0, row);
        args.images = images.data_ptr<uint8_t>();
        args.source_row = resident ? row.data_ptr<int64_t>() : nullptr;
        args.source_labels = labels_in.data_ptr<int64_t>();
        if (augmented) {
          args.crop_top = top.data_ptr<int64_t>();
          args.crop_left = left.data_ptr<int64_t>();
          args.flip = flip.data_ptr<int64_t>();
          args.crop_padding = padding;
        }
        args.mean = mean.data_ptr<float>();
        args.std = std.data_ptr<float>();
        at::Tensor input = at::empty({batch, 3, 6, 5}, at::TensorOptions().memory_format(format));
        at::Tensor labels = at::empty({batch}, at::kLong);
        args.input = input.data_ptr();
        for (int d = 0; d < 4; ++d) args.input_stride[d] = input.stride(d);
        args.labels = labels.data_ptr<int64_t>();
        for (int64_t e = 0; e < input_elements(args); ++e) input_element<float, HostConvert>(args, e);

        for (int64_t b = 0; b < batch; ++b) {
          const int64_t r = row[b].item<int64_t>();
          at::Tensor expected = source[r];
          if (augmented) {
            expected = at::constant_pad_nd(expected, {padding, padding, padding, padding}, 0)
                           .narrow(1, top[b].item<int64_t>(), 6)
                           .narrow(2, left[b].item<int64_t>(), 5);
            if (flip[b].item<int64_t>()) expected = expected.flip({2});
          }
          const at::Tensor normalised =
              expected.to(at::kFloat).div_(255.0).sub_(mean.view({3, 1, 1})).div_(std.view({3, 1, 1}));
          EXPECT_TRUE(at::allclose(input[b], normalised, /*rtol=*/1e-6, /*atol=*/1e-6))
              << "sample " << b << ": max difference "
              << (input[b] - normalised).abs().max().item<double>();
          EXPECT_EQ(labels[b].item<int64_t>(), source_labels[r].item<int64_t>()) << "sample " << b;
        }
      }
    }
  }
}

TEST(DefaultAugmentation, Policy) {
  const DatasetInfo cifar = image_info(3, 32, 32);
  const DatasetInfo fashion = image_info(1, 28, 28);
  const DatasetInfo small_colour = image_info(3, 28, 28);
  auto is_on = [](const AugmentOptions& a) { return a.random_crop && a.horizontal_flip; };
  auto is_off = [](const AugmentOptions& a) { return !a.random_crop && !a.horizontal_flip; };
  EXPECT_TRUE(is_on(default_augmentation(cifar, Switch::kAuto)));
  EXPECT_EQ(default_augmentation(cifar, Switch::kAuto).crop_padding_px, 4);
  EXPECT_TRUE(is_off(default_augmentation(fashion, Switch::kAuto)));
  EXPECT_TRUE(is_off(default_augmentation(small_colour, Switch::kAuto)));
  EXPECT_TRUE(is_on(default_augmentation(fashion, Switch::kOn)));
  EXPECT_TRUE(is_off(default_augmentation(cifar, Switch::kOff)));
  // A name that is none of auto, on and off stops at the command line (test_config).
}

}  // namespace
}  // namespace hpc_train
