// The seed of a test that draws fresh random inputs every run: random unless
// HPC_TRAIN_TEST_SEED is set, printed once, so that a failing run can be repeated.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace hpc_train::testing {

inline uint64_t test_seed(const char* test_name) {
  static const uint64_t seed = [test_name] {
    const char* fixed = std::getenv("HPC_TRAIN_TEST_SEED");
    const uint64_t chosen = fixed ? std::strtoull(fixed, nullptr, 10)
                                  : (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                        std::random_device{}();
    std::printf("%s: seed %llu (HPC_TRAIN_TEST_SEED=%llu repeats this run)\n", test_name,
                static_cast<unsigned long long>(chosen), static_cast<unsigned long long>(chosen));
    return chosen;
  }();
  return seed;
}

}  // namespace hpc_train::testing
