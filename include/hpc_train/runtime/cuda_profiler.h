// The CUDA profiler's capture range around chosen training steps (--cuda-profiler-start-step,
// --cuda-profiler-steps): a profiler started with its capture off (ncu --profile-from-start off,
// nsys --capture-range=cudaProfilerApi) records those steps alone, warmed up and replayed,
// without start-up, warm-up, graph capture or evaluation (bench/kernel_profile.sh).
#pragma once

#include <cstdint>

namespace hpc_train {

class CudaProfilerRange {
 public:
  // `first_step` 0: never. `cuda`: this rank computes on a GPU (a CPU rank, or a build without
  // CUDA, has no range to open).
  CudaProfilerRange(int64_t first_step, int64_t steps, bool cuda)
      : first_step_(cuda ? first_step : 0), last_step_(first_step + steps - 1) {}
  // Before the first micro-step of global step `step` (1 is the run's first).
  void step_begins(int64_t step) {
    if (first_step_ > 0 && step == first_step_) start();
  }
  // After global step `step` was queued.
  void step_ended(int64_t step) {
    if (first_step_ > 0 && step == last_step_) stop();
  }

 private:
  // cudaProfilerStart / cudaProfilerStop (cuda_profiler_cuda.cpp; no-ops in a CPU build).
  static void start();
  static void stop();

  int64_t first_step_;
  int64_t last_step_;
};

}  // namespace hpc_train
