// Where a run's start-up goes, phase by phase, before the first training step.
//
// Note [Start-up phases]
// A short job pays its start-up in full: the origin's job spent a large part of its process's time
// outside training (bench/results-notes.md, Note [Start-up phases]). main() and the Trainer's
// constructor mark the end of each phase on every rank; rank 0's figures are printed before
// training ("Start-up: ...") and go into summary.json as "startup" ({"<phase>_s": seconds,
// "total_s": ...}). The phases: loading, the time from the process's start (the kernel's record in
// /proc/self/stat) to main(), the dynamic loader mapping LibTorch, CUDA and MPI (left out where
// /proc does not say); mpi (MPI_Init); config; placement (devices probed and agreed); dataset
// (HDF5 opens and checks the file); then the trainer's: communicator (NCCL's; the wait for the
// CUDA context that a thread began making before MPI_Init, Note [Early CUDA start], or its making
// where nothing started it early), model (built, moved and checked; on a GPU the first uses: the
// evaluation's at its shape, and one training step of a twin of the model beside it,
// Note [Training step warm-up]), optimizer (flat storage, broadcast, buckets, state), data (the
// store's read; what is left to wait of the resident splits' upload, which runs beside the model
// and optimizer phases) and resume. The training's own first steps (cuDNN's autotuning, the eager
// steps before the CUDA graph and its capture) are the summary's warmup_s and the "Finished"
// line's warm-up, not here.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpc_train/monitor/metrics.h"  // Stopwatch

namespace hpc_train {

class StartupPhases {
 public:
  // The clock starts now: construct at main()'s first line.
  StartupPhases();
  // Ends the phase `name` (a word: "mpi", "dataset"), which began at the previous mark.
  void end_phase(const std::string& name);
  // "Start-up 2.61 s: loading 0.82 s, mpi 0.40 s, ..."
  std::string describe() const;
  // {"loading_s": 0.82, "mpi_s": 0.40, ..., "total_s": 2.61}
  nlohmann::json to_json() const;

 private:
  std::vector<std::pair<std::string, double>> phases_s_;
  Stopwatch since_main_;
  double last_mark_s_ = 0.0;  // since main()
};

// Seconds since this process started (exec), from /proc/self/stat and /proc/uptime (10 ms
// resolution); negative where they cannot be read.
double seconds_since_process_start();

}  // namespace hpc_train
