// Checkpoints made by hand, for the checkpoint tests and the checkpoint fuzz target's seeds
// (fuzz/make_seeds.cpp): every field set, the same on every rank and in every run.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "hpc_train/io/checkpoint.h"

namespace hpc_train::test_support {

// 3 x 51843 + 1: three ranks' shares of the optimizer arrays cannot be equal.
constexpr size_t kRealisticOptimizerElements = 155530;

// Of realistic size (resnet18's first and last layers for 3x32x32 images, fp16, ZeRO 2 saved at
// 3 ranks) and awkward contents: special floats, an I64 scalar, a zero-size tensor, binary RNG
// state with zero bytes, a multi-line UTF-8 config. `seed` draws the values.
Checkpoint realistic_checkpoint(uint64_t seed,
                                size_t optimizer_elements = kRealisticOptimizerElements);

// A few hundred bytes (simple_cnn for 1x4x4 images, ZeRO 2 saved at 3 ranks), for fuzz seeds,
// which must stay small: fp16 with a dynamic loss scaler, a config and CPU and CUDA RNG state;
// or fp32 with neither scaler nor config nor RNG state (the empty string and arrays).
Checkpoint tiny_checkpoint(bool fp16);

// The bytes of `values` as CheckpointTensor::data holds them (the host's order: little-endian).
template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t count);

}  // namespace hpc_train::test_support
