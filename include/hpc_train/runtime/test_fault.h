// Test-only faults: one rank told to fail at a named point of the start-up (Note [Test faults]).
#pragma once

namespace hpc_train {

// Note [Test faults]
// What one rank's failure does to the job (Note [Ending the job] in runtime.h) can only be shown
// by making one rank, and only it, fail where the others are busy elsewhere, e.g. waiting in a
// collective. HPC_TRAIN_TEST_FAULT=KIND@RANK in the environment (mpirun passes it to every rank)
// asks rank RANK to fail at the point named KIND, the way the real fault fails there:
//   init-weights     the --init-weights file is missing on that rank (the real read fails)
//   alloc            an allocation larger than any node's memory (the real allocator refuses)
//   resident-upload  the upload of the resident splits fails on its thread
//   capture          a backward captured into a CUDA graph fails half-way (reducer.h)
// A value that names no such point is an error, so that a test cannot pass by a typo.
// Returns whether the fault `kind` is asked of `rank`.
bool test_fault(const char* kind, int rank);

}  // namespace hpc_train
